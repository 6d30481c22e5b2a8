"""The orchestrator: multi-step kernel operations, each all-or-nothing.

Every public method either completes or leaves the kernel as it found it:
a tunnel created for a session that then fails is deleted again; a PPP
session whose channel cannot be connected or handed off is deleted again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional

from . import errors
from .kernel.backend import KernelBackend, PPPChannel
from .model import Session, SessionSpec, Tunnel, TunnelSpec
from .records import Invalid

log = logging.getLogger("pipexctl")


@dataclass
class AddSessionResult:
    tunnel: Tunnel
    session: Session
    tunnel_created: bool
    channel: Optional[int] = None  # PPP channel index, when a PPPoL2TP socket was connected


def _same_tunnel(have: Tunnel, want: TunnelSpec) -> list[str]:
    diffs = []
    if have.peer_tunnel_id != want.peer_tunnel_id:
        diffs.append(f"peer tunnel id {have.peer_tunnel_id} != {want.peer_tunnel_id}")
    if have.version != want.version:
        diffs.append(f"version {have.version} != {want.version}")
    if have.encap != want.encap:
        diffs.append(f"encap {have.encap.value} != {want.encap.value}")
    if want.fd is None:
        for name in ("local", "remote"):
            a, b = getattr(have, name), getattr(want, name)
            if a is not None and b is not None and (a.address != b.address or a.port != b.port):
                diffs.append(f"{name} {a} != {b}")
    return diffs


class Transaction:
    """The undo log of one multi-step kernel operation.

    Each step registers its undo once it has succeeded; ``rollback`` runs
    them newest first.  Every create-and-rollback sequence of the codebase
    (the CLI's add_session, the offload service's channel) goes through it,
    so there is one place where partial work is taken back."""

    def __init__(self, backend: KernelBackend) -> None:
        self.backend = backend
        self._undo: list[Callable[[], object]] = []

    def on_rollback(self, fn: Callable[[], object]) -> None:
        """Undo a step done outside the backend (a socket, a record)."""
        self._undo.append(fn)

    def create_tunnel(self, spec: TunnelSpec) -> None:
        self.backend.tunnel_create(spec)
        self._undo.append(lambda: self.backend.tunnel_delete(spec.tunnel_id))

    def create_session(self, spec: SessionSpec) -> None:
        self.backend.session_create(spec)
        self._undo.append(lambda: self.backend.session_delete(spec.tunnel_id, spec.session_id))

    def connect_ppp(self, tunnel: Tunnel, session: Session, unit: Optional[int] = None) -> PPPChannel:
        """A PPPoL2TP socket on the session (``unit``: its channel put under
        that ppp unit too); the caller closes it once handed off (closing
        twice is harmless)."""
        ch = self.backend.ppp_connect(tunnel, session, unit)
        self._undo.append(ch.close)
        return ch

    def rollback(self) -> None:
        while self._undo:
            fn = self._undo.pop()
            try:
                errors.gone_ok(fn, log)  # already gone counts: closing a PPPoL2TP socket deletes its session
            except Exception:  # an undo never stops the ones after it
                log.exception("rollback step failed")


class Orchestrator:
    def __init__(self, backend: KernelBackend) -> None:
        self.backend = backend

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """All or nothing: on any exception (KeyboardInterrupt included) what
        the block did through the transaction is undone, then re-raised."""
        tx = Transaction(self.backend)
        try:
            yield tx
        except BaseException:
            tx.rollback()
            raise

    # ---- tunnels
    def add_tunnel(self, spec: TunnelSpec) -> Tunnel:
        self.backend.tunnel_create(spec)
        return self.backend.tunnel_get(spec.tunnel_id)

    def ensure_tunnel(self, spec: TunnelSpec, tx: Transaction) -> tuple[Tunnel, bool]:
        """The tunnel ``spec`` names: existing (if it matches) or new (undone with ``tx``)."""
        existing = {t.tunnel_id: t for t in self.backend.tunnel_dump()}
        have = existing.get(spec.tunnel_id)
        if have is not None:
            diffs = _same_tunnel(have, spec)
            if diffs:
                raise errors.ConflictError(f"tunnel {spec.tunnel_id} already exists with other parameters: " + "; ".join(diffs))
            return have, False
        tx.create_tunnel(spec)
        return self.backend.tunnel_get(spec.tunnel_id), True

    def delete_tunnel(self, tunnel_id: int) -> None:
        self.backend.tunnel_delete(tunnel_id)

    def tunnels(self) -> list[Tunnel]:
        return sorted(self.backend.tunnel_dump(), key=lambda t: t.tunnel_id)

    # ---- sessions
    def add_session(
        self,
        session: SessionSpec,
        tunnel: Optional[TunnelSpec] = None,
        *,
        connect_ppp: bool = False,
        hand_off: Optional[Callable[[PPPChannel, dict[str, int]], None]] = None,
    ) -> AddSessionResult:
        """Create ``session`` (and ``tunnel`` first, if given and missing).

        With ``connect_ppp`` a PPPoL2TP socket is connected to a PPP session
        and ``hand_off(channel, meta)`` passes it on (e.g. over a unix socket
        to pppd); the socket is closed here afterwards, so the session lives
        exactly as long as the consumer keeps its copy of the fd.
        """
        with self.transaction() as tx:
            created = False
            if tunnel is not None:
                if tunnel.tunnel_id != session.tunnel_id:
                    raise errors.InvalidArgumentError(
                        f"session names tunnel {session.tunnel_id} but tunnel spec is {tunnel.tunnel_id}"
                    )
                kernel_tunnel, created = self.ensure_tunnel(tunnel, tx)
            else:
                try:
                    kernel_tunnel = self.backend.tunnel_get(session.tunnel_id)
                except errors.NotFoundError:
                    raise errors.NotFoundError(
                        f"cannot create {session.describe()}: tunnel {session.tunnel_id} does not exist "
                        "(create it, or give --peer-tunnel-id, --local and --remote)"
                    ) from None
            if kernel_tunnel.version != session.version:
                # re-validate the ids for the tunnel's real version
                try:
                    session = dataclasses.replace(session, version=kernel_tunnel.version)
                except Invalid as e:
                    raise errors.InvalidArgumentError(str(e)) from None
            tx.create_session(session)
            kernel_session = self.backend.session_get(session.tunnel_id, session.session_id)
            channel_index = None
            if connect_ppp:
                if kernel_session.pw_type.value != "ppp":
                    raise errors.InvalidArgumentError("only PPP sessions have a PPPoL2TP channel")
                ch = tx.connect_ppp(kernel_tunnel, kernel_session)
                try:
                    channel_index = ch.channel()
                    if hand_off is not None:
                        hand_off(ch, _meta(kernel_tunnel, kernel_session, channel_index))
                finally:
                    ch.close()
        return AddSessionResult(kernel_tunnel, kernel_session, created, channel_index)

    def delete_session(self, tunnel_id: int, session_id: int, *, tunnel_too: bool = False) -> bool:
        """Delete a session; with ``tunnel_too`` also its tunnel once empty.

        Returns whether the tunnel was deleted.
        """
        self.backend.session_delete(tunnel_id, session_id)
        if tunnel_too and not any(t == tunnel_id for t, _ in self.backend.session_ids()):
            self.backend.tunnel_delete(tunnel_id)
            return True
        return False

    def ensure_session(self, session: SessionSpec, tunnel: Optional[TunnelSpec], present: bool = True, *,
                       check: bool = False, tunnel_too: bool = True) -> dict[str, object]:
        """Desired state for configuration management (the Ansible module).

        ``present``: the session exists as ``session`` says (its tunnel made
        from ``tunnel`` when missing); a session with other parameters is a
        ConflictError, never silently replaced.  Absent: the session is gone
        (with ``tunnel_too``, its tunnel too once empty).  ``check``: only
        say what would change.  Returns changed/before/after, where
        before/after describe the session (None: none)."""
        def describe(s: Optional[Session]) -> Optional[dict[str, object]]:
            if s is None:
                return None
            return {"tunnel_id": s.tunnel_id, "session_id": s.session_id, "peer_session_id": s.peer_session_id,
                    "pw_type": s.pw_type.value, **({"ifname": s.ifname} if s.ifname else {})}

        try:
            have = self.backend.session_get(session.tunnel_id, session.session_id)
        except errors.NotFoundError:
            have = None
        before = describe(have)
        if not present:
            if have is not None and not check:
                self.delete_session(session.tunnel_id, session.session_id, tunnel_too=tunnel_too)
            return {"changed": have is not None, "before": before, "after": None}
        if have is not None and before is not None:
            diffs = [f"{k} {before.get(k)} != {v}" for k, v in
                     (("peer_session_id", session.peer_session_id), ("pw_type", session.pw_type.value),
                      ("ifname", session.ifname)) if v is not None and before.get(k) != v]
            if diffs:
                raise errors.ConflictError(f"{session.describe()} already exists with other parameters: "
                                           + "; ".join(diffs) + " (remove it first: state absent)")
            if tunnel is not None:
                diffs = _same_tunnel(self.backend.tunnel_get(session.tunnel_id), tunnel)
                if diffs:
                    raise errors.ConflictError(f"tunnel {tunnel.tunnel_id} exists with other parameters: "
                                               + "; ".join(diffs))
            return {"changed": False, "before": before, "after": before}
        if check:
            if tunnel is not None:  # a conflicting tunnel fails in check mode too
                t = {t.tunnel_id: t for t in self.backend.tunnel_dump()}.get(tunnel.tunnel_id)
                if t is not None and _same_tunnel(t, tunnel):
                    raise errors.ConflictError(f"tunnel {tunnel.tunnel_id} already exists with other parameters: "
                                               + "; ".join(_same_tunnel(t, tunnel)))
            after = {"tunnel_id": session.tunnel_id, "session_id": session.session_id,
                     "peer_session_id": session.peer_session_id, "pw_type": session.pw_type.value,
                     **({"ifname": session.ifname} if session.ifname else {})}
            return {"changed": True, "before": None, "after": after}
        res = self.add_session(session, tunnel)
        return {"changed": True, "before": None, "after": describe(res.session)}

    def sessions(self, tunnel_id: Optional[int] = None) -> list[Session]:
        out = self.backend.session_dump()
        if tunnel_id is not None:
            out = [s for s in out if s.tunnel_id == tunnel_id]
        return sorted(out, key=lambda s: (s.tunnel_id, s.session_id))

    def session(self, tunnel_id: int, session_id: int) -> Session:
        return self.backend.session_get(tunnel_id, session_id)


def _meta(t: Tunnel, s: Session, channel: int) -> dict[str, int]:
    return {
        "tunnel_id": t.tunnel_id,
        "peer_tunnel_id": t.peer_tunnel_id,
        "session_id": s.session_id,
        "peer_session_id": s.peer_session_id,
        "version": t.version,
        "channel": channel,
    }


def meta_bytes(meta: Mapping[str, object]) -> bytes:
    return json.dumps(meta, sort_keys=True).encode()


__all__ = ["Orchestrator", "AddSessionResult", "Transaction"]
