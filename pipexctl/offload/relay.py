"""The relay: hands what the kernel passes up on tunnel sockets to xl2tpd.

xl2tpd in userspace mode reads only its own listening socket, so what the
kernel L2TP code passes up on a tunnel's socket (control packets, data of a
call still on its pty) is handed to it through the loopback:

- a packet of a known tunnel (tunnel id not 0) is sent from a relay socket
  on 127.0.0.1: xl2tpd finds the tunnel by its id and never looks at the
  source of a known tunnel's packets, and the copy cannot land on the
  tunnel's socket again (it does not come from PEER:PORT);
- a packet with tunnel id 0 (SCCRQ: a second tunnel from the same PEER:PORT)
  must keep its source, because xl2tpd records it as the new tunnel's peer.
  It is written with a raw socket, source PEER:PORT, to 127.0.0.1, where
  only xl2tpd's wildcard socket listens.  An xl2tpd bound to one address
  (``listen-addr``) cannot be reached that way without the copy landing on
  the tunnel's socket again: such a packet is dropped with a warning, and
  the peer's retransmission gets through once the first tunnel is gone.

Copies go through ``lo``, where the kernel skips IPsec policy checks
(``disable_policy``), so a decrypted packet's copy is not refused for lack
of ESP.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import threading
import time
from typing import Any, Optional

from .. import defaults, netns as _netns
from ..poller import Poller

log = logging.getLogger("pipexctl.serve")

MAX_DATAGRAM = 65535
L2TP_FLAG_L = 0x4000
L2TP_VERSION_MASK = 0x000F

Key = tuple[str, int, str, int]  # local address and port, peer address and port


def key_of(sock: socket.socket) -> Key:
    return (*sock.getsockname(), *sock.getpeername())


def _peer(sock: socket.socket) -> tuple[str, int]:
    """A tunnel socket's peer address and port (("?", 0) if it has none any more)."""
    try:
        host, port = sock.getpeername()
        return host, port
    except OSError:
        return "?", 0


def _identity(sock: socket.socket) -> int:
    """The socket itself (its inode, shared by every dup): two tunnels can
    have sockets with the same addresses on Linux 6.11+."""
    return os.fstat(sock.fileno()).st_ino


def udp_packet(src: tuple[str, int], dst: tuple[str, int], payload: bytes) -> bytes:
    """An IPv4 + UDP datagram for a raw ``IPPROTO_RAW`` socket (pure).

    The kernel fills in the IP checksum, and the id when it is 0; the UDP
    checksum is 0 (none), as xl2tpd's own packets carry."""
    length = 8 + len(payload)
    if 20 + length > MAX_DATAGRAM:
        raise ValueError(f"datagram of {length} bytes does not fit in IPv4")
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + length, 0, 0x4000, 64, socket.IPPROTO_UDP, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
    return ip + struct.pack("!HHHH", src[1], dst[1], length, 0) + payload


def l2tp_tunnel_id(packet: bytes) -> Optional[int]:
    """The tunnel id of an L2TPv2 packet, or None if it is not one (pure)."""
    if len(packet) < 6:
        return None
    flags = struct.unpack_from("!H", packet)[0]
    if flags & L2TP_VERSION_MASK != 2:
        return None
    off = 4 if flags & L2TP_FLAG_L else 2
    return struct.unpack_from("!H", packet, off)[0] if len(packet) >= off + 2 else None


def xl2tpd_address(l2tp_port: int, proc_net_udp: str = "/proc/thread-self/net/udp") -> Optional[str]:
    """The address xl2tpd's listening socket is bound to in this namespace
    ("0.0.0.0" for every address), from the unconnected UDP sockets on
    ``l2tp_port``; None when there is none."""
    found = None
    try:
        with open(proc_net_udp) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                local, remote = cols[1], cols[2]
                addr, port = local.split(":")
                if int(port, 16) != l2tp_port or remote != "00000000:0000":
                    continue
                a = socket.inet_ntoa(struct.pack("<I", int(addr, 16)))
                if a == "0.0.0.0":
                    return a
                found = a
    except OSError:
        return None
    return found


