"""Steering for the one case a tunnel cannot have xl2tpd's own socket: a
second tunnel from the same peer address and port (a "twin").

Linux before 6.11 looks a data packet's session up in the tunnel of the UDP
socket that received it, and every packet from PEER:PORT reaches the
connected socket of the first offloaded tunnel (datapath.py).  A twin's data
packets are therefore moved, before the socket lookup, to a private socket of
the twin's own: table ``ip pipexctl`` holds two maps keyed by the peer's
address, port and our tunnel id (one per L2TP header layout: with and
without the L bit), so the cost per packet is one hash lookup whatever the
number of twins.  Their replies leave the private port as port 1701 again.
Control packets (T bit) are not touched.  Packets arriving on ``lo`` are not
steered: those are the relay's, on their way to xl2tpd.

A flush of the ruleset (``systemctl reload nftables``) removes the table;
:meth:`Steering.check` puts it back (the daemon calls it twice a second
while twins exist).
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from dataclasses import dataclass
from typing import Optional

from .. import defaults, errors

log = logging.getLogger("pipexctl.serve")

TABLE = "pipexctl"


@dataclass(frozen=True, slots=True)
class Twin:
    local: str
    private_port: int
    peer: str
    peer_port: int
    tunnel_id: int

    @property
    def key(self) -> tuple[str, int]:
        """What names a twin: its private socket's address and port."""
        return (self.local, self.private_port)


def table(l2tp_port: int = defaults.L2TP_PORT) -> str:
    """The table without elements (nft syntax; pure)."""
    steer = (f"iif != \"lo\" udp dport {l2tp_port} @th,64,2 {{}} udp dport set ip saddr . udp sport . @th,{{}},16 "
             f"map @{{}} udp checksum set 0 notrack")
    return "\n".join([
        f"add table ip {TABLE}",
        f"flush table ip {TABLE}",
        # tunnel id at bit 80 without the L bit, 96 with it (a length field first)
        f"add map ip {TABLE} twins {{ typeof ip saddr . udp sport . @th,80,16 : udp dport ; }}",
        f"add map ip {TABLE} twins_l {{ typeof ip saddr . udp sport . @th,96,16 : udp dport ; }}",
        f"add set ip {TABLE} twin_out {{ typeof ip saddr . udp sport ; }}",
        f"add chain ip {TABLE} pre {{ type filter hook prerouting priority raw ; policy accept ; }}",
        f"add chain ip {TABLE} out {{ type filter hook output priority raw ; policy accept ; }}",
        # T and L bits: 0 = data without L, 1 = data with L
        f"add rule ip {TABLE} pre " + steer.format(0, 80, "twins"),
        f"add rule ip {TABLE} pre " + steer.format(1, 96, "twins_l"),
        # the private socket sends without checksums (SO_NO_CHECK): keep 0 after the rewrite
        f"add rule ip {TABLE} out ip saddr . udp sport @twin_out udp sport set {l2tp_port} udp checksum set 0 notrack",
    ]) + "\n"


def elements(op: str, twins: list[Twin]) -> str:
    """Add or delete these twins' elements (nft syntax; pure)."""
    if not twins:
        return ""
    key = ", ".join(f"{t.peer} . {t.peer_port} . {t.tunnel_id} : {t.private_port}" for t in twins)
    out = ", ".join(f"{t.local} . {t.private_port}" for t in twins)
    return (f"{op} element ip {TABLE} twins {{ {key} }}\n{op} element ip {TABLE} twins_l {{ {key} }}\n"
            f"{op} element ip {TABLE} twin_out {{ {out} }}\n")


