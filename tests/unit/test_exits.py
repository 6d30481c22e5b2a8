"""The daemon's watch on pppd exits (offload/exits.py): pidfds, an exit
reported until unwatched and waking a select only once.  What the service
does on an exit is test_trust.py's."""

from __future__ import annotations

import subprocess

from pipexctl.offload.exits import Exits

from .conftest import readable


def test_an_exited_pid_wakes_once_not_for_ever():
    ex = Exits()
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert ex.watch(p.pid)
        assert not readable(ex)
        p.kill()
        p.wait()
        assert readable(ex)
        assert ex.exited() == {p.pid}
        assert not readable(ex)  # reported; the pidfd left epoll
        assert ex.exited() == {p.pid}  # and still reported until unwatched
        ex.unwatch(p.pid)
        assert ex.exited() == set()
    finally:
        ex.close()


def _open_fds() -> set[str]:
    import os

    return set(os.listdir("/proc/self/fd"))


def test_a_pid_watched_n_times_keeps_its_one_pidfd_until_the_nth_unwatch():
    """An xl2tpd is watched once per tunnel: one pidfd, closed with the last
    of its references, and not before (its other tunnels still depend on it)."""
    ex = Exits()
    p = subprocess.Popen(["sleep", "30"])
    try:
        before = _open_fds()
        assert ex.watch(p.pid) and ex.watch(p.pid) and ex.watch(p.pid)
        assert len(_open_fds() - before) == 1
        ex.unwatch(p.pid)
        ex.unwatch(p.pid)
        assert len(_open_fds() - before) == 1 and ex.alive(p.pid)
        p.kill()
        p.wait()
        assert ex.exited() == {p.pid}  # still watched: its exit is seen
        ex.unwatch(p.pid)
        assert _open_fds() == before and ex.exited() == set()
        ex.unwatch(p.pid)  # one too many: nothing to do
        assert ex.watch(p.pid) is False  # gone: nothing is left watched either
        assert _open_fds() == before
    finally:
        ex.close()
