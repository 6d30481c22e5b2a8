"""The plugin socket's contract: one request line, one reply line (JSON).

Request (plugin or `pipexctl stat --serve` -> daemon), at most MAX_REQUEST
bytes, one JSON object ending in a newline::

    {"op": "channel", "v": 2, "pid": 1234}

- ``op``: ``channel`` (a pppd asks for its kernel channel; with the pty it
  was given as SCM_RIGHTS), ``move`` (a pppd whose call runs on its pty
  asks to be moved into the kernel: a "live move", protocol version 3),
  ``link`` (such a pppd's control link, kept open for its call's life:
  the daemon may write ``{"op": "undo"}`` or ``{"op": "move"}`` on it, the
  plugin answers ``{"op": "undone"}`` or ``{"op": "not_undone", "error":
  ...}``; links.py), ``path`` (the operator: move calls to ``"to": "pty"``
  or ``"kernel"``, ``"call": ID`` with an optional ``"tunnel": ID``, or
  ``"all": true``), ``status``, ``metrics`` or ``reconcile``;
- ``v``: the protocol version the client speaks (1 when absent).  From 2 on,
  the client acknowledges a channel: after it has checked the sockets it
  got, it sends ``{"op": "ack"}`` on the same connection; without that
  line within ACK_TIMEOUT the daemon undoes the offload.  The C plugin adds
  its CLOCK_MONOTONIC stamps (``asked_ns``, ``read_ns``, ``ack_ns``: its
  ask began, it read the reply, it acked), which the daemon only logs.  From 3 on (a
  ``move``), the daemon answers the ack with ``{"ok": true, "committed":
  true}`` once the offload is kept, and the plugin swaps its call's channel
  only then: a channel whose offload the daemon gave up on is never used.
  From 4 on, a ``move`` names its pppd's ppp unit (``"unit": N``): the
  daemon puts the new channel under that unit as soon as the session
  exists, beside the pty's channel, and says so in its reply (``unit``);
  the plugin then only detaches the pty's channel.  The unit is the
  requester's word, trusted as far as the requester (proven root pppd,
  child of xl2tpd; the plugin reads it with PPPIOCGUNIT).  Without it, what the
  peer sends between the session's creation and the plugin's swap would
  wait on a channel with no unit and be dropped;
- anything else (``pid``) is informational: the requester is known by
  SO_PEERCRED and /proc, never by what it says.

Reply: one JSON object whose FIRST member is ``ok`` (the C plugin checks
the line's first bytes, ``{"ok": true,``), then either ``error`` (text) or
the op's answer.  A refusal of a ``channel`` or ``move`` may carry
``"retry": false``: the daemon will refuse this pppd whenever it asks (it
is not xl2tpd's pppd), so a plugin stops asking.  For ``channel`` and
``move``: ``tunnel_id``, ``peer_tunnel_id``,
``session_id``, ``peer_session_id``, ``local``, ``peer``, ``role``,
``tunnel_fd``, ``v`` (and ``unit`` for a move that named one), with the PPPoL2TP socket (and a copy of the
tunnel's UDP socket when ``tunnel_fd``) as SCM_RIGHTS.  The plugin checks
that the socket it got is bound to ``tunnel_id``/``session_id``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Iterable, Iterator, Literal, Optional

from ..records import Invalid, Limits, check, load

MAX_REQUEST = 4096
VERSION = 4
MOVE_VERSION = 3  # the first version whose ``move`` waits for the commit line
ACK_TIMEOUT = 5.0

OPS = ("status", "metrics", "reconcile", "channel", "move", "link", "path")


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    op: Literal["status", "metrics", "reconcile", "channel", "move", "link", "path"]
    v: Annotated[int, Limits(ge=1, le=65535)] = 1
    pid: Optional[Annotated[int, Limits(ge=1)]] = None
    # "path" (the operator's move): where the calls go, and which (a call id, in one tunnel, or all)
    to: Optional[Literal["pty", "kernel"]] = None
    call: Optional[Annotated[int, Limits(ge=1, le=65535)]] = None
    tunnel: Optional[Annotated[int, Limits(ge=1, le=65535)]] = None
    all: bool = False
    # "move" (from version 4): the asking pppd's ppp unit (pppd's own PPPIOCGUNIT)
    unit: Optional[Annotated[int, Limits(ge=0, le=2**31 - 1)]] = None

    def __post_init__(self) -> None:
        check(self)

    @property
    def acks(self) -> bool:
        return self.v >= 2


def parse_request(data: bytes) -> tuple[Optional[Request], Optional[str]]:
    """(request, None) for a valid request line, or (None, refusal reason).
    Pure, so it is fuzzed on the host."""
    if len(data) > MAX_REQUEST:
        return None, "request_too_large"
    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, "malformed_request"
    if not isinstance(obj, dict) or "op" not in obj:
        return None, "malformed_request"
    if obj["op"] not in OPS:
        return None, "unknown_op"
    try:
        req = load(Request, obj)  # keys it does not know are ignored
    except Invalid:
        return None, "malformed_request"
    if req.op in ("move", "link") and req.v < MOVE_VERSION:
        return None, "move_needs_version_3"
    if req.op == "path" and (req.to is None or (req.call is None) == (not req.all)):
        return None, "path_needs_to_and_a_call_or_all"
    return req, None


def reply(ok: bool, **fields: object) -> bytes:
    """One reply line, ``ok`` first."""
    return json.dumps({"ok": ok, **fields}).encode() + b"\n"


def ok_reply(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """A success's reply line around one JSON object encoded in ``pieces``
    (``ok`` first, as ``reply`` writes it), piece by piece: the first opens
    the object with its first field, or is the whole empty object."""
    it = iter(pieces)
    first = next(it, b"")
    if not first.startswith(b"{"):
        raise ValueError("not one JSON object")
    yield b'{"ok": true}' if first == b"{}" else b'{"ok": true, ' + first[1:]
    yield from it
    yield b"\n"


def parse_ack(line: bytes) -> Optional[dict[str, object]]:
    """The ack line's object, or None when ``line`` is not an ack."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) and obj.get("op") == "ack" else None


def ack_stamps(ack: dict[str, object], sent_ns: int, got_ns: int) -> Optional[tuple[int, int, int]]:
    """The plugin's CLOCK_MONOTONIC stamps in its ack (ns: its ask began,
    it read our reply, it sent the ack), when they fit between our sending
    the reply (``sent_ns``) and reading the ack (``got_ns``); else None.
    They are only logged, never acted on: a plugin before them sends none."""
    asked, read, acked = (ack.get(k) for k in ("asked_ns", "read_ns", "ack_ns"))
    if not (type(asked) is int and type(read) is int and type(acked) is int):  # bool is not a stamp
        return None
    if not (0 < asked <= sent_ns <= read <= acked <= got_ns):
        return None
    return asked, read, acked


def ack_cpu_wait(ack: dict[str, object], asked: int, read: int) -> Optional[int]:
    """The ns the plugin's thread spent runnable, waiting for a CPU, between
    its ask and its reading of our reply (the kernel's schedstat, in the ack
    since plugin 2026-12-07), when it fits inside that span; else None.
    Logged only, like the stamps."""
    wait = ack.get("cpu_wait_ns")
    return wait if type(wait) is int and 0 <= wait <= read - asked else None
