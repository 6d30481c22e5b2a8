"""The daemon's serving loop (offload/server.py), on the null kernel backend
and the null data path: it stops at once though nothing polls; started by
systemd's socket activation, it serves the requests made before it ran,
says READY, RELOADING and STOPPING, and leaves the socket to systemd."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from pipexctl.discovery.discovery import Discovery
from pipexctl.errors import SocketError
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload.client import ask
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.server import OffloadServer

from .conftest import serving


def test_the_daemon_stops_at_once_though_nothing_polls(tmp_path):
    d = Discovery([], proc=False, kernel=False)
    s = OffloadServer(str(tmp_path / "s.sock"), d, NullBackend(), NullDataPath())
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    try:
        end = time.monotonic() + 20
        while not os.path.exists(s.socket_path) and time.monotonic() < end:
            time.sleep(0.02)
        time.sleep(0.3)
        t0 = time.monotonic()
        s.stop.set()
        t.join(10)
        assert not t.is_alive() and time.monotonic() - t0 < 5
        assert not os.path.exists(s.socket_path)
    finally:
        s.stop.set()
        d.close()


def test_a_start_removes_the_reply_directories_a_killed_daemon_left(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(run))
    (run / "pipexctl-ctl-4194305-x").mkdir(mode=0o700)  # a pid above any pid_max: gone
    d = Discovery([], proc=False, kernel=False)
    try:
        with serving(OffloadServer(str(run / "s.sock"), d, NullBackend(), NullDataPath())):  # up: it accepts
            assert not any(n.startswith("pipexctl-ctl-") for n in os.listdir(run)) and "s.sock" in os.listdir(run)
    finally:
        d.close()


def messages(s, until: str) -> list[str]:
    got = []
    while not any(until in m for m in got):
        got.append(s.recv(4096).decode())
    return got


def test_a_socket_activated_daemon_says_ready_and_leaves_the_socket_to_systemd(tmp_path, notify_socket):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    path = str(d / "serve.sock")
    lst = socket.socket(socket.AF_UNIX)
    lst.bind(path)
    lst.listen(8)
    # a pppd that asks before the daemon runs waits in the backlog
    early = socket.socket(socket.AF_UNIX)
    early.connect(path)
    srv = OffloadServer(str(tmp_path / "ignored.sock"), Discovery([], proc=False, kernel=False), NullBackend(),
                        NullDataPath(), state_path=str(d / "state.json"))
    srv.activated = lst
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    got = messages(notify_socket, "READY=1")
    assert "STATUS=serving; 0 call(s) offloaded in 0 tunnel(s), 0 refused, 0 failed" in got[-1]
    early.sendall(b'{"op": "status"}\n')
    assert json.loads(early.makefile().readline())["ok"]  # the request made before the daemon ran
    assert srv.socket_path == path and ask(path)["ok"]
    srv.reload.set()
    got = messages(notify_socket, "READY=1")
    assert any("RELOADING=1" in m for m in got)
    srv.stop.set()
    t.join(30)
    assert "STOPPING=1" in notify_socket.recv(100).decode()
    assert os.path.exists(path)  # systemd's socket: it stays for the next start
    early.close()


def _move_server(tmp_path, monkeypatch):
    """A daemon that takes this test process for xl2tpd's pppd of call 1 (the
    requester's proof and discovery's answer stood in for: what is tested is
    the move's exchange on the socket)."""
    import pipexctl.offload.server as server_mod
    from pipexctl.discovery.state import CallInfo

    d = Discovery([], proc=False, kernel=False)
    srv = OffloadServer(str(tmp_path / "serve.sock"), d, NullBackend(), NullDataPath())
    c = CallInfo(instance="xl2tpd", role="lns", peer="192.0.2.7", peer_port=1701, tunnel_id=100, peer_tunnel_id=200,
                 call_id=1, peer_call_id=1001, pppd_pid=os.getpid(), data_path="userspace")
    monkeypatch.setattr(server_mod, "prove_requester", lambda pid: (1, ""))
    monkeypatch.setattr(srv.watch, "call_of", lambda pid, wait, xl2tpd_pid=None, timing=None: (c, ""))
    monkeypatch.setattr(server_mod, "ACK_TIMEOUT", 1.0)
    # the null backend's channel has no fd to send: /dev/null stands in for the PPPoL2TP socket
    import pipexctl.kernel.backend as backend_mod
    nul = os.open("/dev/null", os.O_RDONLY)
    monkeypatch.setattr(backend_mod._NullChannel, "fileno", lambda self: nul)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    for _ in range(200):
        if os.path.exists(srv.socket_path):
            break
        time.sleep(0.02)
    return srv, t


