"""Prometheus metrics of `pipexctl serve` (``--metrics [HOST]:PORT``).

Families over ``OffloadService.metrics()`` (the same dict `pipexctl stat
--serve --json` prints), so there is no second bookkeeping to drift,
written in Prometheus' text format (0.0.4) and served over HTTP by a small
server of its own.  Both are written here rather than taken from
prometheus_client: its import brings http.server, urllib, email and
OpenSSL's libssl, 5.8 MiB of the daemon's memory (docs/offload.md), and
the daemon needs a text format of a few rules and one GET.  The tests
read the text back with prometheus_client's parser, against what its own
writer makes of the same families, and lint it with promtool.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator, NamedTuple, Optional, Sequence

from .. import __version__
from .report import COUNTER_FIELDS

if TYPE_CHECKING:
    from .service import OffloadService

log = logging.getLogger("pipexctl.serve")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OK = "200 OK"


class Sample(NamedTuple):
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


class Family(NamedTuple):
    """One metric family: its name without a counter's ``_total`` or an
    info's ``_info``, its type (counter, gauge, histogram, info) and samples
    (an iterable read once: a family of 1,000 sessions is made as it is written)."""
    name: str
    kind: str
    help: str
    samples: Iterable[Sample]


def gauge(name: str, help_: str, value: float) -> Family:
    return Family(name, "gauge", help_, [Sample(name, (), float(value))])


def counter(name: str, help_: str, value: float) -> Family:
    return Family(name, "counter", help_, [Sample(name + "_total", (), float(value))])


def labelled(kind: str, name: str, help_: str, labels: Sequence[str],
             rows: Iterable[tuple[Sequence[str], float]]) -> Family:
    """A counter or gauge with one sample per row (label values, value)."""
    sample = name + "_total" if kind == "counter" else name
    return Family(name, kind, help_, (Sample(sample, tuple(zip(labels, values)), float(v)) for values, v in rows))


def histogram(name: str, help_: str, buckets: Sequence[tuple[str, float]], total: float) -> Family:
    """Cumulative ``buckets`` (upper bound as text, count), the last "+Inf"."""
    samples = [Sample(name + "_bucket", (("le", le),), float(n)) for le, n in buckets]
    samples += [Sample(name + "_count", (), float(buckets[-1][1])), Sample(name + "_sum", (), float(total))]
    return Family(name, "histogram", help_, samples)


def families(m: dict[str, Any]) -> Iterator[Family]:
    """Prometheus metric families from one ``metrics()`` snapshot."""
    yield Family("pipexctl_build", "info", "pipexctl's version",
                 [Sample("pipexctl_build_info", (("version", __version__),), 1.0)])
    yield labelled("gauge", "pipexctl_calls", "xl2tpd calls known to discovery, by role and data path",
                   ("role", "data_path"), (((c["role"], c["data_path"]), c["count"]) for c in m["calls"]))
    yield gauge("pipexctl_offloaded_tunnels", "Kernel tunnels the daemon owns", m["offloaded_tunnels"])
    yield gauge("pipexctl_offloaded_sessions", "Kernel PPP sessions the daemon owns", m["offloaded_sessions"])
    o = m["offload"]
    yield counter("pipexctl_offloads", "Calls offloaded (channel sent to pppd)", o["offloaded"])
    yield counter("pipexctl_offloads_moved", "Offloads of running calls, moved from their pty", o["moved"])
    yield counter("pipexctl_offloads_removed", "Offloads removed when their call ended", o["removed"])
    for kind, help_ in (("refused", "Channel requests refused, by reason"),
                        ("failed", "Offloads that failed in the kernel, a socket or nftables, by reason")):
        yield labelled("counter", f"pipexctl_offload_{kind}", help_, ("reason",),
                       (((reason,), n) for reason, n in o[kind].items()))
    r = m["reconcile"]
    yield counter("pipexctl_reconcile_runs", "Reconciles of the state file (start, SIGHUP, request)", r["runs"])
    yield counter("pipexctl_reconcile_adopted_sessions", "Sessions adopted by a reconcile", r["adopted"])
    yield counter("pipexctl_reconcile_orphans_removed", "Orphan kernel objects removed by a reconcile",
                  r["orphans_removed"])
    for f in COUNTER_FIELDS:
        yield labelled("counter", f"pipexctl_session_{f}", f"Kernel counter {f} of an offloaded session",
                       ("tunnel_id", "session_id", "peer"), _session_rows(m["sessions"], f))
        yield counter(f"pipexctl_sessions_not_listed_{f}",
                      f"Sum of {f} of the sessions beyond the per-session series cap", m["sessions_not_listed"][f])
    yield gauge("pipexctl_sessions_not_listed", "Offloaded sessions beyond the per-session series cap",
                m["sessions_not_listed"]["count"])
    lat = m["channel_latency_ms"]
    yield labelled("gauge", "pipexctl_channel_latency_seconds",
                   "pppd request to channel sent, over the last 1,000 offloads", ("quantile",),
                   (((q,), lat[k] / 1000) for q, k in (("0.5", "p50"), ("0.99", "p99"), ("1", "max")) if k in lat))
    h = m["channel_latency_histogram"]
    yield histogram("pipexctl_channel_latency_histogram_seconds",
                    "pppd request to channel sent, every offload since start", h["buckets"], h["sum"])
    yield gauge("pipexctl_kernel_readable", "1 when the last scrape read the kernel's counters",
                0 if m["kernel_error"] else 1)
    dp = m["datapath"]
    yield counter("pipexctl_relayed_packets", "Packets the kernel passed up on tunnel sockets (L2TP control, data "
                  "of calls on their pty) handed to xl2tpd", dp["relayed"])
    yield counter("pipexctl_relay_dropped_packets", "SCCRQs that could not reach xl2tpd with their source (xl2tpd "
                  "listens on one address)", dp["dropped"])
    yield counter("pipexctl_relay_errors", "Relay reads or writes that failed", dp["errors"])
    yield gauge("pipexctl_twin_tunnels", "Tunnels steered by nft: a second tunnel from the same peer address and "
                "port", dp["twins"])
    yield counter("pipexctl_xl2tpd_socket_drops", "Datagrams the kernel dropped on xl2tpd's UDP socket for a full "
                  "receive queue, seen since the daemon started (raise net.core.rmem_default)",
                  m["xl2tpd_socket_drops"])
    yield counter("pipexctl_steering_restored", "Times the twins' nft table was written again after it vanished "
                  "(a firewall reload)", dp["steering_restored"])


def _session_rows(sessions: list[dict[str, Any]], field: str) -> Iterator[tuple[tuple[str, str, str], float]]:
    """One field of every listed session (a function: ``field`` bound per family, read when it is written)."""
    for s in sessions:
        yield (str(s["tunnel_id"]), str(s["session_id"]), s["peer"]), s[field]


def process_families(pid: str = "self") -> list[Family]:
    """The process' own numbers, under the names every Prometheus client
    library gives them (process_cpu_seconds_total, process_open_fds, ...)."""
    out: list[Family] = []
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # from field 3 of stat(5) on
        with open("/proc/stat", "rb") as f:
            boot = next(float(ln.split()[1]) for ln in f if ln.startswith(b"btime "))
        out += [gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", float(fields[20])),
                gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
                      float(fields[21]) * os.sysconf("SC_PAGESIZE")),
                gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                      float(fields[19]) / ticks + boot),
                counter("process_cpu_seconds", "Total user and system CPU time spent in seconds.",
                        (float(fields[11]) + float(fields[12])) / ticks)]
    except (OSError, StopIteration, IndexError, ValueError):
        pass
    try:
        out.append(gauge("process_open_fds", "Number of open file descriptors.", len(os.listdir(f"/proc/{pid}/fd"))))
        with open(f"/proc/{pid}/limits", "rb") as f:
            soft = next(ln.split()[3] for ln in f if ln.startswith(b"Max open files"))
        out.append(gauge("process_max_fds", "Maximum number of open file descriptors.",
                         math.inf if soft == b"unlimited" else float(soft)))
    except (OSError, StopIteration, IndexError, ValueError):
        pass
    return out


# ---- the text format

def _number(v: float) -> str:
    if v != v:
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render_to(out: bytearray, fams: Iterable[Family]) -> bytearray:
    """The families appended to ``out`` in Prometheus' text format 0.0.4:
    a family's HELP and TYPE under its exposed name (a counter's with
    ``_total``, an info's with ``_info`` as a gauge), then a line per
    sample, labels sorted.  Written as bytes into one buffer: a list of
    10,000 lines joined and then encoded had held the text three times."""
    for fam in fams:
        name, kind = fam.name, fam.kind
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name, kind = name + "_info", "gauge"
        out += f"# HELP {name} {_help(fam.help)}\n# TYPE {name} {kind}\n".encode()
        for s in fam.samples:
            labels = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(s.labels))
            out += (f"{s.name}{{{labels}}} {_number(s.value)}\n" if labels
                    else f"{s.name} {_number(s.value)}\n").encode()
    return out


def render(fams: Iterable[Family]) -> str:
    """``render_to``'s text as a string."""
    return render_to(bytearray(), fams).decode()


