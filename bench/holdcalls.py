"""One offload service holding N calls at once, run inside the guest: N
offloads one after another through one OffloadService, with the real
netlink backend and the real data path (a tunnel socket on the L2TP port
connected to its peer, the kernel tunnel and session, the PPPoL2TP socket,
the relay watching every tunnel socket), each call in a tunnel of its own,
all held until the last; then every tunnel dropped.  No xl2tpd and no
pppd: what it shows is that the daemon's own side carries N calls (its
fds past 1,024 and its poll loops, its memory, the time of an offload as
the service fills), which real calls cannot show on a two-vCPU emulated
guest (`make scale` stops at a few hundred real calls there, docs/offload.md).

Every STEP calls: the process's fds and RSS, the kernel's session count
(/proc/net/pppol2tp), the state file's size, and the p50/p99 of the last
STEP offloads; at the end, the time of one `status` and one `metrics`
report (and, beside it, the decoded dump the metrics report read before
2026-12-04), then the drop of every tunnel and what is left (sessions, fds).
The drops run with /sys/kernel/rcu_expedited=1 (bench/controlplane.py
says why).  Not a test: it asserts nothing.

    python -m pipexctl.testing.vm --memory 4096 --timeout 3600 -- .venv/bin/python bench/holdcalls.py --calls 10000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controlplane import rcu_expedited  # noqa: E402
from servicestorm import calls, drop_all, finish, pct, setup  # noqa: E402

from pipexctl.discovery.discovery import Discovery  # noqa: E402
from pipexctl.kernel.backend import NetlinkBackend  # noqa: E402
from pipexctl.offload.datapath import KernelDataPath  # noqa: E402
from pipexctl.offload.service import OffloadService  # noqa: E402
from pipexctl.offload.watch import CallWatch  # noqa: E402

FD_LIMIT = 65536  # the shipped unit's LimitNOFILE


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def pppol2tp_sessions() -> int:
    """PPPoL2TP sessions the kernel lists (a netlink dump of 10,000 would cost more than it tells)."""
    lines = Path("/proc/net/pppol2tp").read_text().splitlines()
    return sum(1 for ln in lines if ln.startswith("  SESSION") and not ln.startswith("  SESSION name"))  # no header


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--step", type=int, default=1000)
    p.add_argument("--max-seconds", type=float, default=2400, help="stop filling after this long (reported)")
    p.add_argument("--trace", action="store_true",
                   help="tracemalloc from the start: the largest allocations while N calls are held (slower)")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "holdcalls.json"))
    a = p.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
    if a.trace:
        tracemalloc.start(3)
    setup()
    d = tempfile.mkdtemp()
    backend = NetlinkBackend()
    dp = KernelDataPath()
    svc = OffloadService(CallWatch(Discovery([], proc=False, kernel=False)), backend, dp,
                         state_path=os.path.join(d, "state.json"))
    rec: dict = {"kernel": os.uname().release, "calls_asked": a.calls, "fd_limit": FD_LIMIT,
                 "start": {"fds": fds(), "rss_mib": rss_mib()}, "steps": [], "errors": []}
    print(json.dumps(rec["start"]), flush=True)
    chans = []
    lat: list[float] = []
    t0 = time.monotonic()
    for c in calls(a.calls, 0):
        if time.monotonic() - t0 > a.max_seconds:
            rec["stopped"] = f"after {a.max_seconds:.0f} s"
            break
        t = time.monotonic()
        try:
            ch, _ = svc.offload(c, pppd_pid=c.pppd_pid)
        except Exception as e:  # reported, not raised: how far it got is the result
            rec["errors"].append(f"{c.call_id}: {e}")
            if len(rec["errors"]) >= 20:
                rec["stopped"] = "20 errors"
                break
            continue
        lat.append(time.monotonic() - t)
        chans.append(ch)
        if len(chans) % a.step == 0:
            window = lat[-a.step:]
            row = {"held": len(chans), "elapsed_s": round(time.monotonic() - t0, 1), "fds": fds(),
                   "rss_mib": rss_mib(), "kernel_sessions": pppol2tp_sessions(),
                   "state_file_kib": round(os.path.getsize(svc.state_path) / 1024),
                   "offload_p50_ms": pct(window, 0.5), "offload_p99_ms": pct(window, 0.99)}
            rec["steps"].append(row)
            print(json.dumps(row), flush=True)
    rec["held"] = len(chans)
    t = time.monotonic()
    svc.status()
    rec["status_ms"] = round((time.monotonic() - t) * 1000, 1)
    rec["rss_mib_held"] = rss_mib()
    if a.trace:
        snap = tracemalloc.take_snapshot()
        rec["traced_mib"] = round(sum(st.size for st in snap.statistics("filename")) / 2**20, 1)
        rec["traced_top"] = [f"{st.size / 2**20:.2f} MiB {st.count} blocks {st.traceback}"
                             for st in snap.statistics("lineno")[:25]]
        tracemalloc.stop()
    t = time.monotonic()
    m = svc.metrics()
    rec["metrics_ms"] = round((time.monotonic() - t) * 1000, 1)
    rec["metrics_sessions"] = len(m["sessions"]) + m["sessions_not_listed"]["count"]
    # what the report read before its counters came raw (2026-12-04: 93 s at 10,000), same boot
    t = time.monotonic()
    decoded = backend.session_dump()
    rec["decoded_dump_ms"] = round((time.monotonic() - t) * 1000, 1)
    del decoded
    print(json.dumps({k: rec[k] for k in ("held", "status_ms", "metrics_ms", "metrics_sessions", "decoded_dump_ms",
                                          "rss_mib_held")}), flush=True)
    with rcu_expedited("1") as before:
        rec["rcu_expedited_before"] = before
        t = time.monotonic()
        drop_all(svc)
        for ch in chans:
            ch.close()
        rec["drop_all_s"] = round(time.monotonic() - t, 1)
    rec["left"] = {"kernel_sessions": len(backend.session_dump()), "kernel_tunnels": len(backend.tunnel_dump()),
                   "fds": fds(), "rss_mib": rss_mib()}
    print(json.dumps({"drop_all_s": rec["drop_all_s"], "left": rec["left"], "errors": rec["errors"][:3]}), flush=True)
    backend.close()
    return finish(dp, rec, a.out)


if __name__ == "__main__":
    sys.exit(main())
