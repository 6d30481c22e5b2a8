"""The offload service's all-or-nothing channel, on the null kernel backend
and the null data path: every failing step, the hand-off to pppd included,
leaves no session, tunnel, tunnel socket or record behind.  The same
sequence against the real kernel is tests/kernel/test_faults.py."""

from __future__ import annotations

import errno
import json
import os

import pytest

from pipexctl import errors
from pipexctl.discovery.discovery import Discovery
from pipexctl.discovery.state import CallInfo
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.server import OffloadServer
from pipexctl.records import dump

from .conftest import call as srv_call, offload


def call(cid, tid=100, pid=4242):
    return CallInfo(instance="xl2tpd", role="lns", peer="192.0.2.7", peer_port=1701, tunnel_id=tid,
                    peer_tunnel_id=200, call_id=cid, peer_call_id=cid + 1000, pppd_pid=pid, data_path="kernel")


@pytest.fixture
def svc(tmp_path):
    s = OffloadServer(str(tmp_path / "serve.sock"), Discovery([], proc=False, kernel=False), NullBackend(),
                      NullDataPath()).service
    yield s
    for ts in s.tunnels.values():
        if ts.sock is not None:
            ts.sock.close()


def state(svc):
    """The state file as a restart reads it, in the models' own dump."""
    from pipexctl.offload.statefile import read

    st = read(svc.state_path)
    assert st is not None, "the state file is missing or not valid"
    return dump(st)


def nothing_left(svc):
    assert svc.tunnels == {} and svc.datapath.tunnels == {}
    assert svc.backend.tunnel_dump() == [] and svc.backend.session_dump() == []
    if os.path.exists(svc.state_path):  # absent: failed before anything was recorded
        assert state(svc)["tunnels"] == []


def test_a_failed_hand_off_undoes_the_session_and_the_new_tunnel(svc):
    sent = []

    def hand_off(meta, fds):
        sent.append((meta, fds))
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")  # pppd went away before it read the reply

    with pytest.raises(BrokenPipeError):
        svc.offload(call(1), 4242, hand_off=hand_off)
    assert len(sent) == 1 and len(sent[0][1]) == 2  # the channel and the tunnel's socket were offered
    nothing_left(svc)


def test_a_failed_hand_off_keeps_the_tunnel_of_other_calls(svc):
    ch, _ = svc.offload(call(1), 4242)

    def hand_off(meta, fds):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        svc.offload(call(2), 4343, hand_off=hand_off)
    assert sorted(svc.tunnels[("xl2tpd", 100)].records) == [1]
    assert [s.session_id for s in svc.backend.session_dump()] == [1]
    assert [s["call_id"] for s in state(svc)["tunnels"][0]["sessions"]] == [1]
    ch.close()


@pytest.mark.parametrize("step", ["session_create", "ppp_connect"])
def test_a_failing_kernel_step_undoes_everything_before_it(svc, step):
    svc.backend.fail_on[step] = errno.ENOMEM
    with pytest.raises(errors.PipexError):
        svc.offload(call(1), 4242)
    nothing_left(svc)


def test_a_failing_tunnel_create_closes_the_tunnel_socket(svc):
    svc.backend.fail_on["tunnel_create"] = errno.EBUSY
    with pytest.raises(errors.ConflictError):
        svc.offload(call(1), 4242)
    nothing_left(svc)


def test_an_interrupt_mid_offload_is_undone_too(svc):
    def hand_off(meta, fds):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        svc.offload(call(1), 4242, hand_off=hand_off)
    nothing_left(svc)


# The hand-off runs without the service's lock: what other threads may do meanwhile.

def _sleeper():
    import subprocess

    return subprocess.Popen(["sleep", "60"])


