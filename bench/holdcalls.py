"""One offload service holding N calls at once, run inside the guest, as
`pipexctl serve` holds them: the real netlink backend and the real data
path (a tunnel socket on the L2TP port connected to its peer, the kernel
tunnel and session, the PPPoL2TP socket, the relay watching every tunnel
socket), each call in a tunnel of its own, all held until the last; then
every tunnel dropped.

What the daemon holds per call is all here: discovery's model of the calls
(read from a synthetic xl2tpd log of N live calls, as a start reads it), a
pidfd per pppd (each call's "pppd" is a process of its own: a tiny C
program forks N that wait), and the hand-off: the channel and a copy of the
tunnel's socket go over a unix socket (SCM_RIGHTS) to a holder process, as
they go to pppd, and the service closes its own copy of the channel, as
server.py does.  No xl2tpd and no real pppd: what it shows is that the
daemon's own side carries N calls (its fds past 1,024 and its poll loops,
its memory, the time of an offload as the service fills), which real calls
cannot show on a two-vCPU emulated guest (`make scale` stops at a few
hundred real calls there, docs/offload.md).

Every STEP calls: the process's fds and RSS (anonymous and file-backed),
the kernel's session count (/proc/net/pppol2tp), the state file's size,
and the p50/p99 of the last STEP offloads; at the end, the time of one
`status` and one `metrics` report, then the drop of every tunnel and what
is left (sessions, fds).  The drops run with /sys/kernel/rcu_expedited=1
(bench/controlplane.py says why).  --trim-every gives freed heap back
to the kernel as serve does (malloc_trim after the first read and every
10 s); 0 measures the heap as it was before serve did.  --polls adds
serve's full polls (a /proc scan of the N pppds, the farm standing for
their xl2tpd, and a kernel dump of the N sessions) after the first read,
at each step and at rest: without it the figures are those of a daemon
that never looks.  --metrics adds serve's metrics endpoint, scraped over
HTTP after each step and at rest.  Not a test: it asserts nothing.

    python -m pipexctl.testing.vm --memory 4096 --timeout 3600 -- .venv/bin/python bench/holdcalls.py --calls 10000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Iterator

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipexctl.entry import lean  # noqa: E402

lean()  # before anything imports hashlib, as the pipexctl command starts

from controlplane import Floor, nlmod, rcu_expedited  # noqa: E402
from farm import call_lines, pppd_farm  # noqa: E402
from servicestorm import NET, drop_all, finish, pct, setup  # noqa: E402

from pipexctl.discovery.discovery import Discovery  # noqa: E402
from pipexctl.kernel.backend import NetlinkBackend  # noqa: E402
from pipexctl.offload import malloc  # noqa: E402
from pipexctl.offload.datapath import KernelDataPath  # noqa: E402
from pipexctl.offload.protocol import reply  # noqa: E402
from pipexctl.offload.service import OffloadService  # noqa: E402
from pipexctl.offload.watch import CallWatch  # noqa: E402
from pipexctl.testing.probe import memory_kib, peak_mib, pymalloc_mib, reset_peak  # noqa: E402

FD_LIMIT = 65536  # the shipped unit's LimitNOFILE


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def pppol2tp_sessions() -> int:
    """PPPoL2TP sessions the kernel lists (a netlink dump of 10,000 would cost more than it tells)."""
    with open("/proc/net/pppol2tp") as f:  # a line at a time: 10,000 sessions' text whole took 3 MiB of the RSS measured
        return sum(1 for ln in f if ln.startswith("  SESSION") and not ln.startswith("  SESSION name"))  # no header


def status_op_reply(svc: OffloadService) -> int:
    """The status op's answer as this tree's serve makes it (its size):
    pieces of rows sent as they come since 2026-12-07 (``status_chunks``),
    the whole text first before (``status_json``), and before that the
    whole dict first."""
    from pipexctl.offload.protocol import ok_reply

    if hasattr(svc, "status_chunks"):
        return sum(len(piece) for piece in ok_reply(svc.status_chunks()))
    if hasattr(svc, "status_json"):
        return len(ok_reply(svc.status_json()))
    return len(reply(True, **svc.status()))


def rss_mib() -> dict[str, float]:
    """The process's resident memory, MiB: all, anonymous, file-backed."""
    m = memory_kib()
    return {key: round(m[name] / 1024, 1) for name, key in
            (("VmRSS", "rss_mib"), ("RssAnon", "anon_mib"), ("RssFile", "file_mib"))}


