"""Trust decisions of `pipexctl serve` that need no kernel: an exit, not a
log line, ends an offloaded call; a second (or forged) xl2tpd pid in a
stream is not a restart; the requester is judged by /proc, not by name;
the daemon's directories are private.  Real processes stand in for pppd and
xl2tpd (their pidfds are what the service watches); the guest tests run the
same attacks against real xl2tpd, pppd and kernel (tests/kernel/test_trust.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from pipexctl import errors
from pipexctl.discovery import logparse as lp, procscan
from pipexctl.discovery.discovery import Discovery
from pipexctl.discovery.state import CallDown, CallInfo, Tracker, TunnelDown, TunnelInfo
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload import endings, paths, statefile
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.exits import Exits
from pipexctl.offload.ptys import PtyHolder
from pipexctl.offload.server import OffloadServer, prove_requester


def child():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def call(cid, pid, tid=100):
    return CallInfo(instance="xl2tpd", role="lns", peer="192.0.2.7", peer_port=1701, tunnel_id=tid,
                    peer_tunnel_id=200, call_id=cid, peer_call_id=cid + 1000, pppd_pid=pid, data_path="kernel")


@pytest.fixture
def svc(tmp_path):
    s = OffloadServer(str(tmp_path / "serve.sock"), Discovery([], proc=False, kernel=False), NullBackend(),
                      NullDataPath()).service
    s.channels = []
    yield s
    for ts in s.tunnels.values():
        if ts.sock is not None:
            ts.sock.close()
    s.exits.close()


def offload(svc, c, xl2tpd_pid=None):
    ch, _ = svc.offload(c, c.pppd_pid, xl2tpd_pid=xl2tpd_pid)
    svc.channels.append(ch)


def test_exits_reports_a_watched_process_once_it_has_exited():
    ex = Exits()
    p = child()
    assert ex.watch(p.pid) and ex.alive(p.pid) and ex.exited() == set()
    p.kill()
    p.wait()
    assert ex.exited() == {p.pid} and not ex.alive(p.pid)
    ex.unwatch(p.pid)
    assert ex.exited() == set()
    assert not ex.watch(p.pid)  # already gone: nothing to watch
    ex.close()


def test_a_call_down_while_its_pppd_runs_is_kept_until_the_pppd_exits(svc, monkeypatch):
    pppd = child()
    try:
        offload(svc, call(1, pppd.pid))
        svc.on_event(CallDown(call=call(1, pppd.pid), reason="forged call_close line"))
        assert 1 in svc.tunnels[("xl2tpd", 100)].records and svc.backend.session_get(100, 1)
        svc.sweep()
        assert 1 in svc.tunnels[("xl2tpd", 100)].records  # nothing exited: nothing done
        assert svc.stats["unconfirmed_ends"] == 0  # a real end looks the same for a moment
        monkeypatch.setattr(endings, "UNCONFIRMED_AFTER", 0.0)
        svc.sweep()
        assert svc.stats["unconfirmed_ends"] == 1 and svc.awaiting == {}  # warned once
    finally:
        pppd.kill()
        pppd.wait()
    svc.sweep()  # the exit ends it, with or without discovery's word
    assert svc.tunnels[("xl2tpd", 100)].records == {}
    assert svc.stats["removed"] == 1


def test_a_call_down_after_the_pppd_exited_is_acted_on_at_once(svc):
    pppd = child()
    offload(svc, call(1, pppd.pid))
    pppd.kill()
    pppd.wait()
    svc.on_event(CallDown(call=call(1, pppd.pid), reason="hung up"))
    assert svc.tunnels[("xl2tpd", 100)].records == {} and svc.backend.session_dump() == []


def test_a_tunnel_down_waits_for_its_pppds_then_goes_with_the_last(svc):
    a, b = child(), child()
    try:
        offload(svc, call(1, a.pid))
        offload(svc, call(2, b.pid))
        svc.on_event(TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", peer="192.0.2.7", tunnel_id=100,
                                                  peer_tunnel_id=200), reason="forged: connection closed"))
        ts = svc.tunnels[("xl2tpd", 100)]
        assert sorted(ts.records) == [1, 2] and ts.down == "forged: connection closed"
        a.kill()
        a.wait()
        svc.sweep()
        assert sorted(ts.records) == [2] and ("xl2tpd", 100) in svc.tunnels
    finally:
        b.kill()
        b.wait()
    svc.sweep()
    assert svc.tunnels == {} and svc.backend.tunnel_dump() == [] and svc.datapath.tunnels == {}


def test_the_exit_of_the_tunnels_xl2tpd_ends_it_though_its_pppds_run(svc):
    xl2tpd, pppd = child(), child()
    try:
        offload(svc, call(1, pppd.pid), xl2tpd_pid=xl2tpd.pid)
        assert statefile.load(svc.state_path)[0].tunnels[0].xl2tpd_pid == xl2tpd.pid
        xl2tpd.kill()
        xl2tpd.wait()
        svc.sweep()
        assert svc.tunnels == {} and svc.backend.tunnel_dump() == []
    finally:
        pppd.kill()
        pppd.wait()


def recs(line):
    p = lp.LineParser()
    return p.feed(line) + p.flush()


def apply(t, line):
    return [e for r in recs(line) for e in t.apply("x", r)]


def test_a_second_live_xl2tpd_pid_in_a_stream_is_not_a_restart():
    t = Tracker()
    alive = {147}
    t.daemon_alive = lambda pid: pid in alive
    ev = apply(t, ("xl2tpd[147]: Connection established to 10.99.1.2, 1701.  Local: 5, "
                                    "Remote: 6 (ref=0/0).  LNS session is 'default'"))
    assert [e.event for e in ev] == ["TunnelUp"]
    ev = apply(t, ("xl2tpd[1]: Using l2tp kernel support."))
    assert ev == [] and t.foreign_lines == 1 and [x.tunnel_id for x in t.tunnels()] == [5]
    assert "xl2tpd[1] ignored" in t.notes[0]
    # a second, real, running xl2tpd writing to the same syslog: its own instance
    alive.add(300)
    ev = apply(t, "xl2tpd[300]: Connection established to 10.99.1.3, 1701.  Local: 5, Remote: 9 (ref=0/0).  "
                  "LNS session is 'default'")
    assert [(e.event, e.tunnel.instance) for e in ev] == [("TunnelUp", "x@300")]
    assert sorted((x.instance, x.tunnel_id, x.peer) for x in t.tunnels()) == [("x", 5, "10.99.1.2"),
                                                                              ("x@300", 5, "10.99.1.3")]
    ev = apply(t, "xl2tpd[300]: Connection 9 closed to 10.99.1.3, port 1701 (Goodbye!)")
    assert [(e.event, e.tunnel.instance) for e in ev] == [("TunnelDown", "x@300")]
    assert [(x.instance, x.tunnel_id) for x in t.tunnels()] == [("x", 5)]  # the first one's tunnel 5 untouched
    alive.clear()  # the old pid really gone: now it is a restart
    ev = apply(t, ("xl2tpd[148]: Using l2tp kernel support."))
    assert [e.event for e in ev] == ["TunnelDown"]


def test_the_requester_is_judged_by_proc_not_by_its_name(tmp_path):
    fake = tmp_path / "pppd"
    fake.write_bytes(open(sys.executable, "rb").read())
    fake.chmod(0o755)
    p = subprocess.Popen([str(fake), "-c", "import time; time.sleep(30)"])
    try:
        assert procscan.comm_ppid(p.pid)[0] == "pppd"  # named pppd ...
        assert prove_requester(p.pid) == (None, "not_a_pppd_of_xl2tpd")  # ... but not the system's pppd
    finally:
        p.kill()
        p.wait()
    assert prove_requester(p.pid) == (None, "requester_gone")
    assert procscan.uids(os.getpid()) == (os.getuid(), os.geteuid(), os.getresuid()[2], os.geteuid())


def test_private_dir_makes_0700_and_never_chmods_an_existing_one(tmp_path):
    d = tmp_path / "new" / "sub"
    paths.private_dir(str(d), "socket")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    paths.private_dir(str(shared), "socket")
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o755  # left as the operator made it


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_private_dir_refuses_a_directory_others_can_write(tmp_path, mode):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(errors.PermissionDeniedError, match="writable by group or others"):
        paths.private_dir(str(d), "socket")
    assert stat.S_IMODE(os.stat(d).st_mode) == mode


def test_private_dir_refuses_a_symlink(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(errors.PermissionDeniedError, match="not a directory"):
        paths.private_dir(str(tmp_path / "link"), "state")


def test_the_state_files_temp_path_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "state.json"
    os.symlink(victim, f"{path}.tmp-{os.getpid()}")
    statefile.save(str(path), statefile.State())
    assert victim.read_text() == "precious" and statefile.load(str(path))[0].tunnels == []


def test_a_held_pty_whose_master_closed_is_released_not_spun_on():
    h = PtyHolder()
    master, slave = os.openpty()
    h.hold(("xl2tpd", 7), slave)
    os.write(master, b"lcp echo from xl2tpd")
    os.close(master)  # the call ended: xl2tpd closed its end
    for _ in range(100):
        if h.held(("xl2tpd", 7)) is None:
            break
        time.sleep(0.05)
    assert h.held(("xl2tpd", 7)) is None


def _call_lines(pid, cid, peer="10.99.1.2", tid=28398):
    return (f"xl2tpd[147]: Connection established to {peer}, 1701.  Local: {tid}, Remote: {tid + 1} (ref=0/0).  "
            f"LNS session is 'default'\n"
            f"xl2tpd[147]: Call established with {peer}, PID: {pid}, Local: {cid}, Remote: {cid + 1}, Serial: 1\n")


@pytest.fixture
def watched(tmp_path):
    from pipexctl.offload.watch import CallWatch

    log = tmp_path / "xl2tpd.log"
    log.write_text("xl2tpd[147]: xl2tpd version xl2tpd-1.3.18 started on (none) PID:147\n")
    d = Discovery([str(log)], proc=False, kernel=False)
    d.refresh(events=False)
    yield CallWatch(d), log
    d.close()


def test_a_pppd_claimed_by_two_calls_is_refused_not_guessed(watched):
    w, log = watched
    pppd = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "ipparam", "10.99.1.2"])
    try:
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 100) + _call_lines(pppd.pid, 200, tid=4444))  # the second one forged
        call, why = w.call_of(pppd.pid, 1.0)
        assert call is None and "2 calls name pppd" in why
    finally:
        pppd.kill()
        pppd.wait()


@pytest.mark.parametrize("ipparam,ok", [("10.99.1.2", True), ("10.99.7.7", False)])
def test_the_call_must_be_for_the_peer_xl2tpd_started_the_pppd_for(watched, ipparam, ok):
    w, log = watched
    pppd = _pppd_for(ipparam)
    try:
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 100))
        call, why = w.call_of(pppd.pid, 1.0)
        assert (call is not None) == ok, why
        if not ok:
            assert "but xl2tpd started it for 10.99.7.7 (ipparam)" in why
    finally:
        pppd.kill()
        pppd.wait()


class StubControl:
    """xl2tpd's control pipe as ``available`` and ``status-lns`` parse it:
    tunnel 28398 (the peer's 28399) holding ``calls``; or no answer.
    ``asked`` counts questions (each asks status-lns once: after
    ``available`` in a full one, alone in a question about LNS calls only),
    ``full`` the full ones."""

    pipe = "stub-control"

    def __init__(self, calls, answers=True):
        self.calls, self.answers, self.asked, self.full = calls, answers, 0, 0

    def available(self):
        from pipexctl.discovery import control

        self.full += 1
        if not self.answers:
            self.asked += 1  # no status-lns follows: the question ends here
            raise control.ControlError("no reply from xl2tpd within 2.0 s")
        return control.Available(lns=["default"], tunnels=[control.AvailableTunnel(28399, 28398, len(self.calls))])

    def status_lns(self, name):
        from pipexctl.discovery import control

        self.asked += 1
        if not self.answers:
            raise control.ControlError("no reply from xl2tpd within 2.0 s")
        return [control.StatusTunnel(28399, "10.99.1.2", 1701, {c: control.StatusCall(c) for c in self.calls})]


def _with_control(w, stub):
    (source,) = w.discovery.sources
    source.control = stub
    return stub


def _pppd_for(peer="10.99.1.2"):
    """A stand-in pppd started for ``peer``, once its argv shows in /proc
    (Popen may return while execve is still setting it up: a real pppd asks
    long after)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "ipparam", peer])
    end = time.monotonic() + 10
    while not procscan.argv(p.pid) and time.monotonic() < end:
        time.sleep(0.005)
    return p


