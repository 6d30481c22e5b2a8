"""systemd's protocols as `pipexctl serve` speaks them (offload/sdnotify.py):
a socket passed as fd 3 (LISTEN_PID/LISTEN_FDS), READY/STATUS/WATCHDOG
datagrams.  Real sockets and a real child process.  The daemon's own use
of them: test_server.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from pipexctl.offload import sdnotify


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