class Steering:
    """Keeps table ``ip pipexctl`` equal to the twins the daemon holds."""

    def __init__(self, nft: "Nft", l2tp_port: int = defaults.L2TP_PORT) -> None:
        self.nft, self.l2tp_port = nft, l2tp_port
        self.twins: dict[tuple[str, int], Twin] = {}  # by Twin.key
        self._lock = threading.Lock()
        self.restored = 0

    def add(self, twin: Twin) -> None:
        with self._lock:
            key = twin.key
            try:
                self.nft.run((table(self.l2tp_port) if not self.twins else "") + elements("add", [twin]))
                self.twins[key] = twin
            except errors.PipexError:
                # the table may have gone with a firewall reload: write it whole
                self.twins[key] = twin
                try:
                    self._rewrite()
                except errors.PipexError:
                    del self.twins[key]
                    raise

    def hold(self, twin: Twin) -> None:
        """Count a twin as held without writing (adoption): settle() then
        writes the table for all of them in one transaction."""
        with self._lock:
            self.twins[twin.key] = twin

    def remove(self, twin: Twin) -> None:
        with self._lock:
            if self.twins.pop(twin.key, None) is None:
                return
            try:
                self.nft.run(f"delete table ip {TABLE}\n" if not self.twins else elements("delete", [twin]))
            except errors.PipexError:
                self._rewrite()  # flushed meanwhile, or out of step: write what is true

    def check(self) -> bool:
        """Put the table back if the ruleset lost it; True when it did."""
        with self._lock:
            if not self.twins or self.nft.exists(f"list chain ip {TABLE} pre"):
                return False
            self._rewrite()
            self.restored += 1
            log.warning("steering table ip %s was gone (a firewall reload?): restored for %d twin tunnel(s)",
                        TABLE, len(self.twins))
            return True

    def settle(self) -> None:
        """Write the table for exactly the twins held now (none: no table):
        after a restart's reconcile, whatever a dead daemon left is replaced."""
        with self._lock:
            self._rewrite()

    def _rewrite(self) -> None:
        self.nft.run(table(self.l2tp_port) + elements("add", list(self.twins.values())) if self.twins
                     else f"add table ip {TABLE}\ndelete table ip {TABLE}\n")


class _LibNftables:
    """The few libnftables calls we need, through ctypes.

    Written by hand: Debian's python3-nftables binding lives in the system
    interpreter's dist-packages (not importable from a venv) and is no more
    than these calls; a ``nft`` process per change cost 1 s under TCG."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libnftables.so.1", use_errno=True)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).restype = ctypes.c_char_p
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self.lib = lib
        self.ctx = lib.nft_ctx_new(0)
        if not self.ctx:
            raise OSError("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)

    def run(self, text: str) -> tuple[int, str]:
        rc = self.lib.nft_run_cmd_from_buffer(self.ctx, text.encode())
        self.lib.nft_ctx_get_output_buffer(self.ctx)  # drain it
        err = (self.lib.nft_ctx_get_error_buffer(self.ctx) or b"").decode("utf-8", "replace")
        return rc, err


class Nft:
    """Runs nft command batches (one atomic transaction each): in this
    process's namespace through libnftables, in a named one through
    ``ip netns exec NS nft -f -``."""

    def __init__(self, netns: Optional[str] = None) -> None:
        self.prefix = ["ip", "netns", "exec", netns, "nft"] if netns else ["nft"]
        self._lib: Optional[_LibNftables] = None
        self._lock = threading.Lock()
        if netns is None:
            try:
                self._lib = _LibNftables()
            except (OSError, AttributeError):
                self._lib = None  # no libnftables: the nft program

    def _run(self, text: str) -> tuple[int, str]:
        if self._lib is not None:
            with self._lock:
                return self._lib.run(text)
        try:
            r = subprocess.run(self.prefix + ["-f", "-"], input=text, capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            raise errors.KernelSupportError("nft not found: apt-get install nftables") from None
        return r.returncode, r.stderr

    def run(self, text: str) -> None:
        rc, err = self._run(text)
        if rc != 0:
            raise errors.KernelError(f"nftables rejected the steering: {err.strip()[:400]}")

    def exists(self, command: str) -> bool:
        return self._run(command)[0] == 0