class Relay:
    """Hands what the kernel passes up on tunnel sockets to xl2tpd (one thread)."""

    def __init__(self, l2tp_port: int = defaults.L2TP_PORT, netns: Optional[str] = None) -> None:
        self.l2tp_port, self.netns = l2tp_port, netns
        with _netns.maybe_enter(netns):
            self.out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.out.bind(("127.0.0.1", 0))
            try:
                self.raw: Optional[socket.socket] = socket.socket(socket.AF_INET, socket.SOCK_RAW,
                                                                  socket.IPPROTO_RAW)
            except PermissionError:
                self.raw = None  # no CAP_NET_RAW: a twin's SCCRQ cannot keep its source
                log.warning("relay: no raw socket (CAP_NET_RAW); an SCCRQ from the peer of an offloaded tunnel "
                            "will not reach xl2tpd until that tunnel ends")
        self.sel: Poller[Optional[socket.socket]] = Poller()  # epoll: no fd-number limit
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(self._wake_r, None)
        self._lock = threading.Lock()
        # (op, our copy of the socket to add or the event a detach waits on, the socket's identity)
        self._pending: list[tuple[str, Any, int]] = []
        self._by_ident: dict[int, socket.socket] = {}  # the relay thread's own: our copy of each socket relayed
        self._target: tuple[float, Optional[str]] = (0.0, None)  # when read, xl2tpd's address
        self._warned: dict[tuple[str, int], float] = {}  # (peer, port) -> when its dropped SCCRQ was last logged
        self.relayed = 0
        self.dropped = 0
        self.errors = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()

    def attach(self, sock: socket.socket) -> None:
        self._change(("add", sock.dup(), _identity(sock)))

    def detach(self, sock: socket.socket, wait: bool = False) -> None:
        """Stop relaying ``sock``.  With ``wait``, return once the relay
        thread has let go of its copy (at most 2 s), so that no datagram
        arriving afterwards is read by the relay."""
        done = threading.Event()
        self._change(("del", done, _identity(sock)))
        if wait and self._thread.is_alive() and threading.current_thread() is not self._thread:
            done.wait(2.0)

    def close(self) -> None:
        self._stop = True
        self._kick()
        self._thread.join(5)
        for s in (self.out, self.raw):
            if s is not None:
                s.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _change(self, change: tuple[str, Any, int]) -> None:
        with self._lock:
            self._pending.append(change)
        self._kick()

    def _kick(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # already awake

    def _apply_pending(self) -> None:
        with self._lock:
            todo, self._pending = self._pending, []
        for op, obj, ident in todo:
            self._drop(ident)  # attaching a socket twice keeps one copy
            if op == "add":
                obj.setblocking(False)
                # the socket alone: its peer is read when a packet needs it (one
                # tuple and two strings less per tunnel held)
                self.sel.register(obj.fileno(), obj)
                self._by_ident[ident] = obj
            else:
                obj.set()

    def _drop(self, ident: int) -> None:
        # by identity, not by a walk of every socket: attach and detach cost
        # the same with 10,000 tunnels relayed
        sock = self._by_ident.pop(ident, None)
        if sock is not None:
            self.sel.unregister(sock.fileno())
            sock.close()

    def _run(self) -> None:
        while not self._stop:
            try:
                self._apply_pending()
                for _fd, sock in self.sel.select(5):
                    if sock is None:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                        continue
                    self._drain(sock)
            except Exception:  # the tunnels' control depends on this thread: never let it die
                self.errors += 1
                log.exception("relay: unexpected error; relaying on")
                time.sleep(0.1)
        for sock in self._by_ident.values():
            sock.close()
        self._by_ident.clear()
        self.sel.close()

    def _drain(self, sock: socket.socket) -> None:
        peer: Optional[tuple[str, int]] = None
        for _ in range(64):  # then let the other sockets have a turn
            try:
                data = sock.recv(MAX_DATAGRAM)
            except BlockingIOError:
                return
            except OSError as e:
                # an ICMP error is reported on a connected UDP socket: read on
                if e.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                    log.warning("relay: reading the tunnel socket to %s:%d: %s", *_peer(sock), e.strerror)
                    self.errors += 1
                continue
            if peer is None:
                peer = _peer(sock)
            self._hand_over(data, *peer)

    def _xl2tpd_address(self) -> Optional[str]:
        """xl2tpd's listening address, read again at most once a second
        (the table is long with many tunnels)."""
        now = time.monotonic()
        if now - self._target[0] > 1.0:
            with _netns.maybe_enter(self.netns):
                self._target = (now, xl2tpd_address(self.l2tp_port))
        return self._target[1]

    @staticmethod
    def _known_tunnel_dest(target: Optional[str], port: int) -> tuple[str, int]:
        """Where a known tunnel's packet goes: xl2tpd's address, or loopback
        when xl2tpd listens on every address (or its address is unknown)."""
        return ("127.0.0.1" if target in (None, "0.0.0.0") else target, port)

    def pass_frames(self, tunnel_id: int, session_id: int, frames: list[bytes]) -> int:
        """Hand PPP frames (protocol field on) to xl2tpd as the call's L2TPv2
        data packets, as the peer sent them: a live move's session received
        them before its channel was under pppd's unit, and xl2tpd carries
        them to pppd over the pty.  Returns how many were sent."""
        dest = self._known_tunnel_dest(self._xl2tpd_address(), self.l2tp_port)
        head = struct.pack("!HHH", 0x0002, tunnel_id, session_id) + b"\xff\x03"  # version 2, no L/S/O bits
        sent = 0
        for frame in frames:
            try:
                self.out.sendto(head + frame, dest)
                sent += 1
            except OSError as e:
                self.errors += 1
                log.warning("relay: cannot hand a frame of session %d/%d to xl2tpd: %s", tunnel_id, session_id, e)
        self.relayed += sent
        return sent

    def _hand_over(self, data: bytes, peer: str, peer_port: int) -> None:
        target = self._xl2tpd_address()
        try:
            if l2tp_tunnel_id(data) != 0:
                self.out.sendto(data, self._known_tunnel_dest(target, self.l2tp_port))
            elif target == "0.0.0.0" and self.raw is not None:
                self.raw.sendto(udp_packet((peer, peer_port), ("127.0.0.1", self.l2tp_port), data), ("127.0.0.1", 0))
            else:
                self.dropped += 1
                # a peer (or a forger of its address) decides how often: one line a minute per peer
                if time.monotonic() - self._warned.get((peer, peer_port), -60.0) >= 60.0:
                    self._warned[(peer, peer_port)] = time.monotonic()
                    log.warning("relay: an SCCRQ from %s:%d (an offloaded tunnel's peer address and port) cannot "
                                "reach xl2tpd with its source: xl2tpd listens on %s only, not on every address; "
                                "dropped (the peer retries; %d dropped so far)", peer, peer_port, target, self.dropped)
                return
            self.relayed += 1
        except (OSError, ValueError) as e:
            self.errors += 1
            log.warning("relay: cannot hand a %d-byte packet from %s:%d to xl2tpd: %s", len(data), peer, peer_port, e)
