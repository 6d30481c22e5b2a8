"""/proc: xl2tpd daemons and their pppd children (argv, pty or PPPoL2TP fds)."""

from __future__ import annotations

import errno
import functools
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from .. import defaults

if TYPE_CHECKING:
    from .state import DataPath

# errors that say nothing of the process: out of file descriptors or memory
# here.  Raised, never read as "gone" (that would end a live call)
_OURS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


def _gone(e: OSError) -> None:
    """Return when ``e`` means the process (or its file) is gone; raise it
    when it is a failure of our own."""
    if e.errno in _OURS:
        raise e


@dataclass
class Proc:
    pid: int
    ppid: int
    comm: str
    argv: list[str]
    start: int  # clock ticks after boot (field 22 of stat)
    ttys: list[str] = field(default_factory=list)
    sockets: int = 0

    @property
    def control_pipe(self) -> str:
        a = self.argv
        return a[a.index("-C") + 1] if "-C" in a and a.index("-C") + 1 < len(a) else defaults.XL2TPD_CONTROL

    @property
    def argv_tunnel_session(self) -> tuple[Optional[int], Optional[int]]:
        def num(name: str) -> Optional[int]:
            try:
                return int(self.argv[self.argv.index(name) + 1])
            except (ValueError, IndexError):
                return None

        return num("pppol2tp_tunnel_id"), num("pppol2tp_session_id")

    @property
    def data_path(self) -> DataPath:
        if "pppol2tp.so" in self.argv or "pipexctl.so" in self.argv:
            return "kernel" if not self.ttys else "userspace"
        if self.ttys:
            return "userspace"
        return "unknown"


def started(p: Proc) -> float:
    """When ``p`` was forked, as a ``time.monotonic()`` time, rounded up to
    the clock tick after it (stat gives whole ticks after boot, and boot
    time is CLOCK_BOOTTIME's)."""
    since_boot = (p.start + 1) / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def _split_stat(stat: str) -> tuple[str, list[str]]:
    """/proc/PID/stat: (comm, the fields after it); comm may hold spaces and ')'."""
    return stat[stat.find("(") + 1: stat.rfind(")")], stat[stat.rfind(")") + 2:].split()


def _read_stat(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read()
    except OSError as e:
        _gone(e)
        return None


def read_process(pid: int, with_fds: bool, stat: Optional[str] = None) -> Optional[Proc]:
    """``pid``'s /proc entry (``stat``: its stat line, read already), or
    None when it is gone."""
    base = f"/proc/{pid}"
    stat = stat if stat is not None else _read_stat(pid)
    if stat is None:
        return None
    try:
        with open(f"{base}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError as e:
        _gone(e)
        return None
    comm, rest = _split_stat(stat)
    p = Proc(pid, int(rest[1]), comm, argv, int(rest[19]))
    if with_fds:
        _read_fds(p)
    return p


def _read_fds(p: Proc) -> None:
    base = f"/proc/{p.pid}/fd"
    try:
        for fd in os.listdir(base):
            try:
                target = os.readlink(f"{base}/{fd}")
            except OSError:
                continue
            if target.startswith(("/dev/pts/", "/dev/tty", "/dev/ptmx")):
                p.ttys.append(target)
            elif target.startswith("socket:"):
                p.sockets += 1
    except OSError as e:
        _gone(e)


def scan(fds_of: Optional[Callable[[Proc], bool]] = None) -> tuple[list[Proc], dict[int, list[Proc]]]:
    """(xl2tpd daemons, pppd children by xl2tpd pid).  A pppd's fds (its
    pty, its sockets: a read per fd) are read when ``fds_of(pppd)`` says so
    (default: every xl2tpd's child)."""
    daemons: list[Proc] = []
    pppds: list[Proc] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        # any other process costs one read, its stat line: its cmdline is not
        # needed (and reading it takes the target's mm lock)
        stat = _read_stat(int(name))
        if stat is None:
            continue
        comm = _split_stat(stat)[0]
        if comm not in ("xl2tpd", "pppd"):
            continue
        p = read_process(int(name), with_fds=False, stat=stat)
        if p is None:
            continue
        (daemons if comm == "xl2tpd" else pppds).append(p)
    # a child of xl2tpd still named xl2tpd has not exec'd its pppd yet: no daemon
    named = {d.pid for d in daemons}
    daemons = [d for d in daemons if d.ppid not in named]
    children: dict[int, list[Proc]] = {d.pid: [] for d in daemons}
    for p in pppds:
        if p.ppid in children:
            if fds_of is None or fds_of(p):
                _read_fds(p)
            children[p.ppid].append(p)
    return daemons, children


# ---- who a process is, for the offload daemon's trust decisions

SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")


@functools.cache
def trusted_exes(name: str) -> frozenset[str]:
    """The real paths of the system's ``name`` binaries (root-owned sbin dirs)."""
    return frozenset(os.path.realpath(os.path.join(d, name)) for d in SBIN if os.path.exists(os.path.join(d, name)))


def argv(pid: int) -> list[str]:
    """``pid``'s command line ([] when it is gone)."""
    p = read_process(pid, with_fds=False)
    return p.argv if p else []


def exe(pid: int) -> Optional[str]:
    """The binary ``pid`` runs; a binary replaced by an upgrade since it
    started still counts as its path (the kernel appends " (deleted)")."""
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError as e:
        _gone(e)
        return None


def uids(pid: int) -> Optional[tuple[int, ...]]:
    """Real, effective, saved and filesystem uid of ``pid``."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return tuple(int(x) for x in line.split()[1:5])
    except OSError as e:
        _gone(e)
    except ValueError:
        pass
    return None


def comm_ppid(pid: int) -> Optional[tuple[str, int]]:
    """(comm, parent pid) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError as e:
        _gone(e)
        return None
    comm, rest = _split_stat(stat)
    return comm, int(rest[1])


def runs(pid: int, comm: str) -> bool:
    """``pid`` is a live process named ``comm`` (by /proc, for a pid no pidfd watches)."""
    who = comm_ppid(pid)
    return who is not None and who[0] == comm


def is_daemon(pid: int, name: str = "xl2tpd") -> bool:
    """``pid`` runs the system's ``name`` binary (a copy elsewhere, or a
    process merely named so, does not count)."""
    e = exe(pid)
    return e is not None and e in trusted_exes(name)
