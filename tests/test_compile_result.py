"""The result a replay builds (`compiler/program.py`: `_builder`, generated code for the
structure): the same containers, dataclasses and attributes as the general builder's
(`_closures`), for every kind of structure the recordings return, deep ones included."""

import collections
import dataclasses

import pytest

from tracker_gpu.compiler.program import _builder, _closures, _Slot


@dataclasses.dataclass
class Plain:
    a: object
    b: object = 0


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: object


@dataclasses.dataclass(frozen=True, eq=False)
class Token:  # frozen, but told apart by identity: each call's is its own
    a: object


@dataclasses.dataclass
class Slotted:
    __slots__ = ("a",)
    a: object


@dataclasses.dataclass
class Copied:
    a: object

    def __copy__(self):
        return Copied(self.a)


Pair = collections.namedtuple("Pair", "x y")


def _with_extra(value):
    out = Plain(value, _Slot(3))
    out.note = "an attribute that is not a field"
    return out


STRUCTURES = {
    "slot": _Slot(1),
    "constant": 7,
    "tuple": (_Slot(1), 2.0, (_Slot(2),)),
    "list": [_Slot(1), [], ()],
    "dict": {"w": _Slot(1), 3: {"b": _Slot(2)}},
    "ordered dict": collections.OrderedDict(z=_Slot(2), a=_Slot(1)),
    "named tuple": Pair(_Slot(1), Pair(2, _Slot(2))),
    "dataclasses": [Plain(_Slot(1), Frozen(_Slot(2))), Slotted(_Slot(3)), Copied(_Slot(1))],
    "attributes": _with_extra(Frozen(_Slot(2))),
    "a class": (Plain, _Slot(1)),
    "a frozen record": (Frozen((0.5, "a", None)), _Slot(1)),
    "a frozen dataclass of a list": (Frozen([0.5]), _Slot(1)),
    "deep": [[[[_Slot(1)]]]],
}


def _deep(n):
    value = _Slot(1)
    for _ in range(n):
        value = (value,)
    return value


def _same(a, b, path="result"):
    assert type(a) is type(b), path
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert vars(a) == vars(b) if hasattr(a, "__dict__") else True, path
        for field in dataclasses.fields(a):
            _same(getattr(a, field.name), getattr(b, field.name), f"{path}.{field.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            _same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a is b, path


@pytest.mark.parametrize("name", [*STRUCTURES, "deeper than the generated code nests"])
def test_the_generated_builder_builds_what_the_closures_build(name):
    template = STRUCTURES.get(name) or _deep(100)
    env = {1: object(), 2: object(), 3: object()}
    built, expected = _builder(template)(env), _closures(template)(env)
    _same(built, expected)
    assert built is not template or not dataclasses.is_dataclass(template)
    second = _builder(template)({1: "one", 2: "two", 3: "three"})
    assert second != built or name == "constant" or name == "a class"


def test_a_frozen_record_is_returned_as_it_is_and_anything_that_can_change_anew():
    """An optimiser's rule (a frozen dataclass of numbers, compared by value) is the recording's
    object in every replay's result, not a copy made at every call; a frozen dataclass that
    holds a list, a slot or an attribute of its own, or is compared by identity, is built
    anew."""
    record = Frozen((0.5, "a", Frozen(3)))
    changing = {
        "a list": Frozen([0.5]),
        "a slot": Frozen(_Slot(1)),
        "an attribute": Frozen(2.0),
        "a mutable dataclass": Plain(0.5),
        "a record compared by identity": Token(0.5),
    }
    object.__setattr__(changing["an attribute"], "note", "not a field")
    build = _builder([record, *changing.values()])
    for env in ({1: "one"}, {1: "two"}):
        built = build(env)
        assert built[0] is record
        for name, value in zip(changing, built[1:]):
            assert value is not changing[name], name
