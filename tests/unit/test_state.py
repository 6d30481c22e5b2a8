"""The tracker (discovery/state.py): the events and the model it builds
from xl2tpd's log records, on recorded logs (tests/unit/data/) and on lines
written here."""

from __future__ import annotations

import sys

import pytest

from pipexctl.discovery import logparse as lp
from pipexctl.discovery.state import CallKey, Tracker

from .conftest import DATA, brief


def events(name, lines):
    t = Tracker()
    out = []
    for r in lp.parse_lines(lines):
        out += t.apply(name, r)
    return t, out


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
    assert ev[2].call.pppd_argv[:3] == ("/usr/sbin/pppd", "plugin", "pppol2tp.so")


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
    assert ins.calls["10.0.0.2", 100].ids() == (7, 8, 100, 200, 1702) and ins.calls["10.0.0.2", 100].pppd_pid == 99


CLASH = [  # boot 3 of the 2026-12-05 login storm: xl2tpd gave a second live tunnel the id 53805
    "xl2tpd[9]: Connection established to 10.99.1.2, 1701.  Local: 53805, Remote: 4761 (ref=0/0).  "
    "LNS session is 'default'",
    "xl2tpd[9]: Call established with 10.99.1.2, PID: 9741, Local: 23002, Remote: 1, Serial: 1",
    "xl2tpd[9]: Connection established to 10.99.58.2, 1701.  Local: 53805, Remote: 36725 (ref=0/0).  "
    "LNS session is 'default'",
    "xl2tpd[9]: Call established with 10.99.58.2, PID: 11255, Local: 34008, Remote: 19088, Serial: 1",
]


def test_a_second_live_tunnel_with_one_id_keeps_its_own_peer_ids_and_end():
    """xl2tpd does not check its random tunnel ids against its live tunnels:
    the second tunnel's call gets that tunnel's peer ids (not the first's,
    which no control-pipe answer would confirm), and either tunnel's end
    ends only its own calls."""
    t, ev = events("x", CLASH)
    assert [e.event for e in ev] == ["TunnelUp", "CallUp", "TunnelUp", "CallUp"]
    ins = t.instances["x"]
    assert ins.calls["10.99.1.2", 23002].ids()[:2] == (53805, 4761)
    assert ins.calls["10.99.58.2", 34008].ids()[:2] == (53805, 36725)
    assert sorted((x.peer, x.peer_tunnel_id) for x in t.tunnels()) == [("10.99.1.2", 4761), ("10.99.58.2", 36725)]
    assert any("second live tunnel" in n for n in t.notes), t.notes
    # an end that does not say which of the two it is ends neither
    assert [e for r in lp.parse_lines(["xl2tpd[9]: Maximum retries exceeded for tunnel 53805.  Closing."])
            for e in t.apply("x", r)] == []
    assert {k.call_id for k in ins.calls} == {23002, 34008}
    # the first one ends: the second is the id's tunnel now, its call untouched
    ev = [e for r in lp.parse_lines(["xl2tpd[9]: control_finish: Connection closed to 10.99.1.2, port 1701 "
                                     "(Goodbye!), Local: 53805, Remote: 4761"]) for e in t.apply("x", r)]
    assert [(e.event, getattr(e, "call", getattr(e, "tunnel", None)).peer) for e in ev] == [
        ("CallDown", "10.99.1.2"), ("TunnelDown", "10.99.1.2")]
    assert {k.call_id for k in ins.calls} == {34008} and ins.tunnels[53805].peer_tunnel_id == 36725 and not ins.clashes
    ev = [e for r in lp.parse_lines(["xl2tpd[9]: Maximum retries exceeded for tunnel 53805.  Closing."])
          for e in t.apply("x", r)]
    assert [e.event for e in ev] == ["CallDown", "TunnelDown"] and not ins.calls and not ins.tunnels


def test_the_second_of_two_live_tunnels_with_one_id_ends_alone():
    t, _ = events("x", CLASH)
    ins = t.instances["x"]
    ev = [e for r in lp.parse_lines(["xl2tpd[9]: control_finish: Connection closed to 10.99.58.2, port 1701 "
                                     "(Goodbye!), Local: 53805, Remote: 36725"]) for e in t.apply("x", r)]
    assert [e.event for e in ev] == ["CallDown", "TunnelDown"] and ev[0].call.call_id == 34008
    assert {k.call_id for k in ins.calls} == {23002} and ins.tunnels[53805].peer == "10.99.1.2" and not ins.clashes


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