def test_a_forged_call_line_written_before_xl2tpds_own_is_passed_over(watched):
    """The forger sees the new pppd in /proc and writes its line first, with
    ids of its choosing; xl2tpd's control pipe does not list that call, so
    the request waits for xl2tpd's own line and gets the real call."""
    w, log = watched
    stub = _with_control(w, StubControl([100]))
    pppd = _pppd_for()
    try:
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 4242))  # the forged one (its tunnel line is real: the same text)
        def real_line_later():
            time.sleep(0.8)
            with log.open("a") as f:
                f.write(f"xl2tpd[147]: Call established with 10.99.1.2, PID: {pppd.pid}, Local: 100, Remote: 101, "
                        f"Serial: 2\n")
        import threading

        t = threading.Thread(target=real_line_later)
        t.start()
        call, why = w.call_of(pppd.pid, 3.0)
        t.join()
        assert call is not None, why
        assert (call.tunnel_id, call.call_id, call.peer_call_id) == (28398, 100, 101)
        assert stub.asked >= 1 and w.unchecked == 0
    finally:
        pppd.kill()
        pppd.wait()


def test_a_call_the_control_pipe_does_not_list_is_refused(watched):
    w, log = watched
    _with_control(w, StubControl([100]))
    pppd = _pppd_for()
    try:
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 4242))
        call, why = w.call_of(pppd.pid, 1.0)
        assert call is None and "does not list it: a forged log line?" in why, why
    finally:
        pppd.kill()
        pppd.wait()


@pytest.mark.parametrize("answers", [True, False])
def test_a_listed_call_is_given_and_a_silent_control_pipe_leaves_the_logs_word_counted(watched, answers):
    w, log = watched
    stub = _with_control(w, StubControl([100], answers=answers))
    pppd = _pppd_for()
    try:
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 100))
        call, why = w.call_of(pppd.pid, 1.0)
        assert call is not None and call.call_id == 100, why
        assert stub.asked == 1 and w.unchecked == (0 if answers else 1)
    finally:
        pppd.kill()
        pppd.wait()


def test_two_tunnels_from_one_address_the_call_gets_its_tunnels_port_from_the_control_pipe(watched):
    """Two LACs behind one NAT address: the LNS log names only the address
    for a call, so the control pipe says which tunnel holds it, and the
    call goes out with that tunnel's port (1702), not 1701's."""
    from pipexctl.discovery import control

    class TwoTunnels(StubControl):
        def available(self):
            self.full += 1
            return control.Available(lns=["default"], tunnels=[control.AvailableTunnel(28399, 28398, 0),
                                                               control.AvailableTunnel(5001, 5000, 1)])

        def status_lns(self, name):
            self.asked += 1
            return [control.StatusTunnel(28399, "10.99.1.2", 1701, {}),
                    control.StatusTunnel(5001, "10.99.1.2", 1702, {100: control.StatusCall(100)})]

    w, log = watched
    _with_control(w, TwoTunnels([]))
    pppd = _pppd_for()
    try:
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 300).splitlines(keepends=True)[0]
                    + _call_lines(pppd.pid, 100, tid=5000).replace(", 1701.", ", 1702."))
        call, why = w.call_of(pppd.pid, 3.0)
        assert call is not None, why
        assert call.ids() == (5000, 5001, 100, 101, 1702)
    finally:
        pppd.kill()
        pppd.wait()


def test_a_scrape_never_waits_for_a_request_holding_discovery(watched):
    import threading

    w, log = watched
    with log.open("a") as f:
        f.write(_call_lines(4321, 100))
    w.discovery.poll(reconcile=False)
    assert sum(w.paths().values()) == 1
    got = []
    with w.lock:  # a request waiting for its call holds it
        t = threading.Thread(target=lambda: got.append(w.paths()))
        t.start()
        t.join(2)
        assert not t.is_alive() and sum(got[0].values()) == 1  # the last count, at once


