"""Elementwise rules: every differentiable function against finite differences, on every backend,
with broadcasting, Python scalars on either side, 0-d, empty and non-contiguous inputs."""

import operator

import numpy as np
import pytest
from helpers import (
    CONTIGUOUS,
    STRIDED,
    TRANSPOSED,
    check,
    check_like,
    check_nested,
    is_contiguous_numpy,
    numpy_of,
    on_backend,
    uniform,
)

import tracker_gpu as tg

ANY = (-2.0, 2.0)
POSITIVE = (0.5, 2.0)
NONZERO = ((-2.0, -0.5), (0.5, 2.0))
UNIT = (-0.9, 0.9)

# name: domain of the input
UNARY = {
    "exp": ANY,
    "expm1": ANY,
    "log": POSITIVE,
    "log1p": (-0.5, 2.0),
    "log2": POSITIVE,
    "log10": POSITIVE,
    "sqrt": POSITIVE,
    "square": ANY,
    "reciprocal": NONZERO,
    "sin": (-3.0, 3.0),
    "cos": (-3.0, 3.0),
    "tan": (-1.2, 1.2),
    "asin": UNIT,
    "acos": UNIT,
    "atan": (-3.0, 3.0),
    "sinh": ANY,
    "cosh": ANY,
    "tanh": ANY,
    "asinh": (-3.0, 3.0),
    "acosh": (1.2, 3.0),
    "atanh": UNIT,
    "abs": NONZERO,
    "negative": ANY,
    "positive": ANY,
}

# (shape, layout) of the inputs of unary functions
UNARY_CASES = [
    ((), CONTIGUOUS),
    ((4,), CONTIGUOUS),
    ((4,), STRIDED),
    ((2, 3), CONTIGUOUS),
    ((2, 3), TRANSPOSED),
    ((2, 3), STRIDED),
    ((0,), CONTIGUOUS),
    ((2, 0), CONTIGUOUS),
]


@pytest.mark.parametrize("shape, layout", UNARY_CASES, ids=str)
@pytest.mark.parametrize("name", UNARY)
def test_unary(backend, name, shape, layout):
    x = on_backend(backend, uniform(shape, UNARY[name]), layout)
    if backend.xp is np and layout != CONTIGUOUS:
        assert not is_contiguous_numpy(x)
    check(backend, getattr(tg, name), x)


@pytest.mark.parametrize("shape, layout", UNARY_CASES, ids=str)
def test_sign_has_zero_gradient(backend, shape, layout):
    x = on_backend(backend, uniform(shape, NONZERO), layout)
    grads = check(backend, tg.sign, x, zero=True)
    assert grads[0] is None or not np.any(numpy_of(backend, grads[0]))
    assert np.array_equal(numpy_of(backend, tg.sign(tg.param(x))), np.sign(numpy_of(backend, x)))


# name: (function, domain of x, domain of y)
BINARY = {
    "add": (operator.add, ANY, ANY),
    "subtract": (operator.sub, ANY, ANY),
    "multiply": (operator.mul, ANY, ANY),
    "divide": (operator.truediv, ANY, NONZERO),
    "pow": (operator.pow, POSITIVE, ANY),
    "tg.add": (tg.add, ANY, ANY),
    "tg.subtract": (tg.subtract, ANY, ANY),
    "tg.multiply": (tg.multiply, ANY, ANY),
    "tg.divide": (tg.divide, ANY, NONZERO),
    "tg.pow": (tg.pow, POSITIVE, ANY),
    "remainder": (tg.remainder, (-3.0, 3.0), POSITIVE),
    "remainder-negative": (tg.remainder, (-3.0, 3.0), (-2.0, -0.5)),
    "mod": (operator.mod, (-3.0, 3.0), NONZERO),
    "maximum": (tg.maximum, ANY, ANY),
    "minimum": (tg.minimum, ANY, ANY),
    "atan2": (tg.atan2, ANY, NONZERO),
    "hypot": (tg.hypot, NONZERO, NONZERO),
    "logaddexp": (tg.logaddexp, ANY, ANY),
    "copysign": (tg.copysign, NONZERO, NONZERO),
}

