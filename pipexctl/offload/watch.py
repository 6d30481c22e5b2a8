"""Discovery as the offload daemon uses it: followed in a thread, asked by requests.

One lock (``lock``) guards the Discovery object; a request that waits for
its call reads the newest log lines itself and otherwise sleeps on
``polled`` until the model changes (``changes``): a poll that found
nothing new wakes no request, so K waiting requests are not K looks at
the model per watcher round.  Events found by a request are queued
(``pending``) and handed over by the watcher, so every event reaches the
offload service from one thread, in order.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from .. import defaults
from ..discovery import checkpoint, procscan, udpdrops
from ..discovery.discovery import Discovery, Scanned
from ..discovery.state import CallInfo, CallUp, CallUpdated, DataPath, Event, Role

if TYPE_CHECKING:
    from _typeshed import HasFileno

log = logging.getLogger("pipexctl.serve")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _argv_disagrees(pid: int, call: CallInfo) -> str:
    """xl2tpd starts each pppd with ``ipparam PEER`` (the tunnel's peer): a
    call from the log that names another peer is not this pppd's."""
    argv = procscan.argv(pid)  # read at the answer: once per request
    if "ipparam" in argv[:-1]:
        peer = argv[argv.index("ipparam") + 1]
        if peer != call.peer:
            return (f"the log binds pppd {pid} to call {call.call_id} of {call.peer}, but xl2tpd started it "
                    f"for {peer} (ipparam): a forged log line?")
    return ""


class FdEvent(threading.Event):
    """An Event that a thread blocked in select() sees: set() also makes a
    pipe readable, so the daemon's threads block instead of waking to look
    at flags (wake-ups take CPU from the data path)."""

    def __init__(self) -> None:
        super().__init__()
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self) -> None:
        super().set()
        self.kick()

    def kick(self) -> None:
        """Wake the waiter without setting the flag."""
        try:
            os.write(self._w, b"\0")
        except BlockingIOError:  # the pipe is full: the waiter wakes anyway
            pass

    def fileno(self) -> int:
        return self._r

    def drain(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass


def _survive(fn: Callable[[], object]) -> None:
    """The watcher never dies: a failure (an nft or netlink error, a bug) is
    logged and the next round tries again."""
    try:
        fn()
    except Exception:
        log.exception("discovery watcher: step failed (retried on the next round)")


class CallWatch:
    # A quiet daemon reads its logs once a second; while an end waits for its
    # exit, or just after any event: every log_interval; while a pppd waits
    # for its line: every WAITING_INTERVAL (a read that finds nothing new is
    # a read(2) per log and wakes no request).  An exit wakes it at once.
    IDLE_INTERVAL = 1.0
    ACTIVE_FOR = 5.0
    WAITING_INTERVAL = 0.05
    # a request reads the logs itself only when nobody did for FRESH seconds
    FRESH = 0.02
    # a control answer judges a request's claim if asked after its pppd was
    # forked and at most this long before the request (call_of)
    ANSWER_AGE = 10.0
    # the asker's questions at most this often (ask_ahead), and within
    # BACKGROUND_SHARE; in a storm on TCG, xl2tpd took 0.2 s and more per
    # answer anyway (docs/offload.md)
    ASK_AHEAD_GAP = 0.2
    # /proc and kernel scans are the costly part: every reconcile_interval
    # while calls come and go, every IDLE_RECONCILE when nothing happens
    # (ends are confirmed by exits, not by the scans)
    IDLE_RECONCILE = 30.0
    # ... and at most this share of a CPU: a full poll that cost c seconds of
    # the watcher's CPU is followed by the next one no sooner than c / share.
    # So is the asker's question, whose answer lists every call (10,000:
    # about 0.1 s of CPU to read natively).
    # The daemon runs at the unit's Nice=-20, ahead of the xl2tpd and pppds
    # whose calls wait for it; a scan grows with their number (in a 153-call
    # storm on a TCG guest, 0.3-0.4 s of CPU each: docs/offload.md)
    BACKGROUND_SHARE = 0.1
    # a full poll waits at most this long between its parts for the requests
    # blocked on the lock (_let_requests_in)
    LET_IN = 0.1
    # the read positions and model are saved at stop and, for a crash, this
    # often while lines come in (its encoding holds the lock: bench/startup.py)
    CHECKPOINT_EVERY = 60.0

    def __init__(self, discovery: Discovery, *, log_interval: float = 0.2, reconcile_interval: float = defaults.RECONCILE_INTERVAL,
                 checkpoint_path: Optional[str] = None, xl2tpd_port: int = defaults.L2TP_PORT) -> None:
        # Logs are cheap to follow; /proc and kernel scans are not (they cost CPU
        # that the data path needs), so they run rarely, and on demand while a
        # pppd waits for its channel.
        self.discovery = discovery
        self.log_interval, self.reconcile_interval = log_interval, reconcile_interval
        self.lock = threading.Lock()
        self.polled = threading.Condition(self.lock)  # notified when `changes` moves
        self.changes = 0  # bumped when the model may have changed (lines read, a scan, an answer)
        self.looks = 0  # times a request looked at the model (bench/requestwait.py)
        self._read_at = float("-inf")  # monotonic time the logs were last read
        self._lines = -1  # log lines read by then
        self.pending: list[Event] = []
        self.wake = FdEvent()  # reload, or a request waiting for its line
        self.waiting = 0  # requests inside call_of (under lock)
        self.wanting = 0  # requests blocked on the lock at call_of's start
        self._wanting_lock = threading.Lock()
        self.active = float("-inf")  # monotonic time of the last event or request
        self.unchecked = 0  # calls offloaded on the log's word: the control pipe did not answer
        self.unbarriered = 0  # calls answered from a log that does not carry the daemon's barrier line
        self._paths: Counter[tuple[Role, DataPath]] = Counter()
        self._asking: Optional[float] = None  # when the control question now out was asked
        self._asked = float("-inf")  # when the last question went out (monotonic)
        self.questions = 0  # questions asked in all (status)
        # a question asked as soon as an LNS pppd's line is read, ahead of its
        # request (ask_ahead): asked for the newest such line, read at `_ahead_for`
        self._ahead = threading.Event()
        self._ahead_for = float("-inf")
        self.questions_ahead = 0  # of `questions` (status)
        self.udp_drops = udpdrops.DropWatch(xl2tpd_port)  # xl2tpd's socket overflowing (a login storm)
        self.scan_cpu = 0.0  # CPU seconds of the last full poll (BACKGROUND_SHARE)
        self.checkpoint_path = checkpoint_path
        self._saved_at = (time.monotonic(), -1)  # when, and after how many lines read
        self._saving = threading.Lock()  # the stop's save and a periodic one share the temp file

    def first_read(self) -> None:
        """The start's read of every source (the state is reconciled as a
        whole after it): from a checkpoint's positions where they still fit."""
        t = time.monotonic()
        with self.lock:
            if self.checkpoint_path:
                cp, warning = checkpoint.load(self.checkpoint_path)
                if warning:
                    log.warning("%s", warning)
                for line in self.discovery.resume(cp) if cp is not None else []:
                    log.info("discovery: %s", line)
            self.discovery.refresh(events=False)
            self.discovery.probe_barriers()
            lines = self.discovery.lines_read()
        log.info("discovery: first read of %d log line(s) in %.0f ms", lines, (time.monotonic() - t) * 1000)

    def save_checkpoint(self) -> None:
        """Save where each log was read to, with the model (see discovery/checkpoint.py)."""
        if not self.checkpoint_path:
            return
        with self._saving:
            with self.lock:
                lines = self.discovery.lines_read()
                if lines == self._saved_at[1]:
                    return
                data = checkpoint.encode(self.discovery.checkpoint())
            try:
                checkpoint.write(self.checkpoint_path, data)
            except OSError as e:
                log.warning("cannot write the discovery checkpoint %s: %s", self.checkpoint_path, e.strerror)
                return
            self._saved_at = (time.monotonic(), lines)

    def refresh(self) -> list[Event]:
        """SIGHUP: every source again (logs are followed by name anyway)."""
        with self.lock:
            return self.discovery.refresh()

    def call_of(self, pid: int, wait: float, xl2tpd_pid: Optional[int] = None,
                timing: Optional[dict[str, float]] = None) -> tuple[Optional[CallInfo], str]:
        """The call of pppd ``pid``, once discovery knows it (bounded by ``wait``),
        or None and why not.

        The LNS logs the pppd PID; the LAC's comes from that one pppd's /proc
        entry (its argv against the one xl2tpd logged for the call).  The
        request reads the lines logged since the last read itself (xl2tpd
        has written "Call established" by the time its pppd asks, as a rule),
        instead of waiting up to a watcher period for them; when the line is
        not there yet, the watcher's next poll wakes it.  ``xl2tpd_pid``:
        pppd's verified parent; a claim from another xl2tpd's lines is
        passed over.  ``timing["line"]``: seconds until its call was known
        with all its ids (the rest of the wait is the control pipe's and the
        barrier's check)."""
        now = time.monotonic()
        end = now + wait
        # read once, outside the lock: a pppd's parent and argv do not change
        # (_call_of reads it again while it is not yet pppd)
        proc = procscan.read_process(pid, with_fds=False)
        # xl2tpd lists a call from its ICRQ on, before it forks the call's
        # pppd, and logs the call in the step of that fork: an answer asked
        # after the fork lists the call and comes after its line.  In a storm
        # pppd takes seconds to ask, and answers asked meanwhile serve it
        since = now if proc is None else max(min(now, procscan.started(proc)), now - self.ANSWER_AGE)
        self._wants(1)  # a full poll lets it in between its parts (_let_requests_in)
        try:
            self.lock.acquire()
        finally:
            self._wants(-1)
        try:
            self.waiting += 1
            self.active = time.monotonic()
            timing = {} if timing is None else timing
            try:
                return self._call_of(pid, proc, since, end, xl2tpd_pid, timing)
            finally:
                self.waiting -= 1
                if "line" in timing:
                    timing["line"] -= now
        finally:
            self.lock.release()

    def _wants(self, n: int) -> None:
        with self._wanting_lock:
            self.wanting += n

    def _call_of(self, pid: int, proc: Optional[procscan.Proc], since: float, end: float,
                 xl2tpd_pid: Optional[int], timing: dict[str, float]) -> tuple[Optional[CallInfo], str]:
        asked, kicked = float("-inf"), False
        refuted: dict[tuple[str, Optional[int], int], CallInfo] = {}
        while True:
            if proc is None or proc.comm != "pppd":  # not exec'd yet when read: read again
                proc = procscan.read_process(pid, with_fds=False)
            self._look(pid, proc)
            claims = self.discovery.tracker.calls_of_pppd(pid)
            self._refute(refuted, pid, [c for c in claims if not self._of_parent(c, xl2tpd_pid)],
                         "but that xl2tpd is not its parent")
            claims = [c for c in claims if self._of_parent(c, xl2tpd_pid)]
            verdict = {id(c): True if len(claims) == 1 and self._own_entry(c, proc, xl2tpd_pid)
                       else self._listed(c, since) for c in claims}
            # a line naming a call xl2tpd does not list is a forged one: passed over
            self._refute(refuted, pid, [c for c in claims if verdict[id(c)] is False])
            claims = [c for c in claims if verdict[id(c)] is not False]
            if len(claims) > 1:
                # xl2tpd logs one "Call established ... PID:" per pppd: a second
                # claim is a forged line, and which is true cannot be told
                return None, (f"{len(claims)} calls name pppd {pid} (calls "
                              f"{', '.join(str(c.call_id) for c in claims)}): a forged log line?")
            mine = claims[0] if claims else None
            if mine is not None and mine.disputed:
                return None, (f"two log lines give call {mine.call_id} of pppd {pid} other peer ids: one of them "
                              f"is forged, and which cannot be told")
            complete = mine is not None and mine.ids() is not None
            if complete and "line" not in timing:
                timing["line"] = time.monotonic()  # call_of makes it a duration
            if mine is not None and complete and verdict[id(mine)] is not None:
                bar = self.discovery.barrier(mine.instance, since)
                if bar == "wait":
                    # xl2tpd's lines up to its answer are still on their way through
                    # syslog: a second line naming this pppd may be among them
                    if time.monotonic() < end:
                        self._sleep(min(0.25, end - time.monotonic()))  # the watcher reads the log meanwhile
                        continue
                    return None, ("the daemon's syslog line (its log barrier) did not come back in the log in "
                                  "time: whether a second line names this pppd cannot be told yet")
                if bar == "absent":
                    self.unbarriered += 1
                why = _argv_disagrees(pid, mine)
                return (None, why) if why else (mine.copy(), "")
            if (mine is not None or refuted) and self._asking is not None and time.monotonic() < end:
                # a question is out: wait for its answer (it serves this
                # request if it was asked after `since`: call_of)
                self._sleep(max(0.05, min(end - time.monotonic(), 1.0)))
                continue
            if (mine is not None and complete and self._listed(mine, since) is None
                    and self.discovery.unanswered.get(mine.instance, float("-inf")) >= since):
                # a question asked after `since` (another request's) went
                # unanswered: not a second timeout for this one
                return self._unchecked(pid, mine)
            if (mine is not None or refuted) and time.monotonic() - asked > 0.5:
                # the control pipe (status-lns) says which tunnel holds each
                # call: an LNS log names only the peer's address, ambiguous
                # with several tunnels from one peer; and a claim is checked there
                asked = time.monotonic()
                before = [c.copy() for c in claims]
                # an LNS call is checked against status-lns alone: one round trip, not two
                failed = self._ask_control(lns_calls_only=bool(claims) and all(c.role == "lns" for c in claims))
                # the answer also ends a call it does not list in the model: judged here
                self._refute(refuted, pid, [c for c in before if self._listed(c, since) is False])
                if mine is not None and complete and failed and self._listed(mine, since) is None:
                    return self._unchecked(pid, mine)
                continue
            left = end - time.monotonic()
            if left <= 0:
                if refuted and mine is None:
                    c = next(iter(refuted.values()))
                    return None, (f"the log names call {c.call_id} of tunnel {c.tunnel_id} for pppd {pid}, but "
                                  f"xl2tpd's control pipe does not list it: a forged log line?")
                return None, (f"call {mine.call_id} known, but not yet its tunnel/peer ids (tunnel "
                              f"{mine.tunnel_id}, peer tunnel {mine.peer_tunnel_id}, peer call "
                              f"{mine.peer_call_id}, peer port {mine.peer_port})" if mine else "no call names this pid")
            if not kicked:  # out of its idle sleep: it polls every log_interval while we wait
                kicked = True
                self.wake.kick()
            self._sleep(min(left, 1.0))

    def _unchecked(self, pid: int, mine: CallInfo) -> tuple[Optional[CallInfo], str]:
        """xl2tpd did not answer: the log's word, checked against pppd's argv."""
        log.warning("call %d of pppd %d not checked against xl2tpd's control pipe (no answer)", mine.call_id, pid)
        self.unchecked += 1
        why = _argv_disagrees(pid, mine)
        return (None, why) if why else (mine.copy(), "")

    def _look(self, pid: int, proc: Optional[procscan.Proc]) -> None:
        """A request's look at the model: the newest log lines (unless just
        read), and its pppd matched from its /proc entry (a LAC's pppd is
        named in no line).  The caller holds the lock."""
        self.looks += 1
        if time.monotonic() - self._read_at >= self.FRESH:
            self._read_at = time.monotonic()
            self._take(self.discovery.poll(reconcile=False))  # new log lines only: cheap
        if proc is not None:
            self._take(self.discovery.observe_process(pid, proc))

    def _take(self, ev: list[Event], changed: bool = False) -> None:
        """Queue what a read of the model found; wake the waiting requests
        when it may have changed the model.  The caller holds the lock."""
        self.pending += ev
        if any(self._wants_answer(e) for e in ev):
            self._ahead_for = time.monotonic()
            self._ahead.set()
        lines = self.discovery.lines_read()
        if ev or changed or lines != self._lines:
            self._lines = lines
            self.changes += 1
            self.polled.notify_all()

    def _sleep(self, seconds: float) -> None:
        """Wait (the lock released) until the model changes or ``seconds``
        pass: a request wakes for news, not for each of the watcher's rounds."""
        seen, until = self.changes, time.monotonic() + seconds
        while self.changes == seen:
            left = until - time.monotonic()
            if left <= 0:
                return
            self.polled.wait(left)

    def _ask_control(self, lns_calls_only: bool = False) -> list[str]:
        """Ask xl2tpd's control pipes and apply the answer; the caller holds
        the lock, which is released while the question is out (xl2tpd
        answers slowly in a login storm, and requests and the watcher go on
        meanwhile).  ``lns_calls_only``: status-lns alone
        (``Discovery.fetch_control``).  Returns the failures (logged by the
        watcher)."""
        known = self.discovery.control_known()
        self.questions += 1
        self._asking = self._asked = time.monotonic()
        self.lock.release()
        try:
            answers = self.discovery.fetch_control(lns_calls_only)
        finally:
            self.lock.acquire()
            self._asking = None
        # failures join discovery.warnings: _poll logs them
        self._take(self.discovery.apply_control(answers, known), changed=True)
        return [e for *_, e in answers if e is not None]

    def _wants_answer(self, e: Event) -> bool:
        """``e`` is an LNS pppd's line, whose request will want the control
        pipe's word on it (not a journal entry: xl2tpd's own word, _own_entry)."""
        if not (isinstance(e, CallUp) and e.call.pppd_pid is not None
                or isinstance(e, CallUpdated) and "pppd_pid" in e.fields):
            return False
        c = e.call
        # control_given, not has_control: no /proc scan in a log read
        return (c.role == "lns" and c.data_path != "kernel" and self.discovery.control_given(c.instance)
                and not self.discovery.authenticated(c.instance))

    def ask_ahead(self, done: threading.Event) -> None:
        """The asker thread, until ``done``: a question about the LNS calls as
        soon as an LNS pppd's line is read.  xl2tpd logs that line after
        forking the pppd, so the answer serves the pppd's request (call_of),
        which in a login storm comes seconds later and would otherwise ask
        and wait a pass of xl2tpd's busy loop (and then its barrier's trip
        through syslog).  One question is out at a
        time; lines read while one is out get one more after it, unless a
        request asked one meanwhile.  At most one of its own every
        ASK_AHEAD_GAP, and none sooner than the last one's CPU allows under
        BACKGROUND_SHARE: anyone may write a line, and each answer costs
        xl2tpd and the daemon work in proportion to the calls."""
        last, gap = float("-inf"), self.ASK_AHEAD_GAP
        while True:
            self._ahead.wait()
            if done.is_set():
                return
            done.wait(max(0.0, last + gap - time.monotonic()))
            if done.is_set():
                return
            self._ahead.clear()
            with self.lock:
                while self._asking is not None and not done.is_set():
                    self.polled.wait(0.5)
                if done.is_set():
                    return
                if self._asked >= self._ahead_for:
                    continue  # a question went out after the line: its answer serves
                self.questions_ahead += 1
                last, cpu = time.monotonic(), time.thread_time()
                _survive(lambda: self._ask_and_send_barriers(done))
                gap = max(self.ASK_AHEAD_GAP, (time.thread_time() - cpu) / self.BACKGROUND_SHARE)

    @contextlib.contextmanager
    def asking_ahead(self) -> Iterator[None]:
        """The asker thread (ask_ahead), for as long as the block runs."""
        done = threading.Event()
        asker = threading.Thread(target=self.ask_ahead, args=(done,), name="control-ahead", daemon=True)
        asker.start()
        try:
            yield
        finally:
            done.set()
            self._ahead.set()
            # a question out ends within the control pipe's timeouts (2 s
            # each); a daemon thread, so the stop does not wait for more
            asker.join(5.0)

    def _ask_and_send_barriers(self, done: threading.Event) -> None:
        """The asker's question, then a log barrier after its answer (a log
        that syslog writes, barrier.py): on its way back through syslog
        before the request wants it.  The caller holds the lock."""
        self._ask_control(lns_calls_only=True)
        if done.is_set():  # the daemon is stopping: nothing more sent
            return
        for name in list(self.discovery.listed):
            self.discovery.barrier(name)

    @staticmethod
    def _refute(refuted: dict[tuple[str, Optional[int], int], CallInfo], pid: int, calls: list[CallInfo],
                why: str = "but xl2tpd's control pipe does not list that call") -> None:
        for c in calls:
            key = (c.instance, c.tunnel_id, c.call_id)
            if key not in refuted:
                refuted[key] = c.copy()
                log.warning("pppd %d: the log of %s names call %d of tunnel %s for it, %s: passed over (a forged "
                            "log line?)", pid, c.instance, c.call_id, c.tunnel_id, why)

    def _of_parent(self, c: CallInfo, xl2tpd_pid: Optional[int]) -> bool:
        """Claim ``c`` comes from the lines of pppd's own xl2tpd (or that
        cannot be told: no verified parent, or the lines' xl2tpd not known)."""
        ins = self.discovery.tracker.instances.get(c.instance)
        known = ins.daemon_pid if ins is not None else None
        return xl2tpd_pid is None or known is None or known == xl2tpd_pid

    def _own_entry(self, c: CallInfo, proc: Optional[procscan.Proc], xl2tpd_pid: Optional[int]) -> bool:
        """Claim ``c`` is an LNS call from a journal entry that names pppd
        ``proc`` and that its parent xl2tpd sent (by the kernel's word)
        after that pppd's fork: xl2tpd's own word, which its control pipe
        would only repeat.  The pipe is still asked for every other claim,
        and when two claims name one pppd."""
        if (c.role != "lns" or c.sources[:1] != ("log",) or proc is None or c.pppd_pid != proc.pid
                or xl2tpd_pid is None or not self.discovery.authenticated(c.instance)):
            return False
        ins = self.discovery.tracker.instances.get(c.instance)
        if ins is None or ins.daemon_pid != xl2tpd_pid:
            return False
        # an earlier pppd's entry with this pid is older than this one's fork
        # (journald stamps an entry on receipt; the fork is known to a tick)
        forked = time.time() - (time.monotonic() - procscan.started(proc)) - 2 / _CLK_TCK
        return c.since >= forked

    def _listed(self, c: CallInfo, since: float) -> Optional[bool]:
        """The control pipe's word on claim ``c``, whatever role the log
        gave it: True or False, None when it has not answered since
        ``since``.  True when there is nothing to ask (an xl2tpd without a
        control pipe given)."""
        if not self.discovery.has_control(c.instance):
            return True
        return self.discovery.listed_by_control(c, since)

    def calls(self) -> list[CallInfo]:
        """Copies of the calls discovery knows."""
        with self.lock:
            return [c.copy() for c in self.discovery.tracker.calls()]

    def instances(self) -> list[dict[str, object]]:
        """Each xl2tpd discovery follows: name, pid, kernel or userspace mode."""
        with self.lock:
            return [{"instance": i.name, "pid": i.daemon_pid,
                     "mode": {True: "kernel", False: "userspace", None: "unknown"}[i.kernel_mode]}
                    for i in self.discovery.tracker.instances.values()]

    def paths(self) -> Counter[tuple[Role, DataPath]]:
        """Known calls by (role, data path), for the metrics.  A scrape never
        waits for the lock a request may hold: the last count is given then."""
        if self.lock.acquire(blocking=False):
            try:
                self._paths = Counter((c.role, c.data_path) for c in self.discovery.tracker.calls())
            finally:
                self.lock.release()
        return Counter(self._paths)

    def run(self, stop: threading.Event, reload: threading.Event, *, handle: Callable[[list[Event]], None],
            reloaded: Callable[[list[Event]], None], tick: Callable[[], None], exits: Optional[HasFileno] = None,
            busy: Callable[[], bool] = lambda: False) -> None:
        """The watcher thread: poll, hand events to ``handle``; on ``reload``
        refresh everything and call ``reloaded``; ``tick`` every half second
        while ``busy()``, once a round otherwise, and at once when ``exits``
        (anything with fileno()) turns readable.  ``stop`` and ``reload``
        wake it when they are FdEvents."""
        sel = selectors.DefaultSelector()
        for src in (self.wake, stop, reload, exits):
            if src is not None and hasattr(src, "fileno"):
                sel.register(src, selectors.EVENT_READ, src)
        last = checked = time.monotonic()
        with sel, self.asking_ahead():
            while not stop.is_set():
                quick = self.waiting or busy() or time.monotonic() - self.active < self.ACTIVE_FOR
                period = self.log_interval if quick else self.IDLE_INTERVAL
                woke = [k.data for k, _ in sel.select(min(period, self.WAITING_INTERVAL) if self.waiting else period)]
                if stop.is_set():
                    break
                for src in woke:
                    if isinstance(src, FdEvent):
                        src.drain()
                now = time.monotonic()
                if exits is not None and exits in woke or now - checked >= 0.5:
                    checked = now
                    _survive(tick)
                if reload.is_set():
                    reload.clear()
                    _survive(lambda: reloaded(self.refresh()))
                every = max(self.reconcile_interval if quick else max(self.reconcile_interval, self.IDLE_RECONCILE),
                            self.scan_cpu / self.BACKGROUND_SHARE)
                full = now - last >= every
                if full:
                    last = now
                self._poll(full, handle)
                _survive(self._check_drops)
                if now - self._saved_at[0] >= self.CHECKPOINT_EVERY:
                    self._saved_at = (now, self._saved_at[1])
                    _survive(self.save_checkpoint)

    def _check_drops(self) -> None:
        pids = [i.daemon_pid for i in list(self.discovery.tracker.instances.values()) if i.daemon_pid]
        for w in self.udp_drops.check(pids):
            log.warning("%s", w)

    def _poll_part(self, reconcile: bool, scanned: Optional[Scanned] = None,
                   scanned_at: Optional[float] = None) -> dict[str, float]:
        """One part of a watcher's poll, under the lock: the new log lines, or
        the reconcile with /proc (``scanned``) and the kernel.  Returns the
        time of each of its steps."""
        ev: list[Event] = []
        try:
            ev = self.discovery.poll(logs=not reconcile, reconcile=reconcile, scanned=scanned, scanned_at=scanned_at)
        except OSError as e:  # out of fds (procscan raises rather than call a process gone)
            log.warning("discovery poll failed: %s", e)
        except Exception:  # never let the watcher die: log and go on
            log.exception("discovery poll failed")
        self._take(ev, changed=reconcile)
        return dict(self.discovery.poll_seconds)  # a request's own poll overwrites them once the lock is free

    def _let_requests_in(self) -> None:
        """Between a full poll's parts: requests that want the lock go first
        (a Lock is not fair: the watcher would take it straight back)."""
        end = time.monotonic() + self.LET_IN
        while self.wanting and time.monotonic() < end:
            time.sleep(0.002)

    def _collect(self) -> list[Event]:
        """Under the lock, at a poll's end: the events left for the handler
        (a request's own poll may have added some); discovery's warnings logged."""
        ev, self.pending = self.pending, []
        for w in self.discovery.warnings:
            log.warning("discovery: %s", w)
        del self.discovery.warnings[:]
        return ev

    def _poll(self, full: bool, handle: Callable[[list[Event]], None]) -> None:
        t, cpu0 = time.monotonic(), time.thread_time()
        scanned = None
        if full and self.discovery.proc:
            with self.lock:
                wanted = self.discovery.scan_wanted()
            try:
                scanned = procscan.scan(**wanted)  # outside the lock: slow under TCG
            except OSError as e:  # out of fds: no scan this round, and no end read into a failed one
                log.warning("discovery: cannot scan /proc: %s", e.strerror)
                full = False
            except Exception:  # a bug must not stop the watcher: no scan this round
                log.exception("discovery: the /proc scan failed")
                full = False
        t_scanned = time.monotonic()
        # new log lines first; then, once the requests that waited on the lock
        # meanwhile have had it (their lines are read now), the reconcile
        # (100-400 ms under the lock in a storm on TCG: docs/offload.md)
        with self.lock:
            t_locked = time.monotonic()
            self._read_at = t_locked
            parts = self._poll_part(reconcile=False)
            if not full:
                ev = self._collect()
        if full:
            self._let_requests_in()
            with self.lock:
                parts.update(self._poll_part(reconcile=True, scanned=scanned, scanned_at=t))
                ev = self._collect()
        took = time.monotonic() - t
        cpu = time.thread_time() - cpu0
        if full:
            self.scan_cpu = cpu
        if took > 1.0:
            # where it went: the /proc scan (no lock), waiting for the lock (a
            # request's discovery), then each part of the poll
            parts = {"scan": t_scanned - t, "lock wait": t_locked - t_scanned, **parts}
            log.info("slow discovery poll: %.0f ms, %.0f ms of CPU (full=%s; ms: %s)", took * 1000,
                     cpu * 1000, full, ", ".join(f"{k} {v * 1000:.0f}" for k, v in parts.items()))
        if ev:
            self.active = time.monotonic()
            _survive(lambda: handle(ev))