def test_every_record_type_is_applied_or_named_as_carrying_nothing():
    """Tracker.apply dispatches on the record's type: a new record type in
    logparse must get a handler or be named here as one the model ignores."""
    from pipexctl.discovery import state

    ignored = {"Connecting", "Disconnecting", "Listening", "Malformed", "PppdTerminating", "Unparsed"}
    kinds = {c for c in vars(lp).values() if isinstance(c, type) and issubclass(c, lp.Rec) and c is not lp.Rec}
    assert {c.__name__ for c in kinds - set(state._ON_RECORD)} == ignored
    assert all(c.__bases__ == (lp.Rec,) for c in kinds)  # a subclass would miss its parent's handler


def test_calls_by_pppd_pid_follow_every_change():
    """A request finds its call through Calls' index (the steps do not grow
    with the calls known): it must always say what a scan of every call says,
    through call_up, a pid learnt later, call_down, a reused call id and a
    checkpoint's restore."""
    from hypothesis import given, settings, strategies as st

    from pipexctl.discovery import checkpoint
    from pipexctl.discovery.state import CallInfo

    ops = st.lists(st.tuples(st.sampled_from(["up", "up-no-pid", "pid", "down", "restore"]),
                             st.sampled_from(["a", "b"]), st.integers(1, 4), st.integers(100, 103)), max_size=25)

    @settings(max_examples=200, deadline=None)
    @given(ops)
    def run(steps):
        t = Tracker()
        for op, name, cid, pid in steps:
            ins = t.inst(name)
            if op in ("up", "up-no-pid"):
                t.call_up(ins, CallInfo(instance=name, role="lns", peer="192.0.2.1", call_id=cid,
                                        pppd_pid=pid if op == "up" else None))
            elif op == "pid" and ("192.0.2.1", cid) in ins.calls:
                t.update_call(ins.calls["192.0.2.1", cid], pppd_pid=pid)
            elif op == "down":
                t.call_down(ins, CallKey("192.0.2.1", cid), "gone")
            elif op == "restore":
                t.instances[name] = checkpoint.InstanceState.of(ins).instance()
            for p in range(100, 104):
                want = sorted((c.instance, c.call_id) for c in t.calls() if c.pppd_pid == p)
                assert sorted((c.instance, c.call_id) for c in t.calls_of_pppd(p)) == want
            for i in t.instances.values():
                assert sorted(c.call_id for c in i.calls.without_pppd()) == \
                    sorted(c.call_id for c in i.calls.values() if c.pppd_pid is None)

    run()


def test_a_records_copy_equals_a_deep_copy_and_later_changes_do_not_reach_it():
    """CallInfo.copy and TunnelInfo.copy share every field (no deepcopy):
    every field must come out equal and be of a type that does not change
    in place, so that sharing it is safe; a record's sources tuple is one
    object shared by every record with the same sources."""
    import copy
    import dataclasses

    from hypothesis import given, settings, strategies as st

    from pipexctl.discovery.state import CallInfo, TunnelInfo

    words = st.lists(st.text(max_size=5), max_size=3)
    ints = st.none() | st.integers(0, 65535)

    @settings(max_examples=100, deadline=None)
    @given(words, words, ints, ints, st.booleans())
    def run(argv, sources, tid, pid, disputed):
        c = CallInfo(instance="a", peer="192.0.2.1", call_id=5, tunnel_id=tid, pppd_pid=pid,
                     pppd_argv=argv or None, sources=sources, disputed=disputed)
        t = TunnelInfo(instance="a", peer="192.0.2.1", tunnel_id=7, sources=sources)
        for rec in (c, t):
            snap = rec.copy()
            assert snap == copy.deepcopy(rec) and type(snap) is type(rec)
            for f in dataclasses.fields(rec):
                v = getattr(rec, f.name)
                assert v is None or type(v) in (str, int, float, bool, tuple), (f.name, type(v))
                assert type(v) is not tuple or all(type(x) is str for x in v)
        assert c.sources is t.sources and c.sources == tuple(sources)
        assert c.copy(tunnel_id=9).tunnel_id == 9 and c.tunnel_id == tid

    run()


