"""xl2tpd's control pipe (discovery/control.py): its replies parsed from
real text, and the client's request path against stand-ins for xl2tpd's
side of the FIFO (the real xl2tpd: tests/kernel)."""

from __future__ import annotations

import os
import threading

import pytest

from pipexctl.discovery import control as ctl


def test_control_reply_parsing_real_text():
    av = ctl.parse_available(ctl.parse_reply(
        "00 OK\n00 AVAILABLE lns.0.name=default\n00 AVAILABLE lns.count=1\n00 AVAILABLE lac.0.name=\n"
        "00 AVAILABLE lac.count=1\n00 AVAILABLE tunnel 0x56406db169d0, id 2547, ourtid 25824 has 1 calls and self "
        "0x56406db204c0\n00 AVAILABLE tunnels count=1\n00 AVAILABLE calls count=0\n"))
    assert av.lns == ["default"] and av.lac == []
    assert av.tunnels == [ctl.AvailableTunnel(peer_tunnel_id=2547, tunnel_id=25824, calls=1)]
    st = ctl.parse_status_lns(ctl.parse_reply(
        "00 OK\n00 STATUS tunnels.0.id=2547\n00 STATUS tunnels.0.peer=10.99.2.2:1701\n"
        "00 STATUS tunnels.0.calls.0.id=52848\n00 STATUS tunnels.0.calls.0.tx_bytes=273\n"
        "00 STATUS tunnels.0.calls.0.rx_bytes=173\n00 STATUS tunnels.0.calls.0.tx_pkts=9\n"
        "00 STATUS tunnels.0.calls.0.rx_pkts=8\n00 STATUS tunnels.0.calls.count=1\n00 STATUS tunnels.count=1\n"))
    assert st[0].peer_tunnel_id == 2547 and (st[0].peer, st[0].peer_port) == ("10.99.2.2", 1701)
    assert st[0].calls == {52848: ctl.StatusCall(52848)}
    # a second tunnel after the tenth (its index sorts as a number), and a value that is no number
    many = "".join(f"00 STATUS tunnels.{i}.id={i + 1}\n00 STATUS tunnels.{i}.peer=10.99.{i}.2:1701\n"
                   f"00 STATUS tunnels.{i}.calls.0.id={100 + i}\n00 STATUS tunnels.{i}.calls.0.tx_bytes=1\n"
                   for i in range(12))
    st = ctl.parse_status_lns(ctl.parse_reply("00 OK\n" + many))
    assert [(t.peer_tunnel_id, t.peer, list(t.calls)) for t in st] == [(i + 1, f"10.99.{i}.2", [100 + i])
                                                                       for i in range(12)]
    for bad in ("tunnels.0.id=x", "tunnels.0.peer=10.99.2.2:x", "tunnels.0.calls.0.id=1x"):
        with pytest.raises(ctl.ControlError, match="malformed status-lns"):
            ctl.parse_status_lns(ctl.parse_reply(f"00 OK\n00 STATUS {bad}\n"))
    with pytest.raises(ctl.ControlError, match="malformed"):
        ctl.parse_reply("garbage")
    assert not ctl.parse_reply("01 Error: Could not find lns\n").ok


def test_control_client_errors(tmp_path):
    c = ctl.ControlClient(str(tmp_path / "nope"), timeout=0.3)
    with pytest.raises(ctl.ControlError, match="does not exist"):
        c.available()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ctl.ControlError, match="xl2tpd is not running"):
        ctl.ControlClient(str(fifo), timeout=0.3).available()


