"""The cyclic garbage collector's pauses in `pipexctl serve`.

A collection holds the interpreter's lock for its whole length, so every
thread of the daemon (the accept loop, the requests, the watcher) waits
for it.  The long ones are logged from the watcher's half-second round,
never from inside the collection (docs/offload.md, seventh part).
"""

from __future__ import annotations

import gc
import time
from typing import Any

LONG = 0.02  # seconds: a pause this long or longer is logged
KEEP = 64  # long pauses kept between two rounds; more are counted only


class Pauses:
    def __init__(self) -> None:
        self._t0 = 0.0
        self._long: list[tuple[int, float, int]] = []  # (generation, seconds, objects collected)
        self._dropped = 0  # long pauses not kept (more than KEEP in one round)

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # runs inside the collection, in whichever thread triggered it: counts only
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        if took >= LONG:
            if len(self._long) < KEEP:
                self._long.append((info.get("generation", 2), took, info.get("collected", 0)))
            else:
                self._dropped += 1

    def take(self) -> tuple[list[tuple[int, float, int]], int]:
        """The long pauses since the last call, oldest first, and how many more
        there were (a callback in another thread meanwhile may land in either
        round or, at worst, be lost: they are only logged)."""
        long, self._long = self._long, []
        dropped, self._dropped = self._dropped, 0
        return long, dropped
