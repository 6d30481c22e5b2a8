"""records: typed dataclasses checked when made, loaded from decoded JSON
and dumped back (the model, discovery's records, the state file, the
checkpoint and a plugin's request are made of them)."""

from __future__ import annotations

import enum
import ipaddress
import json
from dataclasses import dataclass, field
from typing import Annotated, Literal, Optional, Union

import pytest
from hypothesis import given, settings, strategies as st

from pipexctl.discovery import checkpoint as cpt
from pipexctl.offload import protocol
from pipexctl.offload.statefile import SessionRecord
from pipexctl.records import Invalid, Limits, check, dump, load


class Colour(str, enum.Enum):
    red = "red"
    blue = "blue"


@dataclass(frozen=True, slots=True, kw_only=True)
class Inner:
    kind: Literal["inner"] = "inner"
    n: Annotated[int, Limits(ge=1, le=10)]

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Other:
    kind: Literal["other"] = "other"
    text: Annotated[str, Limits(pattern=r"^[a-z]+$")]

    def __post_init__(self) -> None:
        check(self)


@dataclass(kw_only=True)
class Outer:
    name: str
    count: int = 0
    ratio: float = 0.0
    flag: bool = False
    colour: Colour = Colour.red
    addr: Optional[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]] = None
    names: tuple[str, ...] = ()
    pair: Optional[tuple[int, int]] = None
    key: Optional[Union[tuple[str, int], int]] = None
    below: Annotated[int, Limits(ge=0, lt=4)] = 0
    inners: list[Inner] = field(default_factory=list)
    either: Optional[Union[Inner, Other]] = None
    raw: Optional[bytes] = None

    def __post_init__(self) -> None:
        check(self)


@pytest.mark.parametrize("kw,why", [
    ({"count": "5"}, "count: must be an integer, not str"),
    ({"count": True}, "count: must be an integer, not bool"),  # a bool is not an int here
    ({"count": 5.0}, "count: must be an integer, not float"),
    ({"flag": 1}, "flag: must be true or false, not int"),
    ({"ratio": "1.5"}, "ratio: must be a number, not str"),
    ({"name": 5}, "name: must be a string, not int"),
    ({"name": None}, "name: must be a string, not null"),
    ({"colour": "green"}, "colour: must be one of 'red', 'blue', not 'green'"),
    ({"addr": "10.0.0.300"}, "addr: '10.0.0.300' is not an IP address"),
    ({"names": ["a", 2]}, "names: 1: must be a string, not int"),
    ({"pair": [1]}, "pair: must be a list of 2 items, not 1 items"),
    ({"pair": [1, "2"]}, "pair: 1: must be an integer, not str"),
    ({"ratio": 10**400}, "ratio: 1000000000"),  # past a float's range: refused, not OverflowError
    ({"colour": [[[]]]}, "colour: must be one of 'red', 'blue', not list"),  # a value's kind, not its repr
    ({"below": 4}, "below: 4 is not below 4"),
    ({"below": -1}, "below: -1 is below 0"),
    ({"inners": [{"n": 1}]}, "inners: 0: must be a Inner, not dict"),  # made by code: records, not dicts
    ({"raw": "00ff"}, "raw: must be bytes, not str"),
])
def test_a_value_against_its_annotation_is_refused_by_name(kw, why):
    with pytest.raises(Invalid) as e:
        Outer(**{"name": "x", **kw})
    assert str(e.value).startswith(why), str(e.value)
    assert isinstance(e.value, ValueError)  # what callers that take any bad value catch


def test_the_three_conversions_and_nothing_else():
    o = Outer(name="x", ratio=2, colour="blue", addr="2001:db8::1", names=["a", "b"], pair=[1, 2], key=["p", 3])
    assert type(o.ratio) is float and o.ratio == 2.0
    assert o.colour is Colour.blue and o.addr == ipaddress.IPv6Address("2001:db8::1")
    assert o.names == ("a", "b") and o.pair == (1, 2) and o.key == ("p", 3)
    assert Outer(name="x", key=7).key == 7  # a union's arms in order: the tuple refuses, the int takes it
    names = ("a",)
    assert Outer(name="x", names=names).names is names  # a value that needs no conversion is kept as it is


def test_a_pattern_takes_the_whole_string_and_no_final_newline():
    """``$`` in Python's re lets a final newline through; pydantic's engine
    did not, nor does a pattern here."""
    assert Other(text="ab").text == "ab"
    with pytest.raises(Invalid, match="does not match"):
        Other(text="ab\n")
    with pytest.raises(Invalid, match="^boot_id: "):
        load(cpt.Checkpoint, {"boot_id": "0" * 32 + "\n"})
    with pytest.raises(Invalid, match="^pty: "):
        SessionRecord(call_id=1, peer_call_id=2, pppd_pid=3, pty="/dev/pts/3\n")


