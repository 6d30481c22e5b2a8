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

Each change is one nft transaction, so the kernel never holds a half-made
rule set.  The first write (and a restart's reconcile) writes the whole
table for what is alive; later changes touch only the rules that differ,
deleted by handle (``Steering``).
"""

from __future__ import annotations

import ctypes
import json
import logging
import subprocess
import threading
from dataclasses import dataclass
from typing import Iterable, Optional

from .. import errors

log = logging.getLogger("pipexctl.serve")

TABLE = "pipexctl"
FAMILY = "ip"


@dataclass(frozen=True, slots=True)
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


def _header() -> list[dict]:
    return [
        {"add": {"table": {"family": FAMILY, "name": TABLE}}},
        {"flush": {"table": {"family": FAMILY, "name": TABLE}}},
        {"add": {"chain": {"family": FAMILY, "table": TABLE, "name": "pre", "type": "filter",
                           "hook": "prerouting", "prio": -300, "policy": "accept"}}},
        {"add": {"chain": {"family": FAMILY, "table": TABLE, "name": "out", "type": "filter",
                           "hook": "output", "prio": -300, "policy": "accept"}}},
    ]


def rules(steers: Iterable[Steer]) -> dict[tuple, dict]:
    """Every rule for these sessions, in table order, by a key that names
    what the rule is for (pure): ("pre", steer, L bit) per session and
    ("out", local, peer, peer port, private port, l2tp port) per tunnel."""
    out: dict[tuple, dict] = {}
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
        out[("pre", s, 0)] = _rule("pre", base + [_match(_th(65, 1), 0), _match(_th(80, 16), s.tunnel_id),
                                                  _match(_th(96, 16), s.session_id)] + act, tag)
        # L bit set (a 16-bit length field first): ids 16 bits further
        out[("pre", s, 1)] = _rule("pre", base + [_match(_th(65, 1), 1), _match(_th(96, 16), s.tunnel_id),
                                                  _match(_th(112, 16), s.session_id)] + act, tag + " L")
        tunnels[(s.local, s.peer, s.peer_port, s.private_port, s.l2tp_port)] = s
    for key, s in sorted(tunnels.items()):
        local, peer, pport, priv, l2tp_port = key
        out[("out", *key)] = _rule("out", [
            _match(_field("ip", "saddr"), local),
            _match(_field("ip", "daddr"), peer),
            _match(_field("udp", "sport"), priv),
            _match(_field("udp", "dport"), pport),
            {"counter": None},
            _mangle("udp", "sport", l2tp_port),
            _mangle("udp", "checksum", 0),  # the socket sends none (SO_NO_CHECK): keep it 0 after the rewrite
            {"notrack": None},
        ], f"t{s.tunnel_id}")
    return out


def _doc(cmds: list[dict]) -> dict:
    return {"nftables": [{"metainfo": {"json_schema_version": 1}}] + cmds}


def ruleset(steers: Iterable[Steer]) -> dict:
    """The complete JSON transaction for these sessions (pure; unit-tested)."""
    return _doc(_header() + list(rules(steers).values()))


def update(handles: dict[tuple, int], want: dict[tuple, dict]) -> tuple[dict, list[tuple]]:
    """The transaction from the installed rules (key -> handle) to ``want``
    (pure): deletes by handle, then adds; and the keys added, in order."""
    gone = [k for k in handles if k not in want]
    new = [k for k in want if k not in handles]
    cmds = [{"delete": {"rule": {"family": FAMILY, "table": TABLE, "chain": k[0], "handle": handles[k]}}}
            for k in gone]
    return _doc(cmds + [want[k] for k in new]), new


class Steering:
    """Keeps table ``ip pipexctl`` equal to the offloaded sessions' rules.

    The first write, and any write after a failed one, rewrites the whole
    table in one transaction.  After that each change is one transaction of
    only the rules that differ: deletes by handle and adds, whose handles nft
    echoes back.  An offload then costs nft a few rules, not every session's
    (measured under TCG: a whole-table write took 1.0-1.8 s at ~60 rules,
    and an offload waited for it under the daemon's lock).  A handle that
    is gone (someone flushed the table) fails the next update that deletes
    a rule; the table is then rewritten.  A change that only adds cannot
    notice a flush: SIGHUP (a reconcile) rewrites the table at once."""

    def __init__(self, nft) -> None:
        self.nft = nft
        self.handles: Optional[dict[tuple, int]] = None  # None: what is installed is not known
        self.rewrites = 0
        self.updates = 0

    def apply(self, steers: Iterable[Steer]) -> None:
        want = rules(steers)
        echo = getattr(self.nft, "apply_echo", None)
        if self.handles is not None and echo is not None:
            doc, new = update(self.handles, want)
            if len(doc["nftables"]) == 1:
                return  # nothing differs
            try:
                got = echo(doc)
            except errors.PipexError as e:
                log.warning("incremental steering update failed (%s); rewriting the table", e)
            else:
                if got is not None and len(got) == len(new):
                    self.handles = {k: h for k, h in self.handles.items() if k in want}
                    self.handles.update(zip(new, got))
                    self.updates += 1
                    return
        self.handles = None
        doc = _doc(_header() + list(want.values()))
        if echo is None:
            self.nft.apply(doc)
        else:
            got = echo(doc)
            if got is not None and len(got) == len(want):
                self.handles = dict(zip(want, got))
        self.rewrites += 1

    def forget(self) -> None:
        """The table was deleted or changed behind our back: rewrite next time."""
        self.handles = None


def delete_table() -> dict:
    return {"nftables": [{"add": {"table": {"family": FAMILY, "name": TABLE}}},
                         {"delete": {"table": {"family": FAMILY, "name": TABLE}}}]}


# nftables/libnftables.h, enum nft_output_flags
NFT_CTX_OUTPUT_HANDLE = 1 << 3
NFT_CTX_OUTPUT_JSON = 1 << 4
NFT_CTX_OUTPUT_ECHO = 1 << 5


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
        self.flags = NFT_CTX_OUTPUT_JSON
        lib.nft_ctx_output_set_flags(self.ctx, self.flags)
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)
        lib.nft_ctx_set_dry_run(self.ctx, dry_run)

    def run(self, text: str, echo: bool = False) -> tuple[int, str, str]:
        flags = self.flags | (NFT_CTX_OUTPUT_ECHO | NFT_CTX_OUTPUT_HANDLE if echo else 0)
        self.lib.nft_ctx_output_set_flags(self.ctx, flags)
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
        self._run(doc, echo=False)

    def apply_echo(self, doc: dict) -> Optional[list[int]]:
        """Run ``doc``; the handles of the rules it added, in order ([] when it
        added none; None when they cannot be read: the caller then rewrites)."""
        out = self._run(doc, echo=True)
        try:
            items = json.loads(out)["nftables"] if out.strip() else []
        except (ValueError, KeyError, TypeError):
            return None
        handles = [i["add"]["rule"].get("handle") for i in items
                   if isinstance(i, dict) and "rule" in i.get("add", {})]
        return None if None in handles else handles

    def _run(self, doc: dict, echo: bool) -> str:
        if self._lib is not None:
            with self._lock:
                rc, out, err = self._lib.run(json.dumps(doc), echo)
            if rc != 0:
                raise errors.KernelError(f"nftables rejected the steering rules: {err.strip()[:400]}")
            return out
        try:
            r = subprocess.run(self.prefix + (["-e", "-a"] if echo else []) + ["-j", "-f", "-"],
                               input=json.dumps(doc), capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            raise errors.KernelSupportError("nft not found: apt-get install nftables") from None
        if r.returncode != 0:
            raise errors.KernelError(f"nftables rejected the steering rules: {r.stderr.strip()[:400]}")
        return r.stdout

    def list_table(self) -> Optional[dict]:
        r = subprocess.run(self.prefix + ["-j", "list", "table", FAMILY, TABLE], capture_output=True, text=True)
        return json.loads(r.stdout) if r.returncode == 0 else None
