"""Tracked arrays behave like Python objects (issue 23): pickling and copying, formatting and
rounding, NumPy-style methods answered with the function to call, and clear refusals."""

import copy
import pickle

import numpy as np
import pytest
from helpers import numpy_of

import tracker_gpu as tg


def _round_trip(x):
    return pickle.loads(pickle.dumps(x))


def _constant(backend, values):
    """A tracked constant of the backend's library (its tracked namespace's asarray)."""
    txp = tg.param(backend.asarray([0.0])).__array_namespace__()
    return txp.asarray(backend.asarray(values))


def _skip_without_float(backend):
    if backend.name == "strict-device1":
        pytest.skip("array_api_strict refuses float() of an array on device1 itself")


# --- pickling and copying
def test_a_leaf_pickles_as_a_leaf_with_its_gradient(backend):
    x = tg.param(backend.asarray([1.0, 2.0]))
    tg.back(tg.sum(x * x))
    y = _round_trip(x)
    assert tg.isleaf(y) and y is not x
    assert np.array_equal(backend.to_numpy(tg.data(y)), [1.0, 2.0])
    assert np.array_equal(backend.to_numpy(tg.grad(y)), [2.0, 4.0])
    assert y.__array_namespace__() is x.__array_namespace__()
    tg.back(tg.sum(y * 3.0))  # a leaf of its own: its gradient goes on accumulating
    assert np.array_equal(backend.to_numpy(tg.grad(y)), [5.0, 7.0])
    assert np.array_equal(backend.to_numpy(tg.grad(x)), [2.0, 4.0])


def test_a_leaf_without_gradient_pickles_with_none(backend):
    y = _round_trip(tg.param(backend.asarray([1.0, 2.0])))
    assert tg.isleaf(y) and y._node.grad is None
    (g,) = tg.gradient(lambda p: tg.sum(p * p), y)
    assert np.array_equal(backend.to_numpy(tg.data(g)), [2.0, 4.0])


def test_a_constant_pickles_as_a_constant(backend):
    c = _constant(backend, [1, 2, 3])
    y = _round_trip(c)
    assert isinstance(y, tg.TrackedArray) and not tg.istracked(y)
    assert np.array_equal(backend.to_numpy(y), [1, 2, 3])


def test_an_interior_value_pickles_as_a_leaf_of_its_value(backend):
    x = tg.param(backend.asarray([1.0, 2.0]))
    y = _round_trip(x * 2.0)
    assert tg.isleaf(y)
    assert np.array_equal(backend.to_numpy(tg.data(y)), [2.0, 4.0])
    assert np.array_equal(backend.to_numpy(tg.grad(y)), [0.0, 0.0])


def test_a_model_of_tracked_arrays_pickles():
    model = {"w": tg.param(np.ones((2, 2))), "step": tg.asarray(np.asarray(3))}
    back = _round_trip(model)
    assert tg.isleaf(back["w"]) and not tg.istracked(back["step"])
    assert int(back["step"]) == 3


def _primitives():
    """Every primitive the package exports, by where a user reaches it."""
    from tracker_gpu import nn
    from tracker_gpu.primitive import Primitive

    spaces = {"tg": tg, "tg.nn": nn, "tg.special": tg.special, "tg.linalg": tg.linalg,
              "tg.fft": tg.fft}  # fmt: skip
    return {f"{where}.{name}": value for where, space in spaces.items()
            for name, value in vars(space).items() if isinstance(value, Primitive)}  # fmt: skip


def test_every_exported_primitive_pickles_and_copies_as_itself():
    found = _primitives()
    assert len(found) > 100, sorted(found)  # the enumeration reaches the namespaces
    for where, primitive in found.items():
        assert _round_trip(primitive) is primitive, where
        assert copy.deepcopy(primitive) is primitive, where


def test_a_layer_with_a_primitive_activation_pickles():
    from tracker_gpu import nn

    x = np.linspace(-1.0, 1.0, 8).reshape(4, 2)
    for activation in (nn.relu, tg.tanh, nn.sigmoid, tg.special.erf):
        layer = nn.Dense(2, 3, activation, rng=np.random.default_rng(0), dtype="float64")
        back = _round_trip(layer)
        assert back.activation is activation
        assert np.array_equal(back(x), layer(x))


