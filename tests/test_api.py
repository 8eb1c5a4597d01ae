"""Tracker's gradient API: param, back, grad, gradient, withgradient, Params, custom rules."""

from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import pytest

import tracker_gpu as tg


def test_readme_example_on_every_backend(backend):
    x = backend.asarray([1.0, 2.0, 3.0])
    val, (g,) = tg.withgradient(lambda x: tg.sum(x**2) + tg.prod(x[1:]), x)
    assert float(tg.data(val)) == 20.0
    assert np.allclose(backend.to_numpy(g), [2.0, 7.0, 8.0])
    assert tg.backend.device_of(tg.data(g)) == backend.device


def test_param_copies_and_promotes(backend):
    ints = backend.asarray([1, 2], dtype="int64")
    p = tg.param(ints)
    assert backend.xp.isdtype(p.dtype, "real floating")
    f32 = backend.asarray([1.0], dtype="float32")
    assert tg.param(f32).dtype == backend.xp.float32
    a = np.array([1.0, 2.0])
    q = tg.param(a)
    a[0] = 5.0
    assert tg.data(q)[0] == 1.0
    assert tg.isleaf(q) and tg.istracked(q) and not tg.isleaf(q * 2)


def test_param_of_a_tracked_value_stays_on_its_tape():
    x = tg.param(np.array([2.0]))
    y = tg.param(x * 3.0)
    assert not tg.isleaf(y)
    tg.back(tg.sum(y * y))
    assert np.allclose(tg.grad(x), [2 * 6.0 * 3.0])


def test_back_with_a_seed_list_and_scalars():
    x = tg.param(np.array([1.0, 2.0]))
    tg.back(x * 5.0, [1, 2])
    assert np.allclose(tg.grad(x), [5.0, 10.0])


def test_grad_is_zero_before_any_pass_and_zero_grad_resets():
    x = tg.param(np.array([1.0, 2.0]))
    assert np.array_equal(tg.grad(x), [0.0, 0.0])
    tg.back(tg.sum(x * 3.0))
    tg.zero_grad(x)
    assert np.array_equal(tg.grad(x), [0.0, 0.0])


def test_update_adds_and_zeroes_the_gradient():
    x = tg.param(np.array([1.0, 2.0]))
    tg.back(tg.sum(x * x))
    tg.update(x, -0.5 * tg.grad(x))
    assert np.allclose(tg.data(x), [0.0, 0.0])
    assert np.array_equal(tg.grad(x), [0.0, 0.0])


def test_gradient_of_several_arguments_and_numbers():
    gx, gy = tg.gradient(lambda x, y: x * y + y, 3.0, 4.0)
    assert float(gx) == 4.0 and float(gy) == 4.0


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_number_beside_an_array_is_a_parameter_of_its_library(backend, compiled):
    """A Python number differentiated beside arrays of a library that does not mix with NumPy's
    (CuPy, PyTorch, array-api-strict) becomes a 0-d array of that library, on their device."""
    x = backend.asarray([1.0, 2.0])
    gradient = tg.compile(lambda x, a: tg.sum(x * a * a), gradient=True) if compiled else None
    for a in (2.0, 3.0):  # a second call replays the compiled step
        if compiled:
            gx, ga = gradient(x, a).grad
        else:
            gx, ga = tg.gradient(lambda x, a: tg.sum(x * a * a), x, a)
        assert np.array_equal(backend.to_numpy(gx), [a * a, a * a])
        assert float(backend.to_numpy(ga)) == 2 * a * 3.0  # d/da of a² (1 + 2)
        if backend.name != "dask":
            assert tg.backend.device_of(ga) == backend.device
            assert tg.backend.namespace_of(ga) is tg.backend.namespace_of(tg.data(gx))


def test_gradient_over_named_tuples_lists_and_dataclasses():
    Pair = namedtuple("Pair", "w b")

    @dataclass
    class Layer:
        weight: np.ndarray
        bias: np.ndarray
        name: str = "dense"

    x = np.array([1.0, -1.0])

    def loss(model):
        pair, layer, items = model
        hidden = tg.tanh(layer.weight @ x + layer.bias)
        return tg.sum(hidden * pair.w) + pair.b * items[0]

    model = (
        Pair(np.array([0.5, 2.0]), 3.0),
        Layer(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.1, 0.2])),
        [np.array(2.0), np.array([1, 2])],
    )
    (g,) = tg.gradient(loss, model)
    pair, layer, items = g
    assert isinstance(pair, Pair) and isinstance(layer, Layer) and isinstance(items, list)
    assert pair.b is None and layer.name is None and items[1] is None
    assert float(items[0]) == 3.0  # d(b * items[0]) / d items[0] = b
    h = np.tanh(model[1].weight @ x + model[1].bias)
    dh = model[0].w * (1 - h**2)
    assert np.allclose(layer.bias, dh) and np.allclose(layer.weight, np.outer(dh, x))
    assert np.allclose(pair.w, h)


