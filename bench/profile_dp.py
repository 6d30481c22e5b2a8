"""Where the data plane's CPU goes, inside the guest (``make bench-profile``;
not part of ``make bench``).

Default: for each case (default (c) xl2tpd kernel mode and (d) pipexctl
offload) bring the lab up as ``bench/dataplane.py`` does, record
``perf record -a -g`` (cpu-clock: TCG has no PMU) over one iperf3 TCP run,
and write the top symbols by self time, the nftables rules with their
counters and the conntrack state of both namespaces to
$PIPEXCTL_RESULTS/profile-<case>.txt.  Measured caveat: under TCG 94-99 %
of the cpu-clock samples land in ``native_safe_halt`` although the guest
is 120-130 % busy, so the symbol list says little; the per-command split
still shows the daemons' share.

``--paused-daemons N``: case (d) only, iperf3 N times with its two
``pipexctl serve`` daemons running and N times with them stopped
(SIGSTOP, alternating): the daemons' own share of (d)'s cost.

``--steer-rules N``: case (c) only, iperf3 N times without and N times with
an nft table in both namespaces that does to (c)'s L2TP packets what
pipexctl's steering rules do to (d)'s (the same matches on addresses,
ports, header bits and ids; a port rewrite, checksum cleared, notrack) but
leaves them going where they went (the port is rewritten to the one it
had), alternating: the price of the steering rules alone, without the
rest of (d).

Needs linux-perf for the default mode (Debian's /usr/bin/perf; not
installed by ``make setup``).

    python -m pipexctl.testing.vm -- .venv/bin/python bench/profile_dp.py [--paused-daemons 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
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


def paused_daemons(seconds: int, runs: int, out: Path) -> str:
    """Case (d) with its two `pipexctl serve` daemons running, then stopped
    (SIGSTOP; the kernel carries the offloaded session without them),
    alternating: how much of (d)'s gap to (c) is the daemons' own CPU."""
    lab, lac, addr = bring_up("d-pipexctl")
    try:
        live, paused = [], []
        for _ in range(runs):
            live.append(iperf(lab.lns.ns, lac.ns, addr, seconds))
            for p in lab.serves:
                os.killpg(p.pid, signal.SIGSTOP)
            try:
                paused.append(iperf(lab.lns.ns, lac.ns, addr, seconds))
            finally:
                for p in lab.serves:
                    os.killpg(p.pid, signal.SIGCONT)
        text = (f"case d-pipexctl, iperf3 {seconds} s forward, alternating: daemons running {_series(live)} Mbit/s; "
                f"daemons stopped {_series(paused)} Mbit/s")
        (out / "paused-daemons.txt").write_text(text + "\n")
        return text
    finally:
        lab.teardown()


def equal_rules(local: str, peer: str, tid: int, sid: int) -> str:
    """An nft table doing (d)'s per-packet steering work (see
    pipexctl.offload.steering) to (c)'s packets, without changing where they go."""
    ids = f"0x{tid:04x}{sid:04x}"
    m = f"ip saddr {peer} ip daddr {local} udp sport 1701 udp dport 1701 @th,64,8 & 0x80 == 0x0"
    return (f"table ip pxequal {{\n chain pre {{\n  type filter hook prerouting priority raw; policy accept;\n"
            f"  {m} @th,64,8 & 0x40 == 0x0 @th,80,32 {ids} counter udp dport set 1701 udp checksum set 0 notrack\n"
            f"  {m} @th,64,8 & 0x40 == 0x40 @th,96,32 {ids} counter udp dport set 1701 udp checksum set 0 notrack\n"
            f" }}\n chain out {{\n  type filter hook output priority raw; policy accept;\n"
            f"  ip saddr {local} ip daddr {peer} udp sport 1701 udp dport 1701 counter udp sport set 1701 "
            f"udp checksum set 0 notrack\n }}\n}}\n")