def test_out_of_file_descriptors_is_never_read_as_a_pppd_gone(monkeypatch):
    """/proc unreadable for lack of fds says nothing of the process: the
    reads raise instead of answering "gone", which would end a live call."""
    import errno as _errno

    real_open = os.open

    def no_fds(path, *a, **k):
        if str(path).startswith("/proc/"):
            raise OSError(_errno.EMFILE, "Too many open files")
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", no_fds)
    for read in (lambda: procscan.runs(os.getpid(), "python"), lambda: procscan.argv(os.getpid()),
                 lambda: procscan.uids(os.getpid()), lambda: procscan.scan()):
        with pytest.raises(OSError):
            read()
    monkeypatch.setattr(os, "open", real_open)
    assert procscan.comm_ppid(os.getpid()) is not None
    assert procscan.comm_ppid(2 ** 22 + 1) is None  # ENOENT: gone


def test_a_control_answer_fetched_before_a_call_began_does_not_end_it(watched):
    """The question goes out without the lock; a call logged meanwhile is
    not in the answer, and must not be taken as gone."""
    w, log = watched
    _with_control(w, StubControl([100]))
    with log.open("a") as f:
        f.write(_call_lines(4321, 100))
    w.discovery.poll(reconcile=False)
    known = w.discovery.control_known()
    answers = w.discovery.fetch_control()  # xl2tpd answers: call 100 only
    with log.open("a") as f:  # then call 200 is established and logged
        f.write("xl2tpd[147]: Call established with 10.99.1.2, PID: 4322, Local: 200, Remote: 201, Serial: 2\n")
    w.discovery.poll(reconcile=False)
    ev = w.discovery.apply_control(answers, known)
    assert {c.call_id for c in w.discovery.tracker.calls()} == {100, 200}, ev
    # a later answer that still does not list it does end it
    ev = w.discovery.apply_control(w.discovery.fetch_control(), w.discovery.control_known())
    assert {c.call_id for c in w.discovery.tracker.calls()} == {100}


@pytest.mark.parametrize("asked", ["after the fork", "before the fork", "too long before the request"])
def test_an_answer_asked_after_the_pppd_was_forked_judges_its_request(watched, asked):
    """xl2tpd lists a call from its ICRQ on and forks the call's pppd after
    that, logging the call in the same step: an answer asked after the fork
    lists the call and came after its line.  So it serves the request, made
    seconds later in a login storm, without a question of its own; an answer
    asked before the fork, or more than ANSWER_AGE before the request, does not."""
    w, log = watched
    stub = _with_control(w, StubControl([100]))
    w.ANSWER_AGE = 0.5

    def ask():
        w.discovery.poll(reconcile=False)
        w.discovery.apply_control(w.discovery.fetch_control(), w.discovery.control_known())

    if asked == "before the fork":
        ask()
        time.sleep(0.05)  # over a clock tick: the fork is seen to come after
    pppd = _pppd_for()
    try:
        time.sleep(0.05)
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 100))
        if asked != "before the fork":
            ask()
        if asked == "too long before the request":
            time.sleep(0.7)
        call, why = w.call_of(pppd.pid, 3.0)
        assert call is not None and call.call_id == 100, why
        assert stub.asked == (1 if asked == "after the fork" else 2)
        assert stub.full == 1  # the request's own question, about an LNS call, asked status-lns alone
    finally:
        pppd.kill()
        pppd.wait()


def test_an_lns_pppds_line_is_asked_about_before_its_request_comes(watched):
    """xl2tpd logs an LNS pppd's line after forking it: a question asked as
    soon as the line is read serves the request that pppd makes later (in a
    login storm, seconds later), which then asks nothing itself.  A line
    read while that question is out gets one more question after it."""
    import threading

    w, log = watched
    gate = threading.Event()

    class Slow(StubControl):
        def status_lns(self, name):
            gate.wait(5)
            return super().status_lns(name)

    stub = _with_control(w, Slow([100, 200]))
    pppds = [_pppd_for(), _pppd_for()]

    def read():
        with w.lock:
            w._take(w.discovery.poll(reconcile=False))

    def until(cond):
        end = time.monotonic() + 5
        while not cond() and time.monotonic() < end:
            time.sleep(0.01)
        assert cond()

    try:
        with w.asking_ahead():
            with log.open("a") as f:
                f.write(_call_lines(pppds[0].pid, 100))
            read()
            until(lambda: w._asking is not None)  # asked at once, with no request
            with log.open("a") as f:
                f.write(f"xl2tpd[147]: Call established with 10.99.1.2, PID: {pppds[1].pid}, Local: 200, "
                        f"Remote: 201, Serial: 2\n")
            read()
            gate.set()
            until(lambda: stub.asked == 2 and w._asking is None)
            assert w.questions_ahead == 2 and stub.full == 1  # the second about the LNS calls only
            for p, cid in zip(pppds, (100, 200)):
                call, why = w.call_of(p.pid, 3.0)
                assert call is not None and call.call_id == cid, why
            assert stub.asked == 2 and w.questions == 2  # the requests asked nothing
            read()  # nothing new: no question
            time.sleep(0.1)
            assert stub.asked == 2
    finally:
        gate.set()
        for p in pppds:
            p.kill()
            p.wait()


def test_the_askers_answer_sends_its_log_barrier_before_any_request(tmp_path):
    """On a log that syslog writes, a request also waits for a barrier sent
    after its answer: the asker sends it with its answer, so it is on its
    way back through syslog before the pppd asks."""
    import socket

    from pipexctl.offload.watch import CallWatch

    sock = tmp_path / "dev-log"
    log = tmp_path / "syslog"
    log.write_text("xl2tpd[147]: xl2tpd version xl2tpd-1.3.18 started on (none) PID:147\n")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind(str(sock))
        rx.settimeout(5)
        d = Discovery([str(log)], ["stub"], proc=False, kernel=False, barrier_socket=str(sock))
        d.refresh(events=False)
        w = CallWatch(d)
        stub = _with_control(w, StubControl([100]))
        pppd = _pppd_for()
        try:
            with w.asking_ahead():
                with log.open("a") as f:
                    f.write(_call_lines(pppd.pid, 100))
                with w.lock:
                    w._take(w.discovery.poll(reconcile=False))
                assert b"log barrier" in rx.recv(512)  # sent with no request made
                with w.lock:  # the asker sends it holding the lock: its bookkeeping done after
                    assert stub.asked == 1 and w.questions_ahead == 1
                    ls = d.listed[str(log)]
                    assert d.sources[0].barrier.sent >= ls.answered
        finally:
            pppd.kill()
            pppd.wait()
            d.close()


def _flood_lns_lines(w, log, n):
    """An LNS tunnel's line, then ``n`` lines of new calls with pppd pids
    (each read at once, as the watcher would), 20 ms apart; the seconds
    the lines took."""
    with log.open("a") as f:
        f.write(_call_lines(50000, 100).split("\n")[0] + "\n")  # the tunnel line
    t0 = time.monotonic()
    for i in range(n):
        with log.open("a") as f:
            f.write(f"xl2tpd[147]: Call established with 10.99.1.2, PID: {50001 + i}, Local: {200 + i}, "
                    f"Remote: {300 + i}, Serial: {i}\n")
        with w.lock:
            w._take(w.discovery.poll(reconcile=False))
        time.sleep(0.02)
    return time.monotonic() - t0


def test_the_asker_asks_at_most_once_a_gap_however_many_lines_come(watched):
    """Anyone may write a line: a flood of them (each a new LNS call with a
    pid) gets at most one question every ASK_AHEAD_GAP, not one per line."""
    w, log = watched
    stub = _with_control(w, StubControl([]))
    w.ASK_AHEAD_GAP = 0.3
    with w.asking_ahead():
        took = _flood_lns_lines(w, log, 30)
        time.sleep(0.1)
        took += 0.1
        assert 2 <= w.questions_ahead <= took / w.ASK_AHEAD_GAP + 1, (w.questions_ahead, took)
        assert stub.asked == w.questions_ahead