def test_a_primitive_that_is_no_global_is_refused_by_name():
    from tracker_gpu.primitive import Primitive

    local = Primitive("local_twice", lambda xp, x: x * 2, (lambda g, ans, x: g * 2,))
    with pytest.raises(pickle.PicklingError, match="local_twice.*top level of a module"):
        pickle.dumps(local)


def test_deepcopy_gives_an_independent_leaf(backend):
    x = tg.param(backend.asarray([1.0, 2.0]))
    tg.back(tg.sum(x * x))
    y = copy.deepcopy(x)
    assert tg.isleaf(y) and y._node is not x._node
    assert np.array_equal(backend.to_numpy(tg.grad(y)), [2.0, 4.0])
    y[0] = 10.0
    tg.back(tg.sum(x))
    assert np.array_equal(backend.to_numpy(tg.data(x)), [1.0, 2.0])
    assert np.array_equal(backend.to_numpy(tg.grad(x)), [3.0, 5.0])


def test_deepcopy_copies_the_buffer():
    x = tg.param(np.array([1.0, 2.0]))
    y = copy.deepcopy(x)
    assert not np.shares_memory(tg.data(x), tg.data(y))
    c = copy.deepcopy(tg.asarray(np.array([1, 2])))
    assert not tg.istracked(c) and isinstance(c, tg.TrackedArray)
    model = copy.deepcopy({"a": x, "b": x})
    assert model["a"] is model["b"]  # the memo keeps a shared array shared


def test_copy_is_the_same_value_and_place_on_the_tape(backend):
    x = tg.param(backend.asarray([1.0, 2.0]))
    y = copy.copy(x)
    assert y is not x and y._node is x._node and y.data is x.data
    y[0] = 5.0  # a write rebinds y alone
    assert np.array_equal(backend.to_numpy(tg.data(x)), [1.0, 2.0])
    c = copy.copy(_constant(backend, [1, 2]))
    assert not tg.istracked(c)


HANDLES = {
    "the same object": lambda p: (p, p),
    "copy.copy": lambda p: (p, copy.copy(p)),
    "a pickled pair": lambda p: _round_trip((p, copy.copy(p))),
}


@pytest.mark.parametrize("how", HANDLES)
@pytest.mark.parametrize("transform", ["gradient", "withgradient", "back"])
def test_two_handles_on_one_parameter_are_one_parameter(how, transform):
    """Each place gets the total gradient, as for one object given twice and as `back` gives:
    `gradient` keyed parameters by the Python object, and a copy's place got its part alone."""
    a, b = HANDLES[how](tg.param(np.array([1.0, 2.0])))
    f = lambda m: tg.sum(m["a"] * 3.0) + tg.sum(m["b"] * m["b"])  # noqa: E731
    total = 3.0 + 2 * np.array([1.0, 2.0])
    if transform == "back":
        tg.back(f({"a": a, "b": b}))
        got = [tg.grad(a), tg.grad(b)]
    else:
        found = getattr(tg, transform)(f, {"a": a, "b": b})
        (grads,) = found if transform == "gradient" else found.grad
        got = [tg.data(grads["a"]), tg.data(grads["b"])]
    for g in got:
        np.testing.assert_array_equal(g, total)


COPIES = {"pickle": _round_trip, "deepcopy": copy.deepcopy}


@pytest.mark.parametrize("how", sorted(COPIES))
def test_params_and_grads_copied_with_their_arrays_find_them(how):
    W, b = tg.param(np.array([1.0, 2.0])), tg.param(np.array([3.0]))
    ps = tg.Params([W, b])
    gs = tg.gradient(lambda: tg.sum(W * W) + tg.sum(b), ps)
    W2, b2, ps2, gs2 = COPIES[how]((W, b, ps, gs))
    assert W2 in ps2 and b2 in ps2 and W not in ps2 and len(ps2) == 2
    ps2.append(W2)
    assert len(ps2) == 2
    np.testing.assert_array_equal(gs2[W2], [2.0, 4.0])
    np.testing.assert_array_equal(gs2[b2], [1.0])
    again = tg.gradient(lambda: tg.sum(W2 * b2), ps2)
    np.testing.assert_array_equal(again[W2], [3.0, 3.0])
    np.testing.assert_array_equal(again[b2], [3.0])


