"""Parse xl2tpd 1.3.18 log lines into typed records.

Accepted framings (all seen from Debian's xl2tpd):

- plain, as ``xl2tpd -D`` writes to stdout:      ``xl2tpd[147]: <msg>``
- syslog file (RFC 3164, as rsyslog writes):    ``Nov 29 23:01:02 host xl2tpd[147]: <msg>``
- syslog with an ISO timestamp (rsyslog's default on Debian 12):
                                                ``2026-11-29T23:01:02.123456+00:00 host xl2tpd[147]: <msg>``
- journal JSON (``journalctl -o json``): an object with ``MESSAGE``; the
  sender is known by journald's trusted ``_PID``, ``_COMM`` and ``_EXE``
  (``SYSLOG_PID``/``SYSLOG_IDENTIFIER`` only when those are absent)
- the bare message (``<msg>``), with the pid unknown.

xl2tpd's status dump writes several records without newlines in between
(``...ref=0/refhim=0xl2tpd[147]: Call default # 1, ...``); such a line is
split at each ``xl2tpd[<same pid>]: `` boundary.

Every pattern is anchored at the start of the message and matches digits and
dotted addresses only where ids and addresses stand, so text a remote peer
controls (host names, result strings) can never be taken for an id.  Lines
that match no pattern are ``Unparsed`` -- counted and reported, never an
error.  A line that starts like a known message but does not match its full
shape (truncated, garbage numbers) is ``Malformed``.
"""

from __future__ import annotations

import ipaddress
import json
import re
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Union

from ..defaults import L2TP_PORT

if TYPE_CHECKING:
    from .checkpoint import ParserState

# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class Rec:
    pid: Optional[int] = field(default=None, kw_only=True)  # xl2tpd's pid
    ts: Optional[float] = field(default=None, kw_only=True)  # journal timestamp, if any


@dataclass(frozen=True)
class Started(Rec):
    """``xl2tpd version xl2tpd-1.3.18 started on <host> PID:<pid>``"""

    version: str
    started_pid: int


@dataclass(frozen=True)
class KernelSupport(Rec):
    """``Using l2tp kernel support.`` (True) / ``Not looking for kernel support.`` (False)"""

    kernel: bool


@dataclass(frozen=True)
class Listening(Rec):
    address: str
    port: int


@dataclass(frozen=True)
class Connecting(Rec):
    """LAC: ``Connecting to host <addr>, port <port>``"""

    peer: str
    port: int


@dataclass(frozen=True)
class TunnelEstablished(Rec):
    """``Connection established to <peer>, <port>.  Local: <ours>, Remote: <theirs> (ref=..).[  LNS session is '<sect>']``"""

    peer: str
    port: int
    tunnel_id: int
    peer_tunnel_id: int
    lns_section: Optional[str] = None  # set when we are the LNS


@dataclass(frozen=True)
class CallingOnTunnel(Rec):
    """LAC: ``Calling on tunnel <ours>``"""

    tunnel_id: int


@dataclass(frozen=True)
class CallEstablished(Rec):
    """``Call established with <peer>, [PID: <pid>, ]Local: <ours>, Remote: <theirs>, Serial: <n>``

    The LNS line carries the pppd PID; the LAC line does not (and ends with
    `` (ref=..)``).  Neither carries the tunnel id.
    """

    peer: str
    call_id: int
    peer_call_id: int
    serial: int
    pppd_pid: Optional[int] = None
    tunnel_id: Optional[int] = None  # only the outgoing-call "parameters:" line has it


@dataclass(frozen=True)
class PppdArgv(Rec):
    """``start_pppd: I'm running:`` followed by one ``"<arg>"`` line per argument."""

    argv: tuple[str, ...]


@dataclass(frozen=True)
class TunnelClosed(Rec):
    """Our tunnel ``tunnel_id`` is gone (``control_finish: Connection closed to ..., Local: <ours>, Remote: <theirs>``)."""

    peer: str
    tunnel_id: Optional[int] = None
    peer_tunnel_id: Optional[int] = None
    reason: str = ""


