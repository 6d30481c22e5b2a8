from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from pipexctl.kernel import uapi
from pipexctl.model import Encap, Endpoint, PwType, SessionSpec, TunnelSpec
from pipexctl.records import Invalid


def tspec(**kw):
    base = dict(tunnel_id=1, peer_tunnel_id=2, version=3, local=Endpoint.parse("10.0.0.1:1"),
                remote=Endpoint.parse("10.0.0.2:2"))
    base.update(kw)
    return TunnelSpec(**base)


@given(st.integers(min_value=-(2**40), max_value=2**40), st.sampled_from([2, 3]))
def test_tunnel_id_ranges(tid, version):
    ok = 1 <= tid <= (0xFFFF if version == 2 else 0xFFFFFFFF)
    if ok:
        assert tspec(tunnel_id=tid, version=version).tunnel_id == tid
    else:
        with pytest.raises(Invalid, match=f"tunnel id {tid} out of range for L2TPv{version}"):
            tspec(tunnel_id=tid, version=version)


@given(st.integers(min_value=0, max_value=2**33), st.sampled_from([2, 3]))
def test_session_id_ranges(sid, version):
    ok = 1 <= sid <= (0xFFFF if version == 2 else 0xFFFFFFFF)
    pw = PwType.ppp if version == 2 else PwType.eth
    mk = lambda: SessionSpec(tunnel_id=1, session_id=sid, peer_session_id=1, version=version, pw_type=pw)  # noqa: E731
    if ok:
        assert mk().session_id == sid
    else:
        with pytest.raises(Invalid, match="session id"):
            mk()


@pytest.mark.parametrize("text,addr,port", [
    ("10.0.0.1", "10.0.0.1", 0),
    ("10.0.0.1:1701", "10.0.0.1", 1701),
    ("[2001:db8::1]:1701", "2001:db8::1", 1701),
    ("2001:db8::1", "2001:db8::1", 0),
    ("[fe80::1]", "fe80::1", 0),
])
def test_endpoint_parse(text, addr, port):
    e = Endpoint.parse(text)
    assert str(e.address) == addr and e.port == port


@pytest.mark.parametrize("text", ["10.0.0.1:70000", "host:1701", "[2001:db8::1", "10.0.0.1:x", ""])
def test_endpoint_parse_rejects(text):
    with pytest.raises(ValueError):
        Endpoint.parse(text)


def test_version_rules():
    with pytest.raises(Invalid, match="L2TPv2 runs over UDP only"):
        tspec(version=2, encap=Encap.ip)
    with pytest.raises(Invalid, match="version must be 2 or 3"):
        tspec(version=4)
    with pytest.raises(Invalid, match="L2TPv2 carries PPP only"):
        SessionSpec(tunnel_id=1, session_id=1, peer_session_id=1, version=2, pw_type=PwType.eth)
    with pytest.raises(Invalid, match="cookies are an L2TPv3 feature"):
        SessionSpec(tunnel_id=1, session_id=1, peer_session_id=1, version=2, pw_type=PwType.ppp, cookie="01020304")


def test_unmanaged_tunnel_needs_addresses_and_ports():
    with pytest.raises(Invalid, match="needs both local and remote"):
        TunnelSpec(tunnel_id=1, peer_tunnel_id=2)
    with pytest.raises(Invalid, match="needs local and remote ports"):
        tspec(local=Endpoint.parse("10.0.0.1"))
    with pytest.raises(Invalid, match="same family"):
        tspec(remote=Endpoint.parse("[::1]:5"))
    assert tspec(encap=Encap.ip, local=Endpoint.parse("10.0.0.1"), remote=Endpoint.parse("10.0.0.2")).encap is Encap.ip
    # managed: the socket has the addresses
    assert TunnelSpec(tunnel_id=1, peer_tunnel_id=2, version=2, fd=5).fd == 5


@pytest.mark.parametrize("name,ok", [("pw0", True), ("x" * 15, True), ("x" * 16, False), ("a/b", False),
                                     ("a b", False), ("", False), ("..", False)])
def test_ifname(name, ok):
    mk = lambda: SessionSpec(tunnel_id=1, session_id=1, peer_session_id=1, ifname=name)  # noqa: E731
    if ok:
        assert mk().ifname == name
    else:
        with pytest.raises(Invalid):
            mk()


def test_cookie():
    s = SessionSpec(tunnel_id=1, session_id=1, peer_session_id=1, cookie="0102030405060708", peer_cookie=b"abcd")
    assert s.cookie == bytes(range(1, 9)) and s.peer_cookie == b"abcd"
    for bad in ("010203", "zz" * 4, b"123456"):
        with pytest.raises(Invalid):
            SessionSpec(tunnel_id=1, session_id=1, peer_session_id=1, cookie=bad)


def test_ppp_session_has_no_ifname():
    with pytest.raises(Invalid, match="PPP sessions have no interface"):
        SessionSpec(tunnel_id=1, session_id=1, peer_session_id=1, version=2, pw_type=PwType.ppp, ifname="ppp0")


def test_pwtype_kernel_values_roundtrip():
    for pw in PwType:
        assert PwType.from_kernel(pw.kernel) is pw
    assert PwType.eth.kernel == uapi.L2TP_PWTYPE_ETH and PwType.ppp.kernel == uapi.L2TP_PWTYPE_PPP
    assert Encap.from_kernel(uapi.L2TP_ENCAPTYPE_IP) is Encap.ip
