"""A restart of `pipexctl serve`: what the state file recorded, adopted or removed.

At start (after discovery's first read) and on SIGHUP the service's state
file is planned against the kernel and discovery (statefile.plan): the
sessions of live calls are adopted -- the tunnel's socket taken back from
one of its pppds with pidfd_getfd and relayed again, the call's pty held
again -- and orphans removed.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from .. import errors
from ..discovery import procscan
from ..kernel.pppol2tp import take_udp_socket
from . import statefile
from .ptys import call_key
from .service import OffloadService, TunnelState
from .statefile import SessionRecord

log = logging.getLogger("pipexctl.serve")


def relay_recorded(svc: OffloadService) -> list[socket.socket]:
    """Relay the recorded tunnels' sockets at once, taken back from their
    pppds, before discovery's first read (slow with a long log): control
    packets that waited in them while no daemon ran reach xl2tpd before its
    retransmissions run out (about 31 s).  Nothing else is decided here; the
    state file is read again, and judged, by ``reconcile``."""
    state = statefile.read(svc.state_path)
    if state is None:
        return []
    socks = []
    for t in state.tunnels:
        for r in t.sessions:
            sock = take_udp_socket(r.pppd_pid, (t.local, t.local_port), (t.peer, t.peer_port))
            if sock is not None:
                svc.datapath.attach(sock)
                socks.append(sock)
                break
    return socks


def _alive(instance: str, tunnel_id: int, call_id: int, pid: int) -> bool:
    """A recorded call lives while its pppd does.  Discovery is not asked: its
    model comes from log lines anyone can forge, and a kernel session that
    still exists is held open by the pppd that got its channel."""
    return procscan.runs(pid, "pppd")


def _rehold_pty(svc: OffloadService, instance: str, tunnel_id: int, s: SessionRecord) -> None:
    """Hold an adopted call's pty slave again (by its recorded path).

    Only for a call just found alive with its pppd: xl2tpd still holds the
    master, so the path still names this call's pty."""
    if not s.pty or svc.ptys.held(call_key(instance, tunnel_id, s.call_id)) is not None:
        return
    try:
        fd = os.open(s.pty, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        log.warning("cannot hold %s of call %d again: %s", s.pty, s.call_id, e.strerror)
        return
    if not os.isatty(fd):
        os.close(fd)
        return
    svc.ptys.hold(call_key(instance, tunnel_id, s.call_id), fd)


def reconcile(svc: OffloadService) -> dict[str, Any]:
    """Adopt what the state file recorded and is still live; remove orphans.
    The caller holds ``svc.lock``."""
    state, warning = statefile.load(svc.state_path)
    if warning:
        log.warning("%s", warning)
    known = {(t.instance, t.tunnel_id) for t in svc.tunnels.values()}
    state.tunnels = [t for t in state.tunnels if (t.instance, t.tunnel_id) not in known]
    try:
        kt, ks = svc.orch.tunnels(), svc.orch.sessions()
    except errors.PipexError as e:
        log.warning("reconcile: cannot read kernel state (%s); nothing adopted", e)
        kt, ks = [], []
    p = statefile.plan(state, kt, ks, _alive)
    for tid, sid, why in p.remove_sessions:
        svc.gone_ok(lambda: svc.orch.delete_session(tid, sid))
        log.info("reconcile: removed orphan session %d/%d (%s)", tid, sid, why)
    for tid, why in p.remove_tunnels:
        svc.gone_ok(lambda: svc.orch.delete_tunnel(tid))
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
                         sock, rec.local_port, xl2tpd_pid=rec.xl2tpd_pid)
        if ts.xl2tpd_pid is not None:
            svc.exits.watch(ts.xl2tpd_pid)
        for r in rec.sessions:
            _rehold_pty(svc, rec.instance, rec.tunnel_id, r)
            svc.exits.watch(r.pppd_pid)
            ts.records[r.call_id] = r
        svc.tunnels[(rec.instance, rec.tunnel_id)] = ts
        sessions = ", ".join(str(r.call_id) for r in rec.sessions)
        if sock is not None:
            svc.datapath.adopt(sock, ts.tunnel_id)
            log.info("reconcile: adopted tunnel %d with session(s) %s", rec.tunnel_id, sessions)
        else:
            log.warning("reconcile: adopted tunnel %d with session(s) %s, but no pppd's copy of its socket "
                        "could be taken back: its control packets cannot reach xl2tpd", rec.tunnel_id, sessions)
    svc.stats["adopted"] += sum(len(t.sessions) for t in p.adopt)
    svc.stats["orphans_removed"] += len(p.remove_sessions) + len(p.remove_tunnels)
    svc.last_reconcile = {**p.summary(), "warning": warning, "at": time.time()}
    svc.reconciles += 1
    svc.datapath.settle()  # the twins' steering: exactly what is held now
    svc.state.rewrite()  # the file now says what is held, whatever it said (or someone wrote) before
    svc.save()
    return svc.last_reconcile
