"""Discovery (discovery/discovery.py): its log readers (a file followed
through rotation and truncation, the journal after a cursor), the model and
snapshot it builds from recorded xl2tpd logs, and its /proc reconcile."""

from __future__ import annotations

import os
import time

import pytest

from pipexctl.discovery import checkpoint as cpt
from pipexctl.discovery.discovery import Discovery, Journal, LogFile

from .conftest import DATA, brief


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


def test_logfile_position_is_the_start_of_an_unfinished_line(tmp_path):
    log = tmp_path / "syslog"
    log.write_bytes(b"line one\npart")
    f = LogFile(str(log))
    assert f.read_lines() == ["line one"]
    assert f.position().offset == len(b"line one\n")
    f.close()


def test_a_journal_is_read_to_its_end_then_followed_after_its_cursor(tmp_path, monkeypatch):
    """A stand-in journalctl: without -f it prints the entry that is
    there; with -f a newer one, then follows.  The first read holds what
    was there (a start's first read sees every entry written before it);
    the follower starts after its cursor; a follower that dies (a signal to
    the daemon's group) is started again after the last entry read, said
    once, after a pause; a saved cursor of another boot, or one journalctl
    turns down, is refused before anything is restored."""
    boot = cpt.boot_id()
    cur1, cur2 = (f"s={'a' * 32};i={i};b={boot};m=1;t=1;x=1" for i in (1, 2))
    entry = '{{"MESSAGE": "{m}", "_COMM": "xl2tpd", "_PID": "7", "__CURSOR": "{c}"}}'
    argvs = tmp_path / "argv"
    fake = tmp_path / "journalctl"
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {argvs}
case "$*" in *"--after-cursor"*"s=bad"*) exit 1;; esac
case "$*" in *" -f "*) echo '{entry.format(m="two", c=cur2)}'; exec sleep 60;; esac
echo '{entry.format(m="one", c=cur1)}'
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    def read(j, until):
        end = time.monotonic() + 10
        while time.monotonic() < end:
            got = j.read_lines()
            if until(got):
                return got
            time.sleep(0.05)
        raise AssertionError("the reader never got there")

    def last_argv():
        return argvs.read_text().splitlines()[-1]

    j = Journal("journal:xl2tpd", follow=True)
    try:
        assert j.position() is None
        assert len(j.read_lines()) == 1 and not j.more, "the first read holds what was there"
        assert j.position().cursor == cur1 and " -f " not in f" {last_argv()} "
        read(j, lambda got: len(got) == 1)
        assert j.position().cursor == cur2 and last_argv().endswith(f"-f -n all --after-cursor {cur1}")
        j._journalctl.kill()  # the follower dies
        assert read(j, lambda got: got == [] and j.note) == []
        assert "started again in 1 s, after the last entry read" in j.note
        t = time.monotonic()
        read(j, lambda got: len(got) == 1)
        assert time.monotonic() - t > 0.5 and last_argv().endswith(f"--after-cursor {cur2}")
    finally:
        j.close()
    d = Discovery(["journal:xl2tpd"], proc=False, kernel=False, follow=True)
    try:
        d.refresh(control=False)
        assert d.sources[0].parser.lines >= 1, "a start's refresh reads the journal's entries"
    finally:
        d.close()
    j = Journal("journal:xl2tpd", follow=True)
    try:
        assert j.resume(cpt.JournalPos(cursor=cur1.replace(f"b={boot}", "b=" + "0" * 32))) == \
            "its cursor is of another boot"
        bad = cur1.replace("s=" + "a" * 32, "s=bad" + "a" * 29)  # a cursor this journalctl turns down
        assert j.resume(cpt.JournalPos(cursor=bad)) == "journalctl refused its cursor (status 1)"
        assert j.position() is None
        assert j.resume(cpt.JournalPos(cursor=cur1)) is None
        j.read_lines()
        assert last_argv().endswith(f"--after-cursor {cur1}") and " -f " not in f" {last_argv()} "
    finally:
        j.close()


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


def _one_lns_call(tmp_path, xl2tpd_pid, pppd_pid, first=""):
    """Discovery of a log with one LNS call (tunnel 28398, call 19361) of
    xl2tpd ``xl2tpd_pid`` and pppd ``pppd_pid``, read once; ``first``: lines before it."""
    log = tmp_path / "x.log"
    log.write_text(first + f"xl2tpd[{xl2tpd_pid}]: Connection established to 10.99.1.2, 1701.  Local: 28398, "
                   f"Remote: 58717 (ref=0/0).  LNS session is 'default'\n"
                   f"xl2tpd[{xl2tpd_pid}]: Call established with 10.99.1.2, PID: {pppd_pid}, Local: 19361, "
                   f"Remote: 13604, Serial: 1\n")
    d = Discovery([str(log)], proc=False, kernel=False)
    d.poll(reconcile=False)
    return d


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
        d = _one_lns_call(tmp_path, me, child.pid)
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