def _sin_x(x):
    return tg.sum(tg.sin(x) * x)


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
def test_a_compiled_function_copies_after_its_first_call_and_records_anew(how):
    step, x = tg.compile(_sin_x), np.array([0.5, 1.0])
    expected = step(x)
    step(x)
    copied = {**COPIES, "copy": copy.copy}[how](step)
    found = copied(x)
    assert copied.cache_info().misses == 1  # its own cache: recorded anew
    assert step.cache_info().currsize == 1
    np.testing.assert_array_equal(found.val, expected.val)
    np.testing.assert_array_equal(found.grad[0], expected.grad[0])


@pytest.mark.parametrize("how", sorted(COPIES))
def test_two_handles_on_one_leaf_are_copied_as_one_leaf(backend, how):
    """`copy.copy(x)` is x's place on the tape: copied together, they stay one parameter (the
    gradient was split between two leaves); other leaves stay apart."""
    x = tg.param(backend.asarray([1.0, 2.0]))
    y = tg.param(backend.asarray([3.0, 4.0]))
    x2, a2, y2 = COPIES[how]((x, copy.copy(x), y))
    assert a2._node is x2._node and y2._node is not x2._node
    tg.back(tg.sum(x2 * a2 * y2))
    np.testing.assert_array_equal(numpy_of(backend, tg.grad(x2)), [6.0, 16.0])
    np.testing.assert_array_equal(numpy_of(backend, tg.grad(y2)), [1.0, 4.0])
    np.testing.assert_array_equal(numpy_of(backend, tg.grad(x)), [0.0, 0.0])  # x is apart


def test_pickling_refused_while_recording():
    def f(x):
        pickle.dumps(x)
        return tg.sum(x)

    with pytest.raises(Exception, match="tg.compile cannot replay pickl"):
        tg.compile(f)(np.ones(2))


# --- format and round
def test_format_of_a_0d_array(backend):
    _skip_without_float(backend)
    x = tg.sum(tg.param(backend.asarray([1.0, 0.23456])))
    assert f"{x:.3f}" == "1.235"
    assert f"{x:>8.2f}" == "    1.23"
    assert f"{_constant(backend, 7):03d}" == "007"
    assert f"{x}" == str(x)  # no spec: as before


def test_format_spec_of_an_array_refused():
    with pytest.raises(TypeError, match="0-d"):
        f"{tg.param(np.ones(2)):.3f}"


def test_round_of_a_0d_array(backend):
    _skip_without_float(backend)
    x = tg.sum(tg.param(backend.asarray([1.0, 0.6])))
    assert round(x) == 2 and type(round(x)) is int
    assert round(x, 1) == 1.6 and type(round(x, 1)) is float
    with pytest.raises(TypeError, match="tg.round"):
        round(tg.param(np.ones(2)))


def test_format_and_round_refused_while_recording():
    for use in (lambda s: f"{s:.2f}", round):

        def f(x, use=use):
            s = tg.sum(x)
            use(s)
            return s

        with pytest.raises(Exception, match="tg.compile cannot replay"):
            tg.compile(f)(np.ones(2))


# --- NumPy-style methods
@pytest.mark.parametrize(
    "name, hint",
    [
        ("sum", "tg.sum(x)"),
        ("mean", "tg.mean(x)"),
        ("reshape", "tg.reshape(x"),
        ("astype", "tg.astype(x"),
        ("item", "float(x)"),
        ("numpy", "tg.data(x)"),
        ("tolist", "tg.data(x)"),
        ("cumsum", "tg.cumulative_sum(x)"),
        ("transpose", "tg.permute_dims"),
        ("flatten", "tg.reshape(x, (-1,))"),
        ("backward", "tg.back(x)"),
        ("detach", "tg.stop_gradient(x)"),
        ("real", "tg.real(x)"),
    ],
)
def test_numpy_style_methods_name_the_function(name, hint):
    x = tg.param(np.ones(2))
    with pytest.raises(AttributeError, match="TrackedArray") as info:
        getattr(x, name)
    assert hint in str(info.value)


