"""The unit tests' daemon: an OffloadServer on the null kernel backend and
the null data path (no kernel here), with three calls known to discovery.

``srv`` is a fixture for every module here; ``call``, ``offload`` and
``serving`` are imported (``from .conftest import ...``), as tests/kernel
does with its own."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from pipexctl.discovery.discovery import Discovery
from pipexctl.discovery.state import CallInfo
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.server import OffloadServer


def call(cid, tid=100, peer="192.0.2.7"):
    return CallInfo(instance="xl2tpd", role="lns", peer=peer, peer_port=1701, tunnel_id=tid, peer_tunnel_id=200,
                    call_id=cid, peer_call_id=cid + 1000, pppd_pid=4242, data_path="kernel")


@pytest.fixture
def srv(tmp_path):
    d = Discovery([], proc=False, kernel=False)
    s = OffloadServer(str(tmp_path / "serve.sock"), d, NullBackend(), NullDataPath())
    s.channels = []
    for c in (call(1), call(2), call(3, tid=101, peer="192.0.2.8")):
        d.tracker.inst("xl2tpd").calls[c.call_id] = c
    yield s
    for ts in s.service.tunnels.values():
        if ts.sock is not None:
            ts.sock.close()


@contextlib.contextmanager
def serving(srv):
    """``srv`` serving in a thread until the block ends."""
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        for _ in range(100):
            try:
                socket.socket(socket.AF_UNIX).connect(srv.socket_path)
                break
            except OSError:
                threading.Event().wait(0.05)
        yield srv
    finally:
        srv.stop.set()
        t.join(10)


def offload(s, c):
    ch, _ = s.service.offload(c, 4242)
    s.channels.append(ch)  # pppd's copy: closing it would end the session, as in the kernel
    s.service.stats["offloaded"] += 1
