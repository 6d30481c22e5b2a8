"""What `pipexctl serve` created, on disk, and how a restart reconciles it.

The file (default ``/run/pipexctl/state.json``, mode 0600) lists each kernel
tunnel the daemon made (xl2tpd instance, ids, both addresses and ports) and
each offloaded session in it (call ids, the owning pppd's PID).

It is a journal of JSON lines: a header, then one line per change (a tunnel
made, a session recorded, a session ended, a tunnel dropped), appended and
fdatasync'ed, so a change costs one short line whatever the number of calls
held.  Offloads running at once share writes (:class:`Writer`): each waits,
outside the daemon's lock, for a write that holds its line, and one write
holds every line recorded before it began.  When the journal has grown to
twice what it describes, and at each start and SIGHUP, the file is
rewritten whole (temp file + fsync + rename) from the daemon's records.  A
crash leaves either a whole rewrite or a journal whose end may hold the
lines of a write that never returned, the last of them possibly cut off
(or, after a power loss, zeros).  No pppd was told of what those lines
say: whole ones are read (a session the kernel then lacks is forgotten, an
end was already done), and a cut-off last line or trailing zeros are not.

At start the daemon calls :func:`plan` with what the file says, what the
kernel holds and what discovery knows, and gets three lists:

- *adopt*: a session whose kernel object exists and whose pppd is alive
  (discovery is not asked: log lines can be forged, and the kernel session
  exists only while the pppd holding its channel does);
- *remove*: sessions and tunnels that are ours (recorded, and the kernel
  tunnel still has the recorded ids and addresses) but orphaned;
- *forget*: records with nothing left in the kernel, or whose ids the
  kernel now uses for something that is not ours (never touched).

A file that cannot be read or does not validate (a line that is not JSON,
not a record, or a change to something the file has not made) is moved
aside (``state.json.corrupt-<time>``) with a warning and treated as empty;
it is never trusted and never a crash.  A version 2 file (one JSON document,
written whole per change) is read as it is; a version 1 file (written by
the earlier data path: private ports and nft steering) is moved aside the
same way, with what it means for the calls it names.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Annotated, Callable, Final, Iterable, Literal, Optional, Protocol, Sequence

from .. import files, records
from ..model import Session, Tunnel
from ..records import Limits, check

VERSION: Final = 3
MAX_BYTES: Final = 64 * 1024 * 1024  # a larger file is not read (10,000 calls: about 3 MB whole)


# Records are slotted, checked, frozen dataclasses (one per offloaded call
# is held in memory; see discovery.state.CallInfo).

CallId = Annotated[int, Limits(ge=1, le=65535)]
PeerId = Annotated[int, Limits(ge=0, le=65535)]  # 0 while xl2tpd had not learned it
Port = Annotated[int, Limits(ge=1, le=65535)]
Pid = Annotated[int, Limits(ge=1)]


@dataclass(slots=True, kw_only=True, frozen=True)
class SessionRecord:
    call_id: CallId
    peer_call_id: PeerId
    pppd_pid: Pid
    role: str = "unknown"
    pty: Optional[Annotated[str, Limits(pattern=r"^/dev/pts/[0-9]{1,7}$")]] = None  # the slave end the daemon holds
    moved: bool = False  # a running call moved from its pty (the plugin's live move), not offloaded at its start
    since: Optional[float] = None  # when its data path became the kernel (epoch seconds; None: an older record)

    def __post_init__(self) -> None:
        check(self)


@dataclass(slots=True, kw_only=True, frozen=True)
class TunnelRecord:
    instance: str
    tunnel_id: CallId
    peer_tunnel_id: PeerId
    local: str
    peer: str
    peer_port: Port
    local_port: Port
    sessions: list[SessionRecord] = field(default_factory=list)
    xl2tpd_pid: Optional[Pid] = None  # the verified parent of its pppds

    def __post_init__(self) -> None:
        check(self)


@dataclass(slots=True, kw_only=True)
class State:
    version: Literal[2, 3] = VERSION
    written: float = 0.0
    pid: int = 0
    tunnels: list[TunnelRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        check(self)


class _Invalid(Exception):
    """Why a file is not a state file (its first line of explanation)."""


def read(path: str) -> Optional[State]:
    """The recorded state, or None when the file is missing, unreadable or
    not valid; the file is left as it is (``load`` judges it)."""
    try:
        with open(path, "rb") as f:
            return _parse(f.read(MAX_BYTES + 1))
    except (OSError, _Invalid):
        return None


def load(path: str) -> tuple[State, Optional[str]]:
    """The recorded state and a warning (None when all is well).

    Missing file: empty state.  Unreadable or invalid: moved aside, empty."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return State(), None
    except OSError as e:
        return State(), f"cannot read state file {path}: {e.strerror}; starting from nothing recorded"
    try:
        return _parse(raw), None
    except _Invalid as e:
        why = str(e)
    aside = f"{path}.corrupt-{int(time.time())}"
    try:
        os.replace(path, aside)
        where = f"moved to {aside}"
    except OSError as e:
        where = f"could not move it aside: {e.strerror}"
    return State(), f"state file {path} is not valid ({why}); {where}; starting from nothing recorded"


