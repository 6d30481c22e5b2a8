"""Where the data plane's CPU goes: a kernel profile of one iperf3 run per
case, inside the guest (``make bench-profile``; not part of ``make bench``).

For each case (default (c) xl2tpd kernel mode and (d) pipexctl offload)
this brings the lab up as ``bench/dataplane.py`` does, records
``perf record -a -g`` (cpu-clock: TCG has no PMU) over one iperf3 TCP run,
and writes the top symbols by self time, the nftables rule counters and
the conntrack state of both namespaces to $PIPEXCTL_RESULTS/profile-<case>.txt.

Needs linux-perf (Debian's /usr/bin/perf runs the perf of the running
kernel's major version, 6.1 here); it is not installed by ``make setup``.

    python -m pipexctl.testing.vm -- .venv/bin/python bench/profile_dp.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dataplane import bring_up, sh  # noqa: E402
from pipexctl.testing.lab import iperf  # noqa: E402


def conntrack(ns: str) -> str:
    mods = [ln.split()[0] for ln in open("/proc/modules") if "conntrack" in ln.split()[0]]
    cnt = sh("ip", "netns", "exec", ns, "cat", "/proc/sys/net/netfilter/nf_conntrack_count")
    return f"modules loaded: {' '.join(mods) or 'none'}; {ns} nf_conntrack_count: {cnt}"


def profile(case: str, seconds: int, out: Path) -> float:
    lab, lac, addr = bring_up(case)
    try:
        data = out / f"perf-{case}.data"
        rec = subprocess.Popen(["perf", "record", "-a", "-g", "-e", "cpu-clock", "-F", "499", "-o", str(data),
                                "--", "sleep", str(seconds + 2)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        mbit = iperf(lab.lns.ns, lac.ns, addr, seconds)
        _, err = rec.communicate()
        report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "sym",
                                 "-g", "none", "--percent-limit", "0.7"], capture_output=True, text=True).stdout
        comm = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "comm",
                               "-g", "none", "--percent-limit", "1"], capture_output=True, text=True).stdout
        text = [f"case {case}: iperf3 {seconds} s forward {mbit:.1f} Mbit/s", conntrack(lab.lns.ns),
                conntrack(lac.ns)]
        for ns in (lab.lns.ns, lac.ns):
            text.append(f"--- nft list ruleset ({ns})\n" + sh("ip", "netns", "exec", ns, "nft", "list", "ruleset"))
        text += ["--- perf record: " + err.decode(errors="replace").strip()[-300:],
                 "--- by command", _strip(comm), "--- by symbol (self)", _strip(report)]
        (out / f"profile-{case}.txt").write_text("\n".join(text) + "\n")
        data.unlink(missing_ok=True)
        return mbit
    finally:
        lab.teardown()


def _strip(report: str) -> str:
    return "\n".join(ln for ln in report.splitlines() if ln.strip() and not ln.startswith("#"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="c-xl2tpd-kernel,d-pipexctl")
    p.add_argument("--seconds", type=int, default=10)
    a = p.parse_args()
    if shutil.which("perf") is None:
        print("profile_dp: perf is not installed (apt-get install linux-perf)", file=sys.stderr)
        return 2
    out = Path(os.environ.get("PIPEXCTL_RESULTS", "."))
    for case in a.cases.split(","):
        mbit = profile(case, a.seconds, out)
        print(f"{case}: {mbit:.1f} Mbit/s, profile in {out / f'profile-{case}.txt'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
