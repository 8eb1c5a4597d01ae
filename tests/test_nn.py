"""Activations and normalisers: sigmoid relu softmax logsoftmax logsumexp, on every backend,
over several axes, and stable at large inputs (finite values and gradients)."""

import numpy as np
import pytest
from helpers import (
    STRIDED,
    TRANSPOSED,
    check,
    check_like,
    check_nested,
    numpy_of,
    on_backend,
    uniform,
)

import tracker_gpu as tg

NONZERO = ((-3.0, -0.2), (0.2, 3.0))


def np_logsumexp(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def np_softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


# name: (function, NumPy reference, domain, shape)
CASES = {
    "sigmoid": (tg.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-4.0, 4.0), (2, 3)),
    "sigmoid-0d": (tg.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-4.0, 4.0), ()),
    "sigmoid-empty": (tg.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-4.0, 4.0), (0, 3)),
    "relu": (tg.relu, lambda x: np.maximum(x, 0), NONZERO, (2, 3)),
    "relu-0d": (tg.relu, lambda x: np.maximum(x, 0), NONZERO, ()),
    "relu-empty": (tg.relu, lambda x: np.maximum(x, 0), NONZERO, (2, 0)),
}
for axis in (0, 1, -1, -2):
    CASES[f"softmax-{axis}"] = (
        lambda x, axis=axis: tg.softmax(x, axis=axis),
        lambda x, axis=axis: np_softmax(x, axis),
        (-2.0, 2.0),
        (3, 4),
    )
    CASES[f"logsoftmax-{axis}"] = (
        lambda x, axis=axis: tg.logsoftmax(x, axis=axis),
        lambda x, axis=axis: np.log(np_softmax(x, axis)),
        (-2.0, 2.0),
        (3, 4),
    )
CASES["softmax-default"] = (tg.softmax, np_softmax, (-2.0, 2.0), (2, 3, 2))
CASES["logsoftmax-default"] = (tg.logsoftmax, lambda x: np.log(np_softmax(x)), (-2.0, 2.0), (3,))
CASES["softmax-3d-axis1"] = (
    lambda x: tg.softmax(x, axis=1),
    lambda x: np_softmax(x, 1),
    (-2.0, 2.0),
    (2, 3, 2),
)
CASES["softmax-empty"] = (tg.softmax, np_softmax, (-2.0, 2.0), (0, 3))
CASES["logsoftmax-empty"] = (tg.logsoftmax, lambda x: np.log(np_softmax(x)), (-2.0, 2.0), (0, 3))
for axis in (None, 0, 1, -1, (0, 1), (2, 0)):
    for keepdims in (False, True):
        CASES[f"logsumexp-{axis}-{keepdims}"] = (
            lambda x, axis=axis, keepdims=keepdims: tg.logsumexp(x, axis=axis, keepdims=keepdims),
            lambda x, axis=axis, keepdims=keepdims: np_logsumexp(x, axis, keepdims),
            (-2.0, 2.0),
            (2, 3, 2),
        )
CASES["logsumexp-0d"] = (tg.logsumexp, np_logsumexp, (-2.0, 2.0), ())
CASES["logsumexp-empty"] = (
    lambda x: tg.logsumexp(x, axis=1),
    lambda x: np_logsumexp(x, 1),
    (-2.0, 2.0),
    (0, 3),
)


@pytest.mark.parametrize("name", CASES)
def test_value_and_gradient(backend, name):
    f, reference, domain, shape = CASES[name]
    values = uniform(shape, domain, seed=80)
    x = on_backend(backend, values)
    y = f(tg.param(x))
    np.testing.assert_allclose(numpy_of(backend, y), reference(values), rtol=1e-12, atol=1e-14)
    check(backend, f, x)


@pytest.mark.parametrize("layout", [TRANSPOSED, STRIDED])
@pytest.mark.parametrize(
    "name", ["sigmoid", "relu", "softmax-0", "logsoftmax--1", "logsumexp-1-False"]
)
def test_non_contiguous(backend, name, layout):
    f, _, domain, _ = CASES[name]
    check(backend, f, on_backend(backend, uniform((3, 4), domain, seed=81), layout))


# --- stability: huge inputs give finite values and gradients
LARGE = {
    "logsumexp": (lambda x: tg.logsumexp(x), [1000.0, 1000.0]),
    "logsumexp-negative": (lambda x: tg.logsumexp(x), [-1000.0, -1000.5, -999.0]),
    "logsumexp-mixed": (lambda x: tg.logsumexp(x, axis=1), [[1000.0, -1000.0], [0.0, 800.0]]),
    "softmax": (lambda x: tg.softmax(x), [1000.0, 1000.0, 999.0, -1000.0]),
    "softmax-axis0": (lambda x: tg.softmax(x, axis=0), [[1000.0, -800.0], [990.0, 700.0]]),
    "logsoftmax": (lambda x: tg.logsoftmax(x), [1000.0, 1000.0, 999.0, -1000.0]),
    "sigmoid": (tg.sigmoid, [-1000.0, -40.0, 40.0, 1000.0]),
}


