"""The offload service alone under a storm, run inside the guest: K offload
requests at once against one OffloadService with the real netlink backend
and the real data path, each call in a tunnel of its own (an LNS after a
reboot of its LACs).  No xl2tpd and no pppd: what is timed is what the
service does per call (its lock, the tunnel socket, the kernel tunnel and
session, the PPPoL2TP connect, the state file), so the login storm's
request latency can be split into the service's part and the rest.

For each K: the storm (every request released at once), then K calls one
after another (the cost of one call with nobody waiting), then a cProfile
of the sequential round's top functions (``--profile``).  Not a test: it
asserts nothing.  Run it from two trees in one boot to compare code:

    python -m pipexctl.testing.vm -- .venv/bin/python bench/servicestorm.py --k 100
    PYTHONPATH=/tmp/old .venv/bin/python bench/servicestorm.py ...   (the older tree)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipexctl.discovery.discovery import Discovery  # noqa: E402
from pipexctl.discovery.state import CallInfo  # noqa: E402
from pipexctl.kernel.backend import NetlinkBackend  # noqa: E402
from pipexctl.offload.datapath import KernelDataPath  # noqa: E402
from pipexctl.offload.service import OffloadService  # noqa: E402
from pipexctl.offload.watch import CallWatch  # noqa: E402

DEV, NET = "pxstorm0", "10.97"


def setup() -> None:
    subprocess.run(["modprobe", "-a", "l2tp_ppp", "l2tp_netlink"], check=True)
    subprocess.run(["ip", "link", "del", DEV], capture_output=True)
    for cmd in (["link", "add", DEV, "type", "dummy"], ["addr", "add", f"{NET}.0.1/16", "dev", DEV],
                ["link", "set", DEV, "up"]):
        subprocess.run(["ip", *cmd], check=True)


def calls(k: int, base: int) -> list[CallInfo]:
    out = []
    for i in range(k):
        n = base + i
        out.append(CallInfo(instance="bench", role="lns", peer=f"{NET}.{1 + n // 250}.{1 + n % 250}",
                            peer_port=1701, tunnel_id=1000 + n, peer_tunnel_id=2000 + n, call_id=3000 + n,
                            peer_call_id=4000 + n, pppd_pid=os.getpid()))
    return out


def pct(v: list[float], q: float) -> float:
    v = sorted(v)
    return round(v[min(len(v) - 1, int(q * len(v)))] * 1000, 1)


def summary(lat: list[float], parts: list[dict[str, float]], wall: float) -> dict:
    out = {"n": len(lat), "wall_s": round(wall, 3), "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99),
           "max_ms": pct(lat, 1.0), "mean_ms": round(statistics.mean(lat) * 1000, 1)}
    for name in ("lock", "build", "state"):
        vals = [p[name] for p in parts if name in p]
        if vals:
            out[f"{name}_p50_ms"] = pct(vals, 0.5)
            out[f"{name}_sum_s"] = round(sum(vals), 3)
    return out


def drop_all(svc: OffloadService) -> float:
    """Every tunnel dropped, as discovery's "xl2tpd dropped these tunnels" does it; the seconds it took."""
    t = time.monotonic()
    with svc.lock:
        for key in list(svc.tunnels):
            svc.drop_tunnel(key, "bench round over", sync=False)
        svc.save()
    return time.monotonic() - t


def finish(dp: KernelDataPath, rec: dict, out: str) -> int:
    """The data path closed, the dummy device gone, the record written."""
    dp.close()
    subprocess.run(["ip", "link", "del", DEV], check=False)
    Path(out).write_text(json.dumps(rec, indent=1))
    return 0


def run(svc: OffloadService, batch: list[CallInfo], together: bool) -> dict:
    lat: list[float] = []
    parts: list[dict[str, float]] = []
    chans = []
    errs: list[str] = []
    mu = threading.Lock()
    go = threading.Barrier(len(batch) if together else 1)

    def one(c: CallInfo) -> None:
        go.wait()
        t = time.monotonic()
        timing: dict[str, float] = {}
        try:
            ch, _ = svc.offload(c, pppd_pid=c.pppd_pid, timing=timing)
        except Exception as e:  # reported, not raised: the round goes on
            with mu:
                errs.append(f"{c.call_id}: {e}")
            return
        with mu:
            lat.append(time.monotonic() - t)
            parts.append(timing)
            chans.append(ch)

    t0 = time.monotonic()
    if together:
        threads = [threading.Thread(target=one, args=(c,)) for c in batch]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    else:
        for c in batch:
            one(c)
    wall = time.monotonic() - t0
    dropped = drop_all(svc)
    for ch in chans:
        ch.close()
    out = summary(lat, parts, wall) if lat else {"n": 0}
    out["drop_all_s"] = round(dropped, 3)
    out["errors"] = errs[:5]
    out["failed"] = len(errs)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--k", default="25,100")
    p.add_argument("--rounds", type=int, default=2, help="storm rounds per K (the sequential round runs once)")
    p.add_argument("--profile", action="store_true", help="cProfile the sequential round")
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "servicestorm.json"))
    a = p.parse_args()
    setup()
    d = tempfile.mkdtemp()
    disc = Discovery([], proc=False, kernel=False)
    watch = CallWatch(disc, checkpoint_path=os.path.join(d, "discovery.json"))
    dp = KernelDataPath()
    svc = OffloadService(watch, NetlinkBackend(), dp, state_path=os.path.join(d, "state.json"))
    rec: dict = {"tag": a.tag, "kernel": os.uname().release, "rounds": []}
    base = 0
    for k in (int(x) for x in a.k.split(",")):
        for r in range(a.rounds):
            row = {"k": k, "mode": "storm", "round": r + 1, **run(svc, calls(k, base), together=True)}
            base += k
            rec["rounds"].append(row)
            print(json.dumps(row), flush=True)
        prof = cProfile.Profile() if a.profile else None
        if prof:
            prof.enable()
        row = {"k": k, "mode": "sequential", **run(svc, calls(k, base), together=False)}
        base += k
        if prof:
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
            row["profile"] = s.getvalue()
            print(s.getvalue(), flush=True)
        rec["rounds"].append(row)
        print(json.dumps({x: y for x, y in row.items() if x != "profile"}), flush=True)
    return finish(dp, rec, a.out)


if __name__ == "__main__":
    sys.exit(main())
