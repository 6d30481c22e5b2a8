"""`pipexctl serve`: the plugin socket, a thin protocol over the offload service.

A pppd that loads the plugin (plugins/pipexctl.c) connects to a unix socket
(0600 in a 0700 directory) and sends one JSON request line; the daemon
knows it by SO_PEERCRED, never by what it says.  For ``channel`` it checks
that the peer is a pppd started by xl2tpd, waits for discovery to name the
pppd's call (watch.py), and lets the offload service (service.py) make the
kernel objects and hand the channel over on this connection.  ``move`` is
the same for a call already running on its pty (the plugin swaps the
channel under the running ppp unit); it keeps no pty, and the daemon says
``committed`` after the plugin's ack, so the plugin never swaps to a
channel whose offload was undone.  ``status``,
``metrics`` and ``reconcile`` answer from the service.

At start the recorded tunnels are relayed at once and the state file is
reconciled (reconcile.py); SIGTERM leaves offloaded sessions running unless
``teardown_on_exit``; SIGHUP asks xl2tpd (control pipe), /proc and the
kernel at once and reconciles again.

Run it in xl2tpd's network namespace (``ip netns exec NS pipexctl serve``).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import selectors
import socket
import struct
import threading
import time
from typing import Any, Optional

from .. import defaults, errors
from ..discovery import control, procscan
from ..discovery.discovery import Discovery
from ..discovery.state import Event
from ..kernel.backend import KernelBackend
from . import gcpause, malloc, paths, reconcile, sdnotify
from .datapath import DataPath
from .links import Links
from .protocol import (
    ACK_TIMEOUT,
    MAX_REQUEST,
    VERSION,
    Request,
    ack_cpu_wait,
    ack_stamps,
    ok_reply,
    parse_ack,
    parse_request,
    reply,
)
from .ptys import call_key
from .service import OffloadService, schedstat_ns
from .watch import CallWatch, FdEvent
from .workers import Workers

log = logging.getLogger("pipexctl.serve")



def prove_requester(pid: int) -> tuple[Optional[int], str]:
    """(its xl2tpd's pid, "") when ``pid`` is the system pppd, started by root,
    child of the system xl2tpd; else (None, refusal reason).

    SO_PEERCRED gives the effective uid only: Debian's pppd is setuid root,
    so a user of group dip passes it.  The real, saved and filesystem uids
    tell.  Binaries are judged by /proc/PID/exe, never by their name."""
    u = procscan.uids(pid)
    if u is None:
        return None, "requester_gone"
    if any(u):
        return None, "pppd_not_started_by_root"
    who = procscan.comm_ppid(pid)
    if who is None or procscan.exe(pid) not in procscan.trusted_exes("pppd"):
        return None, "not_a_pppd_of_xl2tpd"
    if not procscan.is_daemon(who[1], "xl2tpd"):
        return None, "not_a_pppd_of_xl2tpd"
    return who[1], ""


def _running(pidfd: Optional[int]) -> bool:
    """The process behind ``pidfd`` has not exited (a pidfd polls readable then)."""
    if pidfd is None:
        return True  # no pidfd: checked by /proc only
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return not p.poll(0)


LINK_TIMEOUT = 2.0  # seconds a write to a plugin's control link may block
LINK_ANSWER_WAIT = 15.0  # seconds the plugins have to answer an operator's move (they tick every second)

REFUSALS = {
    "requester_gone": "pid {pid} exited before its request was answered",
    "pppd_not_started_by_root": "pid {pid} is a pppd started by a user (setuid): only xl2tpd's pppds are offloaded",
    "not_a_pppd_of_xl2tpd": "pid {pid} is not a pppd started by xl2tpd",
}


def _as_pppd_saw(ns: dict[str, int], clock: dict[str, int]) -> str:
    """The offload's log line's tail: the request as its pppd timed it (from
    the start of its ask to its reading of the reply), the hand-off split between
    pppd's scheduling and ours, how long pppd was runnable and waiting for a
    CPU in that span (a plugin that sends it), and what came before our own clock began
    (``clock``: when we accepted the request, its thread began, it was read,
    the requester proven); empty for a plugin that sent no stamps."""
    if not ns or 0 < clock.get("accepted", 0) < ns["asked"]:  # none, or an ask begun after we accepted it
        return ""
    ms = {k: v / 1e6 for k, v in ns.items()}
    tail = ("; as pppd saw it %.0f ms (ms: its wake for our reply %.0f, its checks %.0f, our read of its ack %.0f%s)"
            % (ms["waited"], ms["woke"], ms["checked"], ms["ack_read"],
               ", its own wait for a CPU %.0f" % ms["cpu_wait"] if "cpu_wait" in ms else ""))
    steps = [ns["asked"]] + [clock.get(k, 0) for k in ("accepted", "begun", "read", "proven")]
    if all(a <= b for a, b in zip(steps, steps[1:])):  # 0: a step not timed
        d = [(b - a) / 1e6 for a, b in zip(steps, steps[1:])]
        tail += ("; before our clock %.0f ms (ms: until our accept %.0f, its thread %.0f, the request read %.0f, "
                 "its pppd proven %.0f)" % (sum(d), *d))
        woke, cpu_wait = clock.get("woke", 0), clock.get("loop_cpu_wait", -1)
        if ns["asked"] <= woke <= clock["accepted"] and 0 <= cpu_wait <= woke - ns["asked"]:
            # the accept loop's part of "until our accept": from its wake to the accept, and its wait for a CPU
            tail += ("; our accept loop woke %.0f ms after the ask, having waited %.0f ms for a CPU"
                     % ((woke - ns["asked"]) / 1e6, cpu_wait / 1e6))
    return tail


class _RunqClock:
    """The calling thread's time runnable and waiting for a CPU (ns, the
    kernel's schedstat), read through one fd kept open (-1: not known)."""

    def __init__(self) -> None:
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = -1

    def ns(self) -> int:
        if self._fd < 0:
            return -1
        try:
            st = schedstat_ns(os.pread(self._fd, 64, 0))
        except OSError:
            return -1
        return st[1] if st else -1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _ttyname(fd: Optional[int]) -> Optional[str]:
    try:
        name = os.ttyname(fd) if fd is not None else None
    except OSError:
        return None
    return name if name and name.startswith("/dev/pts/") else None


# the status op's reply is sent in parts of this size at least (the last may be smaller)
STATUS_SEND = 64 << 10


class OffloadServer:
    def __init__(self, socket_path: str, discovery: Discovery, backend: KernelBackend, datapath: DataPath, *,
                 wait: float = defaults.REQUEST_WAIT, xl2tpd_port: int = defaults.L2TP_PORT,
                 log_interval: float = 0.2, reconcile_interval: float = defaults.RECONCILE_INTERVAL, state_path: Optional[str] = None,
                 teardown_on_exit: bool = False) -> None:
        self.socket_path, self.wait = socket_path, wait
        state_path = state_path or os.path.join(os.path.dirname(socket_path) or ".", "state.json")
        self.watch = CallWatch(discovery, log_interval=log_interval, reconcile_interval=reconcile_interval,
                               checkpoint_path=os.path.join(os.path.dirname(state_path) or ".", "discovery.json"),
                               xl2tpd_port=xl2tpd_port)
        self.service = OffloadService(
            self.watch, backend, datapath, xl2tpd_port=xl2tpd_port, teardown_on_exit=teardown_on_exit,
            state_path=state_path)
        # FdEvents: a signal handler's set() wakes the threads blocked in select()
        self.reload = FdEvent()
        self.stop = FdEvent()
        # a listening socket systemd made (pipexctl.socket): it outlives the daemon
        self.activated: Optional[socket.socket] = None
        self.links = Links()  # the plugins' control links, by pppd pid
        self._watchdog, self._pinged = sdnotify.watchdog_interval(), 0.0
        self._trimmer = malloc.Trimmer()
        self._workers = Workers(self._handle)  # started ahead: the accept loop never waits for a thread
        self._pauses = gcpause.Pauses()  # the collector's long pauses, logged from the watcher's round

    # ---------------------------------------------------------- lifecycle
    def _listen(self) -> socket.socket:
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
        if self.activated is not None:
            self.socket_path = self.activated.getsockname() or self.socket_path
        # refused before anything is made: never a socket or state file where others can write
        paths.private_dir(os.path.dirname(self.socket_path), "socket")
        paths.private_dir(os.path.dirname(svc.state_path), "state")
        base = control.reply_base()
        if base and (n := control.remove_stale_reply_dirs(base)):
            log.info("removed %d control-pipe reply directories left by a daemon that was killed", n)
        early = reconcile.relay_recorded(svc)
        with svc.lock:
            self.watch.first_read()
            for sock in early:
                svc.datapath.release(sock)  # the reconcile takes back what it adopts
            reconcile.reconcile(svc)
        self._trimmer.maybe()  # what the first read parsed and let go: megabytes for a long log
        srv = self.activated if self.activated is not None else self._listen()
        threading.Thread(target=self.watch.run, name="discovery", daemon=True,
                         args=(self.stop, self.reload),
                         kwargs={"handle": svc.handle, "reloaded": self._reloaded,
                                 "tick": self._tick, "exits": svc.exits, "busy": svc.busy}).start()
        log.info("serving on %s%s", self.socket_path, " (socket from systemd)" if self.activated else "")
        sdnotify.notify("READY=1", f"STATUS=serving; {self._summary()}")
        self._workers.start()
        self._pauses.install()
        sel = selectors.DefaultSelector()
        sel.register(srv, selectors.EVENT_READ)
        sel.register(self.stop, selectors.EVENT_READ)
        warned = float("-inf")  # monotonic() may be under 60 s just after boot
        runq = _RunqClock()  # this thread's wait for a CPU, for the offload's log line
        try:
            while not self.stop.is_set():
                before = runq.ns()
                keys = sel.select()
                # when the loop ran again (the interpreter's lock taken back), and its wait for a CPU meanwhile
                woke, after = time.monotonic_ns(), runq.ns()
                waited = after - before if before >= 0 and after >= 0 else -1
                if not any(k.fileobj is srv for k, _ in keys):
                    continue
                try:
                    conn, _ = srv.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError as e:
                    if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        raise
                    # out of file descriptors: pppds fall back to the pty meanwhile;
                    # the daemon keeps serving (one fd per offloaded call is held)
                    if time.monotonic() - warned > 60:
                        warned = time.monotonic()
                        log.warning("cannot accept a request: %s (raise LimitNOFILE); retrying", e.strerror)
                    self.stop.wait(0.5)
                    continue
                self._workers.submit(conn, {"accepted": time.monotonic_ns(), "woke": woke, "loop_cpu_wait": waited})
        finally:
            self._pauses.uninstall()
            sdnotify.notify("STOPPING=1")
            self._workers.stop()
            runq.close()
            sel.close()
            srv.close()
            if self.activated is None:  # systemd's socket stays: pppds queue there until the next start
                try:
                    os.unlink(self.socket_path)
                except OSError:
                    pass
            try:
                self.watch.save_checkpoint()  # the next start reads only what comes after
            except Exception:  # never in the way of the shutdown
                log.exception("cannot save the discovery checkpoint")
            self.links.close()
            svc.shutdown()

    def _summary(self) -> str:
        svc = self.service
        tunnels = list(svc.tunnels.values())
        return (f"{sum(len(t.records) for t in tunnels)} call(s) offloaded in {len(tunnels)} tunnel(s), "
                f"{svc.stats['refused']} refused, {svc.stats['failed']} failed")

    def _tick(self) -> None:
        """The watcher's half-second round: the service's checks, then the
        watchdog ping (a watcher that hangs stops pinging)."""
        self.service.tick()
        self.links.prune()
        now = time.monotonic()
        self._trimmer.maybe()  # what a burst of requests or a report let go goes back to the kernel
        long, dropped = self._pauses.take()
        for gen, took, collected in long:
            log.info("garbage collection paused the daemon %.0f ms (generation %d, %d objects collected)",
                     took * 1000, gen, collected)
        if dropped:
            log.info("garbage collection paused the daemon %d more times for 20 ms or more", dropped)
        if self._watchdog is not None and now - self._pinged >= self._watchdog:
            self._pinged = now
            sdnotify.notify("WATCHDOG=1", f"STATUS=serving; {self._summary()}")

    def _reloaded(self, events: list[Event]) -> None:
        sdnotify.notify("RELOADING=1")
        try:
            with self.service.lock:
                self.service.handle(events)
                reconcile.reconcile(self.service)
            log.info("reloaded (SIGHUP)")
        finally:
            sdnotify.notify("READY=1", f"STATUS=serving; {self._summary()}")

    # ---------------------------------------------------------- requests
    def _handle(self, conn: socket.socket, clock: Optional[dict[str, int]] = None) -> None:
        # when the accept loop woke for the request, accepted it, and its thread began (ns), for the offload's log line
        clock = {**(clock or {}), "begun": time.monotonic_ns()}
        fds: list[int] = []
        kept = False  # a plugin's control link: the connection stays open
        try:
            conn.settimeout(5)
            pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != 0:
                self._reply(conn, {"ok": False, "error": "permission denied: only root may ask for a channel"})
                self.service.refused("not_root")
                return
            data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST + 1, 1)
            if flags & socket.MSG_CTRUNC:
                # pppd's pty did not fit (no fd left): without it held, xl2tpd
                # would see the pty close and end the call, so no offload
                self.service.refused("out_of_fds", pid)
                log.warning("channel request of pid %d refused: out of file descriptors (its pty did not fit)", pid)
                self._reply(conn, {"ok": False, "error": "pipexctl serve is out of file descriptors (LimitNOFILE)"})
                return
            while data and b"\n" not in data and len(data) <= MAX_REQUEST:
                chunk = conn.recv(MAX_REQUEST + 1)
                if not chunk:
                    break
                data += chunk
            if not data:
                return  # connected and closed without a request (a liveness probe)
            req, refusal = parse_request(data)
            if req is None:
                refusal = refusal or "malformed_request"
                self._reply(conn, {"ok": False, "error": refusal.replace("_", " ")})
                self.service.refused(refusal)
                return
            op = req.op
            if op == "status":
                self._status(conn)
            elif op == "metrics":
                self._reply(conn, {"ok": True, **self.service.metrics()})
            elif op == "reconcile":
                with self.service.lock:
                    self._reply(conn, {"ok": True, "reconcile": reconcile.reconcile(self.service)})
            elif op == "channel":
                pty = fds.pop(0) if fds and os.isatty(fds[0]) else None
                self._channel(conn, pid, pty, req.acks, clock=clock)
            elif op == "move":
                self._channel(conn, pid, None, acks=True, move=True, unit=req.unit, clock=clock)
            elif op == "link":
                kept = self._link(conn, pid)
            elif op == "path":
                try:
                    self._reply(conn, {"ok": True, **self._path(req)})
                except errors.PipexError as e:  # the operator named no movable call
                    self._reply(conn, {"ok": False, "error": str(e)})
            else:  # parse_request lets only known ops through
                raise AssertionError(op)
        except OSError as e:
            # unexpected (the offload itself rolls back and replies): say so
            # to the client, with the traceback in the log; out of fds is
            # expected under a low LimitNOFILE: counted, no traceback
            fds_out, gave_up = e.errno in (errno.EMFILE, errno.ENFILE), e.errno in (errno.EPIPE, errno.ECONNRESET)
            if fds_out:
                self.service.failed(e)
            log.warning("request failed: %s%s", e, " (the requester stopped waiting)" if gave_up else "",
                        exc_info=not (fds_out or gave_up))
            self._refuse(conn, f"request failed: {e}")
        except Exception:
            # a bug, or input nothing checked: this request is refused at once
            # (the plugin falls back to its pty), the daemon serves on
            log.exception("request failed")
            self._refuse(conn, "request failed: an error in pipexctl serve (its log has it)")
        finally:
            for fd in fds:
                os.close(fd)
            if not kept:
                conn.close()

    # ---------------------------------------------------------- control links and the operator's moves
    def _link(self, conn: socket.socket, pid: int) -> bool:
        """Keep ``conn`` as pppd ``pid``'s control link; False when refused."""
        _, refusal = prove_requester(pid)
        if refusal:
            self._reply(conn, {"ok": False, "error": REFUSALS[refusal].format(pid=pid), "retry": False})
            return False
        conn.settimeout(LINK_TIMEOUT)
        self._reply(conn, {"ok": True})
        self.links.add(pid, conn)
        return True

    def _path(self, req: Request) -> dict[str, Any]:
        """The operator's move of calls to the pty (``undo``) or into the kernel,
        through their plugins' control links: every link is written to first,
        then the answers are gathered (the plugins act at their next tick, so
        a thousand calls take about as long as one)."""
        to_pty = req.to == "pty"
        owned = self.service.by_pppd()
        cands: dict[int, tuple[Optional[int], int]]
        if to_pty:
            cands = {pid: (key[1], cid) for pid, (key, cid) in owned.items()}
        else:
            linked = set(self.links.pids())  # a plugin with a link runs the live move: on its pty if not owned
            cands = {c.pppd_pid: (c.tunnel_id, c.call_id) for c in self.watch.calls()
                     if c.pppd_pid and c.pppd_pid not in owned and (c.pppd_pid in linked or c.data_path != "kernel")}
        chosen = {pid: tc for pid, tc in cands.items()
                  if req.all or (tc[1] == req.call and req.tunnel in (None, tc[0]))}
        if not req.all and len(chosen) != 1:
            where = f"in tunnel {req.tunnel}" if req.tunnel else "in any tunnel"
            raise errors.InvalidArgumentError(
                f"call {req.call} {where}: {'no such call' if not chosen else 'several calls have this id'} "
                f"{'in the kernel' if to_pty else 'on a pty'} (pipexctl status lists them; --tunnel-id picks one)")
        failed: dict[str, str] = {}  # by call name ("TUNNEL/CALL")
        asked: dict[int, str] = {}  # pppd pid -> its call's name
        for pid, tc in chosen.items():
            link = self.links.get(pid)
            name = f"{tc[0]}/{tc[1]}"
            if link is None:
                failed[name] = "no control link (a plugin without the live move, or pipexctl_move 0)"
                continue
            try:
                link.sendall(b'{"op": "undo"}\n' if to_pty else b'{"op": "move"}\n')
                asked[pid] = name
            except OSError as e:
                failed[name] = f"control link: {e.strerror}"
        if to_pty and asked:
            self.service.failpoint("undo-asked")
        done = self._await_undone(asked, owned, failed) if to_pty else self._await_moved(asked, failed)
        log.info("operator's move %s: %d call(s) moved, %d not", "to the pty" if to_pty else "into the kernel",
                 len(done), len(failed))
        return {"to": req.to, "moved": sorted(done), "failed": failed}

    def _await_undone(self, asked: dict[int, str], owned: dict[int, tuple[tuple[str, int], int]],
                      failed: dict[str, str]) -> list[str]:
        done: list[str] = []
        sel = selectors.DefaultSelector()
        bufs: dict[int, bytes] = {}
        for pid in asked:
            link = self.links.get(pid)
            if link is not None:
                sel.register(link, selectors.EVENT_READ, pid)
        end = time.monotonic() + LINK_ANSWER_WAIT
        try:
            while sel.get_map() and time.monotonic() < end:
                for k, _ in sel.select(max(0.0, end - time.monotonic())):
                    pid = k.data
                    name = asked[pid]
                    sock = k.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        chunk = sock.recv(512)
                    except OSError:
                        chunk = b""
                    bufs[pid] = bufs.get(pid, b"") + chunk
                    if chunk and b"\n" not in bufs[pid]:
                        continue
                    sel.unregister(k.fileobj)
                    line = bufs[pid].split(b"\n")[0]
                    if line == b'{"op": "undone"}':
                        self.service.moved_back(*owned[pid], pid)
                        done.append(name)
                    else:
                        failed[name] = ("the plugin said: " + line.decode("utf-8", "replace")[:200]) if line \
                            else "control link closed"
        finally:
            for k in list(sel.get_map().values()):
                failed[asked[k.data]] = f"no answer within {LINK_ANSWER_WAIT:.0f} s"
            sel.close()
        return done

    def _await_moved(self, asked: dict[int, str], failed: dict[str, str]) -> list[str]:
        # the plugin asks for its channel as at a move of its own: done once the service records it
        end = time.monotonic() + LINK_ANSWER_WAIT
        left = dict(asked)
        done: list[str] = []
        while left and time.monotonic() < end:
            owned = self.service.by_pppd()
            for pid in [p for p in left if p in owned]:
                done.append(left.pop(pid))
            if left:
                self.stop.wait(0.1)
        for pid, name in left.items():
            failed[name] = self.service.pty_reasons.get(pid) or f"not moved within {LINK_ANSWER_WAIT:.0f} s"
        return done

    def _status(self, conn: socket.socket) -> None:
        """The status op: its reply sent as it is encoded, STATUS_SEND bytes
        at a time (a small status goes in one send, as a whole reply did: a
        client that reads it with one recv still gets all of it).  A failure
        once a part has gone out is logged and the connection closed: a
        refusal after half an object would make the whole answer unreadable."""
        sent, buf = False, bytearray()
        try:
            for piece in ok_reply(self.service.status_chunks()):
                buf += piece
                if len(buf) >= STATUS_SEND:
                    conn.sendall(buf)
                    sent = True
                    del buf[:]
            conn.sendall(buf)
        except Exception as e:
            if not sent:
                raise
            log.warning("status reply cut short: %s", e, exc_info=not isinstance(e, OSError))

    def _refuse(self, conn: socket.socket, error: str) -> None:
        """A failure's answer, if the requester still listens (when the hand-off itself failed, pppd is gone)."""
        try:
            self._reply(conn, {"ok": False, "error": error})
        except OSError:
            pass

    def _reply(self, conn: socket.socket, obj: dict[str, Any], fds: Optional[list[int]] = None) -> int:
        """Send one reply line; returns when it was sent (monotonic ns, taken
        just before the send: the requester may read it before send returns)."""
        data = reply(**obj)
        sent = time.monotonic_ns()
        if not fds:
            conn.sendall(data)
        else:
            socket.send_fds(conn, [data], fds)
        return sent

    @staticmethod
    def _await_ack(conn: socket.socket, pid: int) -> dict[str, object]:
        """The plugin's word that it holds a channel it checked; else (it
        timed out, or refused the sockets) the offload is undone."""
        conn.settimeout(ACK_TIMEOUT)
        line = b""
        try:
            while b"\n" not in line and len(line) < 256:
                chunk = conn.recv(256)
                if not chunk:
                    break
                line += chunk
        except socket.timeout:
            pass
        ack = parse_ack(line.split(b"\n")[0])
        if ack is None:
            raise errors.ChannelNotTakenError(f"pppd {pid} did not acknowledge its channel "
                                       f"({'closed' if not line else 'said ' + line[:60].decode('latin-1')!r})")
        return ack

    def _channel(self, conn: socket.socket, pid: int, pty: Optional[int], acks: bool, move: bool = False,
                 unit: Optional[int] = None, *, clock: dict[str, int]) -> None:
        held = False
        clock["read"] = time.monotonic_ns()
        try:
            held = self._channel_inner(conn, pid, pty, acks, move, unit, clock)
        finally:
            if pty is not None and not held:
                os.close(pty)  # not taken over: pppd stays on its pty

    def _channel_inner(self, conn: socket.socket, pid: int, pty: Optional[int], acks: bool, move: bool,
                       unit: Optional[int], clock: dict[str, int]) -> bool:
        """Offload pppd ``pid``'s call (``move``: a call running on its pty,
        ``unit`` its ppp unit); True when ``pty`` is now held by us."""
        try:
            pidfd: Optional[int] = os.pidfd_open(pid)  # first: the /proc reads below are then of this process
        except ProcessLookupError:
            pidfd = None
        try:
            return self._offload_for(conn, pid, pty, pidfd, acks, move, unit, clock)
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _offload_for(self, conn: socket.socket, pid: int, pty: Optional[int], pidfd: Optional[int],
                     acks: bool, move: bool, unit: Optional[int], clock: dict[str, int]) -> bool:
        svc = self.service
        xl2tpd_pid, refusal = prove_requester(pid) if pidfd is not None else (None, "requester_gone")
        if refusal or not _running(pidfd):
            refusal = refusal or "requester_gone"
            svc.refused(refusal, pid)
            log.warning("%s request of pid %d refused: %s", "move" if move else "channel", pid,
                        refusal.replace("_", " "))
            # not xl2tpd's pppd now, so never: a plugin that would ask again stops
            self._reply(conn, {"ok": False, "error": REFUSALS[refusal].format(pid=pid), "retry": False})
            return False
        t0, clock["proven"] = time.monotonic(), time.monotonic_ns()
        found: dict[str, float] = {}
        call, why = self.watch.call_of(pid, self.wait, xl2tpd_pid, found)
        t1 = time.monotonic()
        if call is None:
            svc.refused("no_call", pid)
            log.warning("pppd %d refused: no complete xl2tpd call within %.0f s: %s", pid, self.wait, why)
            self._reply(conn, {"ok": False, "error": f"no xl2tpd call for pppd {pid} within {self.wait:.0f} s: {why}"})
            return False

        def hand_off(meta: dict[str, object], fds: list[int]) -> None:
            if not _running(pidfd):  # the pppd that asked is gone: undo, send nothing
                raise errors.NotFoundError(f"pppd {pid} exited before its channel was sent")
            sent = self._reply(conn, {"ok": True, **meta, "tunnel_fd": len(fds) > 1, "v": VERSION}, fds=fds)
            if acks:
                ack = self._await_ack(conn, pid)
                got = time.monotonic_ns()
                stamps = ack_stamps(ack, sent, got)
                if stamps is not None:
                    asked, read, acked = stamps
                    seen_by_pppd.update(asked=asked, waited=read - asked, woke=read - sent, checked=acked - read,
                                        ack_read=got - acked)
                    if (cpu_wait := ack_cpu_wait(ack, asked, read)) is not None:
                        seen_by_pppd["cpu_wait"] = cpu_wait
            if move:  # kept from here on: the plugin swaps its channel only after this line
                svc.failpoint("move-acked")
                self._reply(conn, {"ok": True, "committed": True})

        timing: dict[str, float] = {}
        seen_by_pppd: dict[str, int] = {}  # ns, from the plugin's stamps in its ack
        try:
            ch, meta = svc.offload(call, pid, _ttyname(pty), hand_off, xl2tpd_pid=xl2tpd_pid, timing=timing, moved=move,
                                unit=unit)
        except (errors.PipexError, OSError) as e:
            svc.failed(e, pid)
            log.warning("offload of call %d (pppd %d) failed: %s", call.call_id, pid, e)
            self._refuse(conn, str(e))
            return False
        ch.close()  # pppd holds the only copy now
        svc.failpoint("channel-sent")
        svc.offloaded(time.monotonic() - t0, moved=move)
        log.info("call %d (tunnel %d) of pppd %d %s in %.0f ms (ms: discovery %.0f, of it the call's line %.0f, "
                 "lock %.0f, kernel %.0f, of it on a CPU %.0f and waiting for one %.0f, state file %.0f, "
                 "hand-off %.0f)%s", call.call_id, call.tunnel_id, pid,
                 "moved from its pty into the kernel" if move else "offloaded",
                 (time.monotonic() - t0) * 1000, (t1 - t0) * 1000, found.get("line", 0) * 1000,
                 *(timing.get(k, 0) * 1000 for k in ("lock", "build", "build_cpu", "build_runnable", "state",
                                                     "hand_off")),
                 _as_pppd_saw(seen_by_pppd, clock),
                 extra={"journal": {"TUNNEL_ID": call.tunnel_id, "CALL_ID": call.call_id, "PEER": call.peer,
                                    "PPPD_PID": pid, "EVENT": "moved" if move else "offloaded"}})
        if pty is None:
            return False
        svc.ptys.hold(call_key(call.instance, int(meta["tunnel_id"]), call.call_id), pty)
        return True
