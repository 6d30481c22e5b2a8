"""Prometheus metrics of `pipexctl serve` (``--metrics [HOST]:PORT``).

A collector over ``OffloadService.metrics()`` (the same dict `pipexctl stat
--serve --json` prints), so there is no second bookkeeping to drift; a
snapshot serves the scrapes of one second.  prometheus_client serves the text format.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import ProcessCollector, start_http_server
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .. import __version__

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .service import OffloadService

SESSION_FIELDS = ("rx_packets", "rx_bytes", "rx_errors", "tx_packets", "tx_bytes", "tx_errors")


def families(m: dict[str, Any]) -> Iterator[Metric]:
    """Prometheus metric families from one ``metrics()`` snapshot."""
    yield InfoMetricFamily("pipexctl_build", "pipexctl's version", value={"version": __version__})
    g = GaugeMetricFamily("pipexctl_calls", "xl2tpd calls known to discovery, by role and data path",
                          labels=["role", "data_path"])
    for c in m["calls"]:
        g.add_metric([c["role"], c["data_path"]], c["count"])
    yield g
    yield GaugeMetricFamily("pipexctl_offloaded_tunnels", "Kernel tunnels the daemon owns",
                            value=m["offloaded_tunnels"])
    yield GaugeMetricFamily("pipexctl_offloaded_sessions", "Kernel PPP sessions the daemon owns",
                            value=m["offloaded_sessions"])
    o = m["offload"]
    yield CounterMetricFamily("pipexctl_offloads", "Calls offloaded (channel sent to pppd)", value=o["offloaded"])
    yield CounterMetricFamily("pipexctl_offloads_moved", "Offloads of running calls, moved from their pty",
                              value=o["moved"])
    yield CounterMetricFamily("pipexctl_offloads_removed", "Offloads removed when their call ended",
                              value=o["removed"])
    for kind, help_ in (("refused", "Channel requests refused, by reason"),
                        ("failed", "Offloads that failed in the kernel, a socket or nftables, by reason")):
        c = CounterMetricFamily(f"pipexctl_offload_{kind}", help_, labels=["reason"])
        for reason, n in o[kind].items():
            c.add_metric([reason], n)
        yield c
    r = m["reconcile"]
    yield CounterMetricFamily("pipexctl_reconcile_runs", "Reconciles of the state file (start, SIGHUP, request)",
                              value=r["runs"])
    yield CounterMetricFamily("pipexctl_reconcile_adopted_sessions", "Sessions adopted by a reconcile",
                              value=r["adopted"])
    yield CounterMetricFamily("pipexctl_reconcile_orphans_removed", "Orphan kernel objects removed by a reconcile",
                              value=r["orphans_removed"])
    for f in SESSION_FIELDS:
        c = CounterMetricFamily(f"pipexctl_session_{f}", f"Kernel counter {f} of an offloaded session",
                                labels=["tunnel_id", "session_id", "peer"])
        for s in m["sessions"]:
            c.add_metric([str(s["tunnel_id"]), str(s["session_id"]), s["peer"]], s[f])
        yield c
        yield CounterMetricFamily(f"pipexctl_sessions_not_listed_{f}",
                                  f"Sum of {f} of the sessions beyond the per-session series cap",
                                  value=m["sessions_not_listed"][f])
    yield GaugeMetricFamily("pipexctl_sessions_not_listed", "Offloaded sessions beyond the per-session series cap",
                            value=m["sessions_not_listed"]["count"])
    lat = m["channel_latency_ms"]
    g = GaugeMetricFamily("pipexctl_channel_latency_seconds",
                          "pppd request to channel sent, over the last 1,000 offloads", labels=["quantile"])
    for q, k in (("0.5", "p50"), ("0.99", "p99"), ("1", "max")):
        if k in lat:
            g.add_metric([q], lat[k] / 1000)
    yield g
    h = m["channel_latency_histogram"]
    yield HistogramMetricFamily("pipexctl_channel_latency_histogram_seconds",
                                "pppd request to channel sent, every offload since start",
                                buckets=h["buckets"], sum_value=h["sum"])
    yield GaugeMetricFamily("pipexctl_kernel_readable", "1 when the last scrape read the kernel's counters",
                            value=0 if m["kernel_error"] else 1)
    dp = m["datapath"]
    yield CounterMetricFamily("pipexctl_relayed_packets", "Packets the kernel passed up on tunnel sockets (L2TP "
                              "control, data of calls on their pty) handed to xl2tpd", value=dp["relayed"])
    yield CounterMetricFamily("pipexctl_relay_dropped_packets", "SCCRQs that could not reach xl2tpd with their "
                              "source (xl2tpd listens on one address)", value=dp["dropped"])
    yield CounterMetricFamily("pipexctl_relay_errors", "Relay reads or writes that failed", value=dp["errors"])
    yield GaugeMetricFamily("pipexctl_twin_tunnels", "Tunnels steered by nft: a second tunnel from the same peer "
                            "address and port", value=dp["twins"])
    yield CounterMetricFamily("pipexctl_xl2tpd_socket_drops", "Datagrams the kernel dropped on xl2tpd's UDP socket "
                              "for a full receive queue, seen since the daemon started (raise "
                              "net.core.rmem_default)", value=m["xl2tpd_socket_drops"])
    yield CounterMetricFamily("pipexctl_steering_restored", "Times the twins' nft table was written again after "
                              "it vanished (a firewall reload)", value=dp["steering_restored"])


class ServeCollector(Collector):
    """The daemon's families, read at most once per MIN_INTERVAL: a scrape
    loop (or several Prometheus servers) costs the daemon one snapshot a
    second, whatever the scrape rate, and takes CPU from no offload.  A
    snapshot that took t seconds serves the scrapes of t / SHARE seconds, so
    snapshots never take more than SHARE of one CPU: the kernel's session
    dump grows with the calls (a snapshot took 6.3 s at 10,000 calls in the
    emulated guest, docs/offload.md)."""

    MIN_INTERVAL = 1.0
    SHARE = 0.1

    def __init__(self, service: OffloadService) -> None:
        self.service = service
        self._lock = threading.Lock()
        self._cache: tuple[float, list[Metric], float] = (float("-inf"), [], 0.0)  # when, families, seconds taken

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            at, fams, took = self._cache
            if time.monotonic() - at >= max(self.MIN_INTERVAL, took / self.SHARE):
                t = time.monotonic()
                fams = list(families(self.service.metrics()))
                took = time.monotonic() - t
                fams.append(GaugeMetricFamily(
                    "pipexctl_metrics_snapshot_seconds", "How long the daemon took to read these numbers (they "
                    f"serve the scrapes of {1 / self.SHARE:.0f} times as long, at least {self.MIN_INTERVAL:.0f} s)",
                    value=took))
                self._cache = (time.monotonic(), fams, took)
        yield from fams


def parse_listen(text: str) -> tuple[str, int]:
    """``[HOST]:PORT`` -> (host, port); an empty host is 127.0.0.1 (the
    numbers name subscribers' addresses: every address only when asked)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: expected [HOST]:PORT, e.g. 127.0.0.1:9469 or :9469")
    return host.strip("[]") or "127.0.0.1", int(port)


def start(service: OffloadService, listen: str) -> WSGIServer:
    """Serve /metrics on ``listen`` in a thread; returns the HTTP server."""
    host, port = parse_listen(listen)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ServeCollector(service))
    ProcessCollector(registry=reg)  # process_cpu_seconds_total, process_open_fds, process_resident_memory_bytes
    httpd, _thread = start_http_server(port, addr=host, registry=reg)
    return httpd
