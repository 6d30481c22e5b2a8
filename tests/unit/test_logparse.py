"""xl2tpd log parsing: every message form, every framing, hostile input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from pipexctl.discovery import logparse as lp

from .conftest import DATA

LINES = {
    "Connection established to 10.99.0.1, 1701.  Local: 29827, Remote: 20392 (ref=0/0).  LNS session is 'default'":
        lp.TunnelEstablished("10.99.0.1", 1701, 29827, 20392, "default"),
    "Connection established to 10.99.0.2, 1701.  Local: 20392, Remote: 29827 (ref=0/0).":
        lp.TunnelEstablished("10.99.0.2", 1701, 20392, 29827, None),
    "Call established with 10.99.0.1, PID: 340, Local: 34736, Remote: 28298, Serial: 1":
        lp.CallEstablished("10.99.0.1", 34736, 28298, 1, 340),
    "Call established with 10.99.0.2, Local: 28298, Remote: 34736, Serial: 1 (ref=0/0)":
        lp.CallEstablished("10.99.0.2", 28298, 34736, 1, None),
    "control_finish: Connection closed to 10.99.0.1, port 1701 (Goodbye!), Local: 29827, Remote: 20392":
        lp.TunnelClosed("10.99.0.1", 29827, 20392, "Goodbye!"),
    "Connection 29827 closed to 10.99.0.2, port 1701 (Goodbye!)":
        lp.TunnelClosed("10.99.0.2", None, 29827, "Goodbye!"),
    "control_finish: Connection closed to 10.99.0.1, serial 2 ()":
        lp.CallClosed("10.99.0.1", serial=2, reason=""),
    "Terminating pppd: sending TERM signal to pid 340": lp.PppdTerminating(340),
    "Using l2tp kernel support.": lp.KernelSupport(True),
    "Not looking for kernel support.": lp.KernelSupport(False),
    "L2TP kernel support not detected (try modprobing l2tp_ppp and pppol2tp)": lp.KernelSupport(False),
    "Maximum retries exceeded for tunnel 29827.  Closing.": lp.MaxRetries(29827),
    "call_close: Call 34736 to 10.99.0.1 disconnected": lp.CallClosed("10.99.0.1", call_id=34736),
    "child_handler : pppd exited for call 28298 with code 16":
        lp.CallClosed(None, peer_call_id=28298, reason="pppd exited with code 16"),
    "child_handler : pppd terminated for call 28298 by signal 9":
        lp.CallClosed(None, peer_call_id=28298, reason="pppd killed by signal 9"),
    "child_handler : pppd exited for call 28298 for unknown reason":
        lp.CallClosed(None, peer_call_id=28298, reason="pppd exited"),
    "lac_hangup :Hanging up call 3, Local: 34736, Remote: 28298":
        lp.CallClosed(None, call_id=34736, peer_call_id=28298, serial=3, reason="hung up"),
    "parameters: Local: 5 , Remote: 6 , Serial: 7 , Pid: 812 , Tunnelid: 99 , Phoneid: 555":
        lp.CallEstablished("0.0.0.0", 5, 6, 7, 812, 99),
    "Disconnecting from 10.99.2.1, Local: 37367, Remote: 39027": lp.Disconnecting("10.99.2.1", 37367, 39027),
    "Unable to deliver closing message for tunnel 77. Destroying anyway.":
        lp.TunnelClosed("0.0.0.0", 77, None, "closing message undeliverable"),
    "Calling on tunnel 58717": lp.CallingOnTunnel(58717),
    "Connecting to host 10.99.1.1, port 1701": lp.Connecting("10.99.1.1", 1701),
    "Listening on IP address 0.0.0.0, port 1701": lp.Listening("0.0.0.0", 1701),
    "xl2tpd version xl2tpd-1.3.18 started on lns PID:147": lp.Started("xl2tpd-1.3.18", 147),
    "death_handler: Fatal signal 15 received": lp.DaemonExiting(15),
    "Connection established to 2001:db8::1, 1701.  Local: 1, Remote: 2 (ref=0/0).":
        lp.TunnelEstablished("2001:db8::1", 1701, 1, 2, None),
}


def _strip(rec):
    import dataclasses

    return dataclasses.replace(rec, pid=None, ts=None)


@pytest.mark.parametrize("msg", list(LINES))
@pytest.mark.parametrize("framing", ["bare", "plain", "syslog", "syslog-iso", "busybox", "rfc5424", "rfc5424-sd",
                                     "journal"])
def test_every_message_in_every_framing(msg, framing):
    raw = {
        "bare": msg,
        "plain": f"xl2tpd[147]: {msg}",
        "syslog": f"Nov 29 23:01:02 lns xl2tpd[147]: {msg}",
        "syslog-iso": f"2026-11-29T23:01:02.123456+00:00 lns xl2tpd[147]: {msg}",
        "busybox": f"Nov 29 23:01:02 lns daemon.notice xl2tpd[147]: {msg}",
        "rfc5424": f"<29>1 2026-11-29T23:01:02.123456+00:00 lns xl2tpd 147 - - {msg}",
        "rfc5424-sd": f'<29>1 2026-11-29T23:01:02Z lns xl2tpd 147 - [origin software="x" a="b\\]c"] \ufeff{msg}',
        "journal": json.dumps({"MESSAGE": msg, "_PID": "147", "SYSLOG_IDENTIFIER": "xl2tpd",
                               "__REALTIME_TIMESTAMP": "1795993200000000"}),
    }[framing]
    recs = lp.parse_lines([raw])
    assert len(recs) == 1
    assert _strip(recs[0]) == LINES[msg]
    if framing != "bare":
        assert recs[0].pid == 147
    if framing == "journal":
        assert recs[0].ts == 1795993200.0


def test_other_identifiers_are_ignored():
    assert lp.parse_lines(["Nov 29 23:01:02 lns pppd[9]: Call established with 1.2.3.4, Local: 1, Remote: 2, Serial: 1"]) == []
    assert lp.parse_lines(["<29>1 2026-11-29T23:01:02Z lns pppd 9 - - Call established with 1.2.3.4, Local: 1, "
                           "Remote: 2, Serial: 1"]) == []
    assert lp.parse_lines(["Nov 29 23:01:02 lns daemon.info pppd[9]: Using l2tp kernel support."]) == []
    assert lp.parse_lines([json.dumps({"MESSAGE": "Using l2tp kernel support.", "SYSLOG_IDENTIFIER": "other"})]) == []


def test_journal_entries_are_judged_by_journalds_trusted_fields():
    """`logger -t "xl2tpd[147]" ...` by any user: SYSLOG_* say xl2tpd, journald's own fields say logger."""
    forged = {"MESSAGE": "call_close: Call 5 to 10.99.1.2 disconnected", "SYSLOG_IDENTIFIER": "xl2tpd",
              "SYSLOG_PID": "147", "_PID": "4711", "_COMM": "logger", "_EXE": "/usr/bin/logger"}
    assert lp.split_framing(json.dumps(forged)) == (None, None, None)
    # a copy of some binary named xl2tpd passes this filter (a name is all a line can be judged by);
    # its pid is then another process than the stream's xl2tpd (test_trust.py), and its lines end no call
    real = {**forged, "_COMM": "xl2tpd", "_EXE": "/usr/sbin/xl2tpd"}
    assert lp.split_framing(json.dumps(real))[0] == 4711  # _PID wins over SYSLOG_PID


