"""What the offload service reports: ``status`` (the plugin socket's
``status`` op) and ``metrics`` (``--metrics`` and `pipexctl stat --serve`)."""

from __future__ import annotations

import heapq
import json
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

from .. import errors
from ..discovery.state import CallInfo
from ..kernel.backend import NetlinkBackend
from ..model import SessionCounters

if TYPE_CHECKING:
    from .service import OffloadService, TunnelState


# rows encoded per hold of a lock: a status of 10,000 calls never keeps an
# offload or the log reader waiting for long
BATCH = 256


def status(svc: "OffloadService") -> dict[str, Any]:
    return dict(json.loads(b"".join(status_chunks(svc))))


def status_chunks(svc: "OffloadService") -> Iterator[bytes]:
    """The status (every call and its path, every tunnel, the counters) as
    one JSON object, in pieces of at most BATCH rows, each encoded under
    its lock and handed on outside it (the status op sends each as it comes).
    The first piece opens the object with its first field.  Building every
    row first grew the daemon's small-object heap by 4 to 5 MiB at 10,000
    calls, and the heap kept it; encoding the whole text first still took
    5 MiB at its peak (docs/offload.md)."""
    enc = json.JSONEncoder().encode  # json.dumps' own output
    with svc.watch.lock:
        tracker = svc.watch.discovery.tracker
        calls = [c for name in sorted(tracker.instances)
                 for c in sorted(tracker.instances[name].calls.values(), key=_in_tunnel_order)]
    yield b'{"instances": ' + enc(svc.watch.instances()).encode() + b', "calls": '
    # each row under the discovery lock, the record as one change left it;
    # the service's records are read without its lock (a lookup is one step)
    yield from _rows(calls, svc.watch.lock, lambda c: enc(_call_row(svc, c)))
    yield b', "tunnels": '
    with svc.lock:
        tunnels = list(svc.tunnels.values())
    yield from _rows(tunnels, svc.lock, lambda t: enc(_tunnel_row(svc, t)))
    with svc.lock:
        tail = {
            "stats": {**svc.stats, "unchecked_calls": svc.watch.unchecked,
                      "unbarriered_calls": svc.watch.unbarriered,
                      "control_questions": svc.watch.questions,
                      "control_questions_ahead": svc.watch.questions_ahead,
                      "xl2tpd_socket_drops": svc.watch.udp_drops.dropped,
                      "disputed_calls": svc.watch.discovery.tracker.disputes},
            "datapath": svc.datapath.stats(),
            "reconcile": svc.last_reconcile,
            "channel_latency_ms": percentiles([x * 1000 for x in svc.latencies_now()]),
        }
    yield b", " + enc(tail)[1:].encode()


def _in_tunnel_order(c: CallInfo) -> int:
    return (c.tunnel_id or 0) << 16 | c.call_id


def _rows(items: list[Any], lock: ContextManager[Any], row: Callable[[Any], str]) -> Iterator[bytes]:
    """``items`` as a JSON array, a piece per BATCH rows, each encoded in one
    hold of ``lock`` and yielded after it (a slow reader never holds it)."""
    yield b"["
    for start in range(0, len(items), BATCH):
        with lock:
            piece = ", ".join(row(items[i]) for i in range(start, min(start + BATCH, len(items))))
        yield (b", " if start else b"") + piece.encode()
    yield b"]"


def _call_row(svc: "OffloadService", c: CallInfo) -> dict[str, Any]:
    ts = svc.tunnels.get((c.instance, c.tunnel_id)) if c.tunnel_id is not None else None
    r = ts.records.get(c.call_id) if ts is not None else None
    return {"instance": c.instance, "role": c.role, "tunnel_id": c.tunnel_id, "call_id": c.call_id,
            "peer": c.peer, "pppd_pid": c.pppd_pid,
            "path": ("offloaded" if r is not None else
                     "xl2tpd kernel mode" if c.data_path == "kernel" else
                     "pty" if c.data_path == "userspace" else "unknown"),
            # since when it is on its path (epoch s): an offloaded call since its
            # offload (moved: while it ran, from its pty); another since its path
            # last changed (moved back), if it did while the daemon watched
            **({"moved": r.moved, "since": r.since} if r is not None else
               {"since": c.path_changed} if c.path_changed else {}),
            "why_not": svc.pty_reasons.get(c.pppd_pid) if c.pppd_pid else None}


def _tunnel_row(svc: "OffloadService", t: "TunnelState") -> dict[str, Any]:
    return {"tunnel_id": t.tunnel_id, "peer_tunnel_id": t.peer_tunnel_id, "local": t.local,
            "local_port": t.local_port, "steered": t.local_port != svc.xl2tpd_port,
            "peer": f"{t.peer}:{t.peer_port}",
            "sessions": sorted(t.records), "holds_socket": t.sock is not None,
            "pppd_pids": {c: r.pppd_pid for c, r in t.records.items()}}


