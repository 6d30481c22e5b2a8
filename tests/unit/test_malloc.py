"""The daemon's cap on glibc's malloc arenas (offload/malloc.py), counted
by glibc itself (malloc_stats() prints one "Arena N:" block per arena)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

CHILD = r"""
import ctypes, sys, threading
from pipexctl.offload import malloc
print(malloc.limit_arenas(int(sys.argv[1])) if sys.argv[1] != "none" else None, flush=True)
go = threading.Barrier(8)
def work():
    go.wait()  # all eight allocating at once, as a storm's request threads
    keep = [bytes(4096) for _ in range(64)]  # past pymalloc's 512 bytes: malloc's
    go.wait()
ts = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
ctypes.CDLL(None).malloc_stats()  # to stderr
"""


def _arenas(cap: str, env: dict[str, str] | None = None) -> tuple[str, int]:
    base = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", CHILD, cap], capture_output=True, text=True, check=True,
                         env={**base, **(env or {})})
    return out.stdout.strip(), len(re.findall(r"^Arena \d+:", out.stderr, re.M))


def test_without_a_cap_each_thread_gets_an_arena_of_its_own():
    # the premise: eight threads allocating at once take more than two arenas
    _, n = _arenas("none")
    assert n > 2, n


def test_the_cap_holds_the_threads_to_its_arenas():
    said, n = _arenas("2")
    assert said == "2"
    assert 1 <= n <= 2, n


def test_an_operators_malloc_arena_max_is_left_as_it_is():
    said, n = _arenas("1", {"MALLOC_ARENA_MAX": "3"})
    assert said == "None"  # not overridden
    assert n == 3, n  # glibc's own reading of the variable


TRIM_CHILD = r"""
from pipexctl.offload import malloc
from pipexctl.testing.probe import memory_kib
def anon(): return memory_kib()["RssAnon"] // 1024
blocks = [bytearray(64 * 1024) for _ in range(2000)]  # 125 MiB on the heap, touched
kept = blocks[9::10]  # every tenth stays, the last among them: nothing is free at the heap's top
del blocks
before = anon()
print(before, anon() if not malloc.trim() else anon())
"""


def test_trim_gives_freed_heap_between_live_blocks_back_to_the_kernel():
    """What serve does after its first read and every 10 s: glibc keeps
    freed space below a live block resident until malloc_trim."""
    out = subprocess.run([sys.executable, "-c", TRIM_CHILD], capture_output=True, text=True, check=True)
    before, after = (int(x) for x in out.stdout.split())
    assert before >= 120 and after <= before - 90, (before, after)


def test_the_trimmer_trims_at_once_then_at_most_once_every_period(monkeypatch):
    from pipexctl.offload import malloc

    now, trims = [1000.0], []
    monkeypatch.setattr(malloc.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(malloc, "trim", lambda: trims.append(now[0]) or True)
    t, never = malloc.Trimmer(10.0), malloc.Trimmer(0)
    for step in (0.0, 4.0, 9.9, 10.0, 19.9, 25.0):
        now[0] = 1000.0 + step
        t.maybe()
        never.maybe()
    assert trims == [1000.0, 1010.0, 1025.0]