def _parse(raw: bytes) -> State:
    if len(raw) > MAX_BYTES:
        raise _Invalid(f"larger than {MAX_BYTES // (1024 * 1024)} MiB")
    raw = raw.rstrip(b"\0")  # what a power loss can leave after the last write that reached the disk
    head, nl, rest = raw.partition(b"\n")
    try:
        try:
            doc = json.loads(head.decode("utf-8"))
        except ValueError:
            doc = None
        if not (nl and isinstance(doc, dict) and set(doc) == {"version", "written", "pid"}
                and doc["version"] == VERSION):
            # one document: a version 1 or 2 file (or a journal's header cut off);
            # a one-line file was parsed whole above, unless that failed (parsed again for its error)
            if nl or doc is None:
                doc = json.loads(raw.decode("utf-8"))
            if isinstance(doc, dict) and doc.get("version") == 1:
                raise _Invalid("written by pipexctl's earlier data path (private ports, nft table ip pipexctl); "
                               "this daemon replaces that table, so the calls it names carry no more data: "
                               "hang them up")
            if isinstance(doc, dict) and doc.get("version") == VERSION:
                raise ValueError(f"a version {VERSION} header alone, without its end of line")
            return records.load(State, doc)
        state = records.load(State, doc)
        lines = rest.split(b"\n")
        # the last piece is empty after a whole line, and a line cut off by a
        # crash in the middle of an append (its write never returned: ignored)
        state.tunnels = _replay(lines[:-1])
        return state
    except (ValueError, UnicodeDecodeError, TypeError, RecursionError) as e:  # Invalid is a ValueError
        raise _Invalid(str(e).splitlines()[0][:200] if str(e) else type(e).__name__) from None


def _replay(lines: Sequence[bytes]) -> list[TunnelRecord]:
    """The tunnels the journal's lines leave, each with its sessions."""
    tunnels: dict[tuple[str, int], tuple[TunnelRecord, dict[int, SessionRecord]]] = {}
    for n, line in enumerate(lines, start=2):
        doc = json.loads(line)
        if not isinstance(doc, dict) or len(doc) != 1 or not isinstance(next(iter(doc.values())), dict):
            raise ValueError(f"line {n}: not a change")
        ((kind, fields),) = doc.items()
        instance, tunnel_id = fields.pop("instance", None), fields.pop("tunnel_id", None)
        if not isinstance(instance, str) or type(tunnel_id) is not int:
            raise ValueError(f"line {n}: no instance and tunnel id")
        key = (instance, tunnel_id)
        held = tunnels.get(key)
        if kind == "tunnel" and held is None:
            tunnels[key] = (TunnelRecord(instance=instance, tunnel_id=tunnel_id, **fields), {})
        elif kind == "session" and held is not None and fields.get("call_id") not in held[1]:
            s = SessionRecord(**fields)
            held[1][s.call_id] = s
        elif kind == "end" and held is not None and set(fields) == {"call_id"} and fields["call_id"] in held[1]:
            del held[1][fields["call_id"]]
        elif kind == "drop" and held is not None and not fields:
            del tunnels[key]
        else:
            raise ValueError(f"line {n}: {kind!r} of tunnel {tunnel_id} does not follow from the lines before it")
    return [replace(t, sessions=list(sessions.values())) for t, sessions in tunnels.values()]


