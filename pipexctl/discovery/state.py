"""What discovery knows: tunnels and calls of xl2tpd instances, and the
events that change them.

``Tracker`` applies parsed log records (``logparse``) and facts from the
control pipe, /proc and the kernel, keeps one consistent model per xl2tpd
instance, and returns the typed events each change causes: ``TunnelUp``,
``CallUp``, ``CallDown``, ``TunnelDown``, ``DataPathChanged``.  Each event is
emitted once: an object goes up once and down once.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Literal, NamedTuple, Optional, Sequence, TypeVar, Union

from ..indexed import Indexed, Several, drop, put, values_at
from ..records import check, dump, names
from . import logparse as lp

DataPath = Literal["kernel", "userspace", "unknown"]
Role = Literal["lac", "lns", "unknown"]


class CallIds(NamedTuple):
    """The ids a kernel session for a call needs, all known."""

    tunnel_id: int
    peer_tunnel_id: int
    call_id: int
    peer_call_id: int
    peer_port: int  # the tunnel's UDP port at the peer: a NAT or a second LAC makes it other than 1701


class CallKey(NamedTuple):
    """A call's key in its xl2tpd's model.  xl2tpd draws our call ids at
    random and does not check them against its live calls (L2TPv2 scopes a
    call id to its tunnel), so two live calls can share one; its log lines
    name a call by id and peer address, never by tunnel.  Two calls of one
    id on two tunnels to one address stay one key (``_on_call_established``)."""

    peer: str
    call_id: int


# The tracker's per-call and per-tunnel records are slotted, checked
# dataclasses (records.check): a daemon tracks one per call (bench: serve
# RSS at 10,000 calls).

_SHARED_SOURCES: dict[tuple[str, ...], tuple[str, ...]] = {}


def shared_sources(names: tuple[str, ...]) -> tuple[str, ...]:
    """One tuple object per distinct list of source names, shared by every
    record that has it: the names are discovery's own (a log, a control pipe,
    their status), so there are a handful, against a list per record."""
    return _SHARED_SOURCES.setdefault(names, names)


# which sources told of a record, first first: immutable and shared (shared_sources)
Sources = tuple[str, ...]


@dataclass(slots=True, kw_only=True)
class CallInfo:
    instance: str
    role: Role = "unknown"
    section: Optional[str] = None
    peer: str
    peer_port: Optional[int] = None
    tunnel_id: Optional[int] = None  # ours; None while not yet known
    peer_tunnel_id: Optional[int] = None
    call_id: int  # ours (= the kernel session id)
    peer_call_id: Optional[int] = None
    serial: Optional[int] = None
    pppd_pid: Optional[int] = None
    # as xl2tpd logged it, while the pppd is not known: how a /proc scan
    # tells which pppd is the call's (a LAC's lines name none).  Dropped once
    # the pid is known: it holds the call's pty and address strings
    pppd_argv: Optional[tuple[str, ...]] = None
    data_path: DataPath = "unknown"
    # when data_path last changed from one known path to another (epoch s;
    # a live move or its undo), None while it has not been seen to change
    path_changed: Optional[float] = None
    since: float = field(default_factory=time.time)
    sources: Sources = ()
    # two "Call established" lines named this pppd with other peer ids: one
    # of them is forged, and which cannot be told (never offloaded then)
    disputed: bool = False

    def __post_init__(self) -> None:
        check(self)
        self.sources = shared_sources(self.sources)

    def ref(self) -> CallKey:
        """Its key in its instance's ``Calls``."""
        return CallKey(self.peer, self.call_id)

    def ids(self) -> Optional[CallIds]:
        """Its kernel ids, or None while one is not yet known."""
        if self.tunnel_id is None or self.peer_tunnel_id is None or self.peer_call_id is None or not self.peer_port:
            return None
        return CallIds(self.tunnel_id, self.peer_tunnel_id, self.call_id, self.peer_call_id, self.peer_port)

    def copy(self, **update: object) -> "CallInfo":
        """A copy that later changes do not reach (events carry snapshots),
        with *update* applied."""
        c = _snapshot(self)
        for k, v in update.items():
            setattr(c, k, v)
        return c

    def dump(self, exclude: Collection[str] = ()) -> dict[str, Any]:
        """Its fields in JSON's types, but those in ``exclude``."""
        return _dump_but(self, exclude)


