"""Churn: many connect/disconnect cycles of offloaded calls, then count leaks.

Runs in the guest (real xl2tpd, pppd, plugin, `pipexctl serve` per
namespace).  Each round brings up one call per [lac] section of every LAC
at once, checks each is a kernel session, then ends them all one way:

- ``lac-disconnect``: the LAC's xl2tpd drops the tunnel (control pipe ``d``);
- ``lns-hangup``:     the LNS's xl2tpd hangs up each call (control pipe ``h``);
                      once those are gone, the LACs drop the empty tunnels;
- ``pppd-kill``:      kill -9 of every LNS pppd.

Between rounds every namespace must hold no session, PPPoL2TP session,
steering rule or PPP link; at the end (all tunnels dropped) no tunnel
either, and each daemon no more fds than at its start.  All counts come from
iproute2, /proc/net/pppol2tp, nft and /proc/<pid>/fd, not from pipexctl.

    python -m pipexctl.testing.churn --cycles 1000 --json churn.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

from .lab import Lab, fd_kinds, kernel_objects, open_fds, plugin_options
from .probe import ppp_inet_links, wait_until

# lns-hangup last: a redial after LNS hang-ups can hit xl2tpd 1.3.18's own
# control-sequence bug (see below), which an 18-cycle CI run must not depend on
KINDS = ("lac-disconnect", "pppd-kill", "lns-hangup")


def _wait(pred: Callable[[], object], what: str, lab: Lab, timeout: float) -> None:
    wait_until(pred, what, timeout, detail=lambda: lab.tails(800), interval=0.2)


def _ppp_up(ns: str) -> int:
    return len(ppp_inet_links(ns))


def _no_calls(inst_objects: dict[str, int]) -> bool:
    """No call left in the kernel: tunnels may stay (xl2tpd keeps them), and
    with them the steering of twins (a second tunnel per address pair)."""
    o = inst_objects
    return all(v == 0 for k, v in o.items() if k not in ("tunnels", "nft_rules")) and (o["tunnels"] > 0 or not o["nft_rules"])


def churn(cycles: int, lacs: int = 2, sections: int = 5, kinds: tuple[str, ...] = KINDS,
          progress: Callable[[str], None] | None = None, max_seconds: float | None = None) -> dict[str, Any]:
    """Run at least ``cycles`` call cycles; return the counts (see module doc).

    ``max_seconds``: start no new round after that long (the report then
    says ``"stopped_early"`` and still counts what is left at the end).

    Raises AssertionError (with every log's tail) on the first round that
    does not come up or does not clean up."""
    progress = progress or (lambda msg: None)
    per_round = lacs * sections
    rounds = max(1, -(-cycles // per_round))
    lab = Lab(kernel_mode=False, sections=sections).setup(lacs)
    insts = [lab.lns, *lab.lacs]
    report: dict[str, Any] = {"lacs": lacs, "sections": sections, "rounds": 0, "cycles": 0,
                    "faults": {k: 0 for k in kinds}, "round_seconds": []}
    try:
        lab.start_all(plugin_options() + "pipexctl_timeout 30\n")
        serves = lab.serve_all(None, "--wait", "30")
        time.sleep(6)  # one periodic reconcile (opens discovery's netlink socket) before the baseline
        report["fds_at_start"] = {i.name: open_fds(p.pid) for i, p in zip(insts, serves)}
        kinds0 = {i.name: fd_kinds(p.pid) for i, p in zip(insts, serves)}
        report["objects_at_start"] = {i.name: kernel_objects(i.ns) for i in insts}
        offsets = {lac.name: lac.log.stat().st_size for lac in lab.lacs}
        established = 0
        report["stopped_early"] = False
        t_start = time.monotonic()
        for r in range(rounds):
            if max_seconds is not None and time.monotonic() - t_start > max_seconds:
                report["stopped_early"] = True
                progress(f"time budget of {max_seconds:.0f} s spent: stopping after {report['cycles']} cycles")
                break
            kind = kinds[r % len(kinds)]
            t0 = time.monotonic()
            for section in lab.section_names():
                for lac in lab.lacs:
                    lab.control(lac, f"c {section}")
            established += sections
            for lac in lab.lacs:
                lab.wait_log(lac, "Call established", offset=offsets[lac.name], count=established, timeout=120)
            _wait(lambda: _ppp_up(lab.lns.ns) == per_round and all(_ppp_up(lac.ns) == sections for lac in lab.lacs),
                  f"round {r}: {per_round} PPP links up", lab, 180)
            got = kernel_objects(lab.lns.ns)
            if got["sessions"] != per_round or got["pppol2tp_sessions"] != per_round:
                raise AssertionError(f"round {r}: {per_round} calls up but the LNS kernel holds {got}")
            if kind == "lac-disconnect":
                for section in lab.section_names():
                    for lac in lab.lacs:
                        lab.disconnect(lac, section)
            elif kind == "lns-hangup":
                out = subprocess.run(["ip", "-n", lab.lns.ns, "l2tp", "show", "session"], capture_output=True,
                                     text=True).stdout
                for line in out.splitlines():
                    if line.startswith("Session "):
                        lab.control(lab.lns, f"h {line.split()[1]}")
            else:
                for pid in lab.pppds(lab.lns):
                    os.kill(pid, signal.SIGKILL)
            _wait(lambda: all(_no_calls(kernel_objects(i.ns)) for i in insts) and not lab.pppds(lab.lns)
                  and not any(lab.pppds(lac) for lac in lab.lacs), f"round {r} ({kind}): everything gone", lab, 180)
            if kind == "lns-hangup":
                # the LACs then drop the tunnels left without calls: a new call on
                # such a tunnel hits xl2tpd 1.3.18's own sequence-number bug
                # ("Received out of order control packet ... got 3, expected 4",
                # then "Maximum retries exceeded"; xelerance/xl2tpd#136, #156),
                # seen here when the next round dialled on those tunnels
                for section in lab.section_names():
                    for lac in lab.lacs:
                        lab.disconnect(lac, section)
                _wait(lambda: all(kernel_objects(i.ns)["tunnels"] == 0 for i in insts),
                      f"round {r}: tunnels gone after the hang-ups", lab, 180)
            report["faults"][kind] += per_round
            report["rounds"] += 1
            report["cycles"] += per_round
            report["round_seconds"].append(round(time.monotonic() - t0, 1))
            progress(f"round {r + 1}/{rounds} ({kind}): {report['cycles']} cycles, "
                     f"{report['round_seconds'][-1]} s")
        # the tunnels xl2tpd still has (after hang-ups) go too
        for section in lab.section_names():
            for lac in lab.lacs:
                lab.disconnect(lac, section)
        _wait(lambda: all(all(v == 0 for v in kernel_objects(i.ns).values()) for i in insts),
              "every tunnel gone at the end", lab, 180)
        time.sleep(6)  # the daemons' next periodic reconcile
        report["objects_at_end"] = {i.name: kernel_objects(i.ns) for i in insts}
        report["fds_at_end"] = {i.name: open_fds(p.pid) for i, p in zip(insts, serves)}
        kinds1 = {i.name: fd_kinds(p.pid) for i, p in zip(insts, serves)}
        report["fds_grown_by_kind"] = {n: {k: v - kinds0[n].get(k, 0) for k, v in kinds1[n].items()
                                           if v > kinds0[n].get(k, 0)} for n in kinds1}
        report["leaked"] = {
            "objects": sum(v for o in report["objects_at_end"].values() for v in o.values()),
            "fds": sum(max(0, report["fds_at_end"][n] - report["fds_at_start"][n]) for n in report["fds_at_end"]),
        }
        report["stats"] = {i.name: lab.serve_status(i)["stats"] for i in insts}
        return report
    finally:
        lab.teardown(keep_as="churn")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--lacs", type=int, default=2)
    ap.add_argument("--sections", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no new round after this long; the leak count still runs")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated round kinds, cycled in this order (default: {','.join(KINDS)})")
    ap.add_argument("--json", metavar="FILE", help="default: churn.json in $PIPEXCTL_RESULTS (the guest's results)")
    a = ap.parse_args(argv)
    kinds = tuple(k for k in a.kinds.split(",") if k)
    if not kinds or set(kinds) - set(KINDS):
        ap.error(f"--kinds: choose from {', '.join(KINDS)}")
    t0 = time.monotonic()
    rep = churn(a.cycles, a.lacs, a.sections, kinds, progress=lambda m: print(f"churn: {m}", flush=True),
                max_seconds=a.max_seconds)
    rep["seconds"] = round(time.monotonic() - t0, 1)
    text = json.dumps(rep, indent=2)
    out = a.json or (os.path.join(os.environ["PIPEXCTL_RESULTS"], "churn.json")
                     if os.environ.get("PIPEXCTL_RESULTS") else None)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text)
    ok = rep["leaked"] == {"objects": 0, "fds": 0}
    print(f"churn: {rep['cycles']} cycles{' (stopped early: time budget)' if rep['stopped_early'] else ''}, leaked objects {rep['leaked']['objects']}, fds {rep['leaked']['fds']}: "
          f"{'ok' if ok else 'LEAK'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
