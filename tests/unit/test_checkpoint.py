"""Discovery checkpoints: a restart that resumes from a saved position and
model ends up where one reader reading on would be (discovery/checkpoint.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipexctl.discovery import checkpoint as cpt
from pipexctl.discovery.discovery import Discovery
from pipexctl.records import dump, load

from .conftest import DATA, model

LOGS = ["lns-userspace.log", "lns-kernel.log", "lac1-userspace.log", "lac2-kernel.log"]


def brief(events) -> list:
    out = []
    for e in events:
        o = getattr(e, "call", None) or e.tunnel
        out.append((e.event, o.instance, o.tunnel_id, getattr(o, "call_id", None), getattr(o, "pppd_pid", None)))
    return out


def roundtrip(d: Discovery, path: Path) -> cpt.Checkpoint:
    """Through the file, as a restarted daemon would find it."""
    cpt.write(str(path), cpt.encode(d.checkpoint()))
    cp, warning = cpt.load(str(path))
    assert warning is None and cp is not None
    return cp


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(LOGS), cut=st.floats(0, 1), second=st.floats(0, 1), full=st.booleans())
def test_resuming_from_a_checkpoint_equals_reading_on(tmp_path_factory, name, cut, second, full):
    """Cut the log anywhere (inside a line, inside a pppd argv): a reader
    that saves there and a new reader that resumes from it see the same
    events for the rest, and end with the same model, as one reader that
    read it all in the same steps.  ``full``: the save follows a refresh
    (which ends a pppd argv at the end of the log); else one poll, as the
    watcher's periodic save does, which may leave an argv half read."""
    tmp = tmp_path_factory.mktemp("cp")
    data = (DATA / name).read_bytes()
    a, b = int(len(data) * cut), int(len(data) * cut) + int((len(data) - int(len(data) * cut)) * second)
    log = tmp / "xl2tpd.log"
    log.write_bytes(data[:a])
    one = Discovery([str(log)], proc=False, kernel=False)
    first = Discovery([str(log)], proc=False, kernel=False)
    try:
        for d in (one, first):
            d.refresh(control=False) if full else d.poll(reconcile=False)
        cp = roundtrip(first, tmp / "discovery.json")
    finally:
        first.close()
    again = Discovery([str(log)], proc=False, kernel=False)
    try:
        said = again.resume(cp)
        assert said == [] if not cp.sources else said[0].startswith(f"{log}: resumed at offset"), said
        for upto in (b, len(data)):
            with log.open("r+b") as f:
                f.seek(0, os.SEEK_END)
                f.write(data[f.tell():upto])
            assert brief(again.refresh(control=False)) == brief(one.refresh(control=False))
        assert model(again) == model(one)
        assert model(one), "the recorded log builds a model: the comparison means something"
    finally:
        one.close()
        again.close()


def test_a_log_rotated_while_nobody_read_is_finished_first(tmp_path):
    """The saved inode is found under its rotated name (syslog.1): its
    lines written after the position are read, then the new file's."""
    lines = (DATA / "lns-kernel.log").read_text().splitlines(keepends=True)
    log = tmp_path / "syslog"
    log.write_text("".join(lines[:20]))
    one = Discovery([str(log)], proc=False, kernel=False)
    first = Discovery([str(log)], proc=False, kernel=False)
    one.refresh(control=False)
    first.refresh(control=False)
    cp = roundtrip(first, tmp_path / "discovery.json")
    first.close()
    with log.open("a") as f:
        f.write("".join(lines[20:40]))
    log.rename(tmp_path / "syslog.1")
    (tmp_path / "syslog").write_text("".join(lines[40:]))
    again = Discovery([str(log)], proc=False, kernel=False)
    try:
        assert again.resume(cp)[0].startswith(f"{log}: resumed at offset")
        ev = again.refresh(control=False)
        assert any(e.event == "CallUp" for e in ev), "calls established after the position come from syslog.1"
        # one reader that was there all along: reads the rest of syslog.1, then syslog
        assert brief(ev) == brief(one.refresh(control=False))
        assert model(again) == model(one)
    finally:
        one.close()
        again.close()


