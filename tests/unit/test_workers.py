"""The request threads started ahead (pipexctl/offload/workers.py)."""

from __future__ import annotations

import threading
import time

import pytest

from pipexctl.offload import workers as workers_mod
from pipexctl.offload.workers import Workers


def _until(cond, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture
def made():
    pools: list[Workers] = []

    def make(run, **kw) -> Workers:
        w = Workers(run, **kw)
        pools.append(w)
        w.start()
        return w

    yield make
    for w in pools:
        w.stop()


def test_the_spare_threads_wait_before_any_request(made) -> None:
    w = made(lambda: None, spare=3)
    assert _until(lambda: w.counts() == (3, 3))


def test_more_blocking_requests_than_spare_threads_all_run_at_once(made) -> None:
    # six requests that each wait for all six: a capped pool of two would never finish them
    gate = threading.Barrier(6, timeout=5)
    done: list[int] = []

    def run(i: int) -> None:
        gate.wait()
        done.append(i)

    w = made(run, spare=2)
    for i in range(6):
        w.submit(i)
    assert _until(lambda: len(done) == 6), f"only {done} ran"
    assert sorted(done) == list(range(6))


def test_the_submitter_never_starts_a_thread(made, monkeypatch) -> None:
    # the accept loop's thread must not wait in Thread.start(): only the starter starts threads
    starters: list[str] = []
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        starters.append(threading.current_thread().name)
        real(self)

    monkeypatch.setattr(workers_mod.threading.Thread, "start", start)
    release = threading.Event()
    w = made(lambda: release.wait(5), spare=1, name="req")
    for _ in range(5):
        w.submit()
    assert _until(lambda: w.counts()[0] >= 6)  # five at work, one spare
    release.set()
    assert starters and set(starters[1:]) == {"req-starter"}, starters  # the first: the starter itself


def test_a_bursts_threads_end_once_idle_and_the_spare_stay(made) -> None:
    release = threading.Event()
    w = made(lambda: release.wait(5), spare=1, idle=0.2)
    for _ in range(4):
        w.submit()
    assert _until(lambda: w.counts()[0] >= 5)
    release.set()
    assert _until(lambda: w.counts() == (1, 1)), w.counts()


def test_a_request_that_raises_ends_its_thread_and_another_serves(made, caplog) -> None:
    ran: list[str] = []

    def run(what: str) -> None:
        if what == "boom":
            raise RuntimeError("a bug in the handler")
        ran.append(what)

    w = made(run, spare=1, name="raiser")
    w.submit("boom")
    w.submit("after")
    assert _until(lambda: ran == ["after"])
    assert "unexpected error" in caplog.text
    # the thread that raised may be left changed (a namespace not restored): it ended; every thread
    # counted is alive and waiting, the spare one among them
    live = lambda: sum(t.name == "raiser" and t.is_alive() for t in threading.enumerate())  # noqa: E731
    assert _until(lambda: w.counts()[0] == w.counts()[1] == live() >= 1), (w.counts(), live())


def test_stop_ends_every_thread_once_its_request_is_done(made) -> None:
    release = threading.Event()
    done: list[int] = []

    def run() -> None:
        release.wait(5)
        done.append(1)

    w = made(run, spare=2)
    w.submit()
    assert _until(lambda: w.counts()[0] >= 3)
    w.stop()
    assert w.counts()[0] >= 1  # the one at work is not cut short
    release.set()
    assert _until(lambda: w.counts() == (0, 0)), w.counts()
    assert done == [1]


def test_a_failed_start_is_retried_even_with_no_thread_to_wake_the_starter(made, monkeypatch) -> None:
    # no thread could be started at first: a request that came meanwhile is served once starts work again
    real = threading.Thread.start
    fail = [True]

    def start(self: threading.Thread) -> None:
        if fail[0] and self.name == "flaky":
            raise RuntimeError("can't start new thread")
        real(self)

    monkeypatch.setattr(workers_mod, "RETRY", 0.05)
    monkeypatch.setattr(workers_mod.threading.Thread, "start", start)
    ran: list[int] = []
    w = made(ran.append, spare=1, name="flaky")
    assert _until(lambda: w.counts() == (0, 0), 1)
    w.submit(1)
    time.sleep(0.2)
    assert ran == []
    fail[0] = False
    assert _until(lambda: ran == [1]), (ran, w.counts())
