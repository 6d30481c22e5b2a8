"""Many real calls through one `pipexctl serve`, run inside the guest: L
LAC namespaces with S xl2tpd each (one call each, on ports 1701, 1702,
...: each tunnel its own address pair, since xl2tpd's kernel mode cannot
carry two tunnels of one address pair before Linux 6.11) dial L x S calls
against one LNS xl2tpd in userspace mode with the plugin, in rounds of L.  Every call must be offloaded while the daemon's file
descriptors run past 1,024 (select() would fail there; each offloaded
call holds its pty, a pidfd and its tunnel's socket), then hung up with
nothing left.

It records the daemon's fds (count, highest number, kinds), RSS, the
time of a `status` request and of a metrics scrape at full load, the
request -> channel latency, and a ping through a sample of the calls.
The LACs run xl2tpd's kernel mode.  One LNS xl2tpd carries at most about
1,000 calls (its own select()), so N stays below that here.  Exit status 1
when a check failed (every call offloaded, no call on a pty, the daemon
alive, nothing left after the hang-ups).

    python -m pipexctl.testing.vm --memory 8192 -- .venv/bin/python bench/scalecalls.py --lacs 12 --sections 50
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loginstorm import pppol2tp_sessions  # noqa: E402

from pipexctl.testing.lab import Lab, fd_kinds, kernel_objects, plugin_options, pty_fds, xl2tpd_pid  # noqa: E402
from pipexctl.testing.probe import cpu_jiffies, memory_kib, ppp_peer_addrs, process_jiffies  # noqa: E402

METRICS_PORT = 9479


def proc_facts(pid: int) -> dict:
    fds = [int(f) for f in os.listdir(f"/proc/{pid}/fd")]
    rss = memory_kib(pid)["VmRSS"]
    with open(f"/proc/{pid}/limits") as f:
        lim = next(ln.split()[3:5] for ln in f if ln.startswith("Max open files"))
    return {"fds": len(fds), "highest_fd": max(fds), "rss_kib": rss, "fd_limit_soft_hard": lim,
            "fd_kinds": fd_kinds(pid)}


def pppds_on_pty(lab: Lab) -> int:
    # the lab's rule: the one close-on-exec copy the plugin keeps of the pty
    # it gave the daemon (the way back for a move) is not a call on its pty
    n = 0
    for pid in lab.pppds(lab.lns):
        try:
            if pty_fds(pid):
                n += 1
        except OSError:  # exited meanwhile
            pass
    return n


def scrape_seconds(ns: str) -> float:
    from pipexctl import netns

    t = time.monotonic()
    with netns.enter(ns), socket.create_connection(("127.0.0.1", METRICS_PORT), timeout=60) as c:
        c.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        while c.recv(65536):
            pass
    return round(time.monotonic() - t, 3)


def guest_cpu(pids: list[int], seconds: float = 10.0) -> dict:
    """The guest's CPU over ``seconds`` (/proc/stat), and the share of it
    that ``pids`` took: the LAC xl2tpd the lab runs beside the LNS share its
    vCPUs, which no real LNS does."""
    def ticks() -> int:
        return sum(process_jiffies(pid) for pid in pids)

    b0, t0, p0 = *cpu_jiffies(), ticks()
    time.sleep(seconds)
    b1, t1, p1 = *cpu_jiffies(), ticks()
    return {"seconds": seconds, "busy_pct": round(100 * (b1 - b0) / max(1, t1 - t0), 1),
            "of_it_these_pct": round(100 * (p1 - p0) / max(1, t1 - t0), 1), "processes": len(pids)}


def say(msg: str) -> None:
    print(f"scalecalls: {msg}", file=sys.stderr, flush=True)


def run(n_lacs: int, sections: int, timeout: float, keep_as: str = "scalecalls") -> dict:
    n = n_lacs * sections
    lab = Lab(kernel_mode=False, lac_kernel_mode=True, lac_extra_pppd="",
              pool=("10.98.0.1", "10.98.0.2", "10.98.31.250"))
    out: dict = {"lacs": n_lacs, "sections": sections, "calls": n, "kernel": os.uname().release}
    checks: dict[str, bool] = {}
    try:
        lab.setup(n_lacs)
        # not required: a call the daemon does not take stays on its pty, and is counted there
        lab.start_all(plugin_options(required=False) + "pipexctl_timeout 60\n")
        columns = [list(lab.lacs)]  # columns[j]: the (j+1)th xl2tpd of every LAC namespace
        for j in range(2, sections + 1):
            columns.append([lab.add_lac_beside(lac, 1700 + j) for lac in columns[0]])
        say(f"{n} LAC xl2tpd started")
        # before any call: what the idle LAC daemons alone take of the guest (its two vCPUs)
        lac_pids = [xl2tpd_pid(lac) for lac in lab.lacs]
        out["idle_lacs_cpu"] = guest_cpu(lac_pids)
        say(f"idle, before any call: {json.dumps(out['idle_lacs_cpu'])}")
        srv = lab.serve(lab.lns, "--wait", "60", "--metrics", f"127.0.0.1:{METRICS_PORT}")
        pid = srv.pid  # `ip netns exec` execs the python: the daemon's own pid
        scrape_seconds(lab.lns.ns)  # the first scrape opens the metrics' own netlink socket: before the count
        out["daemon_at_start"] = proc_facts(pid)
        say(f"{n_lacs} LACs and the LNS up, the daemon holds {out['daemon_at_start']['fds']} fds; dialling")
        t0 = time.monotonic()
        rounds = []
        for r, column in enumerate(columns, 1):
            tr = time.monotonic()
            for lac in column:
                lab.control(lac, "c lns")
            try:
                for lac in column:
                    lab.wait_log(lac, "Call established", timeout=120)
            except (TimeoutError, RuntimeError) as e:  # RuntimeError: a LAC xl2tpd exited
                # the rest is measured at the load reached; xl2tpd's own log says why
                out["dial_stopped"] = {"round": r, "why": str(e)[-600:]}
                checks["every round dialled"] = False
                say(f"round {r}: a call was not established by its LAC xl2tpd; measuring at this load")
                break
            rounds.append(round(time.monotonic() - tr, 2))
            say(f"round {r}: {r * n_lacs} calls established by the LACs, {pppol2tp_sessions(lab.lns.ns)} offloaded")
        n = len(rounds) * n_lacs  # the calls of the rounds whose every call came up
        if rounds:
            out["dial_rounds_seconds"] = {"n": len(rounds), "mean": round(sum(rounds) / len(rounds), 2),
                                          "max": max(rounds)}
        end, last, moved = t0 + timeout, None, time.monotonic()
        while time.monotonic() < end and time.monotonic() - moved < 180:  # 3 min with no change: stuck
            now = (len(ppp_peer_addrs(lab.lns.ns)), pppol2tp_sessions(lab.lns.ns))
            if now != last:
                last, moved = now, time.monotonic()
                say(f"{now[0]} PPP links up, {now[1]} offloaded")
            if min(now) >= n:
                break
            time.sleep(2)
        out["all_up_and_offloaded_seconds"] = round(time.monotonic() - t0, 1)
        peers = ppp_peer_addrs(lab.lns.ns)
        out["links_up"], out["pppol2tp_sessions"] = len(peers), pppol2tp_sessions(lab.lns.ns)
        out["objects"] = kernel_objects(lab.lns.ns)
        out["pppds_on_pty"] = pppds_on_pty(lab)
        out["daemon_at_full_load"] = proc_facts(pid)
        t = time.monotonic()
        st = lab.serve_status(lab.lns)
        out["status_request_seconds"] = round(time.monotonic() - t, 3)
        out["status_tunnels"] = len(st.get("tunnels", []))
        out["stats"], out["channel_latency_ms"] = st.get("stats"), st.get("channel_latency_ms")
        out["metrics_scrape_seconds"] = scrape_seconds(lab.lns.ns)
        sample = random.Random(1).sample(sorted(peers.values()), min(20, len(peers)))
        pings = [subprocess.run(["ip", "netns", "exec", lab.lns.ns, "ping", "-c", "1", "-W", "5", a],
                                capture_output=True).returncode == 0 for a in sample]
        out["ping_sample"] = f"{sum(pings)}/{len(pings)}"
        out["calls_of_full_rounds"] = n
        checks["every call offloaded"] = n > 0 and out["links_up"] >= n and out["links_up"] == out["pppol2tp_sessions"] \
            == out["objects"]["sessions"]
        checks["no call on a pty"] = out["pppds_on_pty"] == 0
        checks["daemon fds past 1024"] = out["daemon_at_full_load"]["highest_fd"] > 1024
        checks["ping through the sample"] = all(pings)
        say(f"at full load: {json.dumps({k: out[k] for k in ('links_up', 'pppds_on_pty', 'ping_sample')})}, "
            f"daemon {json.dumps(out['daemon_at_full_load'])}")
        # hang up every call from the LACs, then nothing may be left
        th = time.monotonic()
        for lac in lab.lacs:
            lab.disconnect(lac)
        end = th + timeout
        while time.monotonic() < end and (kernel_objects(lab.lns.ns)["tunnels"] or lab.pppds(lab.lns)):
            time.sleep(2)
        out["hangup_seconds"] = round(time.monotonic() - th, 1)
        time.sleep(5)  # the daemon's last removals and fd closes after the kernel objects went
        xlog = lab.lns.log.read_text(errors="replace")
        out["lns_xl2tpd"] = {k: xlog.count(k) for k in ("Maximum retries exceeded", "udp_xmit failed",
                                                          "Call established")}
        out["objects_after"] = kernel_objects(lab.lns.ns)
        out["daemon_after"] = proc_facts(pid)
        st = lab.serve_status(lab.lns)
        out["stats_after"] = st.get("stats")
        checks["nothing left"] = (not any(out["objects_after"].values()) and st.get("tunnels") == []
                                  and out["daemon_after"]["fds"] == out["daemon_at_start"]["fds"])
        checks["daemon alive"] = srv.poll() is None
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"[:3000]
        checks["ran to the end"] = False
    finally:
        out["checks"] = checks
        results = os.environ.get("PIPEXCTL_RESULTS")
        lab.teardown(keep_as=keep_as if results else None)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lacs", type=int, default=12)
    p.add_argument("--sections", type=int, default=50, help="xl2tpd (calls) per LAC namespace")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "scalecalls.json"))
    a = p.parse_args()
    out = run(a.lacs, a.sections, a.timeout, keep_as=Path(a.out).stem)  # the logs beside their record
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1), flush=True)
    return 0 if out["checks"] and all(out["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
