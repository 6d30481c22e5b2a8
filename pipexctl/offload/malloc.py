"""glibc's malloc, held to one arena in the daemon.

glibc gives each new thread that allocates an arena of its own, up to
eight per CPU, and what is freed in an arena stays with it.  A login storm
runs a request thread per pppd: in K = 100 storms under emulation the
daemon ended at 79 MiB resident with glibc's default, 49-50 MiB with two
arenas and 45 MiB with one (docs/offload.md, "Memory in a login storm").
Python's own lock keeps its threads from allocating at once anyway, so one
arena makes them wait for each other no more than they already do.
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional

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
