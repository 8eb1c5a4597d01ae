"""Reductions: sum prod mean max min var std over every axis combination, keepdims both ways,
on every backend; prod exact at zeros and max/min ties checked against NumPy references."""

import itertools

import numpy as np
import pytest
from helpers import (
    CONTIGUOUS,
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

# name: domain of the input (prod near 1 keeps it well-conditioned)
REDUCTIONS = {
    "sum": (-2.0, 2.0),
    "prod": (0.5, 1.5),
    "mean": (-2.0, 2.0),
    "max": (-2.0, 2.0),
    "min": (-2.0, 2.0),
    "var": (-2.0, 2.0),
    "std": (-2.0, 2.0),
}

# Every axis combination of a 3-d array, with negative axes and a tuple out of order.
AXES = [None, 0, 1, 2, -1, -3, (0, 1), (0, 2), (1, 2), (0, 1, 2), (-1, 0), (2, -3, 1)]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_axes(backend, name, axis, keepdims):
    x = on_backend(backend, uniform((2, 3, 2), REDUCTIONS[name], seed=30))
    f = getattr(tg, name)
    y = f(tg.param(x), axis=axis, keepdims=keepdims)
    expected = getattr(backend.xp, name)(x, axis=axis, keepdims=keepdims)
    assert tuple(y.shape) == tuple(expected.shape)
    np.testing.assert_allclose(numpy_of(backend, y), backend.to_numpy(expected), rtol=1e-12)
    check(backend, lambda x: f(x, axis=axis, keepdims=keepdims), x)


@pytest.mark.parametrize("layout", [TRANSPOSED, STRIDED])
@pytest.mark.parametrize("axis", [None, 0, -1], ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_non_contiguous(backend, name, axis, layout):
    x = on_backend(backend, uniform((3, 4), REDUCTIONS[name], seed=31), layout)
    check(backend, lambda x: getattr(tg, name)(x, axis=axis), x)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_0d(backend, name, keepdims):
    x = on_backend(backend, uniform((), REDUCTIONS[name], seed=32))
    f = getattr(tg, name)
    if name == "std":  # sqrt of a zero variance: the derivative is infinite
        pytest.skip("std of one element has no derivative")
    check(backend, lambda x: f(x, keepdims=keepdims), x)


EVERY_REDUCTION = {
    **{name: getattr(tg, name) for name in REDUCTIONS},
    "logsumexp": tg.logsumexp,
    "softmax": tg.softmax,
    "logsoftmax": tg.logsoftmax,
}


@pytest.mark.parametrize("axis", [0, -1, (0,), 1, -2], ids=str)
@pytest.mark.parametrize("name", EVERY_REDUCTION)
def test_reduction_axis_out_of_range_is_refused_in_the_forward(backend, name, axis):
    """An axis outside the standard's `[-ndim, ndim)` (`axis=0` of a 0-d array included) is
    refused by every reduction when it is called, tracked or not, never by its pullback."""
    x = on_backend(backend, uniform(() if axis in (0, -1, (0,)) else (3,), (0.5, 1.5), seed=33))
    f = EVERY_REDUCTION[name]
    with pytest.raises(ValueError, match="out of range"):
        f(tg.param(x), axis=axis)
    with pytest.raises(ValueError, match="out of range"):
        f(x, axis=axis)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)], ids=str)
@pytest.mark.parametrize("name", ["sum", "prod"])
def test_reduction_empty(backend, name, axis, keepdims):
    x = on_backend(backend, np.zeros((0, 3)))
    f = getattr(tg, name)
    (g,) = check(backend, lambda x: f(x, axis=axis, keepdims=keepdims), x)
    assert tuple(g.shape) == (0, 3)


@pytest.mark.parametrize("axis", [None, 0, 1], ids=str)
def test_prod_of_an_empty_dask_array_in_several_chunks(axis):
    """Its gradient is empty: the products of the others were reshaped, which Dask refuses
    across chunks of an empty array."""
    da = pytest.importorskip("dask.array")
    (g,) = tg.gradient(lambda a: tg.sum(tg.prod(a, axis=axis)), da.zeros((0, 3), chunks=2))
    assert g.compute().shape == (0, 3)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("name", ["mean", "max", "min", "var", "std"])
