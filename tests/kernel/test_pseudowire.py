"""L2TPv3 Ethernet pseudowires between two namespaces, on the real kernel."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipexctl.model import Encap, Endpoint, PwType, SessionSpec, TunnelSpec

from .conftest import ip_l2tp, link_stats

pytestmark = pytest.mark.kernel

CASES = {
    "udp4": (Encap.udp, 4),
    "udp6": (Encap.udp, 6),
    "ip4": (Encap.ip, 4),
}


def _specs(pair, encap, family, side):
    a, b = (pair.A4, pair.B4) if family == 4 else (pair.A6, pair.B6)
    ports = (5000, 5001) if encap is Encap.udp else (0, 0)
    if side == "a":
        t = TunnelSpec(tunnel_id=100, peer_tunnel_id=200, encap=encap,
                       local=Endpoint.parse(a, ports[0]), remote=Endpoint.parse(b, ports[1]))
        s = SessionSpec(tunnel_id=100, session_id=10, peer_session_id=20, pw_type=PwType.eth, ifname="pw0")
    else:
        t = TunnelSpec(tunnel_id=200, peer_tunnel_id=100, encap=encap,
                       local=Endpoint.parse(b, ports[1]), remote=Endpoint.parse(a, ports[0]))
        s = SessionSpec(tunnel_id=200, session_id=20, peer_session_id=10, pw_type=PwType.eth, ifname="pw0")
    return t, s


def _addr_and_ping(pair):
    for ns, ip in ((pair.a, "192.168.77.1"), (pair.b, "192.168.77.2")):
        subprocess.run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "pw0"], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "pw0", "up"], check=True)
    r = subprocess.run(["ip", "netns", "exec", pair.a, "ping", "-c", "5", "-i", "0.2", "-W", "2", "192.168.77.2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0% packet loss" in r.stdout


@pytest.mark.parametrize("case", list(CASES))
def test_pseudowire_library(pair, orch_in, case):
    encap, family = CASES[case]
    oa, ob = orch_in(pair.a), orch_in(pair.b)
    ta, sa = _specs(pair, encap, family, "a")
    tb, sb = _specs(pair, encap, family, "b")
    ra = oa.add_session(sa, ta)
    rb = ob.add_session(sb, tb)
    assert ra.tunnel_created and rb.tunnel_created

    # iproute2 sees what we created
    tun = ip_l2tp(pair.a, "tunnel")
    assert [t["tunnel_id"] for t in tun] == [100]
    assert tun[0]["peer_tunnel_id"] == 200
    assert tun[0]["encap"] == ("UDP" if encap is Encap.udp else "IP")
    assert tun[0]["local"] == str(ta.local.address) and tun[0]["remote"] == str(ta.remote.address)
    if encap is Encap.udp:
        assert (tun[0]["sport"], tun[0]["dport"]) == (5000, 5001)
    sess = ip_l2tp(pair.a, "session")
    assert sess == [{"session_id": 10, "tunnel_id": 100, "peer_session_id": 20, "peer_tunnel_id": 200, "ifname": "pw0"}]

    before = oa.session(100, 10).stats
    link_before = link_stats(pair.a, "pw0")
    _addr_and_ping(pair)
    after = oa.session(100, 10).stats
    link_after = link_stats(pair.a, "pw0")
    # ping sent 5 requests (plus ARP/ND); 5 replies came back
    assert after.tx_packets - before.tx_packets >= 5
    assert after.rx_packets - before.rx_packets >= 5
    assert link_after["tx_packets"] - link_before["tx_packets"] >= 5
    assert link_after["rx_packets"] - link_before["rx_packets"] >= 5
    # pipexctl's counters and the netdev's agree on direction and order of magnitude
    assert after.rx_bytes > 5 * 84 and after.tx_bytes > 5 * 84

    # modify: sequence numbers on; iproute2 shows it
    oa.backend.session_modify(100, 10, send_seq=True, recv_seq=True)
    out = subprocess.run(["ip", "-n", pair.a, "l2tp", "show", "session"], capture_output=True, text=True).stdout
    seq = [ln for ln in out.splitlines() if "sequence numbering:" in ln]
    assert seq and "send" in seq[0] and "recv" in seq[0], out
    assert oa.session(100, 10).send_seq

    # delete: nothing left behind
    oa.delete_session(100, 10)
    assert ip_l2tp(pair.a, "session") == []
    assert [t["tunnel_id"] for t in ip_l2tp(pair.a, "tunnel")] == [100]
    oa.delete_tunnel(100)
    assert ip_l2tp(pair.a, "tunnel") == []
    ob.delete_session(200, 20, tunnel_too=True)
    assert ip_l2tp(pair.b, "tunnel") == [] and ip_l2tp(pair.b, "session") == []
    r = subprocess.run(["ip", "-n", pair.a, "link", "show", "pw0"], capture_output=True)
    assert r.returncode != 0, "pw0 must be gone with its session"


def _cli(ns, *args):
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "pipexctl", *args],
                          capture_output=True, text=True)


@pytest.mark.one_debian('the CLI over the library; test_pseudowire_library and test_errors meet both kernels')
def test_pseudowire_cli_end_to_end(pair):
    """The operator's commands from the issue, as separate processes."""
    r = _cli(pair.a, "addsess", "l2tp", "--version", "3", "--pw", "eth", "--encap", "udp", "--tunnel-id", "100",
             "--peer-tunnel-id", "200", "--session-id", "10", "--peer-session-id", "20",
             "--local", f"{pair.A4}:5000", "--remote", f"{pair.B4}:5001", "--ifname", "pw0")
    assert r.returncode == 0, r.stderr
    assert "session 10 in tunnel 100 created" in r.stdout
    r = _cli(pair.b, "addsess", "l2tp", "--version", "3", "--pw", "eth", "--tunnel-id", "200",
             "--peer-tunnel-id", "100", "--session-id", "20", "--peer-session-id", "10",
             "--local", f"{pair.B4}:5001", "--remote", f"{pair.A4}:5000", "--ifname", "pw0")
    assert r.returncode == 0, r.stderr
    _addr_and_ping(pair)
    r = _cli(pair.a, "stat", "--tunnel-id", "100", "--session-id", "10", "--json")
    import json

    st = json.loads(r.stdout)[0]
    assert st["rx_packets"] >= 5 and st["tx_packets"] >= 5
    r = _cli(pair.a, "delsess", "l2tp", "--tunnel-id", "100", "--session-id", "10")
    assert r.returncode == 0, r.stderr
    r = _cli(pair.a, "deltun", "--tunnel-id", "100")
    assert r.returncode == 0, r.stderr
    assert ip_l2tp(pair.a, "tunnel") == [] and ip_l2tp(pair.a, "session") == []
    # deleting again: a clear one-line error and exit 1
    r = _cli(pair.a, "deltun", "--tunnel-id", "100")
    assert r.returncode == 1
    assert r.stderr.strip() == "pipexctl: error: cannot delete tunnel 100: it does not exist"
