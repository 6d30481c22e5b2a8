"""`pipexctl serve`'s Prometheus side (offload/metrics.py): the text of
metrics() (the numbers themselves are report.py's, test_report.py), the
--metrics address, the HTTP endpoint against `stat --serve`, the scrape
cache, and contrib's rules and dashboard against what the daemon exports.

An OffloadServer on the null kernel backend and the null data path (no
kernel here: ``srv``, tests/unit/conftest.py); the real daemon's metrics
are checked in the guest (tests/kernel/test_offload.py)."""

from __future__ import annotations

import json
import math
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from pipexctl.cli import cli
from pipexctl.offload import metrics

from .conftest import call, offload, serving


def test_prometheus_text_parses_and_carries_the_numbers(srv):
    offload(srv, call(1))
    srv.service.backend.session_get(100, 1).stats.tx_bytes = 1234
    srv.service.refused("malformed_request")
    for seconds in (0.003, 0.03, 0.03, 7.0):
        srv.service.offloaded(seconds)
    text = metrics.ServeCollector(srv.service).scrape()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    val = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    assert val[("pipexctl_offloaded_sessions", ())] == 1
    assert val[("pipexctl_offloads_total", ())] == 5
    h = "pipexctl_channel_latency_histogram_seconds"
    assert val[(f"{h}_bucket", (("le", "0.005"),))] == 1 and val[(f"{h}_bucket", (("le", "0.05"),))] == 3
    assert val[(f"{h}_bucket", (("le", "5.0"),))] == 3 and val[(f"{h}_bucket", (("le", "+Inf"),))] == 4
    assert val[(f"{h}_count", ())] == 4 and abs(val[(f"{h}_sum", ())] - 7.063) < 1e-9
    from pipexctl import __version__

    assert val[("pipexctl_build_info", (("version", __version__),))] == 1
    assert val[("pipexctl_offload_refused_total", (("reason", "malformed_request"),))] == 1
    assert val[("pipexctl_session_tx_bytes_total", (("peer", "192.0.2.7"), ("session_id", "1"),
                                                    ("tunnel_id", "100")))] == 1234
    assert val[("pipexctl_calls", (("data_path", "kernel"), ("role", "lns")))] == 3
    assert val[("pipexctl_kernel_readable", ())] == 1
    assert val[("pipexctl_relayed_packets_total", ())] == 0 and val[("pipexctl_twin_tunnels", ())] == 0
    assert val[("pipexctl_steering_restored_total", ())] == 0
    assert 0 <= val[("pipexctl_metrics_snapshot_seconds", ())] < 10
    assert val[("process_open_fds", ())] >= 3 and val[("process_resident_memory_bytes", ())] > 1 << 20
    assert fams["pipexctl_offloads"].type == "counter" and fams["pipexctl_build_info"].type == "gauge"
    # the families taken whole first: each session family still carries its own counter
    kept = {f.name: f for f in text_string_to_metric_families(metrics.render(list(metrics.families(
        srv.service.metrics()))))}
    assert [s.value for s in kept["pipexctl_session_tx_bytes"].samples] == [1234]
    assert [s.value for s in kept["pipexctl_session_rx_bytes"].samples] == [0]
    assert fams["pipexctl_channel_latency_histogram_seconds"].type == "histogram"