def test_control_client_protocol(tmp_path):
    """The request bytes and the reply path, against a stand-in that speaks
    xl2tpd's side of the FIFO protocol (the real xl2tpd: tests/kernel)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    seen = {}

    def server():
        with open(fifo, "rb") as f:
            req = f.read().decode()
        seen["req"] = req
        path, letter = req[1:].split(" ")[:2]
        with open(path, "w") as r:
            r.write("00 OK\n00 STATUS tunnels.count=0\n")

    th = threading.Thread(target=server, daemon=True)
    th.start()
    import time

    time.sleep(0.1)
    st = ctl.ControlClient(str(fifo), timeout=3).status_lns("default")
    th.join(3)
    assert st == [] and seen["req"].startswith("@") and seen["req"].endswith(" y default\n")


def test_one_client_asks_many_times_through_one_directory_made_again_if_removed(tmp_path):
    """A FIFO per question in the client's own directory; a cleaner of /tmp
    that removed that directory costs one new one, not an error, and what
    anyone made under its name afterwards is never used."""
    import shutil
    import time

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    paths = []

    def server(n):
        for _ in range(n):
            with open(fifo, "rb") as f:
                req = f.read().decode()
            path = req[1:].split(" ")[0]
            paths.append(path)
            with open(path, "w") as r:
                r.write("00 OK\n00 STATUS tunnels.count=0\n")

    th = threading.Thread(target=server, args=(5,), daemon=True)
    th.start()
    time.sleep(0.1)
    c = ctl.ControlClient(str(fifo), timeout=3)
    assert c.status_lns() == [] and c.status_lns() == []
    first = c._dir
    assert first is not None and os.stat(first).st_mode & 0o777 == 0o700 and os.listdir(first) == []
    shutil.rmtree(first)
    assert c.status_lns() == []
    second = c._dir
    # someone else's directory under its name (in /tmp anyone may make one once it is gone), or a file
    shutil.rmtree(second)
    os.mkdir(second, 0o755)
    assert c.status_lns() == []
    third = c._dir
    shutil.rmtree(third)
    with open(third, "w"):
        pass
    assert c.status_lns() == []
    th.join(3)
    assert os.listdir(second) == [] and os.path.isfile(third)  # never written to
    assert len({first, second, third, c._dir}) == 4 and os.listdir(c._dir) == []
    assert [os.path.dirname(p) for p in paths] == [first, first, second, third, c._dir] and len(set(paths)) == 5


def test_a_killed_clients_reply_directory_is_removed_and_nothing_else(tmp_path, monkeypatch):
    """A client killed by SIGKILL leaves its reply directory; the sweep a
    daemon runs at start removes it, and only such directories: a live
    process's, another name's, a symlink and what lies outside stay."""
    import signal
    import subprocess
    import sys

    base = tmp_path / "run"
    base.mkdir()
    monkeypatch.setenv("RUNTIME_DIRECTORY", f"{base}:{tmp_path / 'other'}")
    assert ctl.reply_base() == str(base)
    child = subprocess.run([sys.executable, "-c", "import os, signal\n"
                            "from pipexctl.discovery import control as c\n"
                            "client = c.ControlClient('/nonexistent')\n"
                            "client._reply_path()\n"
                            "os.kill(os.getpid(), signal.SIGKILL)"], cwd=os.getcwd())
    assert child.returncode == -signal.SIGKILL
    left = [n for n in os.listdir(base) if n.startswith(f"{ctl.REPLY_DIR_PREFIX}")]
    assert len(left) == 1  # the killed process's, named with its pid
    dead = int(left[0][len(ctl.REPLY_DIR_PREFIX):].split("-")[0])
    live = ctl.ControlClient("/nonexistent")
    live._reply_path()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    gone_pid = 4194305  # above the kernel's largest pid_max: never running
    (base / f"{ctl.REPLY_DIR_PREFIX}{gone_pid}-a").mkdir()
    os.symlink(outside / "keep", base / f"{ctl.REPLY_DIR_PREFIX}{gone_pid}-a" / "link")
    os.symlink(outside, base / f"{ctl.REPLY_DIR_PREFIX}{gone_pid}-sym")
    (base / f"{ctl.REPLY_DIR_PREFIX}{gone_pid}-file").write_text("")
    for kept in (f"{ctl.REPLY_DIR_PREFIX}1-b", f"{ctl.REPLY_DIR_PREFIX}old", f"{ctl.REPLY_DIR_PREFIX}\u00b2-c", "other"):
        (base / kept).mkdir()
    assert ctl.remove_stale_reply_dirs(str(base)) == 2
    assert sorted(os.listdir(base)) == sorted([os.path.basename(live._dir), f"{ctl.REPLY_DIR_PREFIX}{gone_pid}-sym",
                                               f"{ctl.REPLY_DIR_PREFIX}{gone_pid}-file", f"{ctl.REPLY_DIR_PREFIX}1-b",
                                               f"{ctl.REPLY_DIR_PREFIX}old", f"{ctl.REPLY_DIR_PREFIX}\u00b2-c", "other"])
    assert dead != os.getpid() and (outside / "keep").read_text() == "x" and os.listdir(outside) == ["keep"]
    assert ctl.remove_stale_reply_dirs(str(tmp_path / "none")) == 0


def test_control_client_waits_when_xl2tpd_opened_the_reply_fifo_but_has_not_written(tmp_path, monkeypatch):
    """select() can report the reply FIFO readable (no writer yet: EOF) just
    before xl2tpd opens it; the read then finds a writer and no data and
    fails with EAGAIN.  Seen in the guest under load: it failed an offload
    request.  select() is made to always say "ready" so the window is hit
    every time."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    monkeypatch.setattr(ctl.select, "select", lambda r, w, x, t: (r, [], []))

    def server():
        with open(fifo, "rb") as f:
            path = f.read().decode()[1:].split(" ")[0]
        fd = os.open(path, os.O_WRONLY)  # opened, nothing written yet
        import time

        time.sleep(0.3)
        os.write(fd, b"00 OK\n00 STATUS tunnels.count=0\n")
        os.close(fd)

    th = threading.Thread(target=server, daemon=True)
    th.start()
    import time

    time.sleep(0.1)
    assert ctl.ControlClient(str(fifo), timeout=3).status_lns("default") == []
    th.join(3)


