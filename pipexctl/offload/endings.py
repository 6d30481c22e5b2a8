"""How offloaded calls and tunnels end: on exits, not on log lines.

Discovery reports ends from xl2tpd's log, which anyone can write to; the
service acts on one only when an exit confirms it -- the call's pppd (its
kernel session goes with pppd's PPPoL2TP socket anyway), or the tunnel's
xl2tpd -- both watched through pidfds (exits.py).  ``sweep`` (every half
second) acts on exits with or without discovery's word, and warns about an
end no exit confirmed within UNCONFIRMED_AFTER.  A mixin of OffloadService.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

from .. import errors
from ..discovery.state import CallDown, Event, TunnelDown
from .ptys import call_key

if TYPE_CHECKING:
    from ..orchestrator import Orchestrator
    from .datapath import DataPath
    from .exits import Exits
    from .ptys import PtyHolder
    from .service import TunnelKey, TunnelState, TunnelTable
    from .statefile import SessionRecord

log = logging.getLogger("pipexctl.serve")

# an end discovery reported that no exit confirmed within this: warned about
UNCONFIRMED_AFTER = 10.0


class Endings:
    # OffloadService's, whose part this is (declared for the type checker)
    lock: threading.RLock
    tunnels: "TunnelTable"
    awaiting: dict[tuple[str, int, Optional[int]], tuple[float, str]]
    stats: dict[str, int]
    orch: "Orchestrator"
    datapath: "DataPath"
    exits: "Exits"
    ptys: "PtyHolder"
    save: Callable[..., None]
    write_saved: Callable[[], None]
    write_later: Callable[[], None]

    def _end_call(self, ts: "TunnelState", call_id: int, why: str, delete: bool = True) -> None:
        """Remove an offloaded session (``delete``: from the kernel too; it is
        gone already when its pppd closed the channel)."""
        rec = ts.records.pop(call_id, None)
        if rec is None:
            return
        self.exits.unwatch(rec.pppd_pid)
        self.ptys.release(call_key(ts.instance, ts.tunnel_id, call_id))
        if delete:
            self.gone_ok(lambda: self.orch.delete_session(ts.tunnel_id, call_id))
        self.stats["removed"] += 1
        log.info("call %d of tunnel %d %s", call_id, ts.tunnel_id, why,
                 extra={"journal": {"TUNNEL_ID": ts.tunnel_id, "CALL_ID": call_id, "PEER": ts.peer,
                                    "PPPD_PID": rec.pppd_pid, "EVENT": "ended"}})

    def _xl2tpd_gone(self, ts: "TunnelState") -> bool:
        return ts.xl2tpd_pid is not None and not self.exits.alive(ts.xl2tpd_pid, "xl2tpd")

    def _confirmed(self, ts: "TunnelState", rec: "SessionRecord") -> bool:
        """A call's end is confirmed by its pppd's exit or its xl2tpd's: a log
        line alone (anyone can write one) never ends a running call."""
        return not self.exits.alive(rec.pppd_pid) or self._xl2tpd_gone(ts)

    # ---------------------------------------------------------- endings
    def drop_tunnel(self, key: TunnelKey, reason: str, sync: bool = True) -> None:
        """Remove a tunnel and its sessions; ``sync=False``: the caller writes the state file."""
        ts = self.tunnels.pop(key, None)
        if ts is None:
            return
        for cid, rec in ts.records.items():
            self.ptys.release(call_key(ts.instance, ts.tunnel_id, cid))
            self.exits.unwatch(rec.pppd_pid)
        ts.records.clear()
        if ts.xl2tpd_pid is not None:
            self.exits.unwatch(ts.xl2tpd_pid)
        # pppds hold copies of the socket, so closing ours is not enough
        self.gone_ok(lambda: self.orch.delete_tunnel(ts.tunnel_id))
        if ts.sock is not None:
            self.datapath.close_tunnel(ts.sock, ts.tunnel_id)
        log.info("tunnel %d removed (%s)", ts.tunnel_id, reason,
                 extra={"journal": {"TUNNEL_ID": ts.tunnel_id, "PEER": ts.peer, "EVENT": "tunnel-removed"}})
        if sync:
            self.save()

    def _drop_when_empty(self, ts: "TunnelState", why: Optional[str]) -> bool:
        """The one rule for a tunnel left without calls: it goes when there is
        a reason (discovery reported its end, or it was made for a call that
        never started); the caller writes the state file."""
        key = (ts.instance, ts.tunnel_id)
        if why is None or ts.records or self.tunnels.get(key) is not ts:
            return False
        self.drop_tunnel(key, why, sync=False)
        return True

    @staticmethod
    def gone_ok(fn: Callable[[], object]) -> None:
        errors.gone_ok(fn, log)

    def handle(self, events: list[Event]) -> None:
        with self.lock:
            for e in events:
                try:
                    self.on_event(e)
                except Exception:  # one event's failure does not lose the ones after it
                    log.exception("acting on %s failed", type(e).__name__)
        self.write_saved()  # after the lock: offloads would wait for the lock through the write

    def on_event(self, e: Event) -> None:
        """Discovery's word that a call or tunnel ended, acted on once an
        exit confirms it (``sweep`` finishes what waits for one)."""
        if isinstance(e, CallDown):
            tid = e.call.tunnel_id
            ts = self.tunnels.get((e.call.instance, tid)) if tid is not None else None
            rec = ts.records.get(e.call.call_id) if ts else None
            if ts is None or rec is None:
                if ts is not None:
                    self.ptys.release(call_key(ts.instance, ts.tunnel_id, e.call.call_id))
                return
            if e.call.pppd_pid and rec.pppd_pid != e.call.pppd_pid:
                # the end of an earlier call with this id (xl2tpd reused it and
                # the new call was offloaded first): not this session's end
                log.info("call %d of tunnel %d: end of pppd %d's call, not of pppd %d's: kept", e.call.call_id,
                         ts.tunnel_id, e.call.pppd_pid, rec.pppd_pid)
                return
            if not self._confirmed(ts, rec):
                # usual for a real end too (xl2tpd has just signalled pppd): a
                # warning only if pppd still runs after UNCONFIRMED_AFTER (sweep)
                self.awaiting[(ts.instance, ts.tunnel_id, e.call.call_id)] = (time.monotonic(), e.reason)
                log.info("call %d of tunnel %d: discovery says it ended (%s), but its pppd %d runs: kept "
                         "until pppd exits", e.call.call_id, ts.tunnel_id, e.reason, rec.pppd_pid)
                return
            self._end_call(ts, e.call.call_id, f"ended ({e.reason}): offload removed")
            self._drop_when_empty(ts, ts.down)
            self.save(now=False)
        elif isinstance(e, TunnelDown):
            key = (e.tunnel.instance, e.tunnel.tunnel_id)
            ts = self.tunnels.get(key)
            if ts is None:
                return
            if e.tunnel.peer_tunnel_id and e.tunnel.peer_tunnel_id != ts.peer_tunnel_id:
                log.info("tunnel %d: end of the earlier tunnel with this id (peer id %d, ours is %d): kept",
                         ts.tunnel_id, e.tunnel.peer_tunnel_id, ts.peer_tunnel_id)
                return
            for cid in [c for c, r in ts.records.items() if self._confirmed(ts, r)]:
                self._end_call(ts, cid, f"ended ({e.reason}): offload removed")
            if ts.records:
                ts.down = e.reason
                self.awaiting[(ts.instance, ts.tunnel_id, None)] = (time.monotonic(), e.reason)
                log.info("tunnel %d: discovery says it ended (%s), but pppd(s) %s run: kept until they exit",
                         ts.tunnel_id, e.reason, ", ".join(str(r.pppd_pid) for r in ts.records.values()))
            else:
                self.drop_tunnel(key, e.reason, sync=False)
            self.save(now=False)

    def tick(self) -> None:
        """Every half second (the watcher): a firewall reload may have flushed
        the twins' steering; a watched process may have exited."""
        self.datapath.check()
        self.sweep()
        self.write_later()  # a change recorded by any other path and not written yet

    def busy(self) -> bool:
        """Something needs the watcher's half-second round: a twins' table to
        keep, or an end that no exit has confirmed yet."""
        return bool(self.awaiting) or self.datapath.watching()

    def sweep(self) -> None:
        """Act on exits: a pppd's ends its session, an xl2tpd's its tunnels, and
        a tunnel discovery said ended goes with its last pppd.  An end that no
        exit confirmed within UNCONFIRMED_AFTER is warned about (a forged log
        line, or a pppd that ignores xl2tpd's SIGTERM)."""
        if self.awaiting:
            self._warn_unconfirmed()
        dead = self.exits.exited()  # once: the watched pids that have exited
        if not dead:
            return
        with self.lock:
            changed = False
            for key, ts in list(self.tunnels.items()):
                if ts.xl2tpd_pid in dead:
                    self.drop_tunnel(key, f"xl2tpd pid {ts.xl2tpd_pid} exited", sync=False)
                    changed = True
                    continue
                for cid in [c for c, r in ts.records.items() if r.pppd_pid in dead]:
                    self._end_call(ts, cid, f"ended (pppd {ts.records[cid].pppd_pid} exited): offload removed")
                    changed = True
                changed |= self._drop_when_empty(ts, ts.down)
            if changed:
                self.save(now=False)
        self.write_saved()

    def _warn_unconfirmed(self) -> None:
        now = time.monotonic()
        with self.lock:
            for key, (since, reason) in list(self.awaiting.items()):
                inst, tid, cid = key
                ts = self.tunnels.get((inst, tid))
                rec = ts.records.get(cid) if ts is not None and cid is not None else None
                if ts is None or (cid is not None and rec is None) or (cid is None and ts.down is None):
                    del self.awaiting[key]  # confirmed meanwhile
                elif now - since >= UNCONFIRMED_AFTER:
                    del self.awaiting[key]
                    self.stats["unconfirmed_ends"] += 1
                    what = f"call {cid} of tunnel {tid}" if cid is not None else f"tunnel {tid}"
                    log.warning("%s: discovery said %.0f s ago that it ended (%s), but no exit confirms it: kept "
                                "(a forged log line?)", what, now - since, reason)

