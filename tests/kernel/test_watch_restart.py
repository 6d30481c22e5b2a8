"""watch across an xl2tpd restart: the new daemon's objects come up once."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from pipexctl.discovery.discovery import Discovery

from .test_discovery_live import lab  # noqa: F401  (the fixture)

pytestmark = pytest.mark.kernel


def test_watch_across_xl2tpd_kill_and_restart(lab):  # noqa: F811
    l1, l2 = lab.lacs
    lab.connect(l1)
    lab.wait_log(lab.lns, "Call established", count=1)
    d = Discovery([str(lab.lns.log)], [lab.lns.control], netns=lab.lns.ns)
    got: list = []
    stop = threading.Event()

    def run():
        for e in d.events(poll=0.1, reconcile_every=0.5, until=time.monotonic() + 200, stop=stop):
            got.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()

    def wait_for(pred, what, timeout=60):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.1)
        raise AssertionError(f"no {what}; events: {[e.event for e in got]}")

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
    stop.set()
    th.join(10)
    d.close()
    assert seq == ["TunnelUp", "CallUp", "CallDown", "TunnelDown", "TunnelUp", "CallUp"], seq
