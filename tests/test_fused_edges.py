"""Edges where the fused paths once left the generic path's (and NumPy's) answers: `tg.broadcast`
on float32 arguments beside float64 ones, `x ** number`, a compiled region's transposed
inputs, and broadcast's gradients where 0 meets inf."""

import warnings

import numpy as np
import pytest
from domain import special_values

import tracker_gpu as tg
from tracker_gpu.cuda import on_host
from tracker_gpu.cuda.dispatch import on_host_now


def same(a, b):
    """Bit for bit, nan where nan (any payload)."""
    a, b = np.asarray(a), np.asarray(b)
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and np.array_equal(a, b, equal_nan=True)
        and np.array_equal(np.signbit(a) | np.isnan(a), np.signbit(b) | np.isnan(b))
    )


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings(), np.errstate(all="ignore"), tg.sync_checks(False):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def pairs(x_dtype, y_dtype):
    """Every pair of special values, as a column of `x_dtype` and one of `y_dtype`."""
    x, y = np.meshgrid(special_values(x_dtype), special_values(y_dtype), indexing="ij")
    return x.ravel().astype(x_dtype), y.ravel().astype(y_dtype)


def fused_and_generic(f, *args):
    """`(value, gradients)` of `broadcast(f, *args)` by the generated kernel and generically."""

    def run():
        loss = lambda *a: tg.sum(tg.broadcast(f, *a))  # noqa: E731
        return tg.data(tg.broadcast(f, *args)), tg.gradient(loss, *args)

    with on_host():
        fused = run()
    with on_host(False):
        generic = run()
    return fused, generic


# --- 1. float32 beside float64: each operation in the dtype NumPy gives it
MIXED = {
    "x + y * y": lambda x, y: x + y * y,
    "y / y + x": lambda x, y: y / y + x,
    "reciprocal(y) * 2 - x": lambda x, y: tg.reciprocal(y) * 2.0 - x,
    "maximum(y * y, 1) * x": lambda x, y: tg.maximum(y * y, 1.0) * x,
    "where(y > 0.1, y * 3, x)": lambda x, y: tg.where(y > 0.1, y * 3.0, x),
    "sqrt(y * y) + x": lambda x, y: tg.sqrt(y * y) + x,
}


@pytest.mark.parametrize("name", sorted(MIXED))
def test_broadcast_of_float32_beside_float64_computes_as_numpy(name):
    f = MIXED[name]
    x, y = pairs(np.float64, np.float32)
    (value, grads), (generic_value, generic_grads) = fused_and_generic(f, x, y)
    assert same(value, tg.data(f(x, y)))  # NumPy's own
    assert same(value, generic_value)
    for fused, generic in zip(grads, generic_grads):
        assert same(fused, generic)


def test_broadcast_of_float32_beside_float64_through_the_c_library():
    """exp in float32 (C's expf against NumPy's): within a few ulps, infinities alike."""
    x, y = pairs(np.float64, np.float32)
    f = lambda x, y: tg.exp(y) * 2.0 - x  # noqa: E731
    (value, _), _ = fused_and_generic(f, x, y)
    numpy = tg.data(f(x, y))
    assert same(np.isnan(value), np.isnan(numpy)) and same(np.isinf(value), np.isinf(numpy))
    finite = np.isfinite(numpy)
    close = np.abs(value[finite] - numpy[finite]) <= 4 * np.spacing(np.abs(numpy[finite]))
    assert close.all() or np.allclose(value[finite], numpy[finite], rtol=1e-6, atol=1e-300)


def test_broadcast_of_float32_beside_float64_reported_cases():
    x, y = np.zeros(1), np.array([1e20], np.float32)
    with on_host():
        assert np.isinf(tg.broadcast(lambda x, y: x + y * y, x, y)[0])  # y * y in float32
    x, y = np.zeros(1), np.array([-1e-45], np.float32)
    (_, (_, gy)), (_, (_, generic)) = fused_and_generic(lambda x, y: y / y, x, y)
    eager = tg.gradient(lambda x, y: tg.sum(x + y / y), x, y)[1]
    assert np.isnan(eager[0]) and same(gy, eager) and same(generic, eager)


# --- 2. x ** number: NumPy's sqrt, square and reciprocal for 0.5, 2 and -1
EXPONENTS = [0.5, 2.0, -1.0, 1.0, 0.0, 3.0, -0.5, 1.5]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("exponent", EXPONENTS)
def test_broadcast_power_of_a_constant_is_numpys(exponent, dtype):
    x = special_values(dtype)
    f = lambda x: x**exponent  # noqa: E731
    (value, (grad,)), (generic, (generic_grad,)) = fused_and_generic(f, x)
    if exponent in (0.5, 2.0, -1.0, 1.0, 0.0):  # correctly rounded: NumPy's bits
        assert same(value, x**exponent) and same(generic, x**exponent)
    assert same(np.isnan(value), np.isnan(x**exponent))
    assert same(np.isnan(grad), np.isnan(generic_grad))
    assert same(np.isinf(grad), np.isinf(generic_grad))