@pytest.mark.parametrize("change", ["replaced", "rewritten", "truncated", "rotated away", "rotated twice"])
def test_a_position_that_no_longer_fits_reads_the_log_from_its_start(tmp_path, change):
    data = (DATA / "lns-kernel.log").read_bytes()
    log = tmp_path / "syslog"
    log.write_bytes(data[:3000])
    first = Discovery([str(log)], proc=False, kernel=False)
    first.refresh(control=False)
    cp = roundtrip(first, tmp_path / "discovery.json")
    first.close()
    if change == "replaced":  # a new file by that name, the old one gone (tmpfs may reuse its inode number)
        log.unlink()
        log.write_bytes((DATA / "lns-userspace.log").read_bytes())
    elif change == "rewritten":  # same inode, other bytes before the position
        log.write_bytes(data[:2000].replace(b"xl2tpd[", b"xl2tpd[9") + data[2000:])
    elif change == "truncated":
        with log.open("r+b") as f:
            f.truncate(1000)
    elif change == "rotated twice":  # syslog.2 has the saved inode; syslog.1, between, would be skipped
        log.rename(tmp_path / "syslog.2")
        (tmp_path / "syslog.1").write_bytes(data[3000:4000])
        os.utime(tmp_path / "syslog.2", (1, 1))
        log.write_bytes(data[4000:])
    else:
        log.rename(tmp_path / "syslog.1.gz")  # compressed: no longer a name beside it that starts with syslog + "."
        (tmp_path / "syslog.1.gz").unlink()
        log.write_bytes(data[3000:])
    fresh = Discovery([str(log)], proc=False, kernel=False)
    again = Discovery([str(log)], proc=False, kernel=False)
    try:
        said = again.resume(cp)
        assert len(said) == 1 and "read from its start" in said[0], said
        fresh.refresh(control=False)
        again.refresh(control=False)
        assert model(again) == model(fresh)
    finally:
        fresh.close()
        again.close()


def test_a_checkpoint_is_used_only_when_it_is_this_boots_and_this_daemons(tmp_path, monkeypatch):
    log = tmp_path / "syslog"
    log.write_bytes((DATA / "lns-kernel.log").read_bytes())
    d = Discovery([str(log)], proc=False, kernel=False)
    d.refresh(control=False)
    path = tmp_path / "discovery.json"
    cpt.write(str(path), cpt.encode(d.checkpoint()))
    d.close()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert cpt.load(str(path))[0] is not None
    monkeypatch.setattr(cpt, "boot_id", lambda: "0" * 32)
    assert cpt.load(str(path)) == (None, None), "another boot's: its calls went with that kernel"
    monkeypatch.undo()
    path.chmod(0o622)
    cp, warning = cpt.load(str(path))
    assert cp is None and "not this daemon's own file" in warning
    path.chmod(0o600)
    path.write_text('{"version": 1, "boot_id": "x"}')
    cp, warning = cpt.load(str(path))
    assert cp is None and "not valid" in warning
    os.symlink(path, tmp_path / "link")
    cp, warning = cpt.load(str(tmp_path / "link"))
    assert cp is None and "cannot read" in warning
    assert cpt.load(str(tmp_path / "missing.json")) == (None, None)


def test_a_checkpoint_of_calls_keyed_by_id_alone_is_read():
    """Before calls were keyed by address and id, a checkpoint named the
    LAC's call waiting for its pppd argv by its id: read as that call's key
    (the checkpoint format did not change)."""
    from pipexctl.discovery.state import CallInfo, CallKey

    call = CallInfo(instance="lac", role="lac", peer="10.99.1.1", tunnel_id=5, call_id=77)
    old = load(cpt.InstanceState, {"name": "lac", "calls": [call.dump()], "last_lac_call": 77})
    assert old.instance().last_lac_call == CallKey("10.99.1.1", 77)
    ins = old.instance()
    again = load(cpt.InstanceState, json.loads(json.dumps(dump(cpt.InstanceState.of(ins))))).instance()
    assert again.last_lac_call == ("10.99.1.1", 77) and list(again.calls) == [("10.99.1.1", 77)]
