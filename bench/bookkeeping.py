"""What one offload, one end and one request's lookup cost the daemon's own
bookkeeping with N calls already held (host; the null kernel backend and data path, so only the
daemon's Python is measured, not the kernel's work).

With 10,000 subscribers a daemon that did O(N) work per offload (say,
rebuilding its state file's records) would take O(N^2) to bring a rebooted
LNS's calls back: this measures the per-operation cost at N = 0, 1,000 and
10,000, for calls in tunnels of their own (remote-access clients, each its
own tunnel) and for calls in one tunnel (a LAC that concentrates them).

``--against REV`` runs the same measurement on another commit of this
repository (unpacked with ``git archive``) in the same run, the two
interleaved (new, old, old, new), so that the machine's drift cancels out.
The state file is written on tmpfs, as /run is in production.

    .venv/bin/python bench/bookkeeping.py --against HEAD~3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS = 200  # offloads (and then ends) measured at each N


def measure(n: int, layout: str, state_dir: str) -> dict:
    """In this process: fill a service with ``n`` calls, then time OPS offloads and OPS ends."""
    from pipexctl.discovery.discovery import Discovery
    from pipexctl.discovery.state import CallInfo
    from pipexctl.kernel.backend import NullBackend
    from pipexctl.offload.datapath import NullDataPath
    from pipexctl.offload.server import OffloadServer
    from pipexctl.offload.service import TunnelState
    from pipexctl.offload.statefile import SessionRecord

    srv = OffloadServer(os.path.join(state_dir, "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(),
                        NullDataPath(), state_path=os.path.join(state_dir, "state.json"))
    svc = srv.service

    def where(i: int) -> tuple[int, int, str]:  # (tunnel id, call id, peer) of call i
        if layout == "one-tunnel":
            return 1, i, "10.1.0.1"
        return i, 1, f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"

    # the calls held: put in as reconcile.py adopts them (no per-call offload: that is what is timed)
    for i in range(1, n + 1):
        tid, cid, peer = where(i)
        ts = svc.tunnels.get(("xl2tpd", tid))
        if ts is None:
            ts = TunnelState("xl2tpd", tid, tid, "127.0.0.1", peer, 1701, None, 1701)
            svc.tunnels[("xl2tpd", tid)] = ts
            svc.backend.tunnel_create(_spec(tid))
        ts.records[cid] = SessionRecord(call_id=cid, peer_call_id=cid, pppd_pid=100000 + i)
        svc.backend.session_create(_sspec(tid, cid))
    with svc.lock:
        svc.save()
    if layout == "one-tunnel" and n == 0:
        svc.offload(_call(CallInfo, 1, 60000, "10.1.0.1"), 1)[0].close()  # the tunnel the calls go into
    builds, offloads, ends = [], [], []
    new = [where(i) for i in range(n + 1, n + 1 + OPS)] if layout != "one-tunnel" else \
        [(1, 60001 - k, "10.1.0.1") for k in range(1, OPS + 1)]
    for tid, cid, peer in new:
        timing: dict = {}
        t = time.perf_counter()
        ch, _ = svc.offload(_call(CallInfo, tid, cid, peer), 200000 + cid, timing=timing)
        offloads.append(time.perf_counter() - t)
        builds.append(timing["build"])
        ch.close()
    for tid, cid, _ in new:
        t = time.perf_counter()
        with svc.lock:  # as the watcher's sweep ends a call whose pppd exited
            ts = svc.tunnels[("xl2tpd", tid)]
            svc._end_call(ts, cid, "ended (pppd exited)")
            svc._drop_when_empty(ts, "its last call ended")
            svc.save()
        ends.append(time.perf_counter() - t)
    held = sum(len(t.records) for t in svc.tunnels.values())
    size = os.path.getsize(os.path.join(state_dir, "state.json"))
    lookups = request_lookups(n, layout, state_dir)

    def ms(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {"p50": round(statistics.median(xs) * 1000, 3), "p99": round(xs[int(len(xs) * 0.99) - 1] * 1000, 3)}

    return {"n": n, "layout": layout, "held_after": held, "state_file_bytes": size,
            "offload_ms": ms(offloads), "under_lock_ms": ms(builds), "end_ms": ms(ends),
            "request_lookup_ms": ms(lookups)}


def request_lookups(n: int, layout: str, state_dir: str) -> list[float]:
    """A pppd's request finding its call among n known ones (CallWatch.call_of,
    its line already read): OPS lookups of calls spread over the n."""
    from pipexctl.discovery.discovery import Discovery
    from pipexctl.offload.watch import CallWatch

    log = os.path.join(state_dir, "xl2tpd.log")
    with open(log, "w") as f:
        f.write("xl2tpd[100]: xl2tpd version xl2tpd-1.3.18 started on lns PID:100\n")
        for i in range(1, n + 2):
            tid, cid = (1, i) if layout == "one-tunnel" else (i, i)  # xl2tpd's call ids are its own, per daemon
            peer = "10.1.0.1" if layout == "one-tunnel" else f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
            if layout != "one-tunnel" or i == 1:
                f.write(f"xl2tpd[100]: Connection established to {peer}, 1701.  Local: {tid}, Remote: {tid + 1} "
                        f"(ref=0/0).  LNS session is 'default'\n")
            f.write(f"xl2tpd[100]: Call established with {peer}, PID: {100000 + i}, Local: {cid}, "
                    f"Remote: {cid}, Serial: {i}\n")
    disc = Discovery([log], proc=False, kernel=False)
    disc.refresh(control=False, events=False)
    watch = CallWatch(disc)
    out = []
    for k in range(OPS):
        pid = 100000 + 1 + (k * 7919) % (n + 1)
        t = time.perf_counter()
        call, why = watch.call_of(pid, wait=0.0)
        out.append(time.perf_counter() - t)
        assert call is not None, why
    disc.close()
    return out


def _spec(tid: int):
    from pipexctl.model import TunnelSpec

    return TunnelSpec(tunnel_id=tid, peer_tunnel_id=tid, version=2, fd=0)


def _sspec(tid: int, cid: int):
    from pipexctl.model import PwType, SessionSpec

    return SessionSpec(tunnel_id=tid, session_id=cid, peer_session_id=cid, version=2, pw_type=PwType.ppp)


def _call(CallInfo, tid: int, cid: int, peer: str):
    return CallInfo(instance="xl2tpd", role="lns", peer=peer, peer_port=1701, tunnel_id=tid, peer_tunnel_id=tid,
                    call_id=cid, peer_call_id=cid, pppd_pid=200000 + cid, data_path="kernel")


def child(tree: str, n: int, layout: str) -> dict:
    """One measurement in a fresh process, on the code of ``tree``."""
    state_dir = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        r = subprocess.run([sys.executable, __file__, "--child", str(n), layout, state_dir], cwd=tree,
                           env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            raise RuntimeError(f"{tree} n={n}: {r.stderr.strip()[-800:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def unpack(rev: str) -> str:
    d = tempfile.mkdtemp(prefix="pipexctl-bench-")
    data = subprocess.run(["git", "archive", rev, "pipexctl"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(data)) as t:
        t.extractall(d, filter="data")
    return d


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="0,1000,10000")
    p.add_argument("--layouts", default="own-tunnel,one-tunnel")
    p.add_argument("--against", default=None, help="another commit to measure beside this tree")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "bookkeeping"
                                       / time.strftime("%Y-%m-%dT%H%M-bookkeeping.json")))
    p.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(measure(int(a.child[0]), a.child[1], a.child[2])))
        return 0
    trees = {"this tree": str(ROOT)}
    if a.against:
        rev = subprocess.run(["git", "rev-parse", "--short", a.against], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        trees[rev] = unpack(a.against)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    rows = []
    try:
        for layout in a.layouts.split(","):
            for n in [int(x) for x in a.sizes.split(",")]:
                order = list(trees) + list(reversed(trees))  # new, old, old, new
                for name in order:
                    r = child(trees[name], n, layout)
                    r["code"] = name
                    rows.append(r)
                    print(f"{layout:10} n={n:6} {name:10} offload p50 {r['offload_ms']['p50']:8.3f} ms "
                          f"(under the lock {r['under_lock_ms']['p50']:8.3f})  end p50 {r['end_ms']['p50']:8.3f} ms  "
                          f"request lookup p50 {r['request_lookup_ms']['p50']:7.3f} ms  "
                          f"state file {r['state_file_bytes']} B", flush=True)
    finally:
        for tree in trees.values():
            if tree != str(ROOT):
                shutil.rmtree(tree, ignore_errors=True)
    rec = {"bench": "bookkeeping", "head": head.strip(), "dirty": bool(subprocess.run(
        ["git", "status", "--porcelain", "pipexctl"], cwd=ROOT, capture_output=True, text=True).stdout.strip()),
        "host": os.uname().nodename, "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "ops_per_point": OPS, "against": a.against, "rows": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
    print("record:", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
