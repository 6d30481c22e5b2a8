"""Typed records checked when they are made.

The project's records (the model's specs and kernel objects, discovery's
calls and tunnels, the state file's and the checkpoint's records, a plugin's
request) are standard-library dataclasses whose ``__post_init__`` calls
:func:`check`: each field against its annotation, and against the bounds an
``Annotated[..., Limits(...)]`` gives it.  :func:`load` makes a record from
decoded JSON (nested records included), :func:`dump` turns one back into
JSON types.  A refused value raises :class:`Invalid`, a ValueError whose
message starts with the field's name.

Written by hand, not with pydantic or msgspec: pydantic and the models
built with it were 10 MiB of `pipexctl serve`'s 30 at start, and the
daemon at 10,000 calls rested 9 to 12 MiB higher with them (its target
is 50 MiB; docs/offload.md); msgspec's import is 3.7 MiB, and msgspec
checks a record only when it decodes one, not when code makes it.  What
the records need is small: ints, floats, strings, booleans, enums, IP
addresses, literals, optionals, unions, tuples, lists and nested records.

The checks are strict: JSON's types as they are (an int is not a string of
digits, a bool is not an int), with three conversions: an int where a
float is wanted, a list where a tuple is (JSON has no tuple), and an enum's
value or an address's text where the enum or the address is wanted.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import re
import types
import typing
from typing import Any, Callable, Optional, TypeVar, Union

R = TypeVar("R")


class Invalid(ValueError):
    """A value a record's rules refuse; the message names the field first."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds of a number (``ge`` <= v <= ``le``, v < ``lt``) or a pattern
    the whole string must match (``re.fullmatch``: a ``$`` does not let a
    final newline through)."""

    ge: Optional[float] = None
    le: Optional[float] = None
    lt: Optional[float] = None
    pattern: Optional[str] = None


Check = Callable[[Any], Any]  # the value as the field keeps it, or Invalid
_CHECKS: dict[type, tuple[tuple[str, Check], ...]] = {}
_LOADS: dict[type, tuple[tuple[str, Any, bool, bool], ...]] = {}  # (name, type, required, holds records) per field
_NAMES: dict[type, tuple[str, ...]] = {}
_ADDRESSES = (ipaddress.IPv4Address, ipaddress.IPv6Address)


def check(rec: object) -> None:
    """Check every field of the dataclass ``rec`` (its ``__post_init__``
    calls this), storing the converted value where one was converted."""
    cls = type(rec)
    checks = _CHECKS.get(cls)
    if checks is None:
        checks = _CHECKS[cls] = _compile(cls)
    for name, fn in checks:
        v = getattr(rec, name)
        try:
            w = fn(v)
        except Invalid as e:
            raise Invalid(f"{name}: {e}") from None
        if w is not v:
            object.__setattr__(rec, name, w)  # frozen records too: this is their making


def load(cls: type[R], obj: object, where: str = "") -> R:
    """A ``cls`` record from decoded JSON: ``obj`` is a dict of its fields
    (keys it does not know are ignored; nested records are dicts too)."""
    if not isinstance(obj, dict):
        raise Invalid(f"{where.rstrip('.') or cls.__name__}: not an object")
    spec = _LOADS.get(cls)
    if spec is None:
        hints = _hints(cls)
        spec = _LOADS[cls] = tuple(
            (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
             _has_records(hints[f.name]))
            for f in dataclasses.fields(cls) if f.init)  # type: ignore[arg-type]
    kw = {}
    for name, tp, required, nested in spec:
        if name in obj:
            kw[name] = _nested(tp, obj[name], f"{where}{name}") if nested else obj[name]
        elif required:
            raise Invalid(f"{where}{name}: missing")
    try:
        return cls(**kw)
    except Invalid as e:
        raise Invalid(f"{where}{e}") from None


def names(cls: type) -> tuple[str, ...]:
    """The field names of a record class, in order."""
    got = _NAMES.get(cls)
    if got is None:
        got = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return got


def dump(v: Any) -> Any:
    """``v`` in JSON's types: a record as a dict of its fields in order, an
    enum as its value, an address as its text, bytes as hex, tuples as lists."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {n: dump(getattr(v, n)) for n in names(type(v))}
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (list, tuple)):
        return [dump(x) for x in v]
    if isinstance(v, dict):
        return {k: dump(x) for k, x in v.items()}
    if isinstance(v, _ADDRESSES):
        return str(v)
    if isinstance(v, bytes):
        return v.hex()
    return v


