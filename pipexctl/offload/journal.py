"""Log records to journald with fields, when `pipexctl serve` runs under it.

systemd connects a unit's stderr to the journal (``JOURNAL_STREAM`` is set
then), but a stream carries text only.  This handler sends each record over
journald's native protocol instead, with ``PRIORITY``, ``SYSLOG_IDENTIFIER``
and the fields a record carries in ``extra={"journal": {...}}`` -- for an
offload ``TUNNEL_ID``, ``CALL_ID``, ``PEER`` and ``PPPD_PID`` -- so that
``journalctl -u pipexctl TUNNEL_ID=17`` finds a tunnel's story.

Written by hand (the protocol is one datagram of ``KEY=value`` lines; a
value with a newline is sent length-prefixed): python-systemd's
JournalHandler would need libsystemd's headers to build in the venv.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from typing import Optional

SOCKET = "/run/systemd/journal/socket"

_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def encode(fields: dict[str, object]) -> bytes:
    out = bytearray()
    for k, v in fields.items():
        b = str(v).encode("utf-8", "replace")
        if b"\n" in b:
            out += k.encode() + b"\n" + struct.pack("<Q", len(b)) + b + b"\n"
        else:
            out += k.encode() + b"=" + b + b"\n"
    return bytes(out)


class JournalHandler(logging.Handler):
    def __init__(self, identifier: str = "pipexctl", path: str = SOCKET) -> None:
        super().__init__()
        self.identifier, self.path = identifier, path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {"MESSAGE": self.format(record), "PRIORITY": _PRIORITY.get(record.levelno, 6),
                      "SYSLOG_IDENTIFIER": self.identifier, "LOGGER": record.name}
            if record.exc_info:
                fields["EXCEPTION"] = logging.Formatter().formatException(record.exc_info)
            for k, v in (getattr(record, "journal", None) or {}).items():
                fields[k.upper()] = v
            self._sock.sendto(encode(fields), self.path)
        except Exception:  # as logging's own handlers: a record that cannot be sent never raises into its caller
            self.handleError(record)

    def close(self) -> None:
        self._sock.close()
        super().close()


def under_journald() -> Optional[str]:
    """journald's socket when stderr goes to the journal (systemd sets JOURNAL_STREAM)."""
    if not os.environ.get("JOURNAL_STREAM") or not os.path.exists(SOCKET):
        return None
    try:
        dev, ino = (int(x) for x in os.environ["JOURNAL_STREAM"].split(":"))
        st = os.fstat(2)
    except (ValueError, OSError):
        return None
    return SOCKET if (st.st_dev, st.st_ino) == (dev, ino) else None
