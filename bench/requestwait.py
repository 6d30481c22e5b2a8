"""Requests waiting for their calls' log lines, as in a login storm: K
pppd requests ask the offload daemon's discovery (``CallWatch.call_of``)
for their calls before xl2tpd's lines naming them are in the log, and the
lines arrive spread out over time.  Runs on the host (no kernel needed):
what it times is discovery's side of a request, not the offload.

Each call's "pppd" is a process named pppd (a tiny C program forks K that
wait; their parent stands in for the LNS xl2tpd).  Request i starts at
``i * spread / K`` seconds; its ``Call established`` line is written
``lag`` seconds later.  Reported: the time from each line's write to its
request's answer (p50/p99/max), the process's CPU seconds over the round,
and how many times requests looked at the model (``CallWatch.looks``,
when the code counts them).  Not a test: it asserts nothing.  Compare
code with two trees in one run of the machine:

    .venv/bin/python bench/requestwait.py --k 100
    PYTHONPATH=/tmp/old:bench .venv/bin/python bench/requestwait.py --k 100
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from farm import call_lines, pppd_farm  # noqa: E402
from servicestorm import pct  # noqa: E402

from pipexctl.discovery.discovery import Discovery  # noqa: E402
from pipexctl.offload.watch import CallWatch, FdEvent  # noqa: E402


def round_(k: int, spread: float, lag: float, wait: float) -> dict:
    d = tempfile.mkdtemp()
    proc, pids = pppd_farm(k, d)
    try:
        log = Path(d) / "syslog"
        pre = f"Dec  5 06:00:00 lns xl2tpd[{proc.pid}]: "
        log.write_text(f"{pre}xl2tpd version xl2tpd-1.3.18 started on lns PID:{proc.pid}\n")
        watch = CallWatch(Discovery([str(log)], proc=False, kernel=False))
        watch.first_read()
        stop, reload = FdEvent(), FdEvent()
        watcher = threading.Thread(target=watch.run, args=(stop, reload), daemon=True,
                                   kwargs={"handle": lambda ev: None, "reloaded": lambda ev: None,
                                           "tick": lambda: None})
        watcher.start()
        written: dict[int, float] = {}
        answered: dict[int, float] = {}
        refused: list[str] = []
        t0 = time.monotonic() + 0.2

        def request(i: int) -> None:
            time.sleep(max(0.0, t0 + i * spread / k - time.monotonic()))
            call, why = watch.call_of(pids[i], wait)
            if call is None:
                refused.append(why)
            else:
                answered[i] = time.monotonic()

        def writer() -> None:
            with open(log, "a") as f:
                for i in range(k):
                    time.sleep(max(0.0, t0 + i * spread / k + lag - time.monotonic()))
                    f.write("".join(ln + "\n" for ln in call_lines(pre, "10.98", i, pids[i])))
                    f.flush()
                    written[i] = time.monotonic()

        cpu0, wall0 = time.process_time(), time.monotonic()
        threads = [threading.Thread(target=request, args=(i,)) for i in range(k)] + [threading.Thread(target=writer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        stop.set()
        watcher.join(5)
        lat = [answered[i] - written[i] for i in answered]
        return {"k": k, "spread_s": spread, "lag_s": lag, "answered": len(answered), "refused": len(refused),
                "refusals": sorted(set(refused))[:3], "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                "line_to_answer_p50_ms": pct(lat, 0.5) if lat else None,
                "line_to_answer_p99_ms": pct(lat, 0.99) if lat else None,
                "line_to_answer_max_ms": pct(lat, 1.0) if lat else None,
                "looks": getattr(watch, "looks", None)}
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--k", type=int, nargs="+", default=[100])
    p.add_argument("--spread", type=float, default=10.0, help="seconds over which the K requests arrive")
    p.add_argument("--lag", type=float, default=2.0, help="seconds from a request to its line")
    p.add_argument("--wait", type=float, default=30.0, help="a request's bound (the plugin's timeout)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    import pipexctl
    rec = {"code": os.path.dirname(pipexctl.__file__), "rounds": []}
    for _ in range(a.rounds):
        for k in a.k:
            r = round_(k, a.spread, a.lag, a.wait)
            print(json.dumps(r), flush=True)
            rec["rounds"].append(r)
    if a.out:
        Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
