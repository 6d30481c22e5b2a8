"""A login-storm boot's records, kept and read back (host side; not a test).

`keep SRC DST`: the rounds a storm boot's run.sh left in SRC (one directory
per round, CODE-CASE-K-N/, with storm.json and storm-*/lns-*.log) become the
record layout of bench/results/loginstorm-*/: CODE-CASE-K-N.json and
CODE-CASE-K-N-lns-{serve,xl2tpd,pppd}.log.gz.

`table DIR...`: from those records, what docs/offload.md quotes of a boot:
- each round: calls up and offloaded, the time to all of them, its ratio to
  the mean of kernel mode's (case c) rounds at the same K in the same
  directory, request p50 / p99, control questions, the daemon's CPU;
- per code, pooled over its rounds from the daemon's own log lines ("call
  N ... offloaded in T ms (ms: discovery D, of it the call's line L, ...)"):
  request and line-wait percentiles, the mean of each part in the slowest
  5 %, and how many requests that waited over 100 ms for their line came
  while a full poll of over a second ran (the daemon logs those polls):
  their wait, from the request to the line, overlaps the poll's span,
  which counts as starting 50 ms early (the log's stamps are the ends).
  A longer wait overlaps a poll more easily, so the two counts are not
  the same odds. Pools are per code and K ("CODE K=N");
- where the plugin stamped its ack (since c8ac1ae; the line's tail "; as
  pppd saw it ..."), the request as pppd timed it, the request less pppd's
  wake for the reply and its checks, and the slowest 5 % of those split;
  where it also says how long pppd was runnable and waiting for a CPU
  inside its ask (the plugin's schedstat, since 2026-12-07: ", its own
  wait for a CPU N"), that wait's percentiles and those of the ask less it;
  where it says when the accept loop woke for the request and how long
  it waited for a CPU (since 2026-12-07), their percentiles;
  where the line also says what came before the daemon's clock (since
  f708219: "; before our clock ..."), its percentiles and the slowest 5 %
  by pppd's own time, split into those steps.
Percentiles are `statistics.quantiles(values, n=100, method="inclusive")`,
rounded to the ms. Each directory is one boot, read on its own: a ratio is
to the kernel mode of its own boot.

    .venv/bin/python bench/stormrecords.py table bench/results/loginstorm-2026-12-06t
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import re
import shutil
import statistics
import sys
from pathlib import Path
from typing import IO, Iterator, Optional

ROUND = re.compile(r"^(?P<code>[\w.]+)-(?P<case>[a-z])-(?P<k>\d+)-(?P<n>\d+)$")
OFFLOAD = re.compile(r"offloaded in (\d+) ms \(ms: discovery (\d+), of it the call's line (\d+), lock (\d+), kernel "
                     r"(\d+), of it on a CPU (\d+) and waiting for one (\d+), state file (\d+), hand-off (\d+)\)")
PARTS = ("request", "discovery", "line", "lock", "kernel", "on a CPU", "waiting for a CPU", "state file", "hand-off")
# the tail a stamping plugin's ack adds (since the stamps; earlier records have none)
AS_PPPD = re.compile(r"; as pppd saw it (\d+) ms \(ms: its wake for our reply (\d+), its checks (\d+), "
                     r"our read of its ack (\d+)(?:, its own wait for a CPU (\d+))?\)")
PPPD_PARTS = ("as pppd saw it", "its wake for our reply", "its checks", "our read of its ack")
BEFORE = re.compile(r"; before our clock (\d+) ms \(ms: until our accept (\d+), its thread (\d+), "
                    r"the request read (\d+), its pppd proven (\d+)\)")
BEFORE_PARTS = ("before our clock", "until our accept", "its thread", "the request read", "its pppd proven")
# the accept loop's share of "until our accept" (since 2026-12-07)
LOOP = re.compile(r"; our accept loop woke (\d+) ms after the ask, having waited (\d+) ms for a CPU")
FULL_POLL = re.compile(r"slow discovery poll: (\d+) ms, .*full=True")


def keep(src: Path, dst: Path) -> list[str]:
    """Copy SRC's rounds into DST in the record layout; returns their names."""
    dst.mkdir(parents=True, exist_ok=True)
    for extra in ("progress.txt", "sysctl-before.txt", "sysctl-after.txt"):
        if (src / extra).exists():
            shutil.copy(src / extra, dst / extra)
    names = []
    for d in sorted(p for p in src.iterdir() if p.is_dir() and ROUND.match(p.name)):
        if not (d / "storm.json").exists():
            continue  # a round that did not end: nothing to keep
        shutil.copy(d / "storm.json", dst / f"{d.name}.json")
        for log in sorted(d.glob("storm-*/lns-*.log")):
            with log.open("rb") as f, gzip.GzipFile(dst / f"{d.name}-{log.name}.gz", "wb", 9, mtime=0) as g:
                shutil.copyfileobj(f, g)
        names.append(d.name)
    return names