def _nested(tp: Any, v: Any, where: str) -> Any:
    """``v`` with the dicts that stand for records (where ``tp`` says so) made records."""
    tp, _ = _unwrap(tp)
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return load(tp, v, f"{where}.")
    if origin in (Union, types.UnionType):
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        if v is None or not any(_has_records(a) for a in arms):
            return v
        errs: list[Invalid] = []
        for a in arms:
            try:
                return _nested(a, v, where)
            except Invalid as e:
                errs.append(e)
        # records in a union are told apart by a literal field "kind": the
        # error of the arm whose kind the dict gave is the one that tells
        own = [e for e in errs if not str(e).startswith(f"{where}.kind: ")]
        raise (own or errs)[0]
    if origin in (list, tuple) and isinstance(v, list) and _has_records(tp):
        args = typing.get_args(tp)
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return [_nested(args[0], x, f"{where}.{i}") for i, x in enumerate(v)]
    return v


def _has_records(tp: Any) -> bool:
    tp, _ = _unwrap(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return True
    return any(_has_records(a) for a in typing.get_args(tp) if a is not Ellipsis)


def _unwrap(tp: Any) -> tuple[Any, tuple[Limits, ...]]:
    if typing.get_origin(tp) is typing.Annotated:
        base, *extra = typing.get_args(tp)
        return base, tuple(m for m in extra if isinstance(m, Limits))
    return tp, ()


def _hints(cls: type) -> dict[str, Any]:
    """Its fields' annotations resolved, ``Annotated`` kept (its Limits); ``check`` and ``load`` each
    ask once per class and keep what they make of them."""
    return typing.get_type_hints(cls, include_extras=True)


def _compile(cls: type) -> tuple[tuple[str, Check], ...]:
    hints = _hints(cls)
    return tuple((n, _checker(hints[n])) for n in names(cls))


def _checker(tp: Any) -> Check:  # noqa: C901 -- one branch per kind of annotation
    tp, limits = _unwrap(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return lambda v: v
    if origin in (Union, types.UnionType):
        return _union(tp, args)
    if origin is typing.Literal:
        def literal(v: Any) -> Any:
            for a in args:
                if v == a and type(v) is type(a):
                    return v
            raise Invalid(f"must be one of {', '.join(repr(a) for a in args)}, not {_show(v)}")
        return literal
    if tp in _EXACT:
        return _exact(tp, _EXACT[tp], limits[0].pattern if limits else None)
    if tp is int or tp is float:
        return _number(tp, limits)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        enum_cls = tp

        def member(v: Any) -> Any:
            if isinstance(v, enum_cls):
                return v
            try:
                return enum_cls(v)
            except ValueError:
                raise Invalid(f"must be one of {', '.join(repr(m.value) for m in enum_cls)}, not {_show(v)}") from None
        return member
    if tp in _ADDRESSES:
        return _address((tp,), f"an IPv{4 if tp is ipaddress.IPv4Address else 6} address")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        rec_cls = tp

        def record(v: Any) -> Any:
            if not isinstance(v, rec_cls):
                raise Invalid(f"must be a {rec_cls.__name__}, not {_kind(v)}")
            return v
        return record
    if origin in (list, tuple):
        return _sequence(origin, args)
    raise TypeError(f"records: no check for {tp!r}")


def _address(classes: tuple[type, ...], what: str) -> Check:
    def address(v: Any) -> Any:
        if isinstance(v, classes):
            return v
        if type(v) is str:
            try:
                a = ipaddress.ip_address(v)
            except ValueError:
                pass
            else:
                if isinstance(a, classes):
                    return a
        raise Invalid(f"{_show(v)} is not {what}")
    return address


_EXACT = {bool: "true or false", str: "a string", bytes: "bytes"}  # that type itself, no subclass


def _exact(t: type, what: str, pattern: Optional[str]) -> Check:
    rx = re.compile(pattern) if pattern else None

    def exact(v: Any) -> Any:
        if type(v) is not t:
            raise Invalid(f"must be {what}, not {_kind(v)}")
        if rx is not None and not rx.fullmatch(typing.cast(str, v)):  # a pattern is given for str only
            raise Invalid(f"{_show(v)} does not match {rx.pattern}")
        return v
    return exact


def _union(tp: Any, args: tuple[Any, ...]) -> Check:
    optional = type(None) in args
    if set(args) - {type(None)} == set(_ADDRESSES):
        arms = [_address(_ADDRESSES, "an IP address")]
    else:
        arms = [_checker(a) for a in args if a is not type(None)]

    def union(v: Any) -> Any:
        if v is None and optional:
            return v
        errs = []
        for fn in arms:
            try:
                return fn(v)
            except Invalid as e:
                errs.append(str(e))
        if v is None:
            raise Invalid("must be given (not null)")
        raise Invalid(errs[0] if len(errs) == 1 else " or ".join(errs))
    return union


def _number(tp: type, limits: tuple[Limits, ...]) -> Check:
    lim = limits[0] if limits else Limits()
    want_float = tp is float

    def number(v: Any) -> Any:
        t = type(v)
        if not (t is int or (want_float and t is float)):
            raise Invalid(f"must be {'a number' if want_float else 'an integer'}, not {_kind(v)}")
        if lim.ge is not None and v < lim.ge:
            raise Invalid(f"{_show(v)} is below {_n(lim.ge)}")
        if lim.le is not None and v > lim.le:
            raise Invalid(f"{_show(v)} is above {_n(lim.le)}")
        if lim.lt is not None and v >= lim.lt:
            raise Invalid(f"{_show(v)} is not below {_n(lim.lt)}")
        if want_float and t is int:
            try:
                return float(v)
            except OverflowError:  # JSON's ints have no bound; a float's range ends near 1.8e308
                raise Invalid(f"{_show(v)} is out of a number's range") from None
        return v
    return number


def _sequence(origin: Any, args: tuple[Any, ...]) -> Check:
    if origin is list or (len(args) == 2 and args[1] is Ellipsis):
        item = _checker(args[0])

        def seq(v: Any) -> Any:
            if not isinstance(v, (list, tuple)):
                raise Invalid(f"must be a list, not {_kind(v)}")
            out = []
            for i, x in enumerate(v):
                try:
                    out.append(item(x))
                except Invalid as e:
                    raise Invalid(f"{i}: {e}") from None
            if origin is tuple:
                return v if type(v) is tuple and all(a is b for a, b in zip(out, v)) else tuple(out)
            return v if type(v) is list and all(a is b for a, b in zip(out, v)) else out
        return seq
    items = [_checker(a) for a in args]

    def fixed(v: Any) -> Any:
        if not isinstance(v, (list, tuple)) or len(v) != len(items):
            what = f"{len(v)} items" if isinstance(v, (list, tuple)) else _kind(v)
            raise Invalid(f"must be a list of {len(items)} items, not {what}")
        out = []
        for i, (fn, x) in enumerate(zip(items, v)):
            try:
                out.append(fn(x))
            except Invalid as e:
                raise Invalid(f"{i}: {e}") from None
        return v if type(v) is tuple and all(a is b for a, b in zip(out, v)) else tuple(out)
    return fixed


def _kind(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _show(v: Any) -> str:
    """A refused value in a message: a scalar's text cut short, else its kind
    (the repr of a JSON list nested a thousand deep would recurse past the
    limit that json's own parser stayed within)."""
    if v is None or type(v) in (bool, int, float, str):
        text = repr(v)
        return text if len(text) <= 80 else text[:77] + "..."
    return _kind(v)


def _n(x: float) -> str:
    return str(int(x)) if x == int(x) else str(x)