# (shape of x, shape of y, layout of both)
BINARY_CASES = [
    ((3,), (3,), CONTIGUOUS),
    ((2, 3), (3,), CONTIGUOUS),
    ((3,), (2, 3), CONTIGUOUS),
    ((2, 1), (1, 3), CONTIGUOUS),
    ((), (2, 3), CONTIGUOUS),
    ((2, 3), (), CONTIGUOUS),
    ((), (), CONTIGUOUS),
    ((2, 3), (2, 3), TRANSPOSED),
    ((2, 3), (2, 1), STRIDED),
    ((0, 3), (3,), CONTIGUOUS),
    ((2, 0), (2, 1), CONTIGUOUS),
]


@pytest.mark.parametrize("xshape, yshape, layout", BINARY_CASES, ids=str)
@pytest.mark.parametrize("name", BINARY)
def test_binary(backend, name, xshape, yshape, layout):
    f, xdomain, ydomain = BINARY[name]
    x = on_backend(backend, uniform(xshape, xdomain, seed=3), layout)
    y = on_backend(backend, uniform(yshape, ydomain, seed=4), layout)
    check(backend, f, x, y, zero=name == "copysign")


OPERATORS = {
    operator.add: tg.add,
    operator.sub: tg.subtract,
    operator.mul: tg.multiply,
    operator.truediv: tg.divide,
    operator.pow: tg.pow,
    operator.mod: tg.remainder,
}


@pytest.mark.parametrize("name", BINARY)
def test_binary_one_side_tracked(backend, name):
    """A plain array on either side: the tracked argument gets its gradient, the other none."""
    f, xdomain, ydomain = BINARY[name]
    if f in OPERATORS:  # a plain array on the left of an operator: see the test below
        f = OPERATORS[f]
    x = on_backend(backend, uniform((2, 3), xdomain, seed=5))
    y = on_backend(backend, uniform((3,), ydomain, seed=6))
    check(backend, lambda x: f(x, y), x)
    if name != "copysign":
        check(backend, lambda y: f(x, y), y)


@pytest.mark.parametrize("narrow", ["float16", "float32"])
@pytest.mark.parametrize("name", BINARY)
def test_a_narrower_plain_operand_gives_the_results_precision(backend, name, narrow):
    """A float16 or float32 constant beside a tracked float64 array: the value is float64 (the
    constant widened exactly), and so is the derivative, bit for bit the one of the same
    constant given in float64 (`pow` and `atan2` computed `y - 1`, `log(x)`, `x * x` in
    the constant's dtype: errors of 2e-4 in a float64 gradient)."""
    f, xdomain, ydomain = BINARY[name]
    f = OPERATORS.get(f, f)
    if narrow == "float16" and not hasattr(backend.xp, "float16"):
        pytest.skip(f"{backend.name} has no float16")
    x, y = uniform((2, 3), xdomain, seed=7), uniform((3,), ydomain, seed=8)
    sides = [(lambda t, c: f(t, c), x, y), (lambda t, c: f(c, t), y, x)]  # the constant right, left
    for h, tracked, constant in sides:
        narrow_c = constant.astype(narrow)
        t = on_backend(backend, tracked)
        grads = []
        for c in (narrow_c, narrow_c.astype(np.float64)):
            c = on_backend(backend, c)
            grads.append(tg.gradient(lambda t, c=c, h=h: tg.sum(h(t, c)), t)[0])
        if grads[1] is None:  # copysign's sign source has no gradient
            assert grads[0] is None
            continue
        np.testing.assert_array_equal(numpy_of(backend, grads[0]), numpy_of(backend, grads[1]))


def test_plain_numpy_array_on_the_left(backend):
    """NumPy defers to the tracked array's reflected operators."""
    if backend.xp is not np:
        pytest.skip("only NumPy arrays defer to a foreign right operand")
    a = uniform((2, 3), POSITIVE, seed=7)
    y = uniform((3,), POSITIVE, seed=8)
    for op in (operator.add, operator.sub, operator.mul, operator.truediv, operator.pow):
        check(backend, lambda y, op=op: op(a, y), y)