# The lines are encoded by hand (no model is built or validated per change);
# ``load`` validates what they say with the models above (a unit test
# compares the two).
_TUNNEL_FIELDS = ("instance", "tunnel_id", "peer_tunnel_id", "local", "peer", "peer_port", "local_port",
                  "xl2tpd_pid")
_SESSION_FIELDS = ("call_id", "peer_call_id", "pppd_pid", "role", "pty", "moved", "since")


def _line(kind: str, fields: dict[str, object]) -> bytes:
    return json.dumps({kind: fields}, separators=(",", ":")).encode() + b"\n"


class TunnelFields(Protocol):
    """What a tunnel's line reads (a TunnelRecord, or the service's TunnelState)."""

    @property
    def instance(self) -> str: ...
    @property
    def tunnel_id(self) -> int: ...
    @property
    def peer_tunnel_id(self) -> int: ...
    @property
    def local(self) -> str: ...
    @property
    def peer(self) -> str: ...
    @property
    def peer_port(self) -> int: ...
    @property
    def local_port(self) -> int: ...
    @property
    def xl2tpd_pid(self) -> Optional[int]: ...


def tunnel_line(t: TunnelFields) -> bytes:
    """Tunnel ``t`` made (without sessions)."""
    return _line("tunnel", {f: getattr(t, f) for f in _TUNNEL_FIELDS})


def session_line(instance: str, tunnel_id: int, s: SessionRecord) -> bytes:
    """Session ``s`` recorded in the tunnel ``(instance, tunnel_id)``."""
    return _line("session", {"instance": instance, "tunnel_id": tunnel_id,
                             **{f: getattr(s, f) for f in _SESSION_FIELDS}})


def end_line(instance: str, tunnel_id: int, call_id: int) -> bytes:
    return _line("end", {"instance": instance, "tunnel_id": tunnel_id, "call_id": call_id})


def drop_line(instance: str, tunnel_id: int) -> bytes:
    return _line("drop", {"instance": instance, "tunnel_id": tunnel_id})


# A whole state: each tunnel with the sessions it holds.
Whole = list[tuple[TunnelFields, Sequence[SessionRecord]]]


def encode(whole: Whole) -> bytes:
    """The file of ``whole``: a header and each tunnel's and session's line."""
    out = [json.dumps({"version": VERSION, "written": time.time(), "pid": os.getpid()},
                      separators=(",", ":")).encode() + b"\n"]
    for t, sessions in whole:
        out.append(tunnel_line(t))
        out.extend(session_line(t.instance, t.tunnel_id, s) for s in sessions)
    return b"".join(out)


def save(path: str, state: State) -> None:
    """The file of ``state``, by atomic replace (files.atomic_write)."""
    _mkdir(path)
    files.atomic_write(path, encode([(t, t.sessions) for t in state.tunnels]))


def _mkdir(path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)  # made only when missing; never chmodded