def test_unknown_attributes_and_protocols_stay_plain_attribute_errors():
    x = tg.param(np.ones(2))
    with pytest.raises(AttributeError, match="no attribute 'frobnicate'"):
        _ = x.frobnicate
    for name in ("__array_interface__", "__array_struct__", "__dask_graph__", "_xp_extra"):
        assert not hasattr(x, name)
    assert hasattr(x, "shape") and hasattr(x, "__array_namespace__")


def test_hinted_names_are_declared_not_looked_up():
    """The hints are class attributes that raise when read (`x.sum`), not a `__getattr__`, with
    which Python reads every attribute of every tracked array (`x.data`) the slow way; `dir`
    leaves them out, and the class has them no more than an instance."""
    assert "__getattr__" not in vars(tg.TrackedArray)
    x = tg.param(np.ones(2))
    assert "sum" not in dir(x) and "reshape" not in dir(x) and "shape" in dir(x)
    assert not hasattr(tg.TrackedArray, "sum") and not hasattr(x, "numpy")


def test_the_table_of_differentiable_dtypes_stays_small_and_right():
    """Whether a dtype carries a gradient is kept by the dtype's id, the dtype kept alive with
    it; dtypes made anew by the hundred (a string's of each length) do not grow it past its
    bound, and the answers stay right past it."""
    from tracker_gpu import primitive

    for n in range(1, 2 * primitive._MOST_SEEN):
        assert primitive._differentiable(np.dtype(f"U{n}")) is False
    assert len(primitive._SEEN) <= primitive._MOST_SEEN
    assert primitive._differentiable(np.dtype(">f8")) is True
    assert tg.istracked(tg.param(np.ones(2, dtype=">f4")) * 2.0)
    assert not tg.istracked(tg.astype(tg.param(np.ones(2)), np.int64))


def test_an_empty_object_does_not_recurse():
    x = object.__new__(tg.TrackedArray)
    for name in ("data", "_node", "_xp", "shape", "sum"):
        assert not hasattr(x, name)


# --- clear refusals
def test_squeeze_without_axis_says_so():
    with pytest.raises(TypeError, match="axis") as info:
        tg.squeeze(tg.param(np.ones((2, 1))))
    assert "_squeeze_forward" not in str(info.value)
    with pytest.raises(TypeError, match="axis") as info:
        tg.squeeze(np.ones((2, 1)))
    assert "_squeeze_forward" not in str(info.value)


def test_hvp_takes_jvp_tuples(backend):
    f = lambda x: tg.sum(x**3)  # noqa: E731
    x, v = backend.asarray([1.0, 2.0]), backend.asarray([1.0, 1.0])
    plain = tg.hvp(f, x, v)
    (tupled,) = tg.hvp(f, (x,), (v,))
    assert np.allclose(backend.to_numpy(tupled), backend.to_numpy(plain))
    assert np.allclose(backend.to_numpy(plain), [6.0, 12.0])


def test_hvp_tuples_of_several_arguments():
    f = lambda x, y: tg.sum(x * x * y)  # noqa: E731
    x, y = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    hx, hy = tg.hvp(f, (x, y), (np.array([1.0, 0.0]), np.array([0.0, 1.0])))
    # H = [[2y, 2x], [2x, 0]] (diagonal blocks); H @ (e0, e1')
    assert np.allclose(hx, [6.0, 4.0]) and np.allclose(hy, [2.0, 0.0])


def test_hvp_tuple_mismatch_refused():
    with pytest.raises(TypeError, match="hvp"):
        tg.hvp(lambda x: tg.sum(x**3), (np.ones(2),), np.ones(2))
    with pytest.raises(ValueError, match="hvp"):
        tg.hvp(lambda x: tg.sum(x**3), (np.ones(2),), (np.ones(2), np.ones(2)))


