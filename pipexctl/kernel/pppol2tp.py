"""PPPoL2TP sockets (AF_PPPOX / PX_PROTO_OL2TP).

Python's ``socket`` module can create an AF_PPPOX socket but cannot build its
address, so ``connect(2)`` is called through ctypes with the packed
``struct sockaddr_pppol2tp*`` layouts of ``linux/if_pppox.h``.  The four
layouts (v2/v3, IPv4/IPv6) are checked against the C headers by
``tests/unit/test_uapi.py``.  Written by hand because no maintained Python
library wraps PPPoL2TP; it is small and pinned by those tests.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import fcntl
import ipaddress
import os
import socket
import struct
from typing import Optional

from .. import defaults, errors
from ..model import Stats
from ..records import names
from . import uapi

_libc = ctypes.CDLL(defaults.LIBC, use_errno=True)
# the same libc, called without giving up the GIL: a live move's connect and
# the ioctls that put its channel under pppd's unit run with no other thread
# of the daemon in between (what arrives meanwhile waits on the channel)
_libc_held = ctypes.PyDLL(defaults.LIBC, use_errno=True)


class sockaddr_in(ctypes.Structure):
    _fields_ = [
        ("sin_family", ctypes.c_uint16),
        ("sin_port", ctypes.c_uint16),  # network order
        ("sin_addr", ctypes.c_uint8 * 4),
        ("sin_zero", ctypes.c_uint8 * 8),
    ]


class sockaddr_in6(ctypes.Structure):
    _fields_ = [
        ("sin6_family", ctypes.c_uint16),
        ("sin6_port", ctypes.c_uint16),
        ("sin6_flowinfo", ctypes.c_uint32),
        ("sin6_addr", ctypes.c_uint8 * 16),
        ("sin6_scope_id", ctypes.c_uint32),
    ]


class pppol2tp_addr(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int),
        ("fd", ctypes.c_int),
        ("addr", sockaddr_in),
        ("s_tunnel", ctypes.c_uint16),
        ("s_session", ctypes.c_uint16),
        ("d_tunnel", ctypes.c_uint16),
        ("d_session", ctypes.c_uint16),
    ]


class pppol2tpin6_addr(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int),
        ("fd", ctypes.c_int),
        ("s_tunnel", ctypes.c_uint16),
        ("s_session", ctypes.c_uint16),
        ("d_tunnel", ctypes.c_uint16),
        ("d_session", ctypes.c_uint16),
        ("addr", sockaddr_in6),
    ]


class pppol2tpv3_addr(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int),
        ("fd", ctypes.c_int),
        ("addr", sockaddr_in),
        ("s_tunnel", ctypes.c_uint32),
        ("s_session", ctypes.c_uint32),
        ("d_tunnel", ctypes.c_uint32),
        ("d_session", ctypes.c_uint32),
    ]


class pppol2tpv3in6_addr(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int),
        ("fd", ctypes.c_int),
        ("s_tunnel", ctypes.c_uint32),
        ("s_session", ctypes.c_uint32),
        ("d_tunnel", ctypes.c_uint32),
        ("d_session", ctypes.c_uint32),
        ("addr", sockaddr_in6),
    ]


def _sockaddr(inner: type[ctypes.Structure]) -> type[ctypes.Structure]:
    class _S(ctypes.Structure):
        _pack_ = 1  # __attribute__((packed))
        _fields_ = [("sa_family", ctypes.c_uint16), ("sa_protocol", ctypes.c_uint), ("pppol2tp", inner)]

    _S.__name__ = "sockaddr_" + inner.__name__.replace("_addr", "")
    return _S


sockaddr_pppol2tp = _sockaddr(pppol2tp_addr)
sockaddr_pppol2tpin6 = _sockaddr(pppol2tpin6_addr)
sockaddr_pppol2tpv3 = _sockaddr(pppol2tpv3_addr)
sockaddr_pppol2tpv3in6 = _sockaddr(pppol2tpv3in6_addr)


class pppol2tp_ioc_stats(ctypes.Structure):
    _fields_ = [
        ("tunnel_id", ctypes.c_uint16),
        ("session_id", ctypes.c_uint16),
        ("using_ipsec", ctypes.c_uint32),  # a 1-bit field in a u32
        ("tx_packets", ctypes.c_uint64),
        ("tx_bytes", ctypes.c_uint64),
        ("tx_errors", ctypes.c_uint64),
        ("rx_packets", ctypes.c_uint64),
        ("rx_bytes", ctypes.c_uint64),
        ("rx_seq_discards", ctypes.c_uint64),
        ("rx_oos_packets", ctypes.c_uint64),
        ("rx_errors", ctypes.c_uint64),
    ]


def build_sockaddr(
    *,
    version: int,
    tunnel_id: int,
    session_id: int,
    peer_tunnel_id: int,
    peer_session_id: int,
    fd: int = -1,
    peer: Optional[tuple[str, int]] = None,
    family: int = 4,
) -> ctypes.Structure:
    """The sockaddr for ``connect(2)``; its size tells the kernel the variant."""
    if peer is not None:
        family = ipaddress.ip_address(peer[0]).version
    if version == 2:
        cls = sockaddr_pppol2tpin6 if family == 6 else sockaddr_pppol2tp
    else:
        cls = sockaddr_pppol2tpv3in6 if family == 6 else sockaddr_pppol2tpv3
    sa = cls()
    sa.sa_family = uapi.AF_PPPOX
    sa.sa_protocol = uapi.PX_PROTO_OL2TP
    p = sa.pppol2tp
    p.pid = 0
    p.fd = fd
    p.s_tunnel, p.s_session = tunnel_id, session_id
    p.d_tunnel, p.d_session = peer_tunnel_id, peer_session_id
    if peer is not None:
        packed = ipaddress.ip_address(peer[0]).packed
        if family == 6:
            p.addr.sin6_family = socket.AF_INET6
            p.addr.sin6_port = socket.htons(peer[1])
            p.addr.sin6_addr[:] = list(packed)
        else:
            p.addr.sin_family = socket.AF_INET
            p.addr.sin_port = socket.htons(peer[1])
            p.addr.sin_addr[:] = list(packed)
    return sa


class PPPoL2TPSocket:
    """A PPPoL2TP socket connected to one kernel session.

    Closing it deletes the session (the kernel's rule).  ``fileno()`` is what
    pppd takes as its channel (``plugin pppol2tp.so pppol2tp <fd>``, or
    pipexctl's own plugin).
    """

    def __init__(self) -> None:
        try:
            self._sock = socket.socket(uapi.AF_PPPOX, socket.SOCK_DGRAM, uapi.PX_PROTO_OL2TP)
        except OSError as e:
            if e.errno in (_errno.EAFNOSUPPORT, _errno.EPROTONOSUPPORT):
                raise errors.KernelSupportError(
                    "kernel PPPoL2TP support missing: modprobe l2tp_ppp (needs CONFIG_PPPOL2TP)"
                ) from None
            raise errors.SocketError(f"cannot open a PPPoL2TP socket: {e.strerror}", errno=e.errno) from None
        self.tunnel_id = self.session_id = 0
        self.early: list[bytes] = []  # frames from before the channel was under its unit (connect's unit)

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def sock(self) -> socket.socket:
        return self._sock

    def connect(
        self,
        *,
        tunnel_id: int,
        session_id: int,
        peer_tunnel_id: int,
        peer_session_id: int,
        version: int = 2,
        fd: int = -1,
        peer: Optional[tuple[str, int]] = None,
        family: int = 4,
        unit: Optional[int] = None,
    ) -> None:
        """Connect to the session; with ``unit``, then put the session's PPP
        channel under ppp unit ``unit`` beside the channel that unit has (a
        unit takes frames from every channel under it and sends down the
        first), in one breath: the session takes the peer's frames from its
        connect, and until the join they wait on the channel.  Those are
        taken off it into ``early`` (PPP frames from the protocol field on),
        for the caller to pass on."""
        ppp = os.open("/dev/ppp", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK) if unit is not None else -1
        try:
            self._connect(tunnel_id, session_id, peer_tunnel_id, peer_session_id, version, fd, peer, family,
                          _libc if unit is None else _libc_held)
            if unit is not None:
                self._join(ppp, unit)
                # what came between the two waits on the channel: taken, for xl2tpd
                while len(self.early) < 64:
                    try:
                        self.early.append(os.read(ppp, 65536))
                    except BlockingIOError:
                        break
        finally:
            if ppp >= 0:
                os.close(ppp)  # the channel stays under the unit until it is disconnected or unregistered

    def _join(self, ppp: int, unit: int) -> None:
        index, u = ctypes.c_int(0), ctypes.c_int(unit)
        for fd, req, arg in ((self.fileno(), uapi.PPPIOCGCHAN, index), (ppp, uapi.PPPIOCATTCHAN, index),
                             (ppp, uapi.PPPIOCCONNECT, u)):
            if _libc_held.ioctl(fd, ctypes.c_ulong(req), ctypes.byref(arg)) != 0:
                code = ctypes.get_errno()
                what = f"the channel of session {self.session_id} in tunnel {self.tunnel_id}"
                if code == _errno.ENXIO and req == uapi.PPPIOCCONNECT:
                    raise errors.NotFoundError(f"cannot connect {what} to ppp unit {unit}: no such unit", errno=code)
                raise errors.from_errno(code, what, f"connect to ppp unit {unit}")

    def _connect(self, tunnel_id: int, session_id: int, peer_tunnel_id: int, peer_session_id: int, version: int,
                 fd: int, peer: Optional[tuple[str, int]], family: int, libc: ctypes.CDLL) -> None:
        sa = build_sockaddr(
            version=version,
            tunnel_id=tunnel_id,
            session_id=session_id,
            peer_tunnel_id=peer_tunnel_id,
            peer_session_id=peer_session_id,
            fd=fd,
            peer=peer,
            family=family,
        )
        rc = libc.connect(self.fileno(), ctypes.byref(sa), ctypes.sizeof(sa))
        if rc != 0:
            code = ctypes.get_errno()
            what = f"session {session_id} in tunnel {tunnel_id}"
            if code == _errno.ENOENT:
                raise errors.NotFoundError(
                    f"cannot connect a PPPoL2TP socket to {what}: no such kernel tunnel", errno=code
                )
            if code == _errno.EEXIST:
                raise errors.ConflictError(
                    f"cannot connect a PPPoL2TP socket to {what}: another socket is already connected to it",
                    errno=code,
                )
            raise errors.from_errno(code, what, "connect a PPPoL2TP socket to")
        self.tunnel_id, self.session_id = tunnel_id, session_id

    def channel(self) -> int:
        """The PPP channel index (PPPIOCGCHAN), for /dev/ppp PPPIOCATTCHAN."""
        buf = fcntl.ioctl(self.fileno(), uapi.PPPIOCGCHAN, struct.pack("i", 0))
        index: int = struct.unpack("i", buf)[0]
        return index

    def stats(self) -> Stats:
        """Per-session counters (PPPIOCGL2TPSTATS)."""
        st = pppol2tp_ioc_stats()
        st.tunnel_id, st.session_id = self.tunnel_id, self.session_id
        buf = bytearray(bytes(st))
        fcntl.ioctl(self.fileno(), uapi.PPPIOCGL2TPSTATS, buf)
        st = pppol2tp_ioc_stats.from_buffer_copy(bytes(buf))
        return Stats(**{k: getattr(st, k) for k, *_ in pppol2tp_ioc_stats._fields_ if k in names(Stats)})

    def set_option(self, opt: int, value: int) -> None:
        self._sock.setsockopt(uapi.SOL_PPPOL2TP, opt, value)

    def get_option(self, opt: int) -> int:
        return self._sock.getsockopt(uapi.SOL_PPPOL2TP, opt)

    def detach(self) -> int:
        """Give up ownership of the fd (e.g. after handing it to pppd)."""
        return self._sock.detach()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "PPPoL2TPSocket":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def send_fd(unix_path: str, fd: int, meta: bytes = b"{}", timeout: float = 5.0) -> None:
    """Hand ``fd`` to a consumer listening on a unix stream socket (SCM_RIGHTS)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(unix_path)
        socket.send_fds(s, [meta], [fd])
    except OSError as e:
        raise errors.SocketError(f"cannot hand the PPPoL2TP fd to {unix_path}: {e.strerror or e}") from None
    finally:
        s.close()


def udp_socket(local: tuple[str, int], remote: tuple[str, int], no_check: bool = False) -> socket.socket:
    """A bound and connected UDP socket, as a managed tunnel needs
    (``no_check``: it sends without UDP checksums, SO_NO_CHECK)."""
    fam = socket.AF_INET6 if ipaddress.ip_address(local[0]).version == 6 else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if no_check:
            s.setsockopt(socket.SOL_SOCKET, uapi.SO_NO_CHECK, 1)
        s.bind(local)
        s.connect(remote)
    except OSError as e:
        s.close()
        raise errors.SocketError(f"cannot bind {local} and connect to {remote}: {e.strerror}", errno=e.errno) from None
    return s


SYS_pidfd_getfd = 438  # the same number on every architecture but alpha (include/uapi/asm-generic/unistd.h)


def take_udp_socket(pid: int, local: tuple[str, int], peer: tuple[str, int]) -> Optional[socket.socket]:
    """A copy of the UDP socket bound to ``local`` and connected to ``peer``
    that process ``pid`` holds, or None.

    Used when `pipexctl serve` restarts: the tunnel's socket lives on in the
    pppds it was given to, and pidfd_getfd(2) (Linux 5.6+, root) takes a copy
    back so the daemon holds the tunnel again.  Python has ``os.pidfd_open``
    but no pidfd_getfd, hence the raw syscall."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return None
        for name in names:
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = _libc.syscall(SYS_pidfd_getfd, pidfd, int(name), 0)
            if fd < 0:
                continue
            s = socket.socket(fileno=fd)
            try:
                if s.type == socket.SOCK_DGRAM and s.family == socket.AF_INET \
                        and s.getsockname() == local and s.getpeername() == peer:
                    return s
            except OSError:
                pass
            s.close()
        return None
    finally:
        os.close(pidfd)
