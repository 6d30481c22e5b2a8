"""L2TPv2 PPP: managed tunnel on a connected UDP socket, PPP session,
PPPoL2TP socket, PPP channel -- and data through pppN without pppd."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import subprocess
import threading
import time

import pytest
from click.testing import CliRunner

from pipexctl import errors, netns
from pipexctl.cli import AppContext, cli
from pipexctl.kernel import uapi
from pipexctl.kernel.backend import NetlinkBackend
from pipexctl.kernel.pppol2tp import udp_socket
from pipexctl.model import PwType, SessionSpec, TunnelSpec

from .conftest import ip_l2tp

pytestmark = pytest.mark.kernel


def _wait_gone(ns, what, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ip_l2tp(ns, what) == []:
            return True
        time.sleep(0.05)
    return False


def _side(orch, ns, local, remote, tid, ptid, sid, psid, version=2):
    """Managed tunnel + PPP session + connected PPPoL2TP socket in ``ns``."""
    with netns.enter(ns):
        udp = udp_socket((local, 1701), (remote, 1701))
    orch.add_tunnel(TunnelSpec(tunnel_id=tid, peer_tunnel_id=ptid, version=version, fd=udp.fileno()))
    r = orch.add_session(SessionSpec(tunnel_id=tid, session_id=sid, peer_session_id=psid, version=version,
                                     pw_type=PwType.ppp))
    assert not r.tunnel_created
    ch = orch.backend.ppp_connect(r.tunnel, r.session)
    return udp, ch


def _ppp_unit(channel_index: int) -> tuple[int, int, int]:
    """What pppd does with a channel: a pppN unit connected to it, IP passing."""
    unit_fd = os.open("/dev/ppp", os.O_RDWR)
    unit = struct.unpack("i", fcntl.ioctl(unit_fd, uapi.PPPIOCNEWUNIT, struct.pack("i", -1)))[0]
    chan_fd = os.open("/dev/ppp", os.O_RDWR)
    fcntl.ioctl(chan_fd, uapi.PPPIOCATTCHAN, struct.pack("i", channel_index))
    fcntl.ioctl(chan_fd, uapi.PPPIOCCONNECT, struct.pack("i", unit))
    fcntl.ioctl(unit_fd, uapi.PPPIOCSNPMODE, struct.pack("ii", uapi.PPP_IP, uapi.NPMODE_PASS))
    return unit, unit_fd, chan_fd


@pytest.mark.parametrize("version,family", [(2, 4), (2, 6), (3, 4), (3, 6)], ids=["v2-ip4", "v2-ip6", "v3-ip4", "v3-ip6"])
def test_managed_tunnel_ppp_session_channel_and_data(pair, orch_in, version, family):
    a, b = (pair.A4, pair.B4) if family == 4 else (pair.A6, pair.B6)
    oa, ob = orch_in(pair.a), orch_in(pair.b)
    udp_a, ch_a = _side(oa, pair.a, a, b, 11, 22, 5, 6, version)
    udp_b, ch_b = _side(ob, pair.b, b, a, 22, 11, 6, 5, version)

    tun = ip_l2tp(pair.a, "tunnel")
    assert len(tun) == 1 and tun[0]["tunnel_id"] == 11 and tun[0]["peer_tunnel_id"] == 22
    assert (tun[0]["local"], tun[0]["remote"], tun[0]["sport"], tun[0]["dport"]) == (a, b, 1701, 1701)
    kt = oa.tunnels()[0]
    assert kt.version == version and kt.local.address.version == family
    sess = ip_l2tp(pair.a, "session")
    assert sess == [{"session_id": 5, "tunnel_id": 11, "peer_session_id": 6, "peer_tunnel_id": 22}]

    chan_a, chan_b = ch_a.channel(), ch_b.channel()
    assert chan_a >= 0 and chan_b >= 0
    st = ch_a.stats()
    assert st.tx_packets == 0 and st.rx_packets == 0

    # Data: pppN on both sides over the kernel channels, no pppd involved.
    fds = []
    with netns.enter(pair.a):
        unit_a, *f = _ppp_unit(chan_a)
        fds += f
    with netns.enter(pair.b):
        unit_b, *f = _ppp_unit(chan_b)
        fds += f
    try:
        for ns, unit, me, peer in ((pair.a, unit_a, "10.99.1.1", "10.99.1.2"), (pair.b, unit_b, "10.99.1.2", "10.99.1.1")):
            subprocess.run(["ip", "-n", ns, "addr", "add", me, "peer", peer, "dev", f"ppp{unit}"], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", f"ppp{unit}", "up"], check=True)
        r = subprocess.run(["ip", "netns", "exec", pair.a, "ping", "-c", "4", "-i", "0.2", "-W", "2", "10.99.1.2"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        st = ch_a.stats()  # PPPIOCGL2TPSTATS
        assert st.tx_packets >= 4 and st.rx_packets >= 4
        nl = oa.session(11, 5).stats  # netlink SESSION_GET agrees
        assert nl.tx_packets >= st.tx_packets and nl.rx_packets >= st.rx_packets
    finally:
        for fd in fds:
            os.close(fd)

    # Closing the PPPoL2TP socket deletes the session (kernel rule) ...
    ch_a.close()
    assert _wait_gone(pair.a, "session")
    assert [t["tunnel_id"] for t in ip_l2tp(pair.a, "tunnel")] == [11]
    # ... and closing the tunnel's UDP socket deletes the tunnel.
    udp_a.close()
    assert _wait_gone(pair.a, "tunnel")
    ch_b.close()
    udp_b.close()
    assert _wait_gone(pair.b, "tunnel") and ip_l2tp(pair.b, "session") == []


def test_openbsd_order_with_fd_handoff(pair, tmp_path):
    """`pipexctl addsess l2tp <OpenBSD order> --fd-to SOCK`: the receiver owns the session."""
    path = str(tmp_path / "consumer.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    got = {}

    def consumer():
        conn, _ = srv.accept()
        msg, fds, _, _ = socket.recv_fds(conn, 4096, 1)
        got["meta"], got["fd"] = json.loads(msg), fds[0]
        conn.close()

    srv.settimeout(60)
    t = threading.Thread(target=consumer, daemon=True)
    t.start()
    backend = NetlinkBackend(netns=pair.a)
    try:
        r = CliRunner().invoke(
            cli,
            ["addsess", "l2tp", "10", "20", pair.A4, "10.99.1.2", "255.255.255.255",
             f"{pair.A4}:1701", f"{pair.B4}:1701", "300", "400", "--fd-to", path],
            obj=AppContext(lambda: backend),
        )
    finally:
        t.join(10)
        srv.close()
    assert r.exit_code == 0, r.output
    assert "tunnel 300 created" in r.output and "PPP channel" in r.output
    meta, fd = got["meta"], got["fd"]
    assert meta["tunnel_id"] == 300 and meta["session_id"] == 10 and meta["peer_session_id"] == 20
    assert meta["framed_addr"] == "10.99.1.2" and meta["version"] == 2
    # the CLI is done and closed its copy; the session lives because we hold the fd
    assert ip_l2tp(pair.a, "session") == [{"session_id": 10, "tunnel_id": 300, "peer_session_id": 20, "peer_tunnel_id": 400}]
    assert os.fstat(fd).st_mode  # a real fd
    chan = struct.unpack("i", fcntl.ioctl(fd, uapi.PPPIOCGCHAN, struct.pack("i", 0)))[0]
    assert chan == meta["channel"]
    os.close(fd)
    assert _wait_gone(pair.a, "session")
    backend.close()
    r = subprocess.run(["ip", "netns", "exec", pair.a, "ip", "l2tp", "del", "tunnel", "tunnel_id", "300"], capture_output=True)
    assert r.returncode == 0


def _ping(ns: str, dst: str, src: str, count: int = 3) -> bool:
    r = subprocess.run(["ip", "netns", "exec", ns, "ping", "-c", str(count), "-i", "0.2", "-W", "1", "-I", src, dst],
                       capture_output=True, text=True)
    return r.returncode == 0


def test_a_channel_joins_a_unit_beside_its_channel_and_leaves_with_its_socket(pair, orch_in):
    """The first half of a live move (ppp_connect with ``unit``): a second
    session's channel put under a ppp unit that already has one, at its
    connect.  The unit takes frames from both and sends down its first;
    closing the joined channel's socket takes it out again.  Proved by a
    round trip that exists only through the join: B sends on session 8, A
    receives on session 7 (joined to A's unit) and answers down the unit's
    first channel, session 5."""
    oa, ob = orch_in(pair.a), orch_in(pair.b)
    udp_a, ch_a5 = _side(oa, pair.a, pair.A4, pair.B4, 11, 22, 5, 6)
    udp_b, ch_b6 = _side(ob, pair.b, pair.B4, pair.A4, 22, 11, 6, 5)
    made = {}
    for o, tid, sid, psid in ((oa, 11, 7, 8), (ob, 22, 8, 7), (oa, 11, 9, 10)):
        made[sid] = o.add_session(SessionSpec(tunnel_id=tid, session_id=sid, peer_session_id=psid, version=2,
                                              pw_type=PwType.ppp))
    ch_b8 = ob.backend.ppp_connect(made[8].tunnel, made[8].session)
    chans, fds = [ch_a5, ch_b6, ch_b8], []
    try:
        with netns.enter(pair.a):
            unit_a, *f = _ppp_unit(ch_a5.channel())
            fds += f
        with netns.enter(pair.b):
            unit_b, *f = _ppp_unit(ch_b6.channel())
            fds += f
            unit_b2, *f = _ppp_unit(ch_b8.channel())
            fds += f
        for ns, dev, me, peer in ((pair.a, f"ppp{unit_a}", "10.99.1.1", "10.99.1.2"),
                                  (pair.b, f"ppp{unit_b}", "10.99.1.2", "10.99.1.1"),
                                  (pair.b, f"ppp{unit_b2}", "10.99.2.2", "10.99.2.1")):
            subprocess.run(["ip", "-n", ns, "addr", "add", me, "peer", peer, "dev", dev], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        # A answers for 10.99.2.1 on its one unit, and sends the answers down it
        subprocess.run(["ip", "-n", pair.a, "addr", "add", "10.99.2.1/32", "dev", f"ppp{unit_a}"], check=True)
        subprocess.run(["ip", "-n", pair.a, "route", "add", "10.99.2.2", "dev", f"ppp{unit_a}"], check=True)
        assert _ping(pair.b, "10.99.1.1", "10.99.1.2")  # the unit's own channel
        assert not _ping(pair.b, "10.99.2.1", "10.99.2.2", 2)  # session 7 has no socket yet

        # a unit that does not exist: one clear error, and the socket closed (its session with it)
        with pytest.raises(errors.NotFoundError, match="ppp unit 4242: no such unit"):
            oa.backend.ppp_connect(made[9].tunnel, made[9].session, unit=4242)
        assert _wait_gone_session(pair.a, 9)
        ch_a7 = oa.backend.ppp_connect(made[7].tunnel, made[7].session, unit=unit_a)
        chans.append(ch_a7)
        assert _ping(pair.b, "10.99.2.1", "10.99.2.2")  # in on session 7, out on session 5
        assert ch_a7.stats().rx_packets >= 3 and ch_a7.stats().tx_packets == 0  # the unit sends down its first
        assert _ping(pair.b, "10.99.1.1", "10.99.1.2")

        ch_a7.close()  # its only socket: the session goes, and its channel leaves the unit
        assert _wait_gone_session(pair.a, 7)
        assert _ping(pair.b, "10.99.1.1", "10.99.1.2")  # the unit's first channel carries on
        assert not _ping(pair.b, "10.99.2.1", "10.99.2.2", 2)
    finally:
        for fd in fds:
            os.close(fd)
        for c in chans:
            c.close()
        udp_a.close()
        udp_b.close()
    assert _wait_gone(pair.a, "tunnel") and _wait_gone(pair.b, "tunnel")


def _wait_gone_session(ns, sid, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(s["session_id"] != sid for s in ip_l2tp(ns, "session")):
            return True
        time.sleep(0.05)
    return False
