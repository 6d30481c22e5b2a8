"""The offload's data path: one kernel-mode UDP socket per tunnel, and the
relay that hands what the kernel passes up back to xl2tpd.

The tunnel's socket is made as xl2tpd's own kernel mode makes it: bound to
xl2tpd's address and port (LOCAL:1701, ``SO_REUSEADDR`` beside xl2tpd's
listening socket), connected to the peer.  Linux scores a connected socket
above an unconnected one, so every packet from PEER:PORT reaches it; the
kernel L2TP code keeps the data packets of its sessions and passes the rest
up to the socket: control packets (T bit), and data of sessions it does not
hold (a call that stayed on the pty).  No packet is rewritten, so IPsec
policies on UDP/1701 select the tunnel's traffic as they select xl2tpd's,
and there is no rule for a firewall reload to remove.

What is passed up belongs to xl2tpd, and :class:`Relay` hands it over:

- a packet of a known tunnel (tunnel id not 0) is sent to xl2tpd from a
  socket of the relay: xl2tpd finds the tunnel by its id and never looks at
  the source of a known tunnel's packets, and the copy cannot loop back into
  the tunnel's socket (it does not come from PEER:PORT);
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

Linux before 6.11 looks a data packet's session up in the tunnel of the
socket that received it, so a second tunnel from the same PEER:PORT (a
twin) gets a socket on a private port and its data packets are steered to it
by nftables (steering.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import struct
import threading
import time
from typing import Optional, Protocol

from .. import errors, netns as _netns
from .steering import Nft, Steering, Twin

log = logging.getLogger("pipexctl.serve")

SO_NO_CHECK = 11  # asm-generic/socket.h
MAX_DATAGRAM = 65535
L2TP_FLAG_L = 0x4000
L2TP_VERSION_MASK = 0x000F

Key = tuple[str, int, str, int]  # local address and port, peer address and port


class DataPath(Protocol):
    """What the offload service needs from a data path (see KernelDataPath)."""

    def local_for(self, peer: str, peer_port: int) -> str: ...

    def open(self, local: str, peer: str, peer_port: int, tunnel_id: int, twin: bool) -> socket.socket: ...

    def attach(self, sock: socket.socket) -> None: ...

    def adopt(self, sock: socket.socket, tunnel_id: int) -> None: ...

    def close_tunnel(self, sock: socket.socket, tunnel_id: int) -> None: ...

    def release(self, sock: socket.socket) -> None: ...

    def check(self) -> None: ...

    def settle(self) -> None: ...

    def stats(self) -> dict: ...

    def close(self) -> None: ...


def _route_source(peer: str, peer_port: int) -> str:
    """The local address the kernel would send from toward ``peer``."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((peer, peer_port))
        return probe.getsockname()[0]
    except OSError as e:
        raise errors.SocketError(f"no route to {peer}: {e.strerror}") from None
    finally:
        probe.close()


