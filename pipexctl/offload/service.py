"""The offload service: the kernel objects of offloaded calls, made and ended.

For one call discovery has matched to a pppd:

1. the tunnel's UDP socket, made as xl2tpd's kernel mode makes it: on
   xl2tpd's address and port, connected to the peer (datapath.py; what the
   kernel passes up on it is relayed to xl2tpd);
2. a kernel L2TPv2 tunnel on it (xl2tpd's tunnel ids);
3. the kernel PPP session (xl2tpd's call ids; LNS mode on the LNS);
4. a PPPoL2TP socket connected to it, handed to pppd.

The steps run in one Orchestrator transaction: any failure undoes every
step made so far.  The hand-off to pppd follows without the service's
lock; if pppd does not take the channel, the call ends as any call ends.  pppd gets the PPPoL2TP
socket and a copy of the tunnel's socket, so the kernel session ends when
pppd does and the tunnel outlives the daemon while any of its pppds runs.
When discovery reports a call gone its session is removed; when it reports
the tunnel gone, the kernel tunnel (and a twin's steering) too.  What the
service made is recorded in the state file (statefile.py; reconcile.py
adopts it after a restart).
"""

from __future__ import annotations

import bisect
import collections
import errno
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Union

from .. import defaults, errors
from ..discovery.state import CallIds, CallInfo
from ..indexed import Indexed, Several, SmallIndexed, drop, put, values_at
from ..kernel.backend import KernelBackend, PPPChannel
from ..model import Encap, PwType, Session, SessionSpec, Tunnel, TunnelSpec
from ..orchestrator import Orchestrator, Transaction
from . import report, statefile
from .datapath import DataPath
from .endings import Endings
from .exits import Exits
from .ptys import PtyHolder
from .statefile import SessionRecord, TunnelRecord
from .watch import CallWatch

log = logging.getLogger("pipexctl.serve")

# Failpoints for the fault tests (tests/kernel/test_faults.py, test_trust.py):
# with PIPEXCTL_FAILPOINT=<name> in its environment the daemon kills itself
# with SIGKILL at that point of the offload sequence, as a crash or an OOM
# kill there would; <name>@<seconds> stalls there instead, as a daemon
# starved of CPU would.  Unset (always, in production) they cost one lookup.
FAILPOINTS = ("tunnel-created", "session-created", "channel-connected", "state-saved", "channel-sent")
# a live move's own points: the plugin acknowledged, the daemon has not said
# "committed"; the operator's undo written on the links, no answer read yet
MOVE_FAILPOINTS = ("move-acked", "undo-asked")

# seconds, request -> channel sent: Prometheus histogram bounds
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# hand_off(meta, fds): sends the channel (fds[0]) and the tunnel's socket to pppd
HandOff = Callable[[dict[str, Any], list[int]], None]


def _failpoints() -> dict[str, Optional[float]]:
    """name -> seconds to stall there, or None: SIGKILL there."""
    points: dict[str, Optional[float]] = {}
    for spec in filter(None, os.environ.get("PIPEXCTL_FAILPOINT", "").split(",")):
        name, _, secs = spec.partition("@")
        try:
            points[name] = float(secs) if secs else None
        except ValueError:
            raise errors.InvalidArgumentError(f"PIPEXCTL_FAILPOINT: {spec!r}: seconds must be a number") from None
    known = FAILPOINTS + MOVE_FAILPOINTS
    unknown = set(points) - set(known)
    if unknown:
        raise errors.InvalidArgumentError(f"PIPEXCTL_FAILPOINT: unknown {', '.join(sorted(unknown))} "
                                          f"(known: {', '.join(known)})")
    return points


def reason_label(e: Exception) -> str:
    """A metrics label for an error: ConflictError -> conflict."""
    n = type(e).__name__.removesuffix("Error") or "error"
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(n))


def schedstat_ns(text: bytes) -> Optional[tuple[int, int]]:
    """(ns on a CPU, ns runnable and waiting for one) from a thread's
    schedstat text; None when it does not parse."""
    try:
        on_cpu, runnable = text.split()[:2]
        return int(on_cpu), int(runnable)
    except ValueError:
        return None