def test_reduction_empty_along_kept_axis(backend, name, keepdims):
    """An empty axis that is not reduced: an empty result, an empty gradient."""
    x = on_backend(backend, np.zeros((0, 3)))
    check(backend, lambda x: getattr(tg, name)(x, axis=1, keepdims=keepdims), x)


@pytest.mark.parametrize("correction", [0, 1, 1.5])
@pytest.mark.parametrize("axis", [None, 0, (0, -1)], ids=str)
@pytest.mark.parametrize("name", ["var", "std"])
def test_var_std_correction(backend, name, axis, correction):
    values = uniform((3, 4), (-2.0, 2.0), seed=33)
    x = on_backend(backend, values)
    f = getattr(tg, name)
    y = f(tg.param(x), axis=axis, correction=correction)
    np_axis = axis if axis is None else tuple(np.atleast_1d(axis))
    reference = getattr(np, name)(values, axis=np_axis, ddof=correction)
    np.testing.assert_allclose(numpy_of(backend, y), reference, rtol=1e-12)
    check(backend, lambda x: f(x, axis=axis, correction=correction), x)


# --- prod at zeros: the exact gradient, "the product of the others", computed independently
def prod_others(values, axis):
    """For each element, the product of the other elements of its reduction (NumPy, by loops)."""
    axes = tuple(range(values.ndim)) if axis is None else tuple(np.atleast_1d(axis) % values.ndim)
    out = np.empty_like(values)
    for index in np.ndindex(values.shape):
        group = [
            j
            for j in np.ndindex(values.shape)
            if all(j[a] == index[a] for a in range(values.ndim) if a not in axes)
        ]
        out[index] = np.prod([values[j] for j in group if j != index])
    return out


ZEROS = {
    "one zero": np.array([2.0, 0.0, 3.0, -1.5]),
    "two zeros": np.array([0.0, 2.0, 0.0, 3.0]),
    "all zeros": np.zeros(3),
    "matrix": np.array([[0.0, 2.0, 3.0], [1.5, 0.0, 0.0], [2.0, -1.0, 0.5]]),
}


@pytest.mark.parametrize("axis", [None, 0, -1], ids=str)
@pytest.mark.parametrize("case", ZEROS)
def test_prod_at_zeros(backend, case, axis):
    values = ZEROS[case]
    if values.ndim == 1 and axis == 0:
        pytest.skip("same as axis=-1 for a vector")
    weights = uniform(np.prod(values, axis=axis).shape, (0.5, 1.5), seed=34)
    x = on_backend(backend, values)
    w = on_backend(backend, weights)
    (g,) = tg.gradient(lambda x: tg.sum(tg.prod(x, axis=axis) * w), x)
    check_like(backend, g, x)
    expected = prod_others(values, axis) * (
        weights if axis is None else np.expand_dims(weights, axis)
    )
    np.testing.assert_allclose(numpy_of(backend, g), expected, rtol=1e-12, atol=0)


def prod_hessian(values):
    """d2 prod / dx_i dx_j: the product of all but x_i and x_j (zero on the diagonal)."""
    n = values.size
    hessian = np.zeros((n, n))
    for i, j in itertools.permutations(range(n), 2):
        hessian[i, j] = np.prod(np.delete(values, [i, j]))
    return hessian


@pytest.mark.parametrize("case", ["one zero", "two zeros", "all zeros"])
def test_prod_second_derivative_at_zeros(backend, case):
    values = ZEROS[case]
    v = uniform(values.shape, (-1.0, 1.0), seed=35)
    x, direction = on_backend(backend, values), on_backend(backend, v)

    def directional(x):
        (g,) = tg.gradient(tg.prod, x, nest=True)
        return tg.sum(g * direction)

    (hv,) = tg.gradient(directional, x)
    check_like(backend, hv, x)
    np.testing.assert_allclose(numpy_of(backend, hv), prod_hessian(values) @ v, atol=1e-12)