@pytest.mark.parametrize("name", LARGE)
def test_large_inputs_are_stable(backend, name):
    f, values = LARGE[name]
    x = on_backend(backend, np.array(values))
    y = numpy_of(backend, f(tg.param(x)))
    assert np.all(np.isfinite(y))
    (g,) = tg.gradient(lambda x: tg.sum(f(x) * f(x)), x)
    check_like(backend, g, x)
    assert np.all(np.isfinite(numpy_of(backend, g)))
    check(backend, f, x)


def test_logsumexp_of_equal_large_values(backend):
    x = on_backend(backend, np.array([1000.0, 1000.0]))
    y = tg.logsumexp(tg.param(x))
    np.testing.assert_allclose(float(y), 1000.0 + np.log(2.0), rtol=1e-15)
    (g,) = tg.gradient(tg.logsumexp, x)
    np.testing.assert_allclose(numpy_of(backend, g), [0.5, 0.5], rtol=1e-12)


def test_softmax_of_large_values(backend):
    x = on_backend(backend, np.array([[1000.0, 1000.0, -1000.0], [-5.0, 1e4, 1e4]]))
    y = numpy_of(backend, tg.softmax(tg.param(x), axis=1))
    np.testing.assert_allclose(y, [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]], atol=1e-300)
    y = numpy_of(backend, tg.logsoftmax(tg.param(x), axis=1))
    log2 = np.log(2.0)
    expected = [[-log2, -log2, -2000 - log2], [-1e4 - 5 - log2, -log2, -log2]]
    np.testing.assert_allclose(y, expected, rtol=1e-15)


@pytest.mark.parametrize("axis", [1, -1, 0])
@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
def test_softmax_over_an_empty_axis(backend, name, axis):
    """Over an empty axis (or along a kept one), an empty result and an empty gradient."""
    x = on_backend(backend, np.zeros((2, 0)))
    f = getattr(tg, name)
    y = f(tg.param(x), axis=axis)
    assert tuple(y.shape) == (2, 0)
    check(backend, lambda x: f(x, axis=axis), x)


@pytest.mark.parametrize("axis", [(0, 1), (1, 2), (0, 2), (-1, -3)])
@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
def test_softmax_over_a_tuple_of_axes_is_scipys(backend, name, axis):
    """Over several axes at once, as SciPy's and JAX's (a TypeError from inside before)."""
    scipy_special = pytest.importorskip("scipy.special")
    reference = {"softmax": scipy_special.softmax, "logsoftmax": scipy_special.log_softmax}[name]
    a = np.random.default_rng(0).standard_normal((2, 3, 4))
    x = on_backend(backend, a)
    got = numpy_of(backend, getattr(tg, name)(tg.param(x), axis=axis))
    np.testing.assert_allclose(got, reference(a, axis=axis), rtol=1e-13)
    check(backend, lambda x: getattr(tg, name)(x, axis=axis), x)


@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp_over_an_empty_axis_is_minus_infinity(backend, keepdims):
    x = on_backend(backend, np.zeros((2, 0)))
    y = tg.logsumexp(tg.param(x), axis=1, keepdims=keepdims)
    assert tuple(y.shape) == ((2, 1) if keepdims else (2,))
    assert np.all(numpy_of(backend, y) == -np.inf)
    (g,) = tg.gradient(lambda x: tg.sum(tg.exp(tg.logsumexp(x, axis=1))), x)  # a finite loss
    assert tuple(g.shape) == (2, 0)


def test_sigmoid_extremes(backend):
    x = on_backend(backend, np.array([-1000.0, 0.0, 1000.0]))
    y = numpy_of(backend, tg.sigmoid(tg.param(x)))
    np.testing.assert_array_equal(y, [0.0, 0.5, 1.0])
    (g,) = tg.gradient(lambda x: tg.sum(tg.sigmoid(x)), x)
    np.testing.assert_array_equal(numpy_of(backend, g), [0.0, 0.25, 0.0])


def test_relu_gradient_is_a_step(backend):
    x = on_backend(backend, np.array([-1.0, 0.0, 2.0]))
    (g,) = tg.gradient(lambda x: tg.sum(tg.relu(x) * 3.0), x)
    np.testing.assert_array_equal(numpy_of(backend, g), [0.0, 0.0, 3.0])  # relu'(0) = 0


@pytest.mark.parametrize(
    "name", ["sigmoid", "relu", "softmax-1", "logsoftmax-0", "logsumexp-(0, 1)-True"]
)
def test_float32_gives_float32(backend, name):
    f, _, domain, shape = CASES[name]
    values = uniform(shape, domain, seed=82)
    x32 = on_backend(backend, values, dtype=np.float32)
    (g32,) = tg.gradient(lambda x: tg.sum(f(x) * f(x)), x32)
    check_like(backend, g32, x32)
    (g64,) = tg.gradient(lambda x: tg.sum(f(x) * f(x)), on_backend(backend, values))
    np.testing.assert_allclose(numpy_of(backend, g32), numpy_of(backend, g64), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "name",
    ["sigmoid", "relu", "softmax-0", "softmax--1", "logsoftmax-1", "logsumexp-None-False"]
    + ["logsumexp-(2, 0)-True"],
)
def test_second_derivative(backend, name):
    f, _, domain, shape = CASES[name]
    check_nested(backend, f, on_backend(backend, uniform(shape, domain, seed=83)))
