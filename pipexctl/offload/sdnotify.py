"""systemd's two small protocols, for `pipexctl serve` under a unit.

- Socket activation (sd_listen_fds(3)): with ``pipexctl.socket`` systemd
  binds the plugin socket before xl2tpd starts and keeps it across daemon
  restarts; a pppd that asks meanwhile waits in the listen backlog instead
  of meeting no socket.  The daemon gets it as fd 3 with ``LISTEN_PID`` and
  ``LISTEN_FDS`` set.
- Readiness and watchdog (sd_notify(3)): ``READY=1`` once the state file is
  reconciled, ``RELOADING=1``/``READY=1`` around a SIGHUP, ``STOPPING=1``,
  ``STATUS=`` lines, and ``WATCHDOG=1`` from the discovery thread (a hung
  watcher stops the pings, and systemd restarts the daemon).

Written by hand (about 40 lines): the protocols are a datagram and two
environment variables, and python-systemd would need libsystemd's headers
to build in the project's venv.
"""

from __future__ import annotations

import os
import socket
from typing import MutableMapping, Optional

LISTEN_FDS_START = 3


def listen_socket(env: Optional[MutableMapping[str, str]] = None) -> Optional[socket.socket]:
    """The listening socket systemd passed, or None when not socket-activated.

    The variables are removed from the environment so no child inherits them."""
    env_: MutableMapping[str, str] = os.environ if env is None else env
    try:
        mine = int(env_.get("LISTEN_PID", "0")) == os.getpid()
        n = int(env_.get("LISTEN_FDS", "0"))
    except ValueError:
        mine, n = False, 0
    for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env_.pop(k, None)
    if not mine or n < 1:
        return None
    s = socket.socket(fileno=LISTEN_FDS_START)
    os.set_inheritable(s.fileno(), False)
    for extra in range(LISTEN_FDS_START + 1, LISTEN_FDS_START + n):  # only one is asked for
        os.close(extra)
    return s


def notify(*lines: str) -> bool:
    """Send ``lines`` to systemd (NOTIFY_SOCKET); False when not under a notify unit."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto("\n".join(lines).encode(), path)
        return True
    except OSError:
        return False


def watchdog_interval() -> Optional[float]:
    """Half of the unit's WatchdogSec (how often to ping), or None."""
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", "0"))
        pid = int(os.environ.get("WATCHDOG_PID", str(os.getpid())))
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 and pid == os.getpid() else None
