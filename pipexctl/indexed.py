"""A dict that keeps something beside its items (an index, encoded copies)
up to date through the changes it overrides (set, pop, del, clear).

Every other way to change it, or to copy it (which would share what it
keeps beside), is refused, so that no code path can leave the two apart.
A subclass says what to keep in ``_added`` and ``_removed``."""

from __future__ import annotations

from typing import Any, TypeVar

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
