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
        self.dropped = 0  # long pauses not kept (more than KEEP in one round)
        self.count = [0, 0, 0]  # collections by generation
        self.seconds = [0.0, 0.0, 0.0]

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
        took, g = time.perf_counter() - self._t0, info.get("generation", 2)
        self.count[g] += 1
        self.seconds[g] += took
        if took >= LONG:
            if len(self._long) < KEEP:
                self._long.append((g, took, info.get("collected", 0)))
            else:
                self.dropped += 1

    def take(self) -> list[tuple[int, float, int]]:
        """The long pauses since the last call, oldest first (a callback that
        appends meanwhile, in another thread, appends to the list returned)."""
        long, self._long = self._long, []
        return long
