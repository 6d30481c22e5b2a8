"""The /proc scan for xl2tpd and its children (discovery/procscan.py), with
real processes standing in for them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Iterator

from pipexctl.discovery import procscan


@contextlib.contextmanager
def xl2tpd_with_child(child: str = "") -> Iterator[tuple[int, int]]:
    """A process named xl2tpd (prctl PR_SET_NAME) and its forked child, which
    runs ``child`` (Python) and then says its pid: (parent pid, child pid);
    both killed after."""
    code = ("import ctypes, os, time\n"
            "ctypes.CDLL(None).prctl(15, b'xl2tpd', 0, 0, 0)\n"
            "if os.fork() == 0:\n"
            + "".join(f"    {line}\n" for line in child.splitlines()) +
            "    print(os.getpid(), flush=True)\n"
            "    time.sleep(60)\n    os._exit(0)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    kid = None
    try:
        assert p.stdout is not None
        kid = int(p.stdout.readline())
        yield p.pid, kid
    finally:
        p.kill()
        p.wait()
        if kid is not None:
            try:
                os.kill(kid, 9)
            except ProcessLookupError:
                pass


def test_a_forked_child_of_xl2tpd_still_named_xl2tpd_is_no_daemon():
    """Between fork() and exec of pppd, xl2tpd's child carries its name: the
    scan counts the parent alone as an xl2tpd (comm set with prctl here)."""
    with xl2tpd_with_child() as (parent, kid):
        assert procscan.comm_ppid(kid) == ("xl2tpd", parent)
        daemons, children = procscan.scan()
        pids = {d.pid for d in daemons}
        assert parent in pids and kid not in pids and children[parent] == []


def test_the_scan_reads_only_the_stat_line_of_other_processes(monkeypatch):
    """A cmdline or fd read costs the target's locks (slow while processes
    start by the hundred): only xl2tpd's and pppd's are read."""
    other = subprocess.Popen(["sleep", "60"])
    opened: list[str] = []
    real_open = os.open

    def spy(path, *a, **kw):
        opened.append(str(path))
        return real_open(path, *a, **kw)

    try:
        monkeypatch.setattr(os, "open", spy)
        procscan.scan()
        monkeypatch.undo()
        assert f"/proc/{other.pid}/stat" in opened
        assert [p for p in opened if p.startswith(f"/proc/{other.pid}/") and not p.endswith("/stat")] == []
    finally:
        other.kill()
        other.wait()


def test_a_pppds_fds_are_read_only_when_asked():
    """Its fds (a read per fd) tell a pty from a kernel channel: read for the
    pppds discovery needs them of, not for the others (scan(fds_of))."""
    child = "ctypes.CDLL(None).prctl(15, b'pppd', 0, 0, 0)\nm, s = os.openpty()"
    with xl2tpd_with_child(child) as (parent, kid):
        _, children = procscan.scan()
        (pppd,) = children[parent]
        assert pppd.pid == kid and pppd.ttys and pppd.data_path == "userspace"
        asked: list[int] = []

        def never(q: procscan.Proc) -> bool:
            asked.append(q.pid)
            return False

        _, children = procscan.scan(never)
        (pppd,) = children[parent]
        assert kid in asked and not pppd.ttys and pppd.data_path == "unknown"


def test_only_the_children_of_the_daemons_asked_about_are_read(monkeypatch):
    """scan(parents=...): another xl2tpd's pppd (or PPPoE's) costs its stat
    line only, and its daemon has no entry (not "no children")."""
    child = "ctypes.CDLL(None).prctl(15, b'pppd', 0, 0, 0)"
    with xl2tpd_with_child(child) as (ours, kid), xl2tpd_with_child(child) as (other, other_kid):
        opened: list[str] = []
        real_open = os.open
        monkeypatch.setattr(os, "open", lambda path, *a, **kw: opened.append(str(path)) or real_open(path, *a, **kw))
        daemons, children = procscan.scan(parents={ours})
        monkeypatch.undo()
        assert {ours, other} <= {d.pid for d in daemons}
        assert [p.pid for p in children[ours]] == [kid] and other not in children
        assert f"/proc/{kid}/cmdline" in opened
        assert [p for p in opened if p.startswith(f"/proc/{other_kid}/") and not p.endswith("/stat")] == []
        _, children = procscan.scan()
        assert [p.pid for p in children[other]] == [other_kid]


def test_a_known_pppd_costs_its_stat_line_only(monkeypatch):
    """scan(known=...): a pppd whose call discovery holds (an offloaded one)
    is listed from its stat line alone, with its start, and neither its
    argv nor its fds are read; the others' are, as before."""
    child = "ctypes.CDLL(None).prctl(15, b'pppd', 0, 0, 0)\nm, s = os.openpty()"
    with xl2tpd_with_child(child) as (parent, kid):
        _, children = procscan.scan()
        (full,) = children[parent]
        opened: list[str] = []
        real_open = os.open
        monkeypatch.setattr(os, "open", lambda path, *a, **kw: opened.append(str(path)) or real_open(path, *a, **kw))
        monkeypatch.setattr(os, "listdir", _listing_fd_dirs(opened))
        _, children = procscan.scan(known={kid})
        monkeypatch.undo()
        (pppd,) = children[parent]
        assert (pppd.pid, pppd.ppid, pppd.comm, pppd.start) == (full.pid, full.ppid, full.comm, full.start)
        assert not pppd.argv and not pppd.ttys and full.argv and full.ttys
        assert [p for p in opened if p.startswith(f"/proc/{kid}/")] == [f"/proc/{kid}/stat"]


