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
