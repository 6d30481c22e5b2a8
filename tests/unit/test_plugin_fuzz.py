"""The C side of the plugin <-> daemon contract, fuzzed (hypothesis): the
plugin's own request path (plugins/pipexctl.c's px_request, built with
AddressSanitizer and UBSan into tests/unit/c/plugin_harness.c) against a
socket that answers with arbitrary replies and arbitrary fds.

This host has no PPPoX sockets, so no reply can be accepted here: every
request must fail with a reason, leave no fd open, and never crash or trip
a sanitizer.  What a valid reply with a real channel does is the guest's
job (tests/kernel/test_offload.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "unit" / "c" / "plugin_harness.c"


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    d = tmp_path_factory.mktemp("plugin")
    exe = d / "harness"
    r = subprocess.run(["gcc", "-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                        "-Wall", "-Wextra", "-Werror", "-Wno-unused-function", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers", f"-I{ROOT / 'plugins'}", "-o", str(exe), str(HARNESS)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    path = str(d / "serve.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    srv.settimeout(10)
    p = subprocess.Popen([str(exe), path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, errors="replace", env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0"})
    h = Harness(p, srv)
    h.baseline = h.ask(lambda conn: conn.close())[1]
    yield h
    p.stdin.close()
    p.wait(10)
    srv.close()
    err = p.stderr.read()
    assert p.returncode == 0 and "Sanitizer" not in err and "runtime error" not in err, err[-3000:]


class Harness:
    def __init__(self, p: subprocess.Popen, srv: socket.socket) -> None:
        self.p, self.srv, self.baseline = p, srv, -1

    def ask(self, serve, op: str = "channel") -> tuple[int, int, str]:
        """One px_request (``op`` "move": one px_move); ``serve(conn)`` answers
        it.  Returns (result, open fds, why); fails if why holds a byte that
        is not printable ASCII."""
        self.p.stdin.write("go\n" if op == "channel" else "move\n")
        self.p.stdin.flush()
        conn, _ = self.srv.accept()
        try:
            conn.settimeout(5)
            req = conn.recv(4096)
            assert json.loads(req) == {"op": op, "v": 2 if op == "channel" else 4, "pid": self.p.pid}  # no unit: no /dev/ppp here
            serve(conn)
        finally:
            conn.close()
        line = self.p.stdout.readline()
        assert line, f"the harness died: {self.p.stderr.read()[-3000:]}"
        r, n, bad, why = line.rstrip("\n").split(" ", 3)
        assert bad == "0", f"{bad} byte(s) that are not printable ASCII reach pppd's log: {why}"
        return int(r), int(n), why


def _fd(kind: str) -> int:
    """A fresh fd of ``kind``; the caller closes it."""
    if kind == "udp-connected":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("127.0.0.1", 9))
    elif kind == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    elif kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    elif kind == "tcp":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    else:
        return os.open("/dev/null", os.O_RDONLY)
    return s.detach()


ids = st.integers(min_value=-2**40, max_value=2**40) | st.integers(min_value=0, max_value=70000)
good_like = st.fixed_dictionaries({"ok": st.booleans(), "tunnel_id": ids, "session_id": ids,
                                   "peer_tunnel_id": ids, "peer_session_id": ids},
                                  optional={"error": st.text(max_size=300)}).map(
    lambda d: json.dumps(d).encode() + b"\n")
replies = (good_like
           | st.binary(max_size=3000)
           | st.builds(lambda a, b: a + b, good_like, st.binary(max_size=200))
           | st.text(alphabet='{}":, ok true error session_id tunnel_id 0123456789-\n\\', max_size=400)
           .map(str.encode))
fd_sets = st.lists(st.sampled_from(["udp-connected", "udp", "unix", "tcp", "file"]), max_size=4)


@given(reply=replies, fds=fd_sets, ack=st.booleans())
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_reply_and_any_fds_give_a_reason_and_leak_nothing(harness, reply, fds, ack):
    opened = [_fd(k) for k in fds]

    def serve(conn):
        try:
            if reply or opened:
                socket.send_fds(conn, [reply or b" "], opened)
            if ack:
                conn.recv(64)  # the plugin's ack, if it sends one
        except OSError:
            pass  # the plugin may have hung up first

    try:
        r, n, why = harness.ask(serve)
    finally:
        for fd in opened:
            os.close(fd)
    assert r == -1 and why
    assert n == harness.baseline, f"{n - harness.baseline} fd(s) left open after: {why}"


def test_a_refusal_is_quoted_and_bounded(harness):
    msg = "x" * 1000
    r, n, why = harness.ask(lambda c: c.sendall(json.dumps({"ok": False, "error": msg}).encode() + b"\n"))
    assert r == -1 and why.startswith("pipexctl refused: " + "x" * 100) and len(why) < 260
    assert n == harness.baseline
    line = json.dumps({"ok": False, "error": 'no "call"\n<31>xl2tpd[1]: forged', "reason": "x"}).encode() + b"\n"
    assert harness.ask(lambda c: c.sendall(line))[2] == 'pipexctl refused: no "call"n<31>xl2tpd[1]: forged'


def test_a_reply_without_its_socket_is_refused_and_the_fds_that_came_are_closed(harness):
    fd = _fd("udp-connected")
    try:
        r, n, why = harness.ask(lambda c: socket.send_fds(
            c, [b'{"ok": true, "tunnel_id": 5, "session_id": 7}\n'], [fd, fd]))
    finally:
        os.close(fd)
    assert (r, why) == (-1, "received fd is not an AF_PPPOX socket")
    assert n == harness.baseline


# px_move's results: what its timer does next (plugins/pipexctl.c)
PX_REFUSED, PX_FINAL = -2, -3


def test_a_move_refused_for_good_is_not_asked_again_and_any_other_refusal_is(harness):
    """A refusal with "retry": false (the daemon will never take this pppd)
    stops the plugin's move timer; any other refusal, or a reply that is no
    channel, makes it ask again later.  Nothing is left open either way."""
    def say(**reply):
        return lambda c: c.sendall(json.dumps({"ok": False, **reply}).encode() + b"\n")

    r, n, why = harness.ask(say(error="pid 1 is not a pppd started by xl2tpd", retry=False), op="move")
    assert (r, why) == (PX_FINAL, "pipexctl refused: pid 1 is not a pppd started by xl2tpd")
    assert n == harness.baseline
    r, n, why = harness.ask(say(error="no xl2tpd call for pppd 1 within 60 s"), op="move")
    assert (r, why) == (PX_REFUSED, "pipexctl refused: no xl2tpd call for pppd 1 within 60 s")
    assert n == harness.baseline
    fd = _fd("udp-connected")
    try:  # a channel that is not one: refused by the plugin, asked again later
        r, n, why = harness.ask(lambda c: socket.send_fds(
            c, [b'{"ok": true, "tunnel_id": 5, "session_id": 7}\n'], [fd, fd]), op="move")
    finally:
        os.close(fd)
    assert (r, why, n) == (PX_REFUSED, "received fd is not an AF_PPPOX socket", harness.baseline)


@given(reply=replies, fds=fd_sets)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_reply_to_a_move_gives_a_reason_and_leaks_nothing(harness, reply, fds):
    opened = [_fd(k) for k in fds]

    def serve(conn):
        try:
            if reply or opened:
                socket.send_fds(conn, [reply or b" "], opened)
        except OSError:
            pass

    try:
        r, n, why = harness.ask(serve, op="move")
    finally:
        for fd in opened:
            os.close(fd)
    assert r in (-1, PX_REFUSED, PX_FINAL) and why
    assert n == harness.baseline, f"{n - harness.baseline} fd(s) left open after: {why}"
