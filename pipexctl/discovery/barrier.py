"""A log barrier: a line of our own, sent through syslog, that tells when a
log file holds every line xl2tpd wrote before it answered a question.

xl2tpd writes its ``Call established`` line in the same step of its main
loop that forks the call's pppd (an LNS writes it just after the fork, a
LAC just before), and reads its control pipe only in a later step.  Its
answer to a question asked after a pppd asked for a channel therefore
comes after that pppd's line went to syslog.  A line we send to the same
syslog socket after the answer is written after xl2tpd's line (one socket,
read in order by rsyslog, busybox syslogd and journald).  Once our line is
read back from the log file, xl2tpd's own line for the pppd has been read
too: a forged line written before it is then one of two claims on the
pppd, never the only one (``Tracker``: the call is disputed).

A log that never carries our line (a file xl2tpd writes itself with
``-D``, a filter by program name, no syslog socket) is noticed once: the
first barrier does not come back within ``PROBE`` seconds, or cannot be
sent.  Requests on such a log are answered without one (counted), as
before barriers existed.  A log that has carried one is then waited on:
a barrier that does not come back in time refuses the request (the call
stays on its pty and the live move asks again later), it never downgrades
the check.

The line is ``pipexctl[PID]: log barrier <nonce>``: a random nonce, never
written before it is sent, so no forged line can pass for it.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Literal, Optional

# syslog's facility daemon (3), level notice (5), as xl2tpd's own lines
_PRI = 3 * 8 + 5
MAX_PENDING = 64

State = Literal["passed", "wait", "absent"]


class LogBarrier:
    PROBE = 1.0  # seconds the first barrier may take before a log is taken not to carry them
    REPROBE = 60.0  # seconds between barriers sent to a log taken not to carry them (one line each)

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.carried: Optional[bool] = None  # None: not known yet
        self.sent = float("-inf")  # monotonic time of the last barrier sent
        self.passed = float("-inf")  # send time of the newest barrier read back
        self.pending: dict[str, float] = {}  # nonce -> its send time
        self._probe_until: Optional[float] = None
        self.note: Optional[str] = None  # something the owner should log once
        self._sock: Optional[socket.socket] = None

    def state(self, after: float) -> State:
        """``passed``: a barrier sent at or after ``after`` (monotonic) has been
        read back; ``absent``: this log does not carry barriers; ``wait``:
        one is on its way (sent now if none was since ``after``)."""
        if self.passed >= after:
            return "passed"
        if self.carried is None and self._probe_until is not None and time.monotonic() > self._probe_until:
            self._absent(f"the daemon's syslog line did not come back within {self.PROBE:.0f} s")
        if self.carried is False:
            if self.sent < after and time.monotonic() - self.sent > self.REPROBE:
                self._send()  # a later one may still come back (syslog started later): not waited for
            return "absent"
        if self.sent >= after or self._send():
            return "wait"
        # not sent: a log that has carried one is waited on still (the request
        # then times out); one never seen to carry one is taken not to (_send)
        return "wait" if self.carried else "absent"

    def feed(self, line: str) -> None:
        """One raw line as read from the log."""
        if not self.pending or "log barrier " not in line:
            return
        for nonce, sent in list(self.pending.items()):
            if nonce in line:
                self.passed = max(self.passed, sent)
                self.carried, self._probe_until = True, None
                # those sent before it will not come after it
                self.pending = {n: t for n, t in self.pending.items() if t > sent}
                return

    def _send(self) -> bool:
        nonce = os.urandom(16).hex()  # secrets.token_hex's own call, without secrets' imports (hmac, base64)
        msg = f"<{_PRI}>pipexctl[{os.getpid()}]: log barrier {nonce}".encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.connect(self.socket_path)
            self._sock.send(msg, socket.MSG_DONTWAIT)  # a full syslog queue must not stall a request
        except OSError as e:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self.carried is None:
                self._absent(f"cannot send to {self.socket_path}: {e.strerror}")
            return False
        now = time.monotonic()
        self.sent = now
        if len(self.pending) >= MAX_PENDING:
            self.pending.pop(next(iter(self.pending)))
        self.pending[nonce] = now
        if self.carried is None and self._probe_until is None:
            self._probe_until = now + self.PROBE
        return True

    def _absent(self, why: str) -> None:
        self.carried, self._probe_until = False, None
        self.note = (f"{why}: this log does not carry it, so a forged line written just before xl2tpd's own "
                     f"cannot be told from it (the journal's trusted fields, or a log that syslog writes, can)")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