def test_withgradient_keeps_aux_outputs_and_the_whole_value():
    res = tg.withgradient(lambda x: (tg.sum(x), {"n": 1}), np.ones(3))
    assert res.val[1] == {"n": 1}
    assert np.allclose(res.grad[0], 1.0)


def test_unused_input_gets_none():
    gx, gy = tg.gradient(lambda x, y: tg.sum(x * 2.0), np.ones(2), np.ones(2))
    assert np.allclose(gx, 2.0) and gy is None


def test_implicit_params_do_not_touch_the_leaves():
    W = tg.param(np.array([[1.0, 2.0], [3.0, 4.0]]))
    b = tg.param(np.array([1.0, 1.0]))
    gs = tg.gradient(lambda: tg.sum(W @ np.array([1.0, 1.0]) * b), tg.Params([W, b, W]))
    assert len(gs) == 2
    assert np.allclose(gs[W], [[1.0, 1.0], [1.0, 1.0]]) and np.allclose(gs[b], [3.0, 7.0])
    assert np.array_equal(tg.grad(W), np.zeros((2, 2)))
    with pytest.raises(KeyError):
        gs[tg.param(np.ones(1))]


@pytest.mark.parametrize("nest", [False, True])
def test_implicit_params_made_of_each_other_get_their_whole_gradients(nest):
    """A parameter that another one is made of gets its share through it too (it was stopped
    there: W's gradient lacked the part through y, and W1 = param(W0) left W0 None). PyTorch's
    autograd.grad over the same values is the reference."""
    torch = pytest.importorskip("torch")
    W = tg.param(np.array([1.0, 2.0]))
    y = W * 2.0
    z = y * 3.0
    gs = tg.gradient(lambda: tg.sum(z * y * W), tg.Params([z, W, y]), nest=nest)
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    ty = t * 2.0
    tz = ty * 3.0
    expected = torch.autograd.grad((tz * ty * t).sum(), [tz, t, ty])
    for p, e in zip((z, W, y), expected):
        assert np.array_equal(tg.data(gs[p]), e.numpy())
    W0 = tg.param(np.array([1.0, 2.0]))
    W1 = tg.param(W0)
    gs = tg.gradient(lambda: tg.sum(W1 * W1), tg.Params([W0, W1]))
    assert np.array_equal(gs[W1], [2.0, 4.0]) and np.array_equal(gs[W0], [2.0, 4.0])


def test_custom_rule_is_used_and_nests():
    calls = []

    @tg.rule
    def cube(x):
        calls.append(1)
        return x**3, lambda g: (g * 3 * x**2,)

    x = np.array([1.0, 2.0])
    (g,) = tg.gradient(lambda x: tg.sum(cube(x)), x)
    assert np.allclose(g, 3 * x**2) and calls
    (h,) = tg.gradient(lambda x: tg.sum(tg.gradient(lambda y: tg.sum(cube(y)), x, nest=True)[0]), x)
    assert np.allclose(h, 6 * x)


def test_custom_rule_with_a_plain_argument():
    @tg.rule
    def scale(x, k):
        return x * k, lambda g: (g * k, None)

    (g,) = tg.gradient(lambda x: tg.sum(scale(x, np.array([2.0, 3.0]))), np.ones(2))
    assert np.allclose(g, [2.0, 3.0])


def test_gradient_on_a_float32_input_is_float32(backend):
    x = backend.asarray([1.0, 2.0], dtype="float32")
    (g,) = tg.gradient(lambda x: tg.sum(tg.exp(x) * 2.0), x)
    assert tg.data(g).dtype == backend.xp.float32


def test_an_inner_gradient_nests_without_a_flag():
    f = lambda x: tg.sum(x**3)  # noqa: E731
    x = np.array([1.0, 2.0])
    (g,) = tg.gradient(lambda x: tg.sum(tg.gradient(f, x)[0]), x)
    assert np.allclose(g, 6 * x)  # d/dx sum(3 x^2)


@pytest.mark.parametrize("how", ["argument", "closed over"])
def test_a_top_level_gradient_of_a_tracked_value_refuses_a_second_order(how):
    x = tg.param(np.array([1.0, 2.0]))
    if how == "argument":
        (g,) = tg.gradient(lambda y: tg.sum(y**3), x)
    else:
        h = x * 2.0
        (g,) = tg.gradient(lambda y: tg.sum(h * y**2), np.array([1.0, 1.0]))
    with pytest.raises(tg.PullbackError, match="nest=True"):
        tg.back(tg.sum(g))


