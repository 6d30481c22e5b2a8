"""The plugins' control links: one connection per pppd whose call began on
its pty, kept open by the daemon for the call's life.  Over it the daemon
asks the plugin to move the call back to its pty ("undo") or into the kernel
("move"); the plugin reads it in pppd's timer and answers on it.

A link is known by its pppd's pid (SO_PEERCRED, proven like a channel
request); a link whose plugin closed it (pppd exited, or its daemon
restarted) is found by one poll() over all of them, so keeping 10,000
costs one syscall a round."""

from __future__ import annotations

import select
import socket
import threading
from typing import Optional

# the peer closed its end, or the socket failed
_GONE = select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL


class Links:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._by_pid: dict[int, socket.socket] = {}
        self._pid_of: dict[int, int] = {}  # fd -> pid
        self._poll = select.poll()

    def add(self, pid: int, conn: socket.socket) -> None:
        """``conn`` is now ``pid``'s link (an older one of that pid is closed)."""
        with self.lock:
            self._drop(pid)
            self._by_pid[pid] = conn
            self._pid_of[conn.fileno()] = pid
            self._poll.register(conn, _GONE)

    def get(self, pid: int) -> Optional[socket.socket]:
        with self.lock:
            return self._by_pid.get(pid)

    def pids(self) -> list[int]:
        with self.lock:
            return list(self._by_pid)

    def prune(self) -> int:
        """Close the links whose plugin went away; how many."""
        with self.lock:
            gone = [self._pid_of[fd] for fd, _ in self._poll.poll(0) if fd in self._pid_of]
            for pid in gone:
                self._drop(pid)
            return len(gone)

    def close(self) -> None:
        with self.lock:
            for pid in list(self._by_pid):
                self._drop(pid)

    def __len__(self) -> int:
        return len(self._by_pid)

    def _drop(self, pid: int) -> None:
        conn = self._by_pid.pop(pid, None)
        if conn is None:
            return
        self._pid_of.pop(conn.fileno(), None)
        self._poll.unregister(conn)
        conn.close()