def test_a_numpy_scalar_compared_with_a_tensor_is_a_boolean_mask():
    """NumPy's scalar on the left ran NumPy's ufunc on the tensor: a uint8 mask, which
    indexing took for the indices [1, 0, 1], a wrong value and gradient, silently."""
    torch = pytest.importorskip("torch")
    values = torch.tensor([1.5, -2.0, 3.0], dtype=torch.float64)
    mask = tg.data(np.float64(0.0) < tg.param(values))
    assert mask.dtype == torch.bool and mask.tolist() == [True, False, True]
    (g,) = tg.gradient(lambda x: tg.sum(x[np.float32(0.0) < x] ** 2), values)
    assert g.tolist() == [3.0, 0.0, 6.0]


LIST_OPERANDS = {
    "x * list": lambda x: x * [1.0, 2.0, 3.0],
    "list * x": lambda x: [1.0, 2.0, 3.0] * x,
    "x / tuple": lambda x: x / (1.0, 2.0, 4.0),
    "x ** list": lambda x: x ** [1.0, 2.0, 3.0],
    "list ** x": lambda x: [1.0, 2.0, 3.0] ** x,
    "x - nested list": lambda x: x - [[1.0], [2.0]],
    "x @ list": lambda x: x @ [1.0, 2.0, 3.0],
    "list @ x": lambda x: [1.0, 2.0, 3.0] @ x,
    # NumPy's functions of the operators take a list on either side too
    "np.multiply(list, x)": lambda x: np.multiply([1.0, 2.0, 3.0], x),
    "np.power(x, list)": lambda x: np.power(x, [2, 3, 1]),
    "np.subtract(tuple, x)": lambda x: np.subtract((1.0, 2.0, 4.0), x),
    "np.matmul(list, x)": lambda x: np.matmul([[1.0, 2.0, 3.0]], x),
}


@pytest.mark.parametrize("name", LIST_OPERANDS)
def test_a_list_operand_is_an_array_as_numpys_operators_take_it(name):
    """Saved as a list, it failed in the backward pass (multiply, divide, power) or at once
    (matmul): NumPy's value, and the gradient against central differences."""
    f = LIST_OPERANDS[name]
    a = np.array([1.5, 2.0, 0.5])
    value, (g,) = tg.withgradient(lambda x: tg.sum(f(x)), a)
    assert value == np.sum(f(a))
    h = 1e-6
    expected = [(np.sum(f(a + h * e)) - np.sum(f(a - h * e))) / (2 * h) for e in np.eye(3)]
    np.testing.assert_allclose(g, expected, rtol=1e-7)


def test_an_in_place_numpy_operator_with_a_tracked_constant_is_numpys():
    """Refused as if the constant carried a gradient; a tracked value (or a tracked array
    given as `out=`) still is, as its gradient would be lost."""
    a = np.array([1.0, 2.0, 3.0])
    a += tg.asarray(np.array([0.5, 0.5, 2.0]))
    a *= tg.ones(3) * 2.0
    np.testing.assert_array_equal(a, [3.0, 5.0, 10.0])
    with pytest.raises(TypeError, match="cannot write a tracked result into a NumPy array"):
        a += tg.param(np.ones(3))
    with pytest.raises(TypeError, match="cannot write a tracked result"):
        np.add(a, a, out=tg.param(np.ones(3)))
    np.testing.assert_array_equal(a, [3.0, 5.0, 10.0])


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("order", ["old first", "updated first"])
def test_handles_that_an_update_set_apart_copy_with_their_own_values(backend, how, order):
    """`tg.update(x, dx)` gives `x` a new value; a `copy.copy(x)` made before keeps the old one
    while sharing the node. Copied together, both came back with whichever was copied first
    (the updated parameter with its value from before the update)."""
    x = tg.param(backend.asarray(np.array([1.0, 2.0])))
    old = copy.copy(x)
    tg.update(x, backend.asarray(np.array([10.0, 10.0])))
    pair = [old, x] if order == "old first" else [x, old]
    copied = pickle.loads(pickle.dumps(pair)) if how == "pickle" else copy.deepcopy(pair)
    got = dict(zip(("old", "x") if order == "old first" else ("x", "old"), copied))
    np.testing.assert_array_equal(backend.to_numpy(tg.data(got["x"])), [11.0, 12.0])
    np.testing.assert_array_equal(backend.to_numpy(tg.data(got["old"])), [1.0, 2.0])
