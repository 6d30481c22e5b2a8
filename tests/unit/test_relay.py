"""The relay's pure parts (offload/relay.py): the relayed datagram's
headers, the tunnel id and xl2tpd's address it reads, and a detach that
waits for the relay's thread (the relay against the real kernel:
tests/kernel/test_datapath.py)."""

from __future__ import annotations

import socket
import struct

import pytest

from pipexctl.offload.relay import MAX_DATAGRAM, l2tp_tunnel_id, udp_packet, xl2tpd_address


def test_relayed_datagram_keeps_the_peers_source_and_xl2tpds_destination():
    payload = bytes(range(40))
    pkt = udp_packet(("10.99.1.2", 1701), ("10.99.1.1", 1701), payload)
    ver_ihl, _, total, _, frag, ttl, proto, csum, src, dst = struct.unpack("!BBHHHBBH4s4s", pkt[:20])
    sport, dport, length, ucsum = struct.unpack("!HHHH", pkt[20:28])
    assert (ver_ihl, total, proto, ttl) == (0x45, 20 + 8 + 40, socket.IPPROTO_UDP, 64)
    assert frag == 0x4000 and csum == 0  # DF; the kernel fills the IP checksum
    assert (socket.inet_ntoa(src), sport, socket.inet_ntoa(dst), dport) == ("10.99.1.2", 1701, "10.99.1.1", 1701)
    assert length == 48 and ucsum == 0 and pkt[28:] == payload  # no UDP checksum, as xl2tpd sends


def test_a_datagram_too_large_for_ipv4_is_refused():
    udp_packet(("10.0.0.1", 1), ("10.0.0.2", 2), b"x" * (MAX_DATAGRAM - 28))
    with pytest.raises(ValueError, match="does not fit"):
        udp_packet(("10.0.0.1", 1), ("10.0.0.2", 2), b"x" * (MAX_DATAGRAM - 27))


def test_the_tunnel_id_is_read_at_both_header_layouts():
    control = struct.pack("!HHHHHH", 0xC802, 12, 4660, 0, 0, 0)  # T, L, S: length first
    data = struct.pack("!HHH", 0x0002, 4661, 7)
    sccrq = struct.pack("!HHHHHH", 0xC802, 12, 0, 0, 0, 0)
    assert [l2tp_tunnel_id(p) for p in (control, data, sccrq)] == [4660, 4661, 0]
    assert l2tp_tunnel_id(struct.pack("!HHHH", 0x0003, 0, 0, 0)) is None  # L2TPv3: not ours
    assert l2tp_tunnel_id(b"\x00\x02\x00") is None  # too short


def test_xl2tpds_listening_address_is_read_from_the_unconnected_sockets(tmp_path):
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    row = "   1: {}:06A5 {} 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 0\n"
    tunnel = row.format("0101630A", "0201630A:06A5")  # 10.99.1.1:1701 connected to 10.99.1.2:1701
    specific, wildcard = row.format("0101630A", "00000000:0000"), row.format("00000000", "00000000:0000")
    f = tmp_path / "udp"
    for rows, want in (([tunnel, specific], "10.99.1.1"), ([specific, wildcard], "0.0.0.0"), ([tunnel], None)):
        f.write_text(head + "".join(rows))
        assert xl2tpd_address(1701, str(f)) == want
    assert xl2tpd_address(1701, str(tmp_path / "none")) is None


def test_detach_with_wait_returns_once_the_relay_thread_let_go_of_the_socket():
    """A caller that reads the socket itself after detach(wait=True) must not
    race the relay thread for its datagrams: by then the relay holds only
    its wake-up pipe (a real Relay thread, on loopback, slowed as under
    emulation: each drop takes 50 ms)."""
    import socket
    import time

    from pipexctl.offload.relay import Relay

    relay = Relay(l2tp_port=1701)
    drop = relay._drop
    relay._drop = lambda ident: (time.sleep(0.05), drop(ident))
    a, b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        a.connect(b.getsockname())
        for _ in range(3):
            relay.attach(a)
            end = time.monotonic() + 5
            while len(relay.sel) < 2 and time.monotonic() < end:  # the relay reads it now
                time.sleep(0.01)
            assert len(relay.sel) == 2
            relay.detach(a, wait=True)
            assert len(relay.sel) == 1 and relay._wake_r in relay.sel
        b.sendto(b"x" * 20, a.getsockname())
        a.settimeout(2)
        assert a.recv(100) == b"x" * 20 and relay.relayed == 0
    finally:
        relay.close()
        a.close()
        b.close()


def test_frames_from_before_a_moved_channels_join_reach_xl2tpd_as_the_calls_data_packets():
    """A live move's session takes the peer's frames from its connect; what
    came before its channel was under pppd's unit is handed to xl2tpd as
    the peer sent it (L2TPv2 data, our tunnel and session ids, the PPP
    address and control field), which carries it over the pty."""
    from pipexctl.offload.relay import Relay

    xl2tpd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    xl2tpd.bind(("127.0.0.1", 0))
    relay = Relay(l2tp_port=xl2tpd.getsockname()[1])
    try:
        frames = [b"\x00\x21" + bytes(range(30)), b"\xc0\x21\x09\x01\x00\x08abcd"]  # an IP packet, an LCP echo
        assert relay.pass_frames(4661, 7, frames) == 2 and relay.relayed == 2
        xl2tpd.settimeout(2)
        got = [xl2tpd.recv(100) for _ in frames]
        assert got == [struct.pack("!HHH", 0x0002, 4661, 7) + b"\xff\x03" + f for f in frames]
        assert l2tp_tunnel_id(got[0]) == 4661
    finally:
        relay.close()
        xl2tpd.close()