@dataclass(frozen=True)
class Disconnecting(Rec):
    """LAC-initiated: ``Disconnecting from <peer>, Local: <ours>, Remote: <theirs>``"""

    peer: str
    tunnel_id: int
    peer_tunnel_id: int


@dataclass(frozen=True)
class CallClosed(Rec):
    """A call ends: by our call id (``call_close: Call <ours> to <peer> disconnected``),
    by serial (``control_finish: Connection closed to <peer>, serial <n> (...)``) or by
    the peer's call id (``child_handler : pppd ... for call <theirs> ...``)."""

    peer: Optional[str] = None
    call_id: Optional[int] = None
    peer_call_id: Optional[int] = None
    serial: Optional[int] = None
    reason: str = ""


@dataclass(frozen=True)
class PppdTerminating(Rec):
    """``Terminating pppd: sending TERM signal to pid <pid>``"""

    pppd_pid: int


@dataclass(frozen=True)
class MaxRetries(Rec):
    """``Maximum retries exceeded for tunnel <ours>.  Closing.``"""

    tunnel_id: int


@dataclass(frozen=True)
class DaemonExiting(Rec):
    """``death_handler: Fatal signal <n> received``: every tunnel of this xl2tpd ends."""

    signal: int


@dataclass(frozen=True)
class StatusTunnel(Rec):
    """Status dump: ``Tunnel <sect>, ID = <ours> (local), <theirs> (remote) to <peer>:<port>, ...``"""

    section: str
    tunnel_id: int
    peer_tunnel_id: int
    peer: str
    port: int


@dataclass(frozen=True)
class StatusCall(Rec):
    """Status dump: ``Call <sect> # <n>, ID = <ours> (local), <theirs> (remote), serno = <serial>, ...``

    Follows the ``StatusTunnel`` it belongs to."""

    section: str
    call_id: int
    peer_call_id: int
    serial: int


@dataclass(frozen=True)
class Unparsed(Rec):
    text: str


@dataclass(frozen=True)
class Malformed(Rec):
    text: str
    why: str


Record = Union[
    Started, KernelSupport, Listening, Connecting, TunnelEstablished, CallingOnTunnel, CallEstablished, PppdArgv,
    TunnelClosed, Disconnecting, CallClosed, PppdTerminating, MaxRetries, DaemonExiting, StatusTunnel, StatusCall,
    Unparsed, Malformed,
]

# ---------------------------------------------------------------- patterns

IP = r"(?P<peer>[0-9a-fA-F:.]{2,45})"
N = r"(\d{1,10})"

# a pattern's handler: the match and the line's pid to its record
Handler = Callable[[re.Match[str], Optional[int]], Record]
_PATTERNS: list[tuple[str, re.Pattern[str], Handler]] = []