def test_the_text_reads_back_as_prometheus_client_writes_the_same_families():
    """The text format is written here (prometheus_client's import was 5.8
    MiB of the daemon): prometheus_client's parser reads it back into the
    families it reads from its own writer's text for the same numbers,
    names, types, help and labels with quotes, backslashes and newlines."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.metrics_core import Metric

    odd = 'a "quoted" \\ back\nslash'

    def made() -> list:  # a family's samples are read once: made anew for each writer
        return [metrics.gauge("g", f"help with {odd}", 0.1),
                metrics.counter("c", "a counter", 12345678901.0),
                metrics.labelled("counter", "lc", "labelled", ("b", "a"),
                                 [(("x", odd), 1.0), (("y", ""), math.inf)]),
                metrics.labelled("gauge", "lg", "no rows", ("a",), []),
                metrics.histogram("h", "hist", [("0.005", 1), ("5.0", 3), ("+Inf", 4)], 7.063),
                metrics.Family("b", "info", "info", [metrics.Sample("b_info", (("version", "1.2"),), 1.0)]),
                metrics.gauge("n", "not a number", math.nan), metrics.gauge("neg", "negative", -2.5e-12)]

    class Theirs:  # the same families, as prometheus_client's writer takes them
        def collect(self):
            for f in made():
                m = Metric(f.name, f.help, f.kind)
                for sample in f.samples:
                    m.add_sample(sample.name, dict(sample.labels), sample.value)
                yield m

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Theirs())

    def read(text: str) -> list:
        return [(f.name, f.type, f.documentation, sorted((s.name, sorted(s.labels.items()), str(s.value))
                                                         for s in f.samples))
                for f in text_string_to_metric_families(text)]

    ours = read(metrics.render(made()))
    assert ours == read(generate_latest(reg).decode())
    assert len(ours) == 8 and ("lc", "counter", "labelled", [
        ("lc_total", [("a", ""), ("b", "y")], "inf"), ("lc_total", [("a", odd), ("b", "x")], "1.0")]) in ours


# promtool's naming advice on two names dashboards already use: kept
LEGACY_LINT = {"pipexctl_channel_latency_histogram_seconds metric name should not include type 'histogram'",
               'pipexctl_channel_latency_seconds non-summary metrics should not have "quantile" label'}


def test_the_scrape_passes_promtool_check_metrics(srv):
    """promtool (Debian 12's, `make setup` unpacks it) parses and lints the
    exposition (names, types, help, suffixes): it finds nothing but its
    advice on two names that dashboards use."""
    import subprocess

    offload(srv, call(1))
    srv.service.offloaded(0.01)
    promtool = Path(__file__).resolve().parents[2] / ".cache" / "promtool" / "usr" / "bin" / "promtool"
    assert promtool.exists(), f"{promtool} is missing: `make setup` fetches it (scripts/fetch_promtool.sh)"
    text = metrics.ServeCollector(srv.service).scrape()
    r = subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode in (0, 3) and set((r.stdout + r.stderr).splitlines()) <= LEGACY_LINT, r.stdout + r.stderr
    r = subprocess.run([str(promtool), "check", "metrics"], input=text.replace("# TYPE pipexctl_offloads_total counter",
                       "# TYPE pipexctl_offloads_total nonsense"), capture_output=True, text=True)
    assert r.returncode == 1 and "nonsense" in r.stdout + r.stderr  # the check reads what it is given


@pytest.mark.parametrize("text,want", [(":9469", ("127.0.0.1", 9469)), ("0.0.0.0:9469", ("0.0.0.0", 9469)), ("127.0.0.1:80", ("127.0.0.1", 80)),
                                       ("[::1]:9469", ("::1", 9469))])
def test_parse_listen(text, want):
    assert metrics.parse_listen(text) == want


@pytest.mark.parametrize("text", ["9469", "host:", ":0", ":70000", "a:b"])
def test_parse_listen_rejects(text):
    with pytest.raises(ValueError):
        metrics.parse_listen(text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_endpoint_and_stat_serve_give_the_same_numbers(srv, tmp_path):
    offload(srv, call(1))
    srv.service.backend.session_get(100, 1).stats.rx_packets = 9
    port = free_port()
    httpd = metrics.start(srv.service, f"127.0.0.1:{port}")
    try:
        with serving(srv):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
                body = resp.read().decode()
            # sent in pieces (the daemon's text, the process'): the length the head gives is theirs together
            head, _, raw = _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n").partition(b"\r\n\r\n")
            assert f"Content-Length: {len(raw)}\r\n".encode() in head + b"\r\n" and raw.endswith(b"\n")
            assert b"pipexctl_offloaded_sessions 1.0" in raw and b"process_open_fds" in raw
            assert 'pipexctl_session_rx_packets_total{peer="192.0.2.7",session_id="1",tunnel_id="100"} 9.0' in body
            assert "process_open_fds" in body and "process_resident_memory_bytes" in body
            r = CliRunner().invoke(cli, ["stat", "--serve", "--socket", srv.socket_path, "--json"])
            assert r.exit_code == 0, r.output
            m = json.loads(r.output)
            assert m["sessions"][0]["rx_packets"] == 9 and m["offloaded_sessions"] == 1
            r = CliRunner().invoke(cli, ["stat", "--serve", "--socket", srv.socket_path])
            assert r.exit_code == 0 and "offloaded: 1 session(s) in 1 tunnel(s)" in r.output
            assert "192.0.2.7" in r.output
    finally:
        httpd.shutdown()


def test_contrib_rules_and_dashboard_name_only_metrics_the_daemon_exports(srv):
    import re as _re

    import yaml

    root = Path(__file__).resolve().parents[2] / "contrib"
    offload(srv, call(1))
    srv.service.offloaded(0.01)
    fams = list(text_string_to_metric_families(metrics.ServeCollector(srv.service).scrape()))
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "info": ["_info"]}
    exported = {f.name + x for f in fams for x in suffixes.get(f.type, [""])}  # labelled families with no series too
    exported |= {"up"}  # Prometheus' own
    rules = yaml.safe_load((root / "prometheus-alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert all(r.get("alert") and r.get("annotations", {}).get("summary") for g in rules["groups"] for r in g["rules"])
    dash = json.loads((root / "grafana-dashboard.json").read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    words = {"sum", "by", "rate", "increase", "histogram_quantile", "le", "reason", "instance", "job", "data_path"}
    for e in exprs:
        for name in _re.findall(r"\b(pipexctl_\w+|process_\w+|up)\b", e):
            assert name in exported or name in words, f"{name} (in {e}) is not exported"


def test_contrib_rules_pass_promtool_and_fire_on_their_series():
    """Debian 12's promtool (`make setup` unpacks it: scripts/fetch_promtool.sh)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    promtool = root / ".cache" / "promtool" / "usr" / "bin" / "promtool"
    assert promtool.exists(), f"{promtool} is missing: `make setup` fetches it (scripts/fetch_promtool.sh)"
    for args in (["check", "rules", "contrib/prometheus-alerts.yml"],
                 ["test", "rules", "contrib/tests/prometheus-alerts.test.yml"]):
        r = subprocess.run([str(promtool), *args], cwd=root, capture_output=True, text=True)
        assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def _counted(srv, monkeypatch):
    """The daemon's collector, and the list of the snapshots it took (one item each)."""
    col = metrics.ServeCollector(srv.service)
    taken = []
    real = srv.service.metrics
    monkeypatch.setattr(srv.service, "metrics", lambda: taken.append(1) or real())
    return col, taken


def test_a_scrape_loop_costs_one_snapshot_a_second(srv, monkeypatch):
    col, taken = _counted(srv, monkeypatch)
    for _ in range(20):
        col.scrape()
    assert len(taken) == 1
    offload(srv, call(1))
    col._cache = (col._cache[0] - col.MIN_INTERVAL, *col._cache[1:])  # a second later
    text = col.scrape()
    assert len(taken) == 2 and "pipexctl_offloaded_sessions 1.0" in text


def test_a_slow_snapshot_serves_ten_times_as_long(srv, monkeypatch):
    col, taken = _counted(srv, monkeypatch)
    text = col.scrape()
    assert len(taken) == 1 and "pipexctl_metrics_snapshot_seconds" in text
    at, kept, _ = col._cache
    col._cache = (at - 4.9, kept, 0.5)  # 4.9 s after a snapshot that took 0.5 s
    col.scrape()
    assert len(taken) == 1
    col._cache = (at - 5.1, kept, 0.5)
    col.scrape()
    assert len(taken) == 2


class _Fixed:
    """A collector with a fixed text, counting its scrapes."""

    def __init__(self) -> None:
        self.scrapes = 0

    def pieces(self) -> list[bytes]:
        self.scrapes += 1
        return [b"x 1.0\n"]


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:  # closed unanswered, the request unread
            pass
    return out


def test_the_endpoint_answers_get_and_head_and_refuses_the_rest():
    col = _Fixed()
    ex = metrics.Exporter(col, "127.0.0.1", 0)
    port = ex.address[1]
    try:
        got = _exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Length: 6" in head and body == b"x 1.0\n"
        got = _exchange(port, b"HEAD /metrics?x=1 HTTP/1.0\n\n")
        assert got.startswith(b"HTTP/1.1 200 OK") and got.endswith(b"\r\n\r\n")  # the head, no body
        assert _exchange(port, b"GET /other HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")
        got = _exchange(port, b"POST /metrics HTTP/1.1\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD" in got
        for bad in (b"GARBAGE\r\n\r\n", b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 9000 + b"\r\n\r\n",
                    b"GET /metrics HTTP/1.1\r\n"):  # the last closed before its blank line
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(bad)
                s.shutdown(socket.SHUT_WR)
                assert s.recv(100).startswith(b"HTTP/1.1 400 ")
        assert col.scrapes == 2
    finally:
        ex.shutdown()
    with pytest.raises(OSError):  # shut down: the port is closed
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_clients_that_stall_keep_no_scrape_out(monkeypatch):
    """A local user who connects and sends nothing (or trickles a byte at a
    time) keeps its own thread, for READ_TIMEOUT in all; a scrape meanwhile
    is answered at once; and with every slot held by stalled clients, a new
    client cuts off the one that has read longest, so it is answered too."""
    monkeypatch.setattr(metrics.Exporter, "READ_TIMEOUT", 3.0)
    monkeypatch.setattr(metrics.Exporter, "MAX_CLIENTS", 2)
    ex = metrics.Exporter(_Fixed(), "127.0.0.1", 0)
    port = ex.address[1]

    def answered() -> bool:
        t = time.monotonic()
        ok = _exchange(port, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200 ")
        return ok and time.monotonic() - t < 2.0  # not after a stalled client's 3 s

    def wait_until(pred) -> None:
        end = time.monotonic() + 10
        while not pred():
            assert time.monotonic() < end, "not within 10 s"
            time.sleep(0.02)

    try:
        first = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert answered()
        later = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        wait_until(lambda: ex._slots._value == 0 and len(ex._reading) == 2)
        assert first.recv(100).startswith(b"HTTP/1.1 400 ")  # the longest reader, cut off by the third
        assert answered()  # cuts off the next longest
        assert later[0].recv(100).startswith(b"HTTP/1.1 400 ")
        trickle = socket.create_connection(("127.0.0.1", port), timeout=10)
        t, got = time.monotonic(), b""
        while not got and time.monotonic() - t < 8:
            try:
                trickle.sendall(b"G")
            except OSError:
                break
            trickle.settimeout(0.5)
            try:
                got = trickle.recv(100)
            except socket.timeout:
                continue
        assert got.startswith(b"HTTP/1.1 400 ") and 2.5 < time.monotonic() - t < 5  # cut at READ_TIMEOUT in all
        for s in (first, *later, trickle):
            s.close()
    finally:
        ex.shutdown()


def test_a_snapshot_that_fails_is_logged_and_the_next_scrape_is_answered(caplog):
    class Flaky(_Fixed):
        def pieces(self) -> list[bytes]:
            self.scrapes += 1
            if self.scrapes == 1:
                raise KeyError("a bug")
            return [b"x 1.0\n"]

    ex = metrics.Exporter(Flaky(), "127.0.0.1", 0)
    try:
        assert _exchange(ex.address[1], b"GET / HTTP/1.1\r\n\r\n") == b""
        assert _exchange(ex.address[1], b"GET / HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\nx 1.0\n")
        end = time.monotonic() + 5  # logged on the first scrape's thread, after its connection closed
        while "metrics scrape failed" not in caplog.text and time.monotonic() < end:
            time.sleep(0.01)
        assert "metrics scrape failed" in caplog.text
    finally:
        ex.shutdown()
