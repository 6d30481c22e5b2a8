"""A client for xl2tpd's control pipe, the protocol of ``xl2tpd-control``.

Request: one write of ``@<reply-file> <letter> <args>\\n`` to the FIFO
(default ``/var/run/xl2tpd/l2tp-control``).  xl2tpd opens ``<reply-file>``,
writes lines ``NN text`` (``00`` = ok) and closes it.  We make the reply file
a FIFO of our own in a private 0700 directory and read it with a timeout.
Written by hand: there is no Python library for it, and it is ~100 lines.

Letters (xl2tpd.c ``do_control``): ``x`` available, ``y`` status-lns,
``s`` status-lac (answers nothing: the status goes to the log), ``c``
connect-lac, ``d`` disconnect-lac, ``h`` hang up a call (our call id),
``t`` tunnel to host, ``o`` outgoing call, ``a``/``r`` add/remove LAC,
``z``/``w`` add/remove LNS.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import select
import shutil
import stat
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Optional

from .. import defaults, errors


class ControlError(errors.PipexError):
    """xl2tpd's control pipe failed or answered with an error."""


@dataclass
class Reply:
    code: int
    lines: list[str]  # the text after "NN ", OK line included

    @property
    def ok(self) -> bool:
        return self.code == 0


_LINE = re.compile(r"^(\d{2}) (.*)$")


def parse_reply(text: str) -> Reply:
    """Parse reply lines; the first line's code is the reply's code."""
    code: Optional[int] = None
    lines: list[str] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        m = _LINE.match(raw)
        if m is None:
            raise ControlError(f"malformed control reply line {raw[:120]!r}")
        if code is None:
            code = int(m[1])
        lines.append(m[2])
    if code is None:
        raise ControlError("empty control reply")
    return Reply(code, lines)


@dataclass
class AvailableTunnel:
    peer_tunnel_id: int
    tunnel_id: int
    calls: int


@dataclass
class Available:
    lns: list[str] = field(default_factory=list)
    lac: list[str] = field(default_factory=list)
    tunnels: list[AvailableTunnel] = field(default_factory=list)


_AV_TUNNEL = re.compile(r"^AVAILABLE tunnel \S+, id (\d{1,5}), ourtid (\d{1,5}) has (\d{1,6}) calls")
_AV_NAME = re.compile(r"^AVAILABLE (lns|lac)\.\d{1,6}\.name=(.{0,128})$")


def parse_available(reply: Reply) -> Available:
    av = Available()
    for ln in reply.lines[1:]:
        if m := _AV_TUNNEL.match(ln):
            av.tunnels.append(AvailableTunnel(int(m[1]), int(m[2]), int(m[3])))
        elif m := _AV_NAME.match(ln):
            if m[2]:
                getattr(av, m[1]).append(m[2])
    return av


@dataclass
class StatusCall:
    call_id: int  # ours (xl2tpd prints c->ourcid); its byte and packet counters are not read


@dataclass
class StatusTunnel:
    peer_tunnel_id: int  # the PEER's (xl2tpd prints t->tid)
    peer: str = ""
    peer_port: int = 0
    calls: dict[int, StatusCall] = field(default_factory=dict)


# the lines a check needs, of the seven per call: one findall over the whole
# answer, since an answer lists every call (10,000 calls: 70,000 lines) and
# the daemon asks often in a login storm
_ST = re.compile(r"^STATUS tunnels\.(\d{1,6})\.(?:calls\.(\d{1,6})\.)?(id|peer)=(.{0,64})$", re.M)


