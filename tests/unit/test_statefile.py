"""The serve daemon's state file and its restart plan (no kernel needed)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os

from pipexctl.model import Encap, Endpoint, PwType, Session, Tunnel
from pipexctl.offload import statefile
from pipexctl.offload.statefile import SessionRecord, State, TunnelRecord
from pipexctl.records import dump


def rec(tid=10, ptid=20, port=40000, sessions=((1, 2, 100),)):
    return TunnelRecord(instance="log", tunnel_id=tid, peer_tunnel_id=ptid, local="10.0.0.1", peer="10.0.0.2",
                        peer_port=1701, local_port=port,
                        sessions=[SessionRecord(call_id=c, peer_call_id=p, pppd_pid=pid) for c, p, pid in sessions])


def ktun(tid=10, ptid=20, port=40000):
    return Tunnel(tunnel_id=tid, peer_tunnel_id=ptid, version=2, encap=Encap.udp,
                  local=Endpoint(address=ipaddress.ip_address("10.0.0.1"), port=port),
                  remote=Endpoint(address=ipaddress.ip_address("10.0.0.2"), port=1701))


def ksess(tid, sid):
    return Session(tunnel_id=tid, session_id=sid, peer_session_id=1, pw_type=PwType.ppp)


def test_save_then_load_round_trips_with_mode_0600(tmp_path):
    path = str(tmp_path / "d" / "state.json")
    statefile.save(path, State(tunnels=[rec()]))
    st, warning = statefile.load(path)
    assert warning is None
    assert st.tunnels == [rec()] and st.pid == os.getpid()
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["state.json"]  # no temp file left


def test_missing_file_is_an_empty_state_without_warning(tmp_path):
    st, warning = statefile.load(str(tmp_path / "none.json"))
    assert st.tunnels == [] and warning is None


def test_corrupt_or_invalid_files_are_moved_aside_never_trusted(tmp_path):
    whole = statefile.encode([(rec(), rec().sessions)])
    head, tunnel, session = whole.splitlines(keepends=True)
    bad = {
        "torn": b'{"version": 2, "tunnels": [{"inst',
        "binary": b"\xff\xfe\x00garbage",
        "wrong-version": json.dumps({"version": 9, "tunnels": []}).encode(),
        "out-of-range": json.dumps({"version": 2, "tunnels": [
            {**dump(State(tunnels=[rec()]))["tunnels"][0], "tunnel_id": 70000}]}).encode(),
        "wrong-type": b"[1, 2, 3]",
        # a journal (version 3): each line must be a record, and follow from the lines before it
        "journal-header-torn": head[:-1],
        "journal-line-not-json": head + tunnel + b"{garbage\n" + session,
        "journal-session-before-its-tunnel": head + session + tunnel,
        "journal-session-twice": whole + session,
        "journal-end-of-an-unknown-call": whole + statefile.end_line("log", 10, 9),
        "journal-drop-of-an-unknown-tunnel": whole + statefile.drop_line("log", 11),
        "journal-out-of-range": whole + session.replace(b'"call_id":1', b'"call_id":70000'),
        "journal-two-changes-in-a-line": head + tunnel[:-2] + b',"drop":{}}\n',
    }
    for name, data in bad.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        st, warning = statefile.load(str(path))
        assert st.tunnels == [], name
        assert warning and "is not valid" in warning and "moved to" in warning, (name, warning)
        assert not path.exists()
        (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith(f"{name}.json.corrupt-")]
        assert aside.read_bytes() == data


def test_a_journal_replays_its_changes_and_ignores_a_torn_last_line(tmp_path):
    """Tunnels made and dropped, sessions recorded and ended, appended after
    a whole write: the file says what is left.  A last line without its end
    (a crash in the middle of an append, whose write never returned) is not
    read, and does not make the file invalid."""
    path = tmp_path / "state.json"
    statefile.save(str(path), State(tunnels=[rec(10, 20, 40000, [(1, 2, 100)])]))
    t11 = rec(11, 21, 40001, ())
    with open(path, "ab") as f:
        f.write(statefile.tunnel_line(t11) + statefile.session_line("log", 11, SessionRecord(
            call_id=5, peer_call_id=6, pppd_pid=102)) + statefile.end_line("log", 10, 1)
            + statefile.session_line("log", 10, SessionRecord(call_id=1, peer_call_id=3, pppd_pid=103))
            + statefile.drop_line("log", 11) + statefile.tunnel_line(rec(11, 22, 40002, ())))
    want = [rec(10, 20, 40000, [(1, 3, 103)]), rec(11, 22, 40002, ())]
    st, warning = statefile.load(str(path))
    assert warning is None and st.tunnels == want and st.pid == os.getpid()
    torn = statefile.session_line("log", 11, SessionRecord(call_id=7, peer_call_id=8, pppd_pid=104))
    with open(path, "ab") as f:
        f.write(torn[:-9])
    st, warning = statefile.load(str(path))
    assert warning is None and st.tunnels == want and path.exists()


def test_a_version_2_file_is_read(tmp_path):
    """The file a daemon before the journal wrote: one JSON document."""
    path = tmp_path / "state.json"
    doc = {"version": 2, "written": 1.0, "pid": 7, "tunnels": dump(
        State(tunnels=[rec(10, 20, 40000, [(1, 2, 100)])]))["tunnels"]}
    path.write_text(json.dumps(doc))
    st, warning = statefile.load(str(path))
    assert warning is None and st.tunnels == [rec(10, 20, 40000, [(1, 2, 100)])]


def test_plan_adopts_live_calls_and_removes_orphans():
    state = State(tunnels=[rec(10, 20, 40000, [(1, 2, 100), (3, 4, 101)]), rec(11, 21, 40001, [(5, 6, 102)])])
    alive = {("log", 10, 1, 100)}
    p = statefile.plan(state, [ktun(10, 20, 40000), ktun(11, 21, 40001)],
                       [ksess(10, 1), ksess(10, 3), ksess(11, 5)], lambda *k: k in alive)
    assert [(t.tunnel_id, [s.call_id for s in t.sessions]) for t in p.adopt] == [(10, [1])]
    assert [(t, s) for t, s, _ in p.remove_sessions] == [(10, 3), (11, 5)]
    assert [t for t, _ in p.remove_tunnels] == [11]
    assert p.summary()["adopted_sessions"] == 1 and p.summary()["removed_tunnels"] == 1


def test_plan_never_touches_a_kernel_tunnel_that_is_not_ours():
    # same id, but another peer id, local port or peer: xl2tpd's kernel mode or another tool owns it
    other_peer = dataclasses.replace(
        ktun(12, 22, 40002), remote=Endpoint(address=ipaddress.ip_address("10.0.0.9"), port=1701))
    state = State(tunnels=[rec(10, 20, 40000), rec(11, 21, 40001), rec(12, 22, 40002)])
    p = statefile.plan(state, [ktun(10, 99, 40000), ktun(11, 21, 1701), other_peer],
                       [ksess(10, 1), ksess(11, 1), ksess(12, 1)], lambda *k: False)
    assert p.adopt == [] and p.remove_sessions == [] and p.remove_tunnels == []
    assert len(p.forget) == 3 and all("not ours" in f for f in p.forget)


def test_a_file_of_the_earlier_data_path_is_moved_aside_with_what_to_do(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"version": 1, "tunnels": [{"private_port": 40000}]}))
    state, warning = statefile.load(str(path))
    assert state.tunnels == [] and "earlier data path" in warning and "hang them up" in warning
    assert not path.exists() and any(p.name.startswith("state.json.corrupt-") for p in tmp_path.iterdir())


def test_plan_forgets_what_the_kernel_already_dropped():
    state = State(tunnels=[rec(10, 20, 40000, [(1, 2, 100)]), rec(12, 22, 40002)])
    p = statefile.plan(state, [ktun(10, 20, 40000)], [], lambda *k: True)
    # session 1 went with its pppd; its tunnel is ours and empty: removed; tunnel 12 is gone
    assert [t for t, _ in p.remove_tunnels] == [10]
    assert any("tunnel 12" in f for f in p.forget) and any("session 10/1" in f for f in p.forget)


def test_plan_removes_a_session_in_our_tunnel_that_no_record_names():
    """A crash between session create and the state write (the failpoints
    session-created, channel-connected before pppd holds the socket, and
    rules-applied) leaves a kernel session in a tunnel whose socket a live
    pppd keeps open: the restart removes it, and adopts the recorded one."""
    state = State(tunnels=[rec(10, 20, 40000, [(1, 2, 100)])])
    p = statefile.plan(state, [ktun(10, 20, 40000), ktun(30, 31, 1701)],
                       [ksess(10, 1), ksess(10, 7), ksess(30, 7)], lambda *k: True)
    assert [(t.tunnel_id, [s.call_id for s in t.sessions]) for t in p.adopt] == [(10, [1])]
    # session 30/7 is in a tunnel that is not ours: untouched
    assert [(t, s) for t, s, _ in p.remove_sessions] == [(10, 7)]
    assert "interrupted offload" in p.remove_sessions[0][2] and p.remove_tunnels == []


def test_offloads_at_once_share_state_writes_and_each_finds_its_record_on_disk(tmp_path, monkeypatch):
    """Group commit: 20 offloads record their call under one lock, then wait
    for the file without it.  Each finds its own record on disk when its
    wait returns (before pppd would get the channel); the writes are fewer
    than the offloads; the file ends with all of them, in the order of the
    snapshots."""
    import threading
    import time

    real_append = statefile.Writer._append

    def slow_append(self, data):  # a write that takes time, as an fdatasync does under load
        time.sleep(0.05)
        real_append(self, data)

    monkeypatch.setattr(statefile.Writer, "_append", slow_append)
    path = str(tmp_path / "state.json")
    w = statefile.Writer(path)
    lock = threading.Lock()
    tunnel = TunnelRecord(instance="xl2tpd", tunnel_id=1, peer_tunnel_id=2, local="10.0.0.1", peer="10.0.0.2",
                          peer_port=1701, local_port=1701)
    w.flush(w.snapshot([], [(tunnel, [])]))
    missing = []

    def offload(cid):
        with lock:
            n = w.snapshot([statefile.session_line("xl2tpd", 1, SessionRecord(call_id=cid, peer_call_id=cid,
                                                                              pppd_pid=1000 + cid))])
        w.flush(n)
        on_disk, _ = statefile.load(path)
        if cid not in {s.call_id for t in on_disk.tunnels for s in t.sessions}:
            missing.append(cid)

    threads = [threading.Thread(target=offload, args=(c,)) for c in range(1, 21)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert missing == []
    assert w.writes < 21
    final, _ = statefile.load(path)
    assert sorted(s.call_id for s in final.tunnels[0].sessions) == list(range(1, 21))
    w.close()


def test_a_failed_state_write_raises_for_every_offload_it_covered(tmp_path, monkeypatch):
    calls = []

    def failing(self, data):
        calls.append(1)
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(statefile.Writer, "_write_whole", failing)
    w = statefile.Writer(str(tmp_path / "state.json"))
    a, b = w.snapshot([], []), w.snapshot([])
    for n in (a, b):
        try:
            w.flush(n)
        except OSError:
            continue
        raise AssertionError("a write that failed was taken as done")
    assert len(calls) == 2


def test_an_append_that_fails_after_writing_leaves_no_torn_line(tmp_path, monkeypatch):
    """The disk fails at the sync, after the lines went in: they are cut off
    again, kept, and written once by the next try."""
    path = str(tmp_path / "state.json")
    w = statefile.Writer(path)
    t = rec(10, 20, 40000, ())
    w.flush(w.snapshot([], [(t, [])]))
    s1 = SessionRecord(call_id=1, peer_call_id=2, pppd_pid=100)
    n = w.snapshot([statefile.session_line("log", 10, s1)])
    real = os.fdatasync

    def failing(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(statefile.os, "fdatasync", failing)
    try:
        w.flush(n)
    except OSError:
        pass
    else:
        raise AssertionError("a failed sync was taken as done")
    assert statefile.load(path)[0].tunnels == [t]  # nothing torn, nothing half-said
    monkeypatch.setattr(statefile.os, "fdatasync", real)
    w.flush(n)
    assert statefile.load(path)[0].tunnels == [rec(10, 20, 40000, [(1, 2, 100)])]
    w.close()


def test_the_journal_is_written_whole_again_once_it_outgrows_what_it_says(tmp_path):
    path = str(tmp_path / "state.json")
    w = statefile.Writer(path)
    t = rec(10, 20, 40000, ())
    w.flush(w.snapshot([], [(t, [])]))
    s1 = SessionRecord(call_id=1, peer_call_id=2, pppd_pid=100)
    for _ in range(w.SLACK // 2 + 1):  # a call made and ended, again and again: the file describes 1 tunnel
        assert not w.wants_whole(1)
        w.flush(w.snapshot([statefile.session_line("log", 10, s1), statefile.end_line("log", 10, 1)]))
    assert w.wants_whole(1) and not w.wants_whole(w.SLACK)
    w.flush(w.snapshot([], [(t, [s1])]))
    with open(path, "rb") as f:
        assert len(f.read().splitlines()) == 3  # header, tunnel, session
    assert not w.wants_whole(2)
    w.close()


def test_the_hand_encoding_is_what_the_model_writes_and_reads_back(tmp_path):
    """The file is joined from lines encoded by hand (statefile.*_line);
    they must say what the records' own dump (records.dump) says, and load
    back through the records' checks."""
    recs = [rec(10, 20, 40000, ((1, 2, 100), (3, 4, 101))), rec(30, 31, 1701, ()),
            TunnelRecord(instance='xl2tpd@7 "x"', tunnel_id=5, peer_tunnel_id=6, local="10.0.0.1", peer="10.0.0.2",
                         peer_port=1702, local_port=1701, xl2tpd_pid=77,
                         sessions=[SessionRecord(call_id=9, peer_call_id=0, pppd_pid=5, role="lac",
                                                 pty="/dev/pts/3", moved=True, since=1.5)])]
    for r in recs:
        model = dump(State(tunnels=[r]))["tunnels"][0]
        assert json.loads(statefile.tunnel_line(r))["tunnel"] == {k: v for k, v in model.items() if k != "sessions"}
        for s, want in zip(r.sessions, model["sessions"]):
            assert json.loads(statefile.session_line(r.instance, r.tunnel_id, s))["session"] == \
                {"instance": r.instance, "tunnel_id": r.tunnel_id, **want}
    path = str(tmp_path / "state.json")
    statefile.save(path, State(tunnels=recs))
    st, warning = statefile.load(path)
    assert warning is None and st.tunnels == recs


