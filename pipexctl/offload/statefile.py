"""What `pipexctl serve` created, on disk, and how a restart reconciles it.

The file (default ``/run/pipexctl/state.json``, mode 0600) lists each kernel
tunnel the daemon made (xl2tpd instance, ids, both addresses and ports) and
each offloaded session in it (call ids, the owning pppd's PID).
It is written after every change with temp file + fsync + rename, so a
crash leaves either the old or the new file, never a torn one.  Offloads
running at once share writes (:class:`Writer`): each waits, outside the
daemon's lock, for a write that holds its record, and one write holds every
record made before it began.

At start the daemon calls :func:`plan` with what the file says, what the
kernel holds and what discovery knows, and gets three lists:

- *adopt*: a session whose kernel object exists and whose pppd is alive
  (discovery is not asked: log lines can be forged, and the kernel session
  exists only while the pppd holding its channel does);
- *remove*: sessions and tunnels that are ours (recorded, and the kernel
  tunnel still has the recorded ids and addresses) but orphaned;
- *forget*: records with nothing left in the kernel, or whose ids the
  kernel now uses for something that is not ours (never touched).

A file that cannot be read or does not validate is moved aside
(``state.json.corrupt-<time>``) with a warning and treated as empty; it is
never trusted and never a crash.  A version 1 file (written by the earlier
data path: private ports and nft steering) is moved aside the same way, with
what it means for the calls it names.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Final, Iterable, Literal, Optional, Protocol

from pydantic import BaseModel, Field, ValidationError
from pydantic.dataclasses import dataclass as pdataclass

from .. import files
from ..model import Session, Tunnel

VERSION: Final = 2


# Records are slotted, validated, frozen dataclasses (one per offloaded
# call is held in memory; see discovery.state.CallInfo); a session record
# carries its own encoding, made once when it is made (a dict beside it
# would cost more than the record); the file's envelope is a BaseModel.


@pdataclass(slots=True, kw_only=True, frozen=True)
class SessionRecord:
    call_id: int = Field(ge=1, le=65535)
    peer_call_id: int = Field(ge=0, le=65535)
    pppd_pid: int = Field(ge=1)
    role: str = "unknown"
    pty: Optional[str] = Field(None, pattern=r"^/dev/pts/[0-9]{1,7}$")  # the slave end the daemon holds
    moved: bool = False  # a running call moved from its pty (the plugin's live move), not offloaded at its start
    since: Optional[float] = None  # when its data path became the kernel (epoch seconds; None: an older record)
    # not a field of the file: the record as the file has it
    encoded: bytes = Field(default=b"", init=False, exclude=True, repr=False)  # made in __post_init__

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoded", _json({f: getattr(self, f) for f in _SESSION_FIELDS}))


@pdataclass(slots=True, kw_only=True, frozen=True)
class TunnelRecord:
    instance: str
    tunnel_id: int = Field(ge=1, le=65535)
    peer_tunnel_id: int = Field(ge=0, le=65535)
    local: str
    peer: str
    peer_port: int = Field(ge=1, le=65535)
    local_port: int = Field(ge=1, le=65535)
    sessions: list[SessionRecord] = Field(default_factory=list)
    xl2tpd_pid: Optional[int] = Field(None, ge=1)  # the verified parent of its pppds


class State(BaseModel):
    version: Literal[2] = VERSION
    written: float = 0.0
    pid: int = 0
    tunnels: list[TunnelRecord] = Field(default_factory=list)


def load(path: str) -> tuple[State, Optional[str]]:
    """The recorded state and a warning (None when all is well).

    Missing file: empty state.  Unreadable or invalid: moved aside, empty."""
    try:
        with open(path, "rb") as f:
            raw = f.read(16 * 1024 * 1024 + 1)
    except FileNotFoundError:
        return State(), None
    except OSError as e:
        return State(), f"cannot read state file {path}: {e.strerror}; starting from nothing recorded"
    why = None
    if len(raw) > 16 * 1024 * 1024:
        why = "larger than 16 MiB"
    else:
        try:
            doc = json.loads(raw.decode("utf-8"))
            if isinstance(doc, dict) and doc.get("version") == 1:
                why = ("written by pipexctl's earlier data path (private ports, nft table ip pipexctl); this "
                       "daemon replaces that table, so the calls it names carry no more data: hang them up")
            else:
                return State.model_validate(doc), None
        except (ValueError, UnicodeDecodeError, ValidationError) as e:
            why = str(e).splitlines()[0][:200]
    aside = f"{path}.corrupt-{int(time.time())}"
    try:
        os.replace(path, aside)
        where = f"moved to {aside}"
    except OSError as e:
        where = f"could not move it aside: {e.strerror}"
    return State(), f"state file {path} is not valid ({why}); {where}; starting from nothing recorded"


# The file is written from pieces encoded once each (a session when it is
# recorded, a tunnel when its sessions change), so a write costs a join of
# bytes, not a validation and serialisation of every record: with 10,000
# calls the daemon rewrites the file on every change.  ``load`` validates
# what these produce with the models above (a unit test compares the two).
_TUNNEL_FIELDS = ("instance", "tunnel_id", "peer_tunnel_id", "local", "peer", "peer_port", "local_port",
                  "xl2tpd_pid")
_SESSION_FIELDS = ("call_id", "peer_call_id", "pppd_pid", "role", "pty", "moved", "since")


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class TunnelFields(Protocol):
    """What a tunnel's encoding reads (a TunnelRecord, or the service's TunnelState)."""

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


def encode_tunnel(t: TunnelFields, sessions: Iterable[SessionRecord]) -> bytes:
    """Tunnel ``t`` with ``sessions`` as the file has it: its fields
    encoded, its sessions' encodings joined."""
    head = _json({f: getattr(t, f) for f in _TUNNEL_FIELDS})[:-1]
    return b"".join((head, b',"sessions":[', b",".join(s.encoded for s in sessions), b"]}"))