def _ask_move(path, unit=None):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    if unit is None:
        s.sendall(b'{"op": "move", "v": 3, "pid": %d}\n' % os.getpid())
    else:
        s.sendall(b'{"op": "move", "v": 4, "pid": %d, "unit": %d}\n' % (os.getpid(), unit))
    data, fds, _, _ = socket.recv_fds(s, 4096, 2)
    for fd in fds:
        os.close(fd)
    return s, json.loads(data)


def test_a_move_is_committed_after_the_plugins_ack_and_only_then(tmp_path, monkeypatch):
    srv, t = _move_server(tmp_path, monkeypatch)
    try:
        s, rep = _ask_move(srv.socket_path)
        assert rep["ok"] and rep["session_id"] == 1 and rep["peer_session_id"] == 1001
        s.sendall(b'{"op": "ack"}\n')
        assert json.loads(s.makefile().readline()) == {"ok": True, "committed": True}
        s.close()
        for _ in range(200):  # counted by the request's thread after the commit line
            if srv.service.stats["moved"]:
                break
            time.sleep(0.02)
        assert srv.service.stats["moved"] == 1 and srv.service.stats["offloaded"] == 1
        assert 1 in srv.service.tunnels[("xl2tpd", 100)].records
        # no ack (the plugin gave up): undone, and no commit line is ever sent
        srv.service.tunnels[("xl2tpd", 100)].records.pop(1)
        s, rep = _ask_move(srv.socket_path)
        assert rep["ok"]
        # after the ack timeout: the offload's failure, never "committed"
        assert json.loads(s.makefile().readline())["ok"] is False
        s.close()
        assert srv.service.stats["moved"] == 1 and 1 not in srv.service.tunnels[("xl2tpd", 100)].records
        assert (100, 1) not in [(k.tunnel_id, k.session_id) for k in srv.service.backend.session_dump()]
    finally:
        srv.stop.set()
        t.join(10)


def test_a_move_that_names_its_unit_gets_a_channel_under_that_unit_or_nothing(tmp_path, monkeypatch):
    """Protocol 4: the daemon puts the new channel under the asking pppd's
    ppp unit before it replies, and says so; a unit the kernel refuses
    fails the move with the reason, leaving no session or record."""
    import errno

    srv, t = _move_server(tmp_path, monkeypatch)
    backend = srv.service.backend
    try:
        s, rep = _ask_move(srv.socket_path)  # a v3 plugin: no unit, nothing joined
        assert rep["ok"] and "unit" not in rep and "ppp_join" not in backend.calls
        s.close()  # no ack: undone
        for _ in range(200):
            if backend.session_dump() == []:
                break
            time.sleep(0.02)
        backend.fail_on["ppp_join"] = errno.ENXIO
        s, rep = _ask_move(srv.socket_path, unit=7)
        s.close()
        assert rep["ok"] is False and "ppp unit 7" in rep["error"], rep
        assert backend.session_dump() == [] and not any(ts.records for ts in srv.service.tunnels.values())
        del backend.fail_on["ppp_join"]
        s, rep = _ask_move(srv.socket_path, unit=7)
        assert rep["ok"] and rep["unit"] == 7 and rep["v"] == 4 and backend.calls.count("ppp_join") == 2
        s.sendall(b'{"op": "ack"}\n')
        assert json.loads(s.makefile().readline()) == {"ok": True, "committed": True}
        s.close()
    finally:
        srv.stop.set()
        t.join(10)


