"""`pipexctl serve`'s numbers: metrics() (the same for --metrics and
`stat --serve`), their Prometheus text, the HTTP endpoint and the CLI.

An OffloadServer on the null kernel backend and the null data path (no
kernel here); the real daemon's metrics are checked in
the guest (tests/kernel/test_offload.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipexctl import errors
from pipexctl.cli import cli
from pipexctl.discovery.discovery import Discovery
from pipexctl.discovery.state import CallInfo
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload import metrics
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.server import OffloadServer


def call(cid, tid=100, peer="192.0.2.7"):
    return CallInfo(instance="xl2tpd", role="lns", peer=peer, peer_port=1701, tunnel_id=tid, peer_tunnel_id=200,
                    call_id=cid, peer_call_id=cid + 1000, pppd_pid=4242, data_path="kernel")


@pytest.fixture
def srv(tmp_path):
    d = Discovery([], proc=False, kernel=False)
    s = OffloadServer(str(tmp_path / "serve.sock"), d, NullBackend(), NullDataPath())
    s.channels = []
    for c in (call(1), call(2), call(3, tid=101, peer="192.0.2.8")):
        d.tracker.inst("xl2tpd").calls[c.call_id] = c
    yield s
    for ts in s.service.tunnels.values():
        if ts.sock is not None:
            ts.sock.close()


@contextlib.contextmanager
def serving(srv):
    """``srv`` serving in a thread until the block ends."""
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        for _ in range(100):
            try:
                socket.socket(socket.AF_UNIX).connect(srv.socket_path)
                break
            except OSError:
                threading.Event().wait(0.05)
        yield srv
    finally:
        srv.stop.set()
        t.join(10)


def offload(s, c):
    ch, _ = s.service.offload(c, 4242)
    s.channels.append(ch)  # pppd's copy: closing it would end the session, as in the kernel
    s.service.stats["offloaded"] += 1


def test_metrics_counts_what_the_daemon_owns_and_why_it_refused(srv):
    for c in (call(1), call(2), call(3, tid=101, peer="192.0.2.8")):
        offload(srv, c)
    with pytest.raises(errors.ConflictError):
        srv.service.offload(call(1), 4242)
    srv.service.stats["failed"] += 1
    srv.service.reasons[("failed", "conflict")] += 1
    srv.service.refused("no_call")
    srv.service.refused("no_call")
    srv.service.refused("not_root")
    m = srv.service.metrics()
    assert m["offloaded_tunnels"] == 2 and m["offloaded_sessions"] == 3
    assert m["offload"] == {"offloaded": 3, "removed": 0, "refused": {"no_call": 2, "not_root": 1},
                            "failed": {"conflict": 1}}
    assert m["calls"] == [{"role": "lns", "data_path": "kernel", "count": 3}]
    assert [(s["tunnel_id"], s["session_id"], s["peer"]) for s in m["sessions"]] == \
        [(100, 1, "192.0.2.7"), (100, 2, "192.0.2.7"), (101, 3, "192.0.2.8")]
    assert m["sessions_not_listed"]["count"] == 0 and m["kernel_error"] is None


def test_per_session_series_are_capped_and_the_rest_summed(srv):
    for c in (call(1), call(2), call(3, tid=101, peer="192.0.2.8")):
        offload(srv, c)
    srv.service.backend._sessions[(100, 2)].stats.rx_bytes = 500
    srv.service.backend._sessions[(101, 3)].stats.rx_bytes = 70
    srv.service.max_session_series = 1
    m = srv.service.metrics()
    assert [s["session_id"] for s in m["sessions"]] == [1]
    assert m["sessions_not_listed"]["count"] == 2 and m["sessions_not_listed"]["rx_bytes"] == 570


def test_prometheus_text_parses_and_carries_the_numbers(srv):
    offload(srv, call(1))
    srv.service.backend._sessions[(100, 1)].stats.tx_bytes = 1234
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


@pytest.mark.parametrize("text,want", [(":9469", ("127.0.0.1", 9469)), ("0.0.0.0:9469", ("0.0.0.0", 9469)), ("127.0.0.1:80", ("127.0.0.1", 80)),
                                       ("[::1]:9469", ("::1", 9469))])
def test_parse_listen(text, want):
    assert metrics.parse_listen(text) == want


@pytest.mark.parametrize("text", ["9469", "host:", ":0", ":70000", "a:b"])
def test_parse_listen_rejects(text):
    with pytest.raises(ValueError):
        metrics.parse_listen(text)


def test_cli_rejects_a_bad_metrics_address():
    r = CliRunner().invoke(cli, ["serve", "--metrics", "nonsense"])
    assert r.exit_code == 2 and "expected [HOST]:PORT" in r.output


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_endpoint_and_stat_serve_give_the_same_numbers(srv, tmp_path):
    offload(srv, call(1))
    srv.service.backend._sessions[(100, 1)].stats.rx_packets = 9
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


def test_stat_serve_without_a_daemon_is_one_clear_error(tmp_path):
    r = CliRunner().invoke(cli, ["stat", "--serve", "--socket", str(tmp_path / "none.sock")])
    assert r.exit_code == 1
    assert "cannot ask pipexctl serve" in r.output and "Traceback" not in r.output


def test_a_duplicate_offload_leaves_the_healthy_session_and_its_tunnel_socket(srv):
    offload(srv, call(1))
    tunnels = dict(srv.service.datapath.tunnels)
    with pytest.raises(errors.ConflictError):
        srv.service.offload(call(1), 4242)
    assert 1 in srv.service.tunnels[("xl2tpd", 100)].records
    assert srv.service.datapath.tunnels == tunnels and len(tunnels) == 1  # the tunnel's socket is still open
    assert srv.service.tunnels[("xl2tpd", 100)].sock.fileno() >= 0
    assert srv.service.backend.session_get(100, 1).session_id == 1


def test_a_second_tunnel_from_the_same_peer_address_and_port_gets_a_steered_socket(srv):
    """Linux before 6.11 looks a data packet's session up in the tunnel of
    the socket that received it: only the first tunnel of an address pair
    sits on xl2tpd's port, a second one (a twin) on a steered private port."""
    offload(srv, call(1))
    first = srv.service.tunnels[("xl2tpd", 100)]
    srv.service.xl2tpd_port = first.local_port  # as if the first one sat on xl2tpd's port
    offload(srv, call(5, tid=103))
    offload(srv, call(4, tid=102, peer="192.0.2.8"))  # another peer: a tunnel of its own
    assert {t: twin for t, (twin, _) in srv.service.datapath.tunnels.items()} == {100: False, 103: True, 102: False}
    assert srv.service.backend.tunnel_get(103).peer_tunnel_id == 200


