"""Which processes the offload depends on have exited: one pidfd each, in epoll.

A pppd's exit is the one trustworthy sign that its call ended (the kernel
session goes with its PPPoL2TP socket); an xl2tpd's exit ends all its
tunnels.  Log lines can be forged by any local user, so the service acts
on them only when an exit (or the kernel) confirms them.  A pidfd names
one process for its whole life: a reused pid cannot be mistaken for it.
"""

from __future__ import annotations

import errno
import os
import threading

from ..discovery import procscan
from ..poller import Poller


class Exits:
    def __init__(self) -> None:
        self._sel: Poller[int] = Poller()  # pidfd -> pid
        self._fds: dict[int, int] = {}  # pid -> pidfd
        # pid -> references beyond the first: a pppd is watched once, an
        # xl2tpd once per tunnel (no list per pppd: one less object per call)
        self._more: dict[int, int] = {}
        self._dead: set[int] = set()
        self._lock = threading.Lock()

    def watch(self, pid: int) -> bool:
        """Follow ``pid`` (counted: every watch needs an unwatch); False when
        it is already gone."""
        with self._lock:
            if pid in self._fds:
                self._more[pid] = self._more.get(pid, 0) + 1
                return pid not in self._dead
            try:
                fd = os.pidfd_open(pid)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                    raise  # out of fds here: an offload must not go on unwatched
                return False  # gone (ESRCH), or no pidfd here: the /proc fallback in alive()
            self._fds[pid] = fd
            self._sel.register(fd, pid)
            return True

    def unwatch(self, pid: int) -> None:
        with self._lock:
            fd = self._fds.get(pid)
            if fd is None:
                return
            more = self._more.pop(pid, 0)
            if more > 1:
                self._more[pid] = more - 1
            if more == 0:
                if pid not in self._dead:  # an exited one is out of epoll already
                    self._sel.unregister(fd)
                os.close(fd)
                del self._fds[pid]
                self._dead.discard(pid)

    def exited(self) -> set[int]:
        """The watched pids that have exited (stay reported until unwatched)."""
        with self._lock:
            if self._fds:
                for fd, pid in self._sel.select(0):
                    self._dead.add(pid)
                    # out of epoll once seen: an exited pid's pidfd stays
                    # readable, and fileno() must not wake a waiter for ever
                    self._sel.unregister(fd)
            return set(self._dead)

    def fileno(self) -> int:
        """Readable when a watched process has exited since the last exited()."""
        return self._sel.fileno()

    def alive(self, pid: int, comm: str = "pppd") -> bool:
        with self._lock:
            watched = pid in self._fds
        if watched:
            return pid not in self.exited()
        return procscan.runs(pid, comm)  # not watched (a pid from an old record): /proc

    def close(self) -> None:
        with self._lock:
            for pid, fd in self._fds.items():
                if pid not in self._dead:
                    self._sel.unregister(fd)
                os.close(fd)
            self._fds.clear()
            self._more.clear()
            self._sel.close()
