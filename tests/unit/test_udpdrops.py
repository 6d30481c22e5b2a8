"""xl2tpd's socket overflowing: the drops of the unconnected socket on its
port, read from /proc/PID/net.  The host's own kernel drops the datagrams
(loopback only): UDP needs no guest."""

from __future__ import annotations

import os
import socket

from pipexctl.discovery import udpdrops


def _flood(port: int, n: int = 400) -> None:
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(n):
        tx.sendto(b"x" * 1000, ("127.0.0.1", port))
    tx.close()


def _small_socket(connect_to: int | None = None) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel doubles it; a few datagrams fit
    s.bind(("127.0.0.1", 0))
    if connect_to is not None:
        s.connect(("127.0.0.1", connect_to))
    return s


def test_drops_on_the_unconnected_socket_of_the_port_are_warned_about_once_per_interval():
    xl2tpd = _small_socket()
    port = xl2tpd.getsockname()[1]
    other = _small_socket()  # another unconnected socket: its drops are not xl2tpd's
    w = udpdrops.DropWatch(port)
    try:
        assert w.check([os.getpid()], now=0.0) == []  # the first look: what was dropped before is not ours
        _flood(other.getsockname()[1])
        assert w.check([os.getpid()], now=10.0) == [] and w.dropped == 0
        _flood(port)
        assert w.check([os.getpid()], now=15.0) == []  # checked every CHECK_EVERY only
        (warning,) = w.check([os.getpid()], now=20.0)
        n = w.dropped
        assert n > 300, n
        assert f"lost {n} datagram(s) on its UDP port {port} within the last 10 s" in warning
        assert "net.core.rmem_default" in warning
        _flood(port)
        assert w.check([os.getpid()], now=30.0) == []  # within WARN_EVERY: summed for later
        assert w.dropped > n
        _flood(port)
        (warning,) = w.check([os.getpid()], now=30.0 + w.WARN_EVERY)
        assert f"lost {w.dropped - n} datagram(s)" in warning and "within the last 610 s" in warning
        assert w.check([os.getpid(), os.getpid()], now=1000.0) == []  # one namespace read once; nothing new
        assert w.check([2**22 + 12345], now=2000.0) == []  # an xl2tpd gone meanwhile
    finally:
        xl2tpd.close()
        other.close()


def test_a_connected_sockets_drops_are_a_tunnels_not_xl2tpds():
    peer = _small_socket()
    tunnel = _small_socket(connect_to=peer.getsockname()[1])
    try:
        before = udpdrops.counters(f"/proc/{os.getpid()}/net")
        for _ in range(400):  # a connected socket takes datagrams from its peer only
            peer.sendto(b"x" * 1000, tunnel.getsockname())
        after = udpdrops.counters(f"/proc/{os.getpid()}/net")
        assert after.drops_connected - before.drops_connected > 300
        assert after.rcvbuf_errors - before.rcvbuf_errors > 300
        assert udpdrops.socket_drops(f"/proc/{os.getpid()}/net", tunnel.getsockname()[1])[0] == 0
    finally:
        tunnel.close()
        peer.close()


def test_the_proc_files_are_read_by_field(tmp_path):
    (tmp_path / "snmp").write_text(
        "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n"
        "Udp: 1000 2 30 40 29 0 0 0 0\n"
        "UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti "
        "MemErrors\nUdpLite: 0 0 0 0 0 0 0 0 0\n")
    (tmp_path / "udp").write_text(
        "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref "
        "pointer drops\n"
        "  1: 0100000A:06A5 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 "
        "0000000000000000 17\n"
        "  2: 0100000A:06A5 0200000A:06A5 01 00000000:00000000 00:00000000 00000000     0        0 3 2 "
        "0000000000000000 5\n"
        "  3: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4 2 "
        "0000000000000000 7\n")
    assert udpdrops.counters(str(tmp_path), 1701) == udpdrops.UdpCounters(1000, 30, 29, 17, 5)
    assert udpdrops.counters(str(tmp_path)) == udpdrops.UdpCounters(1000, 30, 29, 24, 5)