# name: (function of x, domain of x); Python scalars on either side keep x's dtype
SCALAR_OPERANDS = {
    "x+2": (lambda x: x + 2.0, ANY),
    "2+x": (lambda x: 2.0 + x, ANY),
    "x+1int": (lambda x: x + 1, ANY),
    "x-2": (lambda x: x - 2.0, ANY),
    "2-x": (lambda x: 2.0 - x, ANY),
    "x*3": (lambda x: x * 3.0, ANY),
    "3*x": (lambda x: 3 * x, ANY),
    "x/2": (lambda x: x / 2.0, ANY),
    "2/x": (lambda x: 2.0 / x, NONZERO),
    "x**2": (lambda x: x**2, ANY),
    "x**3": (lambda x: x**3, ANY),
    "x**0.5": (lambda x: x**0.5, POSITIVE),
    "x**-1.5": (lambda x: x**-1.5, POSITIVE),
    "2**x": (lambda x: 2.0**x, ANY),
    "x%1.5": (lambda x: x % 1.5, (0.1, 1.4)),
    "5%x": (lambda x: 5.0 % x, (1.1, 1.6)),
    "-x": (lambda x: -x, ANY),
    "+x": (lambda x: +x, ANY),
    "abs(x)": (lambda x: abs(x), NONZERO),
    "maximum(x,0)": (lambda x: tg.maximum(x, 0.0), NONZERO),
    "maximum(0,x)": (lambda x: tg.maximum(0.0, x), NONZERO),
    "minimum(x,0)": (lambda x: tg.minimum(x, 0.0), NONZERO),
    "minimum(1,x)": (lambda x: tg.minimum(1.0, x), ANY),
    "pow(x,2)": (lambda x: tg.pow(x, 2.0), ANY),
    "pow(2,x)": (lambda x: tg.pow(2.0, x), ANY),
    "atan2(x,1)": (lambda x: tg.atan2(x, 1.0), ANY),
    "atan2(1,x)": (lambda x: tg.atan2(1.0, x), ANY),
    "hypot(2,x)": (lambda x: tg.hypot(2.0, x), ANY),
    "logaddexp(x,0)": (lambda x: tg.logaddexp(x, 0.0), ANY),
    "copysign(x,-1)": (lambda x: tg.copysign(x, -1.0), NONZERO),
    "remainder(x,1.5)": (lambda x: tg.remainder(x, 1.5), (0.1, 1.4)),
    "remainder(5,x)": (lambda x: tg.remainder(5.0, x), (1.1, 1.6)),
}


@pytest.mark.parametrize("shape", [(), (2, 3)], ids=str)
@pytest.mark.parametrize("name", SCALAR_OPERANDS)
def test_python_scalar_operand(backend, name, shape):
    f, domain = SCALAR_OPERANDS[name]
    check(backend, f, on_backend(backend, uniform(shape, domain, seed=9)))


def test_remainder_matches_numpy_definition(backend):
    """remainder's forward is Python's (the sign of the divisor); d/dy = -floor(x / y)."""
    x = uniform((5,), (-3.0, 3.0), seed=10)
    y = uniform((5,), NONZERO, seed=11)
    gx, gy = tg.gradient(
        lambda x, y: tg.sum(tg.remainder(x, y)), on_backend(backend, x), on_backend(backend, y)
    )
    np.testing.assert_allclose(numpy_of(backend, gx), np.ones(5))
    np.testing.assert_allclose(numpy_of(backend, gy), -np.floor(x / y))


