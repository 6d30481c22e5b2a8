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

from pipexctl.discovery.discovery import Discovery
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload.client import ask
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.server import OffloadServer


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