def test_a_failed_hand_off_leaves_a_newer_call_with_the_same_id_alone(svc):
    """pppd 1 exits during its hand-off, the watcher ends its call, xl2tpd
    gives the id to pppd 2, which is offloaded; then pppd 1's hand-off fails."""
    p1, p2 = _sleeper(), _sleeper()
    try:
        held = []  # pppd 2's channel (the null backend has no pppd holding a copy: kept open here)

        def hand_off(meta, fds):
            with svc.lock:
                svc._end_call(svc.tunnels[("xl2tpd", 100)], 1, "ended (pppd exited)")
            held.append(svc.offload(call(1, pid=p2.pid), p2.pid)[0])
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        with pytest.raises(BrokenPipeError):
            svc.offload(call(1, pid=p1.pid), p1.pid, hand_off=hand_off)
        ts = svc.tunnels[("xl2tpd", 100)]
        assert ts.records[1].pppd_pid == p2.pid
        assert [s.session_id for s in svc.backend.session_dump()] == [1]  # pppd 1's channel closed, not pppd 2's
        held[0].close()
    finally:
        p1.kill()
        p2.kill()


def test_a_tunnel_reported_down_during_a_failed_hand_off_goes(svc):
    from pipexctl.discovery.state import TunnelDown, TunnelInfo

    pa, pb = _sleeper(), _sleeper()
    try:
        svc.offload(call(1, pid=pa.pid), pa.pid)[0].close()
        with svc.lock:
            svc._end_call(svc.tunnels[("xl2tpd", 100)], 1, "ended")  # the tunnel stays, as after a pppd exit

        def hand_off(meta, fds):
            svc.handle([TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", tunnel_id=100, peer_tunnel_id=200,
                                                     peer="192.0.2.7"), reason="StopCCN")])
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        with pytest.raises(BrokenPipeError):
            svc.offload(call(2, pid=pb.pid), pb.pid, hand_off=hand_off)
        nothing_left(svc)
    finally:
        pa.kill()
        pb.kill()


def test_the_hand_off_sends_its_own_copy_of_the_tunnel_socket(svc):
    import os

    seen = []

    def hand_off(meta, fds):
        ts = svc.tunnels[("xl2tpd", 100)]
        seen.append((fds[1] != ts.sock.fileno(), os.path.samestat(os.fstat(fds[1]), os.fstat(ts.sock.fileno()))))
        with svc.lock:  # the tunnel dropped meanwhile (its xl2tpd exited): the copy stays valid
            svc.drop_tunnel(("xl2tpd", 100), "xl2tpd exited")
        os.fstat(fds[1])

    ch, _ = svc.offload(call(1), 4242, hand_off=hand_off)
    ch.close()
    assert seen == [(True, True)]


# What the service keeps up to date as tunnels change (offload and end cost
# the same at 10 or 10,000 calls held: bench/bookkeeping.py): it must always
# say what a rebuild from the records would.

def _rebuilt(svc):
    from pipexctl.offload.statefile import State

    return dump(State(tunnels=[t.record() for t in svc.tunnels.values()]))["tunnels"]


def _as_set(tunnels):
    return sorted((json.dumps({**t, "sessions": sorted(t["sessions"], key=lambda s: s["call_id"])}, sort_keys=True)
                   for t in tunnels))


def test_the_state_file_and_the_twin_count_follow_every_change(svc, tmp_path):
    from hypothesis import HealthCheck, given, settings, strategies as st

    from pipexctl.offload.service import TunnelState
    from pipexctl.offload.statefile import SessionRecord

    steps = st.lists(st.tuples(st.sampled_from(["offload", "end", "drop", "adopt", "del"]),
                               st.integers(1, 2), st.integers(1, 2)), max_size=20)
    held = []

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(steps)
    def run(ops):
        for key in list(svc.tunnels):
            svc.drop_tunnel(key, "reset", sync=False)
        svc.save()
        for op, tid, cid in ops:
            key = ("xl2tpd", 100 + tid)
            ts = svc.tunnels.get(key)
            with svc.lock:
                if op == "offload":
                    try:
                        held.append(svc.offload(call(cid, tid=100 + tid, pid=4000 + cid), 4000 + cid)[0])
                    except errors.PipexError:  # a duplicate, or an adopted tunnel the null kernel lacks
                        pass
                elif op == "end" and ts is not None:
                    svc._end_call(ts, cid, "ended")
                    svc.save()
                elif op == "drop":
                    svc.drop_tunnel(key, "dropped")
                elif op == "adopt" and ts is None:  # as reconcile.py builds an adopted tunnel
                    t = TunnelState("xl2tpd", 100 + tid, 200, "127.0.0.1", "192.0.2.7", 1701, None, 1701)
                    t.records[cid] = SessionRecord(call_id=cid, peer_call_id=cid, pppd_pid=4000 + cid)
                    svc.tunnels[key] = t
                    svc.save()
                elif op == "del" and ts is not None:
                    del svc.tunnels[key]
                    svc.save()
            assert _as_set(state(svc)["tunnels"]) == _as_set(_rebuilt(svc))
            for t in svc.tunnels.values():
                want = sum((u.local, u.peer, u.peer_port, u.local_port) == (t.local, t.peer, t.peer_port,
                                                                            t.local_port)
                           for u in svc.tunnels.values())
                assert svc.tunnels.on_addresses((t.local, t.peer, t.peer_port, t.local_port)) == want

    try:
        run()
    finally:
        for ch in held:
            ch.close()