# --- max and min: the gradient is shared evenly among the tied extrema (PyTorch's amax)
def shared_extremum_gradient(values, g, axis, name):
    """NumPy reference: `g` shared evenly among the extrema of each reduction."""
    ndim = values.ndim
    axes = tuple(range(ndim)) if axis is None else tuple(np.atleast_1d(axis) % ndim)
    kept = tuple(a for a in range(ndim) if a not in axes)
    out = np.zeros_like(values)
    g = np.reshape(g, [values.shape[a] for a in kept])
    for outer in np.ndindex(*[values.shape[a] for a in kept]):
        index = [slice(None)] * ndim
        for a, i in zip(kept, outer):
            index[a] = i
        group = values[tuple(index)]  # the reduced axes, in their original order
        extremum = getattr(np, name)(group)
        hits = np.isnan(group) if np.isnan(extremum) else group == extremum
        out[tuple(index)] = np.where(hits, g[outer] / np.count_nonzero(hits), 0.0)
    return out


TIES = np.array([[[3.0, 1.0], [3.0, 3.0], [0.0, 3.0]], [[-1.0, -1.0], [2.0, -1.0], [-1.0, 2.0]]])


@pytest.mark.parametrize("layout", [CONTIGUOUS, TRANSPOSED])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2), (1, 2)], ids=str)
@pytest.mark.parametrize("name", ["max", "min"])
def test_ties_share_the_gradient_evenly(backend, name, axis, layout):
    values = TIES if name == "max" else -TIES
    x = on_backend(backend, values, layout)
    out_shape = np.max(values, axis=axis).shape
    weights = uniform(out_shape, (0.5, 1.5), seed=36)
    w = on_backend(backend, weights)
    (g,) = tg.gradient(lambda x: tg.sum(getattr(tg, name)(x, axis=axis) * w), x)
    check_like(backend, g, x)
    expected = shared_extremum_gradient(values, weights, axis, name)
    np.testing.assert_allclose(numpy_of(backend, g), expected, rtol=1e-15)
    np.testing.assert_allclose(expected.sum(), weights.sum())  # nothing lost, nothing doubled


NANS = np.array(
    [[[3.0, np.nan], [3.0, np.nan], [0.0, 3.0]], [[-1.0, -1.0], [2.0, -1.0], [-1.0, 2.0]]]
)


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2), (1, 2)], ids=str)
@pytest.mark.parametrize("name", ["max", "min"])
def test_a_nan_extremum_gives_the_gradient_to_the_nans(backend, name, axis):
    """A nan loss keeps its gradient: the nans share it (PyTorch's max), not lost as 0."""
    x = on_backend(backend, NANS)
    out_shape = np.max(NANS, axis=axis).shape
    weights = uniform(out_shape, (0.5, 1.5), seed=37)
    _, back = tg.forward(lambda x: getattr(tg, name)(x, axis=axis), x)
    (g,) = back(on_backend(backend, weights))
    expected = shared_extremum_gradient(NANS, weights, axis, name)
    np.testing.assert_allclose(numpy_of(backend, g), expected, rtol=1e-15)
    np.testing.assert_allclose(expected.sum(), weights.sum())


def test_a_nan_extremum_splits_as_pytorchs_max():
    torch = pytest.importorskip("torch")
    for name in ("max", "min"):
        t = torch.tensor(NANS, requires_grad=True)
        getattr(torch, name)(t).backward()
        _, back = tg.forward(getattr(tg, name), NANS)
        np.testing.assert_array_equal(back(np.float64(1.0))[0], t.grad.numpy())


