"""All-or-nothing semantics of multi-step operations (NullBackend)."""

from __future__ import annotations

import errno

import pytest

from pipexctl import errors
from pipexctl.kernel.backend import NullBackend
from pipexctl.model import Endpoint, PwType, SessionSpec, TunnelSpec
from pipexctl.orchestrator import Orchestrator

T = TunnelSpec(tunnel_id=1, peer_tunnel_id=2, version=2, local=Endpoint.parse("10.0.0.1:1701"),
               remote=Endpoint.parse("10.0.0.2:1701"))
S = SessionSpec(tunnel_id=1, session_id=3, peer_session_id=4, version=2, pw_type=PwType.ppp)


def test_session_failure_removes_the_tunnel_it_created():
    b = NullBackend(fail_on={"session_create": errno.ENOMEM})
    with pytest.raises(errors.KernelError, match="ENOMEM"):
        Orchestrator(b).add_session(S, T)
    assert b.tunnel_dump() == [] and b.calls == ["tunnel_create", "session_create", "tunnel_delete"]


def test_session_failure_keeps_an_existing_tunnel():
    b = NullBackend()
    o = Orchestrator(b)
    o.add_tunnel(T)
    b.fail_on["session_create"] = errno.EEXIST
    with pytest.raises(errors.AlreadyExistsError):
        o.add_session(S, T)
    assert [t.tunnel_id for t in b.tunnel_dump()] == [1]


def test_handoff_failure_removes_session_and_tunnel():
    b = NullBackend()

    def broken(channel, meta):
        raise errors.SocketError("cannot hand the PPPoL2TP fd to /x: Connection refused")

    with pytest.raises(errors.SocketError):
        Orchestrator(b).add_session(S, T, connect_ppp=True, hand_off=broken)
    assert b.session_dump() == [] and b.tunnel_dump() == []


def test_handoff_gets_meta_and_channel():
    b = NullBackend()
    seen = {}
    r = Orchestrator(b).add_session(S, T, connect_ppp=True, hand_off=lambda ch, meta: seen.update(meta))
    assert seen == {"tunnel_id": 1, "peer_tunnel_id": 2, "session_id": 3, "peer_session_id": 4, "version": 2,
                    "channel": r.channel}
    # our copy of the socket is closed; in the NullBackend (as in the kernel) that
    # drops the session when nobody else holds it
    assert b.session_dump() == []


def test_keyboard_interrupt_mid_way_still_rolls_back():
    b = NullBackend()

    def interrupted(channel, meta):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Orchestrator(b).add_session(S, T, connect_ppp=True, hand_off=interrupted)
    assert b.tunnel_dump() == []


def test_ids_are_revalidated_for_the_real_tunnel_version():
    b = NullBackend()
    o = Orchestrator(b)
    o.add_tunnel(T)  # an L2TPv2 tunnel
    big = SessionSpec(tunnel_id=1, session_id=70000, peer_session_id=4, version=3, pw_type=PwType.ppp)
    with pytest.raises(errors.InvalidArgumentError, match="session id 70000 out of range for L2TPv2"):
        o.add_session(big)
    assert b.session_dump() == []


def test_delete_session_tunnel_too_only_when_empty():
    b = NullBackend()
    o = Orchestrator(b)
    o.add_session(S, T)
    o.add_session(SessionSpec(tunnel_id=1, session_id=5, peer_session_id=6, version=2, pw_type=PwType.ppp))
    assert o.delete_session(1, 3, tunnel_too=True) is False
    assert o.delete_session(1, 5, tunnel_too=True) is True
    assert b.tunnel_dump() == []
