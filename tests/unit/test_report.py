"""What the offload service reports (report.py): for ``status``, every
call, its data path and why it was not offloaded, through `pipexctl status`;
for ``metrics`` (--metrics and `stat --serve`), what the daemon owns and
why it refused, the per-session series capped and the rest summed.  Their
Prometheus text and HTTP endpoint are test_metrics.py's."""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner

from pipexctl import errors
from pipexctl.cli import cli

from .conftest import call, offload, serving


def test_status_names_every_call_its_path_and_why_one_stayed_on_the_pty(srv, tmp_path):
    offload(srv, call(1))
    srv.service.refused("no_call", 5151)
    c3 = srv.watch.discovery.tracker.inst("xl2tpd").calls["192.0.2.8", 3]
    c3.pppd_pid, c3.data_path = 5151, "userspace"
    with serving(srv):
        r = CliRunner().invoke(cli, ["status", "--socket", srv.socket_path, "--json"])
        assert r.exit_code == 0, r.output
        calls = {c["call_id"]: c for c in json.loads(r.output)["calls"]}
        assert calls[1]["path"] == "offloaded" and calls[2]["path"] == "xl2tpd kernel mode"
        assert calls[3]["path"] == "pty" and calls[3]["why_not"] == "no_call"
        r = CliRunner().invoke(cli, ["status", "--socket", srv.socket_path])
        assert r.exit_code == 0 and "offloads: 1 made" in r.output
        assert "WHY-NOT" in r.output and "no_call" in r.output
        assert "log trust" not in r.output  # nothing doubtful: no line
        srv.watch.unbarriered, srv.watch.discovery.tracker.disputes = 2, 1
        r = CliRunner().invoke(cli, ["status", "--socket", srv.socket_path])
        assert ("log trust: 2 call(s) read from a log without the daemon's barrier line; "
                "1 call(s) named by two log lines (one forged)") in r.output, r.output


@pytest.mark.parametrize("batch", [1, 2, 256])
def test_the_status_encoded_a_row_at_a_time_is_every_call_and_tunnel_in_order(srv, monkeypatch, batch):
    """The status op's reply is encoded in batches of rows (report.BATCH),
    each under its lock: whatever the batch, it is one JSON object with
    every call once, ordered by instance, tunnel and call, each with its
    path, and every tunnel with its sessions; an empty list stays a list."""
    from pipexctl.offload import report
    from pipexctl.offload.protocol import ok_reply

    monkeypatch.setattr(report, "BATCH", batch)
    empty = json.loads(b"".join(ok_reply(srv.service.status_chunks())))
    assert empty["ok"] is True and empty["tunnels"] == [] and list(empty)[:3] == ["ok", "instances", "calls"]
    offload(srv, call(2))
    offload(srv, call(3, tid=101, peer="192.0.2.8"))
    tracker = srv.watch.discovery.tracker
    for cid in (9, 5):  # more rows than a batch, put in out of order
        c = call(cid, tid=102, peer="192.0.2.9")
        tracker.inst("xl2tpd").calls[c.ref()] = c
    tracker.inst("other").calls[call(4).ref()] = call(4).copy(instance="other")
    st = json.loads(b"".join(ok_reply(srv.service.status_chunks())))
    assert [(c["instance"], c["tunnel_id"], c["call_id"]) for c in st["calls"]] == [
        ("other", 100, 4), ("xl2tpd", 100, 1), ("xl2tpd", 100, 2), ("xl2tpd", 101, 3), ("xl2tpd", 102, 5),
        ("xl2tpd", 102, 9)]
    assert [c["path"] for c in st["calls"]] == ["xl2tpd kernel mode", "xl2tpd kernel mode", "offloaded",
                                                "offloaded", "xl2tpd kernel mode", "xl2tpd kernel mode"]
    assert [(t["tunnel_id"], t["sessions"], t["pppd_pids"]) for t in st["tunnels"]] == [
        (100, [2], {"2": 4242}), (101, [3], {"3": 4242})]
    assert st == {"ok": True, **srv.service.status()} and st["stats"]["offloaded"] == 2


def test_the_status_is_handed_on_piece_by_piece_with_no_lock_held(srv, monkeypatch):
    """The status op sends each piece as it comes: while the reader holds
    one (a slow client), another thread takes the service's and the
    watcher's locks at once, so no offload waits for the client."""
    from pipexctl.offload import report

    monkeypatch.setattr(report, "BATCH", 1)
    offload(srv, call(2))
    offload(srv, call(3, tid=101, peer="192.0.2.8"))

    def both_free() -> bool:
        got = []

        def probe() -> None:
            for lock in (srv.service.lock, srv.watch.lock):
                if lock.acquire(timeout=0):
                    lock.release()
                    got.append(lock)

        t = threading.Thread(target=probe)
        t.start()
        t.join()
        return len(got) == 2

    pieces = []
    for piece in srv.service.status_chunks():
        assert both_free(), f"a lock is held while piece {len(pieces)} is with its reader"
        pieces.append(piece)
    assert len(pieces) >= 8  # a piece per row, BATCH being 1
    assert json.loads(b"".join(pieces)) == srv.service.status()