class ReopeningXl2tpd:
    """A stand-in for xl2tpd's control FIFO reader that closes its end while
    a client is about to write, as xl2tpd does between two writers, so the
    client's write meets a real EPIPE; it reopens ``reopen_at`` seconds
    after ``began`` and answers the request it then reads."""

    def __init__(self, fifo, reopen_at: float) -> None:
        import time

        self.fifo, self.reopen_at, self.began = fifo, reopen_at, time.monotonic()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        import time

        os.close(os.open(self.fifo, os.O_RDONLY))  # returns once the client opened to write: close at once
        self.closed.set()
        time.sleep(max(0.0, self.began + self.reopen_at - time.monotonic()))
        with open(self.fifo, "rb") as f:
            data = f.read()
        path = data.decode()[1:].split(" ")[0]
        with open(path, "w") as r:
            r.write("00 OK\n00 STATUS tunnels.count=0\n")

    def patch_write(self, monkeypatch, first_at: float = 0.0) -> list:
        """The client's first write waits until the reader has gone (and
        until ``first_at``), then writes for real: EPIPE."""
        import time

        real_write, calls = os.write, []

        def write(fd, data):
            calls.append(data)
            if len(calls) == 1:
                assert self.closed.wait(3)
                time.sleep(max(0.0, self.began + first_at - time.monotonic()))
            return real_write(fd, data)

        monkeypatch.setattr(ctl.os, "write", write)
        return calls


def test_control_client_writes_again_when_xl2tpd_reopens_its_pipe(tmp_path, monkeypatch):
    """xl2tpd closes and reopens its end of the FIFO after each writer: a
    write in between fails with EPIPE (the churn's harness hit it after 280
    cycles).  The request is sent again once xl2tpd reads again."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    x = ReopeningXl2tpd(fifo, reopen_at=0.1)
    calls = x.patch_write(monkeypatch)
    x.thread.start()
    assert ctl.ControlClient(str(fifo), timeout=3).status_lns("default") == []
    x.thread.join(3)
    assert not x.thread.is_alive()
    assert len(calls) == 2 and calls[0] == calls[1]


def test_control_client_allows_xl2tpd_a_slow_reopen_after_a_broken_pipe(tmp_path, monkeypatch):
    """The "not running" allowance for ENXIO (0.5 s) counts afresh after an
    EPIPE: xl2tpd was reading a moment before.  Here the write fails 0.45 s
    in and xl2tpd reopens 0.6 s in, past the first allowance: without the
    fresh count the request fails as "not running"."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    x = ReopeningXl2tpd(fifo, reopen_at=0.6)
    calls = x.patch_write(monkeypatch, first_at=0.45)
    x.thread.start()
    assert ctl.ControlClient(str(fifo), timeout=3).status_lns("default") == []
    x.thread.join(3)
    assert len(calls) == 2


def test_control_client_full_pipe_is_a_clear_error(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # xl2tpd holds it open and does not read
    wfd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        try:
            while True:
                os.write(wfd, b"x" * 4096)
        except BlockingIOError:
            pass
        with pytest.raises(ctl.ControlError, match="is full"):
            ctl.ControlClient(str(fifo), timeout=0.5).available()
    finally:
        os.close(wfd)
        os.close(rfd)


def test_the_reply_fifo_never_exists_without_a_reader(tmp_path, monkeypatch):
    """xl2tpd opens the reply FIFO with a blocking fopen(): on a FIFO with
    no reader it would wait for ever, and every tunnel of that xl2tpd with
    it.  When the client gives up (no answer in time) the FIFO must be gone
    before its read end is closed."""
    import errno
    import os


    pipe = tmp_path / "l2tp-control"
    os.mkfifo(pipe)
    keep = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # an xl2tpd that reads its pipe and never answers
    seen = []
    real_unlink = ctl._unlink

    def unlink(reply):
        try:
            os.close(os.open(reply, os.O_WRONLY | os.O_NONBLOCK))  # what xl2tpd's open would find now
            seen.append("reader")
        except OSError as e:
            seen.append("no reader" if e.errno == errno.ENXIO else errno.errorcode[e.errno])
        real_unlink(reply)
        assert not os.path.exists(reply)

    monkeypatch.setattr(ctl, "_unlink", unlink)
    client = ctl.ControlClient(str(pipe), timeout=0.3)
    try:
        with pytest.raises(ctl.ControlError, match="no reply"):
            client.request("x")
    finally:
        os.close(keep)
    assert seen == ["reader"]
    # the client's directory holds no FIFO between questions, and goes with the client
    folder = client._dir
    assert folder is not None and os.listdir(folder) == []
    del client
    import gc

    gc.collect()
    assert not os.path.exists(folder)
