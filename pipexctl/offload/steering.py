"""nftables steering of offloaded sessions (nft JSON API, one atomic transaction).

xl2tpd in userspace mode owns one unconnected UDP socket on port 1701 for
every tunnel; the kernel cannot attach to it.  For each offloaded tunnel the
daemon opens a private UDP socket (LOCAL:P, connected to PEER:PPORT) and
makes the kernel tunnel on it.  Stateless rules in table ``ip pipexctl``,
hook priority raw, then move exactly the offloaded sessions' *data* packets:

- prerouting: PEER:PPORT -> LOCAL:1701, T bit clear, our tunnel id and
  session id (at both header offsets: with and without the L bit)
  => ``udp dport set P``, ``udp checksum set 0``, ``notrack``;
- output: LOCAL:P -> PEER:PPORT => ``udp sport set 1701``, ``notrack``.

Control packets (T bit set) and other sessions keep reaching xl2tpd.
``udp checksum set 0``: xl2tpd's peers send checksum 0 (SO_NO_CHECK); after a
port rewrite nft would write a bogus non-zero checksum and the receiver would
drop every packet (measured; see shared notes).

The whole table is rewritten in one ``nft -j -f -`` run per change, so the
kernel never holds a half-made rule set, and a restart reconciles simply by
writing the table for what is alive.  (Cost is linear in offloaded sessions;
an nft map keyed by peer/tunnel/session is the planned scale-up.)
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import threading
from dataclasses import dataclass
from typing import Iterable, Optional

from .. import errors

TABLE = "pipexctl"
FAMILY = "ip"


@dataclass(frozen=True)
class Steer:
    local: str
    peer: str
    peer_port: int
    private_port: int
    tunnel_id: int
    session_id: int
    l2tp_port: int = 1701


def _match(left: dict, right) -> dict:
    return {"match": {"op": "==", "left": left, "right": right}}


def _field(proto: str, f: str) -> dict:
    return {"payload": {"protocol": proto, "field": f}}


def _th(offset: int, length: int) -> dict:
    return {"payload": {"base": "th", "offset": offset, "len": length}}


def _mangle(proto: str, f: str, value: int) -> dict:
    return {"mangle": {"key": _field(proto, f), "value": value}}


def _rule(chain: str, expr: list, comment: str) -> dict:
    return {"add": {"rule": {"family": FAMILY, "table": TABLE, "chain": chain, "expr": expr, "comment": comment}}}


def ruleset(steers: Iterable[Steer]) -> dict:
    """The complete JSON transaction for these sessions (pure; unit-tested)."""
    cmds: list[dict] = [
        {"add": {"table": {"family": FAMILY, "name": TABLE}}},
        {"flush": {"table": {"family": FAMILY, "name": TABLE}}},
        {"add": {"chain": {"family": FAMILY, "table": TABLE, "name": "pre", "type": "filter",
                           "hook": "prerouting", "prio": -300, "policy": "accept"}}},
        {"add": {"chain": {"family": FAMILY, "table": TABLE, "name": "out", "type": "filter",
                           "hook": "output", "prio": -300, "policy": "accept"}}},
    ]
    tunnels: dict[tuple, Steer] = {}
    for s in sorted(set(steers), key=lambda s: (s.peer, s.peer_port, s.tunnel_id, s.session_id)):
        base = [
            _match(_field("ip", "saddr"), s.peer),
            _match(_field("ip", "daddr"), s.local),
            _match(_field("udp", "sport"), s.peer_port),
            _match(_field("udp", "dport"), s.l2tp_port),
            _match(_th(64, 1), 0),  # T bit clear: data, never control
        ]
        act = [{"counter": None}, _mangle("udp", "dport", s.private_port), _mangle("udp", "checksum", 0),
               {"notrack": None}]
        tag = f"t{s.tunnel_id} s{s.session_id}"
        # L bit clear: tunnel id at bits 80..95, session id at 96..111
        cmds.append(_rule("pre", base + [_match(_th(65, 1), 0), _match(_th(80, 16), s.tunnel_id),
                                         _match(_th(96, 16), s.session_id)] + act, tag))
        # L bit set (a 16-bit length field first): ids 16 bits further
        cmds.append(_rule("pre", base + [_match(_th(65, 1), 1), _match(_th(96, 16), s.tunnel_id),
                                         _match(_th(112, 16), s.session_id)] + act, tag + " L"))
        tunnels[(s.local, s.peer, s.peer_port, s.private_port)] = s
    for (local, peer, pport, priv), s in sorted(tunnels.items()):
        cmds.append(_rule("out", [
            _match(_field("ip", "saddr"), local),
            _match(_field("ip", "daddr"), peer),
            _match(_field("udp", "sport"), priv),
            _match(_field("udp", "dport"), pport),
            {"counter": None},
            _mangle("udp", "sport", s.l2tp_port),
            _mangle("udp", "checksum", 0),  # the socket sends none (SO_NO_CHECK): keep it 0 after the rewrite
            {"notrack": None},
        ], f"t{s.tunnel_id}"))
    return {"nftables": [{"metainfo": {"json_schema_version": 1}}] + cmds}


def delete_table() -> dict:
    return {"nftables": [{"add": {"table": {"family": FAMILY, "name": TABLE}}},
                         {"delete": {"table": {"family": FAMILY, "name": TABLE}}}]}


NFT_CTX_OUTPUT_JSON = 1 << 4  # nftables/libnftables.h, enum nft_output_flags


class _LibNftables:
    """The few libnftables calls we need, through ctypes.

    Written by hand: Debian's python3-nftables binding lives in the system
    interpreter's dist-packages (not importable from a venv) and is no more
    than these calls.  In-process, one transaction costs what the kernel
    and nft's JSON parser cost; a ``nft`` process per change cost 1 s under
    TCG (measured: 1007 ms of a 1160 ms offload)."""

    def __init__(self, dry_run: bool = False) -> None:
        lib = ctypes.CDLL("libnftables.so.1", use_errno=True)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).restype = ctypes.c_char_p
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error", "nft_ctx_free"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_ctx_set_dry_run.argtypes = [ctypes.c_void_p, ctypes.c_bool]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self.lib = lib
        self.ctx = lib.nft_ctx_new(0)
        if not self.ctx:
            raise OSError("nft_ctx_new failed")
        lib.nft_ctx_output_set_flags(self.ctx, NFT_CTX_OUTPUT_JSON)
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)
        lib.nft_ctx_set_dry_run(self.ctx, dry_run)

    def run(self, text: str) -> tuple[int, str, str]:
        rc = self.lib.nft_run_cmd_from_buffer(self.ctx, text.encode())
        out = (self.lib.nft_ctx_get_output_buffer(self.ctx) or b"").decode("utf-8", "replace")
        err = (self.lib.nft_ctx_get_error_buffer(self.ctx) or b"").decode("utf-8", "replace")
        return rc, out, err


class Nft:
    """Runs nft JSON transactions.

    In this process's network namespace through libnftables; with a named
    namespace (``-n NETNS``) through ``ip netns exec NS nft``.  ``dry_run``:
    check only (``nft -c``), nothing reaches the kernel."""

    def __init__(self, netns: Optional[str] = None, nft: str = "nft", dry_run: bool = False) -> None:
        self.prefix = (["ip", "netns", "exec", netns] if netns else []) + [nft] + (["-c"] if dry_run else [])
        self._lib: Optional[_LibNftables] = None
        self._lock = threading.Lock()
        if netns is None:
            try:
                self._lib = _LibNftables(dry_run)
            except (OSError, AttributeError):
                self._lib = None  # no libnftables: fall back to the nft program

    def apply(self, doc: dict) -> None:
        if self._lib is not None:
            with self._lock:
                rc, _, err = self._lib.run(json.dumps(doc))
            if rc != 0:
                raise errors.KernelError(f"nftables rejected the steering rules: {err.strip()[:400]}")
            return
        try:
            r = subprocess.run(self.prefix + ["-j", "-f", "-"], input=json.dumps(doc), capture_output=True,
                               text=True, timeout=30)
        except FileNotFoundError:
            raise errors.KernelSupportError("nft not found: apt-get install nftables") from None
        if r.returncode != 0:
            raise errors.KernelError(f"nftables rejected the steering rules: {r.stderr.strip()[:400]}")

    def list_table(self) -> Optional[dict]:
        r = subprocess.run(self.prefix + ["-j", "list", "table", FAMILY, TABLE], capture_output=True, text=True)
        return json.loads(r.stdout) if r.returncode == 0 else None
