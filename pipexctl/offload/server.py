"""`pipexctl serve`: the plugin socket, a thin protocol over the offload service.

A pppd that loads the plugin (plugins/pipexctl.c) connects to a unix socket
(0600 in a 0700 directory) and sends one JSON request line; the daemon
knows it by SO_PEERCRED, never by what it says.  For ``channel`` it checks
that the peer is a pppd started by xl2tpd, waits for discovery to name the
pppd's call (watch.py), and lets the offload service (service.py) make the
kernel objects and hand the channel over on this connection.  ``status``,
``metrics`` and ``reconcile`` answer from the service.

At start the recorded tunnels are relayed at once and the state file is
reconciled (reconcile.py); SIGTERM leaves offloaded sessions running unless
``teardown_on_exit``; SIGHUP asks xl2tpd (control pipe), /proc and the
kernel at once and reconciles again.

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
from typing import Optional

from .. import errors
from ..discovery.discovery import Discovery
from ..kernel.backend import KernelBackend
from . import reconcile
from .datapath import DataPath
from .service import OffloadService
from .watch import CallWatch

log = logging.getLogger("pipexctl.serve")

MAX_REQUEST = 4096


def _ttyname(fd: Optional[int]) -> Optional[str]:
    try:
        name = os.ttyname(fd) if fd is not None else None
    except OSError:
        return None
    return name if name and name.startswith("/dev/pts/") else None


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


class OffloadServer:
    def __init__(self, socket_path: str, discovery: Discovery, backend: KernelBackend, datapath: DataPath, *,
                 wait: float = 5.0, xl2tpd_port: int = 1701, log_interval: float = 0.2,
                 reconcile_interval: float = 5.0, state_path: Optional[str] = None,
                 teardown_on_exit: bool = False) -> None:
        self.socket_path, self.wait = socket_path, wait
        self.watch = CallWatch(discovery, log_interval=log_interval, reconcile_interval=reconcile_interval)
        self.service = OffloadService(
            self.watch, backend, datapath, xl2tpd_port=xl2tpd_port, teardown_on_exit=teardown_on_exit,
            state_path=state_path or os.path.join(os.path.dirname(socket_path) or ".", "state.json"))
        self.reload = threading.Event()
        self.stop = threading.Event()

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
        svc = self.service
        early = reconcile.relay_recorded(svc)
        with svc.lock:
            self.watch.first_read()
            for sock in early:
                svc.datapath.release(sock)  # the reconcile takes back what it adopts
            reconcile.reconcile(svc)
        srv = self._listen()
        threading.Thread(target=self.watch.run, name="discovery", daemon=True,
                         args=(self.stop, self.reload),
                         kwargs={"handle": svc.handle, "reloaded": self._reloaded,
                                 # a firewall reload may have flushed the twins' steering
                                 "tick": svc.datapath.check}).start()
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
            svc.shutdown()

    def _reloaded(self, events: list) -> None:
        with self.service.lock:
            self.service.handle(events)
            reconcile.reconcile(self.service)
        log.info("reloaded (SIGHUP)")

    # ---------------------------------------------------------- requests
    def _handle(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            conn.settimeout(5)
            pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != 0:
                self._reply(conn, {"ok": False, "error": "permission denied: only root may ask for a channel"})
                self.service.refused("not_root")
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
                self.service.refused(refusal)
                return
            if op == "status":
                self._reply(conn, {"ok": True, **self.service.status()})
            elif op == "metrics":
                self._reply(conn, {"ok": True, **self.service.metrics()})
            elif op == "reconcile":
                with self.service.lock:
                    self._reply(conn, {"ok": True, "reconcile": reconcile.reconcile(self.service)})
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
        svc = self.service
        who = reconcile.proc_comm(pid)
        parent = reconcile.proc_comm(who[1]) if who else None
        if not who or who[0] != "pppd" or not parent or parent[0] != "xl2tpd":
            svc.refused("not_a_pppd_of_xl2tpd")
            self._reply(conn, {"ok": False, "error": f"pid {pid} is not a pppd started by xl2tpd"})
            return False
        t0 = time.monotonic()
        call, why = self.watch.call_of(pid, self.wait)
        t1 = time.monotonic()
        if call is None:
            svc.refused("no_call")
            log.warning("pppd %d refused: no complete xl2tpd call within %.0f s: %s", pid, self.wait, why)
            self._reply(conn, {"ok": False, "error": f"no xl2tpd call for pppd {pid} within {self.wait:.0f} s: {why}"})
            return False

        def hand_off(meta: dict, fds: list) -> None:
            self._reply(conn, {"ok": True, **meta, "tunnel_fd": len(fds) > 1}, fds=fds)

        try:
            ch, _ = svc.offload(call, pid, _ttyname(pty), hand_off)
        except (errors.PipexError, OSError) as e:
            svc.failed(e)
            log.warning("offload of call %d (pppd %d) failed: %s", call.call_id, pid, e)
            try:
                self._reply(conn, {"ok": False, "error": str(e)})
            except OSError:
                pass  # the hand-off itself failed: pppd is gone
            return False
        ch.close()  # pppd holds the only copy now
        svc.failpoint("channel-sent")
        svc.offloaded(time.monotonic() - t0)
        log.info("call %d (tunnel %d) of pppd %d offloaded in %.0f ms (%.0f ms waiting for discovery)",
                 call.call_id, call.tunnel_id, pid, (time.monotonic() - t0) * 1000, (t1 - t0) * 1000)
        if pty is None:
            return False
        svc.ptys.hold((call.instance, call.call_id), pty)
        return True
