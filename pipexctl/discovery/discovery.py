"""Discovery: every tunnel and call of running xl2tpd instances, from logs,
control pipes, /proc and the kernel, merged into one model.

- ``Discovery.snapshot()``: read the logs to their end, then correct them with
  what xl2tpd says now (control pipe), which processes live (/proc) and what
  the kernel holds (netlink dumps): stale log history never survives.
- ``Discovery.events()``: the live objects first (one ``TunnelUp``/``CallUp``
  each), then every change as it happens, each event once.  Logs are
  followed like ``tail -F`` (rotation and truncation), /proc and the kernel
  are polled (the kernel sends no netlink events for objects made through
  the PPPoL2TP socket API, which is what xl2tpd's kernel mode uses).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterator, Literal, Optional, Protocol, Union

from .. import defaults, errors
from ..kernel.backend import NetlinkBackend
from ..model import session_key
from . import checkpoint as cpt, logparse as lp, procscan
from .barrier import LogBarrier
from .control import Available, ControlClient, ControlError, StatusTunnel
from .state import CallDown, CallInfo, CallKey, CallUp, Event, Instance, Tracker, TunnelDown, TunnelInfo, TunnelUp

if TYPE_CHECKING:
    import threading

DEFAULT_LOGS = ["/var/log/syslog", "/var/log/daemon.log", "journal:xl2tpd"]


def default_sources() -> tuple[list[str], list[str]]:
    """The logs and control pipes of a Debian xl2tpd, when none are named:
    one log (rsyslog writes daemon.* to syslog and daemon.log both, and the
    journal holds the same lines again), and the control pipe if it exists."""
    files = [p for p in DEFAULT_LOGS if not p.startswith("journal") and os.path.exists(p)]
    journal = [p for p in DEFAULT_LOGS if p.startswith("journal")] if os.path.exists("/run/systemd/journal") else []
    controls = [defaults.XL2TPD_CONTROL] if os.path.exists(defaults.XL2TPD_CONTROL) else []
    return (files[:1] or journal), controls


class LogReader(Protocol):
    """A log source: lines as they come, and where they were read to."""

    gaps: int  # times lines may have been lost (a truncation, a refused cursor)
    note: Optional[str]  # something the owner should log once

    def read_lines(self) -> list[str]: ...
    def position(self) -> Union[cpt.FilePos, cpt.JournalPos, None]: ...
    def resume(self, pos: Union[cpt.FilePos, cpt.JournalPos]) -> Optional[str]: ...
    def close(self) -> None: ...


class LogFile:
    """A file followed across rotation and truncation (like ``tail -F``),
    read at most CHUNK bytes at a time: a day of a busy LNS's syslog is
    parsed chunk by chunk, never held in memory whole (``more`` says that a
    read stopped at the chunk's end)."""

    # a read's bytes, its lines and their text are alive at once, and the
    # heap keeps what they took: 4 MiB made a start's read of 10,000 calls
    # peak 13 MiB higher (docs/offload.md)
    CHUNK = 256 << 10

    def __init__(self, path: str) -> None:
        self.path = path
        self._f: Optional[BinaryIO] = None
        self._ino: Optional[int] = None
        self._buf = b""
        self.gaps = 0  # truncations seen: lines written just before one may be lost
        self.more = False
        self.note: Optional[str] = None

    def read_lines(self) -> list[str]:
        out: list[bytes] = []
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if self._f is not None and st is not None and st.st_ino != self._ino:
            while True:  # rotated: finish the old file first
                out += self._drain()
                if not self.more:
                    break
            if self._buf:  # its last line had no newline: a line still, never glued to the next file's
                out.append(self._buf)
                self._buf = b""
            self._f.close()
            self._f = None
        if self._f is None and st is not None:
            self._f = open(self.path, "rb")
            self._ino = st.st_ino
        if self._f is not None:
            if st is not None and st.st_size < self._f.tell():
                self._f.seek(0)  # truncated (copytruncate)
                self._buf = b""
                self.gaps += 1
            out += self._drain()
        return [b.decode("utf-8", "replace") for b in out]

    def position(self) -> Optional[cpt.FilePos]:
        """Where the next line starts (a partial line at the end is read again)."""
        if self._f is None:
            return None
        off = self._f.tell() - len(self._buf)
        if off < 0:
            return None
        st = os.fstat(self._f.fileno())
        return cpt.FilePos(dev=st.st_dev, ino=st.st_ino, offset=off, tail=cpt.file_tail(self._f.fileno(), off))

    def resume(self, pos: Union[cpt.FilePos, cpt.JournalPos]) -> Optional[str]:
        """Go on from ``pos`` (None), or say why not (then read from the start).

        The file may have been rotated since: its inode is looked for among
        the files beside it whose name starts with this one's (syslog.1,
        syslog-20261201); it is read to its end first, then this path."""
        if not isinstance(pos, cpt.FilePos):
            return "saved for another kind of log"
        d, base = os.path.split(self.path)
        try:
            names = [n for n in os.listdir(d or ".") if n.startswith(base)]
        except OSError as e:
            return f"cannot list {d}: {e.strerror}"
        stats = {}
        for name in names:
            try:
                stats[name] = os.stat(os.path.join(d, name))
            except OSError:
                continue
        for name in sorted(stats, key=lambda n: n != base):
            st = stats[name]
            if (st.st_dev, st.st_ino) != (pos.dev, pos.ino):
                continue
            rotated = [n for n in stats if n != base]
            if name != base and name != max(rotated, key=lambda n: stats[n].st_mtime):
                # rotated more than once since: the files in between would be skipped
                return f"it was rotated more than once since (now {name})"
            p = os.path.join(d, name)
            try:
                f = open(p, "rb")
            except OSError as e:
                return f"cannot open {p}: {e.strerror}"
            try:
                same = cpt.file_tail(f.fileno(), pos.offset) == pos.tail
            except (OSError, ValueError):
                same = False
            if not same:
                f.close()
                return "the bytes before its saved position changed (replaced or truncated)"
            f.seek(pos.offset)
            self._f, self._ino, self._buf = f, st.st_ino, b""
            return None
        return "its file is gone (rotated away or compressed)"

    def _drain(self) -> list[bytes]:
        assert self._f is not None
        data = self._f.read(self.CHUNK)
        self.more = len(data) == self.CHUNK
        if not data:
            return []
        data = self._buf + data
        lines = data.split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > 1 << 20:  # a runaway line: cut it
            lines.append(self._buf)
            self._buf = b""
        return lines

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None


# a first read of a long boot is mostly journalctl writing entries and the
# daemon decoding them: only the fields the parser reads
OUTPUT_FIELDS = "--output-fields=" + ",".join(lp.JOURNAL_FIELDS)


class Journal:
    """``journalctl -o json`` for a unit (``journal:UNIT``) or identifier
    (``journal-id:IDENT``), from the start of this boot or after a cursor.

    It first reads what is there to its end (a journalctl without -f, at
    most CHUNK bytes a read, ``more`` set until the end), so a start's
    first read holds every entry written before it; following, it then
    runs ``journalctl -f`` after the last entry read.  A follower that
    exits (a SIGHUP to the daemon's process group kills it too) is started
    again after the last entry read, with a growing pause if it keeps
    failing, and says so in ``note``."""

    CHUNK = LogFile.CHUNK
    BACKOFF_MAX = 60.0

    def __init__(self, spec: str, follow: bool) -> None:
        kind, _, name = spec.partition(":")
        self.spec, self.follow = spec, follow
        self._sel = ["-u", name] if kind == "journal" else ["-t", name]
        self._journalctl: Optional[subprocess.Popen[bytes]] = None
        self._following = False  # _journalctl runs with -f
        self._caught_up = False  # what was there at the start has been read
        self._buf = b""
        self.cursor: Optional[str] = None  # the last entry read (or a checkpoint's): read on after it
        self.gaps = 0
        self.more = False
        self.note: Optional[str] = None  # what the owner should log (a restart of journalctl)
        self._backoff = 1.0
        self._retry_at = float("-inf")

    def _spawn(self, follow: bool) -> subprocess.Popen[bytes]:
        # this boot only: calls of an earlier boot are gone with its kernel
        argv = ["journalctl", "-o", "json", "--no-pager", "-b", *self._sel, OUTPUT_FIELDS]
        argv += ["-f", "-n", "all"] if follow else []  # -n all: with no cursor, the boot from its start
        argv += ["--after-cursor", self.cursor] if self.cursor else []
        try:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except FileNotFoundError:
            raise errors.PipexError(f"{self.spec}: journalctl not found") from None
        assert p.stdout is not None
        os.set_blocking(p.stdout.fileno(), not follow)
        self._journalctl, self._following = p, follow
        return p

    def position(self) -> Optional[cpt.JournalPos]:
        return cpt.JournalPos(cursor=self.cursor) if self.cursor else None

    def resume(self, pos: Union[cpt.FilePos, cpt.JournalPos]) -> Optional[str]:
        if not isinstance(pos, cpt.JournalPos):
            return "saved for another kind of log"
        m = cpt.CURSOR.match(pos.cursor)
        if m is None or m["boot"] != cpt.boot_id():
            return "its cursor is of another boot"
        # asked now, before the model saved with the cursor is restored: a
        # cursor journalctl turns down later would mean the boot read again on top of it
        try:
            r = subprocess.run(["journalctl", "--no-pager", "-q", "-o", "cat", "-n", "1", "-b", *self._sel,
                                "--after-cursor", pos.cursor],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"journalctl could not check its cursor ({e})"
        if r.returncode != 0:
            return f"journalctl refused its cursor (status {r.returncode})"
        self.cursor = pos.cursor
        return None

    def read_lines(self) -> list[str]:
        p = self._journalctl
        if p is None:
            if self._caught_up and (not self.follow or time.monotonic() < self._retry_at):
                return []
            p = self._spawn(follow=self._caught_up)
        assert p.stdout is not None
        if not self._following:  # what is there, to its end
            data = p.stdout.read(self.CHUNK) or b""
            self.more = len(data) == self.CHUNK
            if not self.more:
                p.wait()
                self._journalctl, self._caught_up = None, True  # following: the next read runs -f after the cursor
            return self._lines(data)
        try:
            data = p.stdout.read() or b""
        except BlockingIOError:
            data = b""
        if data:
            self._backoff = 1.0
        elif p.poll() is not None:
            self._journalctl, self._buf = None, b""  # a partial entry comes again after the cursor
            self._retry_at = time.monotonic() + self._backoff
            self.note = (f"journalctl exited (status {p.returncode}): started again in {self._backoff:.0f} s, "
                         f"after the last entry read")
            self._backoff = min(self._backoff * 2, self.BACKOFF_MAX)
            return []
        return self._lines(data)

    def _lines(self, data: bytes) -> list[str]:
        data = self._buf + data
        lines = data.split(b"\n")
        self._buf = lines.pop()
        for raw in reversed(lines):
            cur = cpt.cursor_of(raw)
            if cur is not None:
                self.cursor = cur
                break
        return [x.decode("utf-8", "replace") for x in lines]

    def close(self) -> None:
        if self._journalctl is not None:
            self._journalctl.kill()
            self._journalctl.wait()
            self._journalctl = None


def _file_id(path: str) -> Optional[tuple[int, int]]:
    """The file ``path`` names, as (device, inode) after every symlink, or
    None when there is none (or a loop of symlinks, or a path too long)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


@dataclass(frozen=True)
class Listed:
    """One answer of an xl2tpd's control pipe, as a claim is checked against it."""

    asked: float  # monotonic time the question went out
    tunnels: frozenset[tuple[int, int]]  # (our tunnel id, the peer's), from `available`
    lns_calls: frozenset[tuple[str, int, int]]  # (peer address, the peer's tunnel id, our call id), from status-lns
    # when the answer was taken in (monotonic): a log barrier must be sent after
    # it, not merely after the question (xl2tpd may write its line just before answering)
    answered: float = float("inf")
    # when `tunnels` was asked for, if before `asked`: a question for the calls
    # only (status-lns) keeps the last `available`'s tunnels
    tunnels_asked: Optional[float] = None
    # (asked, answered) of this answer and the few before it: barrier_after
    recent: tuple[tuple[float, float], ...] = ()

    def tunnels_since(self) -> float:
        return self.asked if self.tunnels_asked is None else self.tunnels_asked

    def barrier_after(self, since: Optional[float]) -> float:
        """When a log barrier must have been sent for a claim judged by an
        answer asked after ``since``: after the first such answer came, since
        that one already came after the pppd's line (a later answer's own
        barrier is not needed, and with answers asked back to back in a storm
        it would keep a request waiting)."""
        if since is None:
            return self.answered
        return min((answered for asked, answered in self.recent if asked >= since), default=self.answered)


@dataclass
class Source:
    name: str
    reader: Optional[LogReader]
    parser: lp.LineParser
    control: Optional[ControlClient] = None
    barrier: Optional[LogBarrier] = None  # a syslog-written file with a control pipe (barrier.py)


# answers kept per instance for Listed.barrier_after: more than are asked
# between a pppd's line and its request in a storm
_RECENT_ANSWERS = 16

# One control pipe's answer (Discovery.fetch_control): its source, when it
# was asked (monotonic), `available` (None for a question about the LNS
# calls only) and status-lns by section, or the error
ControlAnswer = tuple[Source, float, Optional[Available], dict[str, list[StatusTunnel]], Optional[str]]
# A /proc scan (procscan.scan): the xl2tpd daemons, and the children of each by its pid
Scanned = tuple[list[procscan.Proc], dict[int, list[procscan.Proc]]]


@dataclass
class Snapshot:
    tunnels: list[TunnelInfo] = field(default_factory=list)
    calls: list[CallInfo] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)  # counts, warnings, time: as_dict's JSON

    def as_dict(self) -> dict[str, Any]:
        return {
            "tunnels": [t.dump() for t in self.tunnels],
            "calls": [c.dump(exclude={"pppd_argv"}) for c in self.calls],
            "stats": self.stats,
        }


class Discovery:
    def __init__(
        self,
        logs: list[str],
        controls: Optional[list[str]] = None,
        *,
        proc: bool = True,
        kernel: bool = True,
        netns: Optional[str] = None,
        identifier: str = "xl2tpd",
        follow: bool = False,
        barrier_socket: Optional[str] = None,
    ) -> None:
        """``barrier_socket``: the syslog socket (``/dev/log``) to send log
        barriers to (barrier.py), for each log file with a control pipe; None:
        no barriers (a one-shot ``discover`` has no request to guard)."""
        self.tracker = Tracker()
        self.tracker.daemon_alive = procscan.is_daemon
        self.sources: list[Source] = []
        self.proc, self.kernel, self.netns = proc, kernel, netns
        controls = list(controls or [])
        for i, spec in enumerate(logs):
            reader: LogReader
            if spec.startswith(("journal:", "journal-id:")):
                reader = Journal(spec, follow)
            else:
                reader = LogFile(spec)
            ctl = ControlClient(controls[i]) if i < len(controls) else None
            # the journal's trusted _PID needs no barrier (and a journalctl filter would not show ours)
            bar = LogBarrier(barrier_socket) if barrier_socket and ctl and isinstance(reader, LogFile) else None
            self.sources.append(Source(spec, reader, lp.LineParser(identifier, isinstance(reader, Journal)), ctl, bar))
        for spec in controls[len(logs):]:  # control pipes without a log
            self.sources.append(Source(f"control:{spec}", None, lp.LineParser(identifier), ControlClient(spec)))
        self._backend: Optional[NetlinkBackend] = None
        self._control_pid: dict[str, Optional[int]] = {}  # source -> the xl2tpd that has its control pipe open
        # instance -> what its control pipe listed, and the monotonic time the question went out
        self.listed: dict[str, Listed] = {}
        # source -> the LNS sections its last full answer named, and the pid
        # of the xl2tpd that had the pipe then (a restart may bring new ones)
        self._lns_sections: dict[str, tuple[Optional[int], list[str]]] = {}
        # per instance: when the last question its control pipe did not answer was asked (monotonic)
        self.unanswered: dict[str, float] = {}
        self.warnings: list[str] = []
        self.poll_seconds: dict[str, float] = {}  # the last poll's parts, seconds each
        self.tracker.notes = self.warnings  # one list: the tracker's notes are discovery's warnings

    # ---- checkpoints (see checkpoint.py)
    def checkpoint(self) -> cpt.Checkpoint:
        """Each log's position and the model built from the lines before it.
        Refers to the live model: encode it before the model changes."""
        out = []
        for s in self.sources:
            try:
                pos = s.reader.position() if s.reader is not None else None
            except (OSError, ValueError):  # read on later (a record refused is a ValueError): the next start reads it whole
                pos = None
            if pos is None:
                continue
            own = [cpt.InstanceState.of(i) for i in self._instances_of(s)]
            out.append(cpt.SourceState(name=s.name, position=pos, parser=s.parser.state(), instances=own))
        return cpt.Checkpoint(boot_id=cpt.boot_id(), sources=out)

    def resume(self, cp: cpt.Checkpoint) -> list[str]:
        """Before the first read: each log whose saved position still fits
        goes on from there, with the model saved with it; the rest are read
        from their start.  One line per saved log, saying which."""
        saved = {s.name: s for s in cp.sources}
        said = []
        for s in self.sources:
            st = saved.get(s.name)
            if st is None or s.reader is None:
                continue
            try:
                why = s.reader.resume(st.position)
            except (OSError, ValueError) as e:  # never in the way of a start: read it whole
                why = str(e)
            if why is not None:
                said.append(f"{s.name}: read from its start: {why}")
                continue
            s.parser.restore(st.parser)
            for i in st.instances:
                self.tracker.instances[i.name] = i.instance()
            calls = sum(len(i.calls) for i in st.instances)
            at = f"offset {st.position.offset}" if st.position.kind == "file" else "its saved cursor"
            said.append(f"{s.name}: resumed at {at} with {calls} call(s) known")
        return said

    def lines_read(self) -> int:
        return sum(s.parser.lines for s in self.sources)

    # ---- reading
    def _read_logs(self) -> list[Event]:
        ev: list[Event] = []
        for s in self.sources:
            if s.reader is None:
                continue
            while True:
                gaps = getattr(s.reader, "gaps", 0)
                lines = s.reader.read_lines()
                note = getattr(s.reader, "note", None)
                if note:
                    self.warnings.append(f"{s.name}: {note}")
                    s.reader.note = None
                if getattr(s.reader, "gaps", 0) != gaps:  # lines may be missing: stop trusting counts
                    self.tracker.inst(s.name).serial_anchor = None
                for line in lines:
                    if s.barrier is not None:
                        s.barrier.feed(line)
                    for rec in s.parser.feed(line):
                        ev += self.tracker.apply(s.name, rec)
                if not getattr(s.reader, "more", False):
                    break
            if not lines:
                # nothing new since the last read: a pppd argv at the end of the
                # log is complete (xl2tpd writes all of it before forking pppd)
                for rec in s.parser.flush():
                    ev += self.tracker.apply(s.name, rec)
        return ev

    def listed_by_control(self, call: CallInfo, since: float) -> Optional[bool]:
        """Whether xl2tpd's control pipe listed ``call``, in an answer asked
        for after ``since`` (monotonic); None when there is no such answer
        (yet) or no control pipe for its xl2tpd.

        An LNS call is matched by the peer's address and tunnel id and our
        call id (status-lns names all three; our tunnel id is left out,
        since two peers may pick the same tunnel id); a LAC call, whose
        calls status-lns does not list, by its tunnel (both ids)."""
        ls = self.listed.get(call.instance)
        if ls is None:
            return None
        if call.role == "lns":
            if ls.asked < since:
                return None
            return any(cid == call.call_id and peer == call.peer and call.peer_tunnel_id in (None, ptid)
                       for peer, ptid, cid in ls.lns_calls)
        if ls.tunnels_since() < since:
            return None
        return (call.tunnel_id, call.peer_tunnel_id) in ls.tunnels

    def tunnel_listed(self, instance: str, tunnel_id: int, peer_tunnel_id: Optional[int]) -> Optional[bool]:
        """Whether xl2tpd's control pipe's last answer listed this tunnel
        (both ids); None when ``instance`` has no answer."""
        ls = self.listed.get(instance)
        return None if ls is None else (tunnel_id, peer_tunnel_id) in ls.tunnels

    def barrier(self, instance: str, since: Optional[float] = None) -> Literal["passed", "wait", "absent", "none"]:
        """Whether every line ``instance``'s xl2tpd wrote before its control
        pipe's first answer asked after ``since`` (its last answer without
        ``since``) has been read (barrier.py): ``none`` when no barrier
        applies (no answer yet, the journal, no syslog socket given)."""
        s = next((s for s in self.sources if _of_source(instance, s)), None)
        ls = self.listed.get(instance)
        if s is None or s.barrier is None or ls is None:
            return "none"
        st = s.barrier.state(ls.barrier_after(since))
        self._barrier_note(s)
        return st

    def probe_barriers(self) -> None:
        """Send each barrier log its first barrier now (at the daemon's start),
        so that a log which does not carry them is known before a request
        would wait for one."""
        for s in self.sources:
            if s.barrier is not None:
                s.barrier.state(time.monotonic())
                self._barrier_note(s)

    def _barrier_note(self, s: Source) -> None:
        if s.barrier is not None and s.barrier.note:
            self.warnings.append(f"{s.name}: {s.barrier.note}")
            s.barrier.note = None

    def authenticated(self, instance: str) -> bool:
        """``instance``'s lines come from the journal, each with the pid the
        kernel gave journald for its sender: no local user can write one as
        that xl2tpd, and a peer's text stays inside one of its entries."""
        return any(isinstance(s.reader, Journal) and _of_source(instance, s) for s in self.sources)

    def control_given(self, instance: str) -> bool:
        """A control pipe is given for the stream ``instance`` writes to (not
        looked up: which xl2tpd of the stream it answers for, has_control)."""
        return any(s.control is not None and _of_source(instance, s) for s in self.sources)

    def has_control(self, instance: str) -> bool:
        return any(s.control is not None and self._control_instance(s).name == instance for s in self.sources)

    def _control_owner(self, s: Source, daemons: list[procscan.Proc]) -> Optional[int]:
        """The xl2tpd (of a /proc scan) that has ``s``'s control pipe open, if one does."""
        assert s.control is not None
        want = _file_id(s.control.pipe)  # /var/run is /run on Debian
        # anyone may run a process named xl2tpd, or the binary itself, with any -C: only root's
        # system xl2tpd counts, and only then is its path looked at (one stat: a scan
        # checks every xl2tpd, and resolving each path costs a syscall per component)
        m = [d.pid for d in daemons
             if self.tracker.daemon_alive(d.pid)
             and (d.control_pipe == s.control.pipe or want is not None and _file_id(d.control_pipe) == want)]
        self._control_pid[s.name] = m[0] if len(m) == 1 else None
        return self._control_pid[s.name]

    def _instances_of(self, s: Source) -> list[Instance]:
        """The xl2tpd instances a source's stream holds: the first to write
        there (named as the source) and any other live one (``NAME@PID``)."""
        return [i for n, i in self.tracker.instances.items() if _of_source(n, s)]

    def _control_instance(self, s: Source) -> Instance:
        """The instance a source's control pipe answers for: the xl2tpd that
        has that pipe open (by /proc), which is not always the first one to
        write to a stream several xl2tpd share (a LAC's lines may come
        first).  Without /proc, or before that xl2tpd is found: the first."""
        main = self.tracker.inst(s.name)
        if s.control is None or not self.proc:
            return main
        pid = self._control_pid.get(s.name, -1)
        if pid == -1 or pid is not None and not self.tracker.daemon_alive(pid):
            # not scanned yet, or its xl2tpd is gone: look now (else the
            # watcher's scans keep this up to date; None: no owner found)
            try:
                daemons, _ = procscan.scan()
            except OSError:  # out of fds: as last known; the watcher's next scan tells
                daemons = None
            pid = self._control_owner(s, daemons) if daemons is not None else None
        if pid is None:
            return main
        mine = [i for i in self._instances_of(s) if i.daemon_pid == pid]
        if mine:
            return mine[0]
        if main.daemon_pid is None:
            return main
        # another xl2tpd wrote to this stream first: the pipe's owner is (or
        # will be, once it writes) the instance named by its pid
        ins = self.tracker.inst(f"{s.name}@{pid}")
        ins.daemon_pid = pid
        return ins

    def _reconcile_control(self) -> list[Event]:
        """What xl2tpd says now beats log history (rotation, missed lines)."""
        return self.apply_control(self.fetch_control())

    def fetch_control(self, lns_calls_only: bool = False) -> list[ControlAnswer]:
        """Ask every control pipe: (source, when asked, Available or None,
        status-lns by section, error or None) each.  Only I/O: the model is
        not touched, so a caller may do this without its lock.

        ``lns_calls_only``: ask status-lns alone, for the LNS sections the
        last full answer named (one round trip through xl2tpd's main loop,
        not two: what an LNS call's check needs); a full question where none
        is known yet, the pipe's xl2tpd is another since (a restart), or
        status-lns fails."""
        out: list[ControlAnswer] = []
        for s in self.sources:
            if s.control is None:
                continue
            owner, sections = self._lns_sections.get(s.name, (None, [])) if lns_calls_only else (None, [])
            if sections and owner == self._control_pid.get(s.name):
                asked = time.monotonic()
                try:
                    out.append((s, asked, None, {name: s.control.status_lns(name) for name in sections}, None))
                    continue
                except ControlError:
                    pass  # asked again in full below
            asked = time.monotonic()
            try:
                av = s.control.available()
                # a LAC-only xl2tpd has no LNS section: nothing to ask status-lns about
                out.append((s, asked, av, {name: s.control.status_lns(name) for name in av.lns}, None))
            except ControlError as e:
                out.append((s, asked, None, {}, f"{s.control.pipe}: {e}"))
        return out

    def control_known(self) -> dict[str, tuple[frozenset[int], frozenset[CallKey]]]:
        """The tunnel and call ids of each control pipe's instance now: what
        an answer fetched from here on may find gone (see ``apply_control``)."""
        return {ins.name: (frozenset(ins.tunnels), frozenset(ins.calls))
                for ins in (self._control_instance(s) for s in self.sources if s.control is not None)}

    def apply_control(self, answers: list[ControlAnswer],
                      known: Optional[dict[str, tuple[frozenset[int], frozenset[CallKey]]]] = None) -> list[Event]:
        """Bring the model to what ``fetch_control`` found.  With ``known``
        (``control_known()`` taken before the fetch) the model may have moved
        on meanwhile: only what was known then can be found gone, and what
        went meanwhile is not brought back."""
        ev: list[Event] = []
        for s, asked, av, status, error in answers:
            if error is not None:
                self.warnings.append(error)
                name = self._control_instance(s).name
                self.unanswered[name] = max(asked, self.unanswered.get(name, asked))
                continue
            ins = self._control_instance(s)
            # an instance that was not the pipe's when the question went out: nothing was known then
            then_tids, then_cids = known.get(ins.name, (frozenset(), frozenset())) if known is not None \
                else (None, None)
            lns_calls_listed = frozenset((st.peer, st.peer_tunnel_id, cid) for tunnels in status.values()
                                         for st in tunnels for cid in st.calls)
            our_tid: Callable[[StatusTunnel], Optional[int]]
            tunnels_asked: Optional[float]  # None: with this answer (Listed)
            if av is None:
                # status-lns alone (fetch_control's lns_calls_only): no tunnel is
                # found gone, and a listed call is placed only in a tunnel the
                # model holds to that peer with that peer tunnel id
                prev = self.listed.get(ins.name)
                listed_tunnels, tunnels_asked = (prev.tunnels, prev.tunnels_since()) if prev \
                    else (frozenset(), float("-inf"))
                held: dict[tuple[str, int], list[int]] = {}
                for x in ins.all_tunnels():
                    if x.peer_tunnel_id is not None:
                        held.setdefault((x.peer, x.peer_tunnel_id), []).append(x.tunnel_id)

                def our_tid(st: StatusTunnel) -> Optional[int]:
                    tids = held.get((st.peer, st.peer_tunnel_id), [])
                    return tids[0] if len(tids) == 1 else None
            else:
                self._lns_sections[s.name] = (self._control_pid.get(s.name), list(av.lns))
                live = frozenset((t.tunnel_id, t.peer_tunnel_id) for t in av.tunnels)
                listed_tunnels, tunnels_asked = live, None
                live_tids = {tid for tid, _ in live}
                # by pair: xl2tpd may have given a gone tunnel's id to a new one (or to a second live one)
                for gone in [t for tid in ins.tunnels if then_tids is None or tid in then_tids
                             for t in ins.with_id(tid)
                             if tid not in live_tids or t.peer_tunnel_id not in (None, *(p for i, p in live
                                                                                          if i == tid))]:
                    ev += self.tracker.tunnel_down(ins, gone.tunnel_id, "not reported by xl2tpd (control pipe)",
                                                   gone.peer, gone.peer_tunnel_id)
                # status-lns names a tunnel by the peer's id and address, `available`
                # by both ids: two peers may pick one id (16 random bits each; at
                # 100 tunnels, about one storm in 14), and then the model's tunnel to
                # that address says which of ours it is, or nothing is placed
                ours: dict[int, list[int]] = {}
                for a in av.tunnels:
                    ours.setdefault(a.peer_tunnel_id, []).append(a.tunnel_id)

                def our_tid(st: StatusTunnel) -> Optional[int]:
                    tids = ours.get(st.peer_tunnel_id, [])
                    if len(tids) > 1:
                        tids = [x.tunnel_id for x in ins.all_tunnels() if x.tunnel_id in tids
                                and x.peer == st.peer and x.peer_tunnel_id == st.peer_tunnel_id]
                    return tids[0] if len(tids) == 1 else None

            now, prev = time.monotonic(), self.listed.get(ins.name)
            recent = (prev.recent[-(_RECENT_ANSWERS - 1):] if prev else ()) + ((asked, now),)
            self.listed[ins.name] = Listed(asked, listed_tunnels, lns_calls_listed, now, tunnels_asked, recent)
            lns_calls: set[CallKey] = set()
            for section, tunnels in status.items():
                for st in tunnels:
                    # listed, whether or not its tunnel can be placed
                    lns_calls.update(CallKey(st.peer, cid) for cid in st.calls)
                    tid = our_tid(st)
                    if tid is None:
                        continue
                    if not any(x.peer_tunnel_id == st.peer_tunnel_id for x in ins.with_id(tid)):
                        if tid not in ins.tunnels and then_tids is not None and tid in then_tids:
                            continue  # ended while the question was out
                        t = TunnelInfo(instance=ins.name, role="lns", section=section, peer=st.peer,
                                       peer_port=st.peer_port, tunnel_id=tid, peer_tunnel_id=st.peer_tunnel_id,
                                       sources=("control",))
                        ev += self.tracker.tunnel_up(ins, t)
                    for cid in st.calls:
                        key = CallKey(st.peer, cid)
                        c = ins.calls.get(key)
                        if c is None:
                            if then_cids is not None and key in then_cids:
                                continue  # ended while the question was out
                            c = CallInfo(instance=ins.name, role="lns", section=section, peer=st.peer,
                                         peer_port=st.peer_port, tunnel_id=tid, peer_tunnel_id=st.peer_tunnel_id,
                                         call_id=cid, data_path="kernel" if ins.kernel_mode else "unknown",
                                         sources=("control",))
                            ev += self.tracker.call_up(ins, c)
                        else:
                            ev += self.tracker.update_call(c, tunnel_id=tid, peer_tunnel_id=st.peer_tunnel_id,
                                                            peer_port=st.peer_port or None, section=section)
            for k, c in list(ins.calls.items()):
                if c.role == "lns" and k not in lns_calls and (then_cids is None or k in then_cids):
                    ev += self.tracker.call_down(ins, k, "not reported by xl2tpd (control pipe)")
        return ev

    def scan_wanted(self) -> dict[str, Any]:
        """What a /proc scan must read (``procscan.scan``'s arguments): the
        children of the xl2tpd instances followed here (every xl2tpd's
        while none is known yet), and their argv and fds but for a pppd whose
        call the kernel dump places already (what they say is not used then:
        only that it runs).  With many calls offloaded, those reads were most
        of a full scan's, and the argv of each most of its memory."""
        parents = {i.daemon_pid for s in self.sources for i in self._instances_of(s) if i.daemon_pid is not None}
        held = {c.pppd_pid for c in self.tracker.calls() if c.pppd_pid and c.data_path == "kernel"} \
            if self.kernel else set()
        return {"parents": frozenset(parents) if parents else None, "known": held}

    def _reconcile_proc(self, scanned: Optional[Scanned] = None, scanned_at: Optional[float] = None) -> list[Event]:
        """``scanned``: a scan begun at ``scanned_at`` (monotonic); one is
        taken now without it."""
        if not self.proc:
            for ins in self.tracker.instances.values():
                ins.calls.forget_named(float("inf"))  # no scan will judge them
            return []
        ev: list[Event] = []
        if scanned is None:  # every xl2tpd's children, but a placed call's pppd from its stat line alone
            scanned_at, scanned = time.monotonic(), procscan.scan(known=self.scan_wanted()["known"])
        daemons, children = scanned
        started = time.monotonic() if scanned_at is None else scanned_at
        alive = {d.pid for d in daemons}
        for s in self.sources:
            if s.control is not None:
                owner = self._control_owner(s, daemons)
                main = self.tracker.inst(s.name)
                if main.daemon_pid is None and owner is not None and not any(
                        i.daemon_pid == owner for i in self._instances_of(s)):
                    main.daemon_pid = owner
            for ins in self._instances_of(s):
                ev += self._reconcile_instance(s, ins, alive, children, started)
                ins.calls.forget_named(started)
        return ev

    def _drop_instance(self, name: str) -> None:
        """Forget a second xl2tpd of a stream: its calls' model and what its pipe answered."""
        del self.tracker.instances[name]
        self.listed.pop(name, None)
        self.unanswered.pop(name, None)

    def _reconcile_instance(self, s: Source, ins: Instance, alive: set[int],
                            children: dict[int, list[procscan.Proc]], started: float) -> list[Event]:
        ev: list[Event] = []
        if ins.daemon_pid is not None and ins.daemon_pid not in alive:
            # the scan runs outside the lock, and a request may read the logs
            # meanwhile: an xl2tpd whose start was read after the scan began
            # is not in it, and is judged by /proc now, by the scan's own test
            try:
                if procscan.is_xl2tpd(ins.daemon_pid):
                    return ev  # its children were not read either: the next scan judges it
            except OSError:  # out of fds here: nothing known of it, nothing ended
                return ev
            ev += self.tracker.all_down(ins, f"xl2tpd pid {ins.daemon_pid} is gone")
            ins.daemon_pid = None
            if ins.name != s.name:  # a second xl2tpd of the stream: its name had its pid
                self._drop_instance(ins.name)
            return ev
        if ins.daemon_pid is None:
            if ins.name != s.name and not ins.calls and not ins.tunnels:
                self._drop_instance(ins.name)  # a second xl2tpd that logged its exit
            return ev  # no process to check against (a log from elsewhere, or not started)
        if ins.daemon_pid not in children:
            return ev  # its children were not read in this scan (it was not followed when it began)
        kids = children[ins.daemon_pid]
        by_pid = {k.pid: k for k in kids}
        taken: Optional[set[int]] = None  # the pppds calls hold: made when a call without one is met
        for c in list(ins.calls.values()):
            if c.pppd_pid is not None and c.pppd_pid not in by_pid:
                if ins.calls.named_since(c.pppd_pid, started):
                    # named after the scan began (the daemon scans outside
                    # its lock): the next scan judges it.  In a login storm
                    # that is most calls, and a read of each held the lock
                    continue
                # named before: gone, or not yet exec'd (still named xl2tpd)
                try:
                    now = procscan.read_process(c.pppd_pid, with_fds=False)
                except OSError:  # out of fds here: nothing known of it, nothing ended
                    continue
                if now is None or now.ppid != ins.daemon_pid:
                    ev += self.tracker.call_down(ins, c.ref(), f"pppd {c.pppd_pid} exited")
                    continue
                if now.comm != "pppd":
                    # xl2tpd logs the call after fork(), before its child
                    # has exec'd pppd: not started yet, not ended
                    continue
            if c.pppd_pid is None:
                if taken is None:
                    taken = {o.pppd_pid for o in ins.calls.values() if o.pppd_pid}
                cands = [k for k in kids if k.pid not in taken and _matches(k, c)]
                if len(cands) == 1:
                    ev += self.tracker.observe_pppd(ins.name, c.ref(), cands[0].pid)
                    taken.add(cands[0].pid)
            k = by_pid.get(c.pppd_pid) if c.pppd_pid else None
            # a pppd moved into the kernel keeps its pty: whether its call is
            # in the kernel is the kernel dump's word (_reconcile_kernel)
            if k is not None and k.data_path != "unknown" and not (self.kernel and c.data_path == "kernel"):
                ev += self.tracker.observe_data_path(ins.name, c.ref(), k.data_path)
        return ev

    def observe_process(self, pid: int, p: Optional[procscan.Proc] = None) -> list[Event]:
        """Match one pppd to its call from its /proc entry alone (``p``: that
        entry, read already; a pppd's parent and argv do not change).

        Cheap next to a full scan: used while that pppd waits for its channel
        (the LAC side logs no pppd PID).  Needs the parent xl2tpd's PID to be
        known already (from an earlier scan); otherwise a full scan runs."""
        p = p if p is not None else procscan.read_process(pid, with_fds=False)
        if p is None or p.comm != "pppd":
            return []
        for ins in [i for s in self.sources for i in self._instances_of(s)]:
            if ins.daemon_pid == p.ppid:
                if ins.calls.of_pppd(pid):
                    return []  # already matched
                cands = [c for c in ins.calls.without_pppd() if _matches(p, c)]
                if len(cands) == 1:
                    return self.tracker.observe_pppd(ins.name, cands[0].ref(), pid)
                return []
        return self._reconcile_proc()

    def _reconcile_kernel(self, sessions: Optional[set[int]] = None) -> list[Event]:
        """The kernel's sessions (``sessions``: a dump read already) applied to the calls."""
        if not self.kernel:
            return []
        if sessions is None:
            sessions = self._kernel_sessions()
            if sessions is None:
                return []
        ev: list[Event] = []
        for c in self.tracker.calls():
            if c.tunnel_id is None:
                continue
            if session_key(c.tunnel_id, c.call_id) in sessions:
                ev += self.tracker.observe_data_path(c.instance, c.ref(), "kernel")
            elif c.data_path == "kernel" and self.tracker.instances[c.instance].kernel_mode is False:
                # a userspace-mode xl2tpd's call leaves the kernel only for its
                # pty (the live move back): its pppd still runs there
                ev += self.tracker.observe_data_path(c.instance, c.ref(), "userspace")
        return ev

    def _kernel_sessions(self) -> Optional[set[int]]:
        """Every kernel session's ``session_key``, or None when the kernel cannot be read (said once)."""
        try:
            if self._backend is None:
                self._backend = NetlinkBackend(netns=self.netns)
            return self._backend.session_keys()
        except errors.PipexError as e:
            self.warnings.append(f"kernel: {e}")
            self.kernel = False
            return None

    def poll(self, reconcile: bool = True, control: bool = False,
             scanned: Optional[Scanned] = None, scanned_at: Optional[float] = None, logs: bool = True) -> list[Event]:
        """One step of following: new log lines (unless ``logs`` is false), and
        optionally /proc + kernel (+ control).

        ``scanned``: a ``procscan.scan()`` result begun at ``scanned_at``
        (monotonic; a caller that serialises access to this object can scan
        /proc outside its lock).  It is handed over: its pppds are dropped
        (``scanned[1]`` emptied) once applied, before the kernel's dump is
        read, so that the two are not held at once (at 10,000 calls 1.5 and
        0.8 MiB at the poll's peak).
        ``poll_seconds`` gets the time each part took (for a slow poll's log line)."""
        t = time.monotonic()
        ev = self._read_logs() if logs else []
        self.poll_seconds = {"logs": time.monotonic() - t} if logs else {}
        if reconcile:
            parts: list[tuple[str, Callable[[], list[Event]]]] = [
                ("control", self._reconcile_control)] if control else []

            def proc() -> list[Event]:
                try:
                    return self._reconcile_proc(scanned, scanned_at)
                finally:
                    if scanned is not None:
                        scanned[1].clear()

            parts += [("proc", proc), ("kernel", self._reconcile_kernel)]
            try:
                for name, part in parts:
                    t = time.monotonic()
                    ev += part()
                    self.poll_seconds[name] = time.monotonic() - t
            except OSError as e:  # out of fds: the log's events still go out; the next round checks again
                self.warnings.append(f"reconcile stopped: {e}")
        return ev

    def refresh(self, control: bool = True, events: bool = True) -> list[Event]:
        """Read every source once.  ``events=False``: bring the model up to
        date without building the events (returns []), for a caller that
        would drop them (a daemon's start: no snapshot per known call)."""
        self.tracker.quiet = not events
        try:
            ev = self._read_logs()
            ev += self._read_logs()  # at the end of every log: flushes a trailing pppd argv
            if control:
                ev += self._reconcile_control()
            # the kernel first: a pppd whose call it places is then read from
            # its stat line alone (scan_wanted), as the watcher's polls read
            # it; a restart's scan read the argv and fds of every offloaded
            # call's pppd, 8 MiB at its peak with 10,000 of them.  The same
            # dump is applied again after /proc, whose word it corrects (as
            # in a poll: a path /proc gave that the kernel does not hold)
            sessions = self._kernel_sessions() if self.kernel else None
            ev += self._reconcile_kernel(sessions)
            ev += self._reconcile_proc()
            if sessions is not None:
                ev += self._reconcile_kernel(sessions)
        finally:
            self.tracker.quiet = False
        return ev

    def snapshot(self) -> Snapshot:
        self.refresh(events=False)
        now = time.time()
        return Snapshot(
            tunnels=sorted(self.tracker.tunnels(), key=lambda t: (t.instance, t.tunnel_id)),
            calls=sorted(self.tracker.calls(), key=lambda c: (c.instance, c.tunnel_id or 0, c.call_id)),
            stats={
                "lines": sum(s.parser.lines for s in self.sources),
                "unparsed": sum(s.parser.unparsed for s in self.sources),
                "malformed": sum(s.parser.malformed for s in self.sources),
                "warnings": self.warnings,
                "at": now,
            },
        )

    def events(self, poll: float = 0.2, reconcile_every: float = 1.0, control_every: float = 10.0,
               until: Optional[float] = None, stop: Optional[threading.Event] = None) -> Iterator[Event]:
        """Current objects first, then each change once.

        ``until``: stop at that monotonic time; ``stop``: a threading.Event that ends the loop."""
        snap = self.snapshot()
        for t in snap.tunnels:
            yield TunnelUp(tunnel=t)
        for c in snap.calls:
            yield CallUp(call=c)
        last_rec = last_ctl = time.monotonic()
        while (until is None or time.monotonic() < until) and not (stop is not None and stop.is_set()):
            ev = self._read_logs()
            now = time.monotonic()
            if now - last_rec >= reconcile_every:
                do_ctl = now - last_ctl >= control_every
                ev += (self._reconcile_control() if do_ctl else []) + self._reconcile_proc() + self._reconcile_kernel()
                last_rec = now
                if do_ctl:
                    last_ctl = now
            for e in ev:
                yield e
            time.sleep(poll)

    def close(self) -> None:
        for s in self.sources:
            if s.reader is not None:
                s.reader.close()
            if s.barrier is not None:
                s.barrier.close()
        if self._backend is not None:
            self._backend.close()


def _of_source(instance: str, s: Source) -> bool:
    """Instance ``instance`` is one of the xl2tpd writing ``s``'s stream (its name, or ``NAME@PID``)."""
    return instance == s.name or instance.startswith(s.name + "@")


def _matches(p: procscan.Proc, c: CallInfo) -> bool:
    """Does pppd ``p`` belong to call ``c``?  By ids in argv (LNS kernel mode)
    or by the exact argv xl2tpd logged for the call (pty path / fd number)."""
    t, s = p.argv_tunnel_session
    if s is not None:
        return s == c.call_id and (t is None or c.tunnel_id is None or t == c.tunnel_id)
    if c.pppd_argv:
        return tuple(p.argv[1:]) == c.pppd_argv[1:]
    return False


__all__ = ["Discovery", "Snapshot", "DEFAULT_LOGS", "default_sources", "CallDown", "TunnelDown"]