@dataclass(slots=True, kw_only=True)
class TunnelInfo:
    instance: str
    role: Role = "unknown"
    section: Optional[str] = None
    peer: str
    peer_port: Optional[int] = None
    tunnel_id: int  # ours
    peer_tunnel_id: Optional[int] = None
    since: float = field(default_factory=time.time)
    sources: Sources = ()

    def __post_init__(self) -> None:
        check(self)
        self.sources = shared_sources(self.sources)

    def key(self) -> tuple[str, int]:
        return (self.instance, self.tunnel_id)

    def copy(self) -> "TunnelInfo":
        return _snapshot(self)

    def dump(self, exclude: Collection[str] = ()) -> dict[str, Any]:
        """Its fields in JSON's types, but those in ``exclude``."""
        return _dump_but(self, exclude)


_Record = TypeVar("_Record", CallInfo, TunnelInfo)


def _dump_but(rec: Union[CallInfo, TunnelInfo], exclude: Collection[str]) -> dict[str, Any]:
    out: dict[str, Any] = dump(rec)
    for k in exclude:
        out.pop(k, None)
    return out


def _snapshot(rec: _Record) -> _Record:
    """A copy of a record that later changes to it do not reach: its fields
    are strings, numbers and tuples of strings, none of which changes in
    place, so the copy shares them (a deep copy was most of a status
    report's time).  The copy is not validated again: the record was."""
    out = type(rec).__new__(type(rec))
    for name in names(type(rec)):
        object.__setattr__(out, name, getattr(rec, name))
    return out


# Events: what a change to the model was, made by the tracker only (their
# records were checked when made).  ``dump`` gives one in JSON's types, its
# fields in order: ``at``, ``event``, then the event's own.


@dataclass(kw_only=True)
class _Event:
    at: float = field(default_factory=time.time)

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = dump(self)
        return out


@dataclass(kw_only=True)
class TunnelUp(_Event):
    event: Literal["TunnelUp"] = "TunnelUp"
    tunnel: TunnelInfo


@dataclass(kw_only=True)
class TunnelDown(_Event):
    event: Literal["TunnelDown"] = "TunnelDown"
    tunnel: TunnelInfo
    reason: str = ""


@dataclass(kw_only=True)
class CallUp(_Event):
    event: Literal["CallUp"] = "CallUp"
    call: CallInfo


@dataclass(kw_only=True)
class CallDown(_Event):
    event: Literal["CallDown"] = "CallDown"
    call: CallInfo
    reason: str = ""


@dataclass(kw_only=True)
class DataPathChanged(_Event):
    event: Literal["DataPathChanged"] = "DataPathChanged"
    call: CallInfo
    old: DataPath
    new: DataPath


@dataclass(kw_only=True)
class CallUpdated(_Event):
    """A known call learned a missing fact (tunnel id, pppd PID, peer call id)."""

    event: Literal["CallUpdated"] = "CallUpdated"
    call: CallInfo
    fields: list[str]


Event = Union[TunnelUp, TunnelDown, CallUp, CallDown, DataPathChanged, CallUpdated]


def data_path_from_argv(argv: Optional[Sequence[str]]) -> DataPath:
    if not argv:
        return "unknown"
    if "pppol2tp.so" in argv or "pppol2tp" in argv:
        return "kernel"
    if any(a.startswith("/dev/pts/") or a.startswith("/dev/tty") for a in argv):
        return "userspace"
    return "unknown"


def _argv_int(argv: Sequence[str], name: str) -> Optional[int]:
    try:
        return int(argv[argv.index(name) + 1])
    except (ValueError, IndexError):
        return None