def test_an_xl2tpd_whose_children_the_scan_did_not_read_keeps_its_calls(tmp_path):
    """A scan reads the children of the xl2tpds followed when it began; an
    instance followed since then has no entry in it, which is no proof its
    pppds are gone: its calls stay for the next scan."""
    import subprocess

    from pipexctl.discovery import procscan

    gone = subprocess.Popen(["true"])
    gone.wait()
    me = os.getpid()
    d = _one_lns_call(tmp_path, me, gone.pid)
    d.proc = True
    xl2tpd = procscan.Proc(pid=me, ppid=os.getppid(), comm="xl2tpd", argv=["xl2tpd"], start=0)
    assert d._reconcile_proc(scanned=([xl2tpd], {})) == []
    assert [c.call_id for c in d.tracker.calls()] == [19361]
    (down,) = d._reconcile_proc(scanned=([xl2tpd], {me: []}))  # read, and its pppd not among them
    assert down.reason == f"pppd {gone.pid} exited"
    d.close()


def test_a_scan_begun_before_a_pppd_was_named_leaves_it_to_the_next_scan(tmp_path, monkeypatch):
    """The daemon scans /proc outside its lock, and in a login storm the
    scan takes long enough that most calls are named while it runs.  Such
    a call's pppd is missing from the scan without being gone; it is not
    read again under the lock (7 s of reads per storm there, every request
    waiting), and not ended: the next scan judges it, and ends it if gone."""
    import subprocess
    import time

    from pipexctl.discovery import procscan

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid: a pppd that is gone once judged
    me = os.getpid()
    before = time.monotonic()
    d = _one_lns_call(tmp_path, me, gone.pid)
    d.proc = True
    xl2tpd = procscan.Proc(pid=me, ppid=os.getppid(), comm="xl2tpd", argv=["xl2tpd"], start=0)
    reads = []
    real = procscan.read_process
    monkeypatch.setattr(procscan, "read_process", lambda pid, **kw: reads.append(pid) or real(pid, **kw))
    assert d._reconcile_proc(([xl2tpd], {me: []}), scanned_at=before) == []
    assert reads == [] and [c.call_id for c in d.tracker.calls()] == [19361]
    (down,) = d._reconcile_proc(([xl2tpd], {me: []}), scanned_at=time.monotonic())
    assert down.reason == f"pppd {gone.pid} exited" and d.tracker.calls() == []
    assert reads == [gone.pid]
    assert not d.tracker.inst(d.sources[0].name).calls.named  # judged: forgotten
    d.close()


def test_a_moved_calls_data_path_follows_the_kernel_not_its_pty(tmp_path):
    """A pppd moved into the kernel keeps its pty (the live move): /proc's
    tty says "userspace" while the kernel holds the session.  The kernel
    dump decides, each way: a call of a userspace-mode xl2tpd is "kernel"
    while its session is there and "userspace" again once it has gone back
    to its pty, with one event per change, not one per poll."""
    import subprocess

    from pipexctl.discovery import procscan
    from pipexctl.kernel.backend import NullBackend
    from pipexctl.model import PwType, SessionSpec, TunnelSpec

    pppd = subprocess.Popen(["sleep", "60"])
    try:
        me = os.getpid()
        d = _one_lns_call(tmp_path, me, pppd.pid, f"xl2tpd[{me}]: Not looking for kernel support.\n")
        d.proc = d.kernel = True
        d._backend = kernel = NullBackend()
        xl2tpd = procscan.Proc(pid=me, ppid=os.getppid(), comm="xl2tpd", argv=["xl2tpd"], start=0)
        on_pty = procscan.Proc(pid=pppd.pid, ppid=me, comm="pppd", argv=["pppd"], start=0, ttys=["/dev/pts/3"])
        scanned = ([xl2tpd], {me: [on_pty]})

        def path_events():
            ev = d._reconcile_proc(scanned=scanned) + d._reconcile_kernel()
            (c,) = d.tracker.calls()
            return [e.event for e in ev], c.data_path

        assert path_events() == (["CallUpdated"], "userspace")
        assert d.tracker.calls()[0].path_changed is None  # first seen on its path: not a change
        kernel.tunnel_create(TunnelSpec(tunnel_id=28398, peer_tunnel_id=58717, version=2, fd=0))
        kernel.session_create(SessionSpec(tunnel_id=28398, session_id=19361, peer_session_id=13604, version=2,
                                          pw_type=PwType.ppp))
        t = time.time()
        assert path_events() == (["DataPathChanged"], "kernel")  # moved in; its pppd still holds the pty
        moved_in = d.tracker.calls()[0].path_changed
        assert moved_in is not None and t - 0.001 <= moved_in <= time.time() + 0.001  # when (to the ms): status and discover say it
        assert path_events() == ([], "kernel")  # and stays so: no flip-flop per poll
        assert d.tracker.calls()[0].path_changed == moved_in
        kernel.session_delete(28398, 19361)
        assert path_events() == (["DataPathChanged"], "userspace")  # moved back
        assert path_events() == ([], "userspace")
        d.close()
    finally:
        pppd.kill()
        pppd.wait()


