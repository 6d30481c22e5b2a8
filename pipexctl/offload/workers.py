"""Request threads started ahead of the requests.

The accept loop hands each connection to a thread that is already running
and waiting, and goes back to accepting.  A thread started per request made
the loop wait in ``Thread.start()`` until the new thread had run, which
means until it got the interpreter's lock: while a discovery poll held it,
every connection behind it in a burst waited too (docs/offload.md, "The
request threads").

Written by hand: ``concurrent.futures.ThreadPoolExecutor`` starts its threads
inside ``submit()`` and waits there for each, and never starts one ahead of
need, so it would keep that wait in the accept loop.

A request may block for seconds (discovery's wait for its call, the
plugin's ack), so the number of threads is not capped, as it was not
before: ``spare`` threads are kept waiting beyond those busy; a thread
started for a burst ends after ``idle`` seconds without work once more than
``spare`` wait (the spare ones wait without a timer).  One starter thread
starts them, so a start's wait falls on it, never on the accept loop.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Optional

log = logging.getLogger("pipexctl.serve")

SPARE = 8  # threads kept waiting: a burst of this many needs no start
IDLE = 30.0  # seconds a thread beyond the spare ones waits for work before it ends
RETRY = 0.5  # seconds between the starter's tries after a thread could not be started


class Workers:
    def __init__(self, run: Callable[..., None], *, spare: int = SPARE, idle: float = IDLE,
                 name: str = "request") -> None:
        self._run, self.spare, self.idle, self.name = run, spare, idle, name
        self._jobs: queue.SimpleQueue[Optional[tuple[Any, ...]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ready = 0  # threads waiting for a job, or started and about to
        self._threads = 0
        self._short = threading.Event()  # the starter's wake: fewer than spare are ready
        self._stopping = False

    def start(self) -> None:
        """Start the starter, which starts the spare threads at once."""
        threading.Thread(target=self._start_more, name=f"{self.name}-starter", daemon=True).start()
        self._short.set()

    def submit(self, *args: Any) -> None:
        """Hand ``args`` to a waiting thread (``run(*args)``); never waits for a thread to start."""
        self._jobs.put(args)
        with self._lock:
            short = self._ready - self._jobs.qsize() < self.spare
        if short:
            self._short.set()

    def stop(self) -> None:
        """Let every thread end once it is idle (those at work finish their request)."""
        with self._lock:
            self._stopping = True
            n = self._threads
        for _ in range(n):
            self._jobs.put(None)
        self._short.set()

    def counts(self) -> tuple[int, int]:
        """(threads, of them waiting or about to)."""
        with self._lock:
            return self._threads, self._ready

    def _start_more(self) -> None:
        failed, warned = False, float("-inf")
        while True:
            # after a failed start, look again soon: with no thread at all, no one else would wake us
            self._short.wait(RETRY if failed else None)
            self._short.clear()
            failed = False
            while True:
                with self._lock:
                    if self._stopping or self._ready - self._jobs.qsize() >= self.spare:
                        break
                    self._ready += 1
                    self._threads += 1
                try:
                    threading.Thread(target=self._work, name=self.name, daemon=True).start()
                except RuntimeError:  # "can't start new thread": retried every RETRY s
                    with self._lock:
                        self._ready -= 1
                        self._threads -= 1
                    failed = True
                    if time.monotonic() - warned >= 60:
                        warned = time.monotonic()
                        log.warning("cannot start a request thread (out of memory or threads): requests wait")
                    break
            with self._lock:
                if self._stopping:
                    return

    def _work(self) -> None:
        while True:
            with self._lock:  # the spare ones wait without a timer: an idle daemon wakes for nothing
                timeout = self.idle if self._ready - self._jobs.qsize() > self.spare else None
            try:
                job = self._jobs.get(timeout=timeout)
            except queue.Empty:
                with self._lock:
                    if self._ready - self._jobs.qsize() > self.spare:  # a burst's thread, not needed now
                        self._ready -= 1
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._ready -= 1
                short = not self._stopping and self._ready - self._jobs.qsize() < self.spare
                if job is None:
                    self._threads -= 1
                    return
            if short:
                self._short.set()
            try:
                self._run(*job)
            except BaseException as e:
                # the handler logs its own failures; this is a bug in it, which may have left
                # the thread changed (a network namespace not restored): it ends, another is started
                with self._lock:
                    self._threads -= 1
                self._short.set()
                if isinstance(e, Exception):
                    log.exception("request thread: unexpected error (the thread ends)")
                    return
                raise
            with self._lock:
                self._ready += 1
