"""The garbage collector's pauses, counted and kept for serve's log (offload/gcpause.py)."""

from __future__ import annotations

import gc

from pipexctl.offload import gcpause


def test_collections_are_counted_and_the_long_ones_kept_until_taken(monkeypatch):
    p = gcpause.Pauses()
    p.install()
    try:
        monkeypatch.setattr(gcpause, "LONG", 0.0)  # every pause counts as long here
        before = p.count[2]
        for _ in range(3):
            a: list = []
            a.append(a)  # cyclic garbage, for the collection to find
            del a
            gc.collect(2)
        assert p.count[2] - before == 3 and p.seconds[2] > 0
        long = p.take()
        assert [g for g, _, _ in long].count(2) == 3
        assert all(took >= 0 for _, took, _ in long) and sum(n for g, _, n in long if g == 2) >= 3
        assert p.take() == []
        monkeypatch.setattr(gcpause, "LONG", 3600.0)
        gc.collect(2)
        assert p.take() == [] and p.count[2] - before == 4
    finally:
        p.uninstall()
    assert p._callback not in gc.callbacks
    n = p.count[2]
    gc.collect(2)
    assert p.count[2] == n  # uninstalled: no longer called


def test_only_so_many_long_pauses_are_kept_between_two_rounds(monkeypatch):
    p = gcpause.Pauses()
    monkeypatch.setattr(gcpause, "LONG", 0.0)
    monkeypatch.setattr(gcpause, "KEEP", 2)
    for _ in range(5):
        p._callback("start", {"generation": 0})
        p._callback("stop", {"generation": 0, "collected": 0})
    assert len(p.take()) == 2 and p.dropped == 3 and p.count[0] == 5