class Writer:
    """Group commit of the state file's journal.

    ``snapshot(lines, whole)`` (under the daemon's lock, where the state is
    consistent) queues the lines of the changes made since the last one, or
    the whole state when ``wants_whole`` said so, and returns its number;
    ``flush(n)`` (without that lock) returns once the changes numbered ``n``
    or earlier are on disk, writing what is queued itself if nobody has.
    Writes never overlap and keep the order of the snapshots.
    ``flush_later`` is the background writer's: it never waits for a write
    under way, and backs off while writes fail."""

    RETRY_MAX = 30.0  # seconds between the background writer's tries on a failing disk
    SLACK = 1024  # lines the journal may hold beyond twice what it describes before a rewrite

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()  # one write at a time; never held while taking the daemon's lock
        self._queue = threading.Lock()  # what is queued; held only to add or take it
        self._lines: list[bytes] = []
        self._whole: Optional[Whole] = None
        self._newest = 0
        self._written = 0
        self._fd = -1  # the journal, open for appending since this daemon last wrote it whole
        self._in_file = 0  # lines in the journal and queued for it
        self._rewrite = True  # a daemon's first write is a whole one: its records, not the file's, are the truth
        self.writes = 0
        self.failures = 0  # failed writes in a row (0: the last one worked)
        self.retry_at = 0.0  # monotonic time of the background writer's next try

    def wants_whole(self, described: int) -> bool:
        """The next snapshot should be the whole state (``described``: the
        tunnels and sessions held)."""
        return self._rewrite or self._in_file > 2 * described + self.SLACK or self._replaced()

    def stuck(self) -> bool:
        """Only a whole write can go on (a failed append's tail could not be
        cut off, or the file was replaced); none is queued."""
        return self._whole is None and (self._rewrite or self._replaced())

    def _replaced(self) -> bool:
        """The path no longer names the file this daemon appends to (an
        editor's rename, a move aside): appends would go nowhere a restart reads."""
        if self._fd < 0:
            return False
        try:
            st, at = os.fstat(self._fd), os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != (at.st_dev, at.st_ino)

    def rewrite(self) -> None:
        """Write the file whole at the next snapshot (after a reconcile: what
        the file said has been judged, and someone may have edited it)."""
        self._rewrite = True

    def snapshot(self, lines: list[bytes], whole: Optional[Whole] = None) -> int:
        with self._queue:
            if whole is not None:  # it holds every change before it
                self._whole, self._lines, self._rewrite = whole, [], False
                self._in_file = sum(1 + len(s) for _, s in whole)
            else:
                self._lines.extend(lines)
                self._in_file += len(lines)
            self._newest += 1
            return self._newest

    def newest(self) -> int:
        """The number of the newest snapshot (0: none yet)."""
        return self._newest

    def behind(self) -> bool:
        """A snapshot is newer than what is on disk."""
        return self._written < self._newest

    def flush(self, n: int) -> None:
        if self._written >= n:
            return  # written already: no need to wait for a write under way
        with self._lock:
            self._flush_locked(n)

    def flush_later(self) -> bool:
        """Write what is queued unless a write is under way or the disk
        failed a moment ago (then the next call tries).  True when it wrote."""
        if not self.behind() or time.monotonic() < self.retry_at or not self._lock.acquire(blocking=False):
            return False
        try:
            return self._flush_locked(self._newest)
        finally:
            self._lock.release()

    def _flush_locked(self, n: int) -> bool:
        if self._written >= n:
            return False  # a later state was written meanwhile
        with self._queue:
            newest, whole, lines = self._newest, self._whole, self._lines
            self._whole, self._lines = None, []
        if whole is None and not lines:
            self._written = newest  # snapshots of no change
            return False
        try:
            if whole is not None:
                self._write_whole(encode(whole) + b"".join(lines))
            else:
                self._append(b"".join(lines))
        except BaseException:
            with self._queue:
                if self._whole is None:  # no whole state was queued meanwhile (it would hold these): keep them
                    self._whole = whole
                    self._lines[:0] = lines
            # every caller it covered tries again itself; the background writer after a pause
            self.failures += 1
            self.retry_at = time.monotonic() + min(self.RETRY_MAX, 0.5 * 2 ** min(self.failures - 1, 10))
            raise
        self._written = newest
        self.writes += 1
        self.failures, self.retry_at = 0, 0.0
        return True

    def _write_whole(self, data: bytes) -> None:
        _mkdir(self.path)
        fd = files.atomic_write(self.path, data, keep_open=True)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        except BaseException:
            os.close(fd)
            raise
        self._close_fd()
        self._fd = fd

    def _append(self, data: bytes) -> None:
        if self._fd < 0 or self._replaced():
            # a failed append's tail could not be cut off, or the file was
            # replaced: only a whole write (the next snapshot's) can go on
            self._rewrite = True
            raise OSError(errno.EIO, "the state file waits to be written whole (a failed write, or the file "
                          "was replaced)")
        good = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fdatasync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, good)  # no torn line before the next one
            except OSError:
                self._rewrite = True
                self._close_fd()
            raise

    def close(self) -> None:
        """Stop appending (a write under way ends first)."""
        with self._lock:
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass
class Plan:
    adopt: list[TunnelRecord] = field(default_factory=list)  # each with only its adopted sessions
    remove_sessions: list[tuple[int, int, str]] = field(default_factory=list)  # (tunnel, session, why)
    remove_tunnels: list[tuple[int, str]] = field(default_factory=list)  # (tunnel, why)
    forget: list[str] = field(default_factory=list)  # records dropped without touching the kernel

    def summary(self) -> dict[str, int]:
        return {"adopted_tunnels": len(self.adopt), "adopted_sessions": sum(len(t.sessions) for t in self.adopt),
                "removed_sessions": len(self.remove_sessions), "removed_tunnels": len(self.remove_tunnels),
                "forgotten": len(self.forget)}


