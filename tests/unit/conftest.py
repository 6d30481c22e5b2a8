"""What the unit test modules share.

The unit tests' daemon: an OffloadServer on the null kernel backend and
the null data path (no kernel here), with three calls known to discovery.
``srv`` is a fixture for every module here; ``call``, ``offload`` and
``serving`` are imported (``from .conftest import ...``), as tests/kernel
does with its own.

Also: ``run``, the CLI through click's CliRunner on a NullBackend, and
``notify_socket``, a datagram socket named by NOTIFY_SOCKET (fixtures);
``DATA``, the recorded xl2tpd logs (tests/unit/data/); ``brief``, an event
in a comparable tuple; ``model``, a Discovery's calls and tunnels without
their times; ``readable``, whether a select would wake (imported)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipexctl.cli import AppContext, cli
from pipexctl.discovery.discovery import Discovery
from pipexctl.discovery.state import CallInfo
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.server import OffloadServer

DATA = Path(__file__).parent / "data"


def call(cid, tid=100, peer="192.0.2.7"):
    return CallInfo(instance="xl2tpd", role="lns", peer=peer, peer_port=1701, tunnel_id=tid, peer_tunnel_id=200,
                    call_id=cid, peer_call_id=cid + 1000, pppd_pid=4242, data_path="kernel")


@pytest.fixture
def srv(tmp_path):
    d = Discovery([], proc=False, kernel=False)
    s = OffloadServer(str(tmp_path / "serve.sock"), d, NullBackend(), NullDataPath())
    s.channels = []
    for c in (call(1), call(2), call(3, tid=101, peer="192.0.2.8")):
        d.tracker.inst("xl2tpd").calls[c.ref()] = c
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


@pytest.fixture
def run():
    backend = NullBackend()

    def invoke(*args):
        return CliRunner().invoke(cli, list(args), obj=AppContext(lambda: backend))

    invoke.backend = backend
    return invoke


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield s
    s.close()


def brief(e):
    o = getattr(e, "call", None) or e.tunnel
    if hasattr(o, "call_id"):
        return (e.event, o.tunnel_id, o.call_id, o.peer_call_id, o.pppd_pid, o.data_path)
    return (e.event, o.tunnel_id, o.peer_tunnel_id, o.role)


def model(d: Discovery) -> list:
    return sorted(([x.dump(exclude={"since"}) for x in d.tracker.calls()],
                   [x.dump(exclude={"since"}) for x in d.tracker.tunnels()]), key=str)


def readable(obj) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(obj, selectors.EVENT_READ)
        return bool(sel.select(0))
