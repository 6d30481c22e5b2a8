"""The built-in demo (`make demo`): a two-namespace L2TP lab in the guest.

Run on the host, it boots the Debian-kernel guest (this machine's kernel may
lack L2TP) and runs itself there with ``--in-guest``.  In the guest:

1. two namespaces, ``lac`` and ``lns``, joined by a veth;
2. pipexctl creates an L2TPv3 Ethernet pseudowire on both ends (tunnel,
   session, l2tpeth interface) through generic netlink;
3. ``ip l2tp show`` (iproute2, not pipexctl) shows what the kernel holds;
4. ping and iperf3 across the pseudowire, against the bare veth as ceiling,
   with the kernel's per-session counters;
5. teardown through pipexctl, then a check that nothing is left.

Exit status 0 only when every step worked.  (The xl2tpd/pppd offload lab
joins this demo when the offload issue lands.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from . import __version__
from .kernel.backend import NetlinkBackend
from .model import Endpoint, PwType, SessionSpec, TunnelSpec
from .netns import Pair
from .orchestrator import Orchestrator


def _sh(*cmd: str, check: bool = True) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def _iperf(server_ns: str, client_ns: str, addr: str, seconds: int) -> float:
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-B", addr],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            time.sleep(0.1)
            if subprocess.run(["ip", "netns", "exec", server_ns, "ss", "-ltn", f"src {addr}"],
                              capture_output=True, text=True).stdout.count("5201"):
                break
        out = _sh("ip", "netns", "exec", client_ns, "iperf3", "-c", addr, "-t", str(seconds), "-J")
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        srv.wait(timeout=15)


def step(n: int, text: str) -> None:
    print(f"\n[{n}] {text}", flush=True)


def in_guest(seconds: int) -> int:
    print(f"pipexctl {__version__} demo, kernel {os.uname().release}, {os.cpu_count()} vCPUs")
    _sh("modprobe", "-a", "l2tp_eth", "l2tp_netlink")
    ok = True
    with Pair(prefix="demo", mtu=1500) as pair:
        lac, lns = pair.a, pair.b
        step(1, f"namespaces {lac} ({pair.A4}) and {lns} ({pair.B4}) joined by a veth")
        for ns, dev in ((lac, "va"), (lns, "vb")):
            _sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", check=False)

        step(2, "pipexctl creates the L2TPv3 pseudowire on both ends (generic netlink)")
        oa, ob = Orchestrator(NetlinkBackend(netns=lac)), Orchestrator(NetlinkBackend(netns=lns))
        ra = oa.add_session(
            SessionSpec(tunnel_id=100, session_id=10, peer_session_id=20, pw_type=PwType.eth, ifname="pw0"),
            TunnelSpec(tunnel_id=100, peer_tunnel_id=200, local=Endpoint.parse(f"{pair.A4}:5000"),
                       remote=Endpoint.parse(f"{pair.B4}:5001")),
        )
        rb = ob.add_session(
            SessionSpec(tunnel_id=200, session_id=20, peer_session_id=10, pw_type=PwType.eth, ifname="pw0"),
            TunnelSpec(tunnel_id=200, peer_tunnel_id=100, local=Endpoint.parse(f"{pair.B4}:5001"),
                       remote=Endpoint.parse(f"{pair.A4}:5000")),
        )
        for side, r in (("lac", ra), ("lns", rb)):
            print(f"    {side}: tunnel {r.tunnel.tunnel_id}->{r.tunnel.peer_tunnel_id}, "
                  f"session {r.session.session_id}->{r.session.peer_session_id}, interface {r.session.ifname}")

        step(3, f"what the kernel holds in {lac}, as iproute2 shows it")
        print("    " + (_sh("ip", "-n", lac, "l2tp", "show", "tunnel") + _sh("ip", "-n", lac, "l2tp", "show", "session"))
              .strip().replace("\n", "\n    "))

        step(4, "traffic across the pseudowire")
        for ns, ip in ((lac, "192.168.77.1"), (lns, "192.168.77.2")):
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "pw0")
            _sh("ip", "-n", ns, "link", "set", "pw0", "up")
        ping = subprocess.run(["ip", "netns", "exec", lac, "ping", "-c", "5", "-i", "0.2", "192.168.77.2"],
                              capture_output=True, text=True)
        summary = [ln for ln in ping.stdout.splitlines() if "packet loss" in ln or ln.startswith("rtt")]
        print("    ping: " + " | ".join(summary))
        ok &= ping.returncode == 0
        veth = _iperf(lns, lac, pair.B4, seconds)
        pw = _iperf(lns, lac, "192.168.77.2", seconds)
        st = oa.session(100, 10).stats
        print(f"    iperf3 {seconds} s, bare veth:         {veth:8.1f} Mbit/s (ceiling)")
        print(f"    iperf3 {seconds} s, L2TPv3 pseudowire: {pw:8.1f} Mbit/s ({pw / veth:.2f} x veth)")
        print(f"    kernel session counters (lac): rx {st.rx_packets} pkts / {st.rx_bytes} B, "
              f"tx {st.tx_packets} pkts / {st.tx_bytes} B, errors {st.rx_errors + st.tx_errors}")
        ok &= st.tx_bytes > 0 and st.rx_bytes > 0 and pw > 0

        step(5, "teardown through pipexctl")
        oa.delete_session(100, 10, tunnel_too=True)
        ob.delete_session(200, 20, tunnel_too=True)
        left = _sh("ip", "-n", lac, "l2tp", "show", "tunnel") + _sh("ip", "-n", lns, "l2tp", "show", "tunnel")
        print("    left in the kernel: " + (left.strip() or "nothing"))
        ok &= not left.strip()
        oa.backend.close()
        ob.backend.close()
    print("\nRESULT: " + ("ok, the kernel carried the pseudowire" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipexctl.demo", description="pipexctl's built-in lab demo")
    p.add_argument("--in-guest", action="store_true", help="run the lab here (needs root and an L2TP kernel)")
    p.add_argument("--seconds", type=int, default=5, help="iperf3 duration per measurement")
    a = p.parse_args(argv)
    if a.in_guest:
        return in_guest(a.seconds)
    from .testing.vm import VMError, run_in_guest

    print("Booting the Debian-kernel guest (QEMU, software emulation); the lab runs inside it.", flush=True)
    try:
        r = run_in_guest([sys.executable, "-m", "pipexctl.demo", "--in-guest", "--seconds", str(a.seconds)],
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), progress=True)
    except VMError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 125
    print(f"(guest powered off after {r.total_seconds:.0f} s, exit status {r.returncode})")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
