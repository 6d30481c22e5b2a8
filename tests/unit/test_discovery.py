"""Tracker events, control-pipe replies, log following, on recorded xl2tpd logs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pipexctl.discovery import control as ctl, logparse as lp
from pipexctl.discovery.discovery import Discovery, LogFile
from pipexctl.discovery.state import Tracker

DATA = Path(__file__).parent / "data"


def events(name, lines):
    t = Tracker()
    out = []
    for r in lp.parse_lines(lines):
        out += t.apply(name, r)
    return t, out


def brief(e):
    o = getattr(e, "call", None) or e.tunnel
    if hasattr(o, "call_id"):
        return (e.event, o.tunnel_id, o.call_id, o.peer_call_id, o.pppd_pid, o.data_path)
    return (e.event, o.tunnel_id, o.peer_tunnel_id, o.role)


def test_lns_userspace_log():
    t, ev = events("lns", (DATA / "lns-userspace.log").read_text().splitlines())
    assert [brief(e) for e in ev] == [
        ("TunnelUp", 28398, 58717, "lns"),
        ("CallUp", 28398, 19361, 13604, 151, "userspace"),
        ("TunnelUp", 25824, 2547, "lns"),
        ("CallUp", 25824, 52848, 37505, 153, "userspace"),
        ("CallDown", 25824, 52848, 37505, 153, "userspace"),
        ("TunnelDown", 25824, 2547, "lns"),
        ("CallDown", 28398, 19361, 13604, 151, "userspace"),
    ]
    assert [x.tunnel_id for x in t.tunnels()] == [28398] and t.calls() == []


def test_lns_kernel_mode_maps_calls_by_argv_ids():
    _, ev = events("lns", (DATA / "lns-kernel.log").read_text().splitlines())
    ups = [brief(e) for e in ev if e.event == "CallUp"]
    assert ups == [("CallUp", 55248, 63662, 48066, 237, "kernel"), ("CallUp", 39027, 54544, 13101, 239, "kernel")]
    assert [e.event for e in ev].count("TunnelDown") == 2


def test_lac_logs():
    _, ev = events("lac", (DATA / "lac1-userspace.log").read_text().splitlines())
    assert brief(ev[1]) == ("CallUp", 58717, 13604, 19361, None, "unknown")
    assert ev[2].event == "CallUpdated" and ev[2].call.data_path == "userspace"
    assert ev[3].event == "CallUpdated" and ev[3].call.section == "lns"  # from the status dump
    assert [e.event for e in ev[4:]] == ["CallDown", "TunnelDown"]
    _, ev = events("lac", (DATA / "lac2-kernel.log").read_text().splitlines())
    assert [e.event for e in ev] == ["TunnelUp", "CallUp", "CallUpdated", "CallDown", "TunnelDown"]
    assert ev[2].call.pppd_argv[:3] == ["/usr/sbin/pppd", "plugin", "pppol2tp.so"]


def test_each_event_once_even_when_facts_repeat():
    lines = (DATA / "lns-kernel.log").read_text().splitlines()
    t = Tracker()
    end = next(i for i, ln in enumerate(lines) if "Tunnel default, ID" in ln) + 1
    recs = lp.parse_lines(lines[:end])
    first = [e for r in recs for e in t.apply("x", r)]
    again = [e for r in recs if isinstance(r, (lp.StatusTunnel, lp.StatusCall)) for e in t.apply("x", r)]
    assert [e.event for e in first].count("CallUp") == 2 and again == []


def test_xl2tpd_restart_ends_the_old_objects():
    a = "xl2tpd[10]: Connection established to 10.0.0.2, 1701.  Local: 5, Remote: 6 (ref=0/0).  LNS session is 'd'"
    b = "xl2tpd[11]: xl2tpd version xl2tpd-1.3.18 started on h PID:11"
    _, ev = events("x", [a, b])
    assert [e.event for e in ev] == ["TunnelUp", "TunnelDown"]
    assert "replaced" in ev[1].reason


def test_ambiguous_call_waits_for_a_tunnel_id():
    """Two tunnels from one address (two LACs behind one NAT): the call
    gets its tunnel, and that tunnel's port, from the status dump."""
    lines = [
        "xl2tpd[1]: Connection established to 10.0.0.2, 1701.  Local: 5, Remote: 6 (ref=0/0).  LNS session is 'd'",
        "xl2tpd[1]: Connection established to 10.0.0.2, 1702.  Local: 7, Remote: 8 (ref=0/0).  LNS session is 'd'",
        "xl2tpd[1]: Call established with 10.0.0.2, PID: 99, Local: 100, Remote: 200, Serial: 1",
    ]
    t, ev = events("x", lines)
    assert ev[-1].event == "CallUp" and ev[-1].call.tunnel_id is None  # two tunnels to one peer: not guessed
    assert ev[-1].call.ids() is None
    more = [e for r in lp.parse_lines([
        "xl2tpd[1]: Tunnel d, ID = 7 (local), 8 (remote) to 10.0.0.2:1702, x",
        "xl2tpd[1]: Call d # 1, ID = 100 (local), 200 (remote), serno = 1, x"]) for e in t.apply("x", r)]
    assert more[-1].event == "CallUpdated" and more[-1].call.tunnel_id == 7
    assert more[-1].call.ids() == (7, 8, 100, 200, 1702)