def key_of(sock: socket.socket) -> Key:
    return (*sock.getsockname(), *sock.getpeername())


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

    def __init__(self, l2tp_port: int = 1701, netns: Optional[str] = None) -> None:
        self.l2tp_port, self.netns = l2tp_port, netns
        with _in(netns):
            self.out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.out.bind(("127.0.0.1", 0))
            try:
                self.raw: Optional[socket.socket] = socket.socket(socket.AF_INET, socket.SOCK_RAW,
                                                                  socket.IPPROTO_RAW)
            except PermissionError:
                self.raw = None  # no CAP_NET_RAW: a twin's SCCRQ cannot keep its source
                log.warning("relay: no raw socket (CAP_NET_RAW); an SCCRQ from the peer of an offloaded tunnel "
                            "will not reach xl2tpd until that tunnel ends")
        self.sel = selectors.DefaultSelector()  # epoll: no fd-number limit
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._pending: list[tuple[str, Optional[socket.socket], Key]] = []
        self._target: tuple[float, Optional[str]] = (0.0, None)  # when read, xl2tpd's address
        self.relayed = 0
        self.dropped = 0
        self.errors = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()

    def attach(self, sock: socket.socket) -> None:
        self._change(("add", sock.dup(), key_of(sock)))

    def detach(self, key: Key) -> None:
        self._change(("del", None, key))

    def close(self) -> None:
        self._stop = True
        self._kick()
        self._thread.join(5)
        for s in (self.out, self.raw):
            if s is not None:
                s.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _change(self, change) -> None:
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
        for op, sock, key in todo:
            self._drop(key)  # a socket for the same addresses can only be a stale one
            if op == "add":
                sock.setblocking(False)
                self.sel.register(sock, selectors.EVENT_READ, key)

    def _drop(self, key: Key) -> None:
        for k in list(self.sel.get_map().values()):
            if k.data == key:
                self.sel.unregister(k.fileobj)
                k.fileobj.close()

    def _run(self) -> None:
        while not self._stop:
            try:
                self._apply_pending()
                for k, _ in self.sel.select(5):
                    if k.data is None:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                        continue
                    self._drain(k.fileobj, k.data)
            except Exception:  # the tunnels' control depends on this thread: never let it die
                self.errors += 1
                log.exception("relay: unexpected error; relaying on")
                time.sleep(0.1)
        for k in list(self.sel.get_map().values()):
            if k.data is not None:
                k.fileobj.close()
        self.sel.close()

    def _drain(self, sock: socket.socket, key: Key) -> None:
        _, _, peer, peer_port = key
        for _ in range(64):  # then let the other sockets have a turn
            try:
                data = sock.recv(MAX_DATAGRAM)
            except BlockingIOError:
                return
            except OSError as e:
                # an ICMP error is reported on a connected UDP socket: read on
                if e.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                    log.warning("relay: reading the tunnel socket to %s:%d: %s", peer, peer_port, e.strerror)
                    self.errors += 1
                continue
            self._hand_over(data, peer, peer_port)

    def _xl2tpd_address(self) -> Optional[str]:
        """xl2tpd's listening address, read again at most once a second
        (the table is long with many tunnels)."""
        now = time.monotonic()
        if now - self._target[0] > 1.0:
            with _in(self.netns):
                self._target = (now, xl2tpd_address(self.l2tp_port))
        return self._target[1]

    def _hand_over(self, data: bytes, peer: str, peer_port: int) -> None:
        target = self._xl2tpd_address()
        try:
            if l2tp_tunnel_id(data) != 0:
                self.out.sendto(data, ("127.0.0.1" if target in (None, "0.0.0.0") else target, self.l2tp_port))
            elif target == "0.0.0.0" and self.raw is not None:
                self.raw.sendto(udp_packet((peer, peer_port), ("127.0.0.1", self.l2tp_port), data), ("127.0.0.1", 0))
            else:
                self.dropped += 1
                log.warning("relay: an SCCRQ from %s:%d (an offloaded tunnel's peer address and port) cannot reach "
                            "xl2tpd with its source: xl2tpd listens on %s only, not on every address; dropped (the "
                            "peer retries)", peer, peer_port, target)
                return
            self.relayed += 1
        except (OSError, ValueError) as e:
            self.errors += 1
            log.warning("relay: cannot hand a %d-byte packet from %s:%d to xl2tpd: %s", len(data), peer, peer_port, e)