def _pattern(prefix: str, regex: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        _PATTERNS.append((prefix, re.compile(regex), fn))
        return fn

    return deco


def _addr(text: str) -> str:
    # not interned: a remote-access LNS has a peer per tunnel, and the
    # interpreter's table of them would cost more than the strings; a call
    # shares its tunnel's string instead (Tracker._on_call_established)
    return str(ipaddress.ip_address(text))


def _section(name: Optional[str]) -> Optional[str]:
    # interned: every tunnel of an LNS section names it (one string, not one per tunnel held)
    return sys.intern(name) if name is not None else None


def _id(text: str, what: str, top: int = 0xFFFF) -> int:
    v = int(text)
    if not 0 <= v <= top:
        raise ValueError(f"{what} {v} out of range")
    return v


def _port(text: str) -> int:
    v = _id(text, "port")
    # L2TP's own port, the one most tunnels name: one int object for all of them
    return L2TP_PORT if v == L2TP_PORT else v


@_pattern("xl2tpd version ", r"xl2tpd version (?P<v>\S{1,64}) started on .{0,255} PID:(?P<pid>\d{1,10})$")
def _started(m: re.Match[str], pid: Optional[int]) -> Started:
    return Started(m["v"], int(m["pid"]), pid=pid)


@_pattern("Using l2tp kernel support.", r"Using l2tp kernel support\.$")
def _kernel_mode_used(m: re.Match[str], pid: Optional[int]) -> KernelSupport:
    return KernelSupport(True, pid=pid)


@_pattern("Not looking for kernel support.", r"Not looking for kernel support\.$")
def _kernel_mode_not_asked(m: re.Match[str], pid: Optional[int]) -> KernelSupport:
    return KernelSupport(False, pid=pid)


@_pattern("L2TP kernel support not detected", r"L2TP kernel support not detected")
def _kernel_mode_not_found(m: re.Match[str], pid: Optional[int]) -> KernelSupport:
    return KernelSupport(False, pid=pid)


@_pattern("This binary does not support kernel L2TP.", r"This binary does not support kernel L2TP\.$")
def _kernel_mode_unsupported(m: re.Match[str], pid: Optional[int]) -> KernelSupport:
    return KernelSupport(False, pid=pid)


@_pattern("Listening on IP address ", r"Listening on IP address (?P<a>[0-9a-fA-F:.]{2,45}), port (?P<port>\d{1,5})$")
def _listening(m: re.Match[str], pid: Optional[int]) -> Listening:
    return Listening(_addr(m["a"]), _port(m["port"]), pid=pid)


@_pattern("Connecting to host ", rf"Connecting to host {IP}, port (?P<port>\d{{1,5}})$")
def _connecting(m: re.Match[str], pid: Optional[int]) -> Connecting:
    return Connecting(_addr(m["peer"]), _port(m["port"]), pid=pid)


@_pattern(
    "Connection established to ",
    rf"Connection established to {IP}, (?P<port>\d{{1,5}})\.  Local: (?P<l>\d{{1,10}}), Remote: (?P<r>\d{{1,10}}) "
    r"\(ref=\d{1,10}/\d{1,10}\)\.(?:  LNS session is '(?P<sect>[^']{0,128})')?$",
)
def _tun_est(m: re.Match[str], pid: Optional[int]) -> TunnelEstablished:
    return TunnelEstablished(
        _addr(m["peer"]), _port(m["port"]), _id(m["l"], "tunnel id"), _id(m["r"], "peer tunnel id"),
        _section(m["sect"]), pid=pid,
    )


@_pattern("Calling on tunnel ", r"Calling on tunnel (?P<t>\d{1,10})$")
def _calling(m: re.Match[str], pid: Optional[int]) -> CallingOnTunnel:
    return CallingOnTunnel(_id(m["t"], "tunnel id"), pid=pid)


@_pattern(
    "Call established with ",
    rf"Call established with {IP}, (?:PID: (?P<pp>\d{{1,10}}), )?Local: (?P<l>\d{{1,10}}), Remote: (?P<r>\d{{1,10}}), "
    r"Serial: (?P<s>\d{1,10})(?: \(ref=\d{1,10}/\d{1,10}\))?$",
)
def _call_est(m: re.Match[str], pid: Optional[int]) -> CallEstablished:
    pp = int(m["pp"]) if m["pp"] is not None else None
    if pp is not None and not 0 < pp < 2**22:
        raise ValueError(f"pppd pid {pp} out of range")
    return CallEstablished(
        _addr(m["peer"]), _id(m["l"], "call id"), _id(m["r"], "peer call id"), _id(m["s"], "serial", 0xFFFFFFFF),
        pp or None, pid=pid,
    )


@_pattern(
    "control_finish: Connection closed to ",
    rf"control_finish: Connection closed to {IP}, (?:port (?P<port>\d{{1,5}}) \((?P<why>.{{0,256}})\), "
    r"Local: (?P<l>\d{1,10}), Remote: (?P<r>\d{1,10})|serial (?P<s>\d{1,10}) \((?P<why2>.{0,256})\))$",
)
def _ctl_closed(m: re.Match[str], pid: Optional[int]) -> Union[CallClosed, TunnelClosed]:
    if m["s"] is not None:
        return CallClosed(_addr(m["peer"]), serial=_id(m["s"], "serial", 0xFFFFFFFF), reason=m["why2"], pid=pid)
    return TunnelClosed(_addr(m["peer"]), _id(m["l"], "tunnel id"), _id(m["r"], "peer tunnel id"), m["why"], pid=pid)


@_pattern("Connection ", rf"Connection (?P<r>\d{{1,10}}) closed to {IP}, port (?P<port>\d{{1,5}}) \((?P<why>.{{0,256}})\)$")
def _conn_closed(m: re.Match[str], pid: Optional[int]) -> TunnelClosed:
    # xl2tpd prints the peer's tunnel id here
    return TunnelClosed(_addr(m["peer"]), None, _id(m["r"], "peer tunnel id"), m["why"], pid=pid)


@_pattern("Disconnecting from ", rf"Disconnecting from {IP}, Local: (?P<l>\d{{1,10}}), Remote: (?P<r>\d{{1,10}})$")
def _disc(m: re.Match[str], pid: Optional[int]) -> Disconnecting:
    return Disconnecting(_addr(m["peer"]), _id(m["l"], "tunnel id"), _id(m["r"], "peer tunnel id"), pid=pid)


@_pattern("call_close: Call ", rf"call_close: Call (?P<c>\d{{1,10}}) to {IP} disconnected$")
def _call_close(m: re.Match[str], pid: Optional[int]) -> CallClosed:
    return CallClosed(_addr(m["peer"]), call_id=_id(m["c"], "call id"), pid=pid)


@_pattern(
    "child_handler : pppd ",
    r"child_handler : pppd (?:exited for call (?P<c>\d{1,10}) with code (?P<code>-?\d{1,10})"
    r"|terminated for call (?P<c2>\d{1,10}) by signal (?P<sig>\d{1,3}))$",
)
def _child(m: re.Match[str], pid: Optional[int]) -> CallClosed:
    c = m["c"] if m["c"] is not None else m["c2"]
    why = f"pppd exited with code {m['code']}" if m["code"] is not None else f"pppd killed by signal {m['sig']}"
    # xl2tpd prints c->cid here: the peer's call id
    return CallClosed(None, peer_call_id=_id(c, "peer call id"), reason=why, pid=pid)


@_pattern("child_handler : pppd exited for call ", r"child_handler : pppd exited for call (?P<c>\d{1,10}) for unknown reason$")
def _child_unknown(m: re.Match[str], pid: Optional[int]) -> CallClosed:
    return CallClosed(None, peer_call_id=_id(m["c"], "peer call id"), reason="pppd exited", pid=pid)


@_pattern(
    "lac_hangup :Hanging up call ",
    r"lac_hangup :Hanging up call (?P<s>\d{1,10}), Local: (?P<l>\d{1,10}), Remote: (?P<r>\d{1,10})$",
)
def _hangup(m: re.Match[str], pid: Optional[int]) -> CallClosed:
    return CallClosed(None, call_id=_id(m["l"], "call id"), peer_call_id=_id(m["r"], "peer call id"),
                      serial=_id(m["s"], "serial", 0xFFFFFFFF), reason="hung up", pid=pid)


@_pattern(
    "parameters: Local: ",
    r"parameters: Local: (?P<l>\d{1,10}) , Remote: (?P<r>\d{1,10}) , Serial: (?P<s>\d{1,10}) , "
    r"Pid: (?P<pp>\d{1,10}) , Tunnelid: (?P<t>\d{1,10}) , Phoneid: .{0,128}$",
)
def _outgoing(m: re.Match[str], pid: Optional[int]) -> CallEstablished:
    pp = int(m["pp"])
    return CallEstablished("0.0.0.0", _id(m["l"], "call id"), _id(m["r"], "peer call id"),
                           _id(m["s"], "serial", 0xFFFFFFFF), pp or None, _id(m["t"], "tunnel id"), pid=pid)


@_pattern(
    "Unable to deliver closing message for tunnel ",
    r"Unable to deliver closing message for tunnel (?P<t>\d{1,10})\. Destroying anyway\.$",
)
def _undeliverable(m: re.Match[str], pid: Optional[int]) -> TunnelClosed:
    return TunnelClosed("0.0.0.0", _id(m["t"], "tunnel id"), None, "closing message undeliverable", pid=pid)


@_pattern("Terminating pppd: sending TERM signal to pid ", r"Terminating pppd: sending TERM signal to pid (?P<p>\d{1,10})$")
def _term(m: re.Match[str], pid: Optional[int]) -> PppdTerminating:
    return PppdTerminating(int(m["p"]), pid=pid)


@_pattern("Maximum retries exceeded for tunnel ", r"Maximum retries exceeded for tunnel (?P<t>\d{1,10})\.  Closing\.$")
def _maxretry(m: re.Match[str], pid: Optional[int]) -> MaxRetries:
    return MaxRetries(_id(m["t"], "tunnel id"), pid=pid)


@_pattern("death_handler: Fatal signal ", r"death_handler: Fatal signal (?P<s>\d{1,3}) received$")
def _death(m: re.Match[str], pid: Optional[int]) -> DaemonExiting:
    return DaemonExiting(int(m["s"]), pid=pid)


@_pattern(
    "Tunnel ",
    rf"Tunnel (?P<sect>[^,]{{0,128}}), ID = (?P<l>\d{{1,10}}) \(local\), (?P<r>\d{{1,10}}) \(remote\) to "
    rf"{IP}:(?P<port>\d{{1,5}}), ",
)
def _st_tunnel(m: re.Match[str], pid: Optional[int]) -> StatusTunnel:
    return StatusTunnel(sys.intern(m["sect"]), _id(m["l"], "tunnel id"), _id(m["r"], "peer tunnel id"), _addr(m["peer"]),
                        _port(m["port"]), pid=pid)


@_pattern(
    "Call ",
    r"Call (?P<sect>[^#]{0,128}) # \d{1,10}, ID = (?P<l>\d{1,10}) \(local\), (?P<r>\d{1,10}) \(remote\), "
    r"serno = (?P<s>\d{1,10}), ",
)
def _st_call(m: re.Match[str], pid: Optional[int]) -> StatusCall:
    return StatusCall(m["sect"].rstrip(), _id(m["l"], "call id"), _id(m["r"], "peer call id"),
                      _id(m["s"], "serial", 0xFFFFFFFF), pid=pid)


# ---------------------------------------------------------------- framing

_PLAIN = re.compile(r"^(?P<ident>[\w.-]{1,64})\[(?P<pid>\d{1,10})\]: ?(?P<msg>.*)$", re.S)
_SYSLOG = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?) "
    r"(?P<host>\S{1,255}) "
    # busybox syslogd (OpenWrt and other small systems) writes facility.level before the tag
    r"(?:(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])"
    r"\.(?:emerg|alert|crit|err|error|warn|warning|notice|info|debug) )?"
    r"(?P<rest>.*)$",
    re.S,
)
# RFC 5424 (rsyslog's RSYSLOG_SyslogProtocol23Format, syslog-ng's syslog()):
# <PRI>1 TIMESTAMP HOST APP-NAME PROCID MSGID STRUCTURED-DATA [MSG]
_RFC5424 = re.compile(
    r"^<\d{1,3}>1 \S{1,64} \S{1,255} (?P<app>\S{1,48}) (?P<procid>\S{1,128}) \S{1,32} "
    r"(?P<sd>-|(?:\[(?:[^\]\\]|\\.)*\])+)(?: (?:\ufeff)?(?P<msg>.*))?$",
    re.S,
)
# Messages xl2tpd 1.3.18 writes without a trailing newline (status dump,
# config dump, a get_call continuation): only after these may a glued
# "xl2tpd[pid]: " start a new record.
_GLUE_OK = re.compile(
    r"(?:ref=\d{1,10}/refhim=\d{1,10}|rx= ?\d{1,20} bytes \(\d{1,20}\)|LNS is/are:"
    r"|^ [0-9a-fA-F:.]{2,45}|^ \(ref=\d{1,10}/\d{1,10}\)|^)$"
)
_ARG = re.compile(r'^"(?P<a>.{0,4096})" ?$', re.S)