PREFIX = "Dec  4 06:00:00 lns xl2tpd[100]: "


def write_xl2tpd_log(path: Path, pids: list[int], xl2tpd_pid: int = 100) -> None:
    """A syslog of N live calls, each in a tunnel of its own, as xl2tpd logs
    them; written call by call, so the bench's own copy of the text is not
    in the RSS it reports as the daemon's."""
    prefix = PREFIX.replace("[100]", f"[{xl2tpd_pid}]")
    with open(path, "w") as f:
        f.write(prefix + f"xl2tpd version xl2tpd-1.3.18 started on lns PID:{xl2tpd_pid}\n")
        for n, pid in enumerate(pids):
            f.write("\n".join(call_lines(prefix, NET, n, pid, argv=True)) + "\n")


@contextlib.contextmanager
def phase(rec: dict, name: str) -> Iterator[None]:
    """The peak RSS over one phase (VmHWM started over at its start), with
    the RSS it started from: ``rec["phases"][name]``, a list of
    [before, peak] in MiB (a phase that repeats, a pair per run).  The
    whole run's peak, ``rec["peak_mib"]``, is the largest of all."""
    before = rss_mib()["rss_mib"]
    rec["peak_mib"] = max(rec.get("peak_mib", 0.0), peak_mib())  # what came before this phase
    reset_peak()
    try:
        yield
    finally:
        top = peak_mib()
        rec.setdefault("phases", {}).setdefault(name, []).append([before, top])
        rec["peak_mib"] = max(rec["peak_mib"], top)
        reset_peak()  # what follows has a peak of its own (a step's offloads: its row's peak_mib)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(exporter: Any, rec: dict) -> None:
    """One GET /metrics as Prometheus sends it, over a bare socket (an HTTP
    library would be in the RSS measured); the exporter's address from
    either tree's server object."""
    addr = getattr(exporter, "address", None) or exporter.server_address
    t = time.monotonic()
    with phase(rec, "scrape"), socket.create_connection(tuple(addr[:2]), timeout=600) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        size = 0
        while chunk := s.recv(1 << 16):
            size += len(chunk)
    rec.setdefault("scrape_ms", []).append(round((time.monotonic() - t) * 1000))
    rec.setdefault("scrape_bytes", []).append(size)


def full_poll(watch: CallWatch, rec: dict) -> None:
    """One of serve's full polls, its watcher's own (/proc scanned outside
    the lock, then the scan and the kernel's sessions applied to discovery's
    model); the events it yields are dropped, as the bench holds every call."""
    t = time.monotonic()
    with phase(rec, "poll"):
        watch._poll(True, lambda ev: None)
    rec.setdefault("poll_ms", []).append(round((time.monotonic() - t) * 1000))