@pytest.mark.parametrize("entry", [
    {"_COMM": "xl2tpd", "_EXE": "/usr/sbin/xl2tpd", "_PID": "4711"},  # xl2tpd's own
    {"_COMM": "logger", "_EXE": "/usr/bin/logger", "_PID": "4712"},  # a forger's
    {"_COMM": "xl2tpd", "_EXE": "/tmp/x", "_PID": "4713"},  # a forger's process renamed xl2tpd
    {"_COMM": "logger", "_PID": "4714"},  # no _EXE: judged by its command
    {},  # no trusted field at all (not from this host's journald)
    {"SYSLOG_IDENTIFIER": "pppd"},  # nor then by its tag
])
def test_journalctl_asked_for_only_the_fields_read_gives_the_same_framing(entry):
    """discovery asks journalctl for lp.JOURNAL_FIELDS only: a field that
    split_framing reads and that list lacks would change what it judges."""
    full = {"__CURSOR": "s=1;i=2", "__REALTIME_TIMESTAMP": "1700000000000000", "_BOOT_ID": "b" * 32,
            "_UID": "0", "_SYSTEMD_UNIT": "xl2tpd.service", "_CMDLINE": "/usr/sbin/xl2tpd -D", "PRIORITY": "6",
            "_SOURCE_REALTIME_TIMESTAMP": "1699999999999999", "SYSLOG_IDENTIFIER": "xl2tpd", "SYSLOG_PID": "147",
            "MESSAGE": "Call established with 10.0.0.1, PID: 9, Local: 1, Remote: 2, Serial: 1", **entry}
    given = {k: v for k, v in full.items() if k.startswith("__") or k == "_BOOT_ID" or k in lp.JOURNAL_FIELDS}
    for journal in (False, True):
        assert lp.split_framing(json.dumps(given), journal=journal) == lp.split_framing(json.dumps(full),
                                                                                         journal=journal)


