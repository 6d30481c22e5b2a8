"""pipexctl.poller: the epoll set that serve's per-call fds are in."""

from __future__ import annotations

import os
import threading

import pytest

from pipexctl.poller import Poller


def test_reports_ready_fds_with_their_values_and_forgets_unregistered_ones():
    p: Poller[str] = Poller()
    pipes = [os.pipe() for _ in range(3)]
    try:
        for i, (r, _) in enumerate(pipes):
            p.register(r, f"call {i}")
        assert p.select(0) == [] and len(p) == 3 and pipes[0][0] in p
        os.write(pipes[1][1], b"x")
        os.write(pipes[2][1], b"x")
        assert sorted(p.select(0)) == [(pipes[1][0], "call 1"), (pipes[2][0], "call 2")]
        assert sorted(p.select(0)) == [(pipes[1][0], "call 1"), (pipes[2][0], "call 2")]  # level-triggered
        p.unregister(pipes[1][0])
        assert p.select(0) == [(pipes[2][0], "call 2")] and pipes[1][0] not in p and p.get(pipes[1][0]) is None
        with pytest.raises(KeyError):
            p.unregister(pipes[1][0])
        os.close(pipes[0][1])  # a hang-up wakes it too
        pipes[0] = (pipes[0][0],)
        assert sorted(p.select(0)) == [(pipes[0][0], "call 0"), (pipes[2][0], "call 2")]
        r, w = pipes[2]
        os.close(r)
        pipes[2] = (w,)  # r is closed: its number may name another file by now
        p.unregister(r)  # closed already: no error
        assert len(p) == 1 and p.select(0) == [(pipes[0][0], "call 0")]
        with pytest.raises(FileExistsError):
            p.register(pipes[0][0], "again")
        assert p.get(pipes[0][0]) == "call 0"
    finally:
        p.close()
        for fds in pipes:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass


def test_a_select_waits_until_a_registered_fd_is_ready():
    p: Poller[int] = Poller()
    r, w = os.pipe()
    try:
        p.register(r, 7)
        threading.Timer(0.1, os.write, (w, b"x")).start()
        assert p.select(5) == [(r, 7)]
        assert p.select(0.01) != []
    finally:
        p.close()
        os.close(r)
        os.close(w)