def test_the_asker_waits_in_proportion_to_what_its_last_answer_cost(watched):
    """An answer lists every call, so at 10,000 calls reading one costs a
    tenth of a second: the asker's next question waits ten times the CPU the
    last one took (BACKGROUND_SHARE), however short ASK_AHEAD_GAP is."""
    w, log = watched

    class Costly(StubControl):
        def status_lns(self, name):
            end = time.thread_time() + 0.03  # 30 ms of this thread's CPU, as a long answer's reading
            while time.thread_time() < end:
                pass
            return super().status_lns(name)

    stub = _with_control(w, Costly([]))
    w.ASK_AHEAD_GAP = 0.01
    with w.asking_ahead():
        took = _flood_lns_lines(w, log, 60)
    # one question per 0.3 s at most (0.03 s / 0.1), against one per 0.04 s without the share
    assert 2 <= stub.asked <= took / (0.03 / w.BACKGROUND_SHARE) + 1, (stub.asked, took)


def test_requests_at_once_share_one_control_question_asked_without_the_lock(watched):
    import threading

    w, log = watched
    stub = _with_control(w, StubControl([100 + i for i in range(6)]))
    inflight, most = [0], [0]
    real = stub.available

    free = []

    def slow_available():
        inflight[0] += 1
        most[0] = max(most[0], inflight[0])
        free.append(w.lock.acquire(timeout=2.0))  # the asker does not hold discovery's lock (others may, briefly)
        if free[-1]:
            w.lock.release()
        time.sleep(0.3)  # xl2tpd busy in a storm
        inflight[0] -= 1
        return real()

    stub.available = slow_available
    pppds = [_pppd_for() for _ in range(6)]
    try:
        with log.open("a") as f:
            for i, p in enumerate(pppds):
                f.write(_call_lines(p.pid, 100 + i))
        got = []
        threads = [threading.Thread(target=lambda p=p: got.append(w.call_of(p.pid, 5.0))) for p in pppds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(c is not None for c, _ in got), got
        assert most[0] == 1 and stub.asked < 6, (most, stub.asked)
        assert free and all(free), free
    finally:
        for p in pppds:
            p.kill()
            p.wait()


def test_a_question_out_that_xl2tpd_leaves_unanswered_is_one_timeout_not_two(watched):
    """A request that waited for a question asked after its pppd's fork
    (another request's) that xl2tpd did not answer takes the log's word
    then (counted), without a timeout of its own."""
    import threading

    w, log = watched
    stub = _with_control(w, StubControl([100], answers=False))
    real = stub.available

    def slow_available():
        time.sleep(0.5)  # xl2tpd busy past the timeout
        return real()

    stub.available = slow_available
    pppd = _pppd_for()
    try:
        time.sleep(0.05)
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 100))

        def other():
            with w.lock:
                w._ask_control()

        first = threading.Thread(target=other, daemon=True)
        first.start()
        time.sleep(0.1)
        call, why = w.call_of(pppd.pid, 3.0)
        first.join(5)
        assert call is not None and call.call_id == 100, why
        assert stub.asked == 1 and w.unchecked == 1
    finally:
        pppd.kill()
        pppd.wait()


def test_a_request_blocked_on_a_full_poll_goes_in_between_its_log_read_and_its_reconcile(watched):
    """The watcher's full poll reads the new log lines, then lets the
    requests that waited on the lock meanwhile in, and only then reconciles
    (100-400 ms under the lock in a storm): the request gets its call
    while the reconcile is still to come."""
    import threading

    w, log = watched
    d = w.discovery
    read, reconcile = d._read_logs, d._reconcile_proc
    marks = {}

    def slow_read():
        time.sleep(0.3)
        return read()

    def slow_reconcile(*a, **k):
        marks["reconcile"] = time.monotonic()
        time.sleep(1.0)
        marks["reconciled"] = time.monotonic()
        return reconcile(*a, **k)

    d._read_logs, d._reconcile_proc = slow_read, slow_reconcile
    pppd = _pppd_for()
    try:
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 100))
        poll = threading.Thread(target=w._poll, args=(True, lambda ev: None), daemon=True)
        poll.start()
        time.sleep(0.1)  # the poll is reading the lines, under the lock
        call, why = w.call_of(pppd.pid, 5.0)
        got = time.monotonic()
        poll.join(5)
        assert call is not None and call.call_id == 100, why
        assert got < marks["reconciled"], (got, marks)
    finally:
        pppd.kill()
        pppd.wait()


def test_a_claim_from_another_xl2tpds_lines_is_passed_over(watched):
    w, log = watched
    pppd = _pppd_for()
    try:
        with log.open("a") as f:
            f.write(_call_lines(pppd.pid, 100))
        w.discovery.poll(reconcile=False)
        w.discovery.tracker.inst(w.discovery.sources[0].name).daemon_pid = 147  # the lines' xl2tpd, as discovery verified it
        call, why = w.call_of(pppd.pid, 0.5, xl2tpd_pid=999)  # pppd's parent is another xl2tpd
        assert call is None, why
        call, why = w.call_of(pppd.pid, 0.5, xl2tpd_pid=147)
        assert call is not None and call.call_id == 100, why
    finally:
        pppd.kill()
        pppd.wait()


def test_a_listed_call_id_of_another_peer_does_not_confirm_a_claim(watched):
    """status-lns lists call 100 for 10.99.1.2's tunnel; a line binding a
    pppd to call 100 of 10.99.7.7 is not confirmed by it."""
    w, log = watched
    _with_control(w, StubControl([100]))
    pppd = _pppd_for("10.99.7.7")
    try:
        with log.open("a") as f:  # two tunnels from 10.99.7.7: the LNS line cannot say which holds the call
            f.write("xl2tpd[147]: Connection established to 10.99.7.7, 1701.  Local: 556, Remote: 557 (ref=0/0).  "
                    "LNS session is 'default'\n")
            f.write(_call_lines(pppd.pid, 100, peer="10.99.7.7", tid=555))
        w.discovery.poll(reconcile=False)
        assert [c.tunnel_id for c in w.discovery.tracker.calls() if c.pppd_pid == pppd.pid] == [None]
        call, why = w.call_of(pppd.pid, 1.0)
        assert call is None, (call, why)
    finally:
        pppd.kill()
        pppd.wait()


def test_a_lac_claim_on_a_tunnel_xl2tpd_does_not_list_is_passed_over(watched):
    """The role comes from the lines: a forged LAC tunnel line and a forged
    LAC call line for the pppd are checked against `available`'s tunnels."""
    w, log = watched
    _with_control(w, StubControl([100]))
    pppd = _pppd_for()
    try:
        with log.open("a") as f:
            f.write("xl2tpd[147]: Connection established to 10.99.1.2, 1701.  Local: 777, Remote: 778 (ref=1/1).\n"
                    f"xl2tpd[147]: parameters: Local: 300 , Remote: 301 , Serial: 1 , Pid: {pppd.pid} , "
                    f"Tunnelid: 777 , Phoneid: x\n")
        w.discovery.poll(reconcile=False)
        claims = [c for c in w.discovery.tracker.calls() if c.pppd_pid == pppd.pid]
        assert claims and claims[0].role == "lac", claims  # the lines made it a LAC call
        call, why = w.call_of(pppd.pid, 1.0)
        assert call is None and "does not list it" in why, why
    finally:
        pppd.kill()
        pppd.wait()


def test_a_tunnel_id_of_a_live_offloaded_tunnel_is_not_taken_on_the_logs_word(svc):
    from pipexctl.discovery.discovery import Listed

    p = child()
    try:
        offload(svc, call(1, p.pid))
        claim = call(5, 4343).copy(peer_tunnel_id=300)  # tunnel 100 again, another peer tunnel id
        with pytest.raises(errors.ConflictError, match="not replaced"):
            svc.offload(claim, 4343)
        assert svc.tunnels[("xl2tpd", 100)].peer_tunnel_id == 200 and list(svc.tunnels[("xl2tpd", 100)].records) == [1]
        # xl2tpd's control pipe lists the new tunnel's call: the old tunnel is gone for xl2tpd
        svc.watch.discovery.listed["xl2tpd"] = Listed(time.monotonic(), frozenset({(100, 300)}),
                                              frozenset({("192.0.2.7", 300, 5)}))
        offload(svc, claim)
        assert svc.tunnels[("xl2tpd", 100)].peer_tunnel_id == 300
    finally:
        p.kill()
        p.wait()


