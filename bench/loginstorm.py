"""Login storm, run inside the guest: K calls dialled at once, one from each
of K LAC namespaces (each its own tunnel and address), against one LNS.

Two rounds per K, in one boot:
- (c) the LNS's xl2tpd in kernel mode (pppol2tp.so): time until every call
  is up (K PPP links with IPCP done on the LNS);
- (d) the LNS's xl2tpd in userspace mode with `pipexctl serve` and the
  plugin: time until every call is up and offloaded (K PPP links, and K
  PPPoL2TP sessions in /proc/net/pppol2tp), and the request -> channel
  latency from the daemon's own records.
- (s) as (d), with a client scraping the daemon's Prometheus endpoint back
  to back for the whole storm: what a scrape loop costs the offloads
  (both (d) and (s) run with `--metrics`, so the only difference is the
  scraping).
- (n) as (d), with `pipexctl_move 0`: no plugin timer, so no control link
  per call: what the links cost a storm.
The LACs run xl2tpd's kernel mode in every round, so their cost is the same.
Each row also has the guest's busy CPU seconds over the round and, in the
pipexctl rounds, the daemon's own CPU seconds and its resident memory.
Not a test: it asserts nothing.

    python -m pipexctl.testing.vm --memory 4096 -- .venv/bin/python bench/loginstorm.py --k 25,100
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipexctl import netns  # noqa: E402
from pipexctl.testing.lab import Lab, kernel_objects, plugin_options  # noqa: E402
from pipexctl.testing.probe import cpu_jiffies, ppp_inet_links, process_jiffies  # noqa: E402


def pppol2tp_sessions(ns: str) -> int:
    """PPP sessions on PPPoL2TP sockets in ``ns`` (its /proc/net/pppol2tp),
    read in-process rather than by a process per poll."""
    with netns.enter(ns):
        text = Path("/proc/thread-self/net/pppol2tp").read_text()
    return sum(1 for line in text.splitlines() if line.lstrip().startswith("SESSION '"))


METRICS_PORT = 9479
TICK = os.sysconf("SC_CLK_TCK")


def serve_memory(pid: int) -> dict:
    """The daemon's resident memory now and at its peak, MiB, its threads,
    and its resident memory by kind of mapping (smaps): the heap, anonymous
    mappings (other threads' malloc arenas, pymalloc's arenas, stacks) and
    files (the interpreter, libraries, extension modules)."""
    out: dict = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[{"VmRSS": "rss_mib", "VmHWM": "peak_rss_mib"}[name]] = round(int(value.split()[0]) / 1024, 1)
        elif name == "Threads":
            out["threads"] = int(value)
    kinds = {"heap": 0, "anon": 0, "file": 0, "other": 0}
    big_anon = 0  # anonymous mappings of 1 MiB or more resident
    kind = "other"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        f = line.split()
        if f and "-" in f[0] and not f[0].endswith(":"):  # a mapping's header: range, perms, offset, dev, inode, path
            path = f[5] if len(f) > 5 else ""
            kind = "heap" if path == "[heap]" else "anon" if not path else "file" if path.startswith("/") else "other"
        elif f and f[0] == "Rss:":
            kb = int(f[1])
            kinds[kind] += kb
            if kind == "anon" and kb >= 1024:
                big_anon += 1
    out["by_kind_mib"] = {k: round(v / 1024, 1) for k, v in kinds.items()}
    out["anon_mappings_over_1_mib"] = big_anon
    return out


def scrape_loop(ns: str, stop: threading.Event, done: list) -> None:
    """GET /metrics from the daemon in ``ns``, back to back, until ``stop``."""
    with netns.enter(ns):
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", METRICS_PORT), timeout=10) as c:
                    c.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                    while c.recv(65536):
                        pass
                done[0] += 1
            except OSError:
                done[1] += 1
                time.sleep(0.05)


def storm(k: int, offload: bool, timeout: float, scrape: bool = False, tag: str = "", pppd_extra: str = "") -> dict:
    lab = Lab(kernel_mode=not offload, lac_kernel_mode=True, lac_extra_pppd="")
    stop, scrapes = threading.Event(), [0, 0]
    try:
        lab.setup(k)
        lab.start_all(plugin_options() + "pipexctl_timeout 60\n" + pppd_extra if offload else "")
        if offload:
            lab.serve_all([lab.lns], "--wait", "60", "--metrics", f"127.0.0.1:{METRICS_PORT}")
        if scrape:
            threading.Thread(target=scrape_loop, args=(lab.lns.ns, stop, scrapes), daemon=True).start()
            time.sleep(1)  # the loop running before the first dial
        serve_pid = lab.serves[-1].pid if offload else None  # `ip netns exec` execs the daemon: its pid
        cpu0, machine0 = (process_jiffies(serve_pid, children=True) if serve_pid else 0), cpu_jiffies()
        t0 = time.monotonic()
        for lac in lab.lacs:
            lab.control(lac, "c lns")
        dialled = time.monotonic() - t0
        up = offloaded = None
        end = t0 + timeout
        rss_seen: list[float] = []  # the daemon's RSS, MiB, every 10 s from the first dial
        while time.monotonic() < end:
            if serve_pid and len(rss_seen) <= (time.monotonic() - t0) // 10:
                rss_seen.append(serve_memory(serve_pid)["rss_mib"])
            if offload and offloaded is None and pppol2tp_sessions(lab.lns.ns) >= k:
                offloaded = time.monotonic() - t0
            if up is None and len(ppp_inet_links(lab.lns.ns)) >= k:
                up = time.monotonic() - t0
            if up is not None and (offloaded is not None or not offload):
                break
            time.sleep(0.1)
        stop.set()
        machine1 = cpu_jiffies()
        out = {"k": k, "dial_seconds": round(dialled, 2), "all_up_seconds": up,
               "links_up": len(ppp_inet_links(lab.lns.ns)), "objects": kernel_objects(lab.lns.ns),
               # from the first dial to the end of the round: what the daemon took of the guest's CPU
               "cpu_seconds": {"machine_busy": round((machine1[0] - machine0[0]) / TICK, 1),
                               "machine_all": round((machine1[1] - machine0[1]) / TICK, 1)}}
        if serve_pid:
            # the daemon and the children it waited for
            out["cpu_seconds"]["serve"] = round((process_jiffies(serve_pid, children=True) - cpu0) / TICK, 1)
            out["serve_memory"] = {**serve_memory(serve_pid), "rss_mib_every_10s": rss_seen}
        if offload:
            st = lab.serve_status(lab.lns)
            # up and offloaded: the plugin gives pppd its channel before LCP starts
            out["all_offloaded_seconds"] = None if offloaded is None or up is None else max(up, offloaded)
            out["channel_latency_ms"] = st.get("channel_latency_ms")
            out["stats"] = st.get("stats")
        if scrape:
            out["scrapes"], out["scrape_errors"] = scrapes
        return out
    except Exception as e:  # one K's failure is a row of its own; the next K still runs
        return {"k": k, "error": f"{type(e).__name__}: {e}"[:2000]}
    finally:
        stop.set()
        if offload and os.environ.get("PIPEXCTL_RESULTS") and lab.instances():
            d = Path(os.environ["PIPEXCTL_RESULTS"]) / f"storm-{k}{tag}"
            d.mkdir(exist_ok=True)
            for name in ("serve.log", "xl2tpd.log"):
                if (lab.lns.dir / name).exists():
                    (d / f"lns-{name}").write_bytes((lab.lns.dir / name).read_bytes())
        lab.teardown()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--k", default="25,100", help="comma-separated numbers of calls dialled at once (at most 153)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--cases", default="c,d", help="comma-separated, in this order: c (kernel mode), d (pipexctl), "
                   "s (pipexctl under a scrape loop), n (pipexctl, no control links); a case named twice runs twice")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "loginstorm.json"))
    a = p.parse_args()
    rows = []
    for k in (int(x) for x in a.k.split(",") if x):
        for n, case in enumerate(a.cases.split(",")):
            r = storm(k, case != "c", a.timeout, scrape=case == "s", tag=f"-{case}{n}",
                      pppd_extra="pipexctl_move 0\n" if case == "n" else "")
            r["case"] = {"c": "c-xl2tpd-kernel", "d": "d-pipexctl", "s": "s-pipexctl-scraped",
                         "n": "n-pipexctl-no-links"}[case]
            rows.append(r)
            print(json.dumps(r), flush=True)
    Path(a.out).write_text(json.dumps({"kernel": os.uname().release, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