class Calls(Indexed[CallKey, CallInfo]):
    """An instance's calls by ``CallKey``, also by their pppd's pid (and those
    whose pppd is not known yet), so that a pppd's request finds its call
    in steps that do not grow with the calls known.  A call's pppd pid is
    set once (``Tracker.update_call``), which tells ``pppd_known``."""

    def __init__(self, calls: Sequence[CallInfo] = ()) -> None:
        super().__init__()
        # a pppd has one call but for a forged or reused line: its call's
        # key, bare, or its calls' keys from the second on (indexed.put)
        self.by_pppd: dict[int, Union[CallKey, Several]] = {}
        self.no_pppd: set[CallKey] = set()
        # pppd pid -> when a call first named it (monotonic), until a /proc
        # scan begun after that has judged it (forget_named)
        self.named: dict[int, float] = {}
        for c in calls:
            self[c.ref()] = c

    def _added(self, key: CallKey, c: CallInfo) -> None:
        if c.pppd_pid is None:
            self.no_pppd.add(key)
        else:
            self._link(c.pppd_pid, key)

    def _removed(self, key: CallKey, c: CallInfo) -> None:
        self.no_pppd.discard(key)
        if c.pppd_pid is not None:
            drop(self.by_pppd, c.pppd_pid, key)

    def _link(self, pid: int, key: CallKey) -> None:
        if put(self.by_pppd, pid, key):
            self.named.setdefault(pid, time.monotonic())

    def pppd_known(self, c: CallInfo) -> None:
        """``c``'s pppd pid was just set (it was None)."""
        key = c.ref()
        if self.get(key) is c and c.pppd_pid is not None:
            self.no_pppd.discard(key)
            self._link(c.pppd_pid, key)

    def named_since(self, pid: int, t: float) -> bool:
        """A call named pppd ``pid`` at or after ``t`` (monotonic)."""
        return self.named.get(pid, float("-inf")) >= t

    def forget_named(self, before: float) -> None:
        """A /proc scan begun at ``before`` has judged the pppds named earlier."""
        if self.named:
            self.named = {p: t for p, t in self.named.items() if t >= before}

    def of_pppd(self, pid: int) -> list[CallInfo]:
        return [self[k] for k in values_at(self.by_pppd, pid)]

    def without_pppd(self) -> list[CallInfo]:
        return [self[k] for k in self.no_pppd]


