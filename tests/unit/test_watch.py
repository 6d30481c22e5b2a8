"""The daemon's view of discovery (offload/watch.py): a request finds its
pppd's call in the log itself; the watcher sleeps until something happens
(an exit, a waiting request, a stop or a reload wakes it at once); the
checkpoint is saved at a stop and resumed at a start.  (How much CPU a
quiet daemon then leaves to the data path is a benchmark figure, `make
bench`, not asserted here.)  The idle interval is set to a minute in these
tests, so anything answered within seconds was answered by a wake-up, not
by the timer."""

from __future__ import annotations

import subprocess
import threading
import time

from pipexctl.discovery.discovery import Discovery
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.exits import Exits
from pipexctl.offload.server import OffloadServer
from pipexctl.offload.watch import CallWatch, FdEvent

from .conftest import DATA, model, readable


def test_a_request_reads_the_call_from_the_log_without_waiting_for_the_watcher(tmp_path):
    """The pppd's call is in the log when it asks: the request finds it at
    once, though the watcher (not running here) would poll only later."""
    log = tmp_path / "xl2tpd.log"
    log.write_text("xl2tpd[147]: xl2tpd version xl2tpd-1.3.18 started on (none) PID:147\n")
    d = Discovery([str(log)], proc=False, kernel=False)
    s = OffloadServer(str(tmp_path / "s.sock"), d, NullBackend(), NullDataPath(), wait=3.0, log_interval=60)
    try:
        d.refresh(events=False)  # as serve_forever starts
        with log.open("a") as f:
            f.write("xl2tpd[147]: Connection established to 10.99.1.2, 1701.  Local: 28398, Remote: 58717 "
                    "(ref=0/0).  LNS session is 'default'\n"
                    "xl2tpd[147]: Call established with 10.99.1.2, PID: 151, Local: 19361, Remote: 13604, Serial: 1\n")
        call, why = s.watch.call_of(151, s.wait)  # before: "no call names this pid" after the 3 s
        assert call is not None, why
        assert (call.tunnel_id, call.peer_tunnel_id, call.call_id, call.peer_call_id) == (28398, 58717, 19361, 13604)
        assert s.watch.pending and s.watch.pending[-1].event == "CallUp"  # the watcher still gets the events
    finally:
        d.close()


def test_fdevent_wakes_a_select_and_drains():
    ev = FdEvent()
    assert not readable(ev)
    ev.kick()
    assert readable(ev) and not ev.is_set()
    ev.drain()
    assert not readable(ev)
    ev.set()
    assert readable(ev) and ev.is_set()


def _watcher(tmp_path, **kw):
    log = tmp_path / "xl2tpd.log"
    log.write_text("xl2tpd[147]: xl2tpd version xl2tpd-1.3.18 started on (none) PID:147\n")
    d = Discovery([str(log)], proc=False, kernel=False)
    d.refresh(events=False)
    w = CallWatch(d, log_interval=0.05, reconcile_interval=3600)
    w.IDLE_INTERVAL = 60.0
    w.ACTIVE_FOR = 0.0
    stop, reload = FdEvent(), FdEvent()
    ticks, reloads = [], []
    t = threading.Thread(target=w.run, args=(stop, reload), daemon=True,
                         kwargs={"handle": lambda ev: None, "reloaded": lambda ev: reloads.append(1),
                                 "tick": lambda: ticks.append(time.monotonic()), **kw})
    t.start()
    time.sleep(0.3)  # the first round is done: the watcher sleeps now
    return log, d, w, stop, reload, t, ticks, reloads


