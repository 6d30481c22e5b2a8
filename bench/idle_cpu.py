"""What a quiet `pipexctl serve` costs: CPU ticks and wake-ups (context
switches) of the two daemons (LNS, LAC) holding one offloaded call, over
60 s with no traffic, once with the default options and once with the
/proc and kernel scans off (--reconcile-interval 3600); and the wake-ups
of the call's two pppds (the plugin's timer, which reads the control link,
and pppd's own LCP echoes).  Not a test: it prints figures.  Run it in the
guest:

    .venv/bin/python -m pipexctl.testing.vm -- .venv/bin/python bench/idle_cpu.py
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipexctl.testing.lab import Lab, plugin_options, wait_ppp  # noqa: E402


def ticks(pid: int) -> int:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def switches(pid: int) -> int:
    tot = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        for line in open(f"/proc/{pid}/task/{t}/status"):
            if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                tot += int(line.split()[1])
    return tot


def main() -> None:
    for extra in ([], ["--reconcile-interval", "3600"]):
        lab = Lab().setup(1)
        try:
            lab.write_configs(plugin_options())
            lac = lab.lacs[0]
            lab.start(lab.lns)
            lab.start(lac)
            lab.serve(lab.lns, *extra)
            lab.serve(lac, *extra)
            lab.connect(lac)
            assert wait_ppp(lab.lns.ns) and wait_ppp(lac.ns)
            time.sleep(8)  # past the 5 s of activity after the call's events
            pids = [p.pid for p in lab.serves]
            pppds = lab.pppds(lab.lns) + lab.pppds(lac)
            t0, c0, w0 = [ticks(p) for p in pids], [switches(p) for p in pids + pppds], time.monotonic()
            time.sleep(60)
            dt = time.monotonic() - w0
            woke = [round((switches(p) - a) / dt, 2) for p, a in zip(pids + pppds, c0)]
            print(" ".join(extra) or "defaults", "| CPU ticks a minute (LNS, LAC):",
                  [round((ticks(p) - a) * 60 / dt) for p, a in zip(pids, t0)],
                  "| wake-ups a second:", woke[:2], "| their pppds' wake-ups a second:", woke[2:], flush=True)
        finally:
            lab.teardown()


if __name__ == "__main__":
    main()
