"""Every request builder against an independent encoder (golden bytes),
and against pyroute2's codec.

The expected bytes are packed here with ``struct`` straight from the
attribute table of linux/l2tp.h, so a wrong attribute type, size, order or
padding in ``pipexctl.kernel.netlink`` fails; and pyroute2, which decodes
the kernel's answers, must read each request and write the same bytes back.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import struct

import pytest

from pipexctl.kernel import netlink as nl, uapi
from pipexctl.model import Encap, Endpoint, PwType, SessionSpec, TunnelSpec, session_key
from pipexctl.records import names

FAMILY, FLAGS, SEQ, PID = 0x1D, 0x5, 7, 4242


def attr(atype: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), atype) + payload
    return raw + b"\0" * ((4 - len(raw) % 4) % 4)


u8 = lambda v: struct.pack("=B", v)  # noqa: E731
u16 = lambda v: struct.pack("=H", v)  # noqa: E731
u32 = lambda v: struct.pack("=I", v)  # noqa: E731
u64 = lambda v: struct.pack("=Q", v)  # noqa: E731
ip4 = lambda s: ipaddress.IPv4Address(s).packed  # noqa: E731
ip6 = lambda s: ipaddress.IPv6Address(s).packed  # noqa: E731


def golden(cmd: int, *attrs: bytes) -> bytes:
    body = struct.pack("=BBH", cmd, uapi.L2TP_GENL_VERSION, 0) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), FAMILY, FLAGS, SEQ, PID) + body


def encoded(req) -> bytes:
    """The library's bytes for ``req``; also checked against pyroute2:
    its decoder reads them and its encoder writes the same bytes back."""
    raw = req.encode(FAMILY, FLAGS, SEQ, PID)
    m = nl.l2tpmsg(raw)
    m.decode()
    again = nl.l2tpmsg()
    again["cmd"], again["version"] = m["cmd"], m["version"]
    again["attrs"] = [[name, value] for name, value in m["attrs"]]
    again["header"].update(type=FAMILY, flags=FLAGS, sequence_number=SEQ, pid=PID)
    again.encode()
    assert bytes(again.data) == raw, "pyroute2 does not write back what it read"
    return raw


def answer(cmd: int, attrs) -> bytes:
    """A kernel answer as pyroute2 encodes it (nested stats included)."""
    m = nl.l2tpmsg()
    m["cmd"], m["version"] = cmd, uapi.L2TP_GENL_VERSION
    m["attrs"] = [[k, v] for k, v in attrs]
    m["header"]["type"] = 30
    m.encode()
    return bytes(m.data)


A = uapi


def test_tunnel_create_unmanaged_udp4():
    spec = TunnelSpec(tunnel_id=100, peer_tunnel_id=200, local=Endpoint.parse("10.98.0.1:5000"),
                      remote=Endpoint.parse("10.98.0.2:5001"), udp_csum=True)
    assert encoded(nl.build_tunnel_create(spec)) == golden(
        A.L2TP_CMD_TUNNEL_CREATE,
        attr(A.L2TP_ATTR_CONN_ID, u32(100)), attr(A.L2TP_ATTR_PEER_CONN_ID, u32(200)),
        attr(A.L2TP_ATTR_PROTO_VERSION, u8(3)), attr(A.L2TP_ATTR_ENCAP_TYPE, u16(A.L2TP_ENCAPTYPE_UDP)),
        attr(A.L2TP_ATTR_IP_SADDR, ip4("10.98.0.1")), attr(A.L2TP_ATTR_IP_DADDR, ip4("10.98.0.2")),
        attr(A.L2TP_ATTR_UDP_SPORT, u16(5000)), attr(A.L2TP_ATTR_UDP_DPORT, u16(5001)),
        attr(A.L2TP_ATTR_UDP_CSUM, u8(1)),
    )


def test_tunnel_create_unmanaged_udp6_zero_csum_flags_not_swapped():
    spec = TunnelSpec(tunnel_id=1, peer_tunnel_id=2, local=Endpoint.parse("[fd00::1]:1"),
                      remote=Endpoint.parse("[fd00::2]:2"), udp6_zero_csum_tx=True)
    assert encoded(nl.build_tunnel_create(spec)) == golden(
        A.L2TP_CMD_TUNNEL_CREATE,
        attr(A.L2TP_ATTR_CONN_ID, u32(1)), attr(A.L2TP_ATTR_PEER_CONN_ID, u32(2)),
        attr(A.L2TP_ATTR_PROTO_VERSION, u8(3)), attr(A.L2TP_ATTR_ENCAP_TYPE, u16(0)),
        attr(A.L2TP_ATTR_IP6_SADDR, ip6("fd00::1")), attr(A.L2TP_ATTR_IP6_DADDR, ip6("fd00::2")),
        attr(A.L2TP_ATTR_UDP_SPORT, u16(1)), attr(A.L2TP_ATTR_UDP_DPORT, u16(2)),
        attr(A.L2TP_ATTR_UDP_ZERO_CSUM6_TX, b""),
    )


def test_tunnel_create_ip_encap_has_no_ports():
    spec = TunnelSpec(tunnel_id=5, peer_tunnel_id=6, encap=Encap.ip, local=Endpoint.parse("10.0.0.1"),
                      remote=Endpoint.parse("10.0.0.2"))
    assert encoded(nl.build_tunnel_create(spec)) == golden(
        A.L2TP_CMD_TUNNEL_CREATE,
        attr(A.L2TP_ATTR_CONN_ID, u32(5)), attr(A.L2TP_ATTR_PEER_CONN_ID, u32(6)),
        attr(A.L2TP_ATTR_PROTO_VERSION, u8(3)), attr(A.L2TP_ATTR_ENCAP_TYPE, u16(A.L2TP_ENCAPTYPE_IP)),
        attr(A.L2TP_ATTR_IP_SADDR, ip4("10.0.0.1")), attr(A.L2TP_ATTR_IP_DADDR, ip4("10.0.0.2")),
    )


@pytest.mark.parametrize("fd", [0, 9])
def test_tunnel_create_managed_fd_without_addresses(fd):
    """pyroute2's L2tp drops fd 0 and demands addresses; we send FD alone."""
    spec = TunnelSpec(tunnel_id=11, peer_tunnel_id=22, version=2, fd=fd)
    assert encoded(nl.build_tunnel_create(spec)) == golden(
        A.L2TP_CMD_TUNNEL_CREATE,
        attr(A.L2TP_ATTR_CONN_ID, u32(11)), attr(A.L2TP_ATTR_PEER_CONN_ID, u32(22)),
        attr(A.L2TP_ATTR_PROTO_VERSION, u8(2)), attr(A.L2TP_ATTR_ENCAP_TYPE, u16(0)),
        attr(A.L2TP_ATTR_FD, u32(fd)),
    )


