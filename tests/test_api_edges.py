"""Edges of the public API: dict subclasses in `tg.pytree`, tracked constants in `tg.Params`,
and what a custom rule (`tg.rule`) may return and take by keyword."""

from collections import Counter, OrderedDict, defaultdict

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu.pytree import tree_leaves, tree_map


# --- pytree: dict subclasses are rebuilt as copies of the original, their items replaced
class Tagged(dict):
    """A dict subclass whose constructor takes no items (keyword-only), with an attribute."""

    def __init__(self, *, tag):
        super().__init__()
        self.tag = tag


def tagged(tag, **items):
    out = Tagged(tag=tag)
    out.update(items)
    return out


def test_counter_keeps_its_items():
    out = tree_map(lambda x: x * 2, Counter(a=1, b=3))
    assert type(out) is Counter and dict(out) == {"a": 2, "b": 6}


def test_defaultdict_keeps_its_factory():
    tree = defaultdict(list, a=np.array([1.0, 2.0]))
    out = tree_map(lambda x: x * 2, tree)
    assert type(out) is defaultdict and out.default_factory is list
    np.testing.assert_array_equal(out["a"], [2.0, 4.0])
    assert out["missing"] == [] and "missing" not in tree  # a new dict, not the original


def test_keyword_only_subclass_keeps_its_attributes():
    tree = tagged("layer", w=1.0, b=2.0)
    for out in (tree_map(lambda x: x * 2, tree), tree_map(lambda x, y: x + y, tree, tree)):
        assert type(out) is Tagged and out.tag == "layer" and dict(out) == {"w": 2.0, "b": 4.0}
    assert dict(tree) == {"w": 1.0, "b": 2.0}  # the original is untouched


def test_ordered_dict_keeps_its_order():
    out = tree_map(lambda x: -x, OrderedDict([("b", 1), ("a", 2)]))
    assert type(out) is OrderedDict and list(out.items()) == [("b", -1), ("a", -2)]


def test_dict_subclasses_through_gradient():
    params = {"counts": Counter(w=np.array([1.0, 2.0])), "layer": tagged("t", w=np.ones(2))}
    (g,) = tg.gradient(lambda p: tg.sum(p["counts"]["w"] ** 2 * p["layer"]["w"]), params)
    assert type(g["counts"]) is Counter and type(g["layer"]) is Tagged and g["layer"].tag == "t"
    np.testing.assert_array_equal(g["counts"]["w"], [2.0, 4.0])
    np.testing.assert_array_equal(g["layer"]["w"], [1.0, 4.0])
    assert [type(x) for x in tree_leaves(g)] == [np.ndarray, np.ndarray]


def test_mismatched_keys_of_mixed_types_are_named():
    with pytest.raises(ValueError, match=r"mismatched dict keys: \[1, 'a'\] and \[1, 'b'\]"):
        tree_map(lambda a, b: a + b, {1: 1.0, "a": 2.0}, {1: 1.0, "b": 2.0})


# --- Params: a tracked constant is refused when added
def test_params_refuses_a_tracked_constant():
    W = tg.param(np.array([1.0, 2.0]))
    c = tg.zeros(2)
    with pytest.raises(TypeError, match=r"tracked constant.*tg\.param"):
        tg.Params([W, c])
    ps = tg.Params([W])
    with pytest.raises(TypeError, match=r"tracked constant.*tg\.param"):
        ps.append(c)
    assert list(ps) == [W]
    gs = tg.gradient(lambda: tg.sum(W * W + c), ps)  # a constant closed over is fine
    np.testing.assert_array_equal(gs[W], [2.0, 4.0])


# --- custom rules
@tg.rule
def two_outputs(x):
    return (x * 2, x * 3), lambda g: (g,)


@tg.rule
def a_number(x):
    return 2.0, lambda g: (g,)


@tg.rule
def scale(x, s=1.0):
    return x * s, lambda g: (g * s,)


X = np.array([0.5, 1.5])


def test_rule_with_several_outputs_is_refused():
    with pytest.raises(TypeError, match="one array.*stack outputs or write one rule per output"):
        tg.gradient(lambda x: tg.sum(two_outputs(x)[0]), X)


def test_rule_returning_a_number_is_refused():
    with pytest.raises(TypeError, match="one array.*got float"):
        tg.gradient(lambda x: a_number(x), X)


def test_rule_refuses_a_tracked_keyword_argument():
    s = tg.param(np.array(2.0))
    with pytest.raises(TypeError, match=r"keyword argument s=.*pass differentiable values"):
        tg.gradient(lambda x: tg.sum(scale(x, s=s)), X)
    with pytest.raises(TypeError, match=r"keyword argument s=.*positionally"):
        scale(X, s=s)  # no tracked positional argument: refused all the same


def test_rule_keyword_constants_still_work():
    (g,) = tg.gradient(lambda x: tg.sum(scale(x, s=3.0)), X)
    np.testing.assert_array_equal(g, [3.0, 3.0])
    (g,) = tg.gradient(lambda x: tg.sum(scale(x, s=tg.zeros(()) + 2.0)), X)  # tracked constant
    np.testing.assert_array_equal(g, [2.0, 2.0])
    np.testing.assert_array_equal(scale(X, s=2.0), [1.0, 3.0])
