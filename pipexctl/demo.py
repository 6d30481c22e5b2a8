"""The built-in demo (`make demo`): the LAC/LNS lab in the guest.

Run on the host, it boots the Debian-kernel guest (this machine's kernel may
lack L2TP) and runs itself there with ``--in-guest``.  In the guest:

Part A, the offload (the product's main job): an LNS and a LAC namespace
with Debian's xl2tpd in userspace mode and pppd.
  1. a call over the pty: discovery shows its ids and data path, iperf3;
  2. the same call with pipexctl: `pipexctl serve` + the pppd plugin give
     pppd a kernel channel; discovery shows the kernel data path, iperf3;
     the ratio of the two.
Part B, the kernel library: an L2TPv3 Ethernet pseudowire made by
pipexctl on both ends, checked with iproute2, ping and iperf3, then torn
down with nothing left.

Exit status 0 only when every step worked.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from . import __version__
from .discovery.discovery import Discovery
from .discovery.state import CallInfo
from .kernel.backend import NetlinkBackend
from .model import Endpoint, PwType, SessionSpec, TunnelSpec
from .netns import Pair
from .orchestrator import Orchestrator
from .testing.lab import Instance, Lab, iperf, plugin_options, wait_ppp
from .testing.vm import VMError, flavour, run_in_guest


def _sh(*cmd: str, check: bool = True) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def step(n: int, text: str) -> None:
    print(f"\n[{n}] {text}", flush=True)


def _discover(lab: Lab, inst: Instance) -> list[CallInfo]:
    d = Discovery([str(inst.log)], [inst.control], netns=inst.ns)
    try:
        return d.snapshot().calls
    finally:
        d.close()


def offload_lab(seconds: int) -> bool:
    results = {}
    ok = True
    for n, (mode, extra) in enumerate((("pty", ""), ("pipexctl", plugin_options()))):
        step(n + 1, f"xl2tpd LNS + LAC in userspace mode, PPP {'over the pty' if mode == 'pty' else 'with pipexctl offload'}")
        lab = Lab(kernel_mode=False).setup(1)
        try:
            lab.write_configs(extra)
            lac = lab.lacs[0]
            for ns, dev in ((lab.lns.ns, "l1"), (lac.ns, "v0")):
                _sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", check=False)
            lab.start(lab.lns)
            lab.start(lac)
            if mode == "pipexctl":
                lab.serve(lab.lns)
                lab.serve(lac)
                print("    pipexctl serve runs next to each xl2tpd; pppd options: plugin pipexctl.so, pipexctl_required")
            lab.connect(lac)
            if not (wait_ppp(lab.lns.ns) and wait_ppp(lac.ns)):
                print("    PPP did not come up")
                return False
            for c in _discover(lab, lab.lns):
                print(f"    discovered on the LNS: tunnel {c.tunnel_id}/{c.peer_tunnel_id} call {c.call_id}/"
                      f"{c.peer_call_id} pppd {c.pppd_pid} data path: {c.data_path}")
                ok &= c.data_path == ("kernel" if mode == "pipexctl" else "userspace")
            sessions = _sh("ip", "-n", lab.lns.ns, "l2tp", "show", "session").count("Session ")
            print(f"    kernel L2TP sessions on the LNS: {sessions}")
            results[mode] = iperf(lab.lns.ns, lac.ns, "10.99.100.1", seconds)
            print(f"    iperf3 {seconds} s LAC -> LNS over ppp0: {results[mode]:7.1f} Mbit/s")
        finally:
            lab.teardown()
    ratio = results["pipexctl"] / results["pty"] if results.get("pty") else 0
    print(f"\n    offload speed-up, same guest, side by side: {ratio:.1f} x "
          f"({results['pty']:.1f} -> {results['pipexctl']:.1f} Mbit/s)")
    return ok and ratio > 1


def in_guest(seconds: int) -> int:
    r = subprocess.run(["pppd", "--version"], capture_output=True, text=True)  # 2.4.9 prints on stderr
    pppd = r.stdout + r.stderr
    distro = _sh("cat", "/etc/debian_version", check=False).strip()
    print(f"pipexctl {__version__} demo, Debian {distro}, kernel {os.uname().release}, "
          f"{pppd.strip() or 'pppd ?'}, {os.cpu_count()} vCPUs")
    _sh("modprobe", "-a", "l2tp_eth", "l2tp_netlink", "l2tp_ppp")
    print("\n== Part A: offloading a userspace-mode xl2tpd ==")
    ok = offload_lab(seconds)
    print("\n== Part B: an L2TPv3 pseudowire from the kernel library ==")
    with Pair(prefix="demo", mtu=1500) as pair:
        lac, lns = pair.a, pair.b
        step(3, f"namespaces {lac} ({pair.A4}) and {lns} ({pair.B4}) joined by a veth")
        for ns, dev in ((lac, "va"), (lns, "vb")):
            _sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", check=False)

        step(4, "pipexctl creates the L2TPv3 pseudowire on both ends (generic netlink)")
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
        for side, made in (("lac", ra), ("lns", rb)):
            print(f"    {side}: tunnel {made.tunnel.tunnel_id}->{made.tunnel.peer_tunnel_id}, session "
                  f"{made.session.session_id}->{made.session.peer_session_id}, interface {made.session.ifname}")

        step(5, f"what the kernel holds in {lac}, as iproute2 shows it")
        print("    " + (_sh("ip", "-n", lac, "l2tp", "show", "tunnel") + _sh("ip", "-n", lac, "l2tp", "show", "session"))
              .strip().replace("\n", "\n    "))

        step(6, "traffic across the pseudowire")
        for ns, ip in ((lac, "192.168.77.1"), (lns, "192.168.77.2")):
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "pw0")
            _sh("ip", "-n", ns, "link", "set", "pw0", "up")
        ping = subprocess.run(["ip", "netns", "exec", lac, "ping", "-c", "5", "-i", "0.2", "192.168.77.2"],
                              capture_output=True, text=True)
        summary = [ln for ln in ping.stdout.splitlines() if "packet loss" in ln or ln.startswith("rtt")]
        print("    ping: " + " | ".join(summary))
        ok &= ping.returncode == 0
        veth = iperf(lns, lac, pair.B4, seconds)
        pw = iperf(lns, lac, "192.168.77.2", seconds)
        st = oa.session(100, 10).stats
        print(f"    iperf3 {seconds} s, bare veth:         {veth:8.1f} Mbit/s (ceiling)")
        print(f"    iperf3 {seconds} s, L2TPv3 pseudowire: {pw:8.1f} Mbit/s ({pw / veth:.2f} x veth)")
        print(f"    kernel session counters (lac): rx {st.rx_packets} pkts / {st.rx_bytes} B, "
              f"tx {st.tx_packets} pkts / {st.tx_bytes} B, errors {st.rx_errors + st.tx_errors}")
        ok &= st.tx_bytes > 0 and st.rx_bytes > 0 and pw > 0

        step(7, "teardown through pipexctl")
        oa.delete_session(100, 10, tunnel_too=True)
        ob.delete_session(200, 20, tunnel_too=True)
        left = _sh("ip", "-n", lac, "l2tp", "show", "tunnel") + _sh("ip", "-n", lns, "l2tp", "show", "tunnel")
        print("    left in the kernel: " + (left.strip() or "nothing"))
        ok &= not left.strip()
        oa.backend.close()
        ob.backend.close()
    print("\nRESULT: " + ("ok: offload and pseudowire worked" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipexctl.demo", description="pipexctl's built-in lab demo")
    p.add_argument("--in-guest", action="store_true", help="run the lab here (needs root and an L2TP kernel)")
    p.add_argument("--seconds", type=int, default=5, help="iperf3 duration per measurement")
    p.add_argument("--debian", choices=("12", "13"), default=os.environ.get("PIPEXCTL_DEBIAN") or "12",
                   help="the guest: 12 (kernel 6.1, pppd 2.4.9) or 13 (kernel 6.12, pppd 2.5.2); "
                        "default $PIPEXCTL_DEBIAN or 12")
    a = p.parse_args(argv)
    if a.in_guest:
        return in_guest(a.seconds)
    print(f"Booting the Debian {a.debian} guest (QEMU, software emulation); the lab runs inside it.", flush=True)
    try:
        fl = flavour(f"debian{a.debian}")
        r = run_in_guest([fl.python, "-m", "pipexctl.demo", "--in-guest", "--seconds", str(a.seconds)],
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), progress=True,
                         flavour_name=fl.name)
    except VMError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 125
    print(f"(guest powered off after {r.total_seconds:.0f} s, exit status {r.returncode})")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