def test_a_union_of_records_says_what_is_wrong_with_the_one_the_kind_names():
    doc = {"boot_id": "0" * 32, "sources": [{"name": "x", "position": {"kind": "file", "dev": 1, "ino": 2,
                                                                       "offset": -1, "tail": "0" * 64},
                                             "parser": {}, "instances": []}]}
    with pytest.raises(Invalid, match=r"^sources\.0\.position\.offset: -1 is below 0$"):
        load(cpt.Checkpoint, doc)


def test_a_list_nested_past_the_recursion_limit_is_refused_not_a_crash():
    """json.loads takes a list nested about 990 deep; a message built from
    its repr would recurse past the limit (a request from a local user)."""
    for depth in range(600, 1000):  # where the window lies depends on the stack the parse starts on
        data = b'{"op": "channel", "to": ' + b"[" * depth + b"]" * depth + b"}"
        try:
            req, why = protocol.parse_request(data)
        except RecursionError:
            pytest.fail(f"depth {depth}: RecursionError out of parse_request")
        assert req is None and why == "malformed_request"


def test_limits_and_patterns_of_nested_records_name_the_field():
    with pytest.raises(Invalid, match=r"^n: 11 is above 10$"):
        Inner(n=11)
    with pytest.raises(Invalid, match=r"^text: 'A' does not match"):
        Other(text="A")
    with pytest.raises(Invalid, match=r"^kind: must be one of 'inner', not 'other'"):
        Inner(kind="other", n=1)  # type: ignore[arg-type]


def test_load_makes_nested_records_from_dicts_and_tells_where_one_is_wrong():
    doc = {"name": "x", "inners": [{"n": 1}, {"n": 2, "unknown": "ignored"}], "either": {"kind": "other", "text": "ab"},
           "extra": [1, 2]}
    o = load(Outer, doc)
    assert o.inners == [Inner(n=1), Inner(n=2)] and o.either == Other(text="ab")
    assert load(Outer, {"name": "x", "either": {"n": 3}}).either == Inner(n=3)  # the arms in order
    with pytest.raises(Invalid, match=r"^inners\.1\.n: 0 is below 1$"):
        load(Outer, {"name": "x", "inners": [{"n": 1}, {"n": 0}]})
    with pytest.raises(Invalid, match=r"^inners\.0\.n: missing$"):
        load(Outer, {"name": "x", "inners": [{}]})
    with pytest.raises(Invalid, match=r"^name: missing$"):
        load(Outer, {})
    with pytest.raises(Invalid, match=r"^inners\.0: not an object$"):
        load(Outer, {"name": "x", "inners": [5]})
    with pytest.raises(Invalid, match=r"^Outer: not an object$"):
        load(Outer, ["name"])
    with pytest.raises(Invalid, match="either"):
        load(Outer, {"name": "x", "either": {"kind": "other", "text": "A"}})


def test_dump_gives_json_types_and_loads_back_the_same():
    o = Outer(name="x", ratio=1.5, flag=True, colour="blue", addr="10.0.0.1", names=("a",), pair=(1, 2),
              key=("p", 3), inners=[Inner(n=4)], either=Other(text="z"), raw=b"\x00\xff")
    doc = dump(o)
    assert json.loads(json.dumps(doc)) == doc
    assert doc["colour"] == "blue" and doc["addr"] == "10.0.0.1" and doc["names"] == ["a"] and doc["raw"] == "00ff"
    assert list(doc) == ["name", "count", "ratio", "flag", "colour", "addr", "names", "pair", "key", "below",
                         "inners", "either", "raw"]  # the fields in order
    back = load(Outer, {**doc, "raw": None})
    assert back == Outer(**{**o.__dict__, "raw": None})


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**70) | st.just(10**400)
                    | st.floats(allow_nan=False)
                    | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(st.sampled_from(["version", "boot_id", "written", "sources", "x"]), JSON, max_size=5),
       source=st.dictionaries(st.sampled_from(["name", "position", "parser", "instances"]), JSON, max_size=4))
def test_any_json_is_a_checkpoint_or_invalid_never_another_error(doc, source):
    """A checkpoint is read from a file: whatever it holds, load makes the
    record or raises Invalid (which the checkpoint's reader turns into a
    warning), never TypeError or the like."""
    for d in (doc, {"boot_id": "0" * 32, "sources": [source]}):
        try:
            load(cpt.Checkpoint, d)
        except Invalid:
            pass


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(["op", "v", "pid", "to", "call", "tunnel", "all", "unit", "x"]), JSON))
def test_any_request_object_is_a_request_or_refused(fields):
    req, why = protocol.parse_request(json.dumps({"op": "channel", **fields}).encode())
    assert (req is None) != (why is None)
    if req is not None:
        assert type(req.v) is int and (req.pid is None or type(req.pid) is int) and type(req.all) is bool