def test_a_poll_says_what_each_of_its_parts_took(tmp_path):
    """The watcher's "slow discovery poll" line names the part that was
    slow (a 12 x 35 run had one poll of 151 s and no way to tell why)."""
    log = tmp_path / "x.log"
    log.write_text("")
    d = Discovery([str(log)], proc=False, kernel=False)
    d.poll(reconcile=False)
    assert set(d.poll_seconds) == {"logs"}
    d.poll(reconcile=True, control=True)
    assert set(d.poll_seconds) == {"logs", "control", "proc", "kernel"}
    assert all(v >= 0 for v in d.poll_seconds.values())


def test_a_full_scan_reads_only_the_pid_of_pppds_whose_path_the_kernel_gives(tmp_path):
    """The kernel dump places an offloaded call: its pppd's argv and fds are
    not read again each scan (only that it runs); nor are another xl2tpd's
    children read at all."""
    from pipexctl.discovery.state import CallInfo

    d = Discovery([str(tmp_path / "x.log")], proc=True, kernel=True)
    assert d.scan_wanted()["parents"] is None  # no xl2tpd known yet: every one's children
    assert not d.scan_wanted()["known"]
    ins = d.tracker.inst(d.sources[0].name)
    ins.daemon_pid = 5
    for cid, pid, path in ((1, 10, "kernel"), (2, 11, "userspace")):
        ins.calls["192.0.2.7", cid] = CallInfo(instance=ins.name, role="lns", peer="192.0.2.7", call_id=cid, pppd_pid=pid,
                                  data_path=path)
    want = d.scan_wanted()
    assert want["parents"] == {5}
    assert [pid in want["known"] for pid in (10, 11, 13)] == [True, False, False]
    d.kernel = False  # without the kernel's word, /proc's decides: read
    assert 10 not in d.scan_wanted()["known"]
    d.close()


def test_a_start_reads_the_pppd_of_a_call_the_kernel_places_from_its_stat_line_alone(tmp_path, monkeypatch):
    """A start's read (refresh) asks the kernel before /proc, so a pppd
    whose call the kernel places costs its stat line, as in the watcher's
    polls: a restart with 10,000 offloaded calls read every one's argv and
    fds, 8 MiB at the read's peak.  A call the kernel does not place has
    its pppd's argv read (it may be on its pty)."""
    from pipexctl.kernel.backend import NullBackend
    from pipexctl.model import PwType, SessionSpec, TunnelSpec

    from .test_procscan import _listing_fd_dirs, xl2tpd_with_child

    with xl2tpd_with_child("ctypes.CDLL(None).prctl(15, b'pppd', 0, 0, 0)") as (parent, kid):
        log = tmp_path / "x.log"
        log.write_text(f"xl2tpd[{parent}]: xl2tpd version xl2tpd-1.3.18 started on lns PID:{parent}\n"
                       f"xl2tpd[{parent}]: Connection established to 10.99.1.2, 1701.  Local: 28398, "
                       f"Remote: 58717 (ref=0/0).  LNS session is 'default'\n"
                       f"xl2tpd[{parent}]: Call established with 10.99.1.2, PID: {kid}, Local: 19361, "
                       f"Remote: 13604, Serial: 1\n")

        def start_reads(placed: bool) -> tuple[list[str], Discovery]:
            d = Discovery([str(log)], proc=True, kernel=True)
            d._backend = kernel = NullBackend()
            if placed:
                kernel.tunnel_create(TunnelSpec(tunnel_id=28398, peer_tunnel_id=58717, version=2, fd=0))
                kernel.session_create(SessionSpec(tunnel_id=28398, session_id=19361, peer_session_id=13604,
                                                  version=2, pw_type=PwType.ppp))
            opened: list[str] = []
            real_open = os.open
            with monkeypatch.context() as m:
                m.setattr(os, "open", lambda path, *a, **kw: opened.append(str(path)) or real_open(path, *a, **kw))
                m.setattr(os, "listdir", _listing_fd_dirs(opened))
                d.refresh(events=False)
            d.close()
            return [p for p in opened if p.startswith(f"/proc/{kid}/")], d

        reads, d = start_reads(placed=True)
        assert reads == [f"/proc/{kid}/stat"]
        (c,) = d.tracker.calls()
        assert (c.pppd_pid, c.data_path) == (kid, "kernel")
        reads, d = start_reads(placed=False)
        assert f"/proc/{kid}/cmdline" in reads and f"/proc/{kid}/fd" in reads
        (c,) = d.tracker.calls()
        assert c.pppd_pid == kid


