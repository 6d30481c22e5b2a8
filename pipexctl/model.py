"""The model: what a tunnel and a session are, validated.

Every layer above the kernel backend speaks these types.  Ids are validated
for the protocol version (L2TPv2: 16-bit, 1..65535; L2TPv3: 32-bit,
1..2**32-1), addresses and ports for their family and encapsulation, when
a record is made (``records.check``); a refused value raises
``records.Invalid`` (a ValueError).
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple, Optional, Union

from .kernel import uapi
from .records import Invalid, Limits, check

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

V2_MAX_ID = 0xFFFF
V3_MAX_ID = 0xFFFFFFFF


class Encap(str, enum.Enum):
    udp = "udp"
    ip = "ip"

    @property
    def kernel(self) -> int:
        return uapi.L2TP_ENCAPTYPE_UDP if self is Encap.udp else uapi.L2TP_ENCAPTYPE_IP

    @classmethod
    def from_kernel(cls, value: int) -> "Encap":
        return cls.ip if value == uapi.L2TP_ENCAPTYPE_IP else cls.udp


class PwType(str, enum.Enum):
    """Pseudowire types, values as ``enum l2tp_pwtype``."""

    eth = "eth"
    eth_vlan = "eth_vlan"
    ppp = "ppp"
    ppp_ac = "ppp_ac"
    ip = "ip"
    none = "none"

    @property
    def kernel(self) -> int:
        return _PW_TO_KERNEL[self]

    @classmethod
    def from_kernel(cls, value: int) -> "PwType":
        for k, v in _PW_TO_KERNEL.items():
            if v == value:
                return k
        return cls.none


_PW_TO_KERNEL = {
    PwType.none: uapi.L2TP_PWTYPE_NONE,
    PwType.eth_vlan: uapi.L2TP_PWTYPE_ETH_VLAN,
    PwType.eth: uapi.L2TP_PWTYPE_ETH,
    PwType.ppp: uapi.L2TP_PWTYPE_PPP,
    PwType.ppp_ac: uapi.L2TP_PWTYPE_PPP_AC,
    PwType.ip: uapi.L2TP_PWTYPE_IP,
}


def max_id(version: int) -> int:
    return V2_MAX_ID if version == 2 else V3_MAX_ID


def check_version(version: int) -> None:
    if version not in (2, 3):
        raise Invalid(f"L2TP version must be 2 or 3, not {version}")


def check_id(value: int, version: int, what: str) -> int:
    top = max_id(version)
    if not 1 <= value <= top:
        raise Invalid(f"{what} {value} out of range for L2TPv{version} (1..{top})")
    return value


Port = Annotated[int, Limits(ge=0, le=65535)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """An IP address and, for UDP encapsulation, a port."""

    address: IPAddress
    port: Port = 0

    def __post_init__(self) -> None:
        check(self)

    @classmethod
    def parse(cls, text: str, default_port: int = 0) -> "Endpoint":
        """Parse ``1.2.3.4``, ``1.2.3.4:1701``, ``[2001:db8::1]:1701`` or ``2001:db8::1``."""
        text = text.strip()
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep:
                raise Invalid(f"bad endpoint {text!r}: missing ']'")
            port = rest[1:] if rest.startswith(":") else ""
            if rest and not rest.startswith(":"):
                raise Invalid(f"bad endpoint {text!r}")
        elif text.count(":") == 1:
            host, _, port = text.partition(":")
        else:
            host, port = text, ""
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            raise Invalid(f"bad endpoint {text!r}: {host!r} is not an IP address") from None
        if port:
            if not port.isdigit() or not 0 <= int(port) <= 65535:
                raise Invalid(f"bad endpoint {text!r}: port must be 0..65535")
            return cls(address=addr, port=int(port))
        return cls(address=addr, port=default_port)

    def __str__(self) -> str:
        if self.address.version == 6:
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


@dataclass(slots=True, kw_only=True)
class TunnelSpec:
    """What to create: a kernel L2TP tunnel.

    Managed tunnel: ``fd`` is a bound and connected UDP (or L2TP/IP) socket
    owned by the caller; closing it deletes the tunnel.  Unmanaged tunnel:
    no ``fd``, the kernel opens its own socket from ``local``/``remote``.
    """

    tunnel_id: int
    peer_tunnel_id: int
    version: int = 3
    encap: Encap = Encap.udp
    local: Optional[Endpoint] = None
    remote: Optional[Endpoint] = None
    fd: Optional[Annotated[int, Limits(ge=0)]] = None
    udp_csum: Optional[bool] = None
    udp6_zero_csum_tx: bool = False
    udp6_zero_csum_rx: bool = False

    def __post_init__(self) -> None:
        check(self)
        check_version(self.version)
        check_id(self.tunnel_id, self.version, "tunnel id")
        check_id(self.peer_tunnel_id, self.version, "peer tunnel id")
        if self.version == 2 and self.encap is not Encap.udp:
            raise Invalid("L2TPv2 runs over UDP only (encap ip is L2TPv3)")
        if self.fd is None:
            if self.local is None or self.remote is None:
                raise Invalid("an unmanaged tunnel (no fd) needs both local and remote addresses")
            if self.local.address.version != self.remote.address.version:
                raise Invalid("local and remote addresses must be of the same family")
            if self.encap is Encap.udp and (not self.local.port or not self.remote.port):
                raise Invalid("UDP encapsulation needs local and remote ports")
        elif self.local and self.remote and self.local.address.version != self.remote.address.version:
            raise Invalid("local and remote addresses must be of the same family")

    @property
    def family(self) -> int:
        ep = self.local or self.remote
        return ep.address.version if ep else 4

    def describe(self) -> str:
        return f"tunnel {self.tunnel_id}"


@dataclass(slots=True, kw_only=True)
class SessionSpec:
    """What to create: a kernel session in an existing tunnel.  A cookie may
    be given as hex text (the CLI's)."""

    tunnel_id: int
    session_id: int
    peer_session_id: int
    version: int = 3
    pw_type: PwType = PwType.eth
    ifname: Optional[str] = None
    cookie: Optional[bytes] = None
    peer_cookie: Optional[bytes] = None
    l2spec_type: Optional[Annotated[int, Limits(ge=0, le=1)]] = None
    recv_seq: Optional[bool] = None
    send_seq: Optional[bool] = None
    lns_mode: Optional[bool] = None
    recv_timeout_ms: Optional[Annotated[int, Limits(ge=0)]] = None
    mtu: Optional[Annotated[int, Limits(ge=68, le=65535)]] = None

    def __post_init__(self) -> None:
        self.cookie, self.peer_cookie = _cookie(self.cookie, "cookie"), _cookie(self.peer_cookie, "peer_cookie")
        check(self)
        v = self.ifname
        if v is not None and (not 1 <= len(v) <= 15 or any(c in v for c in "/ \t\n:") or v in (".", "..")):
            raise Invalid(f"bad interface name {v!r} (1..15 characters, no '/', ':' or spaces)")
        check_version(self.version)
        check_id(self.tunnel_id, self.version, "tunnel id")
        check_id(self.session_id, self.version, "session id")
        check_id(self.peer_session_id, self.version, "peer session id")
        if self.version == 2:
            if self.pw_type is not PwType.ppp:
                raise Invalid("L2TPv2 carries PPP only (use --pw ppp)")
            if self.cookie or self.peer_cookie:
                raise Invalid("cookies are an L2TPv3 feature")
        if self.pw_type is PwType.ppp and self.ifname:
            raise Invalid("PPP sessions have no interface of their own (pppd creates pppN); drop --ifname")

    def describe(self) -> str:
        return f"session {self.session_id} in tunnel {self.tunnel_id}"


def _cookie(v: Any, what: str) -> Any:
    if isinstance(v, str):
        try:
            v = bytes.fromhex(v)
        except ValueError:
            raise Invalid(f"{what}: {v!r} is not hex") from None
    if isinstance(v, bytes) and len(v) not in (4, 8):
        raise Invalid(f"{what}: a cookie is 4 or 8 bytes (8 or 16 hex digits)")
    return v


@dataclass(slots=True, kw_only=True)
class Stats:
    tx_packets: int = 0
    tx_bytes: int = 0
    tx_errors: int = 0
    rx_packets: int = 0
    rx_bytes: int = 0
    rx_seq_discards: int = 0
    rx_oos_packets: int = 0
    rx_errors: int = 0
    rx_cookie_discards: int = 0
    rx_invalid: int = 0

    def __post_init__(self) -> None:
        check(self)


def session_key(tunnel_id: int, session_id: int) -> int:
    """A kernel session's two ids as one int (L2TPv3's ids are 32 bits
    wide): a set of 10,000 keys costs half a set of (tunnel, session) pairs."""
    return tunnel_id << 32 | session_id


class SessionCounters(NamedTuple):
    """One session's ids and kernel counters (``Stats``' fields, in its
    order: tests/unit/test_netlink_golden.py holds the two equal), as a
    metrics snapshot reads every offloaded session.  A typed tuple, not a
    model: a model per session cost a 10,000-session snapshot most of its
    time, and mypy cannot type one built from Stats' field list."""

    tunnel_id: int
    session_id: int
    tx_packets: int
    tx_bytes: int
    tx_errors: int
    rx_packets: int
    rx_bytes: int
    rx_seq_discards: int
    rx_oos_packets: int
    rx_errors: int
    rx_cookie_discards: int
    rx_invalid: int


@dataclass(slots=True, kw_only=True)
class Tunnel:
    """A tunnel as the kernel reports it."""

    tunnel_id: int
    peer_tunnel_id: int
    version: int
    encap: Encap
    local: Optional[Endpoint] = None
    remote: Optional[Endpoint] = None
    udp_csum: Optional[bool] = None
    udp6_zero_csum_tx: bool = False
    udp6_zero_csum_rx: bool = False
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        check(self)


@dataclass(slots=True, kw_only=True)
class Session:
    """A session as the kernel reports it."""

    tunnel_id: int
    session_id: int
    peer_session_id: int
    peer_tunnel_id: Optional[int] = None
    pw_type: PwType
    ifname: Optional[str] = None
    cookie: Optional[bytes] = None
    peer_cookie: Optional[bytes] = None
    l2spec_type: Optional[int] = None
    recv_seq: bool = False
    send_seq: bool = False
    lns_mode: bool = False
    recv_timeout_ms: Optional[int] = None
    using_ipsec: bool = False
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        check(self)

    def describe(self) -> str:
        return f"session {self.session_id} in tunnel {self.tunnel_id}"
