"""Datagrams the kernel dropped on xl2tpd's own UDP socket because its
receive queue was full.

xl2tpd does not size that socket's receive buffer, so it gets
``net.core.rmem_default``.  In a login storm the peers' control messages
outrun it, each dropped one costs its peer a retransmission a second or
more later, and calls come up late or not at all (docs/operations.md).

Read from ``/proc/PID/net`` of an xl2tpd (its network namespace, no
setns): ``snmp``'s ``Udp: RcvbufErrors`` (one short file) at every check,
and ``udp`` (one line per UDP socket: 10,000 and more with offloaded
tunnels) only when that counter rose, for the drops of the unconnected
sockets bound to xl2tpd's port: xl2tpd's own (a tunnel's socket is
connected).  Written by hand: nothing in pyroute2 reads these counters
without a sock_diag dump of every socket.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterable, Optional

from .. import defaults


@dataclass(frozen=True)
class UdpCounters:
    in_datagrams: int
    in_errors: int
    rcvbuf_errors: int  # the namespace's datagrams dropped for a full receive queue, any socket
    drops_unconnected: int  # on the unconnected sockets still open (on ``port`` when given): xl2tpd's
    drops_connected: int  # on connected sockets (a tunnel's)


def snmp_udp(proc_net: str) -> dict[str, int]:
    """The ``Udp:`` counters of ``proc_net``/snmp by name."""
    with open(os.path.join(proc_net, "snmp")) as f:
        names, values = [ln.split()[1:] for ln in f if ln.startswith("Udp:")][:2]
    return {n: int(v) for n, v in zip(names, values)}


def socket_drops(proc_net: str, port: Optional[int] = None) -> tuple[int, int]:
    """Drops of the UDP sockets of ``proc_net``/udp: (unconnected, connected),
    the unconnected ones counted only when bound to ``port`` if given."""
    unconnected = connected = 0
    with open(os.path.join(proc_net, "udp")) as f:
        next(f)  # the header
        for line in f:
            # sl local_address rem_address ... drops: the local port is hex after the colon
            fields = line.split()
            if fields[2] != "00000000:0000":
                connected += int(fields[-1])
            elif port is None or int(fields[1].rsplit(":", 1)[1], 16) == port:
                unconnected += int(fields[-1])
    return unconnected, connected


def counters(proc_net: str, port: Optional[int] = None) -> UdpCounters:
    udp = snmp_udp(proc_net)
    unconnected, connected = socket_drops(proc_net, port)
    return UdpCounters(udp.get("InDatagrams", 0), udp.get("InErrors", 0), udp.get("RcvbufErrors", 0), unconnected,
                       connected)


class DropWatch:
    """Warns when xl2tpd's socket drops datagrams: checked every
    ``CHECK_EVERY`` seconds, warned about at most every ``WARN_EVERY`` per
    network namespace (the drops in between are summed into the next
    warning).  ``dropped``: drops seen since the daemon started (a metric)."""

    CHECK_EVERY = 10.0
    WARN_EVERY = 600.0

    def __init__(self, port: int = defaults.L2TP_PORT) -> None:
        self.port = port
        self.dropped = 0
        self._checked = float("-inf")
        # per netns (inode of /proc/PID/ns/net): RcvbufErrors and xl2tpd's drops
        # as last read and when, when last warned, drops not yet warned about and
        # the check before the first of them
        self._seen: dict[int, tuple[int, int, float]] = {}
        self._warned: dict[int, float] = {}
        self._unwarned: dict[int, tuple[int, float]] = {}

    def check(self, xl2tpd_pids: Iterable[int], now: Optional[float] = None) -> list[str]:
        """Read the counters of each xl2tpd's namespace if ``CHECK_EVERY``
        has passed; the warnings to log."""
        now = time.monotonic() if now is None else now
        if now - self._checked < self.CHECK_EVERY:
            return []
        self._checked = now
        out = []
        done = set()
        for pid in xl2tpd_pids:
            try:
                ns = os.stat(f"/proc/{pid}/ns/net").st_ino
                if ns in done:
                    continue
                done.add(ns)
                out += self._check_ns(ns, f"/proc/{pid}/net", pid, now)
            except (OSError, ValueError, StopIteration):  # gone meanwhile, or a /proc we cannot read
                continue
        return out

    def _check_ns(self, ns: int, proc_net: str, pid: int, now: float) -> list[str]:
        errors = snmp_udp(proc_net).get("RcvbufErrors", 0)
        last = self._seen.get(ns)
        if last is not None and errors == last[0]:
            self._seen[ns] = (errors, last[1], now)
            return []
        drops = socket_drops(proc_net, self.port)[0]
        self._seen[ns] = (errors, drops, now)
        if last is None or drops <= last[1]:  # the first look, or other sockets' drops (or xl2tpd restarted)
            return []
        new = drops - last[1]
        self.dropped += new
        pending, since = self._unwarned.get(ns, (0, last[2]))
        pending += new
        if now - self._warned.get(ns, float("-inf")) < self.WARN_EVERY:
            self._unwarned[ns] = (pending, since)
            return []
        self._warned[ns] = now
        self._unwarned.pop(ns, None)
        return [f"xl2tpd (pid {pid}) lost {pending} datagram(s) on its UDP port {self.port} within the last "
                f"{now - since:.0f} s: the socket's receive queue was full (xl2tpd does "
                f"not size it: net.core.rmem_default applies). Each lost control message costs its peer a "
                f"retransmission, and in a burst of logins calls come up late or fail; raise "
                f"net.core.rmem_default (docs/operations.md)"]