def test_tunnel_delete_modify_get():
    assert encoded(nl.build_tunnel_delete(7)) == golden(A.L2TP_CMD_TUNNEL_DELETE, attr(A.L2TP_ATTR_CONN_ID, u32(7)))
    assert encoded(nl.build_tunnel_modify(7, debug=A.L2TP_MSG_DATA)) == golden(
        A.L2TP_CMD_TUNNEL_MODIFY, attr(A.L2TP_ATTR_CONN_ID, u32(7)), attr(A.L2TP_ATTR_DEBUG, u32(8)))
    assert encoded(nl.build_tunnel_get(7)) == golden(A.L2TP_CMD_TUNNEL_GET, attr(A.L2TP_ATTR_CONN_ID, u32(7)))
    assert encoded(nl.build_tunnel_get()) == golden(A.L2TP_CMD_TUNNEL_GET)


def test_session_create_eth_with_everything():
    spec = SessionSpec(tunnel_id=100, session_id=10, peer_session_id=20, pw_type=PwType.eth, ifname="pw0",
                       l2spec_type=1, cookie="0102030405060708", peer_cookie="a1a2a3a4", recv_seq=True,
                       send_seq=True, recv_timeout_ms=300, mtu=1400)
    assert encoded(nl.build_session_create(spec)) == golden(
        A.L2TP_CMD_SESSION_CREATE,
        attr(A.L2TP_ATTR_CONN_ID, u32(100)), attr(A.L2TP_ATTR_SESSION_ID, u32(10)),
        attr(A.L2TP_ATTR_PEER_SESSION_ID, u32(20)), attr(A.L2TP_ATTR_PW_TYPE, u16(A.L2TP_PWTYPE_ETH)),
        attr(A.L2TP_ATTR_IFNAME, b"pw0\0"), attr(A.L2TP_ATTR_L2SPEC_TYPE, u8(1)),
        attr(A.L2TP_ATTR_COOKIE, bytes(range(1, 9))), attr(A.L2TP_ATTR_PEER_COOKIE, bytes.fromhex("a1a2a3a4")),
        attr(A.L2TP_ATTR_RECV_SEQ, u8(1)), attr(A.L2TP_ATTR_SEND_SEQ, u8(1)),
        attr(A.L2TP_ATTR_RECV_TIMEOUT, u64(300)), attr(A.L2TP_ATTR_MTU, u16(1400)),
    )