# ---- the daemon's families, and the HTTP endpoint

class ServeCollector:
    """The daemon's families as text, read at most once per MIN_INTERVAL: a
    scrape loop (or several Prometheus servers) costs the daemon one
    snapshot a second, whatever the scrape rate, and takes CPU from no
    offload.  A snapshot that took t seconds serves the scrapes of t / SHARE
    seconds, so snapshots never take more than SHARE of one CPU: the
    kernel's session dump grows with the calls (a snapshot took 6.3 s at
    10,000 calls in the emulated guest, docs/offload.md)."""

    MIN_INTERVAL = 1.0
    SHARE = 0.1

    def __init__(self, service: OffloadService) -> None:
        self.service = service
        self._lock = threading.Lock()
        # when, text, seconds taken; the text is never changed once cached (scrapes send it as it is)
        self._cache: tuple[float, bytes | bytearray, float] = (float("-inf"), b"", 0.0)
        self.snapshots = 0

    def text(self) -> bytes | bytearray:
        """The daemon's families in the text format (the process' own are not in it)."""
        with self._lock:
            at, text, took = self._cache
            if time.monotonic() - at >= max(self.MIN_INTERVAL, took / self.SHARE):
                t = time.monotonic()
                text = render_to(bytearray(), families(self.service.metrics()))  # text: a tenth of samples' memory
                took = time.monotonic() - t
                render_to(text, [gauge(
                    "pipexctl_metrics_snapshot_seconds", "How long the daemon took to read these numbers (they "
                    f"serve the scrapes of {1 / self.SHARE:.0f} times as long, at least {self.MIN_INTERVAL:.0f} s)",
                    took)])
                self._cache = (time.monotonic(), text, took)
                self.snapshots += 1
        return text

    def pieces(self) -> list[bytes | bytearray]:
        """What GET /metrics answers, in the pieces it is sent in: the
        daemon's families, then the process' (not joined: no second copy)."""
        return [self.text(), render_to(bytearray(), process_families())]

    def scrape(self) -> str:
        """What GET /metrics answers, as one string."""
        return b"".join(self.pieces()).decode()