def test_a_second_live_tunnel_given_an_offloaded_tunnels_id_is_refused_at_once(svc):
    """xl2tpd lists both tunnels of id 100 and the new one's call: the new
    call is refused at once (the kernel holds one tunnel per id), and the
    offloaded tunnel, whose pppd runs, is not touched."""
    from pipexctl.discovery.discovery import Listed

    p = child()
    try:
        offload(svc, call(1, p.pid))
        svc.watch.discovery.listed["xl2tpd"] = Listed(time.monotonic(), frozenset({(100, 200), (100, 300)}),
                                              frozenset({("192.0.2.7", 300, 5)}))
        with pytest.raises(errors.ConflictError, match="second live tunnel.*one tunnel per id"):
            svc.offload(call(5, 4343).copy(peer_tunnel_id=300), 4343)
        assert svc.tunnels[("xl2tpd", 100)].peer_tunnel_id == 200 and list(svc.tunnels[("xl2tpd", 100)].records) == [1]
    finally:
        p.kill()
        p.wait()


class ListingControl:
    """A control pipe that lists the given (our tunnel id, peer's, peer, call ids) tunnels."""

    pipe = "stub-control"

    def __init__(self, tunnels):
        self.tunnels = tunnels

    def available(self):
        from pipexctl.discovery import control

        return control.Available(lns=["default"], tunnels=[
            control.AvailableTunnel(ptid, tid, len(cids)) for tid, ptid, _, cids in self.tunnels])

    def status_lns(self, name):
        from pipexctl.discovery import control

        return [control.StatusTunnel(ptid, peer, 1701, {c: control.StatusCall(c) for c in cids})
                for _, ptid, peer, cids in self.tunnels]


@pytest.mark.parametrize("lines,first,second", [
    ("CLASH", (53805, 4761, "10.99.1.2", [23002]), (53805, 36725, "10.99.58.2", [34008])),
    ("SHARED_CALL_ID", (101, 201, "10.99.1.2", [7777]), (102, 202, "10.99.2.2", [7777])),
])
def test_the_control_pipe_ends_only_the_tunnel_and_call_it_no_longer_lists(tmp_path, lines, first, second):
    """Two live tunnels of one id (53805), or two calls of one id (7777) in
    two tunnels: xl2tpd checks neither random id against its live ones.  An
    answer that lists both ends neither; one that lists only the second
    ends the first tunnel and its call, and the second keeps its call."""
    from . import test_state

    log = tmp_path / "syslog"
    log.write_text("\n".join(getattr(test_state, lines)) + "\n")
    d = Discovery([str(log)], proc=False, kernel=False)
    d.poll(reconcile=False)
    d.sources[0].control = ListingControl([first, second])
    ev = d.apply_control(d.fetch_control())
    assert not [e for e in ev if e.event in ("CallDown", "TunnelDown")], ev
    kept = d.tracker.instances[str(log)].calls[second[2], second[3][0]]
    assert len(d.tracker.calls()) == 2 and d.listed_by_control(kept, float("-inf")) is True
    d.sources[0].control = ListingControl([second])
    ev = d.apply_control(d.fetch_control())
    assert [(e.event, getattr(e, "call", getattr(e, "tunnel", None)).peer) for e in ev] == [
        ("CallDown", first[2]), ("TunnelDown", first[2])], ev
    assert [(c.peer, c.call_id, c.peer_tunnel_id) for c in d.tracker.calls()] == [(second[2], second[3][0], second[1])]
    d.close()


def test_a_question_about_lns_calls_only_asks_status_lns_alone(tmp_path):
    """What an LNS call's check needs is status-lns: a question about LNS
    calls only asks it alone (one round trip through xl2tpd's busy main
    loop, not two), for the sections the last full answer named.  Such an
    answer judges LNS calls and ends the calls it does not list, places a
    call in the tunnel the model holds to its peer, finds no tunnel gone
    (it has no tunnel list), and does not judge a LAC call, which is
    checked by its tunnel."""
    from pipexctl.discovery import control
    from pipexctl.discovery.state import CallInfo

    from . import test_state

    class Counting(ListingControl):
        def __init__(self, tunnels, fail_status=0):
            super().__init__(tunnels)
            self.asked: list[str] = []
            self.fail_status = fail_status

        def available(self):
            self.asked.append("available")
            return super().available()

        def status_lns(self, name):
            self.asked.append(f"status-lns {name}")
            if self.fail_status:
                self.fail_status -= 1
                raise control.ControlError("no such LNS section")
            return super().status_lns(name)

    log = tmp_path / "syslog"
    log.write_text("\n".join(test_state.SHARED_CALL_ID) + "\n")
    d = Discovery([str(log)], proc=False, kernel=False)
    d.poll(reconcile=False)
    first, second = (101, 201, "10.99.1.2", [7777]), (102, 202, "10.99.2.2", [7777])
    ctl = d.sources[0].control = Counting([first, second])
    # no full answer yet: the sections are not known, so the question is full
    d.apply_control(d.fetch_control(lns_calls_only=True))
    assert ctl.asked == ["available", "status-lns default"]
    t_full = d.listed[str(log)].asked
    # then status-lns alone; it lists only the second call, and no tunnel
    ctl.tunnels = [(102, 202, "10.99.2.2", [7777])]
    ctl.asked.clear()
    ev = d.apply_control(d.fetch_control(lns_calls_only=True))
    assert ctl.asked == ["status-lns default"]
    assert [(e.event, e.call.peer) for e in ev] == [("CallDown", "10.99.1.2")], ev  # no TunnelDown
    assert sorted(t.tunnel_id for t in d.tracker.instances[str(log)].all_tunnels()) == [101, 102]
    ls = d.listed[str(log)]
    assert ls.asked > t_full and ls.tunnels_since() == t_full and (102, 202) in ls.tunnels
    (kept,) = d.tracker.calls()
    assert kept.tunnel_id == 102 and d.listed_by_control(kept, ls.asked) is True
    lac = CallInfo(instance=str(log), role="lac", peer="10.99.2.2", tunnel_id=102, peer_tunnel_id=202, call_id=5)
    assert d.listed_by_control(lac, t_full) is True  # the full answer's tunnels
    assert d.listed_by_control(lac, ls.asked) is None  # not asked for since
    # another xl2tpd has the pipe since (a restart, with its own sections): a full question
    d._control_pid[d.sources[0].name] = 4242
    ctl.asked.clear()
    d.fetch_control(lns_calls_only=True)
    assert ctl.asked == ["available", "status-lns default"]
    d._control_pid.pop(d.sources[0].name)
    # status-lns alone failing (a section renamed): a full question follows
    ctl.fail_status, ctl.tunnels = 1, [second]
    ctl.asked.clear()
    answers = d.fetch_control(lns_calls_only=True)
    assert ctl.asked == ["status-lns default", "available", "status-lns default"]
    assert answers[0][2] is not None and answers[0][4] is None
    d.close()


SAME_PEER_ID = [  # boot 4 of the 2026-12-05 login storm: two LACs picked the peer tunnel id 13379
    "xl2tpd[9]: Connection established to 10.99.68.2, 1701.  Local: 50060, Remote: 13379 (ref=0/0).  "
    "LNS session is 'default'",
    "xl2tpd[9]: Connection established to 10.99.74.2, 1701.  Local: 34342, Remote: 13379 (ref=0/0).  "
    "LNS session is 'default'",
    "xl2tpd[9]: Call established with 10.99.68.2, PID: 10793, Local: 7001, Remote: 11, Serial: 1",
    "xl2tpd[9]: Call established with 10.99.74.2, PID: 10831, Local: 32075, Remote: 11835, Serial: 1",
]