def test_nested_gradient_matches_the_analytic_hessian_vector_product(backend):
    x = backend.asarray([0.3, -0.7, 1.1])
    w = backend.asarray([1.0, 2.0, -1.0])

    def first(x):
        return tg.gradient(lambda y: tg.sum(tg.sin(y) * y), x, nest=True)[0]

    (hv,) = tg.gradient(lambda x: tg.sum(first(x) * w), x)
    xn, wn = backend.to_numpy(x), backend.to_numpy(w)
    assert np.allclose(backend.to_numpy(hv), (2 * np.cos(xn) - xn * np.sin(xn)) * wn)


def test_integer_fields_of_a_top_level_dataclass_are_not_parameters():
    @dataclass
    class Model:
        weight: np.ndarray
        index: np.ndarray

    (g,) = tg.gradient(lambda m: tg.sum(m.weight * m.index), Model(np.ones(2), np.array([1, 2])))
    assert np.allclose(g.weight, [1.0, 2.0]) and g.index is None


def test_withgradient_returns_plain_values_of_the_data_library(backend):
    x = backend.asarray([1.0, 2.0])
    val, (g,) = tg.withgradient(lambda x: (tg.sum(x**2), {"double": x * 2.0}, "aux"), x)
    loss, aux, label = val
    assert not tg.istracked(loss) and not tg.istracked(aux["double"]) and label == "aux"
    assert type(aux["double"]) is type(x)
    assert float(loss) == 5.0 and np.array_equal(backend.to_numpy(aux["double"]), [2.0, 4.0])
    implicit = tg.withgradient(lambda: tg.sum(tg.param(x) * 3.0), tg.Params([]))
    assert not tg.istracked(implicit.val)


def test_withgradient_keeps_aux_objects_that_hold_no_tracked_array():
    config = {"steps": [1, 2]}
    val, _ = tg.withgradient(lambda x: (tg.sum(x), config), np.ones(2))
    assert val[1] is config


def test_withgradient_with_nest_keeps_the_value_tracked():
    val, (g,) = tg.withgradient(lambda x: tg.sum(x**3), np.array([2.0]), nest=True)
    assert tg.istracked(val) and tg.istracked(g)


C = 1.5
SCALAR_FUNCTIONS = {  # f and its derivative, written out
    "sum(c * v**2)": (lambda v: tg.sum(C * v**2), lambda v: 2 * C * v),
    "v * v": (lambda v: v * v, lambda v: 2 * v),
    "sin(v) * v": (lambda v: tg.sin(v) * v, lambda v: np.cos(v) * v + np.sin(v)),
    "v": (lambda v: v, lambda v: 1.0),
    "v * 2 + v": (lambda v: v * 2.0 + v, lambda v: 3.0),
}


def _back_twice(f, v):
    x = tg.param(v)
    for _ in range(2):  # half the derivative each: it accumulates
        tg.back(f(x) * 0.5)
    return tg.grad(x)


SCALAR_TRANSFORMS = {  # the derivative each gives at v
    "gradient": lambda f, v: tg.gradient(f, v)[0],
    "withgradient": lambda f, v: tg.withgradient(f, v).grad[0],
    "back, twice": _back_twice,
    "forward's back": lambda f, v: tg.forward(f, v)[1](np.ones_like(v))[0],
    "jacobian": lambda f, v: tg.jacobian(f, v),
    "compile": lambda f, v: [tg.compile(f)(v) for _ in range(3)][-1].grad[0],
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transform", SCALAR_TRANSFORMS)
@pytest.mark.parametrize("function", SCALAR_FUNCTIONS)
def test_the_gradient_of_a_0d_array_is_a_0d_array(function, transform, dtype):
    """NumPy's arithmetic on 0-d arrays gives scalars, and the gradient of a 0-d argument was
    a NumPy scalar on most paths, a 0-d array on others (the identity's)."""
    f, derivative = SCALAR_FUNCTIONS[function]
    v = np.array(0.75, dtype)
    g = SCALAR_TRANSFORMS[transform](f, v)
    assert type(g) is np.ndarray and g.shape == () and g.dtype == v.dtype, (type(g), g)
    expected = np.asarray(derivative(np.float64(0.75)))
    np.testing.assert_allclose(g, expected, rtol=1e-6 if dtype == "float32" else 1e-14)


@pytest.mark.parametrize("number", [0.75, np.float64(0.75), np.float32(0.75)], ids=type)
@pytest.mark.parametrize("function", SCALAR_FUNCTIONS)
def test_the_gradient_of_a_number_is_a_numpy_scalar(function, number):
    f, derivative = SCALAR_FUNCTIONS[function]
    for g in (tg.gradient(f, number)[0], tg.withgradient(f, number).grad[0]):
        expected_type = np.float64 if type(number) is float else type(number)
        assert type(g) is expected_type, (type(g), g)
        assert np.isclose(g, derivative(np.float64(0.75)), rtol=1e-6)
