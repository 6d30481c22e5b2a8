"""Login storm, run inside the guest: K calls dialled at once, one from each
of K LAC namespaces (each its own tunnel and address), against one LNS.

Two rounds per K, in one boot:
- (c) the LNS's xl2tpd in kernel mode (pppol2tp.so): time until every call
  is up (K PPP links with IPCP done on the LNS, each timed as the kernel
  announces its IPv4 address: AddrEvents);
- (d) the LNS's xl2tpd in userspace mode with `pipexctl serve` (at the
  unit's nice value) and the plugin: time until every call is up and
  offloaded (K PPP links, and K PPPoL2TP sessions in /proc/net/pppol2tp,
  read every 0.25 s in both modes: kernel_sessions_at),
  and the request -> channel latency from the daemon's own records.
- (s) as (d), with a client scraping the daemon's Prometheus endpoint back
  to back for the whole storm: what a scrape loop costs the offloads
  (both (d) and (s) run with `--metrics`, so the only difference is the
  scraping).
- (n) as (d), with `pipexctl_move 0`: no plugin timer, so no control link
  per call: what the links cost a storm.
- (u) as (d), with the daemon at nice 0: (d) runs it at the shipped
  unit's `Nice=` (systemd/pipexctl.service), as systemd starts it.
The LACs run xl2tpd's kernel mode in every round, so their cost is the same.
Every xl2tpd runs with `max retries = 8` (--max-retries) in every round:
with xl2tpd's default of 5 a starved guest lost calls to timed-out
tunnels in both modes in most boots, and a round that loses calls gives no
time to all up.  Each row also records, for every count of calls, when it
was reached (up_at, offloaded_at), xl2tpd's timed-out tunnels, and the LNS's
UDP drops, so a round that still loses calls says how long the rest took.
--rmem-default raises the receive buffer of sockets that do not size
their own, as docs/operations.md advises for xl2tpd's, in every round.
Each row also has the guest's busy CPU seconds over the round (by program:
by_command) and, in the pipexctl rounds, the daemon's own CPU seconds and
its resident memory.
Not a test: it asserts nothing.

    python -m pipexctl.testing.vm --memory 4096 -- .venv/bin/python bench/loginstorm.py --k 25,100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyroute2.netlink.rtnl import RTM_DELADDR, RTM_NEWADDR, RTMGRP_IPV4_IFADDR  # noqa: E402
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg  # noqa: E402

from pipexctl import netns  # noqa: E402
from pipexctl.discovery import udpdrops  # noqa: E402
from pipexctl.testing.lab import Lab, journal_copy, kernel_objects, plugin_options, syslogd  # noqa: E402
from pipexctl.testing.probe import cpu_jiffies, memory_kib, ppp_inet_links, process_jiffies  # noqa: E402

SAMPLER = Path(__file__).resolve().parent / "cpusampler"


def pppol2tp_sessions(ns: str) -> int:
    """PPP sessions on PPPoL2TP sockets in ``ns`` (its /proc/net/pppol2tp),
    read in-process rather than by a process per poll."""
    with netns.enter(ns):
        text = Path("/proc/thread-self/net/pppol2tp").read_text()
    return sum(1 for line in text.splitlines() if line.lstrip().startswith("SESSION '"))


class AddrEvents:
    """When each PPP link in ``ns`` got its IPv4 address (IPCP done), from the
    kernel's rtnetlink notifications, stamped as they arrive.  Counting the
    links with `ip -j addr show` instead took 4 to 13 s per count in a K = 153
    storm (a dump interrupted by links coming and going is taken again, each
    time by a new `ip` process on a saturated guest), so a round's time to all
    up was known only to within that step.  Decoded with pyroute2's ifaddrmsg.
    ``overrun``: the socket's queue overflowed (ENOBUFS) and events were lost,
    or one could not be read; the caller counts by dump then."""

    def __init__(self, ns: str, prefix: str = "ppp") -> None:
        self.prefix = prefix  # of the links' names
        with netns.enter(ns):  # the socket belongs to the namespace it is made in
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE: root, past rmem_max
        self.sock.bind((0, RTMGRP_IPV4_IFADDR))
        self.sock.settimeout(0.2)
        self.t0 = time.monotonic()
        self.links: dict[int, float] = {}  # ifindex of a ppp link with an IPv4 address -> when it got it
        self.up_at: list[float] = []  # seconds from t0 at which the count first reached i + 1
        self.overrun = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def start(self) -> None:
        """Count from now (the first dial)."""
        self.t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:  # ENOBUFS: the queue overflowed
                self.overrun = True
                return
            try:
                self._take(data, time.monotonic())
            except Exception:  # a message it cannot read: counted by dump from here on, not a silent stop
                self.overrun = True
                return

    def _take(self, data: bytes, now: float) -> None:
        off = 0
        while off + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, off)
            if length < 16 or off + length > len(data):
                break
            if kind in (RTM_NEWADDR, RTM_DELADDR):
                m = ifaddrmsg(data[off:off + length])
                m.decode()
                if m["family"] == socket.AF_INET and (m.get_attr("IFA_LABEL") or "").startswith(self.prefix):
                    if kind == RTM_NEWADDR:
                        self.links.setdefault(m["index"], now)
                    else:
                        self.links.pop(m["index"], None)
                    if len(self.links) > len(self.up_at):
                        self.up_at.append(round(now - self.t0, 2))
            off += (length + 3) & ~3

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def cpu_by_command() -> dict[str, int]:
    """Clock ticks of CPU used so far by the live processes, by command name:
    each one's own and that of the children it waited for (so a script
    that ran and exited counts for its parent's name).  Two of these, before
    and after a round, say which programs the round's CPU went to, roughly:
    a process that exits in the round moves all its CPU, from before the
    round too, to its parent's name, and its own name's loss is dropped."""
    out: dict[str, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    comm, _, rest = f.read().rpartition(")")
            except OSError:
                continue
            out[comm.partition("(")[2]] = out.get(comm.partition("(")[2], 0) + sum(int(x) for x in rest.split()[11:15])
    return out


def udp_counters(ns: str) -> dict[str, int]:
    """The UDP counters of ``ns`` (RcvbufErrors: datagrams dropped because a
    socket's receive queue was full), and the drops of its sockets still
    open: on unconnected ones (xl2tpd's own) and on connected ones (a
    tunnel's: xl2tpd's in kernel mode, pipexctl's).  The daemon's own check
    (pipexctl_xl2tpd_socket_drops) reads the same files."""
    with netns.enter(ns):
        c = udpdrops.counters("/proc/thread-self/net")
    return {"InDatagrams": c.in_datagrams, "InErrors": c.in_errors, "RcvbufErrors": c.rcvbuf_errors,
            "drops_unconnected": c.drops_unconnected, "drops_connected": c.drops_connected}


def timeouts(lab: Lab) -> dict[str, int]:
    """Tunnels each side's xl2tpd closed after its last retransmission."""
    def count(path: Path) -> int:
        return path.read_bytes().count(b"Maximum retries exceeded") if path.exists() else 0
    return {"lns": count(lab.lns.log), "lacs": sum(count(lac.log) for lac in lab.lacs)}


ESTABLISHED = re.compile(rb"Connection established to [0-9.]+, \d+\.  Local: (\d+),")


def clashes(lab: Lab) -> int:
    """Tunnel ids the LNS's xl2tpd gave to two tunnels in the round (it does
    not check its random ids, and delivers both tunnels' messages to the
    newer one: a call is lost in either mode).  A clash during set-up, where
    the older tunnel is never established, does not show here."""
    seen = ESTABLISHED.findall(lab.lns.log.read_bytes()) if lab.lns.log.exists() else []
    return len(seen) - len(set(seen))


def reached(at: list[float], n: int, k: int, t0: float) -> float | None:
    """Note in ``at`` the time since ``t0`` for each count up to ``n`` (of
    ``k``) not noted yet; that time once all ``k`` are there, else None."""
    now = time.monotonic() - t0
    at += [round(now, 2)] * (min(n, k) - len(at))
    return now if n >= k else None


def unit_nice() -> int:
    """The daemon's nice value in the shipped systemd unit (0 if it sets none)."""
    unit = Path(__file__).resolve().parent.parent / "systemd" / "pipexctl.service"
    return next((int(ln.split("=", 1)[1]) for ln in unit.read_text().splitlines() if ln.startswith("Nice=")), 0)


METRICS_PORT = 9479
TICK = os.sysconf("SC_CLK_TCK")


def serve_memory(pid: int) -> dict:
    """The daemon's resident memory now and at its peak, MiB, its threads,
    and its resident memory by kind of mapping (smaps): the heap, anonymous
    mappings (other threads' malloc arenas, pymalloc's arenas, stacks) and
    files (the interpreter, libraries, extension modules)."""
    m = memory_kib(pid)
    out: dict = {"rss_mib": round(m["VmRSS"] / 1024, 1), "peak_rss_mib": round(m["VmHWM"] / 1024, 1),
                 "threads": m["Threads"]}
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


def storm(k: int, offload: bool, timeout: float, scrape: bool = False, tag: str = "", pppd_extra: str = "",
          max_retries: int = 0, serve_nice: int = 0, profile: str = "", syslog: str = "") -> dict:
    # both ends alike, in both modes (the module's docstring says why)
    retries = f"max retries = {max_retries}\n" if max_retries else ""
    lab = Lab(kernel_mode=not offload, lac_kernel_mode=True, lac_extra_pppd="", lns_global=retries,
              lac_global=retries, serve_nice=serve_nice, lns_args=("-l",) if syslog else (),
              lns_log_source="journal-id:xl2tpd" if syslog == "journal" else "")
    stop, scrapes = threading.Event(), [0, 0]
    logger = contextlib.ExitStack()
    try:
        lab.setup(k)
        if syslog == "rsyslog":  # the LNS's xl2tpd (and every pppd) logs through rsyslog, which writes the LNS's log
            logger.enter_context(syslogd("rsyslog", lab.lns.log))
        elif syslog == "journal":  # into the journal, which the daemon reads; a copy for the lab's waits
            logger.enter_context(journal_copy(lab.lns.log, "xl2tpd", "pppd"))
        lab.start_all(plugin_options() + "pipexctl_timeout 60\n" + pppd_extra if offload else "")
        if offload:
            # --profile-cpu: the daemon's CPU by stack (bench/cpusampler), written to `profile`
            env = {"PYTHONPATH": os.pathsep.join(filter(None, (str(SAMPLER), os.environ.get("PYTHONPATH")))),
                   "PIPEXCTL_SAMPLE_OUT": profile} if profile else None
            lab.serve_all([lab.lns], "--wait", "60", "--metrics", f"127.0.0.1:{METRICS_PORT}", env=env)
        if scrape:
            threading.Thread(target=scrape_loop, args=(lab.lns.ns, stop, scrapes), daemon=True).start()
            time.sleep(1)  # the loop running before the first dial
        serve_pid = lab.serves[-1].pid if offload else None  # `ip netns exec` execs the daemon: its pid
        events = logger.enter_context(contextlib.closing(AddrEvents(lab.lns.ns)))
        cpu0, machine0, by_command0 = (process_jiffies(serve_pid, children=True) if serve_pid else 0), \
            cpu_jiffies(), cpu_by_command()
        events.start()
        t0 = time.monotonic()
        for lac in lab.lacs:
            lab.control(lac, "c lns")
        dialled = time.monotonic() - t0
        up = offloaded = None
        end = t0 + timeout
        rss_seen: list[float] = []  # the daemon's RSS, MiB, every 10 s from the first dial
        # up_at[i]: seconds from the first dial until i + 1 calls were up (offloaded_at: in the kernel), so a
        # round that loses calls still says how long the others took
        up_at: list[float] = []
        offloaded_at: list[float] = []
        while time.monotonic() < end:
            if serve_pid and len(rss_seen) <= (time.monotonic() - t0) // 10:
                rss_seen.append(serve_memory(serve_pid)["rss_mib"])
            if offloaded is None:  # the PPPoL2TP sessions: pipexctl's, or in kernel mode xl2tpd's own
                offloaded = reached(offloaded_at, pppol2tp_sessions(lab.lns.ns), k, t0)
            if up is None and not events.overrun:
                up = events.up_at[k - 1] if len(events.up_at) >= k else None
            elif up is None:  # events were lost: counted by dump from here on, in steps of seconds
                up_at[:] = up_at or events.up_at
                up = reached(up_at, len(ppp_inet_links(lab.lns.ns)), k, t0)
            if up is not None and (offloaded is not None or not offload):
                break
            time.sleep(0.25)  # read in both modes, so that its cost is the same in both
        stop.set()
        machine1, by_command1 = cpu_jiffies(), cpu_by_command()
        out = {"k": k, "max_retries": max_retries or None, "serve_nice": serve_nice or None,
               "dial_seconds": round(dialled, 2), "all_up_seconds": up,
               "up_at": up_at if events.overrun else list(events.up_at),
               "up_counted_by": "ip addr dumps (rtnetlink events lost)" if events.overrun else "rtnetlink events",
               # the same count two ways: the events' against a dump at the end
               "links_up": len(ppp_inet_links(lab.lns.ns)), "links_up_by_events": len(events.links),
               "kernel_sessions_at": offloaded_at,
               "objects": kernel_objects(lab.lns.ns),
               # why a round loses calls: xl2tpd's timed-out tunnels, the LNS's dropped datagrams
               "max_retries_exceeded": timeouts(lab), "tunnel_id_clashes": clashes(lab),
               "lns_udp": udp_counters(lab.lns.ns),
               # from the first dial to the end of the round: what the daemon took of the guest's CPU
               "cpu_seconds": {"machine_busy": round((machine1[0] - machine0[0]) / TICK, 1),
                               "machine_all": round((machine1[1] - machine0[1]) / TICK, 1),
                               # the programs that used 0.5 s or more (the daemon's command is "pipexctl")
                               "by_command": dict(sorted(((c, round((t - by_command0.get(c, 0)) / TICK, 1))
                                                          for c, t in by_command1.items()
                                                          if t - by_command0.get(c, 0) >= TICK // 2),
                                                         key=lambda x: -x[1]))}}
        if serve_pid:
            # the daemon and the children it waited for
            out["cpu_seconds"]["serve"] = round((process_jiffies(serve_pid, children=True) - cpu0) / TICK, 1)
            out["serve_memory"] = {**serve_memory(serve_pid), "rss_mib_every_10s": rss_seen}
        if offload:
            st = lab.serve_status(lab.lns)
            # up and offloaded: the plugin gives pppd its channel before LCP starts
            out["all_offloaded_seconds"] = None if offloaded is None or up is None else max(up, offloaded)
            out["offloaded_at"] = offloaded_at
            out["channel_latency_ms"] = st.get("channel_latency_ms")
            out["stats"] = st.get("stats")
        if scrape:
            out["scrapes"], out["scrape_errors"] = scrapes
        return out
    except Exception as e:  # one K's failure is a row of its own; the next K still runs
        return {"k": k, "error": f"{type(e).__name__}: {e}"[:2000]}
    finally:
        stop.set()
        logger.close()
        if os.environ.get("PIPEXCTL_RESULTS") and lab.instances():  # both modes: xl2tpd's own losses
            d = Path(os.environ["PIPEXCTL_RESULTS"]) / f"storm-{k}{tag}"
            d.mkdir(exist_ok=True)
            for name in ("serve.log", "xl2tpd.log", "pppd.log"):  # pppd.log: why a pppd exited
                if (lab.lns.dir / name).exists():
                    (d / f"lns-{name}").write_bytes((lab.lns.dir / name).read_bytes())
        lab.teardown()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--k", default="25,100", help="comma-separated numbers of calls dialled at once (at most 153)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--cases", default="c,d", help="comma-separated, in this order: c (kernel mode), d (pipexctl), "
                   "s (pipexctl under a scrape loop), n (pipexctl, no control links), u (pipexctl, its daemon at "
                   "nice 0, not the unit's); a case named twice runs twice")
    p.add_argument("--max-retries", type=int, default=8,
                   help="xl2tpd's \"max retries\" on the LNS and every LAC, both modes (0: xl2tpd's default, 5)")
    p.add_argument("--rmem-default", type=int, default=0,
                   help="net.core.rmem_default for the run, bytes (0: left as it is, the kernel's 212992 unless "
                        "something else set it; a global sysctl, put back when the run ends): the receive buffer of "
                        "every socket that does not size its own, xl2tpd's among them (docs/operations.md)")
    p.add_argument("--syslog", choices=("rsyslog", "journal"), nargs="?", const="rsyslog", default="",
                   help="the LNS's xl2tpd logs through syslog (-l), in every round: rsyslog writes the log the "
                        "daemon reads, in Debian's traditional format, and the daemon's log barriers go through it; "
                        "journal (a guest booted with --init systemd, Debian's default install): journald keeps "
                        "it, and the daemon reads the journal")
    p.add_argument("--profile-cpu", action="store_true",
                   help="sample the daemon's CPU by Python stack (bench/cpusampler; it costs the daemon CPU of its "
                        "own, so a profiled round's times are not the bench's): cpu-K-CASE.txt beside --out")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "loginstorm.json"))
    a = p.parse_args()
    # a global sysctl, read by every namespace's new sockets: put back when the
    # run ends, so a later run in the boot with 0 has the kernel's default
    sysctls = {name: Path(f"/proc/sys/net/core/{name}") for name in ("rmem_max", "rmem_default")}
    saved = {name: f.read_text() for name, f in sysctls.items()}
    try:
        if a.rmem_default:
            for name, f in sysctls.items():
                if name == "rmem_default" or int(f.read_text()) < a.rmem_default:
                    f.write_text(str(a.rmem_default))
        return run(a)
    finally:
        for name, f in sysctls.items():
            f.write_text(saved[name])


def run(a: argparse.Namespace) -> int:
    rows, nice = [], unit_nice()
    for k in (int(x) for x in a.k.split(",") if x):
        for n, case in enumerate(a.cases.split(",")):
            r = storm(k, case != "c", a.timeout, scrape=case == "s", tag=f"-{case}{n}",
                      pppd_extra="pipexctl_move 0\n" if case == "n" else "", max_retries=a.max_retries,
                      serve_nice=0 if case in "cu" else nice,
                      profile=str(Path(a.out).parent / f"cpu-{k}-{case}{n}.txt") if a.profile_cpu and case != "c" else "",
                      syslog=a.syslog)
            r["rmem_default"] = int(Path("/proc/sys/net/core/rmem_default").read_text())
            r["lns_log"] = a.syslog or "xl2tpd -D"
            r["case"] = {"c": "c-xl2tpd-kernel", "d": "d-pipexctl", "s": "s-pipexctl-scraped",
                         "n": "n-pipexctl-no-links", "u": "u-pipexctl-nice-0"}[case]
            rows.append(r)
            print(json.dumps(r), flush=True)
    Path(a.out).write_text(json.dumps({"kernel": os.uname().release, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
