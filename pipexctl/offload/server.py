"""`pipexctl serve`: give a userspace-mode xl2tpd's pppd a kernel channel.

For a pppd that asks (the plugin, plugins/pipexctl.c), identified by
SO_PEERCRED and matched to its xl2tpd call through discovery:

1. a private UDP socket, bound to the local address on a free port and
   connected to the peer's address and port (one per xl2tpd tunnel);
2. a kernel L2TPv2 tunnel on it (xl2tpd's tunnel ids);
3. the kernel PPP session (xl2tpd's call ids; LNS mode on the LNS);
4. a PPPoL2TP socket connected to it, sent to pppd over SCM_RIGHTS;
5. nftables steering of exactly that session's data packets (steering.py).

Every step is undone if a later one fails.  The daemon keeps the tunnel's
UDP socket; pppd keeps the only PPPoL2TP socket, so the kernel session ends
when pppd does.  When discovery reports the call or tunnel gone, the
session, the rules and (with its last call) the tunnel are removed.

Run it in xl2tpd's network namespace (``ip netns exec NS pipexctl serve``).
"""

from __future__ import annotations

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
from ..discovery.discovery import Discovery
from ..discovery.state import CallDown, CallInfo, TunnelDown
from ..model import PwType, SessionSpec, TunnelSpec
from .steering import Nft, Steer, delete_table, ruleset

log = logging.getLogger("pipexctl.serve")

MAX_REQUEST = 4096
SO_NO_CHECK = 11  # asm-generic/socket.h


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
    sock: socket.socket
    private_port: int
    sessions: dict[int, Steer] = field(default_factory=dict)


def _proc_comm(pid: int) -> Optional[tuple[str, int]]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.find("(") + 1: stat.rfind(")")], int(stat[stat.rfind(")") + 2:].split()[1])


