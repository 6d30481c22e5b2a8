"""Kernel backends: the one interface the orchestrator drives.

``NetlinkBackend`` is the real one (generic netlink + PPPoL2TP sockets).
``NullBackend`` keeps the same objects in memory with the kernel's error
semantics (EEXIST, ENOENT, the tunnel/session relation) so that the
orchestrator and the CLI can be unit-tested on a host without L2TP -- the
same split as go-l2tp's null data plane.  It is never used by the kernel
tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from .. import errors
from ..model import Session, SessionCounters, SessionSpec, Stats, Tunnel, TunnelSpec, session_key

# NetlinkBackend imports netlink (pyroute2: memory), pppol2tp and netns (ctypes, and a libc
# lookup that runs ldconfig) where it first needs them: a NullBackend user, and `pipexctl`'s
# start (the CLI imports this module), need not pay for them
if TYPE_CHECKING:
    from .netlink import L2tpNetlink


class PPPChannel(Protocol):
    tunnel_id: int
    session_id: int
    early: list[bytes]  # ppp_connect with a unit: frames that came before the channel was under it

    def fileno(self) -> int: ...
    def channel(self) -> int: ...
    def close(self) -> None: ...


class KernelBackend(Protocol):
    def tunnel_create(self, spec: TunnelSpec) -> None: ...
    def tunnel_delete(self, tunnel_id: int) -> None: ...
    def tunnel_get(self, tunnel_id: int) -> Tunnel: ...
    def tunnel_dump(self) -> list[Tunnel]: ...
    def session_create(self, spec: SessionSpec) -> None: ...
    def session_delete(self, tunnel_id: int, session_id: int) -> None: ...
    def session_modify(self, tunnel_id: int, session_id: int, **kw: Any) -> None: ...
    def session_get(self, tunnel_id: int, session_id: int) -> Session: ...
    def session_dump(self) -> list[Session]: ...
    def session_ids(self) -> set[tuple[int, int]]: ...
    def session_keys(self) -> set[int]: ...  # model.session_key of each session
    # with ``each``: every session handed to it as it is read, none kept (the list is empty)
    def session_counters(self, each: Optional[Callable[[SessionCounters], None]] = None) -> list[SessionCounters]: ...
    def ppp_connect(self, tunnel: Tunnel, session: Session, unit: Optional[int] = None) -> PPPChannel: ...
    def close(self) -> None: ...


class NetlinkBackend(KernelBackend):
    """The real kernel, through the "l2tp" generic-netlink family.

    ``netns``: the name of a network namespace (as ``ip netns``) to work in;
    every socket the backend opens -- netlink and PPPoL2TP -- is opened
    there, because the kernel looks tunnels up in the socket's namespace.
    """

    def __init__(self, netns: Optional[str] = None) -> None:
        from .netlink import L2tpNetlink

        self.netns = netns
        # A netlink socket belongs to the namespace it was opened in; any
        # thread may use it afterwards (L2tpNetlink serialises requests).
        with self._in_ns():
            self.nl: Optional[L2tpNetlink] = L2tpNetlink()

    def _in_ns(self) -> contextlib.AbstractContextManager[None]:
        if self.netns is None:
            return contextlib.nullcontext()
        from .. import netns as _netns

        return _netns.enter(self.netns)

    def _nl(self, action: str) -> "L2tpNetlink":
        nl: Optional["L2tpNetlink"] = getattr(self, "nl", None)  # None: closed, or never opened
        if nl is None:
            raise errors.KernelError(f"cannot {action}: the netlink backend is closed")
        return nl

    def tunnel_create(self, spec: TunnelSpec) -> None:
        self._nl("tunnel create").tunnel_create(spec)

    def tunnel_delete(self, tunnel_id: int) -> None:
        self._nl("tunnel delete").tunnel_delete(tunnel_id)

    def tunnel_modify(self, tunnel_id: int, debug: Optional[int] = None) -> None:
        self._nl("tunnel modify").tunnel_modify(tunnel_id, debug)

    def tunnel_get(self, tunnel_id: int) -> Tunnel:
        return self._nl("tunnel get").tunnel_get(tunnel_id)

    def tunnel_dump(self) -> list[Tunnel]:
        return self._nl("tunnel dump").tunnel_dump()

    def session_create(self, spec: SessionSpec) -> None:
        self._nl("session create").session_create(spec)

    def session_delete(self, tunnel_id: int, session_id: int) -> None:
        self._nl("session delete").session_delete(tunnel_id, session_id)

    def session_modify(self, tunnel_id: int, session_id: int, **kw: Any) -> None:
        self._nl("session modify").session_modify(tunnel_id, session_id, **kw)

    def session_get(self, tunnel_id: int, session_id: int) -> Session:
        return self._nl("session get").session_get(tunnel_id, session_id)

    def session_dump(self) -> list[Session]:
        return self._nl("session dump").session_dump()

    def session_ids(self) -> set[tuple[int, int]]:
        return self._nl("session ids").session_ids()

    def session_keys(self) -> set[int]:
        return self._nl("session keys").session_keys()

    def session_counters(self, each: Optional[Callable[[SessionCounters], None]] = None) -> list[SessionCounters]:
        return self._nl("session counters").session_counters(each)

    def ppp_connect(self, tunnel: Tunnel, session: Session, unit: Optional[int] = None) -> PPPChannel:
        """A PPPoL2TP socket on ``session``; with ``unit``, its channel is put
        under that ppp unit beside the unit's own (a live move: the session's
        frames reach pppN from its connect, while pppd sends down its pty's
        channel until it detaches it).  Closing the socket takes it out."""
        from .pppol2tp import PPPoL2TPSocket

        # in the namespace throughout: /dev/ppp finds a channel in the caller's
        with self._in_ns():
            s = PPPoL2TPSocket()
            try:
                s.connect(
                    version=tunnel.version,
                    tunnel_id=tunnel.tunnel_id,
                    session_id=session.session_id,
                    peer_tunnel_id=tunnel.peer_tunnel_id,
                    peer_session_id=session.peer_session_id,
                    family=tunnel.local.address.version if tunnel.local else 4,
                    unit=unit,
                )
            except BaseException:
                s.close()
                raise
        return s

    def close(self) -> None:
        nl, self.nl = self.__dict__.get("nl"), None
        if nl is not None:
            nl.close()


class _NullChannel:
    def __init__(self, backend: "NullBackend", tunnel_id: int, session_id: int, index: int) -> None:
        self.backend, self.tunnel_id, self.session_id, self.index = backend, tunnel_id, session_id, index
        self.made = backend._made.get((tunnel_id, session_id))
        self.closed = False
        self.early: list[bytes] = []

    def fileno(self) -> int:
        return -1

    def channel(self) -> int:
        return self.index

    def close(self) -> None:
        # closing a PPPoL2TP socket deletes its session, as in the kernel:
        # the session object it was connected to, not a later one with its id
        if not self.closed:
            self.closed = True
            key = (self.tunnel_id, self.session_id)
            if self.backend._made.get(key) == self.made:
                self.backend._sessions.pop(key, None)


class NullBackend(KernelBackend):
    """In-memory kernel stand-in for unit tests (kernel error semantics)."""

    def __init__(self, fail_on: Optional[dict[str, int]] = None) -> None:
        self._tunnels: dict[int, Tunnel] = {}
        self._sessions: dict[tuple[int, int], Session] = {}
        self._channels = 0
        self._made: dict[tuple[int, int], int] = {}  # which creation of a session id: a channel's close deletes only its own
        self.fail_on = fail_on or {}  # method name -> errno, to exercise error paths
        self.calls: list[str] = []

    def _maybe_fail(self, name: str, what: str, action: str) -> None:
        self.calls.append(name)
        if name in self.fail_on:
            raise errors.from_errno(self.fail_on[name], what, action)

    def tunnel_create(self, spec: TunnelSpec) -> None:
        self._maybe_fail("tunnel_create", spec.describe(), "create")
        if spec.tunnel_id in self._tunnels:
            raise errors.from_errno(errno.EEXIST, spec.describe(), "create")
        self._tunnels[spec.tunnel_id] = Tunnel(
            tunnel_id=spec.tunnel_id,
            peer_tunnel_id=spec.peer_tunnel_id,
            version=spec.version,
            encap=spec.encap,
            local=spec.local,
            remote=spec.remote,
            udp_csum=spec.udp_csum,
        )

    def tunnel_delete(self, tunnel_id: int) -> None:
        self._maybe_fail("tunnel_delete", f"tunnel {tunnel_id}", "delete")
        if self._tunnels.pop(tunnel_id, None) is None:
            raise errors.from_errno(errno.ENODEV, f"tunnel {tunnel_id}", "delete")
        for key in [k for k in self._sessions if k[0] == tunnel_id]:
            del self._sessions[key]

    def tunnel_get(self, tunnel_id: int) -> Tunnel:
        if tunnel_id not in self._tunnels:
            raise errors.from_errno(errno.ENODEV, f"tunnel {tunnel_id}", "get")
        return self._tunnels[tunnel_id]

    def tunnel_dump(self) -> list[Tunnel]:
        return list(self._tunnels.values())

    def session_create(self, spec: SessionSpec) -> None:
        self._maybe_fail("session_create", spec.describe(), "create")
        if spec.tunnel_id not in self._tunnels:
            raise errors.from_errno(errno.ENODEV, f"tunnel {spec.tunnel_id}", "create a session in")
        if (spec.tunnel_id, spec.session_id) in self._sessions:
            raise errors.from_errno(errno.EEXIST, spec.describe(), "create")
        self._made[(spec.tunnel_id, spec.session_id)] = self._made.get((spec.tunnel_id, spec.session_id), 0) + 1
        self._sessions[(spec.tunnel_id, spec.session_id)] = Session(
            tunnel_id=spec.tunnel_id,
            session_id=spec.session_id,
            peer_session_id=spec.peer_session_id,
            peer_tunnel_id=self._tunnels[spec.tunnel_id].peer_tunnel_id,
            pw_type=spec.pw_type,
            ifname=spec.ifname or (f"l2tpeth{len(self._sessions)}" if spec.pw_type.value == "eth" else None),
            cookie=spec.cookie,
            peer_cookie=spec.peer_cookie,
            stats=Stats(),
        )

    def session_delete(self, tunnel_id: int, session_id: int) -> None:
        what = f"session {session_id} in tunnel {tunnel_id}"
        self._maybe_fail("session_delete", what, "delete")
        if self._sessions.pop((tunnel_id, session_id), None) is None:
            raise errors.from_errno(errno.ENODEV, what, "delete")

    def session_modify(self, tunnel_id: int, session_id: int, **kw: Any) -> None:
        s = self.session_get(tunnel_id, session_id)
        self._sessions[(tunnel_id, session_id)] = dataclasses.replace(s, **{k: v for k, v in kw.items() if v is not None})

    def session_get(self, tunnel_id: int, session_id: int) -> Session:
        if (tunnel_id, session_id) not in self._sessions:
            raise errors.from_errno(errno.ENODEV, f"session {session_id} in tunnel {tunnel_id}", "get")
        return self._sessions[(tunnel_id, session_id)]

    def session_dump(self) -> list[Session]:
        return list(self._sessions.values())

    def session_ids(self) -> set[tuple[int, int]]:
        return set(self._sessions)

    def session_keys(self) -> set[int]:
        return {session_key(t, s) for t, s in list(self._sessions)}

    def session_counters(self, each: Optional[Callable[[SessionCounters], None]] = None) -> list[SessionCounters]:
        every = (SessionCounters(t, sid, *dataclasses.astuple(s.stats)) for (t, sid), s in list(self._sessions.items()))
        if each is None:
            return list(every)
        for c in every:
            each(c)
        return []

    def ppp_connect(self, tunnel: Tunnel, session: Session, unit: Optional[int] = None) -> PPPChannel:
        self._maybe_fail("ppp_connect", session.describe(), "connect a PPPoL2TP socket to")
        self._channels += 1
        ch = _NullChannel(self, tunnel.tunnel_id, session.session_id, self._channels)
        if unit is not None:
            try:
                self._maybe_fail("ppp_join", f"the channel of {session.describe()}", f"connect to ppp unit {unit}")
            except errors.PipexError:
                ch.close()  # as the kernel: the connected socket closed, its session goes
                raise
        return ch

    def close(self) -> None:
        pass
