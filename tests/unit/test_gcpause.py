"""The garbage collector's long pauses, kept for serve's log (offload/gcpause.py)."""

from __future__ import annotations

import gc

from pipexctl.offload import gcpause


def _cycle() -> None:
    a: list = []
    a.append(a)  # cyclic garbage, for the collection to find


def test_the_long_pauses_are_kept_until_taken_and_none_after_uninstall(monkeypatch):
    p = gcpause.Pauses()
    p.install()
    try:
        monkeypatch.setattr(gcpause, "LONG", 0.0)  # every pause counts as long here
        for _ in range(3):
            _cycle()
            gc.collect(2)
        long, dropped = p.take()
        assert [g for g, _, _ in long].count(2) == 3 and dropped == 0
        assert all(took >= 0 for _, took, _ in long) and sum(n for g, _, n in long if g == 2) >= 3
        assert p.take() == ([], 0)
        monkeypatch.setattr(gcpause, "LONG", 3600.0)  # short pauses are not kept
        gc.collect(2)
        assert p.take() == ([], 0)
        monkeypatch.setattr(gcpause, "LONG", 0.0)
    finally:
        p.uninstall()
    assert p._callback not in gc.callbacks
    gc.collect(2)
    assert p.take() == ([], 0)  # uninstalled: no longer called


def test_only_so_many_long_pauses_are_kept_between_two_rounds(monkeypatch):
    p = gcpause.Pauses()
    monkeypatch.setattr(gcpause, "LONG", 0.0)
    monkeypatch.setattr(gcpause, "KEEP", 2)
    for _ in range(5):
        p._callback("start", {"generation": 0})
        p._callback("stop", {"generation": 0, "collected": 0})
    long, dropped = p.take()
    assert len(long) == 2 and dropped == 3
    assert p.take() == ([], 0)