def test_session_create_ppp_lns():
    spec = SessionSpec(tunnel_id=3, session_id=4, peer_session_id=5, version=2, pw_type=PwType.ppp, lns_mode=True)
    assert encoded(nl.build_session_create(spec)) == golden(
        A.L2TP_CMD_SESSION_CREATE,
        attr(A.L2TP_ATTR_CONN_ID, u32(3)), attr(A.L2TP_ATTR_SESSION_ID, u32(4)),
        attr(A.L2TP_ATTR_PEER_SESSION_ID, u32(5)), attr(A.L2TP_ATTR_PW_TYPE, u16(A.L2TP_PWTYPE_PPP)),
        attr(A.L2TP_ATTR_LNS_MODE, u8(1)),
    )


def test_session_delete_modify_get():
    assert encoded(nl.build_session_delete(3, 4)) == golden(
        A.L2TP_CMD_SESSION_DELETE, attr(A.L2TP_ATTR_CONN_ID, u32(3)), attr(A.L2TP_ATTR_SESSION_ID, u32(4)))
    assert encoded(nl.build_session_modify(3, 4, send_seq=False, lns_mode=True)) == golden(
        A.L2TP_CMD_SESSION_MODIFY, attr(A.L2TP_ATTR_CONN_ID, u32(3)), attr(A.L2TP_ATTR_SESSION_ID, u32(4)),
        attr(A.L2TP_ATTR_SEND_SEQ, u8(0)), attr(A.L2TP_ATTR_LNS_MODE, u8(1)))
    assert encoded(nl.build_session_get(3, 4)) == golden(
        A.L2TP_CMD_SESSION_GET, attr(A.L2TP_ATTR_CONN_ID, u32(3)), attr(A.L2TP_ATTR_SESSION_ID, u32(4)))
    assert encoded(nl.build_session_get()) == golden(A.L2TP_CMD_SESSION_GET)