def test_ties_all_equal(backend):
    x = on_backend(backend, np.full((2, 3), 5.0))
    for f in (tg.max, tg.min):
        (g,) = tg.gradient(f, x)
        np.testing.assert_allclose(numpy_of(backend, g), np.full((2, 3), 1 / 6), rtol=1e-15)
        (g,) = tg.gradient(lambda x, f=f: tg.sum(f(x, axis=0)), x)
        np.testing.assert_array_equal(numpy_of(backend, g), np.full((2, 3), 0.5))


# --- float32 in, float32 gradient out
@pytest.mark.parametrize("name", REDUCTIONS)
def test_float32_gives_float32(backend, name):
    values = uniform((3, 4), REDUCTIONS[name], seed=37)
    f = getattr(tg, name)
    x32 = on_backend(backend, values, dtype=np.float32)
    for axis in (None, 1):
        (g32,) = tg.gradient(lambda x, axis=axis: tg.sum(f(x, axis=axis)), x32)
        check_like(backend, g32, x32)
        x64 = on_backend(backend, values)
        (g64,) = tg.gradient(lambda x, axis=axis: tg.sum(f(x, axis=axis)), x64)
        np.testing.assert_allclose(numpy_of(backend, g32), numpy_of(backend, g64), rtol=1e-4)


def test_sum_dtype_float32_of_float64(backend):
    """`dtype=` changes the result's dtype; the gradient comes back as the input's."""
    x = on_backend(backend, uniform((2, 3), (-1.0, 1.0), seed=38))
    (g,) = tg.gradient(lambda x: tg.sum(x, dtype=backend.xp.float32) * 2.0, x)
    check_like(backend, g, x)
    np.testing.assert_allclose(numpy_of(backend, g), np.full((2, 3), 2.0))