def _listing_fd_dirs(opened: list[str]):  # os.listdir, noting the fd directories it lists
    real = os.listdir

    def listdir(path="."):
        if str(path).endswith("/fd"):
            opened.append(str(path))
        return real(path)
    return listdir


def test_a_process_name_that_is_not_utf8_does_not_stop_a_scan():
    """Any local user names its processes (prctl, or exec of a file so
    named): bytes that are not UTF-8 in a name or a command line are read
    as replacement characters, never raised (that stopped the daemon's
    scans)."""
    code = ("import ctypes, time\n"
            "ctypes.CDLL(None).prctl(15, b'\\xff\\xfe\\x80 x', 0, 0, 0)\n"
            "print(flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code, b"\xff-arg".decode("utf-8", "surrogateescape")],
                         stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        p.stdout.readline()
        procscan.scan()
        comm, ppid = procscan.comm_ppid(p.pid) or ("", 0)
        assert comm.startswith("\ufffd") and ppid == os.getpid()
        assert procscan.uids(p.pid) == (os.getuid(),) * 2 + (os.getuid(),) * 2
        assert "\ufffd-arg" in procscan.argv(p.pid)
    finally:
        p.kill()
        p.wait()


def test_a_command_line_of_megabytes_is_read_only_to_its_first_128_kib():
    """Anyone may run a process named xl2tpd with megabytes of arguments
    (1.5 MB here, within this host's ARG_MAX): the scan reads 128 KiB of
    them (read whole, and joined chunk by chunk, 3 MB cost half a second
    of the watcher's CPU)."""
    code = "import ctypes, time\nctypes.CDLL(None).prctl(15, b'xl2tpd', 0, 0, 0)\nprint(flush=True)\ntime.sleep(60)\n"
    p = subprocess.Popen([sys.executable, "-c", code, *["x" * 100_000] * 15], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        p.stdout.readline()
        proc = procscan.read_process(p.pid, with_fds=False)
        assert proc is not None and proc.comm == "xl2tpd"
        assert 64 << 10 < sum(len(a) for a in proc.argv) <= 128 << 10
        assert p.pid in {d.pid for d in procscan.scan()[0]}
    finally:
        p.kill()
        p.wait()


def test_the_words_pppd_command_lines_share_are_one_string_each(monkeypatch):
    """A scan of 10,000 LNS pppds held 10,000 copies of "passive" and the
    like: a word read again is the string read first, up to a bound, past
    which words are still read right but not kept."""
    monkeypatch.setattr(procscan, "_WORDS", {})
    a, b = (procscan.read_process(os.getpid(), with_fds=False) for _ in range(2))
    assert a is not None and b is not None and a.argv and a.argv == b.argv
    assert all(x is y for x, y in zip(a.argv, b.argv))
    monkeypatch.setattr(procscan, "_MAX_WORDS", len(procscan._WORDS) + 2)
    words = [procscan._word(f"w{i}".encode()) for i in range(10)]
    assert words == [f"w{i}" for i in range(10)] and len(procscan._WORDS) == procscan._MAX_WORDS
    assert procscan._word(b"bad \xff") == "bad \ufffd"