def test_a_call_the_control_pipe_placed_keeps_its_tunnel_when_its_line_names_only_the_address():
    """Two tunnels to one address; the control pipe listed call 100 in
    tunnel 7 (port 1702) before its line was read: the line completes the
    call, which keeps tunnel 7 and its port (it was ended as a reused id
    and replaced by one with no tunnel)."""
    from pipexctl.discovery.state import CallInfo

    t, _ = events("x", [
        "xl2tpd[1]: Connection established to 10.0.0.2, 1701.  Local: 5, Remote: 6 (ref=0/0).  LNS session is 'd'",
        "xl2tpd[1]: Connection established to 10.0.0.2, 1702.  Local: 7, Remote: 8 (ref=0/0).  LNS session is 'd'"])
    ins = t.instances["x"]
    t.call_up(ins, CallInfo(instance="x", role="lns", section="d", peer="10.0.0.2", peer_port=1702, tunnel_id=7,
                            peer_tunnel_id=8, call_id=100, sources=["control"]))
    ev = [e for r in lp.parse_lines(["xl2tpd[1]: Call established with 10.0.0.2, PID: 99, Local: 100, Remote: 200, "
                                     "Serial: 1"]) for e in t.apply("x", r)]
    assert [e.event for e in ev] == ["CallUp"]
    assert ins.calls[100].ids() == (7, 8, 100, 200, 1702) and ins.calls[100].pppd_pid == 99


def test_control_reply_parsing_real_text():
    av = ctl.parse_available(ctl.parse_reply(
        "00 OK\n00 AVAILABLE lns.0.name=default\n00 AVAILABLE lns.count=1\n00 AVAILABLE lac.0.name=\n"
        "00 AVAILABLE lac.count=1\n00 AVAILABLE tunnel 0x56406db169d0, id 2547, ourtid 25824 has 1 calls and self "
        "0x56406db204c0\n00 AVAILABLE tunnels count=1\n00 AVAILABLE calls count=0\n"))
    assert av.lns == ["default"] and av.lac == []
    assert av.tunnels == [ctl.AvailableTunnel(peer_tunnel_id=2547, tunnel_id=25824, calls=1)]
    st = ctl.parse_status_lns(ctl.parse_reply(
        "00 OK\n00 STATUS tunnels.0.id=2547\n00 STATUS tunnels.0.peer=10.99.2.2:1701\n"
        "00 STATUS tunnels.0.calls.0.id=52848\n00 STATUS tunnels.0.calls.0.tx_bytes=273\n"
        "00 STATUS tunnels.0.calls.0.rx_bytes=173\n00 STATUS tunnels.0.calls.0.tx_pkts=9\n"
        "00 STATUS tunnels.0.calls.0.rx_pkts=8\n00 STATUS tunnels.0.calls.count=1\n00 STATUS tunnels.count=1\n"))
    assert st[0].peer_tunnel_id == 2547 and (st[0].peer, st[0].peer_port) == ("10.99.2.2", 1701)
    assert st[0].calls[52848] == ctl.StatusCall(52848, 273, 173, 9, 8)
    with pytest.raises(ctl.ControlError, match="malformed"):
        ctl.parse_reply("garbage")
    assert not ctl.parse_reply("01 Error: Could not find lns\n").ok


