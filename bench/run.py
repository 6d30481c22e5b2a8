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
import subprocess
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipexctl.testing.vm import VMError, flavour, run_in_guest  # noqa: E402

LABELS = {
    "a-veth": "(a) bare veth, MTU 1400, TSO/GSO off",
    "b-xl2tpd-pty": "(b) xl2tpd userspace mode (pty)",
    "c-xl2tpd-kernel": "(c) xl2tpd kernel mode (pppol2tp.so)",
    "d-pipexctl": "(d) pipexctl offload of userspace-mode xl2tpd",
    "b-xl2tpd-pty-stock": "(b) pty, pppd's stock options",
    "d-pipexctl-stock": "(d) pipexctl, pppd's stock options",
    "b-xl2tpd-pty-esp": "(b) pty, under ESP",
    "c-xl2tpd-kernel-esp": "(c) xl2tpd kernel mode, under ESP",
    "d-pipexctl-esp": "(d) pipexctl, under ESP",
}


BASE_CASES = ("a-veth", "b-xl2tpd-pty", "c-xl2tpd-kernel", "d-pipexctl")


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
    ratios = [("d / b (target >= 15)", "d-pipexctl", "b-xl2tpd-pty"), ("d / c (target >= 0.95)", "d-pipexctl", "c-xl2tpd-kernel"),
              ("c / a (target >= 0.7)", "c-xl2tpd-kernel", "a-veth"), ("d / a (target >= 0.7)", "d-pipexctl", "a-veth"),
              ("stock options: d / b (target >= 10)", "d-pipexctl-stock", "b-xl2tpd-pty-stock"),
              ("stock options: d / d with the lab's options", "d-pipexctl-stock", "d-pipexctl"),
              ("under ESP: d / c (target >= 0.95)", "d-pipexctl-esp", "c-xl2tpd-kernel-esp"),
              ("under ESP: d / b (target >= 4)", "d-pipexctl-esp", "b-xl2tpd-pty-esp")]
    for name, x, y in ratios:
        if x in med and y in med and med[y]:
            out.append(f"- {name}: {med[x] / med[y]:.2f}")
    return "\n".join(out) + "\n"


def scale_table(res: dict) -> str:
    sc = res.get("scale") or {}
    if not sc:
        return ""
    cols = [("c-xl2tpd-kernel/sessions", "(c) sessions"), ("d-pipexctl/sessions", "(d) sessions"),
            ("c-xl2tpd-kernel/tunnels", "(c) tunnels"), ("d-pipexctl/tunnels", "(d) tunnels")]
    sizes = sorted({int(n) for col, _ in cols for n in sc.get(col, {}) if n.isdigit()})
    out = ["", "Scale: one call's forward Mbit/s (median of every run of both passes; passes in the order "
           "(c), (d), (d), (c)) with N other sessions in its tunnel, or N other tunnels' sockets on the LNS's "
           "UDP/1701 (each connected to its own peer address); serve daemons running:", "",
           "| N | " + " | ".join(label for _, label in cols) + " |", "|---|" + "---|" * len(cols)]
    for n in sizes:
        cells = []
        for col, _ in cols:
            r = sc.get(col, {}).get(str(n))
            cells.append(f"{r['median']:.1f}" if r else "-")
        out.append(f"| {n:,} | " + " | ".join(cells) + " |")
    out += ["", "Each pass's own median, and the two serve daemons' CPU seconds while one pass measured:", "",
            "| N | " + " | ".join(label for _, label in cols) + " | (d) serve CPU s, sessions / tunnels |",
            "|---|" + "---|" * (len(cols) + 1)]
    for n in sizes:
        cells = []
        for col, _ in cols:
            r = sc.get(col, {}).get(str(n))
            cells.append(" / ".join(f"{m:.1f}" for m in r.get("passes", [])) if r else "-")
        cpu = [" + ".join(f"{c:.1f}" for c in sc.get(col, {}).get(str(n), {}).get("serve_cpu_seconds", [])) or "-"
               for col in ("d-pipexctl/sessions", "d-pipexctl/tunnels")]
        out.append(f"| {n:,} | " + " | ".join(cells) + f" | {cpu[0]} / {cpu[1]} |")
    for col, _ in cols:
        if sc.get(col, {}).get("error"):
            out.append(f"- {col}: error: {sc[col]['error']}")
    d = sc.get("d-pipexctl/sessions", {})
    if "0" in d and str(max(sizes)) in d and d["0"]["median"]:
        out.append(f"\n- (d) sessions, N = {max(sizes):,} / N = 0 (target >= 0.9): "
                   f"{d[str(max(sizes))]['median'] / d['0']['median']:.2f}")
    dt, ct = sc.get("d-pipexctl/tunnels", {}), sc.get("c-xl2tpd-kernel/tunnels", {})
    both = [n for n in sizes if str(n) in dt and str(n) in ct and ct[str(n)]["median"]]
    if both:
        out.append("- (d) tunnels / (c) tunnels at each N (target >= 1): " + ", ".join(
            f"{n:,}: {dt[str(n)]['median'] / ct[str(n)]['median']:.2f}" for n in both))
    return "\n".join(out) + "\n"