class OffloadServer:
    def __init__(self, socket_path: str, discovery: Discovery, backend, nft: Nft, *,
                 wait: float = 5.0, xl2tpd_port: int = 1701, log_interval: float = 0.2,
                 reconcile_interval: float = 5.0) -> None:
        self.socket_path, self.d, self.backend, self.nft = socket_path, discovery, backend, nft
        self.wait, self.xl2tpd_port = wait, xl2tpd_port
        # Logs are cheap to follow; /proc and kernel scans are not (they cost CPU
        # that the data path needs), so they run rarely, and on demand while a
        # pppd waits for its channel.
        self.log_interval, self.reconcile_interval = log_interval, reconcile_interval
        self.lock = threading.RLock()
        self.tunnels: dict[tuple[str, int], TunnelState] = {}
        self.stop = threading.Event()
        self.ptys = PtyHolder()
        self.stats = {"offloaded": 0, "refused": 0, "failed": 0, "removed": 0}

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
        with self.lock:
            self.nft.apply(ruleset([]))  # reconcile: nothing is steered before we own it
            self.d.refresh()
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

    def shutdown(self) -> None:
        with self.lock:
            for key in list(self.tunnels):
                self._drop_tunnel(key, "pipexctl serve stopping", reapply=False)
            try:
                self.nft.apply(delete_table())
            except errors.PipexError as e:
                log.warning("%s", e)

    def _watch(self) -> None:
        last = time.monotonic()
        while not self.stop.wait(self.log_interval):
            now = time.monotonic()
            full = now - last >= self.reconcile_interval
            with self.lock:
                for e in self.d.poll(reconcile=full):
                    self._on_event(e)
            if full:
                last = now

    def _on_event(self, e) -> None:
        if isinstance(e, CallDown):
            key = (e.call.instance, e.call.tunnel_id)
            ts = self.tunnels.get(key)
            self.ptys.release((e.call.instance, e.call.call_id))
            if ts and e.call.call_id in ts.sessions:
                del ts.sessions[e.call.call_id]
                self._quiet(lambda: self.backend.session_delete(ts.tunnel_id, e.call.call_id))
                self.stats["removed"] += 1
                log.info("call %d of tunnel %d ended (%s): offload removed", e.call.call_id, ts.tunnel_id, e.reason)
                self._apply_rules()
        elif isinstance(e, TunnelDown):
            key = (e.tunnel.instance, e.tunnel.tunnel_id)
            if key in self.tunnels:
                self._drop_tunnel(key, e.reason)

    # ---------------------------------------------------------- requests
    def _handle(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            conn.settimeout(5)
            pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != 0:
                self._reply(conn, {"ok": False, "error": "permission denied: only root may ask for a channel"})
                self.stats["refused"] += 1
                return
            data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST + 1, 1)
            while data and b"\n" not in data and len(data) <= MAX_REQUEST:
                chunk = conn.recv(MAX_REQUEST + 1)
                if not chunk:
                    break
                data += chunk
            if len(data) > MAX_REQUEST:
                self._reply(conn, {"ok": False, "error": "request too large"})
                self.stats["refused"] += 1
                return
            try:
                req = json.loads(data.decode("utf-8"))
                op = req["op"] if isinstance(req, dict) else None
            except (ValueError, KeyError, UnicodeDecodeError):
                self._reply(conn, {"ok": False, "error": "malformed request"})
                self.stats["refused"] += 1
                return
            if op == "status":
                self._reply(conn, {"ok": True, **self.status()})
            elif op == "channel":
                pty = fds.pop(0) if fds and os.isatty(fds[0]) else None
                self._channel(conn, pid, pty)
            else:
                self._reply(conn, {"ok": False, "error": f"unknown op {str(op)[:32]!r}"})
                self.stats["refused"] += 1
        except OSError as e:
            log.warning("request failed: %s", e)
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def _reply(self, conn: socket.socket, obj: dict, fd: Optional[int] = None) -> None:
        data = json.dumps(obj).encode() + b"\n"
        if fd is None:
            conn.sendall(data)
        else:
            socket.send_fds(conn, [data], [fd])

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
            self.stats["refused"] += 1
            self._reply(conn, {"ok": False, "error": f"pid {pid} is not a pppd started by xl2tpd"})
            return False
        call = self._wait_for_call(pid)
        if call is None:
            self.stats["refused"] += 1
            self._reply(conn, {"ok": False, "error": f"no xl2tpd call for pppd {pid} within {self.wait:.0f} s"})
            return False
        try:
            with self.lock:
                ch, meta = self.offload(call)
        except errors.PipexError as e:
            self.stats["failed"] += 1
            log.warning("offload of call %d failed: %s", call.call_id, e)
            self._reply(conn, {"ok": False, "error": str(e)})
            return False
        try:
            self._reply(conn, {"ok": True, **meta}, fd=ch.fileno())
        except OSError as e:
            with self.lock:
                self._undo_session(call, meta["tunnel_id"])
            log.warning("could not hand the channel to pppd %d: %s", pid, e)
            return False
        finally:
            ch.close()  # pppd holds the only copy now
        self.stats["offloaded"] += 1
        log.info("call %d (tunnel %d) of pppd %d offloaded", call.call_id, call.tunnel_id, pid)
        if pty is None:
            return False
        self.ptys.hold((call.instance, call.call_id), pty)
        return True

    def _wait_for_call(self, pid: int) -> Optional[CallInfo]:
        end = time.monotonic() + self.wait
        n = 0
        while time.monotonic() < end:
            with self.lock:
                # the LNS logs the pppd PID (log only); the LAC's PID needs /proc
                for ev in self.d.poll(reconcile=n % 4 == 0):
                    self._on_event(ev)
                for c in self.d.tracker.calls():
                    if c.pppd_pid == pid and None not in (c.tunnel_id, c.peer_tunnel_id, c.peer_call_id):
                        return c.model_copy()
            n += 1
            time.sleep(0.05)
        return None

    # ---------------------------------------------------------- the offload
    def offload(self, call: CallInfo):
        key = (call.instance, call.tunnel_id)
        ts = self.tunnels.get(key)
        new_tunnel = ts is None
        if new_tunnel:
            ts = self._new_tunnel(call)
        ch = None
        session_made = False
        try:
            if call.call_id in ts.sessions:
                raise errors.ConflictError(f"call {call.call_id} of tunnel {call.tunnel_id} is already offloaded")
            spec = SessionSpec(tunnel_id=ts.tunnel_id, session_id=call.call_id, peer_session_id=call.peer_call_id,
                               version=2, pw_type=PwType.ppp, lns_mode=call.role == "lns")
            self.backend.session_create(spec)
            session_made = True
            kt = self.backend.tunnel_get(ts.tunnel_id)
            ks = self.backend.session_get(ts.tunnel_id, call.call_id)
            ch = self.backend.ppp_connect(kt, ks)
            ts.sessions[call.call_id] = Steer(ts.local, ts.peer, ts.peer_port, ts.private_port, ts.tunnel_id,
                                              call.call_id, self.xl2tpd_port)
            self._apply_rules()
        except BaseException:
            if ch is not None:
                ch.close()
            if ts.sessions.pop(call.call_id, None) is not None:
                self._quiet(self._apply_rules)
            if session_made:
                self._quiet(lambda: self.backend.session_delete(ts.tunnel_id, call.call_id))
            if new_tunnel:
                self._drop_tunnel(key, "offload failed", reapply=False)
            raise
        meta = {"tunnel_id": ts.tunnel_id, "peer_tunnel_id": ts.peer_tunnel_id, "session_id": call.call_id,
                "peer_session_id": call.peer_call_id, "local": f"{ts.local}:{ts.private_port}",
                "peer": f"{ts.peer}:{ts.peer_port}", "role": call.role}
        return ch, meta

    def _new_tunnel(self, call: CallInfo) -> TunnelState:
        peer_port = call.peer_port or 1701
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((call.peer, peer_port))
            local = probe.getsockname()[0]
        except OSError as e:
            raise errors.SocketError(f"no route to {call.peer}: {e.strerror}") from None
        finally:
            probe.close()
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            # no UDP checksums, like xl2tpd's own sockets: the peer's steering
            # rule zeroes them anyway, and computing them costs the data path
            s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
            s.bind((local, 0))
            s.connect((call.peer, peer_port))
            private = s.getsockname()[1]
            self.backend.tunnel_create(TunnelSpec(tunnel_id=call.tunnel_id, peer_tunnel_id=call.peer_tunnel_id,
                                                  version=2, fd=s.fileno()))
        except OSError as e:
            s.close()
            raise errors.SocketError(f"cannot open the private socket for tunnel {call.tunnel_id}: {e.strerror}") from None
        except BaseException:
            s.close()
            raise
        ts = TunnelState(call.instance, call.tunnel_id, call.peer_tunnel_id, local, call.peer, peer_port, s, private)
        self.tunnels[(call.instance, call.tunnel_id)] = ts
        log.info("kernel tunnel %d/%d on %s:%d <-> %s:%d", ts.tunnel_id, ts.peer_tunnel_id, local, private,
                 call.peer, peer_port)
        return ts

    def _undo_session(self, call: CallInfo, tunnel_id: int) -> None:
        ts = self.tunnels.get((call.instance, tunnel_id))
        if ts and ts.sessions.pop(call.call_id, None):
            self._quiet(lambda: self.backend.session_delete(tunnel_id, call.call_id))
            self._quiet(self._apply_rules)

    def _drop_tunnel(self, key, reason: str, reapply: bool = True) -> None:
        ts = self.tunnels.pop(key, None)
        if ts is None:
            return
        for cid in ts.sessions:
            self.ptys.release((ts.instance, cid))
        ts.sessions.clear()
        ts.sock.close()  # the kernel deletes the tunnel and its sessions with its socket
        log.info("tunnel %d removed (%s)", ts.tunnel_id, reason)
        if reapply:
            self._quiet(self._apply_rules)

    def _apply_rules(self) -> None:
        self.nft.apply(ruleset(s for t in self.tunnels.values() for s in t.sessions.values()))

    @staticmethod
    def _quiet(fn) -> None:
        try:
            fn()
        except errors.PipexError as e:
            log.warning("%s", e)

    def status(self) -> dict:
        with self.lock:
            return {
                "tunnels": [{"tunnel_id": t.tunnel_id, "peer_tunnel_id": t.peer_tunnel_id, "local": t.local,
                             "private_port": t.private_port, "peer": f"{t.peer}:{t.peer_port}",
                             "sessions": sorted(t.sessions)} for t in self.tunnels.values()],
                "stats": dict(self.stats),
            }