def test_a_tunnels_records_refuse_the_changes_they_cannot_encode(svc):
    from pipexctl.offload.service import Records

    r = Records()
    for bad in (lambda: r.update({1: None}), lambda: r.setdefault(1, None), r.popitem):
        with pytest.raises(TypeError):
            bad()


# Ends are recorded under the lock and written after it (save(now=False),
# write_saved): each path that ends a call must still put it on disk.

def _sessions_on_disk(svc):
    return sorted(s["call_id"] for t in state(svc)["tunnels"] for s in t["sessions"])


def test_an_end_by_pppd_exit_reaches_the_file_after_the_sweep(svc):
    p = _sleeper()
    ch, _ = svc.offload(call(1, pid=p.pid), p.pid)
    ch.close()
    assert _sessions_on_disk(svc) == [1]
    p.kill()
    p.wait()
    svc.sweep()
    assert svc.tunnels[("xl2tpd", 100)].records == {} and _sessions_on_disk(svc) == []  # the tunnel waits for its end


def test_an_end_discovery_reports_for_an_exited_pppd_reaches_the_file_after_handle(svc):
    from pipexctl.discovery.state import CallDown

    p = _sleeper()
    ch, _ = svc.offload(call(1, pid=p.pid), p.pid)
    ch.close()
    ch2, _ = svc.offload(call(2, pid=4343), 4343)  # keeps the tunnel: only the session goes
    ch2.close()
    p.kill()
    p.wait()
    svc.handle([CallDown(call=call(1, pid=p.pid), reason="pppd exited")])
    assert _sessions_on_disk(svc) == [2]


