"""The live move as a benchmark, run inside the guest: one call up on its
pty on both sides (xl2tpd's userspace mode, the plugin loaded, no daemon),
an iperf3 transfer on it, then `pipexctl serve` started on both sides and
the call moved into the kernel while the transfer runs.  Per run: the
transfer's mean rate on the pty (before the daemons start) and in the
kernel (from a second after the move), their ratio, the time from the
daemons accepting to the move, and the one-second intervals without data.
Issue 18's target is a ratio of at least 10; the same code's rate on the
pty and in the kernel are measured side by side in one boot.  Not a test:
it asserts nothing.

    python -m pipexctl.testing.vm -- .venv/bin/python bench/livemove.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipexctl.testing.lab import Lab, iperf_server, plugin_options, wait_ppp  # noqa: E402

LNS_ADDR = "10.99.100.1"


def sessions(ns: str) -> int:
    out = subprocess.run(["ip", "-n", ns, "l2tp", "show", "session"], capture_output=True, text=True).stdout
    return out.count("Session ")


def one_run(before: float, after: float) -> dict[str, object]:
    lab = Lab(kernel_mode=False).setup(1)
    l1 = lab.lacs[0]
    try:
        lab.start_all(plugin_options(required=False))
        lab.connect(l1)
        if not (wait_ppp(lab.lns.ns) and wait_ppp(l1.ns)):
            return {"error": "PPP did not come up on its pty"}
        with iperf_server(lab.lns.ns, LNS_ADDR):
            t0 = time.monotonic()
            iperf = subprocess.Popen(["ip", "netns", "exec", l1.ns, "iperf3", "-c", LNS_ADDR, "-t", "300", "-i", "1",
                                      "-J"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(before)
            t_spawn = time.monotonic()
            lab.serve_all([lab.lns, l1])
            t_serving = time.monotonic()
            end = t_serving + 60
            while not (sessions(lab.lns.ns) == 1 == sessions(l1.ns)) and time.monotonic() < end:
                time.sleep(0.02)
            t_moved = time.monotonic()
            moved = t_moved < end
            time.sleep(after)
            iperf.send_signal(signal.SIGINT)
            out, _ = iperf.communicate(timeout=60)
        doc = json.loads(out)
        rates = [(iv["sum"]["start"], iv["sum"]["end"], iv["sum"]["bits_per_second"] / 1e6) for iv in doc["intervals"]]
        pty = [r for s, e, r in rates if e <= t_spawn - t0]
        kernel = [r for s, e, r in rates if s >= t_moved - t0 + 1]
        pty_m = statistics.mean(pty) if pty else 0.0
        kernel_m = statistics.mean(kernel) if kernel else 0.0
        row: dict[str, object] = {
            "moved": moved, "moved_after_serving_s": round(t_moved - t_serving, 2),
            "daemons_start_s": round(t_serving - t_spawn, 1), "pty_mbps": round(pty_m, 1),
            "kernel_mbps": round(kernel_m, 1), "zero_intervals": sum(1 for _, _, r in rates if r == 0),
            "intervals": rates}
        if pty_m and kernel:
            row["ratio"] = round(kernel_m / pty_m, 1)
        return row
    finally:
        lab.teardown()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--before", type=float, default=6.0, help="seconds of transfer on the pty before the daemons")
    p.add_argument("--after", type=float, default=10.0, help="seconds of transfer after the move")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "livemove.json"))
    a = p.parse_args()
    rows: list[dict[str, object]] = []
    for _ in range(a.runs):
        try:
            row = one_run(a.before, a.after)
        except Exception as e:  # one failed run is reported, the next still runs
            row = {"error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        print("livemove:", json.dumps({k: v for k, v in row.items() if k != "intervals"}), flush=True)
    Path(a.out).write_text(json.dumps({"runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