def test_an_operators_undo_goes_over_the_plugins_link_and_ends_the_record(tmp_path, monkeypatch):
    """The daemon keeps a plugin's control link; `pipexctl offload move
    --undo` writes "undo" on it, and the plugin's "undone" ends the record and
    the tunnel left without calls.  A link whose plugin went away is pruned."""
    from pipexctl.offload.client import ask

    srv, t = _move_server(tmp_path, monkeypatch)
    try:
        s, rep = _ask_move(srv.socket_path)
        s.sendall(b'{"op": "ack"}\n')
        assert json.loads(s.makefile().readline())["committed"]
        s.close()
        for _ in range(200):
            if srv.service.stats["moved"]:
                break
            time.sleep(0.02)
        link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        link.settimeout(10)
        link.connect(srv.socket_path)
        link.sendall(b'{"op": "link", "v": 3, "pid": %d}\n' % os.getpid())
        lines = link.makefile("rb")
        assert json.loads(lines.readline()) == {"ok": True}
        with pytest.raises(SocketError, match="call 9 in any tunnel: no such call in the kernel"):
            ask(srv.socket_path, {"op": "path", "to": "pty", "call": 9})
        got = {}
        asker = threading.Thread(target=lambda: got.update(
            ask(srv.socket_path, {"op": "path", "to": "pty", "call": 1}, timeout=20)))
        asker.start()
        assert json.loads(lines.readline()) == {"op": "undo"}  # what the plugin reads at its tick
        link.sendall(b'{"op": "undone"}\n')
        asker.join(20)
        assert got["moved"] == ["100/1"] and got["failed"] == {}, got
        assert ("xl2tpd", 100) not in srv.service.tunnels  # its only call went back: xl2tpd's socket again
        assert len(srv.links) == 1
        lines.close()  # the file object holds the socket's fd too
        link.close()
        for _ in range(100):  # the peer's close reaches the poll at once; at most a moment
            if srv.links.prune() or not len(srv.links):
                break
            time.sleep(0.02)
        assert len(srv.links) == 0
    finally:
        srv.stop.set()
        t.join(10)


def test_links_are_pruned_when_their_plugin_goes_and_replaced_per_pid():
    from pipexctl.offload.links import Links

    links = Links()
    a, a_peer = socket.socketpair()
    b, b_peer = socket.socketpair()
    links.add(7, a)
    links.add(8, b)
    assert links.prune() == 0 and sorted(links.pids()) == [7, 8]
    c, c_peer = socket.socketpair()
    links.add(7, c)  # a new link of the same pppd replaces (and closes) the old
    assert a.fileno() == -1 and links.get(7) is c
    b_peer.close()
    assert links.prune() == 1 and links.pids() == [7]
    links.close()
    assert c.fileno() == -1 and len(links) == 0
    for x in (a_peer, c_peer):
        x.close()


def test_a_request_that_fails_with_any_error_is_answered_and_the_daemon_serves_on(tmp_path, monkeypatch, caplog):
    """Whatever a request's handling raises (a bug, or input nothing
    checked), its plugin gets a refusal at once instead of a closed socket
    after its timeout, the traceback goes to the log, and the next request
    is served."""
    srv, t = _move_server(tmp_path, monkeypatch)
    calls = []

    def fail_once(pid, wait, xl2tpd_pid=None, timing=None):
        calls.append(pid)
        if len(calls) == 1:
            raise RecursionError("maximum recursion depth exceeded")
        return real(pid, wait, xl2tpd_pid, timing)

    real = srv.watch.call_of
    monkeypatch.setattr(srv.watch, "call_of", fail_once)
    try:
        with caplog.at_level("ERROR", logger="pipexctl"):
            s, rep = _ask_move(srv.socket_path)
            s.close()
        assert rep["ok"] is False and "an error in pipexctl serve" in rep["error"]
        assert "RecursionError" in caplog.text
        s, rep = _ask_move(srv.socket_path)
        assert rep["ok"] and rep["session_id"] == 1
        s.close()
    finally:
        srv.stop.set()
        t.join(10)


