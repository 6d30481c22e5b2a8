"""`make bench`: boot the guest once, run the data-plane benchmark there, and
write bench/results/<date>.json and .md (min/median/max and ratios).

Benchmarks, not tests: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipexctl.testing.vm import VMError, run_in_guest  # noqa: E402

LABELS = {
    "a-veth": "(a) bare veth, MTU 1400, TSO/GSO off",
    "b-xl2tpd-pty": "(b) xl2tpd userspace mode (pty)",
    "c-xl2tpd-kernel": "(c) xl2tpd kernel mode (pppol2tp.so)",
    "d-pipexctl": "(d) pipexctl offload of userspace-mode xl2tpd",
}


def table(res: dict) -> str:
    rows = ["| case | forward min / median / max (Mbit/s) | reverse median |", "|---|---|---|"]
    med = {}
    for case, r in res["cases"].items():
        if "forward" not in r:
            rows.append(f"| {LABELS.get(case, case)} | error: {r.get('error')} | |")
            continue
        f = r["forward"]
        med[case] = statistics.median(f)
        rows.append(f"| {LABELS.get(case, case)} | {min(f):.1f} / {med[case]:.1f} / {max(f):.1f} | "
                    f"{statistics.median(r['reverse']):.1f} |")
    out = [f"Guest: kernel {res['kernel']}, {res['cpus']} vCPUs (QEMU TCG); iperf3 TCP {res['seconds']} s, "
           f"{len(next(iter(res['cases'].values())).get('forward', []))} runs per case, one boot.", "", *rows, ""]
    ratios = [("d / b (target >= 10)", "d-pipexctl", "b-xl2tpd-pty"), ("d / c (target >= 0.95)", "d-pipexctl", "c-xl2tpd-kernel"),
              ("c / a (target >= 0.7)", "c-xl2tpd-kernel", "a-veth"), ("d / a (target >= 0.7)", "d-pipexctl", "a-veth")]
    for name, x, y in ratios:
        if x in med and y in med and med[y]:
            out.append(f"- {name}: {med[x] / med[y]:.2f}")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10)
    a = p.parse_args()
    try:
        r = run_in_guest([sys.executable, "bench/dataplane.py", "--runs", str(a.runs), "--seconds", str(a.seconds)],
                         cwd=str(ROOT), keep_results=True, progress=True, timeout=3000)
    except VMError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 125
    src = r.results_dir / "dataplane.json"
    if r.returncode != 0 or not src.exists():
        print(f"bench: the guest run failed (status {r.returncode})", file=sys.stderr)
        return 1
    res = json.loads(src.read_text())
    stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H%M")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stamp}.json").write_text(json.dumps(res, indent=1))
    md = table(res)
    (out / f"{stamp}.md").write_text(md)
    shutil.rmtree(r.results_dir, ignore_errors=True)
    print(md)
    print(f"written: bench/results/{stamp}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
