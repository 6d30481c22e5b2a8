"""Data-plane benchmark, run inside the guest: iperf3 over PPP through
(b) xl2tpd userspace mode (pty), (c) xl2tpd kernel mode (pppol2tp.so),
(d) pipexctl offload of a userspace-mode xl2tpd, and (a) the bare veth.

A case name may end in ``-stock`` (pppd's own defaults instead of the lab's
``noccp novj ...``: compression left to negotiation) or ``-esp``
(transport-mode ESP on UDP/1701 between LNS and LAC, static keys); those
cases measure forward and reverse only.  ``--scale`` measures one call's
throughput with N other sessions in its tunnel, or N other tunnels' sockets
on the LNS's port 1701 (each connected to its own peer address), for (c)
and (d).

Every case in the same boot, side by side.  Not a test: it asserts nothing.

    python -m pipexctl.testing.vm -- .venv/bin/python bench/dataplane.py --runs 3 --seconds 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipexctl.testing.ipsec import esp, wire_counter, wire_counts  # noqa: E402
from pipexctl.testing.lab import (  # noqa: E402,E501
    PPP_OPTS_COMMON,
    PPP_OPTS_STOCK,
    Lab,
    iperf_client,
    iperf_server,
    plugin_options,
    wait_ppp,
)
from pipexctl.testing.probe import cpu_jiffies  # noqa: E402


def sh(*c: str) -> str:
    r = subprocess.run(list(c), capture_output=True, text=True)
    return (r.stdout + r.stderr).strip()


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
    base = base_case(case)
    lab = Lab(kernel_mode=base == "c-xl2tpd-kernel",
              ppp_opts=PPP_OPTS_STOCK if case.endswith("-stock") else PPP_OPTS_COMMON).setup(1)
    try:
        extra = plugin_options() if base == "d-pipexctl" else ""
        lab.write_configs(extra)
        lac = lab.lacs[0]
        for ns, dev in ((lab.lns.ns, "l1"), (lac.ns, "v0")):
            sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off")
            sh("ip", "-n", ns, "link", "set", dev, "mtu", "1400") if base == "a-veth" else None
        if case.endswith("-esp"):
            esp(lab.lns.ns, "10.99.1.1", lac.ns, "10.99.1.2")
            wire_counter(lab.lns.ns, "l1")
        lab.start(lab.lns)
        lab.start(lac)
        if base == "a-veth":
            return lab, lac, "10.99.1.1"
        if base == "d-pipexctl":
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
    lab.teardown(keep_as="")


def base_case(case: str) -> str:
    return case.removesuffix("-stock").removesuffix("-esp")


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

        variant = base_case(case) != case
        with iperf_server(lab.lns.ns, addr):  # one server for the case's runs
            c0 = cpu(lab.serves)
            g0, t0 = cpu_jiffies()[0], time.monotonic()
            fwd = [mbit() for _ in range(runs)]
            busy = (cpu_jiffies()[0] - g0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)  # CPUs busy
            rev = [mbit(reverse=True) for _ in range(runs)]
            fwd4 = [] if variant else [mbit(streams=4) for _ in range(runs)]
        if variant:
            res = {"forward": fwd, "reverse": rev, "guest_cpu_busy_percent": busy * 100,
                   "pppd_log": sh("grep", "-h", "compression", str(lab.lns.dir / "pppd.log"))[-600:]}
            if case.endswith("-esp"):
                res["wire_lns"] = wire_counts(lab.lns.ns)
            return res
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
            res["sockets_lns"] = sh("ip", "netns", "exec", lab.lns.ns, "ss", "-uanp")
            res["channel_latency_ms"] = call_latency(lab, lac, cycles)
        return res
    except RuntimeError as e:  # an iperf3 run failed: this case's error, the other cases still run
        return {"error": str(e)}
    finally:
        finish(lab)


@contextlib.contextmanager
def rcu_expedited():
    """Linux 6.1 waits one RCU grace period per session delete (see
    bench/controlplane.py): expedited while the scale rows build and remove
    10,000 sessions, restored afterwards."""
    path = Path("/sys/kernel/rcu_expedited")
    old = path.read_text().strip()
    path.write_text("1")
    try:
        yield
    finally:
        path.write_text(old)


def extra_sessions(ns: str, tunnel_id: int, have: int, want: int, skip: int) -> None:
    """Grow tunnel ``tunnel_id``'s sessions from ``have`` to ``want`` extra
    ones (PPP, no channel: what an offloaded call's session is to the lookup)."""
    from pipexctl.kernel.backend import NetlinkBackend
    from pipexctl.model import PwType, SessionSpec

    b = NetlinkBackend(netns=ns)
    try:
        sid = 1
        made = 0
        while made < want:
            if sid != skip:
                if made >= have:
                    b.session_create(SessionSpec(tunnel_id=tunnel_id, session_id=sid, peer_session_id=sid, version=2,
                                                 pw_type=PwType.ppp))
                made += 1
            sid += 1
    finally:
        b.close()


def extra_sockets(ns: str, socks: list, want: int, local: str) -> None:
    """Grow the list of UDP sockets on LOCAL:1701, each connected to its own
    address in 10.200.0.0/16, to ``want``: what as many tunnels' sockets are
    to Linux 6.1's UDP lookup (one hash bucket for LOCAL:1701, scanned)."""
    import socket

    from pipexctl import netns

    with netns.enter(ns):
        while len(socks) < want:
            n = len(socks) + 1
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((local, 1701))
            s.connect((f"10.200.{n // 250}.{n % 250 + 1}", 1701))
            socks.append(s)


def scale(case: str, kind: str, sizes: list[int], runs: int, seconds: int) -> dict:
    """One call's forward throughput (median of ``runs``) with N others of
    ``kind`` ("sessions" in its tunnel, "tunnels" sockets) beside it.  The
    serve daemons run as they would in production (their scans of N
    sessions included) and their CPU time per N is recorded: stopping them,
    as earlier runs did, left xl2tpd's HELLOs unanswered for minutes."""
    with rcu_expedited():  # the lab's teardown deletes the N sessions too
        return _scale(case, kind, sizes, runs, seconds)


def serve_cpu(lab: Lab) -> float:
    """CPU seconds the lab's serve daemons have used so far."""
    tck = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in lab.serves:
        try:
            f = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(f[11]) + int(f[12])) / tck
    return total