def test_the_offloads_log_line_splits_the_hand_off_by_the_plugins_stamps(tmp_path, monkeypatch, caplog):
    """The C plugin's ack carries its CLOCK_MONOTONIC stamps; the daemon's
    log line then says how long the request took as pppd saw it, where
    the hand-off went, and what came before the daemon's own clock began.  An ack without stamps, or with stamps that do not
    fit between the reply and the ack, adds nothing (and is still an ack)."""
    import logging
    import re

    caplog.set_level(logging.INFO, logger="pipexctl.serve")
    srv, t = _move_server(tmp_path, monkeypatch)
    tail = re.compile(r"; as pppd saw it (\d+) ms \(ms: its wake for our reply (\d+), its checks (\d+), "
                      r"our read of its ack (\d+)(?:, its own wait for a CPU (\d+))?\)")
    before = re.compile(r"; before our clock (\d+) ms \(ms: until our accept (\d+), its thread (\d+), "
                        r"the request read (\d+), its pppd proven (\d+)\)")
    loop = re.compile(r"; our accept loop woke (\d+) ms after the ask, having waited (\d+) ms for a CPU$")

    def move(ack) -> str:
        caplog.clear()
        if ("xl2tpd", 100) in srv.service.tunnels:  # the call again (the tunnel kept)
            srv.service.tunnels[("xl2tpd", 100)].records.pop(1)
        asked = time.monotonic_ns()
        s, rep = _ask_move(srv.socket_path)
        assert rep["ok"], rep
        s.sendall(ack(asked, time.monotonic_ns()))
        assert json.loads(s.makefile().readline()) == {"ok": True, "committed": True}
        s.close()
        for _ in range(200):
            lines = [r.getMessage() for r in caplog.records if "moved from its pty" in r.getMessage()]
            if lines:
                return lines[0]
            time.sleep(0.02)
        raise AssertionError("no offload line logged")

    def stamped(asked, read):
        time.sleep(0.05)  # "its checks"
        return b'{"op": "ack", "asked_ns": %d, "read_ns": %d, "ack_ns": %d}\n' % (asked, read, time.monotonic_ns())

    try:
        line = move(stamped)
        m = tail.search(line)
        assert m, line
        assert m.group(5) is None  # no cpu_wait_ns in this ack
        waited, woke, checked, ack_read = map(int, m.groups()[:4])
        assert 50 <= checked < 1000 and waited >= woke and ack_read < 1000
        hand_off = int(re.search(r"hand-off (\d+)\)", line).group(1))
        assert hand_off + 2 >= woke + checked + ack_read  # parts of the hand-off (each rounded)
        # what came before the daemon's own clock: its four steps, and no more than pppd waited in all
        b = before.search(line)
        assert b, line
        pre = int(b.group(1))
        request = int(re.search(r"in (\d+) ms \(ms:", line).group(1))
        # pppd's wait = before our clock + our request - its checks - our read of its ack (each rounded)
        assert abs(waited - (pre + request - checked - ack_read)) <= 4, line
        # the accept loop's wake, within the wait until our accept, and its wait for a CPU (schedstat: 0 or more)
        lp = loop.search(line)
        assert lp and int(lp.group(1)) <= int(b.group(2)) + 1 and int(lp.group(2)) >= 0, line
        # pppd's own wait for a CPU (schedstat) within its ask: logged; one longer than the ask is not
        for over in (False, True):
            sent: list[int] = []

            def with_wait(asked: int, read: int) -> bytes:
                sent.append(read - asked + 1 if over else read - asked)
                return b'{"op": "ack", "asked_ns": %d, "read_ns": %d, "ack_ns": %d, "cpu_wait_ns": %d}\n' % (
                    asked, read, time.monotonic_ns(), sent[0])

            m = tail.search(move(with_wait))
            assert m and m.group(5) == (None if over else "%.0f" % (sent[0] / 1e6)), (over, sent, m and m.group(0))
        assert tail.search(move(lambda asked, read: b'{"op": "ack"}\n')) is None
        assert tail.search(move(lambda asked, read: b'{"op": "ack", "asked_ns": 1, "read_ns": 1, "ack_ns": 1}\n')) is None
        # an ask said to have begun after the daemon accepted it: no tail at all
        from pipexctl.offload.server import _as_pppd_saw

        seen = {"asked": 10, "waited": 5, "woke": 1, "checked": 1, "ack_read": 1}
        assert _as_pppd_saw(seen, {"accepted": 9}) == ""
        assert tail.search(_as_pppd_saw(seen, {"accepted": 11})) and not before.search(_as_pppd_saw(seen, {}))
        # a wake before the ask (the loop woke for something else), or no schedstat: no accept-loop tail
        steps = {"accepted": 11, "begun": 12, "read": 13, "proven": 14}
        assert loop.search(_as_pppd_saw(seen, {**steps, "woke": 10, "loop_cpu_wait": 0}))
        assert not loop.search(_as_pppd_saw(seen, {**steps, "woke": 9, "loop_cpu_wait": 0}))
        assert not loop.search(_as_pppd_saw(seen, {**steps, "woke": 10, "loop_cpu_wait": -1}))
        # a wait for a CPU longer than the span it is part of is not shown
        assert loop.search(_as_pppd_saw(seen, {**steps, "woke": 11, "loop_cpu_wait": 1}))
        assert not loop.search(_as_pppd_saw(seen, {**steps, "woke": 11, "loop_cpu_wait": 2}))
    finally:
        srv.stop.set()
        t.join(10)
