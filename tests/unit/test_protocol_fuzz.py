"""Hostile input to the daemon's unix socket protocol, fuzzed (hypothesis):
the pure request parser, then a live OffloadServer (null kernel backend)
fed arbitrary bytes and JSON.  Every request gets one error reply (or a
valid answer), nothing is made, and the daemon keeps serving."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipexctl.discovery.discovery import Discovery
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.protocol import (
    MAX_REQUEST,
    OPS,
    Request,
    ack_cpu_wait,
    ack_stamps,
    parse_ack,
    parse_request,
    reply,
)
from pipexctl.offload.server import OffloadServer

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=4), max_leaves=12)


@given(st.binary(max_size=MAX_REQUEST + 200))
@settings(max_examples=500)
def test_parser_never_raises_on_bytes(data):
    req, why = parse_request(data)
    assert (req is None) != (why is None)
    assert req is None or req.op in OPS


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5) | json_values)
@settings(max_examples=500)
def test_parser_takes_only_known_ops(obj):
    req, why = parse_request(json.dumps(obj).encode())
    if isinstance(obj, dict) and obj.get("op") in OPS and why is None:
        assert req.op == obj["op"]
        assert req.v == obj.get("v", 1) and req.acks == (req.v >= 2)
    else:
        assert req is None and why in ("malformed_request", "unknown_op")
        if isinstance(obj, dict) and obj.get("op") in OPS:  # a known op with a bad version or pid
            assert any(k in obj for k in ("v", "pid"))


def test_deep_nesting_and_size_limit():
    assert parse_request(b"[" * 100000) == (None, "request_too_large")
    assert parse_request(b"[" * 2000 + b"]" * 2000 + b"\n")[1] == "malformed_request"  # deep but small: no RecursionError escapes
    assert parse_request(b'{"op": "status"}' + b" " * (MAX_REQUEST - 16)) == (Request(op="status"), None)


def test_the_contract_the_c_plugin_reads():
    """plugins/pipexctl.c takes a reply as success only when the line starts
    with these bytes, and sends exactly this request and ack."""
    assert reply(True, tunnel_id=1).startswith(b'{"ok": true,')
    assert reply(False, error="x").startswith(b'{"ok": false,')
    src = (Path(__file__).resolve().parents[2] / "plugins" / "pipexctl.c").read_text()
    # the request line as the plugin formats it: channel (v 2, at pppd's start) and move (v 4, with its unit)
    assert '"{\\"op\\": \\"%s\\", \\"v\\": %d, \\"pid\\": %d}\\n", op, with_pty ? 2 : 4' in src
    assert '"{\\"op\\": \\"%s\\", \\"v\\": 4, \\"pid\\": %d, \\"unit\\": %d}\\n", op' in src
    assert 'px_ask("channel", 1,' in src and 'px_ask("move", 0,' in src
    req, why = parse_request(b'{"op": "channel", "v": 2, "pid": 4242}\n')
    assert why is None and req.acks and req.pid == 4242
    req, why = parse_request(b'{"op": "move", "v": 3, "pid": 4242}\n')
    assert why is None and req.op == "move" and req.acks
    assert parse_request(b'{"op": "move", "v": 2, "pid": 4242}\n') == (None, "move_needs_version_3")
    req, why = parse_request(b'{"op": "move", "v": 4, "pid": 4242, "unit": 3}\n')
    assert why is None and req.unit == 3
    assert parse_request(b'{"op": "move", "v": 4, "pid": 4242, "unit": -1}\n') == (None, "malformed_request")
    assert parse_ack(b'{"op": "ack"}') == {"op": "ack"} and parse_ack(b'{"op": "ack"') is None
    assert parse_ack(b"") is None and parse_ack(b'{"op": "nack"}') is None and parse_ack(b"[1]") is None
    assert '"{\\"ok\\": true,"' in src
    # the ack as the plugin formats it, its stamps filled in: an ack, and its stamps read back
    fmt = '{\\"op\\": \\"ack\\", \\"asked_ns\\": %lld, \\"read_ns\\": %lld, \\"ack_ns\\": %lld}\\n'
    assert f'"{fmt}"' in src
    line = (fmt.replace('\\"', '"').replace("\\n", "").replace("%lld", "%d") % (100, 250, 260)).encode()
    ack = parse_ack(line)
    assert ack is not None and ack_stamps(ack, 200, 300) == (100, 250, 260)
    # with pppd's own wait for a CPU (schedstat), when the plugin could read it
    fmt = fmt[:-len('}\\n')] + ', \\"cpu_wait_ns\\": %lld}\\n'
    assert f'"{fmt}"' in src, fmt
    line = (fmt.replace('\\"', '"').replace("\\n", "").replace("%lld", "%d") % (100, 250, 260, 40)).encode()
    ack = parse_ack(line)
    assert ack is not None and ack_stamps(ack, 200, 300) == (100, 250, 260) and ack_cpu_wait(ack, 100, 250) == 40
    # a move's commit line, and a refusal for good, as the plugin compares them
    commit = reply(True, committed=True)
    assert '"{\\"ok\\": true, \\"committed\\": true", 30' in src and len(b'{"ok": true, "committed": true') == 30
    assert commit.startswith(b'{"ok": true, "committed": true')
    assert b'"retry": false' in reply(False, error="x", retry=False) and '"\\"retry\\": false"' in src


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    srv = OffloadServer(str(d / "serve.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    for _ in range(200):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(srv.socket_path)
            break
        except OSError:
            time.sleep(0.02)
    yield srv
    srv.stop.set()
    t.join(10)


def exchange(path, data):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@given(st.binary(min_size=1, max_size=MAX_REQUEST + 100).filter(lambda b: b"\n" not in b[:-1]))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_live_daemon_answers_every_input_once_and_keeps_serving(live, data):
    before = dict(live.service.stats)
    out = exchange(live.socket_path, data)
    lines = out.splitlines()
    assert len(lines) == 1, out
    rep = json.loads(lines[0])
    req, _ = parse_request(data)
    if req is not None and req.op in ("status", "metrics", "reconcile"):
        assert rep["ok"]
    else:  # not JSON, unknown op, or a "channel" from a process that is no pppd of xl2tpd
        assert rep["ok"] is False and rep["error"]
        assert live.service.stats["refused"] == before["refused"] + 1
    assert live.service.tunnels == {} and live.service.backend.session_dump() == []  # nothing made


def test_after_the_fuzzing_the_daemon_still_serves(live):
    rep = json.loads(exchange(live.socket_path, b'{"op": "status"}\n'))
    assert rep["ok"] and rep["tunnels"] == []
    # a client that connects and sends nothing is a liveness probe, not a refusal
    n = live.service.stats["refused"]
    assert exchange(live.socket_path, b"") == b""
    assert live.service.stats["refused"] == n


def test_ack_stamps_are_taken_only_when_they_fit_between_our_send_and_our_read():
    ok = {"op": "ack", "asked_ns": 100, "read_ns": 250, "ack_ns": 260}
    assert ack_stamps(ok, 200, 300) == (100, 250, 260)
    assert ack_stamps({"op": "ack"}, 200, 300) is None  # a plugin before the stamps
    for bad in ({**ok, "read_ns": 199},  # read before we sent
                {**ok, "ack_ns": 301},  # acked after we read the ack
                {**ok, "ack_ns": 240},  # acked before it read
                {**ok, "asked_ns": 201},  # asked after we answered
                {**ok, "asked_ns": 0},
                {**ok, "read_ns": 250.0},
                {**ok, "read_ns": True},
                {**ok, "read_ns": "250"}):
        assert ack_stamps(bad, 200, 300) is None, bad


def test_pppds_wait_for_a_cpu_is_taken_only_within_its_ask():
    # asked at 100, read at 250: a wait of 0 to 150 ns fits; more, a negative, or no int is not taken
    assert ack_cpu_wait({"op": "ack", "cpu_wait_ns": 0}, 100, 250) == 0
    assert ack_cpu_wait({"op": "ack", "cpu_wait_ns": 150}, 100, 250) == 150
    assert ack_cpu_wait({"op": "ack"}, 100, 250) is None  # a plugin before it
    for bad in (151, -1, 1.0, True, "5", None):
        assert ack_cpu_wait({"op": "ack", "cpu_wait_ns": bad}, 100, 250) is None, bad
