"""pipexctl/indexed.py: both maps keep what is beside their items up to date
through every change they allow, and refuse every other change."""

from __future__ import annotations

import copy
import pickle

import pytest

from pipexctl.indexed import Indexed, SmallIndexed


def _logging(base: type) -> type:
    class Logged(base):  # type: ignore[misc, valid-type]
        __slots__ = ("log",)

        def __init__(self) -> None:
            super().__init__()
            self.log: list[tuple[str, object, object]] = []

        def _added(self, key: object, value: object) -> None:
            self.log.append(("+", key, value))

        def _removed(self, key: object, value: object) -> None:
            self.log.append(("-", key, value))

    return Logged


@pytest.fixture(params=[Indexed, SmallIndexed], ids=["Indexed", "SmallIndexed"])
def m(request):
    return _logging(request.param)()


def test_every_allowed_change_is_told_in_order(m):
    m[1] = "a"
    m[1] = "b"  # replaced: the old item's removal first
    m[2] = "c"  # a second item (SmallIndexed: its dict is made)
    m[3] = "d"
    del m[2]
    assert m.pop(3) == "d" and m.pop(3, None) is None
    m[4] = "e"
    m.clear()
    assert m.log == [("+", 1, "a"), ("-", 1, "a"), ("+", 1, "b"), ("+", 2, "c"), ("+", 3, "d"),
                     ("-", 2, "c"), ("-", 3, "d"), ("+", 4, "e"), ("-", 1, "b"), ("-", 4, "e")]
    assert len(m) == 0 and not m and list(m) == []


def test_it_reads_as_a_dict_of_the_same_items_through_every_size(m):
    want: dict[int, str] = {}
    steps = [("set", 1), ("set", 2), ("set", 3), ("del", 1), ("del", 3), ("set", 5), ("del", 2), ("del", 5),
             ("set", 7), ("set", 7)]
    for op, k in steps:
        if op == "set":
            m[k] = want[k] = f"v{k}"
        else:
            del m[k]
            del want[k]
        assert dict(m.items()) == want and len(m) == len(want) and sorted(m) == sorted(want)
        assert sorted(m.values()) == sorted(want.values()) and m == want
        for probe in (1, 2, 3, 5, 7, 9):
            assert (probe in m) == (probe in want) and m.get(probe) == want.get(probe)
    with pytest.raises(KeyError):
        m[9]
    with pytest.raises(KeyError):
        del m[9]
    with pytest.raises(KeyError):
        m.pop(9)
    assert m.log[-2:] == [("-", 7, "v7"), ("+", 7, "v7")]


def test_a_key_equal_but_not_identical_is_the_same_key(m):
    m[1] = "a"
    m[1.0] = "b"  # 1 == 1.0, as a dict has it
    assert len(m) == 1 and m[1] == "b" and [type(k) for k in m] == [int]  # the first key stays


@pytest.mark.parametrize("change", [
    lambda m: m.update({2: "x"}), lambda m: m.setdefault(2, "x"), lambda m: m.popitem(),
    lambda m: m.__ior__({2: "x"}), lambda m: copy.copy(m), lambda m: copy.deepcopy(m), lambda m: pickle.dumps(m)])
def test_every_other_change_or_copy_is_refused(m, change):
    m[1] = "a"
    with pytest.raises(TypeError, match="change it by set, pop, del or clear only"):
        change(m)
    assert dict(m.items()) == {1: "a"} and m.log == [("+", 1, "a")]


def test_small_indexed_has_no_dict_of_its_own_until_a_second_item():
    m = _logging(SmallIndexed)()
    assert not hasattr(m, "__dict__")
    m[1] = "a"
    assert m._items == (1, "a")
    m[2] = "b"
    assert m._items == {1: "a", 2: "b"}
    del m[1]
    assert m._items == (2, "b")
    del m[2]
    assert m._items is None


def test_small_indexed_reads_whole_states_only_while_another_thread_changes_it():
    """metrics() copies a tunnel's keys without the service's lock: every
    copy must be a state the map was in (never a sentinel, never a key
    missing while the others are there), as a dict's copy would be."""
    import sys
    import threading

    m = SmallIndexed()
    states = ([], [1], [1, 2], [1, 2, 3], [1, 3], [3])
    stop = threading.Event()
    seen: set[tuple[int, ...]] = set()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.add(tuple(sorted(list(m))))
            except Exception as e:  # a dict's iterator changed under it, say
                seen.add(("raised", type(e).__name__))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(30000):
            m[1] = "a"
            m[2] = "b"
            m[3] = "c"
            del m[2]
            del m[1]
            del m[3]
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert seen <= {tuple(s) for s in states}, seen - {tuple(s) for s in states}


def test_put_and_drop_keep_one_value_bare_and_several_in_their_own_type():
    """A key with one value holds it bare, even a value that is itself a
    tuple; a second makes them Several; taking values back returns to one,
    then to no key at all.  A value put twice is there once."""
    from pipexctl.indexed import Several, drop, put, values_at

    m: dict = {}
    one, two = ("10.0.0.1", 7), ("10.0.0.2", 7)
    assert put(m, 5, one)
    assert m == {5: one} and values_at(m, 5) == (one,) and values_at(m, 6) == ()
    assert not put(m, 5, one)
    assert m == {5: one}
    put(m, 5, two)
    assert isinstance(m[5], Several) and values_at(m, 5) == (one, two)
    drop(m, 5, one)
    assert m == {5: two} and not isinstance(m[5], Several)
    drop(m, 5, ("10.0.0.9", 1))  # not there: nothing changes
    assert m == {5: two}
    drop(m, 5, two)
    assert m == {}