def _open(path: Path) -> IO[str]:
    return gzip.open(path, "rt", errors="replace") if path.suffix == ".gz" else path.open(errors="replace")


def _stamp(line: str) -> Optional[float]:
    try:
        return datetime.datetime.fromisoformat(line[:23]).timestamp()
    except ValueError:
        return None


# start, the daemon's parts, pppd's (PPPD_PARTS, then BEFORE_PARTS when logged)
# (start, the daemon's parts, pppd's parts and the steps before our clock, pppd's own wait for a CPU)
Offload = tuple[float, tuple[int, ...], Optional[tuple[int, ...]], Optional[int]]


def serve_log(path: Path) -> tuple[list[Offload], list[tuple[float, float]]]:
    """(each offload's start, parts and pppd's parts in ms, each logged full poll's span)."""
    offloads, polls = [], []
    with _open(path) as f:
        for line in f:
            t = _stamp(line)
            if t is None:
                continue
            if m := OFFLOAD.search(line):
                parts = tuple(int(x) for x in m.groups())
                pppd, before = AS_PPPD.search(line, m.end()), BEFORE.search(line, m.end())
                seen = tuple(int(x) for x in pppd.groups()[:4] + (before.groups() if before else ())) if pppd else None
                cpu_wait = int(pppd.group(5)) if pppd and pppd.group(5) else None
                if seen and before and (lp := LOOP.search(line, before.end())):
                    seen += (int(lp.group(1)), int(lp.group(2)))
                offloads.append((t - parts[0] / 1000, parts, seen, cpu_wait))
            elif m := FULL_POLL.search(line):
                polls.append((t - int(m.group(1)) / 1000, t))
    return offloads, polls


