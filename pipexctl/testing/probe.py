"""Independent probes of kernel state for tests, the lab and the churn.

They read what iproute2 prints, not what pipexctl says.  ``ip -j`` dumps
through rtnetlink; when the kernel changes the table mid-dump (a PPP link
coming up while 20 calls start) it marks the dump NLM_F_DUMP_INTR and
iproute2 prints "Dump was interrupted and may be inconsistent." on stderr.
Such a dump is taken again, never parsed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

INTERRUPTED = "Dump was interrupted"


class ProbeError(RuntimeError):
    pass


def cpu_jiffies() -> tuple[int, int]:
    """The whole machine's CPU time since boot, all CPUs, in clock ticks:
    (busy, all), from /proc/stat's first line (busy: all but idle and
    iowait; guest time is inside user time, so not counted again)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]  # user .. steal
    return sum(v) - v[3] - v[4], sum(v)


def process_jiffies(pid: int, children: bool = False) -> int:
    """Clock ticks of CPU process ``pid`` has used, user and system (with
    ``children``: also the children it waited for); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()  # from field 3 of stat(5) on
    except OSError:
        return 0
    return sum(int(x) for x in rest[11:15 if children else 13])  # utime, stime (, cutime, cstime)


def memory_kib(pid: int | str = "self") -> dict[str, int]:
    """``pid``'s memory figures in /proc/PID/status (VmRSS, VmHWM, RssAnon,
    RssFile, ...), KiB, and its Threads count."""
    with open(f"/proc/{pid}/status") as f:
        return {name: int(value.split()[0]) for name, _, value in (ln.partition(":") for ln in f)
                if name.startswith(("Vm", "Rss")) or name == "Threads"}


def reset_peak() -> None:
    """Start this process's peak RSS (VmHWM) over from its RSS now
    (clear_refs' 5, Linux 4.0): the peak of one phase of a bench."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_mib() -> float:
    """This process's peak RSS (VmHWM) since it started or since ``reset_peak``, MiB."""
    return round(memory_kib()["VmHWM"] / 1024, 1)


def pymalloc_mib() -> dict[str, float]:
    """This process's small-object allocator (``sys._debugmallocstats``),
    MiB: its arenas, the blocks in use in them, and the rest (free blocks
    and pools that keep an arena from being returned; what a trim cannot
    give back)."""
    with tempfile.TemporaryFile() as f:  # a file, not a pipe: the report may outgrow a pipe's buffer
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)  # the report goes to C's stderr, not to sys.stderr
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        raw = f.read()
    text = raw.decode(errors="replace")
    m = re.search(r"^(\d+) arenas \* (\d+) bytes/arena", text, re.M)
    u = re.search(r"^# bytes in allocated blocks\s*=\s*([\d,]+)", text, re.M)
    arenas = int(m[1]) * int(m[2]) / 2**20 if m else 0.0
    used = int(u[1].replace(",", "")) / 2**20 if u else 0.0
    return {"arenas_mib": round(arenas, 1), "in_use_mib": round(used, 1), "unused_mib": round(arenas - used, 1)}


def ip_json(ns: str | None, *args: str, tries: int = 20) -> list[Any]:
    """``ip [-n ns] -j ARGS`` as parsed JSON; a dump the kernel marked
    interrupted is taken again (up to ``tries`` times)."""
    cmd = ["ip", *(["-n", ns] if ns else []), "-j", *args]
    last = ""
    for _ in range(tries):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if INTERRUPTED in r.stderr or INTERRUPTED in r.stdout:
            last = "interrupted dump"
            time.sleep(0.05)
            continue
        if r.returncode != 0:
            raise ProbeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
        out: list[Any] = json.loads(r.stdout or "[]")
        return out
    raise ProbeError(f"{' '.join(cmd)}: {last} {tries} times in a row")


def ppp_peer_addrs(ns: str) -> dict[str, str]:
    """{pppN: its peer's IPv4 address} for the PPP links in ``ns`` with IPCP done."""
    return {i["ifname"]: a.get("address") for i in ip_json(ns, "addr", "show") if i["ifname"].startswith("ppp")
            for a in i.get("addr_info", []) if a.get("family") == "inet"}


def ppp_inet_links(ns: str) -> list[str]:
    """Names of the PPP links in ``ns`` that carry an IPv4 address (IPCP done)."""
    return list(ppp_peer_addrs(ns))


def wait_until(pred: Callable[[], object], what: str, timeout: float = 60, detail: Callable[[], str] = lambda: "",
               interval: float = 0.1) -> None:
    """Poll ``pred`` until true; else AssertionError naming ``what``, with ``detail()`` appended."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out ({timeout:.0f} s) waiting for {what}{detail()}")