def steer_rules(seconds: int, runs: int, out: Path) -> str:
    """Case (c) without and with equal_rules() in both namespaces, alternating."""
    import re

    lab, lac, addr = bring_up("c-xl2tpd-kernel")
    try:
        ends = []
        for ns, local, peer in ((lab.lns.ns, "10.99.1.1", "10.99.1.2"), (lac.ns, "10.99.1.2", "10.99.1.1")):
            # xl2tpd's kernel mode also holds a session 0 (its tunnel's management socket): the call's is not 0
            got = [(int(t), int(sid)) for sid, t in re.findall(r"Session (\d+) in tunnel (\d+)",
                                                               sh("ip", "-n", ns, "l2tp", "show", "session"))
                   if int(sid) != 0]
            if len(got) != 1:
                raise RuntimeError(f"{ns}: expected one call's kernel session, found {got}")
            ends.append((ns, equal_rules(local, peer, *got[0])))
        bare, ruled = [], []
        counters = ""
        for _ in range(runs):
            bare.append(iperf(lab.lns.ns, lac.ns, addr, seconds))
            for ns, rules in ends:
                r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, capture_output=True,
                                   text=True)
                if r.returncode:
                    raise RuntimeError(f"nft in {ns}: {r.stderr.strip()}")
            try:
                ruled.append(iperf(lab.lns.ns, lac.ns, addr, seconds))
                counters = "\n".join(sh("ip", "netns", "exec", ns, "nft", "list", "table", "ip", "pxequal")
                                     for ns, _ in ends)
            finally:
                for ns, _ in ends:
                    sh("ip", "netns", "exec", ns, "nft", "delete", "table", "ip", "pxequal")
        # in each namespace the pre rule without the L bit and the out rule carry the data (the L-bit rule: none)
        busy = [ln for ln in counters.splitlines() if "counter packets" in ln and "0x40 == 0x40" not in ln]
        if len(busy) != 4 or any(" packets 0 " in ln for ln in busy):
            raise RuntimeError("the equal rules did not match (c)'s data packets:\n" + counters)
        text = (f"case c-xl2tpd-kernel, iperf3 {seconds} s forward, alternating: as is {_series(bare)} Mbit/s; "
                f"with (d)'s steering work in nft {_series(ruled)} Mbit/s")
        (out / "steer-rules.txt").write_text(text + "\n--- the rules and their counters after the last run\n"
                                              + counters + "\n")
        return text
    finally:
        lab.teardown()


def _series(xs: list[float]) -> str:
    """Each run and the median, as the alternating experiments report them."""
    return f"{', '.join(f'{x:.1f}' for x in xs)} (median {statistics.median(xs):.1f})"


def _strip(report: str) -> str:
    return "\n".join(ln for ln in report.splitlines() if ln.strip() and not ln.startswith("#"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="c-xl2tpd-kernel,d-pipexctl")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--paused-daemons", type=int, default=0, metavar="RUNS",
                   help="only measure (d) with its daemons running and stopped, alternating, RUNS times each")
    p.add_argument("--steer-rules", type=int, default=0, metavar="RUNS",
                   help="only measure (c) without and with the first data path's per-session nft steering work, "
                        "alternating, RUNS times each")
    a = p.parse_args()
    out = Path(os.environ.get("PIPEXCTL_RESULTS", "."))
    if a.steer_rules:
        print(steer_rules(a.seconds, a.steer_rules, out), flush=True)
        return 0
    if a.paused_daemons:
        print(paused_daemons(a.seconds, a.paused_daemons, out), flush=True)
        return 0
    if shutil.which("perf") is None:
        print("profile_dp: perf is not installed (apt-get install linux-perf)", file=sys.stderr)
        return 2
    for case in a.cases.split(","):
        mbit = profile(case, a.seconds, out)
        print(f"{case}: {mbit:.1f} Mbit/s, profile in {out / f'profile-{case}.txt'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
