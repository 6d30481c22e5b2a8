"""`pipexctl serve`: give a userspace-mode xl2tpd's pppd a kernel channel.

For a pppd that asks (the plugin, plugins/pipexctl.c), identified by
SO_PEERCRED and matched to its xl2tpd call through discovery:

1. the tunnel's UDP socket, made as xl2tpd's kernel mode makes it: on
   xl2tpd's address and port, connected to the peer (datapath.py; what the
   kernel passes up on it is relayed to xl2tpd);
2. a kernel L2TPv2 tunnel on it (xl2tpd's tunnel ids);
3. the kernel PPP session (xl2tpd's call ids; LNS mode on the LNS);
4. a PPPoL2TP socket connected to it, sent to pppd over SCM_RIGHTS.

Every step is undone if a later one fails.  pppd gets the PPPoL2TP socket
and a copy of the tunnel's UDP socket, so the kernel session ends when pppd
does and the tunnel outlives the daemon while any of its pppds runs.  When
discovery reports a call gone its session is removed; when it reports the
tunnel gone, the kernel tunnel (and a twin's steering) too.

What the daemon made is recorded in a state file (statefile.py).  A
restart reconciles: it adopts the sessions of live calls (taking the tunnel
socket back from a pppd with pidfd_getfd, and relaying it again) and removes
orphans.  SIGTERM leaves offloaded sessions
running unless ``teardown_on_exit``; SIGHUP asks xl2tpd (control pipe),
/proc and the kernel at once and reconciles the state file against them.

Run it in xl2tpd's network namespace (``ip netns exec NS pipexctl serve``).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import select
import socket
import struct
import threading
import time
import tty
from dataclasses import dataclass, field
from typing import Optional

from .. import errors
from ..discovery import procscan
from ..discovery.discovery import Discovery
from ..discovery.state import CallDown, CallInfo, TunnelDown
from ..kernel.pppol2tp import take_udp_socket
from ..model import Encap, PwType, Session, SessionSpec, Tunnel, TunnelSpec
from . import statefile
from .datapath import DataPath
from .statefile import SessionRecord, TunnelRecord

log = logging.getLogger("pipexctl.serve")

MAX_REQUEST = 4096

# Failpoints for the fault tests (tests/kernel/test_faults.py): with
# PIPEXCTL_FAILPOINT=<name> in its environment the daemon kills itself with
# SIGKILL at that point of the offload sequence, as a crash or an OOM kill
# there would.  Unset (always, in production) they cost one set lookup.
FAILPOINTS = ("tunnel-created", "session-created", "channel-connected", "state-saved", "channel-sent")


def _failpoints() -> frozenset:
    names = frozenset(n for n in os.environ.get("PIPEXCTL_FAILPOINT", "").split(",") if n)
    unknown = names - set(FAILPOINTS)
    if unknown:
        raise errors.InvalidArgumentError(f"PIPEXCTL_FAILPOINT: unknown {', '.join(sorted(unknown))} "
                                f"(known: {', '.join(FAILPOINTS)})")
    return names


class PtyHolder:
    """Keeps the ptys that offloaded pppds gave up open, raw and drained.

    xl2tpd (userspace mode) keeps the master end of each call's pty and
    select()s on it.  If no process held the slave end, every read would
    return EIO at once and xl2tpd would spin at 100 % CPU (measured: 97 % of
    a vCPU per offloaded side).  So the daemon holds the slave until the call
    ends; raw mode stops the line discipline from echoing what xl2tpd writes,
    and a thread reads and drops it so xl2tpd never blocks on a full pty.
    """

    def __init__(self) -> None:
        self._fds: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        threading.Thread(target=self._drain, name="pty-drain", daemon=True).start()

    def hold(self, key: tuple, fd: int) -> None:
        try:
            tty.setraw(fd)
        except OSError:
            pass
        os.set_blocking(fd, False)
        with self._lock:
            old = self._fds.pop(key, None)
            self._fds[key] = fd
        if old is not None:
            os.close(old)
        os.write(self._wake_w, b"x")

    def release(self, key: tuple) -> None:
        with self._lock:
            fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)
            os.write(self._wake_w, b"x")

    def keys(self) -> list[tuple]:
        with self._lock:
            return list(self._fds)

    def _drain(self) -> None:
        while True:
            with self._lock:
                fds = list(self._fds.values())
            try:
                r, _, _ = select.select([self._wake_r, *fds], [], [], 5)
            except (OSError, ValueError):
                continue  # an fd was closed under us: take the new list
            for fd in r:
                try:
                    os.read(fd, 65536)
                except OSError:
                    pass


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


def _ttyname(fd: Optional[int]) -> Optional[str]:
    try:
        name = os.ttyname(fd) if fd is not None else None
    except OSError:
        return None
    return name if name and name.startswith("/dev/pts/") else None


def _proc_comm(pid: int) -> Optional[tuple[str, int]]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.find("(") + 1: stat.rfind(")")], int(stat[stat.rfind(")") + 2:].split()[1])


OPS = ("status", "metrics", "reconcile", "channel")


def parse_request(data: bytes) -> tuple[Optional[str], Optional[str]]:
    """(op, None) for a valid request line, or (None, refusal reason).

    One JSON object with a known ``"op"``, at most MAX_REQUEST bytes; the
    rest of the object is ignored (the pppd is known by SO_PEERCRED, not by
    what it says).  Pure, so it is fuzzed on the host."""
    if len(data) > MAX_REQUEST:
        return None, "request_too_large"
    try:
        req = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, "malformed_request"
    if not isinstance(req, dict) or "op" not in req:
        return None, "malformed_request"
    if req["op"] not in OPS:
        return None, "unknown_op"
    return req["op"], None


def _reason(e: Exception) -> str:
    """A metrics label for an error: ConflictError -> conflict."""
    n = type(e).__name__.removesuffix("Error") or "error"
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(n))


def _percentiles(xs: list[float]) -> dict:
    """p50/p99/max of request -> channel sent (the last 1,000 offloads)."""
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    return {"n": len(xs), "p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))], "max": xs[-1]}


class OffloadServer:
    def __init__(self, socket_path: str, discovery: Discovery, backend, datapath: DataPath, *,
                 wait: float = 5.0, xl2tpd_port: int = 1701, log_interval: float = 0.2,
                 reconcile_interval: float = 5.0, state_path: Optional[str] = None,
                 teardown_on_exit: bool = False) -> None:
        self.socket_path, self.d, self.backend, self.datapath = socket_path, discovery, backend, datapath
        self.wait, self.xl2tpd_port = wait, xl2tpd_port
        self.state_path = state_path or os.path.join(os.path.dirname(socket_path) or ".", "state.json")
        self.teardown_on_exit = teardown_on_exit
        self.reload = threading.Event()
        self.last_reconcile: dict = {}
        self.latencies: collections.deque = collections.deque(maxlen=1000)  # request -> fd sent, seconds
        # Logs are cheap to follow; /proc and kernel scans are not (they cost CPU
        # that the data path needs), so they run rarely, and on demand while a
        # pppd waits for its channel.
        self.log_interval, self.reconcile_interval = log_interval, reconcile_interval
        # Two locks, always taken in this order when both are needed:
        # ``lock`` for what the daemon made (tunnels, kernel, state file),
        # ``dlock`` for discovery.  Parsing logs (slow under emulation) then
        # never delays an offload, and an offload never delays parsing.
        self.lock = threading.RLock()
        self.dlock = threading.Lock()
        self.polled = threading.Condition(self.dlock)  # notified after each discovery poll
        self.pending: list = []  # events found by waiters, handled by the watcher
        self.tunnels: dict[tuple[str, int], TunnelState] = {}
        self.stop = threading.Event()
        self.ptys = PtyHolder()
        self.stats = {"offloaded": 0, "refused": 0, "failed": 0, "removed": 0, "adopted": 0, "orphans_removed": 0}
        self.reasons: collections.Counter = collections.Counter()  # (refused|failed, reason) -> count
        self.reconciles = 0
        self.max_session_series = 1000  # per-session counters in metrics() beyond this are summed, not listed
        self._mbackend = None  # metrics' own netlink socket (a scrape never waits for self.lock)
        self._mlock = threading.Lock()
        self._clock = threading.Lock()  # counters bumped by concurrent request threads
        self.failpoints = _failpoints()

    def _failpoint(self, name: str) -> None:
        if name in self.failpoints:
            log.warning("failpoint %s: SIGKILL", name)
            for h in logging.getLogger().handlers:
                h.flush()
            os.kill(os.getpid(), 9)

    # ---------------------------------------------------------- lifecycle
    def _listen(self) -> socket.socket:
        d = os.path.dirname(self.socket_path) or "."
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            s.bind(self.socket_path)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)
        s.listen(64)
        return s

    def serve_forever(self) -> None:
        early = self._relay_recorded()
        with self.lock:
            with self.dlock:
                self.d.refresh(events=False)  # the state is reconciled as a whole just below
            for sock in early:
                self.datapath.release(sock)  # the reconcile takes back what it adopts
            self.reconcile_state()
        srv = self._listen()
        watcher = threading.Thread(target=self._watch, name="discovery", daemon=True)
        watcher.start()
        log.info("serving on %s", self.socket_path)
        try:
            while not self.stop.is_set():
                r, _, _ = select.select([srv], [], [], 0.2)
                if r:
                    conn, _ = srv.accept()
                    threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
        finally:
            srv.close()
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass
            self.shutdown()

    def _relay_recorded(self) -> list[socket.socket]:
        """Relay the recorded tunnels' sockets at once, taken back from their
        pppds, before discovery's first read (slow with a long log): control
        packets that waited in them while no daemon ran reach xl2tpd before
        its retransmissions run out (about 31 s).  Nothing else is decided
        here; the state file is read again, and judged, by the reconcile."""
        try:
            with open(self.state_path, "rb") as f:
                state = statefile.State.model_validate_json(f.read(16 * 1024 * 1024))
        except (OSError, ValueError):
            return []
        socks = []
        for t in state.tunnels:
            for r in t.sessions:
                sock = take_udp_socket(r.pppd_pid, (t.local, t.local_port), (t.peer, t.peer_port))
                if sock is not None:
                    self.datapath.attach(sock)
                    socks.append(sock)
                    break
        return socks

    def shutdown(self) -> None:
        with self._mlock:
            if self._mbackend is not None and self._mbackend is not self.backend:
                self._mbackend.close()
            self._mbackend = None
        with self.lock:
            if not self.teardown_on_exit:
                # the kernel keeps the sessions and tunnels (pppd holds their
                # sockets); what the kernel passes up meanwhile waits in the
                # tunnel sockets for the next start, which adopts and relays them
                n = sum(len(t.records) for t in self.tunnels.values())
                for ts in self.tunnels.values():
                    if ts.sock is not None:
                        self.datapath.release(ts.sock)
                self._save()
                log.info("stopping: %d offloaded session(s) left running for the next start to adopt", n)
            else:
                for key in list(self.tunnels):
                    self._drop_tunnel(key, "pipexctl serve stopping", sync=False)
                self._save()
        self.datapath.close()

    # ---------------------------------------------------------- state and reconcile
    def _save(self) -> None:
        try:
            statefile.save(self.state_path, statefile.State(tunnels=[t.record() for t in self.tunnels.values()]))
        except OSError as e:
            log.warning("cannot write state file %s: %s", self.state_path, e.strerror)

    def _call_alive(self, instance: str, tunnel_id: int, call_id: int, pid: int) -> bool:
        who = _proc_comm(pid)
        if not who or who[0] != "pppd":
            return False
        with self.dlock:
            return any(c.instance == instance and c.tunnel_id == tunnel_id and c.call_id == call_id
                   and c.pppd_pid == pid for c in self.d.tracker.calls())

    def _rehold_pty(self, instance: str, s: SessionRecord) -> None:
        """Hold an adopted call's pty slave again (by its recorded path).

        Only for a call just found alive with its pppd: xl2tpd still holds the
        master, so the path still names this call's pty."""
        if not s.pty or (instance, s.call_id) in self.ptys.keys():
            return
        try:
            fd = os.open(s.pty, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as e:
            log.warning("cannot hold %s of call %d again: %s", s.pty, s.call_id, e.strerror)
            return
        if not os.isatty(fd):
            os.close(fd)
            return
        self.ptys.hold((instance, s.call_id), fd)

    def reconcile_state(self) -> dict:
        """Adopt what the state file recorded and is still live; remove orphans.

        Runs at start (after discovery's first refresh) and on SIGHUP."""
        state, warning = statefile.load(self.state_path)
        if warning:
            log.warning("%s", warning)
        known = {(t.instance, t.tunnel_id) for t in self.tunnels.values()}
        state.tunnels = [t for t in state.tunnels if (t.instance, t.tunnel_id) not in known]
        try:
            kt, ks = self.backend.tunnel_dump(), self.backend.session_dump()
        except errors.PipexError as e:
            log.warning("reconcile: cannot read kernel state (%s); nothing adopted", e)
            kt, ks = [], []
        p = statefile.plan(state, kt, ks, self._call_alive)
        for tid, sid, why in p.remove_sessions:
            self._gone_ok(lambda: self.backend.session_delete(tid, sid))
            log.info("reconcile: removed orphan session %d/%d (%s)", tid, sid, why)
        for tid, why in p.remove_tunnels:
            self._gone_ok(lambda: self.backend.tunnel_delete(tid))
            log.info("reconcile: removed orphan tunnel %d (%s)", tid, why)
        for why in p.forget:
            log.info("reconcile: forgot %s", why)
        for rec in p.adopt:
            sock = None
            for r in rec.sessions:
                sock = take_udp_socket(r.pppd_pid, (rec.local, rec.local_port), (rec.peer, rec.peer_port))
                if sock is not None:
                    break
            ts = TunnelState(rec.instance, rec.tunnel_id, rec.peer_tunnel_id, rec.local, rec.peer, rec.peer_port,
                             sock, rec.local_port)
            for r in rec.sessions:
                self._rehold_pty(rec.instance, r)
                ts.records[r.call_id] = r
            self.tunnels[(rec.instance, rec.tunnel_id)] = ts
            if sock is not None:
                self.datapath.adopt(sock, ts.tunnel_id)
                log.info("reconcile: adopted tunnel %d with session(s) %s", rec.tunnel_id,
                         ", ".join(str(r.call_id) for r in rec.sessions))
            else:
                log.warning("reconcile: adopted tunnel %d with session(s) %s, but no pppd's copy of its socket "
                            "could be taken back: its control packets cannot reach xl2tpd", rec.tunnel_id,
                            ", ".join(str(r.call_id) for r in rec.sessions))
        self.stats["adopted"] += sum(len(t.sessions) for t in p.adopt)
        self.stats["orphans_removed"] += len(p.remove_sessions) + len(p.remove_tunnels)
        self.last_reconcile = {**p.summary(), "warning": warning, "at": time.time()}
        self.reconciles += 1
        self.datapath.settle()  # the twins' steering: exactly what is held now
        self._save()
        return self.last_reconcile

    def _watch(self) -> None:
        last = checked = time.monotonic()
        while not self.stop.wait(self.log_interval):
            if time.monotonic() - checked >= 0.5:
                # a firewall reload may have flushed the twins' steering
                checked = time.monotonic()
                self.datapath.check()
            if self.reload.is_set():
                self.reload.clear()
                with self.dlock:
                    ev = self.d.refresh()  # logs are followed by name (tail -F) anyway
                with self.lock:
                    for e in ev:
                        self._on_event(e)
                    self.reconcile_state()
                    log.info("reloaded (SIGHUP)")
            now = time.monotonic()
            full = now - last >= self.reconcile_interval
            ev = []
            t = time.monotonic()
            scanned = procscan.scan() if full and self.d.proc else None  # outside the lock: slow under TCG
            with self.dlock:
                try:
                    ev = self.d.poll(reconcile=full, scanned=scanned)
                except Exception:  # never let the watcher die: log and go on
                    log.exception("discovery poll failed")
                ev, self.pending = self.pending + ev, []
                self.polled.notify_all()
                took = time.monotonic() - t
            if took > 1.0:
                log.info("slow discovery poll: %.0f ms (full=%s)", took * 1000, full)
            if ev:
                with self.lock:
                    for e in ev:
                        self._on_event(e)
            if full:
                last = now

    def _on_event(self, e) -> None:
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
                self._gone_ok(lambda: self.backend.session_delete(ts.tunnel_id, e.call.call_id))
                self.stats["removed"] += 1
                log.info("call %d of tunnel %d ended (%s): offload removed", e.call.call_id, ts.tunnel_id, e.reason)
                self._save()
        elif isinstance(e, TunnelDown):
            key = (e.tunnel.instance, e.tunnel.tunnel_id)
            ts = self.tunnels.get(key)
            if ts is not None and e.tunnel.peer_tunnel_id and e.tunnel.peer_tunnel_id != ts.peer_tunnel_id:
                log.info("tunnel %d: end of the earlier tunnel with this id (peer id %d, ours is %d): kept",
                         ts.tunnel_id, e.tunnel.peer_tunnel_id, ts.peer_tunnel_id)
                return
            if ts is not None:
                self._drop_tunnel(key, e.reason)

    # ---------------------------------------------------------- requests
    def _handle(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            conn.settimeout(5)
            pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != 0:
                self._reply(conn, {"ok": False, "error": "permission denied: only root may ask for a channel"})
                self._refused("not_root")
                return
            data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST + 1, 1)
            while data and b"\n" not in data and len(data) <= MAX_REQUEST:
                chunk = conn.recv(MAX_REQUEST + 1)
                if not chunk:
                    break
                data += chunk
            if not data:
                return  # connected and closed without a request (a liveness probe)
            op, refusal = parse_request(data)
            if refusal is not None:
                self._reply(conn, {"ok": False, "error": refusal.replace("_", " ")})
                self._refused(refusal)
                return
            if op == "status":
                self._reply(conn, {"ok": True, **self.status()})
            elif op == "metrics":
                self._reply(conn, {"ok": True, **self.metrics()})
            elif op == "reconcile":
                with self.lock:
                    self._reply(conn, {"ok": True, "reconcile": self.reconcile_state()})
            elif op == "channel":
                pty = fds.pop(0) if fds and os.isatty(fds[0]) else None
                self._channel(conn, pid, pty)
            else:  # parse_request lets only known ops through
                raise AssertionError(op)
        except OSError as e:
            # unexpected (the offload itself rolls back and replies): say so
            # to the client, with the traceback in the log
            log.warning("request failed: %s", e, exc_info=True)
            try:
                self._reply(conn, {"ok": False, "error": f"request failed: {e}"})
            except OSError:
                pass
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def _reply(self, conn: socket.socket, obj: dict, fds: Optional[list[int]] = None) -> None:
        data = json.dumps(obj).encode() + b"\n"
        if not fds:
            conn.sendall(data)
        else:
            socket.send_fds(conn, [data], fds)

    def _channel(self, conn: socket.socket, pid: int, pty: Optional[int]) -> None:
        held = False
        try:
            held = self._channel_inner(conn, pid, pty)
        finally:
            if pty is not None and not held:
                os.close(pty)  # not taken over: pppd stays on its pty

    def _channel_inner(self, conn: socket.socket, pid: int, pty: Optional[int]) -> bool:
        """Offload pppd ``pid``'s call; True when ``pty`` is now held by us."""
        who = _proc_comm(pid)
        parent = _proc_comm(who[1]) if who else None
        if not who or who[0] != "pppd" or not parent or parent[0] != "xl2tpd":
            self._refused("not_a_pppd_of_xl2tpd")
            self._reply(conn, {"ok": False, "error": f"pid {pid} is not a pppd started by xl2tpd"})
            return False
        t0 = time.monotonic()
        call, why = self._wait_for_call(pid)
        t1 = time.monotonic()
        if call is None:
            self._refused("no_call")
            log.warning("pppd %d refused: no complete xl2tpd call within %.0f s: %s", pid, self.wait, why)
            self._reply(conn, {"ok": False, "error": f"no xl2tpd call for pppd {pid} within {self.wait:.0f} s: {why}"})
            return False
        t2 = time.monotonic()
        try:
            with self.lock:
                t3 = time.monotonic()
                ch, meta = self.offload(call, pid, _ttyname(pty))
                t4 = time.monotonic()
                ts = self.tunnels[(call.instance, call.tunnel_id)]
                # pppd also gets the tunnel's socket: the tunnel then outlives the daemon
                fds = [ch.fileno()] + ([ts.sock.fileno()] if ts.sock is not None else [])
        except errors.PipexError as e:
            with self._clock:
                self.stats["failed"] += 1
                self.reasons[("failed", _reason(e))] += 1
            log.warning("offload of call %d failed: %s", call.call_id, e)
            self._reply(conn, {"ok": False, "error": str(e)})
            return False
        try:
            self._reply(conn, {"ok": True, **meta, "tunnel_fd": len(fds) > 1}, fds=fds)
        except OSError as e:
            with self.lock:
                self._undo_session(call, meta["tunnel_id"])
            log.warning("could not hand the channel to pppd %d: %s", pid, e)
            return False
        finally:
            ch.close()  # pppd holds the only copy now
        self._failpoint("channel-sent")
        with self._clock:
            self.stats["offloaded"] += 1
            self.latencies.append(time.monotonic() - t0)
        log.info("call %d (tunnel %d) of pppd %d offloaded in %.0f ms (%.0f ms waiting for discovery, "
                 "%.0f for the lock, %.0f kernel)", call.call_id, call.tunnel_id, pid,
                 (time.monotonic() - t0) * 1000, (t1 - t0) * 1000, (t3 - t2) * 1000, (t4 - t3) * 1000)
        if pty is None:
            return False
        self.ptys.hold((call.instance, call.call_id), pty)
        return True

    def _wait_for_call(self, pid: int) -> tuple[Optional[CallInfo], str]:
        """The call of pppd ``pid``, once discovery knows it (bounded by ``wait``),
        or None and why not.

        The LNS logs the pppd PID; the LAC's comes from that one pppd's /proc
        entry (its argv against the one xl2tpd logged for the call).  The
        request reads the lines logged since the last read itself (xl2tpd
        has written "Call established" by the time its pppd asks, as a rule),
        instead of waiting up to a watcher period for them; when the line is
        not there yet, the watcher's next poll wakes it."""
        end = time.monotonic() + self.wait
        with self.dlock:
            asked = 0.0
            while True:
                self.pending += self.d.poll(reconcile=False)  # new log lines only: cheap
                self.pending += self.d.observe_process(pid)
                mine = next((c for c in self.d.tracker.calls() if c.pppd_pid == pid), None)
                if mine is not None and None not in (mine.tunnel_id, mine.peer_tunnel_id, mine.peer_call_id):
                    return mine.copy(), ""
                if mine is not None and time.monotonic() - asked > 0.5:
                    # known but not its tunnel: an LNS log names only the peer's
                    # address, ambiguous with several tunnels from one peer;
                    # xl2tpd's control pipe (status-lns) says which
                    asked = time.monotonic()
                    nw = len(self.d.warnings)
                    self.pending += self.d.ask_control()
                    for w in self.d.warnings[nw:]:
                        log.warning("discovery: %s", w)
                    del self.d.warnings[nw:]
                    continue
                left = end - time.monotonic()
                if left <= 0:
                    return None, (f"call {mine.call_id} known, but not yet its tunnel/peer ids (tunnel "
                                  f"{mine.tunnel_id}, peer tunnel {mine.peer_tunnel_id}, peer call "
                                  f"{mine.peer_call_id})" if mine else "no call names this pid")
                self.polled.wait(min(left, 1.0))

    # ---------------------------------------------------------- the offload
    def offload(self, call: CallInfo, pppd_pid: Optional[int] = None, pty: Optional[str] = None):
        key = (call.instance, call.tunnel_id)
        ts = self.tunnels.get(key)
        if ts is not None and (ts.peer_tunnel_id, ts.peer, ts.peer_port) != (call.peer_tunnel_id, call.peer,
                                                                          call.peer_port or 1701):
            # xl2tpd picked the id of a tunnel whose end discovery has not
            # reported yet (its ids are random): that tunnel is gone
            self._drop_tunnel(key, f"its id {call.tunnel_id} now names a new tunnel to {call.peer}")
            ts = None
        new_tunnel = ts is None
        if new_tunnel:
            ts = self._new_tunnel(call)
        if call.call_id in ts.records and self._stale_session(ts, call.call_id):
            # the id of a call whose end discovery has not reported yet
            self._forget_session(ts, call.call_id, "its id was reused by a new call")
        if call.call_id in ts.records:
            # before the try: the rollback below must not touch the healthy session
            raise errors.ConflictError(f"call {call.call_id} of tunnel {call.tunnel_id} is already offloaded")
        ch = None
        session_made = False
        try:
            spec = SessionSpec(tunnel_id=ts.tunnel_id, session_id=call.call_id, peer_session_id=call.peer_call_id,
                               version=2, pw_type=PwType.ppp, lns_mode=call.role == "lns")
            self.backend.session_create(spec)
            session_made = True
            self._failpoint("session-created")
            # what PPPoL2TP connect needs is known: no netlink round trip to read it back
            kt = Tunnel(tunnel_id=ts.tunnel_id, peer_tunnel_id=ts.peer_tunnel_id, version=2, encap=Encap.udp)
            ks = Session(tunnel_id=ts.tunnel_id, session_id=call.call_id, peer_session_id=call.peer_call_id,
                         pw_type=PwType.ppp)
            ch = self.backend.ppp_connect(kt, ks)
            self._failpoint("channel-connected")
            ts.records[call.call_id] = SessionRecord(call_id=call.call_id, peer_call_id=call.peer_call_id,
                                                     pppd_pid=pppd_pid or call.pppd_pid or 1, role=call.role,
                                                     pty=pty)
            self._save()
            self._failpoint("state-saved")
        except BaseException:
            if ch is not None:
                ch.close()
            ts.records.pop(call.call_id, None)
            if session_made:
                errors.quietly(lambda: self.backend.session_delete(ts.tunnel_id, call.call_id), log)
            if new_tunnel:
                self._drop_tunnel(key, "offload failed", sync=False)
            raise
        meta = {"tunnel_id": ts.tunnel_id, "peer_tunnel_id": ts.peer_tunnel_id, "session_id": call.call_id,
                "peer_session_id": call.peer_call_id, "local": f"{ts.local}:{ts.local_port}",
                "peer": f"{ts.peer}:{ts.peer_port}", "role": call.role}
        return ch, meta

    def _new_tunnel(self, call: CallInfo) -> TunnelState:
        peer_port = call.peer_port or 1701
        local = self.datapath.local_for(call.peer, peer_port)
        # a second tunnel from the same peer address and port cannot have
        # xl2tpd's port too (Linux before 6.11 looks a data packet's session
        # up in the tunnel of the socket that received it): a private port
        twin = any((t.local, t.peer, t.peer_port, t.local_port) == (local, call.peer, peer_port, self.xl2tpd_port)
                   for t in self.tunnels.values())
        s = self.datapath.open(local, call.peer, peer_port, call.tunnel_id, twin)
        try:
            self.backend.tunnel_create(TunnelSpec(tunnel_id=call.tunnel_id, peer_tunnel_id=call.peer_tunnel_id,
                                                  version=2, fd=s.fileno()))
        except BaseException:
            self.datapath.close_tunnel(s, call.tunnel_id)
            raise
        ts = TunnelState(call.instance, call.tunnel_id, call.peer_tunnel_id, local, call.peer, peer_port, s,
                         s.getsockname()[1])
        self.tunnels[(call.instance, call.tunnel_id)] = ts
        self._failpoint("tunnel-created")
        log.info("kernel tunnel %d/%d on %s:%d <-> %s:%d%s", ts.tunnel_id, ts.peer_tunnel_id, local, ts.local_port,
                 call.peer, peer_port, " (steered: another tunnel has this address pair)" if twin else "")
        return ts

    def _stale_session(self, ts: TunnelState, call_id: int) -> bool:
        """True when the kernel no longer has a session we recorded: its pppd
        closed the PPPoL2TP socket (it ended), whatever discovery says yet."""
        try:
            self.backend.session_get(ts.tunnel_id, call_id)
        except errors.NotFoundError:
            return True
        return False

    def _forget_session(self, ts: TunnelState, call_id: int, why: str) -> None:
        ts.records.pop(call_id, None)
        self.ptys.release((ts.instance, call_id))
        self.stats["removed"] += 1
        log.info("call %d of tunnel %d had ended (%s)", call_id, ts.tunnel_id, why)

    def _undo_session(self, call: CallInfo, tunnel_id: int) -> None:
        ts = self.tunnels.get((call.instance, tunnel_id))
        if ts and ts.records.pop(call.call_id, None):
            self._gone_ok(lambda: self.backend.session_delete(tunnel_id, call.call_id))
            self._save()

    def _drop_tunnel(self, key, reason: str, sync: bool = True) -> None:
        """Remove a tunnel and its sessions; ``sync=False``: the caller writes the state file."""
        ts = self.tunnels.pop(key, None)
        if ts is None:
            return
        for cid in ts.records:
            self.ptys.release((ts.instance, cid))
        ts.records.clear()
        # pppds hold copies of the socket, so closing ours is not enough
        self._gone_ok(lambda: self.backend.tunnel_delete(ts.tunnel_id))
        if ts.sock is not None:
            self.datapath.close_tunnel(ts.sock, ts.tunnel_id)
        log.info("tunnel %d removed (%s)", ts.tunnel_id, reason)
        if sync:
            self._save()

    @staticmethod
    def _gone_ok(fn) -> None:
        """Delete something that may already be gone (with its pppd or socket)."""
        try:
            fn()
        except errors.NotFoundError:
            pass
        except errors.PipexError as e:
            log.warning("%s", e)

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
                "channel_latency_ms": _percentiles([x * 1000 for x in self._latencies()]),
            }

    def _latencies(self) -> list[float]:
        with self._clock:
            return list(self.latencies)

    def _refused(self, reason: str) -> None:
        with self._clock:
            self.stats["refused"] += 1
            self.reasons[("refused", reason)] += 1

    def metrics(self) -> dict:
        """The numbers behind ``--metrics`` (Prometheus) and ``pipexctl stat --serve``.

        Calls known to discovery by role and data path; what the daemon owns;
        offload outcomes by reason; reconcile actions; the kernel's counters of
        each offloaded session (at most ``max_session_series`` listed, the
        rest summed), read through a netlink socket of its own."""
        with self.dlock:
            calls = collections.Counter((c.role, c.data_path) for c in self.d.tracker.calls())
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
            "channel_latency_ms": _percentiles([x * 1000 for x in self._latencies()]),
            "kernel_error": error,
            "datapath": self.datapath.stats(),
        }
