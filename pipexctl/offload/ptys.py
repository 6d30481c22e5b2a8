"""The ptys that offloaded pppds gave up: held open, raw and drained.

xl2tpd (userspace mode) keeps the master end of each call's pty and
select()s on it.  If no process held the slave end, every read would return
EIO at once and xl2tpd would spin on it, a whole CPU per offloaded side
(test_offload checks that xl2tpd stays idle).  So the daemon holds the slave until the call ends; raw
mode stops the line discipline from echoing what xl2tpd writes, and a
thread reads and drops it so xl2tpd never blocks on a full pty.

The drain uses epoll (pipexctl.poller), not select(): one fd per offloaded call
goes past select()'s limit of 1024 at about a thousand calls.
"""

from __future__ import annotations

import logging
import os
import termios
import threading
import tty
from typing import Hashable, Optional

from ..poller import Poller

log = logging.getLogger("pipexctl.serve")


def call_key(instance: str, tunnel_id: int, call_id: int) -> tuple[str, int, int]:
    """A call's pty's key: xl2tpd gives one call id to calls on two tunnels
    at times (it draws ids at random), so the id alone does not name a call."""
    return (instance, tunnel_id, call_id)


def _name(key: Hashable) -> str:
    """A held pty's key for the log: the call id of a ``call_key``."""
    return f"call {key[-1]}" if isinstance(key, tuple) and key else repr(key)


class PtyHolder:
    def __init__(self) -> None:
        self._fds: dict[Hashable, int] = {}
        self._lock = threading.Lock()
        self._sel: Poller[Hashable] = Poller()  # fd -> its key
        threading.Thread(target=self._drain, name="pty-drain", daemon=True).start()

    def hold(self, key: Hashable, fd: int) -> None:
        try:
            tty.setraw(fd)
        except (OSError, termios.error):  # its master closed already (EIO): held, and the drain sees it gone
            pass
        os.set_blocking(fd, False)
        with self._lock:
            old = self._fds.pop(key, None)
            if old is not None:
                self._close(old)
            self._fds[key] = fd
            self._sel.register(fd, key)

    def release(self, key: Hashable) -> None:
        with self._lock:
            fd = self._fds.pop(key, None)
            if fd is not None:
                self._close(fd)

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._fds)

    def held(self, key: Hashable) -> Optional[int]:
        with self._lock:
            return self._fds.get(key)

    def _close(self, fd: int) -> None:
        # unregistered before it is closed: epoll forgets a closed fd by itself,
        # but the selector's map would not
        try:
            self._sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        os.close(fd)

    def _drain(self) -> None:
        while True:
            try:
                ready = self._sel.select(30)  # epoll sees fds registered meanwhile
            except (OSError, ValueError):
                continue
            for fd, key in ready:
                with self._lock:
                    # only if still held: a released fd's number may already
                    # name another file (a tunnel socket) by now
                    if self._fds.get(key) != fd:
                        continue
                    try:
                        gone = not os.read(fd, 65536)
                    except BlockingIOError:
                        gone = False
                    except OSError:  # EIO: xl2tpd closed the master (the call ended)
                        gone = True
                    if gone:
                        # else epoll reports it readable for ever: a busy loop
                        del self._fds[key]
                        self._close(fd)
                        log.info("pty of %s closed by xl2tpd: released", _name(key))