def test_an_xl2tpd_started_after_the_scan_began_is_not_declared_gone(tmp_path):
    """A request may read the logs while a scan runs (outside the lock): an
    xl2tpd whose start (and call) was read after the scan began is not in it.  /proc is asked again, by
    the scan's own test (named xl2tpd, not a fork of one), before its calls
    are ended; a pid that is gone, or no xl2tpd, ends them as before."""
    from pipexctl.discovery import procscan

    from .test_procscan import xl2tpd_with_child

    with xl2tpd_with_child() as (xl2tpd, kid):
        d = _one_lns_call(tmp_path, xl2tpd, kid)
        d.proc = True
        assert d.tracker.inst(d.sources[0].name).daemon_pid == xl2tpd
        assert procscan.is_xl2tpd(xl2tpd) and not procscan.is_xl2tpd(kid)  # the fork: no daemon
        assert d._reconcile_proc(scanned=([], {})) == []  # a scan older than its start
        assert [c.call_id for c in d.tracker.calls()] == [19361]
    ev = d._reconcile_proc(scanned=([], {}))  # now gone: the call and its tunnel end
    assert [e.event for e in ev] == ["CallDown", "TunnelDown"] and d.tracker.calls() == []
    assert ev[1].reason == f"xl2tpd pid {xl2tpd} is gone"
    d.close()
    # a live process that is no xl2tpd (here: this test) is judged gone too
    d = _one_lns_call(tmp_path, os.getpid(), 1)
    d.proc = True
    ev = d._reconcile_proc(scanned=([], {}))
    assert [e.event for e in ev] == ["CallDown", "TunnelDown"] and ev[1].reason == f"xl2tpd pid {os.getpid()} is gone"
    d.close()


def test_a_poll_drops_the_scan_it_was_handed_before_it_reads_the_kernel(tmp_path):
    """A poll given a /proc scan applies it, then lets its pppds go before
    the kernel's dump is read: at 10,000 calls the two together were the
    poll's peak.  The scan's word still counts (the call is matched)."""
    import subprocess

    from pipexctl.discovery import procscan
    from pipexctl.kernel.backend import NullBackend

    pppd = subprocess.Popen(["sleep", "60"])
    try:
        me = os.getpid()
        d = _one_lns_call(tmp_path, me, pppd.pid, f"xl2tpd[{me}]: Not looking for kernel support.\n")
        d.proc = d.kernel = True
        held_at_dump: list[int] = []

        class Kernel(NullBackend):
            def session_keys(self) -> set[int]:
                held_at_dump.append(sum(map(len, scanned[1].values())))
                return super().session_keys()

        d._backend = Kernel()
        xl2tpd = procscan.Proc(pid=me, ppid=os.getppid(), comm="xl2tpd", argv=["xl2tpd"], start=0)
        on_pty = procscan.Proc(pid=pppd.pid, ppid=me, comm="pppd", argv=["pppd"], start=0, ttys=["/dev/pts/3"])
        scanned = ([xl2tpd], {me: [on_pty]})
        d.poll(reconcile=True, scanned=scanned, scanned_at=time.monotonic(), logs=False)
        assert held_at_dump == [0] and scanned[1] == {}
        (c,) = d.tracker.calls()
        assert c.data_path == "userspace"  # from the scan: its pty
    finally:
        pppd.kill()
        pppd.wait()