# Two LACs, one LNS: xl2tpd gave both calls our call id 7777 (it draws call
# ids at random and does not check them against its live calls)
SHARED_CALL_ID = [
    "xl2tpd[9]: Connection established to 10.99.1.2, 1701.  Local: 101, Remote: 201 (ref=0/0).  "
    "LNS session is 'default'",
    "xl2tpd[9]: Call established with 10.99.1.2, PID: 501, Local: 7777, Remote: 301, Serial: 1",
    "xl2tpd[9]: Connection established to 10.99.2.2, 1701.  Local: 102, Remote: 202 (ref=0/0).  "
    "LNS session is 'default'",
    "xl2tpd[9]: Call established with 10.99.2.2, PID: 502, Local: 7777, Remote: 302, Serial: 1",
]


def test_two_live_calls_with_one_call_id_on_two_peers_are_both_followed():
    """The second call's line no longer ends the first (its pppd was then
    refused: "no call names this pid"); each end line, which names the call
    by id and address, ends its own call only."""
    t, ev = events("x", SHARED_CALL_ID)
    assert [e.event for e in ev] == ["TunnelUp", "CallUp", "TunnelUp", "CallUp"]
    assert sorted(c.ids() for c in t.calls()) == [(101, 201, 7777, 301, 1701), (102, 202, 7777, 302, 1701)]
    assert [c.tunnel_id for c in t.calls_of_pppd(501)] == [101] and [c.tunnel_id for c in t.calls_of_pppd(502)] == [102]
    assert t.find_call("x", 102, 7777).pppd_pid == 502 and t.find_call("x", 103, 7777) is None
    ev = [e for r in lp.parse_lines(["xl2tpd[9]: call_close: Call 7777 to 10.99.1.2 disconnected"])
          for e in t.apply("x", r)]
    assert [(e.event, e.call.pppd_pid) for e in ev] == [("CallDown", 501)]
    assert [c.pppd_pid for c in t.calls()] == [502] and t.calls_of_pppd(501) == []
    # a line that names neither address nor tunnel, with ids two calls share, ends none
    t, _ = events("x", SHARED_CALL_ID[:3] + [SHARED_CALL_ID[3].replace("Remote: 302", "Remote: 301")])
    ev = [e for r in lp.parse_lines(["xl2tpd[9]: child_handler : pppd exited for call 301 with code 16"])
          for e in t.apply("x", r)]
    assert ev == [] and len(t.calls()) == 2


def test_a_status_dump_places_each_of_two_calls_with_one_id_in_its_own_tunnel():
    """xl2tpd's status dump (SIGUSR1) lists each tunnel, then its calls."""
    t, _ = events("x", [SHARED_CALL_ID[0], SHARED_CALL_ID[2]])
    recs = lp.parse_lines([
        "xl2tpd[9]: Tunnel default, ID = 101 (local), 201 (remote) to 10.99.1.2:1701, control_seq_num = 2, "
        "control_rec_seq_num = 4, cLr = 2, call count = 1 ref=0/refhim=0",
        "xl2tpd[9]: Call default # 1, ID = 7777 (local), 301 (remote), serno = 1, data_seq_num = 9, "
        "data_rec_seq_num = 0, pLr = 8, tx = 273 bytes (9), rx= 173 bytes (8)",
        "xl2tpd[9]: Tunnel default, ID = 102 (local), 202 (remote) to 10.99.2.2:1701, control_seq_num = 2, "
        "control_rec_seq_num = 4, cLr = 2, call count = 1 ref=0/refhim=0",
        "xl2tpd[9]: Call default # 1, ID = 7777 (local), 302 (remote), serno = 1, data_seq_num = 9, "
        "data_rec_seq_num = 0, pLr = 8, tx = 273 bytes (9), rx= 173 bytes (8)",
    ])
    assert [type(r).__name__ for r in recs] == ["StatusTunnel", "StatusCall"] * 2
    ev = [e for r in recs for e in t.apply("x", r)]
    assert [e.event for e in ev] == ["CallUp", "CallUp"]
    assert sorted(c.ids() for c in t.calls()) == [(101, 201, 7777, 301, 1701), (102, 202, 7777, 302, 1701)]


