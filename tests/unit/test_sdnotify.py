"""systemd's protocols as `pipexctl serve` speaks them: a socket passed as
fd 3 (LISTEN_PID/LISTEN_FDS), READY/STATUS/STOPPING/WATCHDOG datagrams.
Real sockets and a real child process; the daemon on the null backend."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from pipexctl.discovery.discovery import Discovery
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload import sdnotify
from pipexctl.offload.client import ask
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.server import OffloadServer


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield s
    s.close()


def messages(s, until: str) -> list[str]:
    got = []
    while not any(until in m for m in got):
        got.append(s.recv(4096).decode())
    return got


def test_notify_sends_one_datagram_and_is_quiet_without_systemd(notify_socket, monkeypatch):
    assert sdnotify.notify("READY=1", "STATUS=x")
    assert notify_socket.recv(100) == b"READY=1\nSTATUS=x"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert sdnotify.notify("READY=1") is False


def test_watchdog_interval_is_half_of_watchdogsec(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process
    assert sdnotify.watchdog_interval() is None


def test_listen_socket_takes_fd_3_only_when_meant_for_this_process(tmp_path):
    path = str(tmp_path / "s.sock")
    lst = socket.socket(socket.AF_UNIX)
    lst.bind(path)
    lst.listen(8)
    code = ("import os, sys; from pipexctl.offload import sdnotify; os.environ['LISTEN_PID'] = str(os.getpid()) "
            "if sys.argv[1] == 'mine' else '1'; os.environ['LISTEN_FDS'] = '1'; s = sdnotify.listen_socket(); "
            "print(s.getsockname() if s else None, 'LISTEN_FDS' in os.environ)")

    def run(whose):
        return subprocess.run([sys.executable, "-c", code, whose], capture_output=True, text=True, timeout=60,
                              pass_fds=(3,), preexec_fn=lambda: os.dup2(lst.fileno(), 3)).stdout.split()

    assert run("mine") == [path, "False"]  # the variables are dropped: no child inherits them
    assert run("other") == ["None", "False"]
    lst.close()


def test_a_socket_activated_daemon_says_ready_and_leaves_the_socket_to_systemd(tmp_path, notify_socket):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    path = str(d / "serve.sock")
    lst = socket.socket(socket.AF_UNIX)
    lst.bind(path)
    lst.listen(8)
    # a pppd that asks before the daemon runs waits in the backlog
    early = socket.socket(socket.AF_UNIX)
    early.connect(path)
    srv = OffloadServer(str(tmp_path / "ignored.sock"), Discovery([], proc=False, kernel=False), NullBackend(),
                        NullDataPath(), state_path=str(d / "state.json"))
    srv.activated = lst
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    got = messages(notify_socket, "READY=1")
    assert "STATUS=serving; 0 call(s) offloaded in 0 tunnel(s), 0 refused, 0 failed" in got[-1]
    early.sendall(b'{"op": "status"}\n')
    assert json.loads(early.makefile().readline())["ok"]  # the request made before the daemon ran
    assert srv.socket_path == path and ask(path)["ok"]
    srv.reload.set()
    got = messages(notify_socket, "READY=1")
    assert any("RELOADING=1" in m for m in got)
    srv.stop.set()
    t.join(30)
    assert "STOPPING=1" in notify_socket.recv(100).decode()
    assert os.path.exists(path)  # systemd's socket: it stays for the next start
    early.close()


def test_journal_records_carry_fields_journalctl_can_match(tmp_path):
    import logging

    from pipexctl.offload import journal

    path = str(tmp_path / "journal.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(5)
    h = journal.JournalHandler(path=path)
    lg = logging.getLogger("pipexctl.test-journal")
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    try:
        lg.info("call %d offloaded", 7, extra={"journal": {"TUNNEL_ID": 17, "CALL_ID": 7, "PEER": "10.0.0.2"}})
        got = dict(ln.split("=", 1) for ln in s.recv(65536).decode().splitlines())
        assert got == {"MESSAGE": "call 7 offloaded", "PRIORITY": "6", "SYSLOG_IDENTIFIER": "pipexctl",
                       "LOGGER": "pipexctl.test-journal", "TUNNEL_ID": "17", "CALL_ID": "7", "PEER": "10.0.0.2"}
        lg.warning("two\nlines")  # a newline: the length-prefixed form
        data = s.recv(65536)
        assert b"MESSAGE\n" + (9).to_bytes(8, "little") + b"two\nlines\n" in data and b"PRIORITY=4\n" in data
    finally:
        lg.removeHandler(h)
        h.close()
        s.close()


def test_journal_is_used_only_when_stderr_is_the_journal_stream(monkeypatch):
    from pipexctl.offload import journal

    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert journal.under_journald() is None
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")  # another stream than our stderr
    assert journal.under_journald() is None
