"""Data-plane benchmark, run inside the guest: iperf3 over PPP through
(b) xl2tpd userspace mode (pty), (c) xl2tpd kernel mode (pppol2tp.so),
(d) pipexctl offload of a userspace-mode xl2tpd, and (a) the bare veth.

Every case in the same boot, side by side.  Not a test: it asserts nothing.

    python -m pipexctl.testing.vm -- .venv/bin/python bench/dataplane.py --runs 3 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipexctl.testing.lab import Lab, iperf_client, iperf_server, plugin_options, wait_ppp  # noqa: E402


def sh(*c: str) -> str:
    r = subprocess.run(list(c), capture_output=True, text=True)
    return (r.stdout + r.stderr).strip()


def guest_busy() -> int:
    """Busy jiffies of the whole guest (all CPUs): /proc/stat minus idle and iowait."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4]


def ping_latency(ns: str, addr: str) -> dict:
    """ping -c 100 -i 0.01 (root): avg and p99 of the round-trip times, ms."""
    out = sh("ip", "netns", "exec", ns, "ping", "-c", "100", "-i", "0.01", "-W", "2", addr)
    rtts = sorted(float(x.split("time=")[1].split()[0]) for x in out.splitlines() if "time=" in x)
    if not rtts:
        return {"error": out[-200:]}
    return {"avg": statistics.mean(rtts), "p99": rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))],
            "received": len(rtts)}


def call_latency(lab: Lab, lac, cycles: int) -> dict:
    """Hang up and redial ``cycles`` times; the daemons' own figures for each
    pppd's request -> kernel session made and its socket sent (p50/p99)."""
    for _ in range(cycles):
        lab.disconnect(lac)
        end = time.monotonic() + 30
        while lab.pppds(lac) and time.monotonic() < end:
            time.sleep(0.1)
        lab.connect(lac)
        wait_ppp(lab.lns.ns)
        wait_ppp(lac.ns)
    return {inst.name: lab.serve_status(inst)["channel_latency_ms"] for inst in (lab.lns, lac)}


def bring_up(case: str) -> tuple[Lab, object, str]:
    """The lab of one case, its PPP link up (a-veth: no PPP): (lab, lac, address to measure to).
    The caller tears the lab down (this does, if it fails)."""
    lab = Lab(kernel_mode=case == "c-xl2tpd-kernel").setup(1)
    try:
        extra = plugin_options() if case == "d-pipexctl" else ""
        lab.write_configs(extra)
        lac = lab.lacs[0]
        for ns, dev in ((lab.lns.ns, "l1"), (lac.ns, "v0")):
            sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off")
            sh("ip", "-n", ns, "link", "set", dev, "mtu", "1400") if case == "a-veth" else None
        lab.start(lab.lns)
        lab.start(lac)
        if case == "a-veth":
            return lab, lac, "10.99.1.1"
        if case == "d-pipexctl":
            lab.serve(lab.lns)
            lab.serve(lac)
        lab.connect(lac)
        if not (wait_ppp(lab.lns.ns) and wait_ppp(lac.ns)):
            raise RuntimeError("PPP did not come up")
        time.sleep(1)
        return lab, lac, "10.99.100.1"
    except BaseException:
        finish(lab)
        raise


def finish(lab: Lab) -> None:
    """Keep the lab's logs in the guest's results (when there are any) and tear it down."""
    if os.environ.get("PIPEXCTL_RESULTS"):
        lab.keep_logs(Path(os.environ["PIPEXCTL_RESULTS"]))
    lab.teardown()


def run_case(case: str, runs: int, seconds: int, cycles: int = 6) -> dict:
    try:
        lab, lac, addr = bring_up(case)
    except RuntimeError as e:
        return {"error": str(e)}
    try:
        def cpu(procs):
            tot = 0
            for pr in procs:
                try:
                    f = open(f"/proc/{pr.pid}/stat").read().rsplit(")", 1)[1].split()
                    tot += int(f[11]) + int(f[12])
                except OSError:
                    pass
            return tot

        def mbit(**kw) -> float:
            return iperf_client(lac.ns, addr, seconds, **kw)["bits_per_second"] / 1e6

        with iperf_server(lab.lns.ns, addr):  # one server for the case's runs
            c0 = cpu(lab.serves)
            g0, t0 = guest_busy(), time.monotonic()
            fwd = [mbit() for _ in range(runs)]
            busy = (guest_busy() - g0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)  # CPUs busy
            rev = [mbit(reverse=True) for _ in range(runs)]
            fwd4 = [mbit(streams=4) for _ in range(runs)]
        res = {"forward": fwd, "reverse": rev, "forward_4_streams": fwd4, "serve_cpu_ticks": cpu(lab.serves) - c0,
               "guest_cpu_busy_percent": busy * 100,
               "cpu_percent_per_mbit": busy * 100 / statistics.median(fwd) if statistics.median(fwd) else None,
               "latency_ms": ping_latency(lac.ns, addr)}
        if case != "a-veth":
            res["ppp_fds_lns"] = sorted(os.readlink(f"/proc/{p}/fd/{f}") for p in lab.pppds(lab.lns)
                                        for f in os.listdir(f"/proc/{p}/fd") if "pts" in os.readlink(f"/proc/{p}/fd/{f}"))
            res["kernel_sessions_lns"] = sh("ip", "-n", lab.lns.ns, "l2tp", "show", "session").count("Session ")
            res["status_lns"] = sh("xl2tpd-control", "-d", "-c", lab.lns.control, "status-lns", "default")[-400:]
        if case == "d-pipexctl":
            res["nft"] = sh("ip", "netns", "exec", lab.lns.ns, "nft", "list", "table", "ip", "pipexctl")
            res["channel_latency_ms"] = call_latency(lab, lac, cycles)
        return res
    except RuntimeError as e:  # an iperf3 run failed: this case's error, the other cases still run
        return {"error": str(e)}
    finally:
        finish(lab)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--cases", default="a-veth,b-xl2tpd-pty,c-xl2tpd-kernel,d-pipexctl")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "dataplane.json"))
    a = p.parse_args()
    results = {"kernel": os.uname().release, "cpus": os.cpu_count(), "seconds": a.seconds, "cases": {}}
    for case in a.cases.split(","):
        results["cases"][case] = r = run_case(case, a.runs, a.seconds)
        if "forward" in r:
            print(f"{case:18} fwd min/med/max {min(r['forward']):7.1f} {statistics.median(r['forward']):7.1f} "
                  f"{max(r['forward']):7.1f}  rev {statistics.median(r['reverse']):7.1f} Mbit/s", flush=True)
        else:
            print(case, r, flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