@pytest.mark.parametrize("lines_first", [True, False])
def test_two_peers_with_one_peer_tunnel_id_keep_their_own_tunnels(tmp_path, lines_first):
    """The control pipe's status-lns names a tunnel by the peer's id and
    address only: when two peers picked one id, the model's tunnel to each
    address says which of ours it is; before the log's lines say it, the
    answer places neither (and ends none of their calls)."""
    log = tmp_path / "syslog"
    log.write_text("\n".join(SAME_PEER_ID[:2] if lines_first else []) + "\n")
    d = Discovery([str(log)], proc=False, kernel=False)
    d.poll(reconcile=False)
    d.sources[0].control = ListingControl([(50060, 13379, "10.99.68.2", [7001]), (34342, 13379, "10.99.74.2", [32075])])
    ev = d.apply_control(d.fetch_control())
    assert not [e for e in ev if e.event in ("CallDown", "TunnelDown")], ev
    with log.open("a") as f:
        f.write("\n".join(SAME_PEER_ID[2:] if lines_first else SAME_PEER_ID) + "\n")
    d.poll(reconcile=False)
    d.apply_control(d.fetch_control())
    ins = d.tracker.instances[str(log)]
    assert not ins.clashes and not [n for n in d.warnings if "second live tunnel" in n], d.warnings
    assert sorted((c.call_id, c.peer, c.tunnel_id) for c in d.tracker.calls()) == [
        (7001, "10.99.68.2", 50060), (32075, "10.99.74.2", 34342)]
    assert all(d.listed_by_control(c, float("-inf")) for c in d.tracker.calls())
    d.close()


def test_a_call_the_control_pipe_listed_before_its_line_is_completed_not_ended(watched):
    """In a burst the control pipe can list a call before its log line is
    read: that line completes the call; it is no "call id reused" end."""
    w, log = watched
    _with_control(w, StubControl([100]))
    with log.open("a") as f:
        f.write(_call_lines(4321, 200))  # the tunnel line, and another call the pppd of which asks
    w.discovery.poll(reconcile=False)
    ev = w.discovery.apply_control(w.discovery.fetch_control(), w.discovery.control_known())  # lists call 100, not yet in the log
    assert 100 in {c.call_id for c in w.discovery.tracker.calls()}
    with log.open("a") as f:
        f.write("xl2tpd[147]: Call established with 10.99.1.2, PID: 4322, Local: 100, Remote: 101, Serial: 2\n")
    ev = w.discovery.poll(reconcile=False)
    assert not [e for e in ev if type(e).__name__ == "CallDown"], ev
    (c,) = [c for c in w.discovery.tracker.calls() if c.call_id == 100]
    assert c.pppd_pid == 4322 and c.peer_call_id == 101


def test_several_xl2tpd_in_one_stream_keep_their_own_calls_and_the_control_pipe_its_owners(tmp_path):
    """Two live xl2tpd write to one stream (a LAC and an LNS, or two units in
    one journal read with journal-id:xl2tpd).  The one that wrote first is
    not the control pipe's: the pipe's answer is applied to the xl2tpd that
    has it open (by /proc), never ends the other one's tunnel, and the
    other one's exit ends only its own calls."""
    from pipexctl.discovery.procscan import Proc

    log = tmp_path / "syslog"
    log.write_text(
        "xl2tpd[200]: Connection established to 10.99.9.9, 1701.  Local: 5, Remote: 6 (ref=0/0).  "
        "LNS session is 'default'\n"
        "xl2tpd[200]: Call established with 10.99.9.9, PID: 2000, Local: 50, Remote: 51, Serial: 1\n"
        + _call_lines(555, 100))
    d = Discovery([str(log)], proc=True, kernel=False)
    alive = {147, 200}
    d.tracker.daemon_alive = lambda pid: pid in alive
    stub = StubControl([100])
    d.sources[0].control = stub
    name = str(log)

    def scanned():
        daemons = [Proc(p, 1, "xl2tpd", ["xl2tpd", "-C", "stub-control" if p == 147 else "/run/other/c"], 0)
                   for p in sorted(alive)]
        kids = {p: [Proc(k, p, "pppd", ["pppd"], 0)] for p, k in ((147, 555), (200, 2000), (201, 2001))}
        return daemons, kids

    try:
        d.poll(reconcile=False)
        assert sorted((c.instance, c.call_id) for c in d.tracker.calls()) == [(name, 50), (f"{name}@147", 100)]
        d._reconcile_proc(scanned())
        d._reconcile_control()
        # the answer (tunnel 28398, call 100) went to pid 147's instance: pid 200's tunnel 5 and call 50 stay
        assert sorted((c.instance, c.call_id) for c in d.tracker.calls()) == [(name, 50), (f"{name}@147", 100)]
        assert sorted(t.key() for t in d.tracker.tunnels()) == [(name, 5), (f"{name}@147", 28398)]
        assert d.has_control(f"{name}@147") and not d.has_control(name)
        (c100,) = [c for c in d.tracker.calls() if c.call_id == 100]
        assert d.listed_by_control(c100, float("-inf")) is True
        # pid 200 exits: only its calls end; the pipe still answers for pid 147 (not for the
        # stream's first name, now without a live xl2tpd): no copy of its tunnel or calls there
        alive.discard(200)
        ev = d._reconcile_proc(scanned())
        assert sorted((e.event, e.call.call_id) for e in ev if e.event == "CallDown") == [("CallDown", 50)]
        assert d._reconcile_control() == [] and d.has_control(f"{name}@147") and not d.has_control(name)
        assert sorted((c.instance, c.call_id) for c in d.tracker.calls()) == [(f"{name}@147", 100)]
        # a new xl2tpd (pid 201) takes the stream's first name; pid 147's lines still go to its own
        alive.add(201)
        with log.open("a") as f:
            f.write("xl2tpd[201]: Call established with 10.99.9.9, PID: 2001, Local: 60, Remote: 61, Serial: 1\n"
                    "xl2tpd[147]: Call established with 10.99.1.2, PID: 556, Local: 101, Remote: 102, Serial: 2\n")
        d.poll(reconcile=False)
        assert sorted((c.instance, c.call_id) for c in d.tracker.calls()) == [(name, 60), (f"{name}@147", 100),
                                                              (f"{name}@147", 101)]
        # pid 147 exits: its instance goes, with its calls and its tunnel; pid 201's call stays
        alive.discard(147)
        stub.calls = []
        ev = d._reconcile_proc(scanned())
        assert sorted(e.call.call_id for e in ev if e.event == "CallDown") == [100, 101]
        assert [(c.instance, c.call_id) for c in d.tracker.calls()] == [(name, 60)] and f"{name}@147" not in d.tracker.instances
        # a second xl2tpd that logs its own exit: its instance goes at the next scan
        alive.add(202)
        with log.open("a") as f:
            f.write("xl2tpd[202]: Listening on IP address 0.0.0.0, port 1701\n"
                    "xl2tpd[202]: death_handler: Fatal signal 15 received\n")
        d.poll(reconcile=False)
        assert f"{name}@202" in d.tracker.instances
        alive.discard(202)
        d._reconcile_proc(scanned())
        assert sorted(d.tracker.instances) == [name]
    finally:
        d.close()


# ---- a forged line with the real call id and a false peer call id (barrier.py)


def test_a_second_line_for_the_same_pppd_disputes_its_call_and_is_no_id_reuse():
    t = Tracker()
    apply(t, "xl2tpd[147]: Connection established to 10.99.1.2, 1701.  Local: 5, Remote: 6 (ref=0/0).  "
             "LNS session is 'default'")
    line = "xl2tpd[147]: Call established with 10.99.1.2, PID: 4000, Local: 100, Remote: {r}, Serial: 1"
    assert [e.event for e in apply(t, line.format(r=999))] == ["CallUp"]
    assert apply(t, line.format(r=999)) == []  # the very same line again: nothing
    ev = apply(t, line.format(r=101))  # xl2tpd's own, after the forged one
    assert [(e.event, e.fields) for e in ev] == [("CallUpdated", ["disputed"])]
    (c,) = t.calls()
    assert c.disputed and t.disputes == 1 and "one of them is forged" in t.notes[-1]
    assert apply(t, line.format(r=102)) == [] and t.disputes == 1  # disputed once
    # a new pppd with the id: xl2tpd reused it (the old call ended), as before
    ev = apply(t, line.replace("4000", "4001").format(r=103))
    assert [e.event for e in ev] == ["CallDown", "CallUp"]
    (c,) = t.calls()
    assert (c.pppd_pid, c.peer_call_id, c.disputed) == (4001, 103, False)


