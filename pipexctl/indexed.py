"""A dict that keeps something beside its items (an index, encoded copies)
up to date through the changes it overrides (set, pop, del, clear).

Every other way to change it, or to copy it (which would share what it
keeps beside), is refused, so that no code path can leave the two apart.
A subclass says what to keep in ``_added`` and ``_removed``.

``Indexed`` is a dict; ``SmallIndexed`` keeps the same contract for the
many small maps of a daemon (one per tunnel), in less memory."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, Generic, TypeVar, Union

K = TypeVar("K")
V = TypeVar("V")


def _refused(self: object, *a: Any, **k: Any) -> Any:
    raise TypeError(f"{type(self).__name__}: change it by set, pop, del or clear only, and do not copy it "
                    "(what it keeps beside its items would go out of step)")


class _Contract(Generic[K, V]):
    """What both maps share: the hooks, clear() through del, and the
    changes and copies refused."""

    __slots__ = ()  # a subclass with slots of its own then has no __dict__
    update = setdefault = popitem = __ior__ = __copy__ = __deepcopy__ = __reduce__ = __reduce_ex__ = _refused

    def _added(self, key: K, value: V) -> None:
        """``value`` is now the item at ``key``."""

    def _removed(self, key: K, value: V) -> None:
        """``value`` is no longer the item at ``key``."""

    def clear(self) -> None:
        for key in list(self):  # type: ignore[call-overload]  # the map's own keys
            del self[key]  # type: ignore[attr-defined]


class Indexed(_Contract[K, V], dict[K, V]):
    __slots__ = ()

    def __setitem__(self, key: K, value: V) -> None:
        if key in self:
            self._removed(key, self[key])
        super().__setitem__(key, value)
        self._added(key, value)

    def __delitem__(self, key: K) -> None:
        self._removed(key, self[key])
        super().__delitem__(key)

    def pop(self, key: K, *default: Any) -> Any:
        if key in self:
            self._removed(key, self[key])
        return super().pop(key, *default)


class SmallIndexed(_Contract[K, V], MutableMapping[K, V]):
    """Indexed's contract (set, pop, del and clear keep what is beside the
    items up to date; nothing else may change it) for a map that nearly
    always holds one item: a tunnel's sessions, one for each remote-access
    client's tunnel.  The one item is kept as a (key, value) pair and a dict
    is made only for a second: 104 bytes with one item against 232 for a
    dict (a daemon holds one per tunnel; bench/servemem.py --maps).

    Its whole content is one attribute, replaced whole or (a dict) changed
    in place, and its keys are iterated from a copy, so that a reader
    without the writer's lock that copies the keys (a metrics scrape does)
    sees them as they were before or after a change, as with a dict."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        # None: empty; (key, value): one item; a dict: two or more
        self._items: Union[None, tuple[K, V], dict[K, V]] = None

    def __len__(self) -> int:
        items = self._items
        return 0 if items is None else len(items) if isinstance(items, dict) else 1

    def __iter__(self) -> Iterator[K]:
        items = self._items
        if items is None:
            return iter(())
        if isinstance(items, dict):
            # a copy of the keys (one step for a dict): list(self) asks len()
            # in Python after this, so a dict's own iterator could see a change
            return iter(list(items))
        return iter((items[0],))

    def __contains__(self, key: object) -> bool:
        items = self._items
        if items is None:
            return False
        if isinstance(items, dict):
            return key in items
        return bool(items[0] == key)

    def __getitem__(self, key: K) -> V:
        items = self._items
        if isinstance(items, dict):
            return items[key]
        if items is not None and items[0] == key:
            return items[1]
        raise KeyError(key)

    def __setitem__(self, key: K, value: V) -> None:
        if key in self:
            self._removed(key, self[key])
        items = self._items
        if items is None:
            self._items = (key, value)
        elif isinstance(items, dict):
            items[key] = value
        else:
            # the key first set stays, as in a dict
            self._items = (items[0], value) if items[0] == key else {items[0]: items[1], key: value}
        self._added(key, value)

    def __delitem__(self, key: K) -> None:
        value = self[key]
        self._removed(key, value)
        items = self._items
        if not isinstance(items, dict):
            self._items = None
            return
        del items[key]
        if len(items) == 1:  # back to one: the dict goes
            self._items = next(iter(items.items()))

    # pop(): MutableMapping's, through __getitem__ and __delitem__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"


class Several(tuple):  # type: ignore[type-arg]
    """Two or more values under one key of a map that keeps a single value
    bare (``put``, ``drop``): nearly every key has one (a pppd its call, a
    peer address its tunnel), and a tuple around it would cost 56 bytes a
    key.  Its own type, so that a value that is itself a tuple (a key
    tuple) is not taken for several."""

    __slots__ = ()


def values_at(m: dict[Any, Any], key: Any) -> tuple[Any, ...]:
    """The values ``put`` under ``key``: none, one, or several."""
    v = m.get(key)
    return () if v is None else v if isinstance(v, Several) else (v,)  # Several is a tuple: no copy


def put(m: dict[Any, Any], key: Any, value: Any) -> bool:
    """Add ``value`` under ``key``; False when it was there already (it stays one)."""
    old = values_at(m, key)
    if value in old:
        return False
    m[key] = Several(old + (value,)) if old else value
    return True


def drop(m: dict[Any, Any], key: Any, value: Any) -> None:
    """Take ``value`` from under ``key``; the key goes with its last value."""
    rest = tuple(v for v in values_at(m, key) if v != value)
    if len(rest) > 1:
        m[key] = Several(rest)
    elif rest:
        m[key] = rest[0]
    else:
        m.pop(key, None)