def _head(title: str, cols: list[str]) -> list[str]:
    """The first lines of a titled markdown table."""
    return ["", title, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def storm_table(st: dict) -> str:
    rows = st.get("rows") or []
    if not rows:
        return ""
    out = _head("Login storm (`bench/loginstorm.py`): K calls dialled at once, one per LAC namespace, against one "
                "LNS; the LACs in xl2tpd's kernel mode in both rounds:",
                ["K", "(c) kernel mode: all up, s", "(d) pipexctl: all up and offloaded, s", "d / c (target <= 1.2)",
                 "request -> channel p50 / p99 / max ms (n)", "(d) the daemon: RSS MiB at the end, CPU s"])
    by = {(r["k"], r["case"]): r for r in rows}
    with_c = {r["k"] for r in rows if r.get("case") == "c-xl2tpd-kernel"}

    def up(r: dict, secs: Optional[float], k: int) -> str:
        if secs:
            return f"{secs:.1f}"
        if r.get("error"):
            return r["error"]
        if "links_up" not in r:
            return "not all up"
        # a round that lost calls: how long the others took (offloaded_at: pipexctl's, up and in the kernel)
        at = [max(x) for x in zip(r["up_at"], r["offloaded_at"])] if "offloaded_at" in r else r.get("up_at")
        n = r.get("tunnel_id_clashes")  # xl2tpd's own loss, in either mode (bench/loginstorm.py)
        return f"not all up: {r['links_up']} of {k}" + (f", {len(at)} by {at[-1]:.1f}" if at else "") + \
            (f" ({n} tunnel id clash{'es' if n > 1 else ''} in xl2tpd)" if n else "")

    for k in sorted(with_c or {r["k"] for r in rows}):  # the scrape rows' K has no (c)
        c, d = by.get((k, "c-xl2tpd-kernel"), {}), by.get((k, "d-pipexctl"), {})
        cs, ds = c.get("all_up_seconds"), d.get("all_offloaded_seconds")
        lat = d.get("channel_latency_ms") or {}
        mem, cpu = (d.get("serve_memory") or {}).get("rss_mib"), (d.get("cpu_seconds") or {}).get("serve")
        out.append(f"| {k} | {up(c, cs, k)} | {up(d, ds, k)} "
                   f"| {f'{ds / cs:.2f}' if cs and ds else '-'} "
                   f"| {lat.get('p50', 0):.0f} / {lat.get('p99', 0):.0f} / {lat.get('max', 0):.0f} ({lat.get('n', 0)}) "
                   f"| {mem if mem is not None else '-'}, {cpu if cpu is not None else '-'} |")
    scraped = [r for r in rows if r.get("case") == "s-pipexctl-scraped"]
    if scraped:
        out += ["", "A scrape loop during the storm: (s) is (d) with a client fetching /metrics back to back; "
                "every (d) and (s) round in the order run:", "",
                "| K | case | all up and offloaded, s | request -> channel p50 / p99 / max ms (n) | scrapes |",
                "|---|---|---|---|---|"]
        for r in rows:
            if r.get("case") not in ("d-pipexctl", "s-pipexctl-scraped"):
                continue
            lat, ds = r.get("channel_latency_ms") or {}, r.get("all_offloaded_seconds")
            out.append(f"| {r['k']} | {r['case'][0]} | {f'{ds:.1f}' if ds else r.get('error', 'not all up')} "
                       f"| {lat.get('p50', 0):.0f} / {lat.get('p99', 0):.0f} / {lat.get('max', 0):.0f} "
                       f"({lat.get('n', 0)}) | {r.get('scrapes', '-')} |")
    return "\n".join(out) + "\n"


def cp_table(cp: dict) -> str:
    out = ["", "Control plane, library (one netlink socket reused) vs one `ip l2tp` process per operation, "
           "Ethernet sessions (the only kind Debian 12's iproute2 makes), one tunnel; `ip` started by one shell loop:", "",
           "| sessions | library us/op | ip l2tp us/op | speed-up | library create / delete ms per session "
           "| ip l2tp create / delete ms per session |", "|---|---|---|---|---|---|"]

    def split(x: dict) -> str:
        return f"{x['create_s'] / x['sessions'] * 1e3:.1f} / {x['delete_s'] / x['sessions'] * 1e3:.1f}"

    for r in cp.get("eth_vs_ip", []):
        out.append(f"| {r['lib']['sessions']:,} | {r['lib']['per_op_us']:.0f} | {r['ip']['per_op_us']:.0f} | "
                   f"{r['speedup']:.1f}x | {split(r['lib'])} | {split(r['ip'])} |")
    out += ["", "Library alone, PPP sessions (what the offload makes), create + delete:", "",
            "| placement | sessions | us/op | sessions/s (create+delete) |", "|---|---|---|---|"]
    for where, label in (("one_tunnel", "1 tunnel"), ("many_tunnels", "1,000 tunnels")):
        for r in cp.get(where, []):
            lib = r["lib"]
            out.append(f"| {label} | {lib['sessions']:,} | {lib['per_op_us']:.0f} | {lib['sessions_per_s']:.0f} |")
    one = {r["lib"]["sessions"]: r["lib"]["per_op_us"] for r in cp.get("one_tunnel", [])}
    if 100 in one and 10000 in one:
        out.append(f"\n- library per-op cost at 10,000 / at 100 sessions (target <= 1.5): {one[10000] / one[100]:.2f}")
    one_lib = {r["lib"]["sessions"]: r["lib"] for r in cp.get("one_tunnel", [])}
    shipped = cp.get("as_shipped", {}).get("lib")
    if shipped and shipped["sessions"] in one_lib:
        exp = one_lib[shipped["sessions"]]
        out.append(f"- the kernel's share: PPP sessions in 1 tunnel, {shipped['sessions']:,}, create / delete ms per "
                   f"session: {split(exp)} with /sys/kernel/rcu_expedited=1 (as in every row above), {split(shipped)} "
                   "as the kernel ships (Linux 6.1 waits one RCU grace period per session delete, under the "
                   "genetlink mutex, for the library and ip l2tp alike)")
    elif "rcu_expedited" in cp:
        out.append(f"- timed with /sys/kernel/rcu_expedited {'=1' if cp['rcu_expedited'] is True else 'as shipped'} "
                   f"(before: {cp.get('rcu_expedited_before')})")
    sp = [r["speedup"] for r in cp.get("eth_vs_ip", []) if r["lib"]["sessions"] == 1000]
    if sp:
        out.append(f"- library vs ip l2tp at 1,000 sessions (target >= 20): {sp[0]:.1f}x")
    rs = cp.get("request_split")
    if rs:
        out += ["", f"Request split ({rs['sessions']:,} L2TPv2 PPP sessions, interleaved; floor: the request's bytes "
                "encoded beforehand, send, answers read, nothing decoded; target: overhead <= floor):", "",
                "| request | library us | floor us | overhead / floor |", "|---|---|---|---|"]
        for op in ("create", "get", "delete"):
            r = rs[op]
            out.append(f"| session {op} | {r['library']['median_us']:.0f} | {r['floor']['median_us']:.0f} | "
                       f"{r['overhead_per_kernel']:.2f} |")
    ds = cp.get("dump_split")
    if ds:
        out.append(f"- a dump of {ds['sessions']:,} sessions, median s: " + ", ".join(
            f"{k} {ds[k]['median_s']:.2f}" for k in ("models", "counters", "ids", "floor") if k in ds))
    if cp.get("phase_seconds"):
        out.append("- control-plane phases, seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in cp["phase_seconds"].items()))
    rss = cp.get("serve_rss", [])
    if rss:
        out.append("- pipexctl serve RSS (issue 17's target < 50 MiB at 10,000; the service's bookkeeping only, no real calls): "
                   + ", ".join(f"{r['sessions']:,} sessions {r['rss_kib'] / 1024:.1f} MiB" if "rss_kib" in r
                               else f"{r['sessions']:,}: error" for r in rss))
    return "\n".join(out) + "\n"


def startup_table(su: dict) -> str:
    if not su:
        return ""
    return (f"\n### A daemon's start on a large syslog (bench/startup.py)\n\n"
            f"{su['log_bytes'] / 1e6:.1f} MB, {su['log_lines']} lines ({su['history_calls']} calls came and went, "
            f"{su['live_calls']} up); then 1,000 more calls logged while it was stopped.\n\n"
            f"| start | s |\n|---|---|\n"
            f"| from the start of the log | {su['cold_start_after_s']:.2f} |\n"
            f"| from the checkpoint saved at stop ({su['resumed_lines']} lines read) | {su['resumed_start_s']:.2f} |\n"
            f"\nSave at stop: {su['save_s'] * 1000:.0f} ms ({su['save_locked_s'] * 1000:.0f} ms under the lock), "
            f"{su['checkpoint_bytes'] / 1e6:.1f} MB; same model both ways: {su['same_model']}.\n")


def host_table(title: str, head: list[str], rows: list[list[object]]) -> str:
    """A host bench's rows under its own heading (nothing without rows)."""
    if not rows:
        return ""
    out = ["", f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def bookkeeping_table(bk: dict) -> str:
    """bench/bookkeeping.py's rows (host): per-operation cost against the calls already held."""
    rows = []
    for r in bk.get("rows", []):
        look = r.get("request_lookup_ms", {}).get("p50")
        rows.append([r["layout"], f"{r['n']:,}", r.get("code", "this tree"), f"{r['offload_ms']['p50']:.2f}",
                     f"{r['under_lock_ms']['p50']:.2f}", f"{r['end_ms']['p50']:.2f}",
                     "-" if look is None else f"{look:.3f}"])
    return host_table("The daemon's bookkeeping with N calls held (bench/bookkeeping.py, host)",
                      ["layout", "N", "code", "offload p50 ms", "of it under the lock", "end p50 ms",
                       "request lookup p50 ms"], rows)


def requestwait_table(rw: dict) -> str:
    """bench/requestwait.py's rows (host): requests waiting for their calls' log lines."""
    rows = [[r["k"], f"{r['spread_s']:g}", f"{r['lag_s']:g}", r["answered"],
             f"{r['line_to_answer_p50_ms']} / {r['line_to_answer_p99_ms']}", r["cpu_s"], r["looks"]]
            for r in rw.get("rounds", [])]
    return host_table("Requests waiting for their lines (bench/requestwait.py, host)",
                      ["K", "requests over s", "line after s", "answered", "line -> answer p50 / p99 ms", "CPU s",
                       "looks"], rows)


def dp_extra(res: dict) -> str:
    out = ["", "| case | 4 streams median Mbit/s | ping avg / p99 ms | guest CPU % busy | CPU % per Mbit/s |",
           "|---|---|---|---|---|"]
    for case, r in res["cases"].items():
        if "forward_4_streams" not in r:
            continue
        lat = r.get("latency_ms", {})
        cpm = r.get("cpu_percent_per_mbit")
        out.append(f"| {LABELS.get(case, case)} | {statistics.median(r['forward_4_streams']):.1f} | "
                   f"{lat.get('avg', float('nan')):.2f} / {lat.get('p99', float('nan')):.2f} | "
                   f"{r['guest_cpu_busy_percent']:.0f} | {cpm:.3f} |" if cpm is not None else "|")
    d = res["cases"].get("d-pipexctl", {}).get("channel_latency_ms")
    if d:
        out.append("\npppd request -> kernel session made and its socket sent, through `pipexctl serve` "
                   "(target p99 < 200 ms): " + "; ".join(
                       f"{k} p50 {v['p50']:.0f} ms, p99 {v['p99']:.0f} ms (n={v['n']})" for k, v in d.items() if v.get("n")))
    return "\n".join(out) + "\n"


def service_table(ss: dict) -> str:
    """bench/servicestorm.py's rows: the offload service alone (real kernel, no xl2tpd or pppd)."""
    rows = ss.get("rounds") or []
    if not rows:
        return ""
    out = _head("The offload service alone (`bench/servicestorm.py`): K offload requests at once, each call in a "
                "tunnel of its own, real kernel, no xl2tpd or pppd; then K one after another; then every tunnel "
                "dropped (as when xl2tpd drops them):",
                ["K", "mode", "all done, s", "request p50 / p99 ms",
                 "of it: lock wait p50, build p50, state file p50 ms", "K tunnels dropped, s"])
    for r in rows:
        if not r.get("n"):
            out.append(f"| {r['k']} | {r['mode']} | failed: {r.get('errors')} | | | |")
            continue
        out.append(f"| {r['k']} | {r['mode']} | {r['wall_s']:.2f} | {r['p50_ms']:.0f} / {r['p99_ms']:.0f} "
                   f"| {r.get('lock_p50_ms', 0):.0f}, {r.get('build_p50_ms', 0):.0f}, {r.get('state_p50_ms', 0):.0f} "
                   f"| {r['drop_all_s']:.2f} |")
    return "\n".join(out) + "\n"


def livemove_table(lm: dict) -> str:
    """bench/livemove.py's rows: one call moved from its pty into the kernel while a transfer runs."""
    lines = []
    for i, r in enumerate(lm.get("runs") or [], 1):
        if r.get("error") or not r.get("moved"):
            lines.append(f"| {i} | failed: {r.get('error') or 'not moved within 60 s'} | | | | |")
        else:
            lines.append(f"| {i} | {r['moved_after_serving_s']:.2f} | {r.get('pty_mbps')} | {r.get('kernel_mbps')} "
                         f"| {r.get('ratio', '-')} | {r['zero_intervals']} |")
    head = _head("The live move (`bench/livemove.py`): one call on its pty on both sides, an iperf3 transfer on it, "
                 "then the daemons started and the call moved while it runs (target: kernel at least 10x the pty):",
                 ["run", "moved after the daemons accepted, s", "pty Mbit/s", "kernel Mbit/s", "ratio",
                  "seconds without data"])
    return "\n".join(head + lines) + "\n" if lines else ""


def plot(res: dict, cp: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(18, 4.5))
    cases = [c for c in BASE_CASES if "forward" in res["cases"].get(c, {})]
    meds = [statistics.median(res["cases"][c]["forward"]) for c in cases]
    a1.bar([c.split("-", 1)[0] for c in cases], meds, color=["#888", "#c44", "#48c", "#4a4"][:len(cases)])
    for i, c in enumerate(cases):
        f = res["cases"][c]["forward"]
        a1.errorbar(i, meds[i], yerr=[[meds[i] - min(f)], [max(f) - meds[i]]], color="k", capsize=4)
    a1.set_ylabel("iperf3 TCP Mbit/s (median, min-max)")
    a1.set_title("Data plane: (a) veth (b) pty (c) xl2tpd kernel (d) pipexctl")
    curve = next((r["lib"].get("curve_per_op_us") for r in cp.get("one_tunnel", []) if r["lib"].get("curve_per_op_us")),
                 None)
    if curve:
        half = len(curve) // 2
        xs = [100 * (i + 1) for i in range(half)]
        a2.plot(xs, curve[:half], label="create (sessions in tunnel = x)")
        a2.plot(xs[::-1], curve[half:], label="delete (sessions left = x)")
        a2.set_xlabel("sessions in the tunnel")
        a2.set_ylabel("us per operation (block of 100)")
        a2.set_ylim(bottom=0)
        a2.legend()
        a2.set_title("Control plane: library cost per operation")
    for col, style in (("c-xl2tpd-kernel/sessions", "b--"), ("d-pipexctl/sessions", "g-"),
                       ("c-xl2tpd-kernel/tunnels", "b:"), ("d-pipexctl/tunnels", "g-.")):
        pts = sorted((int(n), r["median"]) for n, r in (res.get("scale") or {}).get(col, {}).items() if n.isdigit())
        if pts:
            a3.plot([max(n, 1) for n, _ in pts], [m for _, m in pts], style, marker="o", label=col.replace("/", ", "))
    if res.get("scale"):
        a3.set_xscale("log")
        a3.set_xlabel("N other sessions / tunnels (0 drawn at 1)")
        a3.set_ylabel("one call, iperf3 TCP Mbit/s (median)")
        a3.set_ylim(bottom=0)
        a3.legend(fontsize=8)
        a3.set_title("Data plane at scale")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--storm", default="25,100", help="calls dialled at once in the login-storm rows")
    p.add_argument("--scrape-k", default="20", help="calls dialled at once in the scrape-loop rows ('' to skip them)")
    p.add_argument("--debian", choices=("12", "13"), default="12",
                   help="the guest: 12 (kernel 6.1, pppd 2.4.9) or 13 (kernel 6.12, pppd 2.5.2)")
    a = p.parse_args()
    try:
        fl = flavour(f"debian{a.debian}")
        py = fl.python
        cmd = (f"{py} bench/dataplane.py --runs {a.runs} --seconds {a.seconds}; "
               f"{py} bench/controlplane.py; "
               f"{py} bench/startup.py; "
               f"{py} bench/servicestorm.py --k {a.storm}; "
               f"{py} bench/livemove.py --runs {a.runs}; "
               f"{py} bench/loginstorm.py --k {a.storm}"
               + (f"; {py} bench/loginstorm.py --k {a.scrape_k} --cases d,s,s,d "
                  f"--out \"$PIPEXCTL_RESULTS/loginstorm-scrape.json\"" if a.scrape_k else ""))
        r = run_in_guest(["sh", "-c", cmd], cwd=str(ROOT), keep_results=True, progress=True, timeout=5400,
                         flavour_name=fl.name)
    except VMError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 125
    src = r.results_dir / "dataplane.json"
    if r.returncode != 0 or not src.exists():
        print(f"bench: the guest run failed (status {r.returncode})", file=sys.stderr)
        return 1
    res = json.loads(src.read_text())
    cpf = r.results_dir / "controlplane.json"
    res["controlplane"] = cp = json.loads(cpf.read_text()) if cpf.exists() else {}
    stf = r.results_dir / "loginstorm.json"
    res["loginstorm"] = json.loads(stf.read_text()) if stf.exists() else {}
    scf = r.results_dir / "loginstorm-scrape.json"
    if scf.exists():
        res["loginstorm"].setdefault("rows", []).extend(json.loads(scf.read_text())["rows"])
    ssf = r.results_dir / "servicestorm.json"
    res["servicestorm"] = json.loads(ssf.read_text()) if ssf.exists() else {}
    lmf = r.results_dir / "livemove.json"
    res["livemove"] = json.loads(lmf.read_text()) if lmf.exists() else {}
    suf = r.results_dir / "startup.json"
    res["startup"] = json.loads(suf.read_text()) if suf.exists() else {}
    res["guest_seconds"] = r.total_seconds
    res["guest_flavour"] = fl.name
    stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H%M")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    # the daemon's own bookkeeping needs no kernel: measured on the host, after the guest has stopped
    bkf = out / f"{stamp}-bookkeeping.json"
    if subprocess.run([sys.executable, str(ROOT / "bench" / "bookkeeping.py"), "--out", str(bkf)]).returncode == 0:
        res["bookkeeping"] = json.loads(bkf.read_text())
    rwf = out / f"{stamp}-requestwait.json"
    if subprocess.run([sys.executable, str(ROOT / "bench" / "requestwait.py"), "--k", "100", "400", "--spread", "2",
                       "--lag", "10", "--out", str(rwf)]).returncode == 0:
        res["requestwait"] = json.loads(rwf.read_text())
    (out / f"{stamp}.json").write_text(json.dumps(res, indent=1))
    md = (table(res) + dp_extra(res) + scale_table(res) + cp_table(cp) + storm_table(res["loginstorm"])
          + service_table(res["servicestorm"]) + livemove_table(res["livemove"])
          + startup_table(res["startup"]) + bookkeeping_table(res.get("bookkeeping", {}))
          + requestwait_table(res.get("requestwait", {})))
    png = out / f"{stamp}.png"
    md += f"\nPlot: bench/results/{png.name}\n" if plot(res, cp, png) else "\n(no plot: matplotlib missing)\n"
    md += f"\nGuest run: {r.total_seconds / 60:.1f} min.\n"
    # the daemons' own logs of case (d): each offload's split (discovery wait, lock wait, kernel + nft)
    logs = sorted(r.results_dir.glob("*-serve.log")) + sorted(r.results_dir.glob("storm-*/*.log"))
    if logs:
        (out / f"{stamp}-logs").mkdir(exist_ok=True)
        for f in logs:
            # the login storm's LNS logs: storm-K-lns-serve.log, storm-K-lns-xl2tpd.log
            name = f"{f.parent.name}-{f.name}" if f.parent.name.startswith("storm-") else f.name
            shutil.copy(f, out / f"{stamp}-logs" / name)
        md += f"Daemon logs of (d): bench/results/{stamp}-logs/\n"
    (out / f"{stamp}.md").write_text(md)
    shutil.rmtree(r.results_dir, ignore_errors=True)
    print(md)
    print(f"written: bench/results/{stamp}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