def test_a_failing_disk_is_retried_by_the_tick_and_warned_about_once(svc, monkeypatch, caplog):
    import logging

    from pipexctl.offload import statefile

    real = statefile.Writer._append
    failing = [False]

    def append(self, data):
        if failing[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, data)

    monkeypatch.setattr(statefile.Writer, "_append", append)
    ch, _ = svc.offload(call(1), 4242)  # written before the disk fills
    ch.close()
    failing[0] = True
    with caplog.at_level(logging.WARNING, logger="pipexctl.serve"):
        with svc.lock:
            svc._end_call(svc.tunnels[("xl2tpd", 100)], 1, "ended")
            svc.save(now=False)
        for _ in range(10):
            svc.tick()
    warned = [r for r in caplog.records if "cannot write state file" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    failing[0] = False
    svc.state.retry_at = 0.0  # the back-off's next try is now
    with caplog.at_level(logging.INFO, logger="pipexctl.serve"):
        svc.tick()
    assert _sessions_on_disk(svc) == []
    assert any("written again" in r.getMessage() for r in caplog.records)


def test_a_journal_snapshot_is_not_changed_by_what_the_table_does_after_it(svc):
    ch, _ = svc.offload(call(1), 4242)
    ch.close()
    with svc.lock:
        svc.snapshot()  # the lines so far are queued
        whole = svc.tunnels.whole()
        ch2, _ = svc.offload(call(2, pid=4343), 4343)
        svc._end_call(svc.tunnels[("xl2tpd", 100)], 1, "ended")
        svc.save()
    ch2.close()
    assert [[s.call_id for s in sessions] for _, sessions in whole] == [[1]]
    assert _sessions_on_disk(svc) == [2]


def test_the_indexed_tables_refuse_a_copy_that_would_share_their_index():
    import copy

    from pipexctl.discovery.state import Calls
    from pipexctl.offload.service import Records, TunnelTable

    for table in (Records(), TunnelTable(), Calls()):
        for bad in (copy.copy, copy.deepcopy, lambda t: t.__ior__({})):
            with pytest.raises(TypeError):
                bad(table)


# Which kernel tunnel an offloaded call's session goes to: a duplicate
# refused, a second tunnel of one address pair (a twin) steered, a second
# port of one address a tunnel of its own, and ids xl2tpd reused while the
# old call or tunnel was still recorded (the served daemon's fixture, srv).

def test_a_duplicate_offload_leaves_the_healthy_session_and_its_tunnel_socket(srv):
    offload(srv, srv_call(1))
    tunnels = dict(srv.service.datapath.tunnels)
    with pytest.raises(errors.ConflictError):
        srv.service.offload(srv_call(1), 4242)
    assert 1 in srv.service.tunnels[("xl2tpd", 100)].records
    assert srv.service.datapath.tunnels == tunnels and len(tunnels) == 1  # the tunnel's socket is still open
    assert srv.service.tunnels[("xl2tpd", 100)].sock.fileno() >= 0
    assert srv.service.backend.session_get(100, 1).session_id == 1


def test_a_second_tunnel_from_the_same_peer_address_and_port_gets_a_steered_socket(srv):
    """Linux before 6.11 looks a data packet's session up in the tunnel of
    the socket that received it: only the first tunnel of an address pair
    sits on xl2tpd's port, a second one (a twin) on a steered private port."""
    offload(srv, srv_call(1))
    first = srv.service.tunnels[("xl2tpd", 100)]
    srv.service.xl2tpd_port = first.local_port  # as if the first one sat on xl2tpd's port
    offload(srv, srv_call(5, tid=103))
    offload(srv, srv_call(4, tid=102, peer="192.0.2.8"))  # another peer: a tunnel of its own
    assert {t: twin for t, (twin, _) in srv.service.datapath.tunnels.items()} == {100: False, 103: True, 102: False}
    assert srv.service.backend.tunnel_get(103).peer_tunnel_id == 200


def test_a_tunnel_from_a_second_port_of_one_address_goes_to_that_port_and_is_no_twin(srv):
    """Two clients behind one NAT address: the second tunnel's socket is
    connected to its own peer port, and it is not a twin (another pair)."""
    offload(srv, srv_call(1))
    srv.service.xl2tpd_port = srv.service.tunnels[("xl2tpd", 100)].local_port
    offload(srv, srv_call(5, tid=103).copy(peer_port=1702))
    second = srv.service.tunnels[("xl2tpd", 103)]
    assert (second.peer, second.peer_port) == ("192.0.2.7", 1702)
    assert srv.service.datapath.tunnels[103][0] is False  # no twin: its own address pair


def test_a_reused_session_id_is_offloaded_and_the_old_calls_late_end_spares_it(srv):
    """xl2tpd's call ids are random: a new call can get the id of one whose
    pppd just exited, before discovery reported that end."""
    from pipexctl.discovery.state import CallDown

    offload(srv, srv_call(1))
    srv.channels.pop().close()  # the first pppd exits: the kernel drops its session
    new = srv_call(1).copy(pppd_pid=4343, peer_call_id=77)
    ch, meta = srv.service.offload(new, 4343)
    srv.channels.append(ch)
    assert meta["peer_session_id"] == 77 and srv.service.backend.session_get(100, 1).peer_session_id == 77
    srv.service.on_event(CallDown(call=srv_call(1), reason="pppd 4242 exited"))  # the old call's end, late
    assert srv.service.tunnels[("xl2tpd", 100)].records[1].pppd_pid == 4343
    assert srv.service.backend.session_get(100, 1).peer_session_id == 77
    srv.service.on_event(CallDown(call=new, reason="hung up"))  # the new call's own end
    assert 1 not in srv.service.tunnels[("xl2tpd", 100)].records


def test_a_reused_tunnel_id_replaces_the_dead_tunnel_and_its_late_end_spares_the_new_one(srv):
    from pipexctl.discovery.state import TunnelDown, TunnelInfo

    offload(srv, srv_call(1))
    old_sock = srv.service.tunnels[("xl2tpd", 100)].sock
    new = srv_call(5).copy(peer_tunnel_id=300, pppd_pid=4343)
    ch, meta = srv.service.offload(new, 4343)
    srv.channels.append(ch)
    ts = srv.service.tunnels[("xl2tpd", 100)]
    assert ts.peer_tunnel_id == 300 and list(ts.records) == [5] and old_sock.fileno() == -1
    assert srv.service.backend.tunnel_get(100).peer_tunnel_id == 300
    srv.service.on_event(TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", peer="192.0.2.7", tunnel_id=100, peer_tunnel_id=200)))
    assert ("xl2tpd", 100) in srv.service.tunnels and srv.service.backend.tunnel_get(100).peer_tunnel_id == 300
    srv.service.on_event(TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", peer="192.0.2.7", tunnel_id=100, peer_tunnel_id=300)))
    assert ("xl2tpd", 100) not in srv.service.tunnels


# The failpoints: PIPEXCTL_FAILPOINT is read when the daemon is made, and a
# name or a stall it does not know is refused then (they fire in the guest:
# tests/kernel/test_faults.py).

def test_an_unknown_failpoint_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEXCTL_FAILPOINT", "state-saved,tunnel-made")
    with pytest.raises(errors.InvalidArgumentError, match="unknown tunnel-made"):
        OffloadServer(str(tmp_path / "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    monkeypatch.setenv("PIPEXCTL_FAILPOINT", "state-saved@x")
    with pytest.raises(errors.InvalidArgumentError, match="seconds must be a number"):
        OffloadServer(str(tmp_path / "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    monkeypatch.setenv("PIPEXCTL_FAILPOINT", "state-saved,session-created@2.5")
    s = OffloadServer(str(tmp_path / "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    assert s.service.failpoints == {"state-saved": None, "session-created": 2.5}


def test_the_timing_splits_the_build_into_this_threads_cpu_and_its_waits(svc, monkeypatch):
    """The serve log's "kernel X, of it on a CPU Y and waiting for one Z": a
    build that sleeps (here in a kernel step) shows it outside both."""
    import time

    slow = svc.backend.session_create

    def sleepy(spec):
        time.sleep(0.2)
        return slow(spec)

    monkeypatch.setattr(svc.backend, "session_create", sleepy)
    timing: dict = {}
    ch, _ = svc.offload(call(1), 4242, timing=timing)
    ch.close()
    assert timing["build"] >= 0.2
    assert 0 <= timing["build_cpu"] < timing["build"] - 0.15, timing
    assert 0 <= timing["build_runnable"] < timing["build"] - 0.15, timing  # asleep, not waiting for a CPU


def test_the_tick_writes_the_file_whole_again_after_someone_replaced_it(svc):
    """The daemon owns the file: an edit without SIGHUP is overwritten by the
    next round, so a restart reads what the daemon holds."""
    from pipexctl.offload import statefile

    ch, _ = svc.offload(call(1), 4242)
    ch.close()
    statefile.save(svc.state_path, statefile.State())  # an editor's save: a new file at the path
    assert _sessions_on_disk(svc) == []
    svc.tick()
    assert _sessions_on_disk(svc) == [1]


def test_one_parser_reads_a_threads_schedstat_for_the_kernel_part_and_the_accept_loop():
    from pipexctl.offload.service import schedstat_ns

    assert schedstat_ns(b"123 456 7\n") == (123, 456)
    for bad in (b"", b"1", b"a b 3"):
        assert schedstat_ns(bad) is None, bad