def test_pppd_argv_spans_lines():
    recs = lp.parse_lines(['xl2tpd[5]: start_pppd: I\'m running: ', 'xl2tpd[5]: "/usr/sbin/pppd" ',
                           'xl2tpd[5]: "plugin" ', 'xl2tpd[5]: "pppol2tp.so" ', 'xl2tpd[5]: "pppol2tp" ',
                           'xl2tpd[5]: "7" ', 'xl2tpd[5]: Call established with 10.0.0.1, PID: 9, Local: 1, '
                           'Remote: 2, Serial: 1'])
    assert recs[0] == lp.PppdArgv(("/usr/sbin/pppd", "plugin", "pppol2tp.so", "pppol2tp", "7"), pid=5)
    assert isinstance(recs[1], lp.CallEstablished)


def test_glued_status_dump_is_split():
    line = ("xl2tpd[147]: Tunnel default, ID = 25824 (local), 2547 (remote) to 10.99.2.2:1701, control_seq_num = 2, "
            "control_rec_seq_num = 4, cLr = 2, call count = 1 ref=0/refhim=0xl2tpd[147]: Call default # 1, ID = 52848 "
            "(local), 37505 (remote), serno = 1, data_seq_num = 9, data_rec_seq_num = 0, pLr = 8, tx = 273 bytes (9), "
            "rx= 173 bytes (8)xl2tpd[147]: ==========Config File===========")
    recs = lp.parse_lines([line])
    assert recs[0] == lp.StatusTunnel("default", 25824, 2547, "10.99.2.2", 1701, pid=147)
    assert recs[1] == lp.StatusCall("default", 52848, 37505, 1, pid=147)
    assert isinstance(recs[2], lp.Unparsed)


def test_peer_text_imitating_a_prefix_is_not_split():
    """A StopCCN result string is the peer's text: it must not become a record."""
    evil = ("xl2tpd[147]: control_finish: Connection closed to 10.99.0.1, port 1701 (x xl2tpd[147]: Call established "
            "with 10.99.0.1, PID: 1, Local: 666, Remote: 666, Serial: 1), Local: 29827, Remote: 20392")
    recs = lp.parse_lines([evil])
    assert len(recs) == 1
    assert isinstance(recs[0], lp.TunnelClosed)
    assert (recs[0].tunnel_id, recs[0].peer_tunnel_id) == (29827, 20392)


def test_peer_text_cannot_move_the_ids():
    evil = ("control_finish: Connection closed to 10.0.0.1, port 1701 (bye), Local: 1, Remote: 2), "
            "Local: 300, Remote: 400")
    (rec,) = lp.parse_lines([evil])
    assert (rec.tunnel_id, rec.peer_tunnel_id) == (300, 400)
    assert rec.reason == "bye), Local: 1, Remote: 2"


@pytest.mark.parametrize("bad,why", [
    ("Call established with 10.99.0.1, PID: 340, Local: 99999999, Remote: 1, Serial: 1", "call id 99999999 out of range"),
    ("Call established with 10.99.0.1, PID: 340, Local: 70000, Remote: 1, Serial: 1", "call id 70000 out of range"),
    ("Connection established to 999.1.1.1, 1701.  Local: 1, Remote: 2 (ref=0/0).", "does not appear to be an IPv4"),
    ("Call established with 10.99.0.1, PID: 340, Local: 34736, Remo", "does not match"),
    ("Connection established to 10.99.0.1, 1701.  Local: -5, Remote: 2 (ref=0/0).", "does not match"),
])
def test_malformed_is_counted_never_trusted(bad, why):
    p = lp.LineParser()
    (rec,) = p.feed(bad)
    assert isinstance(rec, lp.Malformed) and why in rec.why
    assert p.malformed == 1


def test_real_logs_parse_without_malformed_lines():
    for f in sorted(DATA.glob("*.log")):
        p = lp.LineParser()
        for line in f.read_text().splitlines():
            p.feed(line)
        p.flush()
        assert p.malformed == 0, f


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=30))
def test_fuzz_never_crashes(lines):
    p = lp.LineParser()
    for ln in lines:
        for rec in p.feed(ln):
            assert isinstance(rec, (lp.Unparsed, lp.Malformed, lp.Rec))
    p.flush()


ids = st.integers(min_value=1, max_value=65535)


@settings(max_examples=300, deadline=None)
@given(ids, ids, ids, st.integers(min_value=1, max_value=2**22 - 1), st.text(max_size=40),
       st.sampled_from(["", "xl2tpd[7]: ", "Nov  1 00:00:00 h xl2tpd[7]: "]))
