"""A client of `pipexctl serve`'s unix socket (one JSON request, one reply)."""

from __future__ import annotations

import json
import socket
from typing import Any

from .. import defaults, errors


def ask(socket_path: str = defaults.SERVE_SOCKET, request: dict[str, Any] | None = None,
        timeout: float = 30) -> dict[str, Any]:
    """Send ``request`` (default ``{"op": "status"}``); the reply, or SocketError."""
    request = request or {"op": "status"}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(socket_path)
            s.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as e:
        raise errors.SocketError(f"cannot ask pipexctl serve at {socket_path}: {e.strerror or e}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise errors.SocketError(f"pipexctl serve at {socket_path} sent no valid reply") from None
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise errors.SocketError(f"pipexctl serve refused: {reply.get('error') if isinstance(reply, dict) else reply}")
    return reply
