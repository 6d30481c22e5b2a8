"""glibc's malloc, held to one arena in the daemon.

glibc gives each new thread that allocates an arena of its own, up to
eight per CPU, and what is freed in an arena stays with it.  A login storm
keeps many request threads busy at once: in K = 100 storms under emulation the
daemon ended at 79 MiB resident with glibc's default, 49-50 MiB with two
arenas and 45 MiB with one (docs/offload.md, "Memory in a login storm").
Python's own lock keeps its threads from allocating at once anyway, so one
arena makes them wait for each other no more than they already do.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from typing import Any, Optional

ARENAS = 1
M_ARENA_MAX = -8  # malloc.h


def limit_arenas(n: int = ARENAS) -> Optional[int]:
    """Cap glibc's arenas at ``n`` for the threads started from now on; the
    cap set, or None: MALLOC_ARENA_MAX is set (the operator's choice, which
    glibc has already taken) or the C library has no ``mallopt`` (not glibc)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return n if mallopt(M_ARENA_MAX, n) == 1 else None


TRIM_EVERY = 10.0  # seconds between trims in the daemon (server.py); one took 0.02-0.08 ms on the host


@functools.cache
def _malloc_trim() -> Optional[Any]:
    try:
        f = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc
    f.argtypes, f.restype = (ctypes.c_size_t,), ctypes.c_int
    return f


def trim() -> bool:
    """Give the heap's free pages back to the kernel (glibc's malloc_trim).
    glibc returns only the free space at the heap's top by itself; what a
    first read of a long log or a status report of 10,000 calls freed in
    between stays resident until this.  False where there is no glibc."""
    f = _malloc_trim()
    if f is None:
        return False
    f(0)
    return True


class Trimmer:
    """``trim()`` at most once every ``every`` seconds (0: never): serve's
    half-second round, and the hold bench doing as serve does."""

    def __init__(self, every: float = TRIM_EVERY) -> None:
        self.every, self._last = every, float("-inf")

    def maybe(self) -> None:
        now = time.monotonic()
        if self.every and now - self._last >= self.every:
            self._last = now
            trim()