def test_a_status_that_fails_once_sent_in_part_is_cut_short_not_refused(srv, monkeypatch, caplog):
    """A row that raises after pieces went out: the reply ends there and
    the daemon logs why.  A refusal glued to half an object would make the
    whole answer unreadable; before any piece, the op is refused as any."""
    import socket

    from pipexctl.offload import report, server

    monkeypatch.setattr(report, "BATCH", 1)
    monkeypatch.setattr(server, "STATUS_SEND", 1)  # each piece sent as it comes
    offload(srv, call(2))
    real, rows = report._call_row, []

    def failing(svc, c):
        rows.append(c)
        if len(rows) == 2:
            raise KeyError("a bug")
        return real(svc, c)

    monkeypatch.setattr(report, "_call_row", failing)
    with serving(srv):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(srv.socket_path)
            s.sendall(b'{"op": "status"}\n')
            got = b""
            while chunk := s.recv(65536):
                got += chunk
    assert got.startswith(b'{"ok": true, "instances": ') and b'"ok": false' not in got
    assert "status reply cut short" in caplog.text


def test_a_small_status_comes_in_one_read(srv, monkeypatch):
    """The pieces go out 64 KiB at a time: a small status is one send, as a
    whole reply was, and a client that reads it with a single recv (the
    kernel tests' own) gets all of it; a large one comes whole over reads."""
    import socket

    from pipexctl.offload import report, server

    monkeypatch.setattr(report, "BATCH", 1)
    offload(srv, call(2))

    def ask(reads: int) -> bytes:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(srv.socket_path)
            s.sendall(b'{"op": "status"}\n')
            got = b""
            for _ in range(reads):
                got += s.recv(1 << 20)
                if got.endswith(b"\n"):
                    break
            return got

    with serving(srv):
        assert json.loads(ask(1))["ok"] is True
        monkeypatch.setattr(server, "STATUS_SEND", 100)
        assert json.loads(ask(1000)) == {"ok": True, **srv.service.status()}


def test_an_ok_reply_around_encoded_fields_is_the_reply_of_those_fields():
    from pipexctl.offload.protocol import ok_reply, reply

    def line(*pieces: bytes) -> bytes:
        return b"".join(ok_reply(pieces))

    assert line(b'{"a": [1, {"b": 2}]}') == reply(True, a=[1, {"b": 2}])
    assert line(b'{"a": [1, ', b'{"b": 2}', b"]}") == reply(True, a=[1, {"b": 2}])
    assert line(b"{}") == reply(True)
    for bad in ((b"[1]",), ()):
        with pytest.raises(ValueError):
            line(*bad)


def test_status_and_discover_say_since_when_each_call_is_on_its_path(srv, tmp_path):
    """An offloaded call: since its offload.  A call whose path changed while
    the daemon watched (moved back to its pty): since that change.  Others:
    nothing.  `pipexctl discover` takes these from the daemon when it
    answers on --socket, and shows none without one."""
    import time

    t = time.time()
    offload(srv, call(1))
    tracker = srv.watch.discovery.tracker
    c3 = tracker.inst("xl2tpd").calls["192.0.2.8", 3]
    c3.pppd_pid = 5151
    tracker.observe_data_path("xl2tpd", c3.ref(), "userspace")  # kernel -> pty: a move back
    log = tmp_path / "xl2tpd.log"
    log.write_text("xl2tpd[100]: Connection established to 192.0.2.7, 1701.  Local: 100, Remote: 200 (ref=0/0).  "
                   "LNS session is 'default'\nxl2tpd[100]: Call established with 192.0.2.7, PID: 4242, Local: 1, "
                   "Remote: 1001, Serial: 1\n")
    with serving(srv):
        r = CliRunner().invoke(cli, ["status", "--socket", srv.socket_path, "--json"])
        calls = {c["call_id"]: c for c in json.loads(r.output)["calls"]}
        assert t - 1 <= calls[1]["since"] <= time.time() + 1 and calls[1]["moved"] is False
        assert t - 1 <= calls[3]["since"] <= time.time() + 1 and "moved" not in calls[3]
        assert "since" not in calls[2]
        args = ["discover", "--no-proc", "--no-kernel", "--log", str(log)]
        r = CliRunner().invoke(cli, [*args, "--socket", srv.socket_path, "--json"])
        assert r.exit_code == 0, r.output
        (dc,) = json.loads(r.output)["calls"]
        assert dc["path_changed"] == calls[1]["since"]
        r = CliRunner().invoke(cli, [*args, "--socket", srv.socket_path])
        assert "PATH-SINCE" in r.output and time.strftime("%Y-%m-%d", time.localtime(t)) in r.output
    r = CliRunner().invoke(cli, [*args, "--socket", str(tmp_path / "none.sock"), "--json"])  # no daemon: no error
    assert r.exit_code == 0 and json.loads(r.output)["calls"][0]["path_changed"] is None, r.output