def _sched() -> tuple[float, float]:
    """Seconds this thread has run on a CPU and waited, runnable, for one
    (its schedstat); without schedstat, its CPU time and 0."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            st = schedstat_ns(f.read())
        if st and st[0]:
            return st[0] / 1e9, st[1] / 1e9
    except OSError:
        pass
    return time.thread_time(), 0.0


class Records(SmallIndexed[int, SessionRecord]):
    """A tunnel's offloaded sessions by call id (most tunnels carry one);
    every change becomes a line of the state file's journal (its table's,
    once in one)."""

    __slots__ = ("_table", "_key")  # one per tunnel held: no __dict__

    def __init__(self, recs: Optional[dict[int, SessionRecord]] = None) -> None:
        super().__init__()
        self._table: Optional[TunnelTable] = None
        self._key: Optional[TunnelKey] = None
        for k, v in (recs or {}).items():
            self[k] = v

    def _added(self, call_id: int, rec: SessionRecord) -> None:
        if self._table is not None and self._key is not None:
            self._table.changed(self._key, self, statefile.session_line(*self._key, rec), 1)

    def _removed(self, call_id: int, rec: SessionRecord) -> None:
        if self._table is not None and self._key is not None:
            self._table.changed(self._key, self, statefile.end_line(*self._key, call_id), -1)


@dataclass(slots=True)
class TunnelState:
    instance: str
    tunnel_id: int
    peer_tunnel_id: int
    local: str
    peer: str
    peer_port: int
    sock: Optional[socket.socket]  # None: adopted, and no pppd copy could be taken back
    local_port: int
    records: Records = field(default_factory=Records)  # by call id: the offloaded sessions
    xl2tpd_pid: Optional[int] = None  # the verified parent of its pppds (None: not known, an old record)
    down: Optional[str] = None  # discovery said it ended while pppds still ran: why
    _made: bool = field(default=False, init=False, repr=False, compare=False)

    # what the state file says of the tunnel itself: written in its first
    # line only, so fixed once made
    FILE_FIELDS = frozenset({"instance", "tunnel_id", "peer_tunnel_id", "local", "peer", "peer_port", "local_port",
                             "xl2tpd_pid", "records"})

    def __post_init__(self) -> None:
        if not isinstance(self.records, Records):
            object.__setattr__(self, "records", Records(self.records))
        object.__setattr__(self, "_made", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in TunnelState.FILE_FIELDS and getattr(self, "_made", False):
            raise AttributeError(f"TunnelState.{name} is fixed once the tunnel is made (the state file has it)")
        object.__setattr__(self, name, value)

    def record(self) -> TunnelRecord:
        return TunnelRecord(instance=self.instance, tunnel_id=self.tunnel_id, peer_tunnel_id=self.peer_tunnel_id,
                            local=self.local, peer=self.peer, peer_port=self.peer_port,
                            local_port=self.local_port, sessions=list(self.records.values()),
                            xl2tpd_pid=self.xl2tpd_pid)


TunnelKey = tuple[str, int]  # (xl2tpd instance, tunnel id)
Addresses = tuple[str, str, int, int]  # local address, peer address and port, local port


class TunnelTable(Indexed[TunnelKey, TunnelState]):
    """The offloaded tunnels by (instance, tunnel id).  What costs as many
    steps as there are tunnels is kept up to date as they change, so an
    offload costs the same with 10 or 10,000 calls held: the state file's
    journal lines of the changes not yet snapshotted, the count of tunnels
    and sessions it describes, and the tunnels by peer address (the twin
    test)."""

    __slots__ = ("_lines", "_described", "_on")

    def __init__(self) -> None:
        super().__init__()
        self._lines: list[bytes] = []
        self._described = 0
        # peer address -> its tunnel, or its tunnels from the second on
        # (indexed.put): keyed by the tunnel's own string, where a key of all
        # four addresses would cost a tuple per tunnel held, for the rare twin
        self._on: dict[str, Union[TunnelState, Several]] = {}

    @staticmethod
    def _addresses(ts: TunnelState) -> Addresses:
        return (ts.local, ts.peer, ts.peer_port, ts.local_port)

    def _added(self, key: TunnelKey, ts: TunnelState) -> None:
        put(self._on, ts.peer, ts)
        ts.records._table, ts.records._key = self, key
        # an adopted tunnel comes with its sessions
        self._lines.append(statefile.tunnel_line(ts))
        self._lines.extend(statefile.session_line(*key, r) for r in ts.records.values())
        self._described += 1 + len(ts.records)

    def _removed(self, key: TunnelKey, ts: TunnelState) -> None:
        ts.records._table = ts.records._key = None
        drop(self._on, ts.peer, ts)
        self._lines.append(statefile.drop_line(*key))
        self._described -= 1 + len(ts.records)

    def changed(self, key: TunnelKey, records: Records, line: bytes, sessions: int) -> None:
        """A session of the tunnel at ``key`` was recorded (``sessions`` 1)
        or ended (-1); ``records``: that tunnel's own, ``line``: the change."""
        ts = self.get(key)
        if ts is not None and ts.records is records:
            self._lines.append(line)
            self._described += sessions

    def on_addresses(self, addresses: Addresses) -> int:
        """How many tunnels have these addresses and ports."""
        return sum(self._addresses(t) == addresses for t in values_at(self._on, addresses[1]))

    def journal(self) -> tuple[list[bytes], int]:
        """The journal lines of the changes since the last call, and how
        many tunnels and sessions the table holds."""
        lines, self._lines = self._lines, []
        return lines, self._described

    def whole(self) -> statefile.Whole:
        """Every tunnel with its sessions as they are now (the tunnels'
        file fields are fixed and the records frozen: the state file
        encodes them later, without the lock)."""
        return [(ts, tuple(ts.records.values())) for ts in self.values()]