def test_a_quiet_watcher_sleeps_and_is_woken_by_an_exit_a_reload_and_a_stop(tmp_path):
    ex = Exits()
    p = subprocess.Popen(["sleep", "30"])
    ex.watch(p.pid)
    log, d, w, stop, reload, t, ticks, reloads = _watcher(tmp_path, exits=ex)
    try:
        n = len(ticks)
        time.sleep(1.0)
        assert len(ticks) == n  # idle: no round within a second (the interval is a minute here)
        p.kill()
        p.wait()
        end = time.monotonic() + 5
        while len(ticks) == n and time.monotonic() < end:
            time.sleep(0.02)
        assert len(ticks) > n, "an exit did not wake the watcher"
        assert ex.exited() == {p.pid}
        reload.set()
        end = time.monotonic() + 5
        while not reloads and time.monotonic() < end:
            time.sleep(0.02)
        assert reloads, "SIGHUP's reload did not wake the watcher"
        stop.set()
        t.join(5)
        assert not t.is_alive(), "stop did not wake the watcher"
    finally:
        stop.set()
        ex.close()
        d.close()


def test_a_request_waiting_for_its_line_wakes_the_watcher_and_gets_its_call(tmp_path):
    """... and says how long it waited for the line: from its request, not
    from its pppd's fork (forked a while before it asked, here)."""
    pppd = subprocess.Popen(["sleep", "30"])
    time.sleep(0.6)
    log, d, w, stop, reload, t, ticks, reloads = _watcher(tmp_path)
    try:
        def later():
            time.sleep(0.5)
            with log.open("a") as f:
                f.write("xl2tpd[147]: Connection established to 10.99.1.2, 1701.  Local: 28398, Remote: 58717 "
                        "(ref=0/0).  LNS session is 'default'\n"
                        f"xl2tpd[147]: Call established with 10.99.1.2, PID: {pppd.pid}, Local: 19361, Remote: 13604, "
                        "Serial: 1\n")
        threading.Thread(target=later, daemon=True).start()
        t0 = time.monotonic()
        timing = {}
        call, why = w.call_of(pppd.pid, 20.0, timing=timing)
        took = time.monotonic() - t0
        assert call is not None, why
        assert took < 10  # not the minute of an idle watcher
        assert 0.4 <= timing["line"] <= took, (timing, took)
        assert w.waiting == 0
    finally:
        stop.set()
        t.join(5)
        d.close()
        pppd.kill()
        pppd.wait()


def test_waiting_requests_look_at_the_model_for_news_not_at_each_watcher_round(tmp_path):
    """K requests wait for lines that do not come.  A line that names none
    of them wakes each once; after it, the watcher reads the log several
    times and no request looks again (until its own timeout, a second).
    Before, each of them read the log and its pppd's /proc entry at every
    watcher round: K looks per round (a herd of K threads under one lock)."""
    log, d, w, stop, reload, t, ticks, reloads = _watcher(tmp_path)
    k = 20

    def until(cond, what):
        end = time.monotonic() + 5
        while not cond() and time.monotonic() < end:
            time.sleep(0.01)
        assert cond(), what

    try:
        threads = [threading.Thread(target=w.call_of, args=(151 + i, 4.0)) for i in range(k)]
        for th in threads:
            th.start()
        until(lambda: w.waiting == k and w.looks >= k, "the requests did not start waiting")
        looks = w.looks
        with log.open("a") as f:
            f.write("xl2tpd[147]: Connection established to 10.99.1.2, 1701.  Local: 28398, Remote: 58717 "
                    "(ref=0/0).  LNS session is 'default'\n")
        until(lambda: w.looks >= looks + k, "a line did not wake each waiting request")
        looks, polls, real = w.looks, [0], d.poll

        def counted(*a, **kw):
            polls[0] += 1
            return real(*a, **kw)
        d.poll = counted
        time.sleep(0.5)  # the watcher reads the log every 0.05 s while requests wait
        assert polls[0] >= 3, f"the watcher read the log {polls[0]} times"
        assert w.looks == looks, f"{w.looks - looks} looks at the model while nothing came"
        for th in threads:
            th.join(10)
        assert w.waiting == 0
    finally:
        stop.set()
        t.join(5)
        d.close()


