"""`tg.testing.gradcheck` checks every floating-point leaf of every argument: a top-level
Python float (a 0-d float64 array, as `gradient` takes it), and the arrays inside dicts, lists,
tuples and nested structures; an argument with nothing to check raises."""

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu.testing import GradcheckError, gradcheck


@tg.rule
def wrong(x):
    """sin with a pullback 1.5 times too large."""
    return np.sin(x), lambda g: (1.5 * g * np.cos(x),)


@tg.rule
def right(x):
    return np.sin(x), lambda g: (g * np.cos(x),)


class Pair(NamedTuple):
    w: object
    b: object


@dataclasses.dataclass
class Layer:
    weights: object
    eps: float = 1e-5


A = np.array([0.3, 0.7])


def nested(a):
    """A structure with `a` deep inside, next to other parameters and data."""
    return (Pair(np.array([1.0, -2.0]), 0.5), {"z": Layer([np.arange(2), a])})


def pick_nested(rule):
    return lambda t: tg.sum(t[0].w * 2.0) + tg.sum(rule(t[1]["z"].weights[1]))


CASES = {
    "python float": (lambda rule: rule, lambda a: 0.7),
    "dict": (lambda rule: lambda d: rule(d["x"]), lambda a: {"x": a}),
    "list": (lambda rule: lambda xs: rule(xs[0]), lambda a: [a]),
    "tuple": (lambda rule: lambda xs: rule(xs[1]), lambda a: (np.arange(2), a)),
    "nested": (pick_nested, nested),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_rule_is_caught(case):
    make_f, make_x = CASES[case]
    with pytest.raises(GradcheckError, match="input 0"):
        gradcheck(make_f(wrong), make_x(A.copy()))


@pytest.mark.parametrize("case", list(CASES))
def test_a_right_rule_passes(case):
    make_f, make_x = CASES[case]
    assert gradcheck(make_f(right), make_x(A.copy())) is True


def test_the_error_says_where_in_the_structure():
    with pytest.raises(GradcheckError, match=r"input 0\[1\]\['z'\]\.weights\[1\]"):
        gradcheck(pick_nested(wrong), nested(A.copy()))
    with pytest.raises(GradcheckError, match=r"input 1\['x'\]"):
        gradcheck(lambda u, d: tg.sum(u * 1.0) + tg.sum(wrong(d["x"])), A.copy(), {"x": A.copy()})


def test_a_float_argument_among_arrays():
    f = lambda x, s: tg.sum(right(x) * s)  # noqa: E731
    assert gradcheck(f, A.copy(), 2.5)
    with pytest.raises(GradcheckError, match="input 1"):
        gradcheck(lambda x, s: tg.sum(right(x)) * wrong(s), A.copy(), 2.5)


def test_an_array_given_twice_is_one_parameter():
    assert gradcheck(lambda x, y: tg.sum(tg.sin(x) * y), A, A)
    assert gradcheck(lambda p: tg.sum(p[0] * p[1]), [A, A])


def test_integer_arrays_beside_a_float_one_are_data():
    assert gradcheck(lambda x, i: tg.sum(right(x)[i]), A.copy(), np.array([1, 0, 1]))


@pytest.mark.parametrize(
    "args",
    [
        (np.array([1, 2]),),
        ({"labels": np.array([1, 2])},),
        ([0.7, 0.2],),  # numbers inside a structure are constants
        (np.array([True, False]), 3),
    ],
    ids=["integer array", "dict of integers", "list of floats", "bool and int"],
)
def test_nothing_to_check_raises(args):
    with pytest.raises(ValueError, match="nothing to check.*floating-point"):
        gradcheck(lambda *a: tg.sum(A * 1.0), *args)