def test_a_second_lac_line_for_a_call_whose_pppd_has_not_shown_disputes_it():
    t = Tracker()
    apply(t, "xl2tpd[144]: Connection established to 10.99.1.1, 1701.  Local: 5, Remote: 6 (ref=0/0).")
    apply(t, "xl2tpd[144]: Calling on tunnel 5")
    line = "xl2tpd[144]: Call established with 10.99.1.1, Local: 100, Remote: {r}, Serial: 1 (ref=0/0)"
    assert [e.event for e in apply(t, line.format(r=101))] == ["CallUp"]
    ev = apply(t, line.format(r=999))  # forged, before xl2tpd's argv line names the pppd
    assert [(e.event, e.fields) for e in ev] == [("CallUpdated", ["disputed"])]
    (c,) = t.calls()
    assert c.disputed and c.peer_call_id == 101
    # once its pppd is known, a line with the id is xl2tpd reusing it, as before
    t.update_call(c, pppd_pid=4000)
    assert [e.event for e in apply(t, line.format(r=103))] == ["CallDown", "CallUp"]


class Syslogd:
    """A syslog daemon on a datagram socket: each message appended to the log
    file in rsyslog's traditional format, in the order received, ``lag``
    seconds after it came (a busy rsyslog)."""

    def __init__(self, path, log, lag=0.3, drop=None):
        import socket
        import threading

        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.path, self.log, self.lag, self.drop = str(path), log, lag, drop
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import re

        while True:
            data = self.sock.recv(65536)
            if self.stopped:
                return
            msg = re.sub(rb"^<\d{1,3}>", b"", data).decode()
            time.sleep(self.lag)
            if self.drop and self.drop in msg:
                continue  # filtered out (a rule by program name)
            with self.log.open("a") as f:
                f.write(f"Dec  4 02:48:00 lns {msg}\n")

    def send(self, msg):
        import socket

        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(f"<29>{msg}".encode(), self.path)

    def close(self):
        self.stopped = True
        self.send("bye")
        self.thread.join(5)
        self.sock.close()


class Xl2tpdControl(StubControl):
    """As StubControl, and, like xl2tpd, the call's own line goes to syslog
    before xl2tpd gets to answer (it is written in the step that forks pppd)."""

    def __init__(self, calls, syslogd, line):
        super().__init__(calls)
        self.syslogd, self.line = syslogd, line

    def status_lns(self, name):  # the answer's last part, in a full question or one about LNS calls only
        if self.line:
            self.syslogd.send(self.line)
            self.line = None
        return super().status_lns(name)


@pytest.fixture
def forged_first(tmp_path):
    """An LNS call whose pppd a forger names first, with the real call id (100)
    and a false peer call id (999), through the same syslog; xl2tpd's own
    line (peer call 101) is in syslog's queue when its control pipe answers."""
    log, sock = tmp_path / "syslog", tmp_path / "dev-log"
    log.write_text("Dec  4 02:47:00 lns xl2tpd[147]: xl2tpd version xl2tpd-1.3.18 started on lns PID:147\n")
    pppd = _pppd_for()
    made = []

    def make(barrier=True, lag=0.3, drop=None, forged=True):
        syslogd = Syslogd(sock, log, lag=lag, drop=drop)
        d = Discovery([str(log)], ["stub"], proc=False, kernel=False,
                      barrier_socket=str(sock) if barrier else None)
        from pipexctl.offload.watch import CallWatch

        w = CallWatch(d)
        d.refresh(events=False, control=False)
        real = f"xl2tpd[147]: Call established with 10.99.1.2, PID: {pppd.pid}, Local: 100, Remote: 101, Serial: 1"
        d.sources[0].control = Xl2tpdControl([100], syslogd, real if forged else None)
        with log.open("a") as f:  # the tunnel's line, then the forger's (it wrote first)
            f.write("Dec  4 02:47:01 lns " + _call_lines(pppd.pid, 100).splitlines()[0] + "\n")
            f.write(f"Dec  4 02:47:02 lns xl2tpd[147]: Call established with 10.99.1.2, PID: {pppd.pid}, Local: 100, "
                    f"Remote: 999, Serial: 1\n" if forged else f"Dec  4 02:47:02 lns {real}\n")
        made.append((syslogd, d))
        return w, syslogd

    yield make, pppd
    for syslogd, d in made:
        d.close()
        syslogd.close()
    pppd.kill()
    pppd.wait()


def test_without_a_barrier_the_forged_line_written_first_wins(forged_first):
    """What the barrier is for: the control pipe lists call 100 (it is real),
    and xl2tpd's own line is still in syslog's queue when the answer comes."""
    make, pppd = forged_first
    w, _ = make(barrier=False)
    call, why = w.call_of(pppd.pid, 3.0)
    assert call is not None and call.peer_call_id == 999, why


def test_a_forged_line_written_first_is_caught_by_the_log_barrier(forged_first):
    make, pppd = forged_first
    w, _ = make()
    call, why = w.call_of(pppd.pid, 3.0)
    assert call is None and "other peer ids: one of them is forged" in why, why
    assert w.discovery.tracker.disputes == 1 and w.unbarriered == 0
    call, why = w.call_of(pppd.pid, 0.5)  # asked again (the live move): still refused
    assert call is None and "forged" in why


def test_a_log_that_does_not_carry_the_barrier_is_noticed_once_and_answered_as_before(forged_first):
    make, pppd = forged_first
    w, _ = make(lag=0.0, drop="pipexctl[", forged=False)
    t0 = time.monotonic()
    call, why = w.call_of(pppd.pid, 3.0)
    assert call is not None and call.peer_call_id == 101, why
    assert w.unbarriered == 1 and time.monotonic() - t0 < 2.5
    assert any("does not carry it" in x for x in w.discovery.warnings), w.discovery.warnings


def test_a_barrier_that_does_not_come_back_in_time_refuses_once_the_log_carried_one(forged_first):
    make, pppd = forged_first
    w, syslogd = make(lag=0.0)
    (s,) = w.discovery.sources
    s.barrier.state(time.monotonic())  # the start's probe
    wait_until = time.monotonic() + 2
    while s.barrier.carried is None and time.monotonic() < wait_until:
        w.discovery.poll(reconcile=False)
        time.sleep(0.02)
    assert s.barrier.carried is True
    syslogd.lag = 2.0  # syslog now far behind
    call, why = w.call_of(pppd.pid, 1.0)
    assert call is None and "did not come back in the log in time" in why, why


def test_a_barrier_needs_a_syslog_socket(tmp_path):
    from pipexctl.discovery.barrier import LogBarrier

    b = LogBarrier(str(tmp_path / "none"))
    assert b.state(time.monotonic()) == "absent" and "cannot send" in b.note
    b.close()


def test_a_barrier_counts_only_when_sent_after_the_answer_was_taken_in(tmp_path):
    """A barrier sent while a question was out may precede xl2tpd's line (it
    writes the line just before it answers): it does not pass that answer."""
    from pipexctl.discovery.discovery import Listed

    sock = tmp_path / "dev-log"
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind(str(sock))
        d = Discovery([str(tmp_path / "log")], ["stub"], proc=False, kernel=False, barrier_socket=str(sock))
        (s,) = d.sources
        t0 = time.monotonic()
        assert s.barrier.state(t0) == "wait"  # sent now, after the question went out at t0 ...
        nonce = rx.recv(512).decode().rsplit(" ", 1)[1]
        s.barrier.feed(f"Dec  4 02:48:00 lns pipexctl[1]: log barrier {nonce}")  # ... and read back
        d.listed["x"] = Listed(t0, frozenset(), frozenset(), time.monotonic())  # the answer, taken in after it
        d.sources[0].name = "x"
        assert d.barrier("x") == "wait" and rx.recv(512)  # so a new one goes out
        d.listed["x"] = Listed(t0, frozenset(), frozenset(), t0)
        assert d.barrier("x") == "passed"
        d.close()