def test_two_calls_with_one_id_on_two_tunnels_to_one_address_keep_the_later_and_say_so():
    """The log names a call by id and address only: the model holds one of
    them (the later), and a note says which call is no longer followed."""
    lines = [
        "xl2tpd[9]: Connection established to 10.99.1.2, 1701.  Local: 101, Remote: 201 (ref=0/0).  "
        "LNS session is 'default'",
        "xl2tpd[9]: Connection established to 10.99.1.2, 1702.  Local: 102, Remote: 202 (ref=0/0).  "
        "LNS session is 'default'",
        "xl2tpd[9]: start_pppd: I'm running: ",
        'xl2tpd[9]: "/usr/sbin/pppd" ',
        'xl2tpd[9]: "plugin" ',
        'xl2tpd[9]: "pppol2tp.so" ',
        'xl2tpd[9]: "pppol2tp" ',
        'xl2tpd[9]: "7" ',
        'xl2tpd[9]: "pppol2tp_tunnel_id" ',
        'xl2tpd[9]: "101" ',
        'xl2tpd[9]: "pppol2tp_session_id" ',
        'xl2tpd[9]: "7777" ',
        "xl2tpd[9]: Call established with 10.99.1.2, PID: 501, Local: 7777, Remote: 301, Serial: 1",
        "xl2tpd[9]: start_pppd: I'm running: ",
        'xl2tpd[9]: "/usr/sbin/pppd" ',
        'xl2tpd[9]: "plugin" ',
        'xl2tpd[9]: "pppol2tp.so" ',
        'xl2tpd[9]: "pppol2tp" ',
        'xl2tpd[9]: "8" ',
        'xl2tpd[9]: "pppol2tp_tunnel_id" ',
        'xl2tpd[9]: "102" ',
        'xl2tpd[9]: "pppol2tp_session_id" ',
        'xl2tpd[9]: "7777" ',
        "xl2tpd[9]: Call established with 10.99.1.2, PID: 502, Local: 7777, Remote: 302, Serial: 2",
    ]
    t, ev = events("x", lines)
    assert [(c.tunnel_id, c.pppd_pid) for c in t.calls()] == [(102, 502)], (ev, t.calls())
    assert any("two tunnels to 10.99.1.2 (101 and 102)" in n for n in t.notes), t.notes


def test_a_call_keeps_its_tunnels_copy_of_the_peer_address():
    """Serve tracks one call per remote-access tunnel: the call and its key
    share the tunnel's string for the address (one per tunnel, not one per
    record, and no table of every address seen)."""
    t, _ = events("lns", (DATA / "lns-userspace.log").read_text().splitlines()[:40])
    ins = t.inst("lns")
    c = t.calls()[0]
    tun = ins.tunnels[c.tunnel_id]
    key = next(k for k in ins.calls if ins.calls[k] is c)
    assert c.peer == tun.peer and c.peer is tun.peer and key.peer is tun.peer
    assert sys.intern("".join(list(c.peer))) is not c.peer  # not in the interpreter's table


def test_a_calls_pppd_argv_is_kept_until_its_pppd_is_known():
    """The argv is how a /proc scan tells a LAC call's pppd; once the pid is
    known it is dropped (it holds the call's own pty and address strings):
    an LNS line names the pid at once, a LAC call learns it from /proc."""
    lines = (DATA / "lns-userspace.log").read_text().splitlines()
    t, _ = events("lns", lines[:1 + next(i for i, ln in enumerate(lines) if "Call established" in ln)])
    (lns,) = t.calls()
    assert lns.pppd_pid == 151 and lns.pppd_argv is None and lns.data_path == "userspace"
    lines = (DATA / "lac1-userspace.log").read_text().splitlines()
    end = max(i for i, ln in enumerate(lines) if ln.endswith('"/lab/lac1/options" ')) + 1
    t, _ = events("lac", lines[:end])
    (lac,) = t.calls()
    assert lac.pppd_pid is None and lac.pppd_argv[1] == "/dev/pts/0"
    ev = t.observe_pppd("lac", lac.ref(), 4242)
    assert lac.pppd_pid == 4242 and lac.pppd_argv is None and ev[0].fields == ["pppd_pid"]
    assert t.update_call(lac, pppd_argv=("/usr/sbin/pppd", "/dev/pts/9")) == [] and lac.pppd_argv is None