def slowest(rows: list) -> list:
    """The last 5 % (at least one) of ``rows``, sorted by the caller."""
    return rows[-max(1, len(rows) // 20):]


def means(rows: list[tuple[int, ...]], names: tuple[str, ...]) -> dict[str, int]:
    """Each named part's mean over ``rows``, rounded to the ms."""
    return {name: round(statistics.mean(r[i] for r in rows)) for i, name in enumerate(names)}


def pcts(values: list[int]) -> list[int]:
    """p50, p90 and p99."""
    if len(values) < 2:
        return values * 3
    q = statistics.quantiles(values, n=100, method="inclusive")
    return [round(q[49]), round(q[89]), round(q[98])]


class Round:
    def __init__(self, path: Path) -> None:
        m = ROUND.match(path.stem)
        assert m, path
        self.name, self.code, self.case, self.k = path.stem, m["code"], m["case"], int(m["k"])
        self.row = json.loads(path.read_text())["rows"][0]
        logs = sorted(path.parent.glob(f"{path.stem}-lns-serve.log*"))
        self.offloads, self.polls = serve_log(logs[0]) if logs else ([], [])

    @property
    def seconds(self) -> Optional[float]:
        return self.row.get("all_up_seconds" if self.case == "c" else "all_offloaded_seconds")


def rounds(d: Path) -> Iterator[Round]:
    for p in sorted(d.glob("*.json")):
        if ROUND.match(p.stem):
            yield Round(p)


def table(d: Path) -> dict:
    """One boot's figures (its record directory ``d``)."""
    rs = list(rounds(d))
    kernel: dict[int, list[float]] = {}
    for r in rs:
        if r.case == "c" and r.seconds:
            kernel.setdefault(r.k, []).append(r.seconds)
    out: dict = {"kernel_mode_mean": {k: round(statistics.mean(v), 2) for k, v in kernel.items()}, "rounds": [],
                 "codes": {}}
    for r in rs:
        row, mean = r.row, out["kernel_mode_mean"].get(r.k)
        lat, st = row.get("channel_latency_ms") or {}, row.get("stats") or {}
        out["rounds"].append({
            "round": r.name, "k": r.k, "up": row.get("links_up"),
            "offloaded": (row.get("objects") or {}).get("pppol2tp_sessions") if r.case != "c" else None,
            "seconds": round(r.seconds, 2) if r.seconds else None, "ratio": round(r.seconds / mean, 2) if r.seconds and mean and r.case != "c" else None,
            "request_p50_p99_ms": [round(lat["p50"]), round(lat["p99"])] if lat.get("n") else None,
            "control_questions": st.get("control_questions"), "asked_ahead": st.get("control_questions_ahead"),
            "daemon_cpu_s": (row.get("cpu_seconds") or {}).get("serve"), "tunnel_id_clashes": row.get("tunnel_id_clashes")})
    # pooled per code and K (a boot may run several Ks)
    for code, k in sorted({(r.code, r.k) for r in rs if r.offloads}):
        pool = [r for r in rs if (r.code, r.k) == (code, k)]
        offs = [o for r in pool for o in r.offloads]
        req, line = [p[0] for _, p, _, _ in offs], [p[2] for _, p, _, _ in offs]
        slow = slowest(sorted(p for _, p, _, _ in offs))
        stamped = sorted((p, q) for _, p, q, _ in offs if q is not None)
        waited = during = others = others_during = 0
        for r in pool:
            for start, p, _, _ in r.offloads:
                in_poll = any(a - 0.05 <= start + p[2] / 1000 and start <= b for a, b in r.polls)
                if p[2] > 100:
                    waited, during = waited + 1, during + in_poll
                else:
                    others, others_during = others + 1, others_during + in_poll
        c = out["codes"][f"{code} K={k}"] = {
            "requests": len(offs),
            "request_p50_p90_p99_ms": pcts(req),
            "line_wait_p50_p90_p99_ms": pcts(line),
            "line_waits_over_20_ms": sum(x > 20 for x in line),
            "slowest_5_percent_mean_ms": means(slow, PARTS),
            "line_waits_over_100_ms": waited, "of_them_during_a_full_poll": during,
            "other_requests": others, "others_during_a_full_poll": others_during}
        if stamped:
            # the daemon's own share: the request less what pppd's scheduling took of its hand-off
            tail = slowest(stamped)
            c.update({
                "stamped_requests": len(stamped),
                "as_pppd_saw_p50_p90_p99_ms": pcts([q[0] for _, q in stamped]),
                "less_pppds_wake_and_checks_p50_p90_p99_ms": pcts([p[0] - q[1] - q[2] for p, q in stamped]),
                "slowest_5_percent_of_stamped_mean_ms": {**means([p for p, _ in tail], PARTS),
                                                         **means([q for _, q in tail], PPPD_PARTS)}})
            # pppd's own wait for a CPU inside its ask (the plugin's schedstat, since 2026-12-07): the ask less it
            # is what the daemon and the sockets took
            waits = [(q[0], w) for _, _, q, w in offs if q is not None and w is not None]
            if waits:
                c.update({"pppds_own_cpu_wait_p50_p90_p99_ms": pcts([w for _, w in waits]),
                          "as_pppd_saw_less_its_cpu_wait_p50_p90_p99_ms": pcts([a - w for a, w in waits])})
            timed = sorted(q for _, q in stamped if len(q) > len(PPPD_PARTS))  # the steps before our clock logged
            if timed:
                c.update({"before_our_clock_p50_p90_p99_ms": pcts([q[len(PPPD_PARTS)] for q in timed]),
                          "slowest_5_percent_as_pppd_saw_mean_ms": means(slowest(timed), PPPD_PARTS + BEFORE_PARTS)})
            n = len(PPPD_PARTS) + len(BEFORE_PARTS)
            looped = [q for _, q in stamped if len(q) > n]  # the accept loop's wake logged
            if looped:
                until = len(PPPD_PARTS) + 1
                c.update({"until_our_accept_p50_p90_p99_ms": pcts([q[until] for q in looped]),
                          "accept_loop_woke_p50_p90_p99_ms": pcts([q[n] for q in looped]),
                          "accept_loop_cpu_wait_p50_p90_p99_ms": pcts([q[n + 1] for q in looped]),
                          # the loop's wake less its wait for a CPU: mostly its wait for the interpreter's lock
                          "accept_loop_woke_less_cpu_wait_p50_p90_p99_ms": pcts([q[n] - q[n + 1] for q in looped])})
    return out


def render(d: Path, t: dict) -> str:
    lines = [f"# {d}", f"kernel mode's mean, by K: {t['kernel_mode_mean']}"]
    for r in t["rounds"]:
        lines.append("  ".join(f"{k}={v}" for k, v in r.items() if v is not None))
    for code, c in t["codes"].items():
        lines.append(f"{code}: " + "  ".join(f"{k}={v}" for k, v in c.items()))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keep", help="a boot's rounds into the record layout")
    k.add_argument("src", type=Path)
    k.add_argument("dst", type=Path)
    t = sub.add_parser("table", help="each round, and per code the pooled request figures (each directory a boot)")
    t.add_argument("dirs", type=Path, nargs="+")
    t.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "keep":
        print("\n".join(keep(a.src, a.dst)))
    else:
        res = {str(d): table(d) for d in a.dirs}
        print(json.dumps(res, indent=1) if a.json else "\n\n".join(render(Path(d), t) for d, t in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