class Exporter:
    """/metrics over HTTP on one listening socket: a thread accepts, and a
    thread per connection (at most MAX_CLIENTS at once) reads one request,
    answers it and closes.  A request's head is read for READ_TIMEOUT
    seconds in all and MAX_REQUEST bytes at most, its answer sent within
    TIMEOUT.  With every slot taken, a new client cuts off the one that has
    been reading its request longest: a scraper sends its request at once,
    so clients that connect and stall cannot keep Prometheus out.  GET and
    HEAD of / or /metrics; any other method 405, any other path 404."""

    MAX_CLIENTS = 16
    MAX_REQUEST = 8192
    READ_TIMEOUT = 3.0
    TIMEOUT = 10.0

    def __init__(self, collector: ServeCollector, host: str, port: int) -> None:
        self.collector = collector
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        self.sock = socket.socket(family, kind, proto)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(addr)
            self.sock.listen(self.MAX_CLIENTS)
        except OSError:
            self.sock.close()
            raise
        self.address = self.sock.getsockname()
        self._slots = threading.BoundedSemaphore(self.MAX_CLIENTS)
        self._mu = threading.Lock()
        self._reading: dict[socket.socket, float] = {}  # clients still reading their request, since when
        self._stopping = False
        self._failures: set[Optional[int]] = set()  # accept()'s errors logged once each
        self._thread = threading.Thread(target=self._accept, name="metrics-http", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop accepting and close the listening socket (a scrape being
        answered finishes on its own thread)."""
        self._stopping = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        except OSError:
            pass
        self._thread.join(timeout=5)
        self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError as e:
                if self._stopping:
                    return
                if e.errno not in self._failures:  # out of fds, a client gone before its accept...: go on
                    self._failures.add(e.errno)
                    log.warning("metrics endpoint: accept failed: %s (it goes on)", e)
                time.sleep(0.1)
                continue
            if not self._slots.acquire(blocking=False):
                self._cut_longest_reader()
                if not self._slots.acquire(timeout=1.0):
                    conn.close()
                    continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="metrics-scrape", daemon=True).start()
            except RuntimeError:  # no thread to be had: this scrape goes unanswered, the slot back
                conn.close()
                self._slots.release()

    def _cut_longest_reader(self) -> None:
        """End the read of the client that has been reading its request longest (its thread then answers 400)."""
        with self._mu:  # under the lock: its thread closes it only after leaving _reading
            if self._reading:
                oldest = min(self._reading, key=self._reading.__getitem__)
                try:
                    oldest.shutdown(socket.SHUT_RD)
                except OSError:
                    pass

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                with self._mu:
                    self._reading[conn] = time.monotonic()
                try:
                    request = self._read(conn)
                finally:
                    with self._mu:
                        self._reading.pop(conn, None)
                status, body, head_only = self._answer(request)
                head = [f"HTTP/1.1 {status}", f"Content-Type: {CONTENT_TYPE if status == OK else 'text/plain'}",
                        f"Content-Length: {sum(map(len, body))}", "Connection: close"]
                head += ["Allow: GET, HEAD"] if status.startswith("405") else []
                deadline = time.monotonic() + self.TIMEOUT  # the whole answer within TIMEOUT, however many pieces
                for piece in ["\r\n".join([*head, "", ""]).encode(), *(() if head_only else body)]:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise socket.timeout("answer not taken within TIMEOUT")
                    conn.settimeout(left)
                    conn.sendall(piece)
        except OSError:  # the client went, or stalled past TIMEOUT
            pass
        except Exception:  # a bug in a snapshot: logged, the daemon goes on, the client sees the connection close
            log.exception("metrics scrape failed")
        finally:
            self._slots.release()

    def _read(self, conn: socket.socket) -> Optional[bytes]:
        """The request's head (up to its blank line), or None when it is too large or cut short."""
        data = b""
        deadline = time.monotonic() + self.READ_TIMEOUT
        while b"\r\n\r\n" not in data and b"\n\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            conn.settimeout(left)  # the whole head within READ_TIMEOUT, however it trickles in
            try:
                chunk = conn.recv(4096)
            except socket.timeout:
                return None
            if not chunk:
                return None
            data += chunk
            if len(data) > self.MAX_REQUEST:
                return None
        return data

    def _answer(self, head: Optional[bytes]) -> tuple[str, list[bytes | bytearray], bool]:
        """(status line, the body's pieces, whether only the head is sent) for a request's head."""
        if head is None:
            return "400 Bad Request", [b"bad request\n"], False
        parts = head.split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return "400 Bad Request", [b"bad request\n"], False
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return "405 Method Not Allowed", [b"GET or HEAD only\n"], False
        if path not in (b"/", b"/metrics"):
            return "404 Not Found", [b"see /metrics\n"], method == b"HEAD"
        return OK, self.collector.pieces(), method == b"HEAD"


def parse_listen(text: str) -> tuple[str, int]:
    """``[HOST]:PORT`` -> (host, port); an empty host is 127.0.0.1 (the
    numbers name subscribers' addresses: every address only when asked)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: expected [HOST]:PORT, e.g. 127.0.0.1:9469 or :9469")
    return host.strip("[]") or "127.0.0.1", int(port)


def start(service: OffloadService, listen: str) -> Exporter:
    """Serve /metrics on ``listen`` in a thread; returns the server (``shutdown()`` stops it)."""
    host, port = parse_listen(listen)
    return Exporter(ServeCollector(service), host, port)
