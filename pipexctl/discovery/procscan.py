"""/proc: xl2tpd daemons and their pppd children (argv, pty or PPPoL2TP fds)."""

from __future__ import annotations

import array
import errno
import functools
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Collection, Optional, Sequence

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


@dataclass(slots=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    argv: Sequence[str]
    start: int  # clock ticks after boot (field 22 of stat)
    ttys: Sequence[str] = ()  # a pppd's pty fds, read when asked (an empty tuple is one shared object)
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


def _read(path: str) -> Optional[bytes]:
    """A /proc file's bytes, or None when its process is gone.  os-level
    calls: a scan reads hundreds of these, and io.open's buffered and text
    layers cost more than the read under TCG.  A short read is the end
    (stat and cmdline fill the buffer while they have more)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        _gone(e)
        return None
    try:
        chunks = [os.read(fd, _CHUNK)]
        while len(chunks[-1]) == _CHUNK and len(chunks) < _MAX_CHUNKS:
            chunks.append(os.read(fd, _CHUNK))
        return b"".join(chunks)
    except OSError as e:  # ESRCH: it exited between the open and the read
        _gone(e)
        return None
    finally:
        os.close(fd)


_CHUNK = 4096
# a command line past 128 KiB is cut there: xl2tpd's and pppd's are a few
# hundred bytes, and anyone may run a process so named with megabytes of
# arguments (its whole read would hold up the scan)
_MAX_CHUNKS = 32


def _text(raw: bytes) -> str:
    # any local user names its processes (prctl, exec of any file name):
    # bytes that are not UTF-8 must not stop a scan
    return raw.decode("utf-8", "replace")


# the words pppd command lines share ("/usr/sbin/pppd", "passive", an
# options file), one string each: a scan of 10,000 LNS pppds held 10,000
# copies of each.  Bounded in words and in their length (any user names a
# process xl2tpd and gives it arguments): junk that fills it costs only the
# saving, at most 512 short words
_WORDS: dict[bytes, str] = {}
_MAX_WORDS = 512
_MAX_WORD = 96


def _word(raw: bytes) -> str:
    w = _WORDS.get(raw)
    if w is None:
        w = _text(raw)
        if len(raw) <= _MAX_WORD and len(_WORDS) < _MAX_WORDS:
            _WORDS[raw] = w
    return w


def _read_stat(pid: int) -> Optional[str]:
    raw = _read(f"/proc/{pid}/stat")
    return None if raw is None else _text(raw)


def read_process(pid: int, with_fds: bool, stat: Optional[str] = None) -> Optional[Proc]:
    """``pid``'s /proc entry (``stat``: its stat line, read already), or
    None when it is gone."""
    stat = stat if stat is not None else _read_stat(pid)
    if stat is None:
        return None
    comm, rest = _split_stat(stat)
    return _with_argv(pid, int(rest[1]), comm, int(rest[19]), with_fds)


def _with_argv(pid: int, ppid: int, comm: str, start: int, with_fds: bool) -> Optional[Proc]:
    """The process its stat line describes, with its argv (and fds), or None when it is gone."""
    raw = _read(f"/proc/{pid}/cmdline")
    if raw is None:
        return None
    p = Proc(pid, ppid, comm, tuple(_word(a) for a in raw.split(b"\0") if a), start)
    if with_fds:
        _read_fds(p)
    return p


def _read_fds(p: Proc) -> None:
    base = f"/proc/{p.pid}/fd"
    ttys: list[str] = []
    try:
        for fd in os.listdir(base):
            try:
                target = os.readlink(f"{base}/{fd}")
            except OSError:
                continue
            if target.startswith(("/dev/pts/", "/dev/tty", "/dev/ptmx")):
                ttys.append(target)
            elif target.startswith("socket:"):
                p.sockets += 1
    except OSError as e:
        _gone(e)
    if ttys:
        p.ttys = ttys


def scan(fds_of: Optional[Callable[[Proc], bool]] = None,
         parents: Optional[Collection[int]] = None,
         known: Collection[int] = ()) -> tuple[list[Proc], dict[int, list[Proc]]]:
    """(xl2tpd daemons, pppd children by xl2tpd pid).  Only the children of
    the daemons in ``parents`` are read (default: every daemon's); a daemon
    whose children were not read has no entry.  A pppd's fds (its pty, its
    sockets: a read per fd) are read when ``fds_of(pppd)`` says so (default:
    every child read).  A child in ``known`` is read from its stat line
    alone, without its argv or fds: the caller needs only to know that it
    runs (an LNS holds thousands of pppds whose calls it knows)."""
    daemons: list[Proc] = []
    # (pid, ppid, start) of each pppd, flat in one array: a tuple and three
    # ints each took 1.7 MiB at the peak of a scan of 10,000
    pppds = array.array("q")
    with os.scandir("/proc") as entries:  # one entry at a time: no list of every process's name
        for entry in entries:
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            # any other process costs one read, its stat line: its cmdline is not
            # needed (and reading it takes the target's mm lock); nor is a pppd's
            # that is no child of a daemon asked about (PPPoE's, another xl2tpd's)
            stat = _read_stat(pid)
            if stat is None:
                continue
            comm, rest = _split_stat(stat)
            if comm == "pppd":
                pppds.extend((pid, int(rest[1]), int(rest[19])))
            elif comm == "xl2tpd":
                d = read_process(pid, with_fds=False, stat=stat)
                if d is not None:
                    daemons.append(d)
    # a child of xl2tpd still named xl2tpd has not exec'd its pppd yet: no daemon (is_xl2tpd)
    named = {d.pid for d in daemons}
    daemons = [d for d in daemons if d.ppid not in named]
    children: dict[int, list[Proc]] = {d.pid: [] for d in daemons if parents is None or d.pid in parents}
    parent_of = {d.pid: d.pid for d in daemons}  # one int object per daemon, shared by its children's Procs
    for i in range(0, len(pppds), 3):
        kid, ppid, start = pppds[i], pppds[i + 1], pppds[i + 2]
        if ppid not in children:
            continue
        ppid = parent_of[ppid]
        if kid in known:
            p: Optional[Proc] = Proc(kid, ppid, "pppd", (), start)  # no argv, no ttys: its path unknown
        else:
            p = _with_argv(kid, ppid, "pppd", start, with_fds=False)
            if p is not None and (fds_of is None or fds_of(p)):
                _read_fds(p)
        if p is not None:
            children[ppid].append(p)
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
    return list(p.argv) if p else []


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
    raw = _read(f"/proc/{pid}/status")
    for line in (raw or b"").splitlines():
        if line.startswith(b"Uid:"):
            try:
                return tuple(int(x) for x in line.split()[1:5])
            except ValueError:
                return None
    return None


def comm_ppid(pid: int) -> Optional[tuple[str, int]]:
    """(comm, parent pid) of ``pid``, or None when it is gone."""
    stat = _read_stat(pid)
    if stat is None:
        return None
    comm, rest = _split_stat(stat)
    return comm, int(rest[1])


def is_xl2tpd(pid: int) -> bool:
    """``pid`` is what a scan counts as an xl2tpd daemon: named xl2tpd, and
    not a child of one (a fork that has yet to exec its pppd)."""
    who = comm_ppid(pid)
    return who is not None and who[0] == "xl2tpd" and not runs(who[1], "xl2tpd")


def runs(pid: int, comm: str) -> bool:
    """``pid`` is a live process named ``comm`` (by /proc, for a pid no pidfd watches)."""
    who = comm_ppid(pid)
    return who is not None and who[0] == comm


def is_daemon(pid: int, name: str = "xl2tpd") -> bool:
    """``pid`` runs the system's ``name`` binary, as root (a copy elsewhere,
    a process merely named so, or the binary run by another user with
    arguments of its choosing, does not count)."""
    e = exe(pid)
    return e is not None and e in trusted_exes(name) and uids(pid) == (0, 0, 0, 0)
