"""The /proc scan for xl2tpd and its children (discovery/procscan.py), with
real processes standing in for them."""

from __future__ import annotations

import os


def test_a_forked_child_of_xl2tpd_still_named_xl2tpd_is_no_daemon():
    """Between fork() and exec of pppd, xl2tpd's child carries its name: the
    scan counts the parent alone as an xl2tpd (comm set with prctl here)."""
    import subprocess
    import sys

    from pipexctl.discovery import procscan

    code = ("import ctypes, os, sys, time\n"
            "ctypes.CDLL(None).prctl(15, b'xl2tpd', 0, 0, 0)\n"  # PR_SET_NAME
            "kid = os.fork()\n"
            "if kid == 0:\n    time.sleep(60)\n    os._exit(0)\n"
            "print(kid, flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        kid = int(p.stdout.readline())
        assert procscan.comm_ppid(kid) == ("xl2tpd", p.pid)
        daemons, children = procscan.scan()
        pids = {d.pid for d in daemons}
        assert p.pid in pids and kid not in pids and children[p.pid] == []
    finally:
        p.kill()
        p.wait()
        try:
            os.kill(kid, 9)
        except (ProcessLookupError, NameError):
            pass


def test_the_scan_reads_only_the_stat_line_of_other_processes(monkeypatch):
    """A cmdline or fd read costs the target's locks (slow while processes
    start by the hundred): only xl2tpd's and pppd's are read."""
    import builtins
    import subprocess

    from pipexctl.discovery import procscan

    other = subprocess.Popen(["sleep", "60"])
    opened: list[str] = []
    real_open = builtins.open

    def spy(path, *a, **kw):
        opened.append(str(path))
        return real_open(path, *a, **kw)

    try:
        monkeypatch.setattr(builtins, "open", spy)
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
    import subprocess
    import sys

    from pipexctl.discovery import procscan

    code = ("import ctypes, os, time\n"
            "ctypes.CDLL(None).prctl(15, b'xl2tpd', 0, 0, 0)\n"
            "kid = os.fork()\n"
            "if kid == 0:\n"
            "    ctypes.CDLL(None).prctl(15, b'pppd', 0, 0, 0)\n"
            "    m, s = os.openpty()\n"
            "    print(os.getpid(), flush=True)\n"
            "    time.sleep(60)\n    os._exit(0)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        kid = int(p.stdout.readline())
        _, children = procscan.scan()
        (pppd,) = children[p.pid]
        assert pppd.pid == kid and pppd.ttys and pppd.data_path == "userspace"
        asked: list[int] = []

        def never(q: procscan.Proc) -> bool:
            asked.append(q.pid)
            return False

        _, children = procscan.scan(never)
        (pppd,) = children[p.pid]
        assert kid in asked and pppd.ttys == [] and pppd.data_path == "unknown"
    finally:
        p.kill()
        p.wait()
