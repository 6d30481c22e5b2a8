"""offload.client.ask against a stand-in for `pipexctl serve`: a unix
socket served by a thread on a tmp path, answering as told.  The real
daemon's answers are test_server.py's."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time

import pytest

from pipexctl import errors
from pipexctl.offload import client


@contextlib.contextmanager
def server(path, answer):
    """Listening at ``path``; each connection: its request line read, then
    ``answer(conn, request)``.  Yields the requests it was sent."""
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(str(path))
    lst.listen(4)
    lst.settimeout(10)
    requests: list = []
    done = threading.Event()

    def run():
        while not done.is_set():
            try:
                conn, _ = lst.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    buf += chunk
                requests.append(json.loads(buf))
                answer(conn, requests[-1])

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield requests
    finally:
        done.set()
        with contextlib.suppress(OSError):
            lst.shutdown(socket.SHUT_RDWR)  # wakes the accept
        lst.close()
        t.join(10)


def reply(obj, *, newline=True):
    def answer(conn, _req):
        conn.sendall(json.dumps(obj).encode() + (b"\n" if newline else b""))
    return answer


def test_the_reply_is_parsed_and_the_default_request_is_status(tmp_path):
    sock = tmp_path / "serve.sock"
    with server(sock, reply({"ok": True, "calls": 3, "offloaded": [1, 2]})) as reqs:
        assert client.ask(str(sock)) == {"ok": True, "calls": 3, "offloaded": [1, 2]}
    assert reqs == [{"op": "status"}]


def test_the_request_is_sent_as_given(tmp_path):
    sock = tmp_path / "serve.sock"
    with server(sock, lambda conn, req: conn.sendall(json.dumps({"ok": True, "echo": req}).encode() + b"\n")):
        assert client.ask(str(sock), {"op": "metrics", "x": [1]})["echo"] == {"op": "metrics", "x": [1]}


def test_a_reply_in_many_pieces_longer_than_one_read_is_read_whole(tmp_path):
    big = {"ok": True, "blob": "x" * 300_000}
    line = json.dumps(big).encode() + b"\n"

    def trickle(conn, _req):
        for i in range(0, len(line), 50_000):
            conn.sendall(line[i:i + 50_000])
            time.sleep(0.01)

    sock = tmp_path / "serve.sock"
    with server(sock, trickle):
        assert client.ask(str(sock)) == big


def test_a_reply_ended_by_close_not_newline_is_taken(tmp_path):
    sock = tmp_path / "serve.sock"
    with server(sock, reply({"ok": True}, newline=False)):
        assert client.ask(str(sock)) == {"ok": True}


def test_no_daemon_is_one_socket_error_naming_the_socket(tmp_path):
    sock = tmp_path / "serve.sock"
    with pytest.raises(errors.SocketError, match=re.escape(f"cannot ask pipexctl serve at {sock}: No such file")) as e:
        client.ask(str(sock))
    assert e.value.__cause__ is None and e.value.__suppress_context__  # one line, no OSError traceback


def test_a_socket_no_one_listens_on_is_connection_refused(tmp_path):
    sock = tmp_path / "serve.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sock))  # bound, never listening: a daemon that died and left its socket
    try:
        with pytest.raises(errors.SocketError, match="Connection refused"):
            client.ask(str(sock))
    finally:
        dead.close()


def test_a_silent_daemon_is_a_socket_error_after_the_timeout_not_a_hang(tmp_path):
    sock = tmp_path / "serve.sock"
    release = threading.Event()
    with server(sock, lambda conn, req: release.wait(10)):
        t0 = time.monotonic()
        try:
            with pytest.raises(errors.SocketError, match="timed out"):
                client.ask(str(sock), timeout=0.3)
        finally:
            release.set()
        assert 0.25 <= time.monotonic() - t0 < 5


def test_a_daemon_that_closes_without_a_word_sent_no_valid_reply(tmp_path):
    sock = tmp_path / "serve.sock"
    with server(sock, lambda conn, req: None):
        with pytest.raises(errors.SocketError, match=re.escape(f"pipexctl serve at {sock} sent no valid reply")):
            client.ask(str(sock))


def test_a_torn_reply_is_no_valid_reply(tmp_path):
    sock = tmp_path / "serve.sock"
    with server(sock, lambda conn, req: conn.sendall(b'{"ok": true, "calls": ')):
        with pytest.raises(errors.SocketError, match="sent no valid reply"):
            client.ask(str(sock))


def test_a_refusal_is_a_socket_error_with_the_daemons_reason(tmp_path):
    sock = tmp_path / "serve.sock"
    with server(sock, reply({"ok": False, "error": "unknown op 'nope'"})):
        with pytest.raises(errors.SocketError, match="pipexctl serve refused: unknown op 'nope'"):
            client.ask(str(sock), {"op": "nope"})


@pytest.mark.parametrize("obj, shown", [({"calls": 3}, "None"), ([1, 2], r"\[1, 2\]"), (None, "None")])
def test_a_reply_that_is_not_an_ok_object_is_refused(tmp_path, obj, shown):
    sock = tmp_path / "serve.sock"
    with server(sock, reply(obj)):
        with pytest.raises(errors.SocketError, match=f"pipexctl serve refused: {shown}$"):
            client.ask(str(sock))