def test_a_claim_needs_the_barrier_of_the_first_answer_asked_after_its_fork_not_of_the_last(tmp_path):
    """Any answer asked after the pppd's fork came after its line went to
    syslog: a barrier sent after the first such answer was taken in is
    enough, and later answers (asked back to back in a storm) do not make
    the request wait for barriers of their own."""
    import socket

    from pipexctl.discovery.discovery import Listed

    sock = tmp_path / "dev-log"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind(str(sock))
        rx.settimeout(5)
        d = Discovery([str(tmp_path / "log")], ["stub"], proc=False, kernel=False, barrier_socket=str(sock))
        (s,) = d.sources
        s.name = "x"
        t = time.monotonic()
        fork, a1, a2 = t - 3.0, t - 2.0, t - 1.0  # answers asked at a1 (after the fork) and a2
        # a barrier sent after the first answer was taken in, and read back
        s.barrier.carried, s.barrier.sent, s.barrier.passed = True, a1 + 0.2, a1 + 0.2
        d.listed["x"] = Listed(a2, frozenset(), frozenset(), a2 + 0.1, recent=((fork - 1, fork - 0.9),
                                                                                (a1, a1 + 0.1), (a2, a2 + 0.1)))
        assert d.barrier("x", fork) == "passed"
        assert d.barrier("x", a1 + 0.05) == "wait" and rx.recv(512)  # only the later answer serves: its own barrier
        assert d.listed["x"].barrier_after(None) == a2 + 0.1
        d.close()


def test_a_log_taken_not_to_carry_barriers_is_asked_again_only_once_a_minute(tmp_path, monkeypatch):
    import socket

    from pipexctl.discovery.barrier import LogBarrier

    sock = tmp_path / "dev-log"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind(str(sock))
        rx.setblocking(False)
        b = LogBarrier(str(sock))
        monkeypatch.setattr(LogBarrier, "PROBE", 0.0)
        assert b.state(time.monotonic()) == "wait" and rx.recv(512)
        time.sleep(0.01)
        assert b.state(time.monotonic()) == "absent" and b.carried is False  # not back in time
        for _ in range(5):  # requests go on: no line each
            assert b.state(time.monotonic()) == "absent"
        with pytest.raises(BlockingIOError):
            rx.recv(512)
        monkeypatch.setattr(LogBarrier, "REPROBE", 0.0)
        assert b.state(time.monotonic()) == "absent" and rx.recv(512)  # a minute on: one more, not waited for
        b.close()


def test_the_control_pipes_owner_is_roots_system_xl2tpd_and_a_hostile_path_is_no_error(tmp_path):
    """Anyone may run a process named xl2tpd (or the system's binary) with
    any -C: one naming our control pipe is not a second owner (which left
    the pipe without one), and a -C that is a chain of symlinks deeper
    than Python's recursion (RecursionError in realpath, which stopped
    the daemon's start and every request) is no error."""
    from pipexctl.discovery.procscan import Proc

    log = tmp_path / "syslog"
    log.write_text("")
    d = Discovery([str(log)], proc=True, kernel=False)
    s = d.sources[0]
    s.control = StubControl([])
    links = tmp_path / "links"
    links.mkdir()
    for i in range(1200):
        (links / f"l{i}").symlink_to(links / f"l{i + 1}")
    system = {147, 148}  # root's system xl2tpd (procscan.is_daemon)
    d.tracker.daemon_alive = lambda pid: pid in system

    def xl2tpd(pid, pipe):
        return Proc(pid, 1, "xl2tpd", ["xl2tpd", "-C", pipe], 0)

    assert d._control_owner(s, [xl2tpd(147, "stub-control"), xl2tpd(300, "stub-control")]) == 147
    assert d._control_owner(s, [xl2tpd(148, str(links / "l0")), xl2tpd(147, "stub-control")]) == 147
    system.add(300)  # two of root's system xl2tpd name the pipe: which has it open cannot be told
    assert d._control_owner(s, [xl2tpd(147, "stub-control"), xl2tpd(300, "stub-control")]) is None
    # one FIFO by two paths (/var/run is a symlink to /run on Debian); another FIFO is another pipe
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "l2tp-control")
    os.mkfifo(tmp_path / "run" / "other")
    (tmp_path / "var-run").symlink_to(tmp_path / "run")
    s.control.pipe = str(tmp_path / "var-run" / "l2tp-control")
    assert d._control_owner(s, [xl2tpd(147, str(tmp_path / "run" / "other")),
                                xl2tpd(148, str(tmp_path / "run" / "l2tp-control"))]) == 148
    assert d._control_owner(s, [xl2tpd(147, str(tmp_path / "run" / "other"))]) is None
    d.close()


def test_the_system_xl2tpd_run_by_another_user_is_not_a_daemon(monkeypatch):
    """procscan.is_daemon: the system's binary, run as root. xl2tpd is not
    setuid: any user may run it, with arguments of its choosing."""
    monkeypatch.setattr(procscan, "exe", lambda pid: "/usr/sbin/xl2tpd")
    monkeypatch.setattr(procscan, "trusted_exes", lambda name: frozenset({"/usr/sbin/xl2tpd"}))
    for ids, daemon in (((0, 0, 0, 0), True), ((65534,) * 4, False), ((1000, 0, 0, 0), False), (None, False)):
        monkeypatch.setattr(procscan, "uids", lambda pid, ids=ids: ids)
        assert procscan.is_daemon(4242) is daemon, ids


def _journal_entries(entries, tmp_path, monkeypatch):
    """A stand-in journalctl that prints ``entries`` (journal JSON) once."""
    data = tmp_path / "entries.json"
    data.write_text("".join(json.dumps(e) + "\n" for e in entries))
    fake = tmp_path / "journalctl"
    fake.write_text(f"#!/bin/sh\ncat {data}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def _entry(msg, at, pid="147"):
    return {"MESSAGE": msg, "_COMM": "xl2tpd", "_EXE": "/usr/sbin/xl2tpd", "_PID": pid,
            "__REALTIME_TIMESTAMP": str(int(at * 1e6))}


@pytest.mark.parametrize("case", ["journal", "entry-before-the-fork", "no-trusted-pid", "file"])
def test_an_lns_calls_own_journal_entry_needs_no_control_pipe_answer(tmp_path, monkeypatch, case):
    """In the journal, the kernel names each entry's sender: an LNS call
    whose entry its pppd's parent xl2tpd sent after that pppd's fork is
    offloaded on it, with no question to the control pipe (which here
    would deny it).  An entry older than the fork (another pppd's, of a
    reused pid) and the same line in a file are checked against the
    control pipe as before, and refused; an entry without journald's _PID
    is not read."""
    from pipexctl.offload.watch import CallWatch

    pppd = _pppd_for()
    try:
        at = time.time() - (60 if case == "entry-before-the-fork" else 0)
        tunnel, call = _call_lines(pppd.pid, 100).splitlines()
        entries = [_entry(line.split(": ", 1)[1], at) for line in (tunnel, call)]
        if case == "no-trusted-pid":
            entries = [{**e, "SYSLOG_PID": "147"} for e in entries]
            for e in entries:
                del e["_PID"]
        _journal_entries(entries, tmp_path, monkeypatch)
        if case == "file":
            (tmp_path / "xl2tpd.log").write_text(f"{tunnel}\n{call}\n")
        d = Discovery([str(tmp_path / "xl2tpd.log") if case == "file" else "journal-id:xl2tpd"],
                      proc=False, kernel=False)
        d.refresh(events=False)
        d.tracker.inst(d.sources[0].name).daemon_pid = 147  # what a /proc scan says of the real xl2tpd
        w = CallWatch(d)
        stub = _with_control(w, StubControl([]))  # lists no call: a checked claim is refused
        call_, why = w.call_of(pppd.pid, 1.0, xl2tpd_pid=147)
        if case == "journal":
            assert call_ is not None and call_.call_id == 100 and stub.asked == 0, why
        elif case == "no-trusted-pid":  # not read at all
            assert call_ is None and why == "no call names this pid" and d.tracker.calls() == [], why
        else:
            assert call_ is None and stub.asked >= 1 and "does not list it" in why, why
        d.close()
    finally:
        pppd.kill()
        pppd.wait()
