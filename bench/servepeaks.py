"""The peaks of `pipexctl serve`'s memory at N calls, phase by phase, on
the host (no kernel): the start's read of discovery's model, a full poll
(/proc scanned and the kernel's sessions applied), the status op, the
metrics op and a scrape of the metrics endpoint.  Each phase's peak RSS
(VmHWM, started over per phase: probe.reset_peak) against the RSS before
it, the heap trimmed before and after each as serve trims it.

The N pppds are real processes (bench/farm.py's farm, named xl2tpd, whose
children show an LNS pppd's argv); the service holds a record per call on
the null kernel backend, and the kernel's word on which calls it holds is
a stand-in that places every call (``--pty-first``: none at the start's
read, every one from the first poll on, as for a daemon that starts on
calls still on their ptys).  bench/holdcalls.py measures the same in the
guest with real kernel calls.  To compare two commits, run this in a
worktree of each.  Not a test: it asserts nothing.

    .venv/bin/python bench/servepeaks.py --calls 10000 [--pty-first]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(ROOT))

from pipexctl.entry import lean  # noqa: E402

lean()  # before anything imports hashlib, as the pipexctl command starts

from farm import call_lines, pppd_farm  # noqa: E402

from pipexctl.discovery.discovery import Discovery  # noqa: E402
from pipexctl.kernel.backend import NullBackend  # noqa: E402
from pipexctl.model import PwType, SessionSpec, TunnelSpec  # noqa: E402
from pipexctl.offload import malloc, metrics  # noqa: E402  # metrics: as serve --metrics imports it
from pipexctl.offload.datapath import NullDataPath  # noqa: E402
from pipexctl.offload.protocol import reply  # noqa: E402
from pipexctl.offload.service import OffloadService, TunnelState  # noqa: E402
from pipexctl.offload.statefile import SessionRecord  # noqa: E402
from pipexctl.offload.watch import CallWatch  # noqa: E402
from pipexctl.testing.probe import memory_kib, peak_mib, reset_peak  # noqa: E402


def rss() -> float:
    return round(memory_kib()["VmRSS"] / 1024, 1)


class Placed:
    """The kernel's session dump, every call of the farm in it (none at the first ask with ``late``)."""

    netns = None

    def __init__(self, n: int, late: bool) -> None:
        self.n, self.late = n, late

    def session_ids(self) -> set[tuple[int, int]]:
        if self.late:
            self.late = False
            return set()
        return {(1000 + i, 3000 + i) for i in range(self.n)}  # farm.call_lines' ids

    def session_keys(self) -> set[int]:  # what a poll asks since 2026-12-07 (a tree without it asks session_ids)
        if self.late:
            self.late = False
            return set()
        return {(1000 + i) << 32 | (3000 + i) for i in range(self.n)}

    def close(self) -> None:
        pass


def status_op(svc: OffloadService) -> int:
    """The status op's answer as this tree's serve sends it (its size)."""
    from pipexctl.offload.protocol import ok_reply

    if hasattr(svc, "status_chunks"):
        return sum(len(piece) for piece in ok_reply(svc.status_chunks()))
    return len(ok_reply(svc.status_json()))


def scrape(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        size = 0
        while chunk := s.recv(1 << 16):
            size += len(chunk)
    return size


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--pty-first", action="store_true", help="no call in the kernel at the start's read")
    p.add_argument("--polls", type=int, default=2)
    p.add_argument("--out", help="write the record here as JSON")
    a = p.parse_args()
    d = tempfile.mkdtemp()
    farm, pids = pppd_farm(a.calls, d, as_xl2tpd=True)
    try:
        log = os.path.join(d, "syslog")
        prefix = f"Dec  4 06:00:00 lns xl2tpd[{farm.pid}]: "
        with open(log, "w") as f:
            f.write(prefix + f"xl2tpd version xl2tpd-1.3.18 started on lns PID:{farm.pid}\n")
            for n, pid in enumerate(pids):
                f.write("\n".join(call_lines(prefix, "10.200", n, pid, argv=True)) + "\n")
        disc = Discovery([log], proc=True, kernel=True)
        disc._backend = Placed(a.calls, a.pty_first)  # type: ignore[assignment]
        watch = CallWatch(disc)
        rec: dict[str, Any] = {"calls": a.calls, "pty_first": a.pty_first, "phases": {}}

        def phase(name: str, fn: Callable[[], object]) -> None:
            gc.collect()
            malloc.trim()
            before = rss()
            reset_peak()
            t = time.monotonic()
            fn()
            took = time.monotonic() - t
            top = peak_mib()
            gc.collect()
            malloc.trim()
            rec["phases"][name] = {"before_mib": before, "peak_mib": top, "above_mib": round(top - before, 1),
                                   "after_trim_mib": rss(), "s": round(took, 2)}

        phase("first_read", watch.first_read)
        backend = NullBackend()
        svc = OffloadService(watch, backend, NullDataPath(), state_path=os.path.join(d, "state.json"))
        for c in watch.discovery.tracker.calls():  # held as a reconcile adopts them (no offload is measured)
            tid = c.tunnel_id
            assert tid is not None
            ts = TunnelState(c.instance, tid, tid + 1000, "127.0.0.1", c.peer, 1701, None, 1701)
            svc.tunnels[(c.instance, tid)] = ts
            ts.records[c.call_id] = SessionRecord(call_id=c.call_id, peer_call_id=c.call_id + 1000,
                                                  pppd_pid=c.pppd_pid)
            backend.tunnel_create(TunnelSpec(tunnel_id=tid, peer_tunnel_id=tid + 1000, version=2, fd=0))
            backend.session_create(SessionSpec(tunnel_id=tid, session_id=c.call_id, peer_session_id=c.call_id + 1000,
                                               version=2, pw_type=PwType.ppp))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        exporter = metrics.start(svc, f"127.0.0.1:{port}")
        gc.collect()
        malloc.trim()
        rec["held_mib"] = rss()
        for i in range(a.polls):
            phase(f"poll_{i + 1}", lambda: watch._poll(True, lambda ev: None))
        phase("status", lambda: status_op(svc))
        phase("metrics_op", lambda: reply(True, **svc.metrics()))
        phase("scrape", lambda: scrape(port))
        exporter.shutdown()
        rec["at_end_mib"] = rss()
    finally:
        farm.kill()
        farm.wait()
    print(json.dumps(rec, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