def _scale(case: str, kind: str, sizes: list[int], runs: int, seconds: int) -> dict:
    import resource

    try:
        lab, lac, addr = bring_up(case)
    except RuntimeError as e:
        return {"error": str(e)}
    socks: list = []
    out = {}
    try:
        # "Session S in tunnel T"; xl2tpd's kernel mode also has its session 0
        calls = [ln.split() for ln in sh("ip", "-n", lab.lns.ns, "l2tp", "show", "session").splitlines()
                 if ln.startswith("Session ") and not ln.startswith("Session 0 ")]
        if not calls:
            return {"error": "no kernel session on the LNS"}
        sid, tid = int(calls[0][1]), int(calls[0][4])
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4 * max(sizes) + 1024), max(hard, 4 * max(sizes) + 1024)))
        sh("ip", "-n", lab.lns.ns, "route", "add", "10.200.0.0/16", "dev", "l1")
        have = 0
        with iperf_server(lab.lns.ns, addr):
            for n in sizes:
                t0 = time.monotonic()
                if kind == "sessions":
                    extra_sessions(lab.lns.ns, tid, have, n, sid)
                    have = n
                else:
                    extra_sockets(lab.lns.ns, socks, n, "10.99.1.1")
                built = time.monotonic() - t0
                cpu0 = serve_cpu(lab)
                runs_ = [iperf_client(lac.ns, addr, seconds)["bits_per_second"] / 1e6 for _ in range(runs)]
                out[str(n)] = {"forward": runs_, "median": statistics.median(runs_), "build_seconds": built,
                               "serve_cpu_seconds": serve_cpu(lab) - cpu0}
                print(f"  scale {case} {kind} N={n}: {statistics.median(runs_):.1f} Mbit/s", flush=True)
        return out
    except RuntimeError as e:
        out["error"] = str(e)
        return out
    finally:
        for s in socks:
            s.close()
        finish(lab)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--cases", default="a-veth,b-xl2tpd-pty,c-xl2tpd-kernel,d-pipexctl,b-xl2tpd-pty-stock,"
                   "d-pipexctl-stock,b-xl2tpd-pty-esp,c-xl2tpd-kernel-esp,d-pipexctl-esp")
    p.add_argument("--scale", default="0,100,1000,10000", help="N for the scale rows ('' to skip them)")
    p.add_argument("--scale-seconds", type=int, default=5)
    p.add_argument("--scale-kinds", default="sessions,tunnels")
    p.add_argument("--scale-passes", type=int, choices=(1, 2), default=2,
                   help="2: (c), (d), (d), (c) for each kind; 1: (c), (d)")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "dataplane.json"))
    a = p.parse_args()
    results = {"kernel": os.uname().release, "cpus": os.cpu_count(), "seconds": a.seconds, "cases": {},
               "scale": {}}
    for case in filter(None, a.cases.split(",")):
        results["cases"][case] = r = run_case(case, a.runs, a.seconds)
        if "forward" in r:
            print(f"{case:18} fwd min/med/max {min(r['forward']):7.1f} {statistics.median(r['forward']):7.1f} "
                  f"{max(r['forward']):7.1f}  rev {statistics.median(r['reverse']):7.1f} Mbit/s", flush=True)
        else:
            print(case, r, flush=True)
    sizes = [int(x) for x in a.scale.split(",") if x]
    for kind in filter(None, a.scale_kinds.split(",")) if sizes else ():
        # c, d, d, c: a drift of the host's speed over the minutes between
        # passes cancels out of d/c instead of landing on one side of it
        passes = {case: [] for case in ("c-xl2tpd-kernel", "d-pipexctl")}
        for case in ("c-xl2tpd-kernel", "d-pipexctl", "d-pipexctl", "c-xl2tpd-kernel")[:2 * a.scale_passes]:
            passes[case].append(scale(case, kind, sizes, a.runs, a.scale_seconds))
        for case, got in passes.items():
            results["scale"][f"{case}/{kind}"] = merge_passes(got)
    Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


def merge_passes(got: list[dict]) -> dict:
    """One row per N from a case's passes: every run's figure, their median,
    and each pass's own median (how far the two passes lay apart)."""
    out: dict = {}
    for g in got:
        if g.get("error"):
            out["error"] = g["error"]
        for n, r in g.items():
            if n == "error":
                continue
            m = out.setdefault(n, {"forward": [], "passes": [], "build_seconds": [], "serve_cpu_seconds": []})
            m["forward"] += r["forward"]
            m["passes"].append(r["median"])
            m["build_seconds"].append(r["build_seconds"])
            m["serve_cpu_seconds"].append(r["serve_cpu_seconds"])
    for n, m in out.items():
        if n != "error":
            m["median"] = statistics.median(m["forward"])
    return out


if __name__ == "__main__":
    sys.exit(main())
