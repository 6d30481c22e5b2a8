"""An epoll set in which each fd carries one value: for the sets that hold
one fd per call held (a pppd's pidfd, a tunnel's socket, a pty).

Written by hand, not ``selectors``: a selector keeps a ``SelectorKey`` and
its map entry per fd, 140 bytes on the host against 60 for the dict entry
kept here (``bench/servemem.py --fds``), and serve holds up to three such
fds per call (docs/offload.md, "Smaller records, no OpenSSL, a bare
epoll").  It is level-triggered, as ``selectors`` is."""

from __future__ import annotations

import select
from typing import Generic, Optional, TypeVar

T = TypeVar("T")
_GONE = object()


class Poller(Generic[T]):
    __slots__ = ("_ep", "_data")

    def __init__(self) -> None:
        self._ep = select.epoll()
        self._data: dict[int, T] = {}

    def register(self, fd: int, data: T) -> None:
        """Wake for ``fd`` readable (or hung up), reporting ``data``."""
        self._ep.register(fd, select.EPOLLIN)
        self._data[fd] = data

    def unregister(self, fd: int) -> None:
        """Before ``fd`` is closed: KeyError if it is not registered."""
        del self._data[fd]
        try:
            self._ep.unregister(fd)
        except OSError:
            pass  # closed already: epoll forgot it by itself

    def get(self, fd: int) -> Optional[T]:
        return self._data.get(fd)

    def __contains__(self, fd: int) -> bool:
        return fd in self._data

    def __len__(self) -> int:
        return len(self._data)

    def select(self, timeout: Optional[float] = None) -> list[tuple[int, T]]:
        """The registered fds that are ready, with their values."""
        out = []
        for fd, _ in self._ep.poll(-1 if timeout is None else timeout):
            d = self._data.get(fd, _GONE)  # unregistered by another thread since
            if d is not _GONE:
                out.append((fd, d))
        return out  # type: ignore[return-value]

    def fileno(self) -> int:
        return self._ep.fileno()

    def close(self) -> None:
        self._ep.close()
        self._data.clear()