def test_metrics_counts_what_the_daemon_owns_and_why_it_refused(srv):
    for c in (call(1), call(2), call(3, tid=101, peer="192.0.2.8")):
        offload(srv, c)
    with pytest.raises(errors.ConflictError):
        srv.service.offload(call(1), 4242)
    srv.service.stats["failed"] += 1
    srv.service.reasons[("failed", "conflict")] += 1
    srv.service.refused("no_call")
    srv.service.refused("no_call")
    srv.service.refused("not_root")
    m = srv.service.metrics()
    assert m["offloaded_tunnels"] == 2 and m["offloaded_sessions"] == 3
    assert m["offload"] == {"offloaded": 3, "moved": 0, "removed": 0, "refused": {"no_call": 2, "not_root": 1},
                            "failed": {"conflict": 1}}
    assert m["calls"] == [{"role": "lns", "data_path": "kernel", "count": 3}]
    assert [(s["tunnel_id"], s["session_id"], s["peer"]) for s in m["sessions"]] == \
        [(100, 1, "192.0.2.7"), (100, 2, "192.0.2.7"), (101, 3, "192.0.2.8")]
    assert m["sessions_not_listed"]["count"] == 0 and m["kernel_error"] is None


def test_per_session_series_are_capped_and_the_rest_summed(srv):
    for c in (call(1), call(2), call(3, tid=101, peer="192.0.2.8")):
        offload(srv, c)
    srv.service.backend.session_get(100, 2).stats.rx_bytes = 500
    srv.service.backend.session_get(101, 3).stats.rx_bytes = 70
    srv.service.max_session_series = 1
    m = srv.service.metrics()
    assert [s["session_id"] for s in m["sessions"]] == [1]
    assert m["sessions_not_listed"]["count"] == 2 and m["sessions_not_listed"]["rx_bytes"] == 570


@pytest.mark.parametrize("keep", [0, 1, 3, 50, 64, 100])
def test_the_fold_keeps_the_lowest_sessions_and_sums_the_rest_as_a_sort_would(keep):
    """A scrape folds the sessions as the dump hands them over (in no
    order): what it lists and sums is what sorting all of them gives."""
    import random

    from pipexctl.model import SessionCounters
    from pipexctl.offload.report import COUNTER_FIELDS, SessionFold

    rnd = random.Random(keep)
    ids = rnd.sample([(t, s) for t in range(1, 9) for s in range(1, 20)], 64)
    n = len(SessionCounters._fields) - 2
    sessions = [SessionCounters(t, s, *(rnd.randrange(10**12) for _ in range(n))) for t, s in ids]
    fold = SessionFold(keep)
    for c in sessions:
        fold.add(c, f"peer-{c.tunnel_id}")
    ordered = sorted(sessions)
    assert fold.listed() == [(c, f"peer-{c.tunnel_id}") for c in ordered[:keep]]
    assert fold.rest == len(ordered[keep:])
    assert fold.rest_sums == [sum(getattr(c, f) for c in ordered[keep:]) for f in COUNTER_FIELDS]


def test_a_session_the_daemon_does_not_own_is_neither_listed_nor_summed(srv):
    """The kernel's other sessions (xl2tpd's kernel-mode calls, another
    daemon's) are no series of ours."""
    from pipexctl.model import PwType, SessionSpec, TunnelSpec

    offload(srv, call(1))
    b = srv.service.backend
    b.tunnel_create(TunnelSpec(tunnel_id=555, peer_tunnel_id=9, version=2, fd=0))
    b.session_create(SessionSpec(tunnel_id=555, session_id=1, peer_session_id=2, version=2, pw_type=PwType.ppp))
    b.session_create(SessionSpec(tunnel_id=100, session_id=77, peer_session_id=2, version=2, pw_type=PwType.ppp))
    b.session_get(555, 1).stats.rx_bytes = 9
    srv.service.max_session_series = 0
    m = srv.service.metrics()
    assert m["sessions"] == [] and m["sessions_not_listed"]["count"] == 1
    assert m["sessions_not_listed"]["rx_bytes"] == 0


def test_a_dump_cut_short_gives_its_error_and_no_part_of_the_series(srv):
    """The kernel's dump failing half way (ENOBUFS, say) is the snapshot's
    error; the sessions it handed over before are neither listed nor
    summed, so no scrape shows a part of the counters as if whole."""
    from pipexctl import errors as errs

    for c in (call(1), call(2)):
        offload(srv, c)
    b = srv.service.backend
    real = b.session_counters

    def cut_short(each=None):
        if each is None:
            return real()
        real(each)  # every session handed over, then the dump fails
        raise errs.KernelError("cannot dump sessions: netlink socket: No buffer space available")

    b.session_counters = cut_short
    srv.service.max_session_series = 1
    m = srv.service.metrics()
    assert m["kernel_error"] and m["sessions"] == [] and m["sessions_not_listed"]["count"] == 0
    assert m["offloaded_sessions"] == 2