def test_control_client_errors(tmp_path):
    c = ctl.ControlClient(str(tmp_path / "nope"), timeout=0.3)
    with pytest.raises(ctl.ControlError, match="does not exist"):
        c.available()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ctl.ControlError, match="xl2tpd is not running"):
        ctl.ControlClient(str(fifo), timeout=0.3).available()


def test_control_client_protocol(tmp_path):
    """The request bytes and the reply path, against a stand-in that speaks
    xl2tpd's side of the FIFO protocol (the real xl2tpd: tests/kernel)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    seen = {}

    def server():
        with open(fifo, "rb") as f:
            req = f.read().decode()
        seen["req"] = req
        path, letter = req[1:].split(" ")[:2]
        with open(path, "w") as r:
            r.write("00 OK\n00 STATUS tunnels.count=0\n")

    th = threading.Thread(target=server, daemon=True)
    th.start()
    import time

    time.sleep(0.1)
    st = ctl.ControlClient(str(fifo), timeout=3).status_lns("default")
    th.join(3)
    assert st == [] and seen["req"].startswith("@") and seen["req"].endswith(" y default\n")


def test_control_client_waits_when_xl2tpd_opened_the_reply_fifo_but_has_not_written(tmp_path, monkeypatch):
    """select() can report the reply FIFO readable (no writer yet: EOF) just
    before xl2tpd opens it; the read then finds a writer and no data and
    fails with EAGAIN.  Seen in the guest under load: it failed an offload
    request.  select() is made to always say "ready" so the window is hit
    every time."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    monkeypatch.setattr(ctl.select, "select", lambda r, w, x, t: (r, [], []))

    def server():
        with open(fifo, "rb") as f:
            path = f.read().decode()[1:].split(" ")[0]
        fd = os.open(path, os.O_WRONLY)  # opened, nothing written yet
        import time

        time.sleep(0.3)
        os.write(fd, b"00 OK\n00 STATUS tunnels.count=0\n")
        os.close(fd)

    th = threading.Thread(target=server, daemon=True)
    th.start()
    import time

    time.sleep(0.1)
    assert ctl.ControlClient(str(fifo), timeout=3).status_lns("default") == []
    th.join(3)


class ReopeningXl2tpd:
    """A stand-in for xl2tpd's control FIFO reader that closes its end while
    a client is about to write, as xl2tpd does between two writers, so the
    client's write meets a real EPIPE; it reopens ``reopen_at`` seconds
    after ``began`` and answers the request it then reads."""

    def __init__(self, fifo, reopen_at: float) -> None:
        import time

        self.fifo, self.reopen_at, self.began = fifo, reopen_at, time.monotonic()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        import time

        os.close(os.open(self.fifo, os.O_RDONLY))  # returns once the client opened to write: close at once
        self.closed.set()
        time.sleep(max(0.0, self.began + self.reopen_at - time.monotonic()))
        with open(self.fifo, "rb") as f:
            data = f.read()
        path = data.decode()[1:].split(" ")[0]
        with open(path, "w") as r:
            r.write("00 OK\n00 STATUS tunnels.count=0\n")

    def patch_write(self, monkeypatch, first_at: float = 0.0) -> list:
        """The client's first write waits until the reader has gone (and
        until ``first_at``), then writes for real: EPIPE."""
        import time

        real_write, calls = os.write, []

        def write(fd, data):
            calls.append(data)
            if len(calls) == 1:
                assert self.closed.wait(3)
                time.sleep(max(0.0, self.began + first_at - time.monotonic()))
            return real_write(fd, data)

        monkeypatch.setattr(ctl.os, "write", write)
        return calls


def test_control_client_writes_again_when_xl2tpd_reopens_its_pipe(tmp_path, monkeypatch):
    """xl2tpd closes and reopens its end of the FIFO after each writer: a
    write in between fails with EPIPE (the churn's harness hit it after 280
    cycles).  The request is sent again once xl2tpd reads again."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    x = ReopeningXl2tpd(fifo, reopen_at=0.1)
    calls = x.patch_write(monkeypatch)
    x.thread.start()
    assert ctl.ControlClient(str(fifo), timeout=3).status_lns("default") == []
    x.thread.join(3)
    assert not x.thread.is_alive()
    assert len(calls) == 2 and calls[0] == calls[1]


def test_control_client_allows_xl2tpd_a_slow_reopen_after_a_broken_pipe(tmp_path, monkeypatch):
    """The "not running" allowance for ENXIO (0.5 s) counts afresh after an
    EPIPE: xl2tpd was reading a moment before.  Here the write fails 0.45 s
    in and xl2tpd reopens 0.6 s in, past the first allowance: without the
    fresh count the request fails as "not running"."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    x = ReopeningXl2tpd(fifo, reopen_at=0.6)
    calls = x.patch_write(monkeypatch, first_at=0.45)
    x.thread.start()
    assert ctl.ControlClient(str(fifo), timeout=3).status_lns("default") == []
    x.thread.join(3)
    assert len(calls) == 2


