"""The data path's pure parts: the relayed datagram's headers, the tunnel id
and xl2tpd's address the relay reads, the twins' nft table (the relay and
the steering run against the real kernel in tests/kernel/test_datapath.py)."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess

import pytest

from pipexctl import errors
from pipexctl.kernel.check import sessions_per_namespace
from pipexctl.offload import steering
from pipexctl.offload.relay import MAX_DATAGRAM, l2tp_tunnel_id, udp_packet, xl2tpd_address
from pipexctl.offload.steering import Twin


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


TWINS = [Twin("10.99.1.1", 40000, "10.99.1.2", 1701, 4660), Twin("10.99.1.1", 40001, "10.99.1.2", 1701, 4661)]


def test_nft_accepts_the_steering_table_and_its_elements():
    nft = shutil.which("nft")
    assert nft, "nft is needed (make setup installs nftables)"
    text = steering.table() + steering.elements("add", TWINS)
    assert "@th,80,16 map @twins " in text and "@th,96,16 map @twins_l " in text and 'iif != "lo"' in text
    r = subprocess.run([nft, "-c", "-f", "-"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "10.99.1.2 . 1701 . 4660 : 40000" in text and "10.99.1.1 . 40001" in text
    assert steering.elements("add", []) == ""


class FakeNft:
    """Stands for nftables: what ran, and a table that a flush can remove."""

    def __init__(self):
        self.ran, self.table = [], False

    def run(self, text):
        if text.startswith("add element") or text.startswith("delete element"):
            if not self.table:
                raise errors.KernelError("No such file or directory")
        self.ran.append(text)
        self.table = "delete table" not in text and (self.table or "add table" in text)

    def exists(self, command):
        return self.table


def test_steering_writes_the_table_with_the_first_twin_and_removes_it_with_the_last():
    nft = FakeNft()
    st = steering.Steering(nft)
    st.add(TWINS[0])
    assert nft.ran[-1].startswith("add table ip pipexctl") and nft.table
    st.add(TWINS[1])
    assert nft.ran[-1].startswith("add element") and "4661" in nft.ran[-1]
    st.remove(TWINS[0])
    assert nft.ran[-1].startswith("delete element") and "4660" in nft.ran[-1]
    st.remove(TWINS[1])
    assert "delete table ip pipexctl" in nft.ran[-1] and not nft.table


def test_a_flushed_table_is_put_back_whole_by_check_and_by_the_next_add():
    nft = FakeNft()
    st = steering.Steering(nft)
    st.add(TWINS[0])
    nft.table = False  # nft flush ruleset
    assert st.check() and nft.table and st.restored == 1
    assert "4660" in nft.ran[-1] and nft.ran[-1].startswith("add table")
    assert not st.check()  # nothing to do while it is there
    nft.table = False
    st.add(TWINS[1])  # the element add fails, the whole table is written
    assert nft.table and "4660" in nft.ran[-1] and "4661" in nft.ran[-1]


def test_adopted_twins_are_written_in_one_transaction_by_settle():
    """After a restart every adopted twin's elements go in with the table in
    one nft transaction: none of them is ever without its steering."""
    nft = FakeNft()
    st = steering.Steering(nft)
    for t in TWINS:
        st.hold(t)
    assert nft.ran == []
    st.settle()
    assert len(nft.ran) == 1 and "4660" in nft.ran[0] and "4661" in nft.ran[0] and "flush table" in nft.ran[0]
    st2 = steering.Steering(nft)
    st2.settle()  # nothing held (none adopted): the stale table goes
    assert "delete table ip pipexctl" in nft.ran[-1] and not nft.table


@pytest.mark.parametrize("release, per_namespace", [
    ("6.1.0-57-amd64", False), ("6.10.14", False), ("6.11.0", True), ("6.12.117+deb13-amd64", True),
    ("7.0.1-arch1", True), ("5.15.0-1-generic", False), ("garbage", False),
])
def test_twins_are_steered_only_before_linux_6_11(release, per_namespace):
    assert sessions_per_namespace(release) is per_namespace


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
            while len(relay.sel.get_map()) < 2 and time.monotonic() < end:  # the relay reads it now
                time.sleep(0.01)
            assert len(relay.sel.get_map()) == 2
            relay.detach(a, wait=True)
            assert [k.data for k in relay.sel.get_map().values()] == [None]
        b.sendto(b"x" * 20, a.getsockname())
        a.settimeout(2)
        assert a.recv(100) == b"x" * 20 and relay.relayed == 0
    finally:
        relay.close()
        a.close()
        b.close()
