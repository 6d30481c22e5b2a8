"""watch across an xl2tpd restart: the new daemon's objects come up once."""

from __future__ import annotations

import signal

import pytest

from pipexctl.discovery.discovery import Discovery

from .conftest import Watcher

pytestmark = [pytest.mark.kernel, pytest.mark.one_debian("discovery following xl2tpd's restarts, userspace only")]


def test_watch_across_xl2tpd_kill_and_restart(lab):
    l1, l2 = lab.lacs
    lab.connect(l1)
    lab.wait_log(lab.lns, "Call established", count=1)
    w = Watcher(Discovery([str(lab.lns.log)], [lab.lns.control], netns=lab.lns.ns))
    got, wait_for = w.got, w.wait_for
    wait_for(lambda: sum(e.event == "CallUp" for e in got) == 1, "initial CallUp")
    old_pid = lab.pppds(lab.lns)[0]
    lab.kill(lab.lns, signal.SIGKILL)  # no log line: /proc must tell
    wait_for(lambda: any(e.event == "TunnelDown" for e in got), "TunnelDown after kill -9")
    lab.start(lab.lns)  # same log file, new pid
    lab.connect(l2)
    wait_for(lambda: sum(e.event == "CallUp" for e in got) == 2, "CallUp from the restarted xl2tpd")
    ups = [e.call for e in got if e.event == "CallUp"]
    assert ups[1].pppd_pid != old_pid and ups[1].peer == l2.local
    seq = [e.event for e in got if e.event != "CallUpdated"]
    w.stop()
    assert seq == ["TunnelUp", "CallUp", "CallDown", "TunnelDown", "TunnelUp", "CallUp"], seq