@pytest.mark.parametrize("exponent", [0.5, 2.0, -1.0, 3.0])
def test_broadcast_power_of_a_number_argument_is_numpys(exponent):
    x = special_values(np.float64)
    f = lambda x, y: x**y  # noqa: E731
    with on_host():
        value = tg.broadcast(f, x, exponent)
    with on_host(False):
        generic = tg.broadcast(f, x, exponent)
    assert same(np.isnan(value), np.isnan(x**exponent)) and same(np.isnan(generic), np.isnan(value))
    if exponent != 3.0:
        assert same(value, x**exponent)


@pytest.mark.parametrize("n", [1, 1024, 1027, 1031])
def test_compiled_power_of_a_half_is_numpys_sqrt_in_vector_loop_and_tail(n):
    f = lambda x: x**0.5 * 1.0  # noqa: E731
    x = np.full(n, -np.inf)
    x[-1] = -0.0
    step = tg.compile(f, gradient=False, fuse=True)
    step(x)
    assert same(step(x), f(x))


def test_compiled_power_of_a_0d_array_is_numpys():
    f = lambda x, y: x**y * 1.0 + 0.0  # noqa: E731
    x = np.resize(special_values(np.float64), 2000)
    step = tg.compile(f, gradient=False, fuse=True)
    for exponent in (0.5, 2.0, -1.0):
        y = np.array(exponent)
        step(x, y)
        assert same(step(x, y), f(x, y))


# --- 3. tg.compile's regions on inputs of any layout: eager's bits
def layouts():
    rng = np.random.default_rng(2)
    base = (rng.standard_normal((40, 30)) * 10.0 ** rng.integers(-3, 4, (40, 30))).astype(
        np.float32
    )
    wide = np.repeat(base.T, 2, axis=1)
    return {"C": np.ascontiguousarray(base.T), "F": base.T, "strided": wide[:, ::2],
            "strided F": np.asfortranarray(wide)[:, ::2]}  # fmt: skip


@pytest.mark.parametrize("layout", ["C", "F", "strided", "strided F"])
def test_compiled_region_on_any_layout_is_eager_bits(layout):
    x = layouts()[layout]
    f = lambda x: tg.sum(tg.square(x * 3.0 + 1.0))  # noqa: E731
    step = tg.compile(f)
    step(np.ascontiguousarray(x))  # recorded on a C-ordered array, replayed on this one
    got, eager = step(x), tg.withgradient(f, x)
    assert got.val == eager.val and same(got.grad[0], eager.grad[0])
    assert step.programs()[0].fused or on_host_now()  # the numpy-fused row replays unfused


def test_compiled_region_of_a_transposed_input_reported_case():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((40, 30)) * 10.0 ** rng.integers(-3, 4, (40, 30))).astype(np.float32)
    x = x.T
    f = lambda x: tg.sum(tg.square(x * 3.0 + 1.0))  # noqa: E731
    step = tg.compile(f)
    step(x)
    assert step(x).val == tg.withgradient(f, x).val


# --- 4. broadcast's gradients: eager's order of operations, no folding of 0 * x
def eager_and_broadcast(f, loss, x):
    """The gradients of `loss(f)` eagerly and of `loss(broadcast(f))`, fused and generic."""
    eager = tg.gradient(lambda x: loss(f(x)), x)[0]
    found = []
    for fused in (True, False):
        with on_host(fused):
            found.append(tg.gradient(lambda x: loss(tg.broadcast(f, x)), x)[0])
    return eager, found


GRADIENTS = {
    "exp(x) * 0": (lambda x: tg.exp(x) * 0.0, tg.sum),
    "x * x masked": (lambda x: x * x, lambda y: tg.sum(tg.where(y < 0, y, 0.0))),
    "x / x": (lambda x: x / x, tg.sum),
    "sqrt(x) * x": (lambda x: tg.sqrt(x) * x, tg.sum),
    "x * x * 1e300": (lambda x: x * x * 1e300, tg.sum),
    "maximum(x, 0) * 0": (lambda x: tg.maximum(x, 0.0) * 0.0, tg.sum),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_broadcast_gradient_has_eagers_inf_and_nan(name):
    f, loss = GRADIENTS[name]
    x = special_values(np.float64)
    eager, (fused, generic) = eager_and_broadcast(f, loss, x)
    for found in (fused, generic):
        assert same(np.isnan(found), np.isnan(eager))
        assert same(np.isinf(found) & (found > 0), np.isinf(eager) & (eager > 0))
        assert same(np.isinf(found) & (found < 0), np.isinf(eager) & (eager < 0))


def test_broadcast_gradient_reported_cases():
    eager, found = eager_and_broadcast(lambda x: tg.exp(x) * 0.0, tg.sum, np.array([1.0, np.inf]))
    assert np.isnan(eager[1]) and all(same(f, eager) for f in found)
    masked = lambda y: tg.sum(tg.where(y < 0, y, 0.0))  # noqa: E731
    eager, found = eager_and_broadcast(lambda x: x * x, masked, np.array([1e308]))
    assert eager[0] == 0.0 and all(same(f, eager) for f in found)
