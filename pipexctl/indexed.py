"""A dict that keeps something beside its items (an index, encoded copies)
up to date through the changes it overrides (set, pop, del, clear).

Every other way to change it, or to copy it (which would share what it
keeps beside), is refused, so that no code path can leave the two apart."""

from __future__ import annotations

from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def _refused(self: object, *a: Any, **k: Any) -> Any:
    raise TypeError(f"{type(self).__name__}: change it by set, pop, del or clear only, and do not copy it "
                    "(what it keeps beside its items would go out of step)")


class Indexed(dict[K, V]):
    update = setdefault = popitem = __ior__ = __copy__ = __deepcopy__ = __reduce__ = __reduce_ex__ = _refused
