"""A minimal L2TPv2 control-connection peer for tests: it opens a tunnel to
an LNS (SCCRQ, SCCCN) and closes it with a StopCCN whose Result Code
message is whatever the caller gives, as a hostile peer may (RFC 2661 puts
no limit on that text).  Run it in the peer's network namespace:

    ip netns exec NS python -m pipexctl.testing.l2tp_peer LNS_ADDR SRC_PORT MESSAGE

It exits 0 once the StopCCN is sent after an established tunnel, 1 if the
LNS did not answer the SCCRQ with an SCCRP.  Written by hand: no Python
library speaks L2TP control, and the test needs only these three messages.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

# RFC 2661: T, L and S bits, version 2
CONTROL = 0xC802
SCCRQ, SCCRP, SCCCN, STOPCCN = 1, 2, 3, 4
MESSAGE_TYPE, RESULT_CODE, PROTOCOL_VERSION, FRAMING_CAPABILITIES = 0, 1, 2, 3
HOST_NAME, ASSIGNED_TUNNEL_ID, RECEIVE_WINDOW_SIZE = 7, 9, 10


def avp(kind: int, value: bytes) -> bytes:
    return struct.pack("!HHH", 0x8000 | (6 + len(value)), 0, kind) + value  # M bit, IETF vendor


def message(tunnel: int, ns: int, nr: int, avps: list[bytes]) -> bytes:
    body = b"".join(avps)
    return struct.pack("!HHHHHH", CONTROL, 12 + len(body), tunnel, 0, ns, nr) + body


def avps_of(packet: bytes) -> dict[int, bytes]:
    length = struct.unpack("!H", packet[2:4])[0]
    out, off = {}, 12
    while off + 6 <= length:
        head, vendor, kind = struct.unpack("!HHH", packet[off:off + 6])
        n = head & 0x3FF
        if n < 6:
            break
        if vendor == 0:
            out[kind] = packet[off + 6:off + n]
        off += n
    return out


def close_with(lns: str, src_port: int, text: str, our_tunnel: int = 4321) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", src_port))
    s.connect((lns, 1701))
    s.settimeout(5)
    s.send(message(0, 0, 0, [avp(MESSAGE_TYPE, struct.pack("!H", SCCRQ)), avp(PROTOCOL_VERSION, b"\x01\x00"),
                             avp(FRAMING_CAPABILITIES, struct.pack("!I", 3)), avp(HOST_NAME, b"peer"),
                             avp(ASSIGNED_TUNNEL_ID, struct.pack("!H", our_tunnel)),
                             avp(RECEIVE_WINDOW_SIZE, struct.pack("!H", 4))]))
    end = time.monotonic() + 15
    theirs = None
    while theirs is None and time.monotonic() < end:
        try:
            pkt = s.recv(4096)
        except socket.timeout:
            continue
        a = avps_of(pkt)
        if a.get(MESSAGE_TYPE) == struct.pack("!H", SCCRP) and ASSIGNED_TUNNEL_ID in a:
            theirs = struct.unpack("!H", a[ASSIGNED_TUNNEL_ID])[0]
    if theirs is None:
        print("no SCCRP from the LNS", file=sys.stderr)
        return 1
    s.send(message(theirs, 1, 1, [avp(MESSAGE_TYPE, struct.pack("!H", SCCCN))]))
    time.sleep(1)
    s.send(message(theirs, 2, 1, [avp(MESSAGE_TYPE, struct.pack("!H", STOPCCN)),
                                  avp(ASSIGNED_TUNNEL_ID, struct.pack("!H", our_tunnel)),
                                  avp(RESULT_CODE, struct.pack("!HH", 1, 0) + text.encode())]))
    time.sleep(1)
    print(f"tunnel {theirs} opened and closed")
    return 0


if __name__ == "__main__":
    sys.exit(close_with(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