def test_fuzz_ids_roundtrip_and_truncation(local, remote, serial, pid, junk, prefix):
    msg = f"Call established with 10.1.2.3, PID: {pid}, Local: {local}, Remote: {remote}, Serial: {serial}"
    (rec,) = lp.parse_lines([prefix + msg])
    assert (rec.call_id, rec.peer_call_id, rec.serial, rec.pppd_pid) == (local, remote, serial, pid)
    # a line cut before its last field is never a CallEstablished; a cut inside
    # the last field (Serial) can only shorten the serial, never change the ids
    for r in lp.parse_lines([prefix + msg[: len(msg) // 2]]):
        assert not isinstance(r, lp.CallEstablished)
    for r in lp.parse_lines([prefix + msg[:-1]]):
        if isinstance(r, lp.CallEstablished):
            assert (r.call_id, r.peer_call_id, r.pppd_pid) == (local, remote, pid)
            assert str(serial).startswith(str(r.serial))
    for r in lp.parse_lines([prefix + msg + junk]):
        if isinstance(r, lp.CallEstablished):
            assert (r.call_id, r.peer_call_id) == (local, remote)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list(LINES)), min_size=1, max_size=20), st.lists(st.text(max_size=80), max_size=20))
def test_fuzz_interleaved_garbage_does_not_change_records(good, garbage):
    mixed = []
    for i, g in enumerate(good):
        mixed.append(f"xl2tpd[9]: {g}")
        if i < len(garbage):
            mixed.append(garbage[i].replace("\n", " "))
    recs = [r for r in lp.parse_lines(mixed) if not isinstance(r, (lp.Unparsed, lp.Malformed))]
    # garbage lines may parse as records only if they are themselves valid messages
    expected = [LINES[g] for g in good]
    got = [_strip(r) for r in recs]
    assert [x for x in got if x in expected] == expected


@pytest.mark.parametrize("line", [
    # RFC 5424 framing whose PROCID is a digit to str.isdigit() but not to int() ("²")
    "<30>1 2026-12-05T10:00:00Z lns xl2tpd \u00b2 - - Listening on IP address 0.0.0.0, port 1701",
    # journald's JSON with numbers no int() or float division takes
    '{"_PID": 1e400, "SYSLOG_IDENTIFIER": "xl2tpd", "MESSAGE": "Listening on IP address 0.0.0.0, port 1701"}',
    '{"SYSLOG_IDENTIFIER": "xl2tpd", "__REALTIME_TIMESTAMP": "' + "9" * 400 + '", "MESSAGE": "x"}',
    '{"SYSLOG_IDENTIFIER": "xl2tpd", "__REALTIME_TIMESTAMP": 1e400, "MESSAGE": "x"}',
    # nesting deeper than the JSON parser's stack
    '{"a": ' + "[" * 100000 + "]" * 100000 + "}",
    # a lone surrogate (\udc80), which no encoder takes later (the checkpoint, the journal)
    '{"SYSLOG_IDENTIFIER": "xl2tpd", "SYSLOG_PID": "147", "MESSAGE": "Call \\udc80 established"}',
])
def test_a_line_anyone_can_write_never_raises_and_gives_no_false_pid(line):
    """Any local user writes syslog lines, and a peer's newline puts a line
    of its own into a log xl2tpd writes itself: framing that raised
    (ValueError, OverflowError, RecursionError) stopped a start and a
    request, and cost the watcher the records of the rest of its read."""
    pid, msg, ts = lp.split_framing(line)
    assert pid in (None, 147) and (ts is None or ts < 1e10)
    if msg is not None:
        msg.encode("utf-8")
    assert isinstance(lp.LineParser().feed(line), list)


def test_a_line_the_parser_fails_on_is_malformed_and_the_next_lines_are_read(monkeypatch):
    """Whatever a line makes the parser raise, it is one Malformed record:
    the lines after it are parsed as ever."""
    real = lp.split_framing
    monkeypatch.setattr(lp, "split_framing", lambda raw, ident="xl2tpd", journal=False: (
        (_ for _ in ()).throw(RuntimeError("a parser bug")) if "BOOM" in raw else real(raw, ident, journal)))
    p = lp.LineParser()
    (bad,) = p.feed("xl2tpd[147]: BOOM")
    assert isinstance(bad, lp.Malformed) and "RuntimeError" in bad.why and p.malformed == 1
    (ok,) = p.feed("xl2tpd[147]: Listening on IP address 0.0.0.0, port 1701")
    assert isinstance(ok, lp.Listening)