def _whole(v: object, digits: int) -> Optional[int]:
    """A whole number from a log's framing: journald's JSON number, or at
    most ``digits`` ASCII digits (str.isdigit takes "²", which int() does not)."""
    if type(v) is int:
        return v
    if isinstance(v, str) and len(v) <= digits and v.isascii() and v.isdigit():
        return int(v)
    return None


def _pid(v: object) -> Optional[int]:
    """A process id from a log's framing, or None."""
    n = _whole(v, 7)
    return n if n is not None and 0 < n <= PID_MAX else None


PID_MAX = 4194304  # the kernel's PID_MAX_LIMIT on 64-bit

# the journal fields split_framing reads (journalctl adds the cursor and the
# timestamps): discovery asks journalctl for these only, of some 25 per entry
JOURNAL_FIELDS = ("MESSAGE", "_PID", "_COMM", "_EXE", "SYSLOG_IDENTIFIER", "SYSLOG_PID")


def split_framing(line: str, identifier: str = "xl2tpd",
                  journal: bool = False) -> tuple[Optional[int], Optional[str], Optional[float]]:
    """(pid, message, timestamp) of one raw line; message None if it is not
    xl2tpd's.  ``journal``: the line is an entry journalctl gave, read only
    with journald's trusted ``_PID`` (locally it always has one; an entry
    without one came from elsewhere, and its SYSLOG_PID is anybody's word)."""
    line = line.rstrip("\r\n")
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
            return None, None, None
        if not isinstance(obj, dict) or journal and "_PID" not in obj:
            return None, None, None
        # journald's own fields (leading "_") come from the sender's kernel
        # credentials; SYSLOG_IDENTIFIER and SYSLOG_PID are whatever the
        # sender wrote (`logger -t "xl2tpd[PID]"` by any user): never trusted
        # when the trusted ones are there
        ident = obj.get("_COMM") or obj.get("SYSLOG_IDENTIFIER")
        if ident is not None and ident != identifier:
            return None, None, None
        exe = obj.get("_EXE")
        if isinstance(exe, str) and exe.rsplit("/", 1)[-1] != identifier:
            return None, None, None
        msg = obj.get("MESSAGE")
        if isinstance(msg, list):  # journald stores non-UTF-8 messages as byte arrays
            msg = bytes(x & 0xFF for x in msg if isinstance(x, int)).decode("utf-8", "replace")
        if not isinstance(msg, str):
            return None, None, None
        if not msg.isascii():  # a \udcXX escape gives a lone surrogate, which no encoder takes later
            msg = msg.encode("utf-8", "replace").decode("utf-8")
        ts = obj.get("__REALTIME_TIMESTAMP")
        usec = _whole(ts, 20)
        ts = usec / 1e6 if usec is not None and 0 <= usec < 1 << 63 else None
        return _pid(obj.get("_PID") or obj.get("SYSLOG_PID")), msg, ts
    m = _RFC5424.match(line)
    if m:
        if m["app"] != identifier:
            return None, None, None
        return _pid(m["procid"]), m["msg"] or "", None
    m = _SYSLOG.match(line)
    if m:
        line = m["rest"]
    m = _PLAIN.match(line)
    if m:
        if m["ident"] != identifier:
            return None, None, None
        return int(m["pid"]), m["msg"], None
    return None, line, None


