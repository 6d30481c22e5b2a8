"""The offload service: the kernel objects of offloaded calls, made and ended.

For one call discovery has matched to a pppd:

1. the tunnel's UDP socket, made as xl2tpd's kernel mode makes it: on
   xl2tpd's address and port, connected to the peer (datapath.py; what the
   kernel passes up on it is relayed to xl2tpd);
2. a kernel L2TPv2 tunnel on it (xl2tpd's tunnel ids);
3. the kernel PPP session (xl2tpd's call ids; LNS mode on the LNS);
4. a PPPoL2TP socket connected to it, handed to pppd.

The steps run in one Orchestrator transaction: any failure, the hand-off
to pppd included, undoes every step made so far.  pppd gets the PPPoL2TP
socket and a copy of the tunnel's socket, so the kernel session ends when
pppd does and the tunnel outlives the daemon while any of its pppds runs.
When discovery reports a call gone its session is removed; when it reports
the tunnel gone, the kernel tunnel (and a twin's steering) too.  What the
service made is recorded in the state file (statefile.py; reconcile.py
adopts it after a restart).
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .. import errors
from ..discovery.state import CallDown, CallInfo, TunnelDown
from ..kernel.backend import KernelBackend, PPPChannel
from ..model import Encap, PwType, Session, SessionSpec, Tunnel, TunnelSpec
from ..orchestrator import Orchestrator, Transaction
from . import statefile
from .datapath import DataPath
from .ptys import PtyHolder
from .statefile import SessionRecord, TunnelRecord
from .watch import CallWatch

log = logging.getLogger("pipexctl.serve")

# Failpoints for the fault tests (tests/kernel/test_faults.py): with
# PIPEXCTL_FAILPOINT=<name> in its environment the daemon kills itself with
# SIGKILL at that point of the offload sequence, as a crash or an OOM kill
# there would.  Unset (always, in production) they cost one set lookup.
FAILPOINTS = ("tunnel-created", "session-created", "channel-connected", "state-saved", "channel-sent")

# hand_off(meta, fds): sends the channel (fds[0]) and the tunnel's socket to pppd
HandOff = Callable[[dict, list], None]


def _failpoints() -> frozenset:
    names = frozenset(n for n in os.environ.get("PIPEXCTL_FAILPOINT", "").split(",") if n)
    unknown = names - set(FAILPOINTS)
    if unknown:
        raise errors.InvalidArgumentError(f"PIPEXCTL_FAILPOINT: unknown {', '.join(sorted(unknown))} "
                                          f"(known: {', '.join(FAILPOINTS)})")
    return names


def reason_label(e: Exception) -> str:
    """A metrics label for an error: ConflictError -> conflict."""
    n = type(e).__name__.removesuffix("Error") or "error"
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(n))


@dataclass
class TunnelState:
    instance: str
    tunnel_id: int
    peer_tunnel_id: int
    local: str
    peer: str
    peer_port: int
    sock: Optional[socket.socket]  # None: adopted, and no pppd copy could be taken back
    local_port: int
    records: dict[int, SessionRecord] = field(default_factory=dict)  # by call id: the offloaded sessions

    def record(self) -> TunnelRecord:
        return TunnelRecord(instance=self.instance, tunnel_id=self.tunnel_id, peer_tunnel_id=self.peer_tunnel_id,
                            local=self.local, peer=self.peer, peer_port=self.peer_port,
                            local_port=self.local_port, sessions=[self.records[c] for c in sorted(self.records)])


class OffloadService:
    def __init__(self, watch: CallWatch, backend: KernelBackend, datapath: DataPath, *, state_path: str,
                 xl2tpd_port: int = 1701, teardown_on_exit: bool = False) -> None:
        self.watch, self.backend, self.datapath = watch, backend, datapath
        self.orch = Orchestrator(backend)
        self.state_path, self.xl2tpd_port, self.teardown_on_exit = state_path, xl2tpd_port, teardown_on_exit
        # what the service made (tunnels, kernel, state file); taken before
        # watch.lock when both are needed, so parsing logs (slow under
        # emulation) never delays an offload, and an offload never delays parsing
        self.lock = threading.RLock()
        self.tunnels: dict[tuple[str, int], TunnelState] = {}
        self.ptys = PtyHolder()
        self.stats = {"offloaded": 0, "refused": 0, "failed": 0, "removed": 0, "adopted": 0, "orphans_removed": 0}
        self.reasons: collections.Counter = collections.Counter()  # (refused|failed, reason) -> count
        self.latencies: collections.deque = collections.deque(maxlen=1000)  # request -> fd sent, seconds
        self._clock = threading.Lock()  # counters bumped by concurrent request threads
        self.last_reconcile: dict = {}
        self.reconciles = 0
        self.max_session_series = 1000  # per-session counters in metrics() beyond this are summed, not listed
        self._mbackend: Optional[KernelBackend] = None  # metrics' own netlink socket: a scrape never waits for lock
        self._mlock = threading.Lock()
        self.failpoints = _failpoints()

    def failpoint(self, name: str) -> None:
        if name in self.failpoints:
            log.warning("failpoint %s: SIGKILL", name)
            for h in logging.getLogger().handlers:
                h.flush()
            os.kill(os.getpid(), 9)

    # ---------------------------------------------------------- counters
    def refused(self, reason: str) -> None:
        with self._clock:
            self.stats["refused"] += 1
            self.reasons[("refused", reason)] += 1

    def failed(self, e: Exception) -> None:
        with self._clock:
            self.stats["failed"] += 1
            self.reasons[("failed", reason_label(e))] += 1

    def offloaded(self, seconds: float) -> None:
        with self._clock:
            self.stats["offloaded"] += 1
            self.latencies.append(seconds)

    def latencies_now(self) -> list[float]:
        with self._clock:
            return list(self.latencies)

    # ---------------------------------------------------------- the offload
    def offload(self, call: CallInfo, pppd_pid: Optional[int] = None, pty: Optional[str] = None,
                hand_off: Optional[HandOff] = None) -> tuple[PPPChannel, dict]:
        """Give ``call`` a kernel channel; all or nothing.

        ``hand_off(meta, fds)`` runs last, inside the transaction: if it
        raises, the session (and a tunnel made for it) is undone.  The caller
        closes the returned channel once pppd holds its copy."""
        with self.lock, self.orch.transaction() as tx:
            tx.on_rollback(self.save)  # registered first: runs last
            key = (call.instance, call.tunnel_id)
            ts = self.tunnels.get(key)
            if ts is not None and (ts.peer_tunnel_id, ts.peer, ts.peer_port) != (call.peer_tunnel_id, call.peer,
                                                                              call.peer_port or 1701):
                # xl2tpd picked the id of a tunnel whose end discovery has not
                # reported yet (its ids are random): that tunnel is gone
                self.drop_tunnel(key, f"its id {call.tunnel_id} now names a new tunnel to {call.peer}")
                ts = None
            if ts is None:
                ts = self._new_tunnel(call, tx)
            if call.call_id in ts.records and self._stale_session(ts, call.call_id):
                # the id of a call whose end discovery has not reported yet
                self._forget_session(ts, call.call_id, "its id was reused by a new call")
            if call.call_id in ts.records:
                raise errors.ConflictError(f"call {call.call_id} of tunnel {call.tunnel_id} is already offloaded")
            tx.create_session(SessionSpec(tunnel_id=ts.tunnel_id, session_id=call.call_id,
                                          peer_session_id=call.peer_call_id, version=2, pw_type=PwType.ppp,
                                          lns_mode=call.role == "lns"))
            self.failpoint("session-created")
            # what PPPoL2TP connect needs is known: no netlink round trip to read it back
            ch = tx.connect_ppp(Tunnel(tunnel_id=ts.tunnel_id, peer_tunnel_id=ts.peer_tunnel_id, version=2,
                                       encap=Encap.udp),
                                Session(tunnel_id=ts.tunnel_id, session_id=call.call_id,
                                        peer_session_id=call.peer_call_id, pw_type=PwType.ppp))
            self.failpoint("channel-connected")
            tx.on_rollback(lambda: ts.records.pop(call.call_id, None))
            ts.records[call.call_id] = SessionRecord(call_id=call.call_id, peer_call_id=call.peer_call_id,
                                                     pppd_pid=pppd_pid or call.pppd_pid or 1, role=call.role,
                                                     pty=pty)
            self.save()
            self.failpoint("state-saved")
            meta = {"tunnel_id": ts.tunnel_id, "peer_tunnel_id": ts.peer_tunnel_id, "session_id": call.call_id,
                    "peer_session_id": call.peer_call_id, "local": f"{ts.local}:{ts.local_port}",
                    "peer": f"{ts.peer}:{ts.peer_port}", "role": call.role}
            if hand_off is not None:
                # pppd also gets the tunnel's socket: the tunnel then outlives the daemon
                hand_off(meta, [ch.fileno()] + ([ts.sock.fileno()] if ts.sock is not None else []))
            return ch, meta

    def _new_tunnel(self, call: CallInfo, tx: Transaction) -> TunnelState:
        peer_port = call.peer_port or 1701
        local = self.datapath.local_for(call.peer, peer_port)
        # a second tunnel from the same peer address and port cannot have
        # xl2tpd's port too (Linux before 6.11 looks a data packet's session
        # up in the tunnel of the socket that received it): a private port
        twin = any((t.local, t.peer, t.peer_port, t.local_port) == (local, call.peer, peer_port, self.xl2tpd_port)
                   for t in self.tunnels.values())
        s = self.datapath.open(local, call.peer, peer_port, call.tunnel_id, twin)
        tx.on_rollback(lambda: self.datapath.close_tunnel(s, call.tunnel_id))
        tx.create_tunnel(TunnelSpec(tunnel_id=call.tunnel_id, peer_tunnel_id=call.peer_tunnel_id, version=2,
                                    fd=s.fileno()))
        key = (call.instance, call.tunnel_id)
        ts = self.tunnels[key] = TunnelState(call.instance, call.tunnel_id, call.peer_tunnel_id, local, call.peer,
                                             peer_port, s, s.getsockname()[1])
        tx.on_rollback(lambda: self.tunnels.pop(key, None))
        self.failpoint("tunnel-created")
        log.info("kernel tunnel %d/%d on %s:%d <-> %s:%d%s", ts.tunnel_id, ts.peer_tunnel_id, local, ts.local_port,
                 call.peer, peer_port, " (steered: another tunnel has this address pair)" if twin else "")
        return ts

    def _stale_session(self, ts: TunnelState, call_id: int) -> bool:
        """True when the kernel no longer has a session we recorded: its pppd
        closed the PPPoL2TP socket (it ended), whatever discovery says yet."""
        try:
            self.orch.session(ts.tunnel_id, call_id)
        except errors.NotFoundError:
            return True
        return False

    def _forget_session(self, ts: TunnelState, call_id: int, why: str) -> None:
        ts.records.pop(call_id, None)
        self.ptys.release((ts.instance, call_id))
        self.stats["removed"] += 1
        log.info("call %d of tunnel %d had ended (%s)", call_id, ts.tunnel_id, why)

    # ---------------------------------------------------------- endings
    def drop_tunnel(self, key, reason: str, sync: bool = True) -> None:
        """Remove a tunnel and its sessions; ``sync=False``: the caller writes the state file."""
        ts = self.tunnels.pop(key, None)
        if ts is None:
            return
        for cid in ts.records:
            self.ptys.release((ts.instance, cid))
        ts.records.clear()
        # pppds hold copies of the socket, so closing ours is not enough
        self.gone_ok(lambda: self.orch.delete_tunnel(ts.tunnel_id))
        if ts.sock is not None:
            self.datapath.close_tunnel(ts.sock, ts.tunnel_id)
        log.info("tunnel %d removed (%s)", ts.tunnel_id, reason)
        if sync:
            self.save()

    @staticmethod
    def gone_ok(fn) -> None:
        """Delete something that may already be gone (with its pppd or socket)."""
        try:
            fn()
        except errors.NotFoundError:
            pass
        except errors.PipexError as e:
            log.warning("%s", e)

    def handle(self, events: list) -> None:
        with self.lock:
            for e in events:
                self.on_event(e)

    def on_event(self, e) -> None:
        if isinstance(e, CallDown):
            key = (e.call.instance, e.call.tunnel_id)
            ts = self.tunnels.get(key)
            rec = ts.records.get(e.call.call_id) if ts else None
            if rec is not None and e.call.pppd_pid and rec.pppd_pid != e.call.pppd_pid:
                # the end of an earlier call with this id (xl2tpd reused it and
                # the new call was offloaded first): not this session's end
                log.info("call %d of tunnel %d: end of pppd %d's call, not of pppd %d's: kept", e.call.call_id,
                         ts.tunnel_id, e.call.pppd_pid, rec.pppd_pid)
                return
            self.ptys.release((e.call.instance, e.call.call_id))
            if ts and e.call.call_id in ts.records:
                del ts.records[e.call.call_id]
                self.gone_ok(lambda: self.orch.delete_session(ts.tunnel_id, e.call.call_id))
                self.stats["removed"] += 1
                log.info("call %d of tunnel %d ended (%s): offload removed", e.call.call_id, ts.tunnel_id, e.reason)
                self.save()
        elif isinstance(e, TunnelDown):
            key = (e.tunnel.instance, e.tunnel.tunnel_id)
            ts = self.tunnels.get(key)
            if ts is not None and e.tunnel.peer_tunnel_id and e.tunnel.peer_tunnel_id != ts.peer_tunnel_id:
                log.info("tunnel %d: end of the earlier tunnel with this id (peer id %d, ours is %d): kept",
                         ts.tunnel_id, e.tunnel.peer_tunnel_id, ts.peer_tunnel_id)
                return
            if ts is not None:
                self.drop_tunnel(key, e.reason)

    # ---------------------------------------------------------- state
    def save(self) -> None:
        try:
            statefile.save(self.state_path, statefile.State(tunnels=[t.record() for t in self.tunnels.values()]))
        except OSError as e:
            log.warning("cannot write state file %s: %s", self.state_path, e.strerror)

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
        with self._mlock:
            if self._mbackend is not None and self._mbackend is not self.backend:
                self._mbackend.close()
            self._mbackend = None
        self.datapath.close()

    def status(self) -> dict:
        with self.lock:
            return {
                "tunnels": [{"tunnel_id": t.tunnel_id, "peer_tunnel_id": t.peer_tunnel_id, "local": t.local,
                             "local_port": t.local_port, "steered": t.local_port != self.xl2tpd_port,
                             "peer": f"{t.peer}:{t.peer_port}",
                             "sessions": sorted(t.records), "holds_socket": t.sock is not None,
                             "pppd_pids": {c: r.pppd_pid for c, r in t.records.items()}}
                            for t in self.tunnels.values()],
                "stats": dict(self.stats),
                "datapath": self.datapath.stats(),
                "reconcile": self.last_reconcile,
                "channel_latency_ms": percentiles([x * 1000 for x in self.latencies_now()]),
            }

    def metrics(self) -> dict:
        """The numbers behind ``--metrics`` (Prometheus) and ``pipexctl stat --serve``.

        Calls known to discovery by role and data path; what the daemon owns;
        offload outcomes by reason; reconcile actions; the kernel's counters of
        each offloaded session (at most ``max_session_series`` listed, the
        rest summed), read through a netlink socket of its own."""
        calls = self.watch.paths()
        with self.lock:
            owned = {(t.tunnel_id, cid): t.peer for t in self.tunnels.values() for cid in t.records}
            n_tunnels = len(self.tunnels)
            with self._clock:
                stats, reasons = dict(self.stats), dict(self.reasons)
        sessions, error = [], None
        with self._mlock:
            try:
                if self._mbackend is None:
                    from ..kernel.backend import NetlinkBackend

                    self._mbackend = (NetlinkBackend(netns=self.backend.netns)
                                      if isinstance(self.backend, NetlinkBackend) else self.backend)
                sessions = [s for s in self._mbackend.session_dump() if (s.tunnel_id, s.session_id) in owned]
            except (errors.PipexError, OSError) as e:
                error = str(e)
        sessions.sort(key=lambda s: (s.tunnel_id, s.session_id))
        fields = ("rx_packets", "rx_bytes", "rx_errors", "tx_packets", "tx_bytes", "tx_errors")
        listed = [{"tunnel_id": s.tunnel_id, "session_id": s.session_id, "peer": owned[(s.tunnel_id, s.session_id)],
                   **{f: getattr(s.stats, f) for f in fields}} for s in sessions[: self.max_session_series]]
        rest = sessions[self.max_session_series:]
        return {
            "calls": [{"role": r, "data_path": d, "count": n} for (r, d), n in sorted(calls.items())],
            "offloaded_tunnels": n_tunnels,
            "offloaded_sessions": len(owned),
            "offload": {"offloaded": stats["offloaded"], "removed": stats["removed"],
                        "refused": {r: n for (k, r), n in sorted(reasons.items()) if k == "refused"},
                        "failed": {r: n for (k, r), n in sorted(reasons.items()) if k == "failed"}},
            "reconcile": {"runs": self.reconciles, "adopted": stats["adopted"],
                          "orphans_removed": stats["orphans_removed"]},
            "sessions": listed,
            "sessions_not_listed": {"count": len(rest), **{f: sum(getattr(s.stats, f) for s in rest) for f in fields}},
            "channel_latency_ms": percentiles([x * 1000 for x in self.latencies_now()]),
            "kernel_error": error,
            "datapath": self.datapath.stats(),
        }


def percentiles(xs: list[float]) -> dict:
    """p50/p99/max of request -> channel sent (the last 1,000 offloads)."""
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    return {"n": len(xs), "p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))], "max": xs[-1]}