class Instance:
    """The model of one xl2tpd (one log stream / control pipe)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.daemon_pid: Optional[int] = None
        self.kernel_mode: Optional[bool] = None
        self.tunnels: dict[int, TunnelInfo] = {}
        self.calls = Calls()
        # LAC: outgoing calls not yet established, as (n-th "Calling on tunnel"
        # line, tunnel id).  xl2tpd gives each outgoing call the next serial
        # number right when it logs that line (global_serno, 1 at start), so
        # "Call established ... Serial: S" names its line once one pair of
        # (line number, serial) is known: the anchor.
        self.calling: list[tuple[int, int]] = []
        self.calling_seen = 0
        self.serial_anchor: Optional[tuple[int, int]] = None
        self.pending_argv: Optional[tuple[str, ...]] = None
        self.foreign_pids: set[int] = set()
        self.last_lac_call: Optional[CallKey] = None
        # the tunnel (its id and peer) whose calls a status dump lists next
        self.status_tunnel: Optional[int] = None
        self.status_peer: Optional[str] = None
        # Later live tunnels given the id of one in `tunnels`, to another peer:
        # xl2tpd draws its tunnel ids at random and does not check them against
        # its live tunnels.  Kept apart, so that neither one's calls get the
        # other's peer ids, and one's end does not end the other's calls.
        # (Not the data path's "twins": tunnels that share a peer's address and port.)
        self.clashes: dict[int, list[TunnelInfo]] = {}

    def with_id(self, tid: int) -> list[TunnelInfo]:
        """The live tunnels of id ``tid``: none, one, or more after a clash."""
        t = self.tunnels.get(tid)
        return [] if t is None else [t, *self.clashes.get(tid, ())]

    def all_tunnels(self) -> list[TunnelInfo]:
        return [*self.tunnels.values(), *(w for ws in self.clashes.values() for w in ws)]

    def tunnel_to(self, tid: int, peer: Optional[str]) -> Optional[TunnelInfo]:
        """Tunnel ``tid``; after a clash, the one to ``peer`` (none if none is)."""
        t = self.tunnels.get(tid)
        if t is None or peer is None or tid not in self.clashes or t.peer in (None, peer):
            return t
        return next((w for w in self.clashes[tid] if w.peer == peer), None)


def _names(t: TunnelInfo, peer: Optional[str], peer_tunnel_id: Optional[int]) -> bool:
    """Whether a report of ``t``'s id, naming ``peer`` and ``peer_tunnel_id``
    (either may be unknown), can be of ``t``: no known field tells them apart."""
    return all(x is None or y is None or x == y for x, y in ((t.peer, peer), (t.peer_tunnel_id, peer_tunnel_id)))


def _in_tunnel(c: CallInfo, t: TunnelInfo) -> bool:
    """Whether call ``c`` (of ``t``'s id) is ``t``'s, when ``t`` has a twin."""
    if c.peer_tunnel_id is not None and t.peer_tunnel_id is not None:
        return c.peer_tunnel_id == t.peer_tunnel_id
    return c.peer == t.peer


class Tracker:
    def __init__(self) -> None:
        self.instances: dict[str, Instance] = {}
        self.bad_lines = 0
        self.foreign_lines = 0
        self.disputes = 0  # calls given other peer ids by a second line for the same pppd
        self.notes: list[str] = []  # warnings for the owner to log (Discovery moves them to its warnings)
        # Is this pid (the xl2tpd a stream names) still running?  Discovery
        # answers from /proc (procscan.is_daemon); the pure tracker says no,
        # so a new pid is a restart, as in a replayed log.
        self.daemon_alive: Callable[[int], bool] = lambda pid: False
        # True while nobody will read the events (Discovery.refresh(events=False)):
        # the model is updated the same, but no event or snapshot copy is made.
        # A daemon starting on logs with 10,000 calls would otherwise build
        # 10,000 CallUp snapshots only to drop them (its memory peak).
        self.quiet = False

    def inst(self, name: str) -> Instance:
        if name not in self.instances:
            self.instances[name] = Instance(name)
        return self.instances[name]

    # ---- snapshot
    def tunnels(self) -> list[TunnelInfo]:
        return [t for i in self.instances.values() for t in i.all_tunnels()]

    def calls(self) -> list[CallInfo]:
        return [c for i in self.instances.values() for c in i.calls.values()]

    def calls_of_pppd(self, pid: int) -> list[CallInfo]:
        """The calls that name pppd ``pid`` (one, unless a forged line named it too)."""
        return [c for i in self.instances.values() for c in i.calls.of_pppd(pid)]

    # ---- helpers
    def _ev(self, make: Callable[[], Event]) -> list[Event]:
        return [] if self.quiet else [make()]

    def call_up(self, ins: Instance, c: CallInfo) -> list[Event]:
        """A new call in the model (from a log line, a status dump or the control pipe)."""
        ins.calls[c.ref()] = c
        return self._ev(lambda: CallUp(call=c.copy()))

    def tunnel_up(self, ins: Instance, t: TunnelInfo) -> list[Event]:
        same = ins.with_id(t.tunnel_id)
        have = next((x for x in same if _names(x, t.peer, t.peer_tunnel_id)), None)
        if same and have is None:
            ins.clashes.setdefault(t.tunnel_id, []).append(t)
            self.notes.append(
                f"{ins.name}: xl2tpd gave tunnel id {t.tunnel_id} to a second live tunnel (to {t.peer}, "
                f"peer tunnel {t.peer_tunnel_id}; the first is to {same[0].peer}, peer tunnel "
                f"{same[0].peer_tunnel_id}): the kernel holds one tunnel per id, so only one can be offloaded")
            return self._ev(lambda: TunnelUp(tunnel=t.copy()))
        if have is not None:
            for f in ("section", "peer_tunnel_id", "peer_port", "role"):
                if getattr(have, f) in (None, "unknown") and getattr(t, f) not in (None, "unknown"):
                    setattr(have, f, getattr(t, f))
            more = tuple(s for s in t.sources if s not in have.sources)
            if more:
                have.sources = shared_sources(have.sources + more)
            return []
        ins.tunnels[t.tunnel_id] = t
        return self._ev(lambda: TunnelUp(tunnel=t.copy()))

    def tunnel_down(self, ins: Instance, tid: int, reason: str, peer: Optional[str] = None,
                    peer_tunnel_id: Optional[int] = None) -> list[Event]:
        """Tunnel ``tid`` ended; after a clash, the one ``peer`` and
        ``peer_tunnel_id`` name (a report that names neither ends none)."""
        others = ins.clashes.get(tid)
        if others:
            if peer is None and peer_tunnel_id is None:
                self.notes.append(f"{ins.name}: tunnel {tid} ended ({reason}), but two live tunnels have that id "
                                  f"and the report does not say which: both kept until xl2tpd says more")
                return []
            t = next((x for x in ins.with_id(tid) if _names(x, peer, peer_tunnel_id)), None)
            if t is None:
                return []
            if t is ins.tunnels[tid]:
                ins.tunnels[tid] = others.pop(0)  # the one left is the id's tunnel now
            else:
                others.remove(t)
            if not others:
                del ins.clashes[tid]
            gone = [k for k, c in ins.calls.items() if c.tunnel_id == tid and _in_tunnel(c, t)]
        else:
            t = ins.tunnels.pop(tid, None)
            if t is None:
                return []
            gone = [k for k, c in ins.calls.items() if c.tunnel_id == tid]
        ev: list[Event] = []
        for k in gone:
            ev += self.call_down(ins, k, f"tunnel {tid} closed" + (f": {reason}" if reason else ""))
        ev += self._ev(lambda: TunnelDown(tunnel=t, reason=reason))
        if tid not in ins.tunnels:
            ins.calling = [e for e in ins.calling if e[1] != tid]  # its calls will never be established
        return ev

    def call_down(self, ins: Instance, key: CallKey, reason: str) -> list[Event]:
        c = ins.calls.pop(key, None)
        if c is None:
            return []
        if ins.last_lac_call == key:
            ins.last_lac_call = None
        return self._ev(lambda: CallDown(call=c, reason=reason))

    def all_down(self, ins: Instance, reason: str) -> list[Event]:
        ins.calling, ins.serial_anchor = [], None  # a new xl2tpd numbers its calls afresh
        ins.clashes = {}
        ev: list[Event] = []
        for tid in list(ins.tunnels):
            ev += self.tunnel_down(ins, tid, reason)
        for k in list(ins.calls):
            ev += self.call_down(ins, k, reason)
        return ev

    def update_call(self, c: CallInfo, **fields: object) -> list[Event]:
        changed: list[str] = []
        for k, v in fields.items():
            if k == "pppd_argv" and (c.pppd_pid is not None or fields.get("pppd_pid") is not None):
                continue  # its pppd is known: the argv has no use left (CallInfo.pppd_argv)
            if v is not None and getattr(c, k) in (None, "unknown") and getattr(c, k) != v:
                setattr(c, k, v)
                changed.append(k)
        if "pppd_pid" in changed:
            c.pppd_argv = None
            for ins in self.instances.values():  # the one that holds this very object
                ins.calls.pppd_known(c)
        return self._ev(lambda: CallUpdated(call=c.copy(), fields=changed)) if changed else []

    def _lac_call_tunnel(self, ins: Instance, peer: str, serial: int) -> Optional[int]:
        """The tunnel of an outgoing call from its serial number (see Instance.calling).

        With no anchor yet, only an unambiguous pending call (one towards
        this peer) is taken, and it sets the anchor.  The anchor is dropped
        when the numbers stop matching (a serial with no pending line, a
        different peer), when xl2tpd restarts and when the log is truncated
        (copytruncate can lose the lines written just before).  A "Calling on tunnel" line lost while the count still
        matches (syslog rate limiting) is not detectable from the log: then
        a call can get its neighbour's tunnel, and its PPP negotiation fails.  Several LAC sections
        dialling one LNS at once interleave their lines, so the last
        "Calling on tunnel" line is not necessarily this call's."""
        def peer_of(tid: int) -> Optional[str]:
            t = ins.tunnels.get(tid)
            return t.peer if t else None

        pick = None
        if ins.serial_anchor is not None:
            idx = ins.serial_anchor[0] + (serial - ins.serial_anchor[1])
            pick = next((e for e in ins.calling if e[0] == idx), None)
            if pick is None or peer_of(pick[1]) not in (None, peer):
                # no such pending line, or another peer's: a line was missed (or
                # the log restarted), so the count no longer tracks the serials
                pick = None
                ins.serial_anchor = None
        if pick is None:
            cands = [e for e in ins.calling if peer_of(e[1]) in (None, peer)]
            if len(cands) != 1:
                return None
            pick = cands[0]
        ins.calling.remove(pick)
        ins.serial_anchor = (pick[0], serial)
        return pick[1]

    def _tunnel_for_call(self, ins: Instance, peer: str) -> Optional[int]:
        cands = [t.tunnel_id for t in ins.all_tunnels() if t.peer == peer]
        return cands[0] if len(cands) == 1 else None

    # ---- log records
    def apply(self, instance: str, rec: lp.Record, source: str = "log") -> list[Event]:
        ins = self.inst(instance)
        if isinstance(rec, (lp.Unparsed,)):
            return []
        if isinstance(rec, lp.Malformed):
            self.bad_lines += 1
            return []
        sub = f"{instance}@{rec.pid}"
        if rec.pid is not None and rec.pid != ins.daemon_pid and sub in self.instances:
            # a second xl2tpd of this stream (or the one its control pipe
            # answers for): its lines stay its own, whatever the first one does
            return self.apply(sub, rec, source)
        if rec.pid is not None and ins.daemon_pid is not None and rec.pid != ins.daemon_pid:
            if self.daemon_alive(ins.daemon_pid) and self.daemon_alive(rec.pid):
                # a second system xl2tpd, running, logs to the same stream (two
                # instances, one syslog): tracked on its own, they never meet
                self.notes.append(f"{instance}: a second xl2tpd (pid {rec.pid}) writes here: tracked as {sub}")
                return self.apply(sub, rec, source)
            if self.daemon_alive(ins.daemon_pid):
                # the stream's xl2tpd still runs: anyone may have forged the
                # line (syslog takes any tag), or it is an exited second
                # xl2tpd's (a journal is read from the boot's start): never a restart
                self.foreign_lines += 1
                if rec.pid not in ins.foreign_pids:
                    ins.foreign_pids.add(rec.pid)
                    self.notes.append(f"{instance}: lines tagged xl2tpd[{rec.pid}] ignored: this stream's xl2tpd "
                                      f"is pid {ins.daemon_pid}, still running, and {rec.pid} is no running xl2tpd "
                                      f"(one that has exited, or a forger)")
                return []
            # another xl2tpd process writes to this stream: the old one is gone
            ev = self.all_down(ins, f"xl2tpd pid {ins.daemon_pid} replaced by {rec.pid}")
            ins.daemon_pid = rec.pid
            return ev + self.apply(instance, rec, source)
        if rec.pid is not None:
            ins.daemon_pid = rec.pid
        on = _ON_RECORD.get(type(rec))
        # PppdTerminating and the rest carry nothing the model needs
        return on(self, ins, instance, rec, source) if on is not None else []

    # ---- one method per record type (_ON_RECORD)
    def _on_started(self, ins: Instance, instance: str, rec: lp.Started, source: str) -> list[Event]:
        ins.calling, ins.calling_seen, ins.serial_anchor = [], 0, (0, 0)
        return []

    def _on_kernel_support(self, ins: Instance, instance: str, rec: lp.KernelSupport, source: str) -> list[Event]:
        ins.kernel_mode = rec.kernel
        return []

    def _on_daemon_exiting(self, ins: Instance, instance: str, rec: lp.DaemonExiting, source: str) -> list[Event]:
        ev = self.all_down(ins, f"xl2tpd exiting (signal {rec.signal})")
        ins.daemon_pid = None
        return ev

    def _on_tunnel_established(self, ins: Instance, instance: str, rec: lp.TunnelEstablished, source: str) -> list[Event]:
        role: Role = "lns" if rec.lns_section is not None else "lac"
        return self.tunnel_up(ins, TunnelInfo(
            instance=instance, role=role, section=rec.lns_section, peer=rec.peer, peer_port=rec.port,
            tunnel_id=rec.tunnel_id, peer_tunnel_id=rec.peer_tunnel_id, sources=(source,)))

    def _on_calling_on_tunnel(self, ins: Instance, instance: str, rec: lp.CallingOnTunnel, source: str) -> list[Event]:
        ins.calling_seen += 1
        ins.calling = ins.calling[-255:] + [(ins.calling_seen, rec.tunnel_id)]
        return []

    def _on_pppd_argv(self, ins: Instance, instance: str, rec: lp.PppdArgv, source: str) -> list[Event]:
        # LNS: the argv precedes its "Call established"; LAC: it follows
        if ins.last_lac_call is not None and ins.last_lac_call in ins.calls:
            c = ins.calls[ins.last_lac_call]
            ins.last_lac_call = None
            return self.update_call(c, pppd_argv=tuple(rec.argv), data_path=data_path_from_argv(rec.argv))
        ins.pending_argv = rec.argv
        return []

    def _on_call_established(self, ins: Instance, instance: str, rec: lp.CallEstablished, source: str) -> list[Event]:
        argv = ins.pending_argv
        ins.pending_argv = None
        tid = None
        role: Role = "unknown"
        if rec.tunnel_id is not None:  # outgoing call ("parameters:"): exact
            role, tid = "lac", rec.tunnel_id
            t0 = ins.tunnels.get(tid)
            rec = lp.CallEstablished(t0.peer if t0 else rec.peer, rec.call_id, rec.peer_call_id, rec.serial,
                                     rec.pppd_pid, tid, pid=rec.pid, ts=rec.ts)
        elif rec.pppd_pid is not None:
            role = "lns"
            if argv is not None and _argv_int(argv, "pppol2tp_session_id") == rec.call_id:
                tid = _argv_int(argv, "pppol2tp_tunnel_id")
        else:
            role = "lac"
            tid = self._lac_call_tunnel(ins, rec.peer, rec.serial)
            argv = None
        if tid is None:
            tid = self._tunnel_for_call(ins, rec.peer)
        t = ins.tunnel_to(tid, rec.peer) if tid is not None else None
        if t is not None and t.peer == rec.peer and t.peer is not rec.peer:
            # the tunnel's copy of the address: the call's own (and a table
            # of every address seen) would cost a string per call
            rec = dataclasses.replace(rec, peer=t.peer)
        key = CallKey(rec.peer, rec.call_id)
        old = ins.calls.get(key)
        ev = []
        # xl2tpd's control pipe may list a call before its line is read:
        # that line completes the call, it does not reuse its id
        listed_first = (old is not None and old.sources == ("control",) and old.pppd_pid is None
                        and old.peer == rec.peer and (tid is None or old.tunnel_id in (None, tid)))
        if old is not None and not listed_first and (
                rec.pppd_pid is not None and old.pppd_pid == rec.pppd_pid
                or rec.pppd_pid is None and old.role == "lac" and old.pppd_pid is None):
            # xl2tpd writes this line once per call, and a pppd serves one call
            # for its life: a second line for the same pppd (a LAC's names none:
            # for a call whose pppd has not shown yet) is no id reuse
            return self._dispute(old, rec)
        if old is not None and not listed_first:
            if tid is not None and old.tunnel_id not in (None, tid):
                # two live tunnels to one address, each with a call of this id:
                # the log names a call by id and address only, so the model
                # holds one of them, the later (usual after a lost end line)
                self.notes.append(
                    f"{ins.name}: xl2tpd gave call id {rec.call_id} to calls on two tunnels to {rec.peer} "
                    f"({old.tunnel_id} and {tid}): its log cannot tell them apart; the call on tunnel "
                    f"{old.tunnel_id} is no longer followed")
            ev += self.call_down(ins, key, "call id reused")
        elif old is not None and tid is None and old.tunnel_id is not None:
            # the line names only the address (several tunnels to it): the control pipe placed the call
            tid = old.tunnel_id
            t = ins.tunnel_to(tid, rec.peer)
        c = CallInfo(
            instance=instance, role=role if t is None else t.role, section=t.section if t else None,
            peer=rec.peer, peer_port=t.peer_port if t else None, tunnel_id=tid,
            peer_tunnel_id=t.peer_tunnel_id if t else None, call_id=rec.call_id, peer_call_id=rec.peer_call_id,
            serial=rec.serial, pppd_pid=rec.pppd_pid, pppd_argv=tuple(argv) if argv and rec.pppd_pid is None else None,
            data_path=data_path_from_argv(argv) if argv else ("kernel" if ins.kernel_mode else "unknown"),
            sources=(source,),
        )
        if rec.ts:
            c.since = rec.ts
        if role == "lac":
            ins.last_lac_call = key
        return ev + self.call_up(ins, c)

    def _dispute(self, c: CallInfo, rec: lp.CallEstablished) -> list[Event]:
        """A second ``Call established`` line for call ``c``'s pppd."""
        if (rec.peer, rec.peer_call_id, rec.serial) == (c.peer, c.peer_call_id, c.serial) or c.disputed:
            return []  # the same line again, or already disputed
        c.disputed = True
        self.disputes += 1
        pppd = c.pppd_pid or "(not yet known)"
        self.notes.append(
            f"{c.instance}: two lines give call {c.call_id} of pppd {pppd} other peers (peer call "
            f"{c.peer_call_id} at {c.peer}, then {rec.peer_call_id} at {rec.peer}): one of them is forged; the call "
            f"is not offloaded (one offloaded already keeps the ids it was given)")
        return self._ev(lambda: CallUpdated(call=c.copy(), fields=["disputed"]))

    def _on_status_tunnel(self, ins: Instance, instance: str, rec: lp.StatusTunnel, source: str) -> list[Event]:
        ins.status_tunnel, ins.status_peer = rec.tunnel_id, rec.peer
        return self.tunnel_up(ins, TunnelInfo(
            instance=instance, section=rec.section, peer=rec.peer, peer_port=rec.port,
            tunnel_id=rec.tunnel_id, peer_tunnel_id=rec.peer_tunnel_id, sources=(source + ":status",)))

    def _on_status_call(self, ins: Instance, instance: str, rec: lp.StatusCall, source: str) -> list[Event]:
        tid = ins.status_tunnel
        t = ins.tunnel_to(tid, ins.status_peer) if tid is not None else None
        peer = t.peer if t is not None else ins.status_peer
        known = ins.calls.get(CallKey(peer, rec.call_id)) if peer is not None else None
        if known is not None:
            return self.update_call(known, tunnel_id=tid, peer_tunnel_id=t.peer_tunnel_id if t else None,
                                    peer_port=t.peer_port if t else None, section=rec.section,
                                    peer_call_id=rec.peer_call_id, serial=rec.serial)
        if t is None:
            return []
        c = CallInfo(instance=instance, role=t.role, section=rec.section, peer=t.peer, peer_port=t.peer_port,
                     tunnel_id=tid, peer_tunnel_id=t.peer_tunnel_id, call_id=rec.call_id,
                     peer_call_id=rec.peer_call_id, serial=rec.serial,
                     data_path="kernel" if ins.kernel_mode else "unknown", sources=(source + ":status",))
        return self.call_up(ins, c)

    def _on_tunnel_closed(self, ins: Instance, instance: str, rec: lp.TunnelClosed, source: str) -> list[Event]:
        tid = rec.tunnel_id
        if tid is None and rec.peer_tunnel_id is not None:
            m = [t.tunnel_id for t in ins.all_tunnels() if t.peer_tunnel_id == rec.peer_tunnel_id and t.peer == rec.peer]
            tid = m[0] if len(m) == 1 else None
        return self.tunnel_down(ins, tid, rec.reason, rec.peer, rec.peer_tunnel_id) if tid is not None else []

    def _on_max_retries(self, ins: Instance, instance: str, rec: lp.MaxRetries, source: str) -> list[Event]:
        return self.tunnel_down(ins, rec.tunnel_id, "maximum retries exceeded")

    def _on_call_closed(self, ins: Instance, instance: str, rec: lp.CallClosed, source: str) -> list[Event]:
        reason = rec.reason or "call closed"
        if rec.call_id is not None and rec.peer is not None:
            return self.call_down(ins, CallKey(rec.peer, rec.call_id), reason)
        # the lines that name no address: a call they name by ids shared
        # with another live call (ours or the peer's) is left to its other lines
        if rec.call_id is not None:
            m = [k for k, c in ins.calls.items()
                 if c.call_id == rec.call_id and rec.peer_call_id in (None, c.peer_call_id)]
        elif rec.peer_call_id is not None:
            m = [k for k, c in ins.calls.items() if c.peer_call_id == rec.peer_call_id]
        elif rec.serial is not None:
            m = [k for k, c in ins.calls.items() if c.serial == rec.serial and c.peer == rec.peer]
        else:
            return []
        return self.call_down(ins, m[0], reason) if len(m) == 1 else []

    # ---- facts from other sources
    def find_call(self, instance: str, tunnel_id: int, call_id: int) -> Optional[CallInfo]:
        """Call ``call_id`` of tunnel ``tunnel_id`` (the kernel's names for it)."""
        ins = self.instances.get(instance)
        if ins is None:
            return None
        found = (ins.calls.get(CallKey(t.peer, call_id)) for t in ins.with_id(tunnel_id))
        return next((c for c in found if c is not None and c.tunnel_id in (None, tunnel_id)), None)

    def observe_pppd(self, instance: str, key: CallKey, pid: int) -> list[Event]:
        ins = self.inst(instance)
        c = ins.calls.get(key)
        return self.update_call(c, pppd_pid=pid) if c else []

    def observe_data_path(self, instance: str, key: CallKey, path: DataPath) -> list[Event]:
        ins = self.inst(instance)
        c = ins.calls.get(key)
        if c is None or path == "unknown" or c.data_path == path:
            return []
        old = c.data_path
        c.data_path = path
        if old == "unknown":
            return self._ev(lambda: CallUpdated(call=c.copy(), fields=["data_path"]))
        c.path_changed = round(time.time(), 3)
        return self._ev(lambda: DataPathChanged(call=c.copy(), old=old, new=path))


# Tracker.apply's dispatch: a record's type -> the method that applies it
_ON_RECORD: dict[type, Callable[..., list[Event]]] = {
    lp.Started: Tracker._on_started,
    lp.KernelSupport: Tracker._on_kernel_support,
    lp.DaemonExiting: Tracker._on_daemon_exiting,
    lp.TunnelEstablished: Tracker._on_tunnel_established,
    lp.CallingOnTunnel: Tracker._on_calling_on_tunnel,
    lp.PppdArgv: Tracker._on_pppd_argv,
    lp.CallEstablished: Tracker._on_call_established,
    lp.StatusTunnel: Tracker._on_status_tunnel,
    lp.StatusCall: Tracker._on_status_call,
    lp.TunnelClosed: Tracker._on_tunnel_closed,
    lp.MaxRetries: Tracker._on_max_retries,
    lp.CallClosed: Tracker._on_call_closed,
}
