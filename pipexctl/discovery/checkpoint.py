"""Where discovery stopped reading each log, and what it knew there.

A daemon that starts reads its logs from the beginning: the journal from
the start of this boot, a syslog file whole.  On an LNS up for weeks that
is millions of lines parsed before the first request is served.  A
checkpoint saves, per log source, the read position (a journal cursor, or a
file's inode and offset with a hash of the bytes before it) together with
the model built from everything before that position (the tracker's
instances and the parser's state).  A start that finds a checkpoint which
still fits its logs restores that model and reads only what came after;
the usual reconcile (control pipe, /proc, kernel) then corrects anything
that changed while nobody read, as it does for a full read.

A position is taken only when it fits the log it names:
- a file: the same inode (or the rotated file that has it now, in the same
  directory), at least ``offset`` bytes long, with the same bytes before
  ``offset``; otherwise that log is read whole, as without a checkpoint;
- the journal: a cursor of this boot (calls of an earlier boot are gone
  with its kernel).

The file lives with the state file in the daemon's private directory (root
only); it is validated like the state file, and one that does not validate
is ignored with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Annotated, Literal, Optional, Union

from .. import files, records
from ..records import Limits, check
from .state import CallInfo, CallKey, Calls, Instance, TunnelInfo

MAX_BYTES = 64 << 20
TAIL = 4096  # bytes before a file position that must still be there, unchanged

# journalctl's cursor: seqnum id, seqnum, boot id, monotonic, realtime, xor hash
CURSOR = re.compile(r"^s=[0-9a-f]{32};i=[0-9a-f]{1,16};b=(?P<boot>[0-9a-f]{32});m=[0-9a-f]{1,16};"
                    r"t=[0-9a-f]{1,16};x=[0-9a-f]{1,16}$")


# The file's records: checked when made (records.check), from the file by
# records.load; a record that does not check makes the whole file ignored.


@dataclass(kw_only=True)
class FilePos:
    kind: Literal["file"] = "file"
    dev: int
    ino: int
    offset: Annotated[int, Limits(ge=0, lt=1 << 62)]
    tail: Annotated[str, Limits(pattern=r"^[0-9a-f]{64}$")]  # sha256 of the TAIL bytes before offset (fewer at the start)

    def __post_init__(self) -> None:
        check(self)


@dataclass(kw_only=True)
class JournalPos:
    kind: Literal["journal"] = "journal"
    cursor: Annotated[str, Limits(pattern=CURSOR.pattern)]

    def __post_init__(self) -> None:
        check(self)


@dataclass(kw_only=True)
class ParserState:
    argv: Optional[list[str]] = None  # a pppd argv being read (its lines span reads)
    argv_pid: Optional[int] = None
    last_pid: Optional[int] = None

    def __post_init__(self) -> None:
        check(self)


@dataclass(kw_only=True)
class InstanceState:
    name: str
    daemon_pid: Optional[int] = None
    kernel_mode: Optional[bool] = None
    tunnels: list[TunnelInfo] = field(default_factory=list)
    calls: list[CallInfo] = field(default_factory=list)
    calling: list[tuple[int, int]] = field(default_factory=list)
    calling_seen: int = 0
    serial_anchor: Optional[tuple[int, int]] = None
    pending_argv: Optional[list[str]] = None
    foreign_pids: list[int] = field(default_factory=list)
    # a call's key; a bare call id in a checkpoint written before calls were keyed by peer too
    last_lac_call: Optional[Union[tuple[str, int], int]] = None
    status_tunnel: Optional[int] = None
    status_peer: Optional[str] = None

    def __post_init__(self) -> None:
        check(self)

    @classmethod
    def of(cls, ins: Instance) -> "InstanceState":
        return cls(name=ins.name, daemon_pid=ins.daemon_pid, kernel_mode=ins.kernel_mode,
                   tunnels=list(ins.tunnels.values()), calls=list(ins.calls.values()), calling=list(ins.calling),
                   calling_seen=ins.calling_seen, serial_anchor=ins.serial_anchor,
                   pending_argv=list(ins.pending_argv) if ins.pending_argv is not None else None,
                   foreign_pids=sorted(ins.foreign_pids), last_lac_call=ins.last_lac_call,
                   status_tunnel=ins.status_tunnel, status_peer=ins.status_peer)

    def instance(self) -> Instance:
        ins = Instance(self.name)
        ins.daemon_pid, ins.kernel_mode = self.daemon_pid, self.kernel_mode
        ins.tunnels = {t.tunnel_id: t for t in self.tunnels}
        ins.calls = Calls(self.calls)
        ins.calling, ins.calling_seen = [(a, b) for a, b in self.calling], self.calling_seen
        ins.serial_anchor = (self.serial_anchor[0], self.serial_anchor[1]) if self.serial_anchor is not None else None
        ins.pending_argv = tuple(self.pending_argv) if self.pending_argv is not None else None
        ins.foreign_pids, ins.status_tunnel, ins.status_peer = set(self.foreign_pids), self.status_tunnel, \
            self.status_peer
        last = self.last_lac_call
        if isinstance(last, int):
            keys = [k for k in ins.calls if k.call_id == last]
            ins.last_lac_call = keys[0] if len(keys) == 1 else None
        elif last is not None:
            ins.last_lac_call = CallKey(*last)
        return ins


@dataclass(kw_only=True)
class SourceState:
    name: str  # the log spec (--log): a position is only ever used for the same spec
    position: Union[FilePos, JournalPos]  # told apart by their "kind"
    parser: ParserState
    instances: list[InstanceState]

    def __post_init__(self) -> None:
        check(self)


@dataclass(kw_only=True)
class Checkpoint:
    version: Literal[1] = 1
    boot_id: Annotated[str, Limits(pattern=r"^[0-9a-f]{32}$")]
    written: float = 0.0
    sources: list[SourceState] = field(default_factory=list)

    def __post_init__(self) -> None:
        check(self)


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip().replace("-", "")


def file_tail(fd: int, offset: int) -> str:
    start = max(0, offset - TAIL)
    data = os.pread(fd, offset - start, start)
    if len(data) != offset - start:
        raise ValueError("shorter than the saved position")
    return hashlib.sha256(data).hexdigest()


def load(path: str) -> tuple[Optional[Checkpoint], Optional[str]]:
    """The checkpoint and a warning.  Missing: (None, None).  Of another
    boot, unreadable or invalid: (None, why) -- never trusted, never a crash."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"checkpoint {path}: cannot read it ({e.strerror}); every log is read from its start"
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None, f"checkpoint {path}: not this daemon's own file (owner or mode); ignored"
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        return None, f"checkpoint {path}: larger than {MAX_BYTES >> 20} MiB; ignored"
    try:
        cp = records.load(Checkpoint, json.loads(raw))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # Invalid is a ValueError, as json's errors
        return None, f"checkpoint {path}: not valid ({str(e).splitlines()[0][:200]}); ignored"
    if cp.boot_id != boot_id():
        return None, None  # written in an earlier boot: its calls are gone with that kernel
    return cp, None


def encode(cp: Checkpoint) -> bytes:
    """The file's bytes.  The checkpoint refers to the tracker's live
    records: encode it under the lock that guards them."""
    return json.dumps(records.dump(replace(cp, written=time.time())), separators=(",", ":")).encode()


def write(path: str, data: bytes) -> None:
    files.atomic_write(path, data)


def cursor_of(line: bytes) -> Optional[str]:
    """The ``__CURSOR`` of one ``journalctl -o json`` line (None if it has none)."""
    try:
        cur = json.loads(line).get("__CURSOR")
    except (ValueError, AttributeError):
        return None
    return cur if isinstance(cur, str) and CURSOR.fullmatch(cur) else None