def save(path: str, state: State) -> None:
    """Atomic replace (files.atomic_write)."""
    save_encoded(path, [encode_tunnel(t, t.sessions) for t in state.tunnels])


def save_encoded(path: str, tunnels: list[bytes]) -> None:
    """The file of these encoded tunnels (``encode_tunnel``), by atomic
    replace (files.atomic_write)."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, mode=0o700, exist_ok=True)  # made here only when missing; never chmodded
    head = _json({"version": VERSION, "written": time.time(), "pid": os.getpid()})[:-1]
    files.atomic_write(path, b"".join((head, b',"tunnels":[', b",".join(tunnels), b"]}")))


class Writer:
    """Group commit of the state file.

    ``snapshot`` (under the daemon's lock, where the state is consistent)
    keeps the newest state, as its encoded tunnels, and returns its number;
    ``flush(n)`` (without that lock) returns once a state numbered ``n`` or
    later is on disk, writing the newest one itself if nobody has.  Writes
    never overlap and never put an older state over a newer one.
    ``flush_later`` is the background writer's: it never waits for a write
    under way, and backs off while writes fail."""

    RETRY_MAX = 30.0  # seconds between the background writer's tries on a failing disk

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()  # one write at a time; never held while taking the daemon's lock
        self._newest: tuple[int, Optional[list[bytes]]] = (0, None)
        self._written = 0
        self.writes = 0
        self.failures = 0  # failed writes in a row (0: the last one worked)
        self.retry_at = 0.0  # monotonic time of the background writer's next try

    def snapshot(self, tunnels: list[bytes]) -> int:
        n = self._newest[0] + 1
        self._newest = (n, tunnels)  # one assignment: a flush reads either the old pair or the new
        return n

    def newest(self) -> int:
        """The number of the newest snapshot (0: none yet)."""
        return self._newest[0]

    def behind(self) -> bool:
        """A snapshot is newer than what is on disk."""
        return self._written < self._newest[0]

    def flush(self, n: int) -> None:
        if self._written >= n:
            return  # written already: no need to wait for a write under way
        with self._lock:
            self._flush_locked(n)

    def flush_later(self) -> bool:
        """Write the newest snapshot unless one is being written or the disk
        failed a moment ago (then the next call tries).  True when it wrote."""
        if not self.behind() or time.monotonic() < self.retry_at or not self._lock.acquire(blocking=False):
            return False
        try:
            return self._flush_locked(self._newest[0])
        finally:
            self._lock.release()

    def _flush_locked(self, n: int) -> bool:
        if self._written >= n:
            return False  # a later state was written meanwhile
        newest, state = self._newest
        if state is None:
            return False  # nothing was ever snapshotted
        try:
            save_encoded(self.path, state)
        except OSError:
            # every caller it covered tries again itself; the background writer after a pause
            self.failures += 1
            self.retry_at = time.monotonic() + min(self.RETRY_MAX, 0.5 * 2 ** min(self.failures - 1, 10))
            raise
        self._written = newest
        self.writes += 1
        self.failures, self.retry_at = 0, 0.0
        return True


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