def plan(state: State, kernel_tunnels: Iterable[Tunnel], kernel_sessions: Iterable[Session],
         call_alive: Callable[[str, int, int, int], bool]) -> Plan:
    """Decide what to adopt and what to remove (pure; unit-tested).

    ``call_alive(instance, tunnel_id, call_id, pppd_pid)``: the call's pppd lives."""
    kernel_tunnels_by_id = {t.tunnel_id: t for t in kernel_tunnels}
    kernel_session_ids = {(s.tunnel_id, s.session_id) for s in kernel_sessions}
    p = Plan()
    for rec in state.tunnels:
        t = kernel_tunnels_by_id.get(rec.tunnel_id)
        if t is None:
            p.forget.append(f"tunnel {rec.tunnel_id}: no longer in the kernel")
            continue
        local = (str(t.local.address), t.local.port) if t.local else None
        remote = (str(t.remote.address), t.remote.port) if t.remote else None
        if t.peer_tunnel_id != rec.peer_tunnel_id or local not in (None, (rec.local, rec.local_port)) \
                or remote not in (None, (rec.peer, rec.peer_port)):
            # the id now belongs to another tunnel (xl2tpd kernel mode, another tool): not ours
            p.forget.append(f"tunnel {rec.tunnel_id}: the kernel's tunnel with this id is not ours "
                            f"(peer id {t.peer_tunnel_id}, {local} <-> {remote})")
            continue
        kept = []
        for s in rec.sessions:
            if (rec.tunnel_id, s.call_id) not in kernel_session_ids:
                p.forget.append(f"session {rec.tunnel_id}/{s.call_id}: no longer in the kernel")
            elif call_alive(rec.instance, rec.tunnel_id, s.call_id, s.pppd_pid):
                kept.append(s)
            else:
                p.remove_sessions.append((rec.tunnel_id, s.call_id, f"call gone or pppd {s.pppd_pid} dead"))
        recorded = {s.call_id for s in rec.sessions}
        for tid, sid in sorted(kernel_session_ids):
            # only this daemon adds sessions to its tunnel:
            # one it did not record was left by a crash between session create
            # and the state write
            if tid == rec.tunnel_id and sid not in recorded:
                p.remove_sessions.append((tid, sid, "in our tunnel but not recorded (an interrupted offload)"))
        if kept:
            p.adopt.append(replace(rec, sessions=kept))
        else:
            p.remove_tunnels.append((rec.tunnel_id, "no live call left"))
    return p