def test_reply_decoding_includes_new_stats_counters():
    """A SESSION_GET reply as the kernel sends it, with RX_COOKIE_DISCARDS/RX_INVALID."""
    stats = b"".join(attr(i, u64(i * 10)) for i in (1, 2, 3, 4, 5, 6, 7, 8, 10, 11))
    raw = golden(
        A.L2TP_CMD_SESSION_GET,
        attr(A.L2TP_ATTR_CONN_ID, u32(100)), attr(A.L2TP_ATTR_PEER_CONN_ID, u32(200)),
        attr(A.L2TP_ATTR_SESSION_ID, u32(10)), attr(A.L2TP_ATTR_PEER_SESSION_ID, u32(20)),
        attr(A.L2TP_ATTR_PW_TYPE, u16(A.L2TP_PWTYPE_ETH)), attr(A.L2TP_ATTR_IFNAME, b"pw0\0"),
        attr(A.L2TP_ATTR_SEND_SEQ, u8(1)), attr(A.L2TP_ATTR_STATS | 0x8000, stats),
    )
    msg = nl.l2tpmsg(raw)
    msg.decode()
    s = nl.parse_session(msg)
    assert (s.tunnel_id, s.session_id, s.peer_session_id, s.peer_tunnel_id, s.ifname) == (100, 10, 20, 200, "pw0")
    assert s.pw_type is PwType.eth and s.send_seq and not s.recv_seq
    assert s.stats.tx_packets == 10 and s.stats.rx_errors == 80
    assert s.stats.rx_cookie_discards == 100 and s.stats.rx_invalid == 110


def test_tunnel_reply_decoding():
    raw = golden(
        A.L2TP_CMD_TUNNEL_GET,
        attr(A.L2TP_ATTR_CONN_ID, u32(100)), attr(A.L2TP_ATTR_PEER_CONN_ID, u32(200)),
        attr(A.L2TP_ATTR_PROTO_VERSION, u8(3)), attr(A.L2TP_ATTR_ENCAP_TYPE, u16(0)),
        attr(A.L2TP_ATTR_UDP_SPORT, u16(5000)), attr(A.L2TP_ATTR_UDP_DPORT, u16(5001)),
        attr(A.L2TP_ATTR_UDP_CSUM, u8(0)),
        attr(A.L2TP_ATTR_IP_SADDR, ip4("10.98.0.1")), attr(A.L2TP_ATTR_IP_DADDR, ip4("10.98.0.2")),
    )
    msg = nl.l2tpmsg(raw)
    msg.decode()
    t = nl.parse_tunnel(msg)
    assert (t.tunnel_id, t.peer_tunnel_id, t.version, t.encap) == (100, 200, 3, Encap.udp)
    assert str(t.local) == "10.98.0.1:5000" and str(t.remote) == "10.98.0.2:5001" and t.udp_csum is False


def test_session_ids_read_from_the_raw_answer_match_the_decoder():
    """session_ids() reads CONN_ID and SESSION_ID without pyroute2's decoder:
    the same values as the decoder's, whatever the attributes around them."""
    from pipexctl.kernel import netlink as n

    for attrs in ([("L2TP_ATTR_CONN_ID", 70000), ("L2TP_ATTR_SESSION_ID", 65535)],
                  [("L2TP_ATTR_PEER_SESSION_ID", 9), ("L2TP_ATTR_IFNAME", "l2tpeth12345"),
                   ("L2TP_ATTR_SESSION_ID", 1), ("L2TP_ATTR_COOKIE", b"\x01\x02\x03"), ("L2TP_ATTR_CONN_ID", 4)],
                  [("L2TP_ATTR_STATS", {"attrs": [("L2TP_ATTR_TX_PACKETS", 5)]}), ("L2TP_ATTR_CONN_ID", 3)]):
        data = b"pad!" + answer(n.uapi.L2TP_CMD_SESSION_GET, attrs)  # not at offset 0, as in a multi-message answer
        d = n.l2tpmsg(data[4:])
        d.decode()
        assert n._ids(data, 4, len(data) - 4) == (d.get_attr("L2TP_ATTR_CONN_ID"), d.get_attr("L2TP_ATTR_SESSION_ID"))
        ids = n._ids(data, 4, len(data) - 4)
        assert n._key(data, 4, len(data) - 4) == (None if None in ids else session_key(*ids))