class OffloadService(Endings):
    def __init__(self, watch: CallWatch, backend: KernelBackend, datapath: DataPath, *, state_path: str,
                 xl2tpd_port: int = defaults.L2TP_PORT, teardown_on_exit: bool = False) -> None:
        self.watch, self.backend, self.datapath = watch, backend, datapath
        self.orch = Orchestrator(backend)
        self.state_path, self.xl2tpd_port, self.teardown_on_exit = state_path, xl2tpd_port, teardown_on_exit
        self.state = statefile.Writer(state_path)
        # what the service made (tunnels, kernel, state file); taken before
        # watch.lock when both are needed, so parsing logs (slow under
        # emulation) never delays an offload, and an offload never delays parsing
        self.lock = threading.RLock()
        self.tunnels = TunnelTable()
        self.ptys = PtyHolder()
        self.exits = Exits()
        self.stats = {"offloaded": 0, "refused": 0, "failed": 0, "removed": 0, "adopted": 0, "orphans_removed": 0,
                      "unconfirmed_ends": 0, "moved": 0}
        self.reasons: collections.Counter[tuple[str, str]] = collections.Counter()  # (refused|failed, reason) -> count
        self.latencies: collections.deque[float] = collections.deque(maxlen=1000)  # request -> fd sent, seconds
        self.latency_hist = [0] * (len(LATENCY_BUCKETS) + 1)  # cumulative-free counts; the last is +Inf
        self.latency_sum = 0.0
        self.counter_lock = threading.Lock()  # counters bumped by concurrent request threads
        self.pty_reasons: dict[int, str] = {}  # pppd pid -> why it was not offloaded
        self.awaiting: dict[tuple[str, int, Optional[int]], tuple[float, str]] = {}  # ends reported, no exit yet: since, why
        self.last_reconcile: dict[str, Any] = {}
        self.reconciles = 0
        self.max_session_series = 1000  # per-session counters in metrics() beyond this are summed, not listed
        self.metrics_backend: Optional[KernelBackend] = None  # metrics' own netlink socket: a scrape never waits for lock
        self.metrics_lock = threading.Lock()
        self.failpoints = _failpoints()
        self._write_warned = float("-inf")

    def failpoint(self, name: str) -> None:
        if name in self.failpoints:
            stall = self.failpoints[name]
            if stall is not None:
                log.warning("failpoint %s: stalling %.1f s", name, stall)
                time.sleep(stall)
                return
            log.warning("failpoint %s: SIGKILL", name)
            for h in logging.getLogger().handlers:
                h.flush()
            os.kill(os.getpid(), 9)

    # ---------------------------------------------------------- counters
    def refused(self, reason: str, pid: Optional[int] = None) -> None:
        with self.counter_lock:
            self.stats["refused"] += 1
            self.reasons[("refused", reason)] += 1
            self._why_pty(pid, reason)

    def failed(self, e: Exception, pid: Optional[int] = None) -> None:
        label = "out_of_fds" if getattr(e, "errno", None) in (errno.EMFILE, errno.ENFILE) else reason_label(e)
        with self.counter_lock:
            self.stats["failed"] += 1
            self.reasons[("failed", label)] += 1
            self._why_pty(pid, label)

    def _why_pty(self, pid: Optional[int], reason: str) -> None:
        # why a pppd stayed on its pty, for `pipexctl status` (the last 1,000)
        if pid is not None:
            self.pty_reasons[pid] = reason
            while len(self.pty_reasons) > 1000:
                self.pty_reasons.pop(next(iter(self.pty_reasons)))

    def offloaded(self, seconds: float, moved: bool = False) -> None:
        """One more call offloaded (``moved``: a running call, from its pty)."""
        with self.counter_lock:
            self.stats["offloaded"] += 1
            self.stats["moved"] += moved
            self.latencies.append(seconds)
            self.latency_hist[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self.latency_sum += seconds

    def latencies_now(self) -> list[float]:
        with self.counter_lock:
            return list(self.latencies)

    # ---------------------------------------------------------- the offload
    def offload(self, call: CallInfo, pppd_pid: Optional[int] = None, pty: Optional[str] = None,
                hand_off: Optional[HandOff] = None, xl2tpd_pid: Optional[int] = None,
                timing: Optional[dict[str, float]] = None, moved: bool = False,
                unit: Optional[int] = None) -> tuple[PPPChannel, dict[str, Any]]:
        """Give ``call`` a kernel channel; all or nothing (``moved``: the call
        runs on its pty and its pppd swaps channels, the plugin's live move;
        ``unit``: its pppd's ppp unit, which the channel joins as soon as it
        exists, so the session's frames reach pppN while pppd has yet to
        swap; ``meta["unit"]`` says it did).

        ``pppd_pid`` and ``xl2tpd_pid`` (its verified parent) are watched:
        their exits, not log lines, end the session and the tunnel.

        The kernel objects and the record are made under ``self.lock`` in one
        transaction.  ``hand_off(meta, fds)`` then runs without the lock (it
        waits for pppd's acknowledgement, which would otherwise hold every
        other call's offload behind this pppd's scheduling): if it raises,
        the call is ended the way any offloaded call ends, and a tunnel made
        for it alone goes with it.  ``timing`` (if given) gets the seconds
        spent waiting for the lock, building (and of it on a CPU, and
        waiting for one), writing the state file and handing off.  The
        caller closes the returned channel once pppd holds its copy."""
        t = time.monotonic()
        tsock, dup_failed = -1, None
        try:
            with self.lock:
                # schedstat is a /proc read (3 syscalls) under the lock: only when asked for
                t_locked, sched_locked = time.monotonic(), _sched() if timing is not None else (0.0, 0.0)
                ch, meta, ts, rec, made_tunnel, snap = self._build(call, pppd_pid, pty, xl2tpd_pid, moved, unit)
                if hand_off is not None and ts.sock is not None:
                    # our own copy: the tunnel may be dropped (and its socket
                    # closed) by another thread while pppd is handed this one
                    try:
                        tsock = os.dup(ts.sock.fileno())
                    except OSError as e:  # out of fds: undone below, as a hand-off that failed
                        dup_failed = e
        except BaseException:
            self.write_saved()  # what the rollback recorded, written after the lock
            raise
        t_built, sched_built = time.monotonic(), _sched() if timing is not None else (0.0, 0.0)
        try:
            if dup_failed is not None:
                raise dup_failed
            # on disk before pppd holds the channel (a restart adopts only
            # recorded calls): a failed write fails the offload
            self.state.flush(snap)
            t_saved = time.monotonic()
            self.failpoint("state-saved")
            if hand_off is not None:
                # pppd also gets the tunnel's socket: the tunnel then outlives the daemon
                hand_off(meta, [ch.fileno()] + ([tsock] if tsock >= 0 else []))
        except BaseException:
            ch.close()
            with self.lock:
                # only this pppd's record: its call may have ended meanwhile, and xl2tpd given the id to a new one
                if ts.records.get(call.call_id) is rec:
                    self._end_call(ts, call.call_id, "not taken by its pppd: offload removed")
                self._drop_when_empty(ts, ts.down or (f"its first call {call.call_id} was not taken by its pppd"
                                                      if made_tunnel else None))
                self.save(now=False)
            self.write_saved()
            raise
        finally:
            if tsock >= 0:
                os.close(tsock)
        if timing is not None:
            # of the build: this thread on a CPU, and runnable but waiting for
            # one (the rest it slept: for the interpreter's lock or in the kernel)
            timing.update(lock=t_locked - t, build=t_built - t_locked, build_cpu=sched_built[0] - sched_locked[0],
                          build_runnable=sched_built[1] - sched_locked[1], state=t_saved - t_built,
                          hand_off=time.monotonic() - t_saved)
        return ch, meta

    def _build(self, call: CallInfo, pppd_pid: Optional[int], pty: Optional[str], xl2tpd_pid: Optional[int],
               moved: bool = False, unit: Optional[int] = None
               ) -> tuple[PPPChannel, dict[str, Any], TunnelState, SessionRecord, bool, int]:
        """The kernel objects and the record of ``call`` (caller holds the lock)."""
        ids = call.ids()
        if ids is None:
            raise errors.InvalidArgumentError(f"call {call.call_id}: its tunnel and peer ids are not all known")
        with self.orch.transaction() as tx:
            tx.on_rollback(lambda: self.save(now=False))  # registered first: runs last; written by offload()
            key = (call.instance, ids.tunnel_id)
            ts = self.tunnels.get(key)
            if ts is not None and (ts.peer_tunnel_id, ts.peer, ts.peer_port) != (call.peer_tunnel_id, call.peer,
                                                                              ids.peer_port):
                # xl2tpd picked the id of a tunnel whose end discovery has not
                # reported yet, or of a live one (its ids are random and not
                # checked).  The old one is replaced only when its pppds are
                # gone, or when xl2tpd's control pipe lists the new call and
                # no longer the old tunnel; otherwise this call is refused now
                # (the kernel holds one tunnel per id); pppd goes on on its pty unless
                # its plugin requires the offload.
                discovery = self.watch.discovery
                alive = [r.pppd_pid for r in ts.records.values() if self.exits.alive(r.pppd_pid)]
                if alive and discovery.listed_by_control(call, float("-inf")) is not True:
                    raise errors.ConflictError(
                        f"tunnel {call.tunnel_id} is offloaded to {ts.peer}:{ts.peer_port} (peer tunnel "
                        f"{ts.peer_tunnel_id}) and its pppd(s) {', '.join(map(str, alive))} run; the call names "
                        f"{call.peer} (peer tunnel {call.peer_tunnel_id}): not replaced")
                if alive and discovery.tunnel_listed(call.instance, ids.tunnel_id, ts.peer_tunnel_id) is not False:
                    raise errors.ConflictError(
                        f"xl2tpd gave tunnel id {call.tunnel_id} to a second live tunnel (to {call.peer}, peer "
                        f"tunnel {call.peer_tunnel_id}) while the offloaded one to {ts.peer}:{ts.peer_port} (peer "
                        f"tunnel {ts.peer_tunnel_id}, pppd(s) {', '.join(map(str, alive))}) lives: the kernel holds "
                        f"one tunnel per id, so this call is not offloaded")
                self.drop_tunnel(key, f"its id {call.tunnel_id} now names a new tunnel to {call.peer}", sync=False)
                ts = None
            made_tunnel = ts is None
            if ts is None:
                ts = self._new_tunnel(call, ids, tx, xl2tpd_pid)
            if call.call_id in ts.records and self._stale_session(ts, call.call_id):
                # the id of a call whose end discovery has not reported yet
                self._forget_session(ts, call.call_id, "its id was reused by a new call")
            if call.call_id in ts.records:
                raise errors.ConflictError(f"call {call.call_id} of tunnel {call.tunnel_id} is already offloaded")
            # what PPPoL2TP connect needs is known: no netlink round trip to
            # read it back, and nothing to build between create and connect
            # (the session drops what it receives until its socket is there)
            k_tunnel = Tunnel(tunnel_id=ts.tunnel_id, peer_tunnel_id=ts.peer_tunnel_id, version=2, encap=Encap.udp)
            k_session = Session(tunnel_id=ts.tunnel_id, session_id=call.call_id, peer_session_id=ids.peer_call_id,
                                pw_type=PwType.ppp)
            tx.create_session(SessionSpec(tunnel_id=ts.tunnel_id, session_id=call.call_id,
                                          peer_session_id=ids.peer_call_id, version=2, pw_type=PwType.ppp,
                                          lns_mode=call.role == "lns"))
            self.failpoint("session-created")
            # a move's channel goes under pppd's unit at once: the peer's frames
            # reach pppN, not a channel queue the plugin would drop at its swap
            ch = tx.connect_ppp(k_tunnel, k_session, unit)
            if ch.early:  # they came between the connect and the join: xl2tpd still carries the call
                n = self.datapath.pass_frames(ts.tunnel_id, call.call_id, ch.early)
                log.info("call %d: %d frame(s) from before its channel was under ppp%s passed to xl2tpd",
                         call.call_id, n, unit)
            self.failpoint("channel-connected")
            rec = SessionRecord(call_id=call.call_id, peer_call_id=ids.peer_call_id,
                                pppd_pid=pppd_pid or call.pppd_pid or 1, role=call.role, pty=pty, moved=moved,
                                since=round(time.time(), 3))
            self.exits.watch(rec.pppd_pid)
            tx.on_rollback(lambda: ts.records.pop(call.call_id, None))
            tx.on_rollback(lambda: self.exits.unwatch(rec.pppd_pid))
            ts.records[call.call_id] = rec
            # written by offload() without the lock, shared with the offloads running beside it
            snap = self.snapshot()
            meta = {"tunnel_id": ts.tunnel_id, "peer_tunnel_id": ts.peer_tunnel_id, "session_id": call.call_id,
                    "peer_session_id": ids.peer_call_id, "local": f"{ts.local}:{ts.local_port}",
                    "peer": f"{ts.peer}:{ts.peer_port}", "role": call.role}
            if unit is not None:
                meta["unit"] = unit
            return ch, meta, ts, rec, made_tunnel, snap

    def _new_tunnel(self, call: CallInfo, ids: CallIds, tx: Transaction, xl2tpd_pid: Optional[int]) -> TunnelState:
        peer_port = ids.peer_port
        local = self.datapath.local_for(call.peer, peer_port)
        # a second tunnel from the same peer address and port: the data path
        # decides where its socket goes (a private port before Linux 6.11)
        twin = self.tunnels.on_addresses((local, call.peer, peer_port, self.xl2tpd_port)) > 0
        s = self.datapath.open(local, call.peer, peer_port, ids.tunnel_id, twin)
        tx.on_rollback(lambda: self.datapath.close_tunnel(s, ids.tunnel_id))
        tx.create_tunnel(TunnelSpec(tunnel_id=ids.tunnel_id, peer_tunnel_id=ids.peer_tunnel_id, version=2,
                                    fd=s.fileno()))
        key = (call.instance, ids.tunnel_id)
        port = s.getsockname()[1]
        port = self.xl2tpd_port if port == self.xl2tpd_port else port  # most tunnels': one int object for them all
        ts = self.tunnels[key] = TunnelState(call.instance, ids.tunnel_id, ids.peer_tunnel_id, local, call.peer,
                                             peer_port, s, port, xl2tpd_pid=xl2tpd_pid)
        tx.on_rollback(lambda: self.tunnels.pop(key, None))
        if xl2tpd_pid is not None:
            self.exits.watch(xl2tpd_pid)
            tx.on_rollback(lambda: self.exits.unwatch(xl2tpd_pid))
        self.failpoint("tunnel-created")
        note = ""
        if twin:
            steered = "steered: " if ts.local_port != self.xl2tpd_port else ""
            note = f" ({steered}another tunnel has this address pair)"
        log.info("kernel tunnel %d/%d on %s:%d <-> %s:%d%s", ts.tunnel_id, ts.peer_tunnel_id, local, ts.local_port,
                 call.peer, peer_port, note,
                 extra={"journal": {"TUNNEL_ID": ts.tunnel_id, "PEER": call.peer, "EVENT": "tunnel-made"}})
        return ts

    def by_pppd(self) -> dict[int, tuple[TunnelKey, int]]:
        """The offloaded calls by pppd pid: (tunnel key, call id)."""
        with self.lock:
            return {rec.pppd_pid: (key, cid) for key, ts in self.tunnels.items() for cid, rec in ts.records.items()}

    def moved_back(self, key: TunnelKey, call_id: int, pppd_pid: int) -> None:
        """pppd ``pppd_pid``'s plugin moved its call back to the pty (the
        operator asked): the session went with the socket the plugin closed;
        the record ends, and a tunnel left without calls goes, so that
        xl2tpd's own socket takes the peer's packets again."""
        with self.lock:
            ts = self.tunnels.get(key)
            rec = ts.records.get(call_id) if ts is not None else None
            if ts is None or rec is None or rec.pppd_pid != pppd_pid:
                return  # ended meanwhile
            self._end_call(ts, call_id, "moved back to its pty (the operator asked)")
            self._drop_when_empty(ts, f"its last call {call_id} moved back to its pty")
            self.save(now=False)
            # discovery would learn it from its next kernel dump: say it now (status, the next move)
            with self.watch.lock:
                tracker = self.watch.discovery.tracker
                call = tracker.find_call(key[0], key[1], call_id)
                if call is not None:
                    tracker.observe_data_path(call.instance, call.ref(), "userspace")
        self.write_saved()

    def _stale_session(self, ts: TunnelState, call_id: int) -> bool:
        """True when the kernel no longer has a session we recorded: its pppd
        closed the PPPoL2TP socket (it ended), whatever discovery says yet."""
        try:
            self.orch.session(ts.tunnel_id, call_id)
        except errors.NotFoundError:
            return True
        return False

    def _forget_session(self, ts: TunnelState, call_id: int, why: str) -> None:
        self._end_call(ts, call_id, f"had ended ({why})", delete=False)

    # ---------------------------------------------------------- state
    def save(self, now: bool = True) -> None:
        """Record the state as it is now (the caller holds the lock: snapshots
        are numbered in the order the lock gives) and write it; ``now=False``:
        the caller writes it with ``write_saved`` once it has let go of the
        lock (ends need not be on disk at once: a restart forgets a record
        the kernel no longer has).  A failed write is logged."""
        n = self.snapshot()
        if now:
            self._write(n)

    def write_saved(self) -> None:
        """Write the newest recorded state if nobody has (no lock needed)."""
        self._write(self.state.newest())

    def write_later(self) -> None:
        """The watcher's round: write what is recorded and not yet on disk,
        never waiting for a write under way, with a pause after a failure."""
        failures = self.state.failures
        if self.state.stuck():
            with self.lock:  # a whole write is the only way on: queue one
                self.snapshot()
        try:
            wrote = self.state.flush_later()
        except OSError as e:
            self._write_failed(e)
            return
        if wrote and failures:
            log.info("state file %s written again (after %d failed write(s))", self.state_path, failures)

    def _write(self, n: int) -> None:
        try:
            self.state.flush(n)
        except OSError as e:
            self._write_failed(e)

    def _write_failed(self, e: OSError) -> None:
        # a full or failing disk: once at first, then once a minute (the watcher retries every round)
        now = time.monotonic()
        if self.state.failures <= 1 or now - self._write_warned >= 60.0:
            self._write_warned = now
            log.warning("cannot write state file %s: %s (%d failed write(s) in a row; retried)", self.state_path,
                        e.strerror, self.state.failures)

    def snapshot(self) -> int:
        """The changes made since the last snapshot, or now and then the
        whole state, to be written (the caller holds the lock)."""
        lines, described = self.tunnels.journal()
        try:
            whole = self.tunnels.whole() if self.state.wants_whole(described) else None
            return self.state.snapshot(lines, whole)
        except BaseException:
            self.state.rewrite()  # the lines taken are lost: only a whole write says everything again
            raise

    def shutdown(self) -> None:
        with self.lock:
            if not self.teardown_on_exit:
                # the kernel keeps the sessions and tunnels (pppd holds their
                # sockets); what the kernel passes up meanwhile waits in the
                # tunnel sockets for the next start, which adopts and relays them
                n = sum(len(t.records) for t in self.tunnels.values())
                for ts in self.tunnels.values():
                    if ts.sock is not None:
                        self.datapath.release(ts.sock)
                self.save()
                log.info("stopping: %d offloaded session(s) left running for the next start to adopt", n)
            else:
                for key in list(self.tunnels):
                    self.drop_tunnel(key, "pipexctl serve stopping", sync=False)
                self.save()
        with self.metrics_lock:
            if self.metrics_backend is not None and self.metrics_backend is not self.backend:
                self.metrics_backend.close()
            self.metrics_backend = None
        self.state.close()
        self.datapath.close()
        self.exits.close()

    def status(self) -> dict[str, Any]:
        return report.status(self)

    def status_chunks(self) -> Iterator[bytes]:
        """``status`` as JSON, in pieces of rows (what the status op sends as they come)."""
        return report.status_chunks(self)

    def metrics(self) -> dict[str, Any]:
        return report.metrics(self)