class KernelDataPath:
    """Tunnel sockets as xl2tpd's kernel mode makes them, the relay, and
    the steering of twins."""

    def __init__(self, l2tp_port: int = 1701, netns: Optional[str] = None) -> None:
        self.l2tp_port, self.netns = l2tp_port, netns
        self.relay = Relay(l2tp_port, netns)
        self.steering = Steering(Nft(netns), l2tp_port)

    def local_for(self, peer: str, peer_port: int) -> str:
        with _in(self.netns):
            return _route_source(peer, peer_port)

    def open(self, local: str, peer: str, peer_port: int, tunnel_id: int, twin: bool) -> socket.socket:
        """The tunnel's UDP socket, connected to PEER:PORT and relayed: on
        LOCAL:l2tp_port, or for a twin on a private port with its steering."""
        with _in(self.netns):
            s = _udp_socket(local, self.l2tp_port if not twin else 0, peer, peer_port)
        try:
            if twin:
                self.steering.add(Twin(local, s.getsockname()[1], peer, peer_port, tunnel_id))
            self.relay.attach(s)
        except BaseException:
            s.close()
            raise
        return s

    def attach(self, sock: socket.socket) -> None:
        """Relay ``sock`` (a tunnel socket taken back at start, before the
        reconcile decides about it: what waits in it is xl2tpd's anyway)."""
        self.relay.attach(sock)

    def adopt(self, sock: socket.socket, tunnel_id: int) -> None:
        """A tunnel socket taken back after a restart: relay it, and count a
        twin's steering (settle() writes the table for all at once)."""
        local, port, peer, peer_port = key_of(sock)
        if port != self.l2tp_port:
            self.steering.hold(Twin(local, port, peer, peer_port, tunnel_id))
        self.relay.attach(sock)

    def close_tunnel(self, sock: socket.socket, tunnel_id: int) -> None:
        """Stop relaying (and steering) ``sock``'s tunnel, then close it."""
        try:
            local, port, peer, peer_port = key_of(sock)
        except OSError:
            sock.close()
            return
        self.relay.detach((local, port, peer, peer_port))
        if port != self.l2tp_port:
            errors.quietly(lambda: self.steering.remove(Twin(local, port, peer, peer_port, tunnel_id)), log)
        sock.close()

    def release(self, sock: socket.socket) -> None:
        """Stop relaying ``sock`` and close our copy, leaving steering in
        place (the daemon stops; the kernel tunnel lives on in pppd)."""
        try:
            self.relay.detach(key_of(sock))
        except OSError:
            pass
        sock.close()

    def check(self) -> None:
        errors.quietly(self.steering.check, log)

    def settle(self) -> None:
        errors.quietly(self.steering.settle, log)

    def stats(self) -> dict:
        r = self.relay
        return {"relayed": r.relayed, "dropped": r.dropped, "errors": r.errors, "twins": len(self.steering.twins),
                "steering_restored": self.steering.restored}

    def close(self) -> None:
        self.relay.close()


def _udp_socket(local: str, port: int, peer: str, peer_port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # no UDP checksums, like xl2tpd's own sockets (SO_NO_CHECK)
        s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        s.bind((local, port))
        s.connect((peer, peer_port))
    except OSError as e:
        s.close()
        raise errors.SocketError(f"cannot open the tunnel socket {local}:{port} <-> {peer}:{peer_port}: "
                                 f"{e.strerror}") from None
    return s


class NullDataPath:
    """For unit tests on a host without L2TP: plain sockets, no relay, twins
    recorded instead of steered."""

    def __init__(self) -> None:
        self.tunnels: dict[int, tuple[bool, socket.socket]] = {}

    def local_for(self, peer: str, peer_port: int) -> str:
        return _route_source(peer, peer_port)

    def open(self, local: str, peer: str, peer_port: int, tunnel_id: int, twin: bool) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.connect(("127.0.0.1", 9))
        self.tunnels[tunnel_id] = (twin, s)
        return s

    def attach(self, sock: socket.socket) -> None:
        pass

    def adopt(self, sock: socket.socket, tunnel_id: int) -> None:
        self.tunnels[tunnel_id] = (False, sock)

    def close_tunnel(self, sock: socket.socket, tunnel_id: int) -> None:
        self.tunnels.pop(tunnel_id, None)
        sock.close()

    def release(self, sock: socket.socket) -> None:
        sock.close()

    def check(self) -> None:
        pass

    def settle(self) -> None:
        pass

    def stats(self) -> dict:
        return {"relayed": 0, "dropped": 0, "errors": 0, "twins": sum(t for t, _ in self.tunnels.values()),
                "steering_restored": 0}

    def close(self) -> None:
        self.tunnels.clear()


def _in(netns: Optional[str]):
    """Sockets opened in the body belong to ``netns`` (None: this one)."""
    return _netns.enter(netns) if netns else contextlib.nullcontext()
