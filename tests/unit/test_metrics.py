"""`pipexctl serve`'s Prometheus side (offload/metrics.py): the text of
metrics() (the numbers themselves are report.py's, test_report.py), the
--metrics address, the HTTP endpoint against `stat --serve`, the scrape
cache, and contrib's rules and dashboard against what the daemon exports.

An OffloadServer on the null kernel backend and the null data path (no
kernel here: ``srv``, tests/unit/conftest.py); the real daemon's metrics
are checked in the guest (tests/kernel/test_offload.py)."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.exposition import generate_latest
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
    reg = metrics.CollectorRegistry()
    reg.register(metrics.ServeCollector(srv.service))
    text = generate_latest(reg).decode()
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
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
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
    reg = metrics.CollectorRegistry()
    reg.register(metrics.ServeCollector(srv.service))
    from prometheus_client import ProcessCollector

    ProcessCollector(registry=reg)
    fams = list(text_string_to_metric_families(generate_latest(reg).decode()))
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
    """A registry with the daemon's collector, and the list of the
    snapshots it took (one item each)."""
    reg = metrics.CollectorRegistry()
    col = metrics.ServeCollector(srv.service)
    reg.register(col)
    taken = []
    real = srv.service.metrics
    monkeypatch.setattr(srv.service, "metrics", lambda: taken.append(1) or real())
    return reg, col, taken


def test_a_scrape_loop_costs_one_snapshot_a_second(srv, monkeypatch):
    reg, col, taken = _counted(srv, monkeypatch)
    for _ in range(20):
        generate_latest(reg)
    assert len(taken) == 1
    offload(srv, call(1))
    col._cache = (col._cache[0] - col.MIN_INTERVAL, *col._cache[1:])  # a second later
    text = generate_latest(reg).decode()
    assert len(taken) == 2 and "pipexctl_offloaded_sessions 1.0" in text


def test_a_slow_snapshot_serves_ten_times_as_long(srv, monkeypatch):
    reg, col, taken = _counted(srv, monkeypatch)
    text = generate_latest(reg).decode()
    assert len(taken) == 1 and "pipexctl_metrics_snapshot_seconds" in text
    at, fams, _ = col._cache
    col._cache = (at - 4.9, fams, 0.5)  # 4.9 s after a snapshot that took 0.5 s
    generate_latest(reg)
    assert len(taken) == 1
    col._cache = (at - 5.1, fams, 0.5)
    generate_latest(reg)
    assert len(taken) == 2