def test_session_counters_read_from_the_raw_answer_match_the_decoder():
    """session_counters() reads the ids and the nested counters without
    pyroute2's decoder or a model: the values parse_session gives, wherever
    the stats nest sits and whichever counters the kernel sends."""
    from pipexctl.kernel import netlink as n
    from pipexctl.model import SessionCounters, Stats

    every = [("L2TP_ATTR_" + f.upper(), (i + 1) * 1_000_000_007) for i, f in enumerate(names(Stats))]
    for stats in (every, [("L2TP_ATTR_RX_BYTES", 2**63 + 5), ("L2TP_ATTR_TX_ERRORS", 1)], []):
        for attrs in ([("L2TP_ATTR_CONN_ID", 70000), ("L2TP_ATTR_SESSION_ID", 65535),
                       ("L2TP_ATTR_STATS", {"attrs": stats})],
                      [("L2TP_ATTR_STATS", {"attrs": stats}), ("L2TP_ATTR_IFNAME", "l2tpeth7"),
                       ("L2TP_ATTR_SESSION_ID", 1), ("L2TP_ATTR_COOKIE", b"\x01\x02\x03"), ("L2TP_ATTR_CONN_ID", 4)]):
            data = b"pad!" + answer(n.uapi.L2TP_CMD_SESSION_GET, attrs)
            d = n.l2tpmsg(data[4:])
            d.decode()
            want = n.parse_session(d)
            got = n._counters(data, 4, len(data) - 4)
            assert got == SessionCounters(want.tunnel_id, want.session_id, *dataclasses.astuple(want.stats))
    # without a session id (not a session answer) there is nothing to count
    raw = answer(n.uapi.L2TP_CMD_SESSION_GET, [("L2TP_ATTR_CONN_ID", 3)])
    assert n._counters(raw, 0, len(raw)) is None


def test_raw_readers_stop_at_an_attribute_that_overruns_its_message():
    """An attribute whose length runs past its message is not read (nor
    anything after it): the readers never take bytes of the next answer."""
    from pipexctl.kernel import netlink as n

    hdr = n.NLMSG_HDR.pack(0, 30, 0, 1, 0) + b"\x01\x01\x00\x00"
    good = struct.pack("=HHI", 8, n.uapi.L2TP_ATTR_CONN_ID, 9)
    bad = struct.pack("=HHI", 200, n.uapi.L2TP_ATTR_SESSION_ID, 7)
    body = hdr + good + bad
    data = body + struct.pack("=HHI", 8, n.uapi.L2TP_ATTR_SESSION_ID, 5)  # the next answer's bytes
    assert n._ids(data, 0, len(body)) == (9, None)
    assert n._counters(data, 0, len(body)) is None


def test_session_counters_carry_exactly_stats_fields_in_order():
    from pipexctl.model import SessionCounters, Stats

    assert SessionCounters._fields == ("tunnel_id", "session_id", *names(Stats))


def test_a_run_of_ids_packs_as_its_attributes_one_by_one():
    names = ("L2TP_ATTR_CONN_ID", "L2TP_ATTR_SESSION_ID", "L2TP_ATTR_PEER_SESSION_ID", "L2TP_ATTR_PW_TYPE")
    run = nl._run(*names)
    for values in ((1, 1, 0, 7), (0xFFFFFFFF, 65535, 0xFFFFFFFF, 0xFFFF), (9, 2**31, 17, 0)):
        assert run(*values) == b"".join(nl._A[n](v) for n, v in zip(names, values))
    with pytest.raises(ValueError):
        nl._run("L2TP_ATTR_CONN_ID")  # no request sends a run of one


def test_session_keys_tell_every_pair_of_32_bit_ids_apart():
    """A discovery poll holds the kernel's sessions as keys: two sessions
    never share one, at the edges of L2TPv3's 32-bit ids either."""
    edge = (0, 1, 0xFFFF, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF)
    pairs = [(t, s) for t in edge for s in edge]
    assert len({session_key(t, s) for t, s in pairs}) == len(pairs)
    assert all(divmod(session_key(t, s), 1 << 32) == (t, s) for t, s in pairs)
