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

What is passed up belongs to xl2tpd: :class:`relay.Relay` hands it over.

A second tunnel from the same PEER:PORT (a twin): Linux 6.11+ finds a data
packet's session by tunnel and session id in the namespace, whichever of
the tunnels' sockets received it, so a twin's socket is made like any
other.  Linux before 6.11 looks only in the receiving socket's tunnel, so
there a twin gets a socket on a private port and its data packets are
steered to it by nftables (steering.py).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from typing import Optional, Protocol

from .. import defaults, errors, netns as _netns
from ..kernel.check import sessions_per_namespace
from ..kernel.pppol2tp import udp_socket
from .relay import Relay, key_of
from .steering import Nft, Steering, Twin

log = logging.getLogger("pipexctl.serve")



class DataPath(Protocol):
    """What the offload service needs from a data path (see KernelDataPath)."""

    def local_for(self, peer: str, peer_port: int) -> str: ...

    def open(self, local: str, peer: str, peer_port: int, tunnel_id: int, twin: bool) -> socket.socket: ...

    def attach(self, sock: socket.socket) -> None: ...

    def adopt(self, sock: socket.socket, tunnel_id: int) -> None: ...

    def close_tunnel(self, sock: socket.socket, tunnel_id: int) -> None: ...

    def release(self, sock: socket.socket) -> None: ...

    def pass_frames(self, tunnel_id: int, session_id: int, frames: list[bytes]) -> int: ...

    def check(self) -> None: ...

    def watching(self) -> bool: ...

    def settle(self) -> None: ...

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...


def _route_source(peer: str, peer_port: int) -> str:
    """The local address the kernel would send from toward ``peer``."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((peer, peer_port))
        host: str = probe.getsockname()[0]  # AF_INET: (host, port)
        return sys.intern(host)  # a box has a handful of local addresses: one string each, not one per tunnel
    except OSError as e:
        raise errors.SocketError(f"no route to {peer}: {e.strerror}") from None
    finally:
        probe.close()


class KernelDataPath:
    """Tunnel sockets as xl2tpd's kernel mode makes them, the relay, and
    the steering of twins."""

    def __init__(self, l2tp_port: int = defaults.L2TP_PORT, netns: Optional[str] = None,
                 steer_twins: Optional[bool] = None) -> None:
        """``steer_twins``: give twins private ports and nft steering; by
        default only where the kernel needs it (before 6.11)."""
        self.l2tp_port, self.netns = l2tp_port, netns
        self.steer_twins = not sessions_per_namespace() if steer_twins is None else steer_twins
        self.relay = Relay(l2tp_port, netns)
        self._check_warned = float("-inf")
        self.steering = Steering(Nft(netns), l2tp_port)

    def local_for(self, peer: str, peer_port: int) -> str:
        with _netns.maybe_enter(self.netns):
            return _route_source(peer, peer_port)

    def open(self, local: str, peer: str, peer_port: int, tunnel_id: int, twin: bool) -> socket.socket:
        """The tunnel's UDP socket, connected to PEER:PORT and relayed: on
        LOCAL:l2tp_port, or for a twin that must be steered on a private
        port with its steering."""
        steer = twin and self.steer_twins
        if steer:
            self._refuse_twin_under_ipsec(tunnel_id, peer, peer_port)
        with _netns.maybe_enter(self.netns):
            # no UDP checksums, like xl2tpd's own sockets
            s = udp_socket((local, self.l2tp_port if not steer else 0), (peer, peer_port), no_check=True)
        try:
            if steer:
                self.steering.add(Twin(local, s.getsockname()[1], peer, peer_port, tunnel_id))
            self.relay.attach(s)
        except BaseException:
            self.close_tunnel(s, tunnel_id)  # a twin's elements too, if they went in
            raise
        return s

    def attach(self, sock: socket.socket) -> None:
        """Relay ``sock`` (a tunnel socket taken back at start, before the
        reconcile decides about it: what waits in it is xl2tpd's anyway)."""
        self.relay.attach(sock)

    def _refuse_twin_under_ipsec(self, tunnel_id: int, peer: str, peer_port: int) -> None:
        """A twin's private port is chosen before the rewrite to 1701, so an
        IPsec policy on UDP/1701 would not select its packets: with any
        outbound policy configured (or when that cannot be read) a twin is
        refused, and its calls stay on the pty, rather than leave in cleartext."""
        cmd = (["ip", "-n", self.netns] if self.netns else ["ip"]) + ["xfrm", "policy", "list", "dir", "out"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            policies = r.stdout.strip() if r.returncode == 0 else f"unreadable: {r.stderr.strip()[:200]}"
        except (OSError, subprocess.TimeoutExpired) as e:
            policies = f"unreadable: {e}"
        if policies:
            seen = "cannot tell" if policies.startswith("unreadable") else "ip xfrm policy"
            raise errors.ConflictError(
                f"tunnel {tunnel_id} is a second tunnel from {peer}:{peer_port}, which needs a steered private "
                f"port, and IPsec policies are configured ({seen}): a private port would escape a policy on "
                f"UDP/1701, so its calls stay on the pty")

    def pass_frames(self, tunnel_id: int, session_id: int, frames: list[bytes]) -> int:
        """Frames a moved call's session took before its channel was under
        pppd's unit: to xl2tpd, which still carries the call on its pty."""
        return self.relay.pass_frames(tunnel_id, session_id, frames)

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
        self.relay.detach(sock)
        if port != self.l2tp_port:
            errors.quietly(lambda: self.steering.remove(Twin(local, port, peer, peer_port, tunnel_id)), log)
        sock.close()

    def release(self, sock: socket.socket) -> None:
        """Stop relaying ``sock`` and close our copy, leaving steering in
        place (the daemon stops; the kernel tunnel lives on in pppd)."""
        try:
            self.relay.detach(sock)
        except OSError:
            pass
        sock.close()

    def check(self) -> None:
        try:
            self.steering.check()
            self._check_warned = float("-inf")  # a new failure is said at once
        except errors.PipexError as e:  # retried every half second: said once a minute
            now = time.monotonic()
            if now - self._check_warned >= 60:
                self._check_warned = now
                log.warning("cannot restore the twins' steering (retried twice a second): %s", e)

    def watching(self) -> bool:
        """The twins' table exists and must be checked twice a second."""
        return bool(self.steering.twins)

    def settle(self) -> None:
        # where twins are not steered (Linux 6.11+) nft is never touched, unless adopted sockets are steered
        if self.steer_twins or self.steering.twins:
            errors.quietly(self.steering.settle, log)

    def stats(self) -> dict[str, int]:
        r = self.relay
        return {"relayed": r.relayed, "dropped": r.dropped, "errors": r.errors, "twins": len(self.steering.twins),
                "steering_restored": self.steering.restored}

    def close(self) -> None:
        self.relay.close()


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

    def pass_frames(self, tunnel_id: int, session_id: int, frames: list[bytes]) -> int:
        return len(frames)  # no xl2tpd to hand them to

    def check(self) -> None:
        pass

    def watching(self) -> bool:
        return any(t for t, _ in self.tunnels.values())

    def settle(self) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {"relayed": 0, "dropped": 0, "errors": 0, "twins": sum(t for t, _ in self.tunnels.values()),
                "steering_restored": 0}

    def close(self) -> None:
        self.tunnels.clear()