def metrics(svc: "OffloadService") -> dict[str, Any]:
    """The numbers behind ``--metrics`` (Prometheus) and ``pipexctl stat --serve``.

    Calls known to discovery by role and data path; what the daemon owns;
    offload outcomes by reason; reconcile actions; the kernel's counters of
    each offloaded session (at most ``max_session_series`` listed, the
    rest summed), read through a netlink socket of its own."""
    calls = svc.watch.paths()
    # no svc.lock: a scrape loop must never delay an offload.  list() of a
    # dict's items is one step under the GIL, so each copy is consistent
    tunnels = list(svc.tunnels.values())
    # the kernel's tunnel id is the tunnel's own: a session's tunnel is found
    # in the live table under each instance's name (a map by id would cost a scrape 10,000 entries)
    names = {t.instance for t in tunnels}
    n_sessions = sum(len(t.records) for t in tunnels)
    with svc.counter_lock:
        stats, reasons = dict(svc.stats), dict(svc.reasons)
    fold, error = SessionFold(svc.max_session_series), None
    with svc.metrics_lock:
        try:
            if svc.metrics_backend is None:
                svc.metrics_backend = (NetlinkBackend(netns=svc.backend.netns)
                                  if isinstance(svc.backend, NetlinkBackend) else svc.backend)

            def owned(s: SessionCounters) -> None:
                for name in names:
                    t = svc.tunnels.get((name, s.tunnel_id))
                    if t is not None and s.session_id in t.records:
                        fold.add(s, t.peer)
                        return

            svc.metrics_backend.session_counters(owned)
        except (errors.PipexError, OSError) as e:
            error = str(e)
            fold = SessionFold(svc.max_session_series)  # a dump cut short: no series, rather than a part of them
    listed = [{"tunnel_id": s.tunnel_id, "session_id": s.session_id, "peer": peer,
               **{f: getattr(s, f) for f in COUNTER_FIELDS}} for s, peer in fold.listed()]
    return {
        "calls": [{"role": r, "data_path": d, "count": n} for (r, d), n in sorted(calls.items())],
        "offloaded_tunnels": len(tunnels),
        "offloaded_sessions": n_sessions,
        "offload": {"offloaded": stats["offloaded"], "moved": stats["moved"], "removed": stats["removed"],
                    "refused": {r: n for (k, r), n in sorted(reasons.items()) if k == "refused"},
                    "failed": {r: n for (k, r), n in sorted(reasons.items()) if k == "failed"}},
        "reconcile": {"runs": svc.reconciles, "adopted": stats["adopted"],
                      "orphans_removed": stats["orphans_removed"]},
        "sessions": listed,
        "sessions_not_listed": {"count": fold.rest, **dict(zip(COUNTER_FIELDS, fold.rest_sums))},
        "channel_latency_ms": percentiles([x * 1000 for x in svc.latencies_now()]),
        "channel_latency_histogram": histogram(svc),
        "kernel_error": error,
        "datapath": svc.datapath.stats(),
        "xl2tpd_socket_drops": svc.watch.udp_drops.dropped,
    }



# the kernel counters of each session a snapshot lists and sums (the metrics endpoint's series too)
COUNTER_FIELDS = ("rx_packets", "rx_bytes", "rx_errors", "tx_packets", "tx_bytes", "tx_errors")


class SessionFold:
    """The sessions of a metrics snapshot as the dump hands them over: the
    ``keep`` of lowest (tunnel id, session id) kept, with their peers; of
    the rest only a count and the sums of their counters.  Listing all
    10,000 sessions of a snapshot and sorting them had cost a scrape 2.9
    MiB at its peak."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._heap: list[tuple[int, int, SessionCounters, str]] = []  # (-tunnel id, -session id, ...): the highest first
        self.rest = 0
        self.rest_sums = [0] * len(COUNTER_FIELDS)

    def add(self, s: SessionCounters, peer: str) -> None:
        item = (-s.tunnel_id, -s.session_id, s, peer)
        if len(self._heap) < self.keep:
            heapq.heappush(self._heap, item)
            return
        if self.keep and item[:2] > self._heap[0][:2]:  # lower than the highest kept: kept, that one not
            item = heapq.heapreplace(self._heap, item)
        self.rest += 1
        c = item[2]
        for i, f in enumerate(COUNTER_FIELDS):
            self.rest_sums[i] += getattr(c, f)

    def listed(self) -> list[tuple[SessionCounters, str]]:
        """The kept sessions by (tunnel id, session id), each with its peer."""
        return [(s, peer) for _, _, s, peer in sorted(self._heap, reverse=True)]


def histogram(svc: "OffloadService") -> dict[str, object]:
    """Cumulative counts per upper bound (seconds), as Prometheus wants them."""
    from .service import LATENCY_BUCKETS  # an import cycle: service imports this module

    with svc.counter_lock:
        counts, total = list(svc.latency_hist), svc.latency_sum
    cum, buckets = 0, []
    for bound, n in zip([*map(str, LATENCY_BUCKETS), "+Inf"], counts):
        cum += n
        buckets.append([bound, cum])
    return {"buckets": buckets, "sum": total, "count": cum}


def percentiles(xs: list[float]) -> dict[str, float]:
    """p50/p99/max of request -> channel sent (the last 1,000 offloads)."""
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    return {"n": len(xs), "p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))], "max": xs[-1]}