def holder() -> tuple[socket.socket, int]:
    """A process that takes each call's fds as pppd would (SCM_RIGHTS, then
    one byte back) and holds them until its socket closes."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        held = []
        while True:
            msg, fds, _, _ = socket.recv_fds(theirs, 4096, 4)
            if not msg:
                os._exit(0)
            held += fds
            theirs.send(b"k")
    theirs.close()
    return ours, pid


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--step", type=int, default=1000)
    p.add_argument("--max-seconds", type=float, default=2400, help="stop filling after this long (reported)")
    p.add_argument("--trim-every", type=float, default=malloc.TRIM_EVERY,
                   help="give freed heap back to the kernel (malloc_trim) after the first read and this often while "
                        "filling, as serve does (0: never, as serve did before)")
    p.add_argument("--trace", action="store_true",
                   help="tracemalloc from the start: the largest allocations while N calls are held (slower)")
    p.add_argument("--polls", action="store_true",
                   help="serve's full polls too: the farm stands for the LNS's xl2tpd (its pppds show an LNS pppd's "
                        "argv), discovery scans /proc and the kernel after its first read, at each step and at rest")
    p.add_argument("--metrics", action="store_true",
                   help="serve --metrics too: its module imported at the start, its endpoint on loopback, scraped "
                        "over HTTP after each step's poll and at rest")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "holdcalls.json"))
    a = p.parse_args()
    if a.metrics:
        from pipexctl.offload import metrics as prom  # as serve --metrics imports it, before its first read
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
    setup()
    d = tempfile.mkdtemp()
    rec: dict = {"kernel": os.uname().release, "calls_asked": a.calls, "fd_limit": FD_LIMIT,
                 "start": {"fds": fds(), **rss_mib()}, "steps": [], "errors": []}
    t = time.monotonic()
    farm, pids = pppd_farm(a.calls, d, as_xl2tpd=a.polls)
    rec["farm_s"] = round(time.monotonic() - t, 1)
    conn, holder_pid = holder()
    if a.trace:
        tracemalloc.start(3)
    log = Path(d) / "syslog"
    write_xl2tpd_log(log, pids, farm.pid if a.polls else 100)
    watch = CallWatch(Discovery([str(log)], proc=a.polls, kernel=a.polls))
    t = time.monotonic()
    with phase(rec, "first_read"):
        watch.first_read()
    trimmer = malloc.Trimmer(a.trim_every)
    trimmer.maybe()  # as serve does after its first read
    todo = sorted(watch.discovery.tracker.calls(), key=lambda c: c.call_id)
    rec["discovery"] = {"read_s": round(time.monotonic() - t, 1), "calls": len(todo), **rss_mib()}
    print(json.dumps({"start": rec["start"], "discovery": rec["discovery"]}), flush=True)
    backend = NetlinkBackend()
    dp = KernelDataPath()
    svc = OffloadService(watch, backend, dp, state_path=os.path.join(d, "state.json"))
    exporter = prom.start(svc, f"127.0.0.1:{free_port()}") if a.metrics else None
    rec["service"] = rss_mib()

    def hand_off(meta: dict, fds: list[int]) -> None:
        socket.send_fds(conn, [json.dumps(meta).encode()], fds)
        if conn.recv(1) != b"k":
            raise OSError("the holder is gone")

    held = 0
    lat: list[float] = []
    t0 = time.monotonic()
    for c in todo:
        trimmer.maybe()  # as serve's half-second round does
        if time.monotonic() - t0 > a.max_seconds:
            rec["stopped"] = f"after {a.max_seconds:.0f} s"
            break
        t = time.monotonic()
        try:
            ch, _ = svc.offload(c, pppd_pid=c.pppd_pid, hand_off=hand_off)
            ch.close()  # pppd holds it now
        except Exception as e:  # reported, not raised: how far it got is the result
            rec["errors"].append(f"{c.call_id}: {e}")
            if len(rec["errors"]) >= 20:
                rec["stopped"] = "20 errors"
                break
            continue
        lat.append(time.monotonic() - t)
        held += 1
        if held % a.step == 0:
            window = lat[-a.step:]
            row = {"held": held, "elapsed_s": round(time.monotonic() - t0, 1), "fds": fds(), **rss_mib(),
                   "kernel_sessions": pppol2tp_sessions(),
                   "state_file_kib": round(os.path.getsize(svc.state_path) / 1024),
                   "offload_p50_ms": pct(window, 0.5), "offload_p99_ms": pct(window, 0.99),
                   "peak_mib": peak_mib()}  # over this step's offloads (and its trims)
            if a.polls:
                full_poll(watch, rec)
                row["after_poll"] = rss_mib()
            if exporter is not None:
                scrape(exporter, rec)
                row["after_scrape"] = rss_mib()
            rec["steps"].append(row)
            print(json.dumps(row), flush=True)
    rec["held"] = held
    if held:
        per = (rec["steps"][-1]["rss_mib"] - rec["service"]["rss_mib"]) * 1024 / rec["steps"][-1]["held"] \
            if rec["steps"] else None
        rec["kib_per_call"] = round(per, 2) if per is not None else None
    if a.polls:
        full_poll(watch, rec)
    if a.trim_every:  # all held, before any report, trimmed as serve's next round would
        malloc.trim()
        rec["held_trimmed"] = {**rss_mib(), **pymalloc_mib()}
    t = time.monotonic()
    with phase(rec, "status"):
        status_op_reply(svc)
    rec["status_ms"] = round((time.monotonic() - t) * 1000, 1)
    rec["held_mem"] = rss_mib()
    if a.trim_every:
        malloc.trim()
        rec["after_status_trimmed"] = {**rss_mib(), **pymalloc_mib()}
    if a.trace:
        snap = tracemalloc.take_snapshot()
        rec["traced_mib"] = round(sum(st.size for st in snap.statistics("filename")) / 2**20, 1)
        rec["traced_top"] = [f"{st.size / 2**20:.2f} MiB {st.count} blocks {st.traceback}"
                             for st in snap.statistics("lineno")[:25]]
        tracemalloc.stop()
    t = time.monotonic()
    with phase(rec, "metrics"):
        m = svc.metrics()
        reply(True, **m)
    rec["metrics_ms"] = round((time.monotonic() - t) * 1000, 1)
    # the kernel's part of it: the same session dump, its answers read and not decoded
    assert backend.nl is not None
    fl = Floor(backend.nl.family)
    t = time.monotonic()
    fl.run(fl.encode(nlmod.build_session_get(), dump=True))
    rec["dump_floor_ms"] = round((time.monotonic() - t) * 1000, 1)
    fl.close()
    rec["metrics_sessions"] = len(m["sessions"]) + m["sessions_not_listed"]["count"]
    if a.polls:
        full_poll(watch, rec)
    if exporter is not None:
        scrape(exporter, rec)
    rec["after_reports"] = rss_mib()
    if a.trim_every:
        malloc.trim()  # serve's next round, at most TRIM_EVERY after the reports
        rec["after_reports_trimmed"] = {**rss_mib(), **pymalloc_mib()}
    rec["trim_every_s"] = a.trim_every
    rec["polls"] = a.polls
    rec["metrics_endpoint"] = a.metrics
    if exporter is not None:
        exporter.shutdown()
    rec["peak_mib"] = max(rec["peak_mib"], peak_mib())
    print(json.dumps({k: rec[k] for k in ("held", "kib_per_call", "status_ms", "metrics_ms", "dump_floor_ms",
                                          "metrics_sessions",
                                          "held_mem", "after_reports")}), flush=True)
    with rcu_expedited("1") as before:
        rec["rcu_expedited_before"] = before
        t = time.monotonic()
        drop_all(svc)
        conn.close()  # the holder exits: the "pppds" let go of their channels
        os.waitpid(holder_pid, 0)
        rec["drop_all_s"] = round(time.monotonic() - t, 1)
    farm.send_signal(signal.SIGKILL)
    farm.wait()
    rec["left"] = {"kernel_sessions": len(backend.session_dump()), "kernel_tunnels": len(backend.tunnel_dump()),
                   "fds": fds(), **rss_mib()}
    print(json.dumps({"drop_all_s": rec["drop_all_s"], "left": rec["left"], "errors": rec["errors"][:3]}), flush=True)
    backend.close()
    watch.discovery.close()
    return finish(dp, rec, a.out)


if __name__ == "__main__":
    sys.exit(main())