def parse_status_lns(reply: Reply) -> list[StatusTunnel]:
    tunnels: dict[str, StatusTunnel] = {}
    for ti, ci, what, value in _ST.findall("\n".join(reply.lines[1:])):
        t = tunnels.get(ti)
        if t is None:
            t = tunnels[ti] = StatusTunnel(0)
        try:
            if ci:
                if what == "id":
                    t.calls[int(value)] = StatusCall(int(value))
            elif what == "id":
                t.peer_tunnel_id = int(value)
            else:
                host, _, port = value.rpartition(":")
                t.peer, t.peer_port = host, int(port)
        except ValueError:
            raise ControlError(f"malformed status-lns line {what}={value[:64]!r}") from None
    return [tunnels[k] for k in sorted(tunnels, key=int)]


def write_request(pipe: str, line: bytes, timeout: float, no_reader: float) -> int:
    """Open xl2tpd's control FIFO (non-blocking), write one request line and
    return the still-open fd (the caller closes it).

    xl2tpd closes and reopens its end of the FIFO after each writer has
    gone, so for a moment an open finds no reader (ENXIO) or a write finds
    none (EPIPE): open and write again, ENXIO for ``no_reader`` seconds
    (then xl2tpd is taken as not running; counted afresh after an EPIPE,
    since xl2tpd was reading just before), EPIPE within ``timeout``."""
    end = time.monotonic() + timeout
    no_reader_end = time.monotonic() + no_reader
    while True:
        try:
            wfd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise ControlError(f"xl2tpd control pipe {pipe} does not exist (is xl2tpd running?)") from None
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise ControlError(f"cannot open {pipe}: {e.strerror}") from None
            if time.monotonic() >= no_reader_end:
                raise ControlError(f"nobody reads {pipe}: xl2tpd is not running") from None
            time.sleep(0.02)  # between xl2tpd's close and reopen, or not running
            continue
        written = False
        try:
            os.write(wfd, line)
            written = True
            return wfd
        except BlockingIOError:
            raise ControlError(f"{pipe} is full: xl2tpd is not reading its control pipe") from None
        except BrokenPipeError:
            if time.monotonic() >= end:
                raise ControlError(f"{pipe}: xl2tpd closed its control pipe") from None
            # a reader was there a moment ago: give its reopen the full ENXIO allowance again
            no_reader_end = time.monotonic() + no_reader
            time.sleep(0.02)
        finally:
            if not written:
                os.close(wfd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# a client's reply directory: the prefix, the maker's pid, mkdtemp's suffix
REPLY_DIR_PREFIX = "pipexctl-ctl-"


def reply_base() -> Optional[str]:
    """Where reply directories are made: under systemd the runtime directory,
    so the unit can have PrivateTmp (xl2tpd, outside it, writes the reply
    there); else the temporary directory (None)."""
    return (os.environ.get("RUNTIME_DIRECTORY") or "").split(":")[0] or None


def remove_stale_reply_dirs(base: str) -> int:
    """Remove the reply directories that clients of processes no longer
    running left in ``base`` (a daemon killed by SIGKILL never runs its
    cleanup, and systemd keeps the runtime directory across restarts).
    Only real directories of this user, named with a pid that is gone; a
    reused pid keeps its directory.  Returns how many were removed."""
    removed = 0
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        pid = name[len(REPLY_DIR_PREFIX):].split("-", 1)[0]
        if not name.startswith(REPLY_DIR_PREFIX) or not (pid.isascii() and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
            continue  # running (or another user's): not ours to judge
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: symlinks inside are not followed
            removed += not os.path.lexists(path)
    return removed


class ControlClient:
    def __init__(self, pipe: str = defaults.XL2TPD_CONTROL, timeout: float = defaults.CONTROL_TIMEOUT) -> None:
        self.pipe, self.timeout = pipe, timeout
        # one private directory for the client's reply FIFOs, a FIFO per
        # question: the daemon asks about once a second in a login storm,
        # and a directory made and removed per question cost more than the FIFO
        self._dir: Optional[str] = None
        self._dir_id: tuple[int, int] = (0, 0)  # its device and inode, as made
        self._dir_lock = threading.Lock()
        # never a name twice: xl2tpd removes the reply path once it has answered
        self._names = itertools.count()

    def _reply_path(self) -> str:
        """A new FIFO's path in the client's directory, made now (again
        when it is gone, or is not the one made: a cleaner of /tmp removed
        it, and anyone may have made another under its name there)."""
        with self._dir_lock:
            if self._dir is not None:
                try:
                    st = os.lstat(self._dir)
                    mine = (stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == self._dir_id
                            and st.st_uid == os.geteuid() and not st.st_mode & 0o077)
                except OSError:
                    mine = False
                if not mine:
                    self._dir = None
            if self._dir is None:
                # the pid in the name: a later daemon removes what a killed one left
                self._dir = tempfile.mkdtemp(prefix=f"{REPLY_DIR_PREFIX}{os.getpid()}-", dir=reply_base())
                st = os.lstat(self._dir)
                self._dir_id = (st.st_dev, st.st_ino)
                weakref.finalize(self, shutil.rmtree, self._dir, True)
            return os.path.join(self._dir, f"reply-{next(self._names)}")

    def request(self, letter: str, args: str = "") -> Reply:
        if len(letter) != 1 or "\n" in args or len(args) > 900:
            raise ControlError("bad control request")
        try:
            reply = self._reply_path()
            os.mkfifo(reply, 0o600)
        except OSError as e:
            raise ControlError(f"cannot make a reply FIFO: {e.strerror}") from None
        try:
            # open the reply FIFO first (non-blocking), so xl2tpd's open never blocks
            rfd = os.open(reply, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:  # out of fds, say: one error type for every caller
            _unlink(reply)
            raise ControlError(f"cannot open a reply FIFO: {e.strerror}") from None
        try:
            self._send(f"@{reply} {letter} {args}".rstrip().encode() + b"\n")
            return parse_reply(self._read_all(rfd))
        finally:
            # unlinked while still open for reading: xl2tpd opens the reply with a
            # blocking fopen(), which would wait for ever on a FIFO left without a
            # reader (a reply given up on), and xl2tpd with it, all its tunnels too
            _unlink(reply)
            os.close(rfd)

    def _send(self, line: bytes) -> None:
        os.close(write_request(self.pipe, line, self.timeout, min(self.timeout, 0.5)))  # not running: say so soon

    def _read_all(self, fd: int) -> str:
        end = time.monotonic() + self.timeout
        data = b""
        opened = False  # EOF only counts after xl2tpd has opened the FIFO
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise ControlError(f"no reply from xl2tpd on {self.pipe} within {self.timeout:.1f} s")
            p = select.poll()  # not select(): the fd may be past 1024 in a busy daemon
            p.register(fd, select.POLLIN)
            if not p.poll(min(left, 0.05) * 1000):
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                # select saw no writer (EOF), then xl2tpd opened the FIFO and
                # has not written yet: its data follows, EAGAIN is no error
                continue
            if chunk:
                data += chunk
                opened = True
                if len(data) > 4 << 20:
                    raise ControlError("control reply too large")
            elif opened:
                return data.decode("utf-8", "replace")
            else:
                time.sleep(0.01)  # no writer yet: select reports EOF on an unopened FIFO

    # typed helpers
    def available(self) -> Available:
        return parse_available(self._ok(self.request("x")))

    def status_lns(self, lns: str = "default") -> list[StatusTunnel]:
        return parse_status_lns(self._ok(self.request("y", lns)))

    def connect_lac(self, lac: str) -> Reply:
        return self._ok(self.request("c", lac))

    def disconnect_lac(self, lac: str) -> Reply:
        return self._ok(self.request("d", lac))

    def hangup(self, call_id: int) -> Reply:
        return self._ok(self.request("h", str(int(call_id))))

    def _ok(self, r: Reply) -> Reply:
        if not r.ok:
            raise ControlError(f"xl2tpd answered {r.code:02d}: {' / '.join(r.lines)[:200]}")
        return r