def test_a_tunnel_from_a_second_port_of_one_address_goes_to_that_port_and_is_no_twin(srv):
    """Two clients behind one NAT address: the second tunnel's socket is
    connected to its own peer port, and it is not a twin (another pair)."""
    offload(srv, call(1))
    srv.service.xl2tpd_port = srv.service.tunnels[("xl2tpd", 100)].local_port
    offload(srv, call(5, tid=103).copy(peer_port=1702))
    second = srv.service.tunnels[("xl2tpd", 103)]
    assert (second.peer, second.peer_port) == ("192.0.2.7", 1702)
    assert srv.service.datapath.tunnels[103][0] is False  # no twin: its own address pair


def test_a_dropped_tunnel_closes_its_socket(srv):
    from pipexctl.discovery.state import TunnelDown, TunnelInfo

    offload(srv, call(1))
    sock = srv.service.tunnels[("xl2tpd", 100)].sock
    srv.service.on_event(TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", peer="192.0.2.7", tunnel_id=100, peer_tunnel_id=200)))
    assert srv.service.datapath.tunnels == {} and srv.service.tunnels == {} and sock.fileno() == -1


def test_a_reused_session_id_is_offloaded_and_the_old_calls_late_end_spares_it(srv):
    """xl2tpd's call ids are random: a new call can get the id of one whose
    pppd just exited, before discovery reported that end."""
    from pipexctl.discovery.state import CallDown

    offload(srv, call(1))
    srv.channels.pop().close()  # the first pppd exits: the kernel drops its session
    new = call(1).copy(pppd_pid=4343, peer_call_id=77)
    ch, meta = srv.service.offload(new, 4343)
    srv.channels.append(ch)
    assert meta["peer_session_id"] == 77 and srv.service.backend.session_get(100, 1).peer_session_id == 77
    srv.service.on_event(CallDown(call=call(1), reason="pppd 4242 exited"))  # the old call's end, late
    assert srv.service.tunnels[("xl2tpd", 100)].records[1].pppd_pid == 4343
    assert srv.service.backend.session_get(100, 1).peer_session_id == 77
    srv.service.on_event(CallDown(call=new, reason="hung up"))  # the new call's own end
    assert 1 not in srv.service.tunnels[("xl2tpd", 100)].records


def test_a_reused_tunnel_id_replaces_the_dead_tunnel_and_its_late_end_spares_the_new_one(srv):
    from pipexctl.discovery.state import TunnelDown, TunnelInfo

    offload(srv, call(1))
    old_sock = srv.service.tunnels[("xl2tpd", 100)].sock
    new = call(5).copy(peer_tunnel_id=300, pppd_pid=4343)
    ch, meta = srv.service.offload(new, 4343)
    srv.channels.append(ch)
    ts = srv.service.tunnels[("xl2tpd", 100)]
    assert ts.peer_tunnel_id == 300 and list(ts.records) == [5] and old_sock.fileno() == -1
    assert srv.service.backend.tunnel_get(100).peer_tunnel_id == 300
    srv.service.on_event(TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", peer="192.0.2.7", tunnel_id=100, peer_tunnel_id=200)))
    assert ("xl2tpd", 100) in srv.service.tunnels and srv.service.backend.tunnel_get(100).peer_tunnel_id == 300
    srv.service.on_event(TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", peer="192.0.2.7", tunnel_id=100, peer_tunnel_id=300)))
    assert ("xl2tpd", 100) not in srv.service.tunnels


def test_an_unknown_failpoint_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEXCTL_FAILPOINT", "state-saved,tunnel-made")
    with pytest.raises(errors.InvalidArgumentError, match="unknown tunnel-made"):
        OffloadServer(str(tmp_path / "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    monkeypatch.setenv("PIPEXCTL_FAILPOINT", "state-saved@x")
    with pytest.raises(errors.InvalidArgumentError, match="seconds must be a number"):
        OffloadServer(str(tmp_path / "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    monkeypatch.setenv("PIPEXCTL_FAILPOINT", "state-saved,session-created@2.5")
    s = OffloadServer(str(tmp_path / "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    assert s.service.failpoints == {"state-saved": None, "session-created": 2.5}


def test_a_request_reads_the_call_from_the_log_without_waiting_for_the_watcher(tmp_path):
    """The pppd's call is in the log when it asks: the request finds it at
    once, though the watcher (not running here) would poll only later."""
    log = tmp_path / "xl2tpd.log"
    log.write_text("xl2tpd[147]: xl2tpd version xl2tpd-1.3.18 started on (none) PID:147\n")
    d = Discovery([str(log)], proc=False, kernel=False)
    s = OffloadServer(str(tmp_path / "s.sock"), d, NullBackend(), NullDataPath(), wait=3.0, log_interval=60)
    try:
        d.refresh(events=False)  # as serve_forever starts
        with log.open("a") as f:
            f.write("xl2tpd[147]: Connection established to 10.99.1.2, 1701.  Local: 28398, Remote: 58717 "
                    "(ref=0/0).  LNS session is 'default'\n"
                    "xl2tpd[147]: Call established with 10.99.1.2, PID: 151, Local: 19361, Remote: 13604, Serial: 1\n")
        call, why = s.watch.call_of(151, s.wait)  # before: "no call names this pid" after the 3 s
        assert call is not None, why
        assert (call.tunnel_id, call.peer_tunnel_id, call.call_id, call.peer_call_id) == (28398, 58717, 19361, 13604)
        assert s.watch.pending and s.watch.pending[-1].event == "CallUp"  # the watcher still gets the events
    finally:
        d.close()


def test_status_names_every_call_its_path_and_why_one_stayed_on_the_pty(srv, tmp_path):
    offload(srv, call(1))
    srv.service.refused("no_call", 5151)
    c3 = srv.watch.d.tracker.inst("xl2tpd").calls[3]
    c3.pppd_pid, c3.data_path = 5151, "userspace"
    with serving(srv):
        r = CliRunner().invoke(cli, ["status", "--socket", srv.socket_path, "--json"])
        assert r.exit_code == 0, r.output
        calls = {c["call_id"]: c for c in json.loads(r.output)["calls"]}
        assert calls[1]["path"] == "offloaded" and calls[2]["path"] == "xl2tpd kernel mode"
        assert calls[3]["path"] == "pty" and calls[3]["why_not"] == "no_call"
        r = CliRunner().invoke(cli, ["status", "--socket", srv.socket_path])
        assert r.exit_code == 0 and "offloads: 1 made" in r.output
        assert "WHY-NOT" in r.output and "no_call" in r.output


def test_check_offload_reports_the_setup_piece_by_piece(srv, tmp_path):
    from pipexctl.offload import pppopts
    from pipexctl.offload.setupcheck import offload_checks

    opts, conf = tmp_path / "options.lns", tmp_path / "xl2tpd.conf"
    opts.write_text("noauth\n")
    conf.write_text(f"[lns default]\npppoptfile = {opts}\n")
    got = {c.name: c for c in offload_checks(str(conf), srv.socket_path)}
    assert not got["daemon"].ok and not got[f"options {opts}"].ok
    assert "pipexctl offload enable" in got[f"options {opts}"].detail
    assert all(not c.required for c in got.values())  # warnings: a half set-up host is no failure
    pppopts.manage([str(opts)], pppopts.block())
    with serving(srv):
        got = {c.name: c for c in offload_checks(str(conf), srv.socket_path)}
    assert got["daemon"].ok and got[f"options {opts}"].ok
    if "plugin" in got:  # this host's pppd (Debian's ppp) with the set-up's plugin
        assert got["plugin"].ok, got["plugin"].detail


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


def test_a_scrape_loop_costs_one_snapshot_a_second(srv, monkeypatch):
    reg = metrics.CollectorRegistry()
    col = metrics.ServeCollector(srv.service)
    reg.register(col)
    taken = []
    real = srv.service.metrics
    monkeypatch.setattr(srv.service, "metrics", lambda: taken.append(1) or real())
    for _ in range(20):
        generate_latest(reg)
    assert len(taken) == 1
    offload(srv, call(1))
    col._cache = (col._cache[0] - col.MIN_INTERVAL, col._cache[1])  # a second later
    text = generate_latest(reg).decode()
    assert len(taken) == 2 and "pipexctl_offloaded_sessions 1.0" in text