class LineParser:
    """Stateful parser of one log stream (pppd argv spans several lines)."""

    def __init__(self, identifier: str = "xl2tpd", journal: bool = False) -> None:
        self.identifier = identifier
        self.journal = journal  # lines are journalctl's entries (split_framing)
        self._argv: Optional[list[str]] = None
        self._argv_pid: Optional[int] = None
        self.last_pid: Optional[int] = None
        self.lines = 0
        self.unparsed = 0
        self.malformed = 0

    def state(self) -> ParserState:
        from .checkpoint import ParserState  # an import cycle: checkpoint imports state, which imports this module

        return ParserState(argv=list(self._argv) if self._argv is not None else None, argv_pid=self._argv_pid,
                           last_pid=self.last_pid)

    def restore(self, st: ParserState) -> None:
        self._argv = list(st.argv) if st.argv is not None else None
        self._argv_pid, self.last_pid = st.argv_pid, st.last_pid

    def feed(self, raw: str) -> list[Record]:
        """The records of one line.  Never raises: anyone may write a line
        (syslog), so a line this parser fails on is a Malformed record, and
        the lines after it are read as ever."""
        try:
            return self._feed(raw)
        except Exception as e:  # a parser bug must not cost the records of the lines after it
            self.malformed += 1
            return [Malformed(raw[:512], f"cannot be parsed ({type(e).__name__}: {e})"[:200])]

    def _feed(self, raw: str) -> list[Record]:
        self.lines += 1
        pid, msg, ts = split_framing(raw, self.identifier, self.journal)
        if msg is None:
            return []
        pid_for_split: Optional[int]
        if pid is None and self.last_pid is not None:
            # a continuation line (xl2tpd printed a newline inside a message)
            pid_for_split = self.last_pid
        else:
            pid_for_split = pid
            if pid is not None:
                self.last_pid = pid
        parts = self._split_glued(msg, pid_for_split)
        if len(parts) > 1 and pid is None:
            pid = pid_for_split
        out: list[Record] = []
        for part in parts:
            out.extend(self._message(part.rstrip("\n"), pid, ts))
        for r in out:
            if isinstance(r, Unparsed):
                self.unparsed += 1
            elif isinstance(r, Malformed):
                self.malformed += 1
        return out

    def _split_glued(self, msg: str, pid: Optional[int]) -> list[str]:
        """Split records xl2tpd glued together (no newline), but only after
        the known unterminated messages: text a peer controls (a StopCCN
        result string, say) that imitates a prefix is never split."""
        if pid is None:
            return [msg]
        sep = f"{self.identifier}[{pid}]: "
        pieces = msg.split(sep)
        out = [pieces[0]]
        for nxt in pieces[1:]:
            if _GLUE_OK.search(out[-1]):
                out.append(nxt)
            else:
                out[-1] = out[-1] + sep + nxt
        return out

    def flush(self) -> list[Record]:
        """End of input: emit a pending pppd argv."""
        if self._argv is None:
            return []
        rec = PppdArgv(tuple(self._argv), pid=self._argv_pid)
        self._argv = None
        return [rec]

    def _message(self, msg: str, pid: Optional[int], ts: Optional[float]) -> list[Record]:
        out: list[Record] = []
        if self._argv is not None:
            m = _ARG.match(msg)
            if m and pid == self._argv_pid and len(self._argv) < 256:
                # not interned: a call keeps its argv only until its pppd is
                # known, and each call's own pty and addresses would grow the
                # interpreter's table, which does not shrink as they go
                self._argv.append(m["a"])
                return []
            out.extend(self.flush())
        if msg.startswith("start_pppd: I'm running:"):
            self._argv, self._argv_pid = [], pid
            return out
        near: Optional[str] = None
        for prefix, rx, fn in _PATTERNS:
            if not msg.startswith(prefix):
                continue
            m = rx.match(msg)
            if m is None:
                if prefix not in ("Tunnel ", "Call ", "Connection "):  # short prefixes are shared by other text
                    near = near or prefix
                continue
            try:
                rec = fn(m, pid)
            except ValueError as e:
                out.append(Malformed(msg[:512], str(e), pid=pid, ts=ts))
                return out
            if ts is not None:
                rec = _with_ts(rec, ts)
            out.append(rec)
            return out
        if near is not None:
            out.append(Malformed(msg[:512], f"does not match {near.strip()!r} message", pid=pid, ts=ts))
            return out
        out.append(Unparsed(msg[:512], pid=pid, ts=ts))
        return out


def _with_ts(rec: Record, ts: float) -> Record:
    return replace(rec, ts=ts)


def parse_lines(lines: Iterable[str], identifier: str = "xl2tpd") -> list[Record]:
    p = LineParser(identifier)
    out: list[Record] = []
    for ln in lines:
        out.extend(p.feed(ln))
    out.extend(p.flush())
    return out