def test_a_version_2_file_over_several_lines_trailing_zeros_and_deep_nesting(tmp_path):
    """A hand-edited version 2 file (pretty-printed) is read; zeros after the
    last line (a power loss) are not read; a document nested past the
    parser's depth is invalid, never a crash."""
    path = tmp_path / "state.json"
    doc = {"version": 2, "tunnels": dump(State(tunnels=[rec()]))["tunnels"]}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    assert statefile.load(str(path)) == (State(version=2, tunnels=[rec()]), None)
    statefile.save(str(path), State(tunnels=[rec()]))
    with open(path, "ab") as f:
        f.write(statefile.end_line("log", 10, 1)[:-5] + b"\0" * 4096)
    st, warning = statefile.load(str(path))
    assert warning is None and st.tunnels == [rec()]
    path.write_bytes(b"[" * 100000)
    st, warning = statefile.load(str(path))
    assert st.tunnels == [] and "is not valid" in warning


def test_a_replaced_file_is_written_whole_not_appended_to(tmp_path):
    """An editor's save (a rename over the path) or a move aside: appends to
    the old file would reach nothing a restart reads."""
    path = str(tmp_path / "state.json")
    w = statefile.Writer(path)
    t = rec(10, 20, 40000, ())
    w.flush(w.snapshot([], [(t, [])]))
    assert not w.wants_whole(1) and not w.stuck()
    statefile.save(path, State(tunnels=[rec(10, 20, 40000, ((1, 2, 100),))]))  # someone's edit
    assert w.wants_whole(1) and w.stuck()
    n = w.snapshot([statefile.drop_line("log", 10)])
    try:
        w.flush(n)
    except OSError:
        pass
    else:
        raise AssertionError("lines appended to a file no longer at its path")
    w.flush(w.snapshot([], []))  # the whole state, as the service's next snapshot gives it
    assert statefile.load(path)[0].tunnels == [] and not w.stuck()
    w.close()
