"""offload.ptys.PtyHolder with real ptys (os.openpty): the test plays
xl2tpd on the master end, the holder keeps the slave that pppd gave up.
test_trust.py checks that a pty whose master closed is released; these
check the rest."""

from __future__ import annotations

import errno
import os
import termios
import time

import pytest

from pipexctl.offload.ptys import PtyHolder

from .conftest import readable


def until(cond, timeout=5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def closed(fd) -> bool:
    try:
        os.fstat(fd)
    except OSError as e:
        return e.errno == errno.EBADF
    return False


def master_sees_hangup(master) -> bool:
    """What xl2tpd reads once no one holds the slave: EIO."""
    os.set_blocking(master, False)
    try:
        os.read(master, 1)
    except BlockingIOError:
        return False
    except OSError as e:
        return e.errno == errno.EIO
    return False


class Ptys:
    """Opens ptys; closes at the end the masters a test did not close itself
    (by hangup: never a number closed twice, it may name another file by then)."""

    def __init__(self) -> None:
        self.masters: list[int] = []

    def __call__(self) -> tuple[int, int]:
        m, s = os.openpty()
        self.masters.append(m)
        return m, s

    def hangup(self, master: int) -> None:
        self.masters.remove(master)
        os.close(master)


@pytest.fixture
def pty():
    p = Ptys()
    yield p
    for m in p.masters:
        os.close(m)


def test_a_held_pty_is_kept_raw_and_non_blocking(pty):
    h = PtyHolder()
    master, slave = pty()
    h.hold(("xl2tpd", 7), slave)
    assert h.held(("xl2tpd", 7)) == slave and h.keys() == [("xl2tpd", 7)]
    assert not os.get_blocking(slave)
    lflag = termios.tcgetattr(slave)[3]
    assert not lflag & (termios.ECHO | termios.ICANON | termios.ISIG)
    assert not master_sees_hangup(master)  # the slave is held: xl2tpd does not spin on EIO


def test_what_xl2tpd_writes_is_drained_and_never_echoed(pty):
    h = PtyHolder()
    master, slave = pty()
    h.hold(("xl2tpd", 7), slave)
    os.set_blocking(master, False)
    data, sent, end = b"\x7e\xff\x03\xc0\x21" * 200_000, 0, time.monotonic() + 20  # 1 MB: ~250 pty buffers
    while sent < len(data) and time.monotonic() < end:
        try:
            sent += os.write(master, data[sent:sent + 4096])
        except BlockingIOError:  # the pty is full until the holder reads it
            time.sleep(0.001)
    assert sent == len(data)
    time.sleep(0.1)
    assert not readable(master)  # raw: the line discipline sent nothing back to xl2tpd
    assert h.held(("xl2tpd", 7)) == slave


def test_release_closes_the_slave_and_forgets_it(pty):
    h = PtyHolder()
    master, slave = pty()
    h.hold(("xl2tpd", 7), slave)
    h.release(("xl2tpd", 7))
    assert h.held(("xl2tpd", 7)) is None and h.keys() == []
    assert closed(slave)
    assert master_sees_hangup(master)
    h.release(("xl2tpd", 7))  # again, and a key never held: nothing happens
    h.release(("xl2tpd", 8))


def test_holding_a_key_again_closes_the_slave_it_held(pty):
    h = PtyHolder()
    m1, s1 = pty()
    m2, s2 = pty()
    h.hold(("xl2tpd", 7), s1)
    h.hold(("xl2tpd", 7), s2)
    assert h.held(("xl2tpd", 7)) == s2 and h.keys() == [("xl2tpd", 7)]
    assert master_sees_hangup(m1) and not master_sees_hangup(m2)


def test_the_master_closing_releases_that_pty_and_the_others_are_still_drained(pty):
    h = PtyHolder()
    m1, s1 = pty()
    m2, s2 = pty()
    h.hold(("xl2tpd", 1), s1)
    h.hold(("xl2tpd", 2), s2)
    pty.hangup(m1)  # call 1 ended: xl2tpd closed its end; the slave reads EIO
    assert until(lambda: h.held(("xl2tpd", 1)) is None)
    assert h.keys() == [("xl2tpd", 2)] and closed(s1)
    os.set_blocking(m2, False)
    sent, end = 0, time.monotonic() + 20
    while sent < 200_000 and time.monotonic() < end:
        try:
            sent += os.write(m2, b"x" * 4096)
        except BlockingIOError:
            time.sleep(0.001)
    assert sent >= 200_000  # far more than one pty buffer: the drain goes on for call 2
    assert h.held(("xl2tpd", 2)) == s2


def test_eio_on_the_slave_releases_it_like_end_of_file(pty, monkeypatch):
    """Linux reads end-of-file on a slave whose master closed; EIO (as other
    kernels, or a hangup, give) is the same end of the call."""
    h = PtyHolder()
    master, slave = pty()
    real = os.read

    def read(fd, n):
        if fd == slave:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, n)

    monkeypatch.setattr(os, "read", read)
    h.hold(("xl2tpd", 7), slave)
    os.write(master, b"lcp terminate-request")  # readable: the drain reads, and gets EIO
    assert until(lambda: h.held(("xl2tpd", 7)) is None)
    monkeypatch.undo()
    assert closed(slave) and master_sees_hangup(master)


def test_a_released_slaves_number_can_be_held_again_for_another_call(pty):
    """The selector forgets a released fd before it is closed: the number,
    reused by the next pty (or a tunnel socket), is registered afresh."""
    h = PtyHolder()
    m1, s1 = pty()
    m2, s2 = pty()  # opened first: else the master would take the released number
    h.hold(("xl2tpd", 1), s1)
    h.release(("xl2tpd", 1))
    os.dup2(s2, s1)  # the new slave under the old slave's number
    os.close(s2)
    h.hold(("xl2tpd", 2), s1)
    assert h.held(("xl2tpd", 2)) == s1
    pty.hangup(m2)
    assert until(lambda: h.held(("xl2tpd", 2)) is None) and closed(s1)


def test_holding_a_pty_whose_master_already_closed_does_not_raise_and_releases_it(pty):
    h = PtyHolder()
    master, slave = pty()
    pty.hangup(master)  # the call ended while pppd was handing its pty over
    try:
        h.hold(("xl2tpd", 7), slave)
    except BaseException:
        os.close(slave)
        raise
    assert until(lambda: h.held(("xl2tpd", 7)) is None) and closed(slave)


def test_any_hashable_key_keeps_the_drain_alive(pty):
    h = PtyHolder()
    m1, s1 = pty()
    h.hold(7, s1)  # hold(key: Hashable, ...)
    pty.hangup(m1)
    assert until(lambda: h.held(7) is None)
    m2, s2 = pty()
    h.hold(("xl2tpd", 8), s2)
    pty.hangup(m2)
    assert until(lambda: h.held(("xl2tpd", 8)) is None, timeout=3)
