"""The daemon's log records in the journal (offload/journal.py): journald's
native protocol, with fields journalctl can match, used only when stderr is
the journal's stream."""

from __future__ import annotations

import socket


def test_journal_records_carry_fields_journalctl_can_match(tmp_path):
    import logging

    from pipexctl.offload import journal

    path = str(tmp_path / "journal.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(5)
    h = journal.JournalHandler(path=path)
    lg = logging.getLogger("pipexctl.test-journal")
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    try:
        lg.info("call %d offloaded", 7, extra={"journal": {"TUNNEL_ID": 17, "CALL_ID": 7, "PEER": "10.0.0.2"}})
        got = dict(ln.split("=", 1) for ln in s.recv(65536).decode().splitlines())
        assert got == {"MESSAGE": "call 7 offloaded", "PRIORITY": "6", "SYSLOG_IDENTIFIER": "pipexctl",
                       "LOGGER": "pipexctl.test-journal", "TUNNEL_ID": "17", "CALL_ID": "7", "PEER": "10.0.0.2"}
        lg.warning("two\nlines")  # a newline: the length-prefixed form
        data = s.recv(65536)
        assert b"MESSAGE\n" + (9).to_bytes(8, "little") + b"two\nlines\n" in data and b"PRIORITY=4\n" in data
    finally:
        lg.removeHandler(h)
        h.close()
        s.close()


def test_journal_is_used_only_when_stderr_is_the_journal_stream(monkeypatch):
    from pipexctl.offload import journal

    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert journal.under_journald() is None
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")  # another stream than our stderr
    assert journal.under_journald() is None


def test_a_record_that_cannot_be_formatted_never_raises_into_the_thread_that_logged_it(tmp_path, monkeypatch):
    """As logging's own handlers: a bad record (here "%d" given None) is
    logging's error report, not an exception in the watcher or a request."""
    import logging

    from pipexctl.offload import journal

    reported = []
    monkeypatch.setattr(logging.Handler, "handleError", lambda self, record: reported.append(record.msg))
    h = journal.JournalHandler(path=str(tmp_path / "nobody-listens.sock"))
    lg = logging.getLogger("pipexctl.test-journal-bad")
    lg.addHandler(h)
    lg.propagate = False  # pytest's own capture handler raises at a bad record
    try:
        lg.warning("call %d", None)
        lg.warning("nobody listens")  # the socket is not there: OSError, reported as ever
        assert reported == ["call %d", "nobody listens"]
    finally:
        lg.removeHandler(h)
        h.close()