def test_pow_at_zero_base(backend):
    """At x = 0: d/dx x**0 = 0 and d/dy x**y = 0 for y > 0 (not NaN), as JAX and PyTorch."""
    x = on_backend(backend, [0.0, 0.0, 0.0, 2.0])
    y = on_backend(backend, [0.0, 1.0, 2.5, 0.0])
    gx, gy = tg.gradient(lambda x, y: tg.sum(x**y), x, y)
    np.testing.assert_array_equal(numpy_of(backend, gx), [0.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(numpy_of(backend, gy), [0.0, 0.0, 0.0, np.log(2.0)])
    (g,) = tg.gradient(lambda x: tg.sum(x**0), x)
    np.testing.assert_array_equal(numpy_of(backend, g), np.zeros(4))
    (g,) = tg.gradient(lambda y: tg.sum(0.0**y), on_backend(backend, [1.0, 2.5]))
    np.testing.assert_array_equal(numpy_of(backend, g), [0.0, 0.0])
    check_nested(backend, lambda y: tg.pow(x, y), on_backend(backend, [0.5, 1.0, 2.5, 1.0]))


def test_astype_gradient_has_the_input_dtype(backend):
    x = on_backend(backend, uniform((2, 3), ANY, seed=23))
    w = uniform((2, 3), POSITIVE, seed=24)
    w32 = on_backend(backend, w, dtype=np.float32)
    (g,) = tg.gradient(lambda x: tg.sum(tg.astype(x, backend.xp.float32) * w32), x)
    check_like(backend, g, x)
    np.testing.assert_allclose(numpy_of(backend, g), w.astype(np.float32))


def test_abs_and_maximum_at_ties(backend):
    """Documented choices at kinks (PyTorch's): abs'(+-0) = 0; maximum/minimum split ties
    evenly (more in test_edges.py)."""
    (g,) = tg.gradient(lambda x: tg.sum(tg.abs(x)), on_backend(backend, [0.0, -1.0, 2.0, -0.0]))
    np.testing.assert_array_equal(numpy_of(backend, g), [0.0, -1.0, 1.0, 0.0])
    x = on_backend(backend, [1.0, 2.0, 3.0])
    for f in (tg.maximum, tg.minimum):
        y = on_backend(backend, [1.0, 0.0, 3.0])
        gx, gy = tg.gradient(lambda a, b, f=f: tg.sum(f(a, b)), x, y)
        np.testing.assert_array_equal(numpy_of(backend, gx), [0.5, f is tg.maximum, 0.5])
        np.testing.assert_array_equal(numpy_of(backend, gy), [0.5, f is tg.minimum, 0.5])


# --- where and clip
@pytest.mark.parametrize(
    "cshape, xshape, yshape",
    [((5,), (5,), (5,)), ((2, 3), (3,), (2, 1)), ((2, 3), (), (2, 3)), ((0, 3), (3,), ())],
    ids=str,
)
def test_where(backend, cshape, xshape, yshape):
    c = backend.asarray(uniform(cshape, ANY, seed=12) > 0)
    x = on_backend(backend, uniform(xshape, ANY, seed=13))
    y = on_backend(backend, uniform(yshape, ANY, seed=14))
    check(backend, lambda x, y: tg.where(c, x, y), x, y)
    check(backend, lambda x: tg.where(c, x, 0.0), x)
    check(backend, lambda y: tg.where(c, -1.0, y), y)


def test_where_sends_gradient_by_condition(backend):
    c = backend.asarray(np.array([True, False, True]))
    gx, gy = tg.gradient(
        lambda x, y: tg.sum(tg.where(c, x, y) * 2.0),
        on_backend(backend, [1.0, 2.0, 3.0]),
        on_backend(backend, [4.0, 5.0, 6.0]),
    )
    np.testing.assert_array_equal(numpy_of(backend, gx), [2.0, 0.0, 2.0])
    np.testing.assert_array_equal(numpy_of(backend, gy), [0.0, 2.0, 0.0])


CLIPS = {
    "both": lambda x: tg.clip(x, -0.5, 0.5),
    "min": lambda x: tg.clip(x, -0.5),
    "max": lambda x: tg.clip(x, max=0.5),
    "none": lambda x: tg.clip(x),
}


@pytest.mark.parametrize("layout", [CONTIGUOUS, TRANSPOSED], ids=str)
@pytest.mark.parametrize("name", CLIPS)
def test_clip_scalar_bounds(backend, name, layout):
    check(backend, CLIPS[name], on_backend(backend, uniform((3, 4), ANY, seed=15), layout))


def test_clip_tracked_bounds(backend):
    x = on_backend(backend, uniform((3, 4), ANY, seed=16))
    lo = on_backend(backend, uniform((4,), (-1.5, 0.0), seed=17))
    hi = on_backend(backend, uniform((3, 1), (0.0, 1.5), seed=18))
    check(backend, lambda x, lo, hi: tg.clip(x, lo, hi), x, lo, hi)
    check(backend, lambda lo: tg.clip(x, min=lo), lo)
    check(backend, lambda hi: tg.clip(x, max=hi), hi)


def test_clip_gradient_by_position(backend):
    """Inside (bounds included) the gradient goes to x; outside, to the bound that clips."""
    x = on_backend(backend, [-2.0, -1.0, 0.0, 1.0, 2.0])
    lo = on_backend(backend, [-1.0] * 5)
    hi = on_backend(backend, [1.0] * 5)
    gx, glo, ghi = tg.gradient(lambda *a: tg.sum(tg.clip(*a)), x, lo, hi)
    np.testing.assert_array_equal(numpy_of(backend, gx), [0, 1, 1, 1, 0])
    np.testing.assert_array_equal(numpy_of(backend, glo), [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(numpy_of(backend, ghi), [0, 0, 0, 0, 1])


def test_clip_crossed_bounds_count_the_gradient_once(backend):
    """Where `min > max` the value is `max` (NumPy's and the standard's): the gradient goes to
    `max` alone, once (PyTorch's convention), none to `x` or `min`."""
    if backend.name.startswith("strict"):
        pytest.skip("array-api-strict refuses min > max, which the standard leaves unspecified")
    x = on_backend(backend, [-3.0, 1.5, 3.0, 1.5])
    lo = on_backend(backend, [2.0, 2.0, 2.0, 1.0])
    hi = on_backend(backend, [1.0, 1.0, 1.0, 2.0])
    y = tg.clip(x, lo, hi)
    np.testing.assert_array_equal(numpy_of(backend, y), [1.0, 1.0, 1.0, 1.5])
    gx, glo, ghi = tg.gradient(lambda *a: tg.sum(tg.clip(*a)), x, lo, hi)
    np.testing.assert_array_equal(numpy_of(backend, gx), [0, 0, 0, 1])
    np.testing.assert_array_equal(numpy_of(backend, glo), [0, 0, 0, 0])
    np.testing.assert_array_equal(numpy_of(backend, ghi), [1, 1, 1, 0])


# --- non-differentiable functions give plain arrays
PLAIN = {
    "floor": lambda x, y: tg.floor(x),
    "ceil": lambda x, y: tg.ceil(x),
    "round": lambda x, y: tg.round(x),
    "trunc": lambda x, y: tg.trunc(x),
    "signbit": lambda x, y: tg.signbit(x),
    "isnan": lambda x, y: tg.isnan(x),
    "isinf": lambda x, y: tg.isinf(x),
    "isfinite": lambda x, y: tg.isfinite(x),
    "floor_divide": lambda x, y: tg.floor_divide(x, y),
    "x//y": lambda x, y: x // y,
    "x//2": lambda x, y: x // 2.0,
    "3//x": lambda x, y: 3.0 // x,
    "equal": lambda x, y: tg.equal(x, y),
    "not_equal": lambda x, y: tg.not_equal(x, y),
    "less": lambda x, y: tg.less(x, y),
    "less_equal": lambda x, y: tg.less_equal(x, y),
    "greater": lambda x, y: tg.greater(x, y),
    "greater_equal": lambda x, y: tg.greater_equal(x, y),
    "x<y": lambda x, y: x < y,
    "x<=y": lambda x, y: x <= y,
    "x>y": lambda x, y: x > y,
    "x>=y": lambda x, y: x >= y,
    "x==y": lambda x, y: x == y,
    "x!=y": lambda x, y: x != y,
    "x<0": lambda x, y: x < 0.0,
}
PLAIN_REFERENCE = {
    "floor": lambda x, y: np.floor(x),
    "ceil": lambda x, y: np.ceil(x),
    "round": lambda x, y: np.round(x),
    "trunc": lambda x, y: np.trunc(x),
    "signbit": lambda x, y: np.signbit(x),
    "isnan": lambda x, y: np.isnan(x),
    "isinf": lambda x, y: np.isinf(x),
    "isfinite": lambda x, y: np.isfinite(x),
    "floor_divide": np.floor_divide,
    "x//y": np.floor_divide,
    "x//2": lambda x, y: x // 2.0,
    "3//x": lambda x, y: 3.0 // x,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "x<y": np.less,
    "x<=y": np.less_equal,
    "x>y": np.greater,
    "x>=y": np.greater_equal,
    "x==y": np.equal,
    "x!=y": np.not_equal,
    "x<0": lambda x, y: x < 0.0,
}


@pytest.mark.parametrize("name", PLAIN)
def test_non_differentiable_gives_plain(backend, name):
    x = np.array([[-1.5, 0.5, 2.5], [1.0, -0.25, 3.0]])
    y = np.array([1.0, 0.5, -2.0])
    tx, ty = tg.param(backend.asarray(x)), tg.param(backend.asarray(y))
    for args in ((tx, ty), (tx, backend.asarray(y))):
        out = PLAIN[name](*args)
        assert not tg.istracked(out)
        np.testing.assert_array_equal(backend.to_numpy(out), PLAIN_REFERENCE[name](x, y))


def test_comparison_with_tracked_on_both_sides(backend):
    x = tg.param(backend.asarray([1.0, 2.0]))
    y = tg.param(backend.asarray([2.0, 2.0]))
    for out, expected in ((x < y, [True, False]), (x == y, [False, True]), (x >= y, [0, 1])):
        assert not tg.istracked(out)
        np.testing.assert_array_equal(backend.to_numpy(out), expected)


# --- float32 stays float32
FLOAT32 = {
    **{name: (getattr(tg, name), domain) for name, domain in UNARY.items()},
    **{name: SCALAR_OPERANDS[name] for name in ("x+2", "2-x", "3*x", "2/x", "x**2", "2**x")},
    "maximum(x,0)": SCALAR_OPERANDS["maximum(x,0)"],
    "clip": (CLIPS["both"], ANY),
    "where": (lambda x: tg.where(x > 0.0, x, x * 0.5), NONZERO),
}


@pytest.mark.parametrize("name", FLOAT32)
def test_float32_gives_float32(backend, name):
    f, domain = FLOAT32[name]
    values = uniform((2, 3), domain, seed=19)
    x32 = on_backend(backend, values, dtype=np.float32)
    (g32,) = tg.gradient(lambda x: tg.sum(f(x)), x32)
    check_like(backend, g32, x32)
    (g64,) = tg.gradient(lambda x: tg.sum(f(x)), on_backend(backend, values))
    np.testing.assert_allclose(numpy_of(backend, g32), numpy_of(backend, g64), rtol=1e-4, atol=1e-5)


def test_float32_binary_with_float32_arrays(backend):
    x = on_backend(backend, uniform((2, 3), POSITIVE, seed=20), dtype=np.float32)
    y = on_backend(backend, uniform((3,), POSITIVE, seed=21), dtype=np.float32)
    for f in (tg.add, tg.multiply, tg.divide, tg.pow, tg.atan2, tg.hypot, tg.logaddexp):
        for g, a in zip(tg.gradient(lambda a, b, f=f: tg.sum(f(a, b)), x, y), (x, y)):
            check_like(backend, g, a)


# --- second derivatives: the vjps are themselves differentiable
NESTED = {name: (getattr(tg, name), UNARY[name]) for name in UNARY}
NESTED.update(
    {
        name: (lambda x, f=BINARY[name][0]: f(x, x * 0.5 + 1.0), BINARY[name][1])
        for name in ("multiply", "divide", "pow", "atan2", "hypot", "logaddexp", "maximum")
    }
)
NESTED["where"] = (lambda x: tg.where(x > 0.0, x * x, x * 3.0), NONZERO)
NESTED["clip"] = (lambda x: tg.clip(x * x, 0.5, 2.0), NONZERO)
NESTED["2**x"] = (lambda x: 2.0**x, ANY)


@pytest.mark.parametrize("name", NESTED)
def test_second_derivative(backend, name):
    f, domain = NESTED[name]
    check_nested(backend, f, on_backend(backend, uniform((2, 3), domain, seed=22)))


@pytest.mark.parametrize("name", ["expm1", "elu", "selu", "celu"])
def test_the_slope_of_expm1_keeps_its_digits_far_below_zero(name):
    """expm1' was ans + 1, which cancels: 2e-5 off at -30, and 0 at -40 where the slope is
    4.2e-18; the slope is exp(x) (times the activation's scale)."""
    from tracker_gpu import nn

    f = tg.expm1 if name == "expm1" else getattr(nn, name)
    x = np.array([-10.0, -20.0, -30.0, -40.0, -700.0])
    if name == "expm1":  # (PyTorch's own expm1' is result + 1, with the same cancellation)
        expected = np.exp(x)
    else:
        torch = pytest.importorskip("torch")
        t = torch.tensor(x, requires_grad=True)
        (expected,) = torch.autograd.grad(getattr(torch.nn.functional, name)(t).sum(), t)
        expected = expected.numpy()
    (found,) = tg.gradient(lambda v: tg.sum(f(v)), x)
    np.testing.assert_allclose(found, expected, rtol=1e-14)
    assert np.all(found > 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("exponent", [2, 2.0])
def test_the_squares_pullback_is_the_powers_formula_bit_for_bit(dtype, exponent):
    """The pullback of `x ** 2` reads `x` where the formula reads `x ** 1`: the same bits over
    the whole domain. (In half precision the fused kernels of the numpy-fused row compute in
    float32 and round once, within the units in the last place that the fuzzer allows.)"""
    from domain import domain, special_values

    x = np.concatenate([special_values(dtype), domain(200, dtype, seed=3)])
    g = domain(x.shape, dtype, seed=4)
    with np.errstate(all="ignore"):  # the domain's overflows
        (got,) = tg.forward(lambda v: v**exponent, x)[1](g)
        expected = g * exponent * x ** (exponent - 1)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got.view(f"u{x.itemsize}"), expected.view(f"u{x.itemsize}"))