def test_control_client_full_pipe_is_a_clear_error(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # xl2tpd holds it open and does not read
    wfd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        try:
            while True:
                os.write(wfd, b"x" * 4096)
        except BlockingIOError:
            pass
        with pytest.raises(ctl.ControlError, match="is full"):
            ctl.ControlClient(str(fifo), timeout=0.5).available()
    finally:
        os.close(wfd)
        os.close(rfd)


def test_logfile_follows_rotation_and_truncation(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("a\nb\npart")
    f = LogFile(str(p))
    assert f.read_lines() == ["a", "b"]
    with open(p, "a") as w:
        w.write("ial\nc\n")
    assert f.read_lines() == ["partial", "c"]
    with open(p, "a") as w:
        w.write("last-of-old\n")
    os.rename(p, tmp_path / "x.log.1")
    p.write_text("new1\n")
    assert f.read_lines() == ["last-of-old", "new1"]
    p.write_text("t\n")  # truncated in place (copytruncate)
    assert f.read_lines() == ["t"]
    f.close()


def test_a_large_log_is_read_in_bounded_chunks_and_nothing_is_lost(tmp_path, monkeypatch):
    """Each read takes at most LogFile.CHUNK bytes (a lines split across two
    chunks is joined); discovery reads chunk after chunk until the end, so
    the model is the same as from one read of the whole file."""
    lines = (DATA / "lns-kernel.log").read_text().splitlines()
    log = tmp_path / "part.log"  # up to the moment both calls are up
    log.write_text("\n".join(lines[:next(i for i, ln in enumerate(lines) if "statistics" in ln)]) + "\n")
    whole = Discovery([str(log)], proc=False, kernel=False)
    want = whole.snapshot().as_dict()
    whole.close()
    reads = []
    real = LogFile._drain

    def counting(self):
        out = real(self)
        reads.append(self.more)
        return out

    monkeypatch.setattr(LogFile, "CHUNK", 997)  # a prime: chunks end inside lines
    monkeypatch.setattr(LogFile, "_drain", counting)
    d = Discovery([str(log)], proc=False, kernel=False)
    got = d.snapshot().as_dict()
    d.close()
    size = log.stat().st_size
    assert len(reads) >= size // 997 and reads.count(True) == size // 997
    for snap in (want, got):
        for t in snap["tunnels"]:
            t.pop("since", None)
        for c in snap["calls"]:
            c.pop("since", None)
    assert got["tunnels"] == want["tunnels"] and got["calls"] == want["calls"]
    got["stats"].pop("at", None), want["stats"].pop("at", None)
    assert len(got["calls"]) == 2 and got["stats"] == want["stats"]


def test_discovery_snapshot_from_logs(tmp_path):
    d = Discovery([str(DATA / "lns-kernel.log")], proc=False, kernel=False)
    lines = (DATA / "lns-kernel.log").read_text().splitlines()
    # the state right after the two calls came up
    cut = next(i for i, ln in enumerate(lines) if "statistics" in ln)
    part = tmp_path / "part.log"
    part.write_text("\n".join(lines[:cut]) + "\n")
    d = Discovery([str(part)], proc=False, kernel=False)
    snap = d.snapshot().as_dict()
    d.close()
    assert [(c["tunnel_id"], c["call_id"], c["pppd_pid"], c["data_path"]) for c in snap["calls"]] == [
        (39027, 54544, 239, "kernel"), (55248, 63662, 237, "kernel")]
    assert snap["stats"]["malformed"] == 0 and snap["stats"]["lines"] == cut


@pytest.mark.parametrize("name", ["lns-userspace.log", "lns-kernel.log", "lac1-userspace.log", "lac2-kernel.log"])
def test_refresh_without_events_builds_the_same_model(tmp_path, name):
    """refresh(events=False) (a daemon's start) makes no events, and leaves
    the tracker exactly as a refresh whose events are read; the next refresh
    makes events again."""
    lines = (DATA / name).read_text().splitlines()
    part = tmp_path / "part.log"
    part.write_text("\n".join(lines[: len(lines) * 2 // 3]) + "\n")
    loud, quiet = (Discovery([str(part)], proc=False, kernel=False) for _ in range(2))
    try:
        made = loud.refresh(control=False)
        assert made, "the recorded log makes events: the comparison below means something"
        assert quiet.refresh(control=False, events=False) == []
        for kind in ("calls", "tunnels"):  # `since` is the clock's when the log has no time stamps
            assert [x.dump(exclude={"since"}) for x in getattr(quiet.tracker, kind)()] == \
                [x.dump(exclude={"since"}) for x in getattr(loud.tracker, kind)()]
        with part.open("a") as f:
            f.write("\n".join(lines[len(lines) * 2 // 3:]) + "\n")
        assert [brief(e) for e in quiet.refresh(control=False)] == [brief(e) for e in loud.refresh(control=False)]
    finally:
        loud.close()
        quiet.close()


def test_lac_argv_at_the_end_of_the_log_is_used(tmp_path):
    lines = (DATA / "lac1-userspace.log").read_text().splitlines()
    end = max(i for i, ln in enumerate(lines) if ln.endswith('"/lab/lac1/options" ')) + 1
    part = tmp_path / "lac.log"
    part.write_text("\n".join(lines[:end]) + "\n")
    d = Discovery([str(part)], proc=False, kernel=False)
    (c,) = d.snapshot().calls
    d.close()
    assert c.pppd_argv[1] == "/dev/pts/0" and c.data_path == "userspace"


CONCURRENT_LAC = """\
xl2tpd[144]: xl2tpd version xl2tpd-1.3.18 started on (none) PID:144
xl2tpd[144]: Connection established to 10.99.1.1, 1701.  Local: 45744, Remote: 41210 (ref=0/0).
xl2tpd[144]: Calling on tunnel 45744
xl2tpd[144]: Connection established to 10.99.1.1, 1701.  Local: 1588, Remote: 10910 (ref=0/0).
xl2tpd[144]: Calling on tunnel 1588
xl2tpd[144]: Connection established to 10.99.1.1, 1701.  Local: 19178, Remote: 26788 (ref=0/0).
xl2tpd[144]: Calling on tunnel 19178
xl2tpd[144]: Call established with 10.99.1.1, Local: 36108, Remote: 38773, Serial: 3 (ref=0/0)
xl2tpd[144]: Call established with 10.99.1.1, Local: 18800, Remote: 12843, Serial: 1 (ref=0/0)
xl2tpd[144]: Call established with 10.99.1.1, Local: 56946, Remote: 60441, Serial: 2 (ref=0/0)
"""


@pytest.mark.parametrize("with_start", [True, False])
def test_concurrent_lac_calls_get_their_tunnels_by_serial(with_start):
    """Three [lac] sections dial one LNS at once (seen in the guest): the
    lines interleave, and "Call established" names no tunnel.  xl2tpd numbers
    outgoing calls in the order of its "Calling on tunnel" lines."""
    lines = CONCURRENT_LAC.splitlines()
    if not with_start:  # a log followed from the middle: no anchor until a call is unambiguous
        lines = lines[1:]
    t, ev = events("lac", lines)
    got = {e.call.call_id: e.call.tunnel_id for e in ev if e.event == "CallUp"}
    if with_start:
        assert got == {36108: 19178, 18800: 45744, 56946: 1588}
    else:
        # three candidates for the first: none guessed (the daemon then waits and says why)
        assert got[36108] is None
    # and a later call, once anchored, maps exactly again
    more = ["xl2tpd[144]: Calling on tunnel 1588", "xl2tpd[144]: Calling on tunnel 45744",
            "xl2tpd[144]: Call established with 10.99.1.1, Local: 7, Remote: 8, Serial: 5 (ref=0/0)",
            "xl2tpd[144]: Call established with 10.99.1.1, Local: 9, Remote: 10, Serial: 4 (ref=0/0)"]
    if with_start:
        ev = [e for r in lp.parse_lines(more) for e in t.apply("lac", r)]
        assert {e.call.call_id: e.call.tunnel_id for e in ev if e.event == "CallUp"} == {7: 45744, 9: 1588}


def test_a_serial_with_no_pending_line_drops_the_anchor():
    """A lost "Calling on tunnel" line shows as a serial that names no pending
    line: the anchor goes, and only an unambiguous call is mapped after it."""
    lines = CONCURRENT_LAC.splitlines()
    del lines[2]  # serial 1's line is lost: two pending lines left, for serials 2 and 3
    t, ev = events("lac", lines)
    got = {e.call.call_id: e.call.tunnel_id for e in ev if e.event == "CallUp"}
    # Serial 3 arrives first: no 3rd pending line -> anchor dropped; two candidates -> unknown,
    # and so for the rest (none of them is guessed)
    assert got == {36108: None, 18800: None, 56946: None}
    assert t.inst("lac").serial_anchor is None


def test_a_call_whose_child_has_not_exec_d_pppd_yet_is_not_ended_by_a_proc_scan(tmp_path):
    """xl2tpd logs "Call established ... PID: N" right after fork(), while
    child N may still be a copy of xl2tpd that has not exec'd pppd (a slow
    machine under a login storm): a /proc scan then is no proof the call
    ended (seen: 2 of 25 calls refused in a Debian 13 storm).  A gone
    process still ends it.  This test process stands in for xl2tpd; a
    ``sleep`` child for its pppd before the exec."""
    import subprocess

    from pipexctl.discovery import procscan

    child = subprocess.Popen(["sleep", "60"])
    try:
        me = os.getpid()
        log = tmp_path / "x.log"
        log.write_text(f"xl2tpd[{me}]: Connection established to 10.99.1.2, 1701.  Local: 28398, Remote: 58717 "
                       f"(ref=0/0).  LNS session is 'default'\n"
                       f"xl2tpd[{me}]: Call established with 10.99.1.2, PID: {child.pid}, Local: 19361, "
                       f"Remote: 13604, Serial: 1\n")
        d = Discovery([str(log)], proc=False, kernel=False)
        d.poll(reconcile=False)
        d.proc = True
        (c,) = d.tracker.calls()
        assert c.pppd_pid == child.pid and d.tracker.inst(d.sources[0].name).daemon_pid == me
        xl2tpd = procscan.Proc(pid=me, ppid=os.getppid(), comm="xl2tpd", argv=["xl2tpd"], start=0)
        assert d._reconcile_proc(scanned=([xl2tpd], {me: []})) == []
        assert [x.call_id for x in d.tracker.calls()] == [19361]
        child.kill()
        child.wait()
        (down,) = d._reconcile_proc(scanned=([xl2tpd], {me: []}))
        assert down.reason == f"pppd {child.pid} exited" and d.tracker.calls() == []
        d.close()
    finally:
        child.kill()
        child.wait()


def test_a_forked_child_of_xl2tpd_still_named_xl2tpd_is_no_daemon():
    """Between fork() and exec of pppd, xl2tpd's child carries its name: the
    scan counts the parent alone as an xl2tpd (comm set with prctl here)."""
    import subprocess
    import sys

    from pipexctl.discovery import procscan

    code = ("import ctypes, os, sys, time\n"
            "ctypes.CDLL(None).prctl(15, b'xl2tpd', 0, 0, 0)\n"  # PR_SET_NAME
            "kid = os.fork()\n"
            "if kid == 0:\n    time.sleep(60)\n    os._exit(0)\n"
            "print(kid, flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        kid = int(p.stdout.readline())
        assert procscan.comm_ppid(kid) == ("xl2tpd", p.pid)
        daemons, children = procscan.scan()
        pids = {d.pid for d in daemons}
        assert p.pid in pids and kid not in pids and children[p.pid] == []
    finally:
        p.kill()
        p.wait()
        try:
            os.kill(kid, 9)
        except (ProcessLookupError, NameError):
            pass


def test_every_record_type_is_applied_or_named_as_carrying_nothing():
    """Tracker.apply dispatches on the record's type: a new record type in
    logparse must get a handler or be named here as one the model ignores."""
    from pipexctl.discovery import state

    ignored = {"Connecting", "Disconnecting", "Listening", "Malformed", "PppdTerminating", "Unparsed"}
    kinds = {c for c in vars(lp).values() if isinstance(c, type) and issubclass(c, lp.Rec) and c is not lp.Rec}
    assert {c.__name__ for c in kinds - set(state._ON_RECORD)} == ignored
    assert all(c.__bases__ == (lp.Rec,) for c in kinds)  # a subclass would miss its parent's handler