# --- second derivatives through the reductions' vjps
@pytest.mark.parametrize("axis", [None, 1], ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_second_derivative(backend, name, axis):
    f = getattr(tg, name)
    x = on_backend(backend, uniform((2, 3), REDUCTIONS[name], seed=39))
    check_nested(backend, lambda x: f(x * x, axis=axis), x)


SQUARES = {
    "sum(x**2)": lambda x: tg.sum(x**2),
    "sum(x*x)": lambda x: tg.sum(x * x),
    "sum(square(x))": lambda x: tg.sum(tg.square(x)),
    "vecdot(x, x)": lambda x: tg.vecdot(x, x),
}


@pytest.mark.parametrize("name", SQUARES)
def test_a_sum_of_squares_has_the_value_of_the_plain_expression(backend, name):
    """Recorded as one `sumabs2` node (for its fused pullback), the value is still that of the
    plain expression, bit for bit: float32 sums of many values differ by order of addition."""
    f = SQUARES[name]
    x = backend.asarray(np.random.default_rng(0).standard_normal(100_000), dtype=np.float32)
    value, (g,) = tg.withgradient(f, x)
    assert np.array_equal(backend.to_numpy(tg.data(value)), backend.to_numpy(f(x)))
    assert np.allclose(backend.to_numpy(g), 2 * backend.to_numpy(x))


def test_vecdot_has_the_value_of_the_plain_vecdot(backend):
    rng = np.random.default_rng(1)
    x, y = (backend.asarray(rng.standard_normal((3, 1000)), dtype=np.float32) for _ in range(2))
    value = tg.vecdot(tg.param(x), y)
    assert np.array_equal(backend.to_numpy(tg.data(value)), backend.to_numpy(tg.vecdot(x, y)))


@pytest.mark.parametrize(
    "name, dtype",
    [("mean", "float16"), ("var", "float16"), ("std", "float16"), ("var", "bfloat16"),
     ("std", "bfloat16")],  # NumPy's own mean sums bfloat16 in bfloat16: stuck at 256
)  # fmt: skip
def test_a_half_dtype_is_averaged_past_its_largest_count(name, dtype):
    """Over 70,000 elements, more than float16 holds (65,504): `var` and `std` came out 0
    and `mean`'s gradient 0 (the count, made float16, was infinite); in bfloat16 `var` came
    out float32. PyTorch, which accumulates half dtypes in float32 too, is the reference."""
    torch = pytest.importorskip("torch")
    half = tg.backend.half_dtype(dtype, np)
    x = (np.random.default_rng(0).standard_normal(70_000) * 0.1 + 1.0).astype(half)
    t = torch.tensor(x.astype(np.float32), dtype=getattr(torch, dtype), requires_grad=True)
    expected = getattr(torch, name)(t, **({} if name == "mean" else {"correction": 0}))
    expected.backward()
    value, (g,) = tg.withgradient(getattr(tg, name), x)
    assert value.dtype == g.dtype == half
    np.testing.assert_allclose(float(value), expected.item(), rtol=2e-2)
    reference = t.grad.float().numpy()
    np.testing.assert_allclose(g.astype(np.float32), reference, rtol=2e-2, atol=1e-7)
    assert np.count_nonzero(g) >= 0.99 * np.count_nonzero(reference) > 0  # (the bug: all 0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_std_is_the_root_of_the_float32_variance(dtype):
    """The variance was rounded to the half dtype before its root: a spread of 3e-5 (variance
    9e-10, below float16's range) gave std 0 and gradient 0, one of 300 gave inf."""
    half = tg.backend.half_dtype(dtype, np)
    tiny = np.array([0.1, 0.1, 0.1, 0.1]).astype(half)
    tiny[1::2] = np.nextafter(tiny[1::2], np.ones(2, half)) if dtype == "float16" else tiny[1::2]
    for x in (tiny, (np.arange(100) * 30.0).astype(half)):
        wide = x.astype(np.float64)
        spread = wide.std()
        value, (g,) = tg.withgradient(tg.std, x)
        assert value.dtype == g.dtype == half
        assert float(value) == float(np.float32(spread).astype(half))
        if spread > 0:  # (x - mean) / (n std), computed in float64
            expected = ((wide - wide.mean()) / (wide.size * spread)).astype(half)
            np.testing.assert_allclose(g.astype(np.float64), expected.astype(np.float64), rtol=1e-2)


def test_half_extrema_count_their_ties_exactly():
    """The ties were counted in the input's dtype: 70,000 in float16 were inf (every gradient
    0), and 257 in bfloat16 were 256."""
    torch = pytest.importorskip("torch")
    (g,) = tg.gradient(tg.min, np.zeros(70_000, np.float16))
    assert g.dtype == np.float16 and np.all(g == np.float16(1 / 70_000))
    t = torch.ones(257, dtype=torch.bfloat16, requires_grad=True)
    torch.amax(t).backward()
    assert torch.equal(tg.gradient(tg.max, torch.ones(257, dtype=torch.bfloat16))[0], t.grad)


INTEGERS = {"uint8": [1, 2, 3, 250], "int8": [-100, 100, 0, 127], "int16": [-30000, 30000, 5, 7],
            "uint32": [0, 3_000_000_000, 1, 2], "int64": [-5, 5, 2**40, 0],
            "bool": [True, False, True, True]}  # fmt: skip


@pytest.mark.parametrize("dtype", INTEGERS)
@pytest.mark.parametrize("name", ["softmax", "logsoftmax", "logsumexp"])
def test_softmax_and_logsumexp_of_integers_are_of_their_values_in_float64(backend, name, dtype):
    """The shift by the row's maximum ran in the integers' own dtype: uint8 wrapped (a
    logsumexp of [1, 2, 3] was inf, its softmax nan), int8 overflowed. SciPy's reference, of
    the same values as float64."""
    special = pytest.importorskip("scipy.special")
    if backend.name == "torch" and dtype == "uint32":
        pytest.skip("PyTorch has no uint32 arrays to speak of")
    values = np.array(INTEGERS[dtype], dtype=dtype)
    x = backend.asarray(values)
    got = backend.to_numpy(getattr(tg, name)(x))
    reference = {"softmax": special.softmax, "logsoftmax": special.log_softmax,
                 "logsumexp": special.logsumexp}[name](values.astype(np.float64))  # fmt: skip
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, reference, rtol=1e-14)
