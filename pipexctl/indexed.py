"""A dict that keeps something beside its items (an index, encoded copies)
up to date through the changes it overrides (set, pop, del, clear).

Every other way to change it, or to copy it (which would share what it
keeps beside), is refused, so that no code path can leave the two apart.
A subclass says what to keep in ``_added`` and ``_removed``.

``Indexed`` is a dict; ``SmallIndexed`` keeps the same contract for the
many small maps of a daemon (one per tunnel), in less memory."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, Generic, Optional, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def _refused(self: object, *a: Any, **k: Any) -> Any:
    raise TypeError(f"{type(self).__name__}: change it by set, pop, del or clear only, and do not copy it "
                    "(what it keeps beside its items would go out of step)")


class Indexed(dict[K, V]):
    __slots__ = ()  # a subclass with slots of its own then has no __dict__
    update = setdefault = popitem = __ior__ = __copy__ = __deepcopy__ = __reduce__ = __reduce_ex__ = _refused

    def _added(self, key: K, value: V) -> None:
        """``value`` is now the item at ``key``."""

    def _removed(self, key: K, value: V) -> None:
        """``value`` is no longer the item at ``key``."""

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

    def clear(self) -> None:
        for key in list(self):
            del self[key]


_EMPTY: Any = object()  # no key: SmallIndexed holds nothing in its slots


class SmallIndexed(MutableMapping[K, V], Generic[K, V]):
    """Indexed's contract (set, pop, del and clear keep what is beside the
    items up to date; nothing else may change it) for a map that nearly
    always holds one item: a tunnel's sessions, one for each remote-access
    client's tunnel.  The one item is kept in two slots and a dict is made
    only for a second: 64 bytes for the map against 232 for a dict of one
    (a daemon holds one per tunnel; bench/servemem.py --maps)."""

    __slots__ = ("_k", "_v", "_more")

    update = setdefault = popitem = __ior__ = __copy__ = __deepcopy__ = __reduce__ = __reduce_ex__ = _refused

    def __init__(self) -> None:
        self._k: Any = _EMPTY
        self._v: Any = None
        self._more: Optional[dict[K, V]] = None

    def _added(self, key: K, value: V) -> None:
        """``value`` is now the item at ``key``."""

    def _removed(self, key: K, value: V) -> None:
        """``value`` is no longer the item at ``key``."""

    def __len__(self) -> int:
        if self._more is not None:
            return len(self._more)
        return 0 if self._k is _EMPTY else 1

    def __iter__(self) -> Iterator[K]:
        if self._more is not None:
            return iter(self._more)
        return iter(()) if self._k is _EMPTY else iter((self._k,))

    def __contains__(self, key: object) -> bool:
        if self._more is not None:
            return key in self._more
        return self._k is not _EMPTY and self._k == key

    def __getitem__(self, key: K) -> V:
        if self._more is not None:
            return self._more[key]
        if self._k is not _EMPTY and self._k == key:
            v: V = self._v
            return v
        raise KeyError(key)

    def __setitem__(self, key: K, value: V) -> None:
        if key in self:
            self._removed(key, self[key])
        if self._more is not None:
            self._more[key] = value
        elif self._k is _EMPTY:
            self._k, self._v = key, value
        elif self._k == key:
            self._v = value  # the key first set stays, as in a dict
        else:
            self._more = {self._k: self._v, key: value}
            self._k, self._v = _EMPTY, None
        self._added(key, value)

    def __delitem__(self, key: K) -> None:
        value = self[key]
        self._removed(key, value)
        if self._more is None:
            self._k, self._v = _EMPTY, None
            return
        del self._more[key]
        if len(self._more) == 1:  # back to one: the dict goes
            ((self._k, self._v),) = self._more.items()
            self._more = None

    def pop(self, key: K, *default: Any) -> Any:
        if key in self:
            value = self[key]
            del self[key]
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"