def test_the_daemon_saves_at_stop_and_resumes_at_start(tmp_path, caplog):
    """CallWatch: save_checkpoint writes only when lines were read since;
    first_read resumes, and reads only what came after."""
    caplog.set_level("INFO", logger="pipexctl.serve")
    lines = (DATA / "lns-kernel.log").read_text().splitlines(keepends=True)
    log = tmp_path / "syslog"
    log.write_text("".join(lines[:40]))
    path = tmp_path / "discovery.json"
    w = CallWatch(Discovery([str(log)], proc=False, kernel=False), checkpoint_path=str(path))
    w.first_read()
    w.save_checkpoint()
    first = path.stat().st_mtime_ns
    w.save_checkpoint()
    assert path.stat().st_mtime_ns == first, "nothing read since: not written again"
    known = model(w.discovery)
    w.discovery.close()
    with log.open("a") as f:
        f.write("".join(lines[40:]))
    w2 = CallWatch(Discovery([str(log)], proc=False, kernel=False), checkpoint_path=str(path))
    w2.first_read()
    assert w2.discovery.lines_read() == len(lines) - 40
    assert "resumed at offset" in caplog.text
    whole = Discovery([str(log)], proc=False, kernel=False)
    whole.refresh(control=False, events=False)
    assert model(w2.discovery) == model(whole) != known
    whole.close()
    w2.discovery.close()


class CostlyScans:
    """A discovery whose full poll (its /proc and kernel scans) costs 0.1 s
    of CPU: counts them."""

    proc = False

    def __init__(self):
        import types

        self.full, self.warnings, self.poll_seconds = 0, [], {}
        self.tracker = types.SimpleNamespace(instances={})

    def poll(self, reconcile=False, scanned=None, scanned_at=None, logs=True):
        if reconcile:
            self.full += 1
            end = time.thread_time() + 0.1
            while time.thread_time() < end:
                pass
        return []

    def lines_read(self):
        return 0


def test_full_polls_take_at_most_a_tenth_of_a_cpu():
    """Asked to reconcile every 0.01 s, a watcher whose full polls cost 0.1 s
    of CPU each runs the next no sooner than 1 s later: in 1.5 s, two at
    most (without the rule, one per round: about ten)."""
    d = CostlyScans()
    w = CallWatch(d, log_interval=0.02, reconcile_interval=0.01)
    stop, reload = FdEvent(), FdEvent()
    t = threading.Thread(target=w.run, args=(stop, reload), daemon=True,
                         kwargs={"handle": lambda ev: None, "reloaded": lambda ev: None, "tick": lambda: None,
                                 "busy": lambda: True})
    t.start()
    time.sleep(1.5)
    stop.set()
    t.join(5)
    assert not t.is_alive()
    assert 1 <= d.full <= 2, d.full
    assert w.scan_cpu >= 0.1


def test_a_scan_that_fails_is_logged_and_the_watcher_goes_on(tmp_path, monkeypatch, caplog):
    """Whatever a /proc scan raises (before procscan read names as bytes, a
    process named with bytes that are not UTF-8 did it), the watcher logs it,
    skips that round's reconcile and scans again the next round."""
    from pipexctl.discovery import procscan

    log = tmp_path / "xl2tpd.log"
    log.write_text("")
    d = Discovery([str(log)], proc=True, kernel=False)
    w = CallWatch(d, reconcile_interval=3600)
    real, calls = procscan.scan, []

    def scan(**kw):
        calls.append(kw)
        if len(calls) == 1:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return real(**kw)

    monkeypatch.setattr(procscan, "scan", scan)
    with caplog.at_level("ERROR", logger="pipexctl"):
        w._poll(True, lambda ev: None)
    assert "the /proc scan failed" in caplog.text and "proc" not in d.poll_seconds
    w._poll(True, lambda ev: None)
    assert len(calls) == 2 and "proc" in d.poll_seconds
    d.close()
