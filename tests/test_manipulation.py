"""Manipulation, indexing, scan and sorting functions: values against array-api-compat's NumPy,
gradients against finite differences, on every backend; exact gradients of cumulative_prod at
zeros against an independent reference; non-differentiable functions return plain arrays."""

import array_api_compat
import array_api_compat.numpy as cnp
import numpy as np
import pytest
from helpers import check, check_like, check_nested

import tracker_gpu as tg

# id: (shapes of the inputs, f(ns, ix, *xs)) with `ns` the namespace (tg, or array-api-compat's
# NumPy for the reference value) and `ix` making an integer index array from a list.
CASES = {
    "cumsum-1d": (((5,),), lambda ns, ix, x: ns.cumulative_sum(x)),
    "cumsum-axis0": (((3, 4),), lambda ns, ix, x: ns.cumulative_sum(x, axis=0)),
    "cumsum-initial": (
        ((3, 4),),
        lambda ns, ix, x: ns.cumulative_sum(x, axis=-1, include_initial=True),
    ),
    "cumsum-3d-dtype": (
        ((2, 3, 2),),
        lambda ns, ix, x: ns.cumulative_sum(x, axis=-2, dtype=x.dtype),
    ),
    "cumsum-empty": (((2, 0),), lambda ns, ix, x: ns.cumulative_sum(x, axis=1)),
    "cumsum-empty-initial": (
        ((0,),),
        lambda ns, ix, x: ns.cumulative_sum(x, include_initial=True),
    ),
    "cumprod-1d": (((6,),), lambda ns, ix, x: ns.cumulative_prod(x)),
    "cumprod-axis0": (((4, 3),), lambda ns, ix, x: ns.cumulative_prod(x, axis=0)),
    "cumprod-initial": (
        ((3, 5),),
        lambda ns, ix, x: ns.cumulative_prod(x, axis=-1, include_initial=True),
    ),
    "cumprod-3d": (((2, 3, 2),), lambda ns, ix, x: ns.cumulative_prod(x, axis=1)),
    "cumprod-one": (((1,),), lambda ns, ix, x: ns.cumulative_prod(x)),
    "cumprod-empty": (((3, 0),), lambda ns, ix, x: ns.cumulative_prod(x, axis=-1)),
    "take-1d-repeated": (((5,),), lambda ns, ix, x: ns.take(x, ix([0, 2, 2, 4, 2]))),
    "take-axis0": (((3, 4),), lambda ns, ix, x: ns.take(x, ix([2, 0, 2]), axis=0)),
    "take-axis-1-negative": (
        ((3, 4),),
        lambda ns, ix, x: ns.take(x, ix([-1, 0, 3, 3]), axis=-1),
    ),
    "take-3d": (((2, 3, 2),), lambda ns, ix, x: ns.take(x, ix([1, 1, 0]), axis=1)),
    "take-empty": (((3, 4),), lambda ns, ix, x: ns.take(x, ix([]), axis=1)),
    "take_along-last": (
        ((3, 4),),
        lambda ns, ix, x: ns.take_along_axis(x, ix([[0, 3], [1, 1], [-1, 2]])),
    ),
    "take_along-axis0": (
        ((3, 2),),
        lambda ns, ix, x: ns.take_along_axis(x, ix([[2, 0], [2, 2], [0, 1], [1, 1]]), axis=0),
    ),
    "take_along-broadcast": (
        ((3, 4),),
        lambda ns, ix, x: ns.take_along_axis(x, ix([[1, 1, 3]]), axis=1),
    ),
    "take_along-3d": (
        ((2, 3, 2),),
        lambda ns, ix, x: ns.take_along_axis(x, ix([[[0, 1]], [[2, 2]]]), axis=-2),
    ),
    "moveaxis": (((2, 3, 4),), lambda ns, ix, x: ns.moveaxis(x, 0, -1)),
    "moveaxis-tuple": (((2, 3, 4),), lambda ns, ix, x: ns.moveaxis(x, (0, -1), (-1, 1))),
    "repeat-flat": (((2, 3),), lambda ns, ix, x: ns.repeat(x, 2)),
    "repeat-axis1": (((2, 3),), lambda ns, ix, x: ns.repeat(x, 3, axis=1)),
    "repeat-zero": (((2, 3),), lambda ns, ix, x: ns.repeat(x, 0, axis=-1)),
    "repeat-array": (((3, 2),), lambda ns, ix, x: ns.repeat(x, ix([1, 0, 3]), axis=0)),
    "repeat-0d": (((),), lambda ns, ix, x: ns.repeat(x, 3)),
    "tile-1d": (((3,),), lambda ns, ix, x: ns.tile(x, (2,))),
    "tile-more-reps": (((2, 3),), lambda ns, ix, x: ns.tile(x, (2, 1, 2))),
    "tile-fewer-reps": (((2, 3),), lambda ns, ix, x: ns.tile(x, (3,))),
    "tile-0d": (((),), lambda ns, ix, x: ns.tile(x, (2, 2))),
    "roll-1d": (((5,),), lambda ns, ix, x: ns.roll(x, 2)),
    "roll-axis0": (((3, 4),), lambda ns, ix, x: ns.roll(x, -1, axis=0)),
    "roll-tuple": (((3, 4),), lambda ns, ix, x: ns.roll(x, (1, -6), axis=(0, -1))),
    "roll-same-axis": (((3, 4),), lambda ns, ix, x: ns.roll(x, (1, 2), axis=(1, 1))),
    "roll-flat": (((3, 4),), lambda ns, ix, x: ns.roll(x, 5)),
    "roll-0d": (((),), lambda ns, ix, x: ns.roll(x, 3)),
    "unstack-axis0": (
        ((3, 2),),
        lambda ns, ix, x: ns.stack([u * (i + 1.0) for i, u in enumerate(ns.unstack(x))]),
    ),
    "unstack-axis-1": (
        ((2, 3, 2),),
        lambda ns, ix, x: ns.concat(ns.unstack(x, axis=-1)[::-1], axis=0),
    ),
    "sort-1d": (((6,),), lambda ns, ix, x: ns.sort(x)),
    "sort-axis0-descending": (((4, 3),), lambda ns, ix, x: ns.sort(x, axis=0, descending=True)),
    "sort-unstable": (((3, 4),), lambda ns, ix, x: ns.sort(x, axis=-1, stable=False)),
    "diff-1d": (((5,),), lambda ns, ix, x: ns.diff(x)),
    "diff-axis0-n2": (((4, 3),), lambda ns, ix, x: ns.diff(x, axis=0, n=2)),
    "diff-n0": (((2, 3),), lambda ns, ix, x: ns.diff(x, n=0)),
    "diff-too-short": (((1, 3),), lambda ns, ix, x: ns.diff(x, axis=0)),
    "diff-prepend-append": (
        ((2, 3), (2, 1), (2, 2)),
        lambda ns, ix, x, p, a: ns.diff(x, axis=1, n=2, prepend=p, append=a),
    ),
    "diff-prepend-axis0": (
        ((2, 3), (1, 3)),
        lambda ns, ix, x, p: ns.diff(x, axis=-2, prepend=p),
    ),
    "diff-scalar-edges": (
        ((2, 3),),
        lambda ns, ix, x: ns.diff(x, axis=0, prepend=1.5, append=-0.5),
    ),
    "meshgrid-xy": (((3,), (2,)), lambda ns, ix, x, y: ns.stack(ns.meshgrid(x, y))),
    "meshgrid-ij-3": (
        ((3,), (2,), (2,)),
        lambda ns, ix, x, y, z: ns.stack(ns.meshgrid(x, y, z, indexing="ij")),
    ),
    "meshgrid-xy-3": (
        ((2,), (3,), (2,)),
        lambda ns, ix, x, y, z: ns.stack(ns.meshgrid(x, y, z)),
    ),
    "broadcast_arrays": (
        ((3, 1), (4,), ()),
        lambda ns, ix, x, y, z: ns.stack(ns.broadcast_arrays(x, y, z)),
    ),
}

# Cases whose second derivative is checked too (the cheap ones of each family).
NESTED = [
    "cumsum-initial",
    "cumprod-initial",
    "cumprod-axis0",
    "take-1d-repeated",
    "take-axis0",
    "take_along-broadcast",
    "repeat-array",
    "repeat-axis1",
    "tile-more-reps",
    "roll-tuple",
    "sort-axis0-descending",
    "diff-axis0-n2",
    "unstack-axis0",
]


def _inputs(backend, shapes):
    arrays = [np.random.default_rng(k).uniform(-2.0, 2.0, size=s) for k, s in enumerate(shapes)]
    return arrays, [backend.asarray(a) for a in arrays]


def _index(backend):
    return lambda values: backend.asarray(np.array(values, dtype=np.int64))


def _np_index(values):
    return np.array(values, dtype=np.int64)


@pytest.mark.parametrize("name", CASES)
def test_value_and_gradient(backend, name):
    shapes, f = CASES[name]
    arrays, xs = _inputs(backend, shapes)
    ix = _index(backend)
    expected = f(cnp, _np_index, *arrays)
    np.testing.assert_allclose(backend.to_numpy(f(tg, ix, *xs)), expected, rtol=1e-12)
    tracked = f(tg, ix, *[tg.param(x) for x in xs])
    assert tg.istracked(tracked)
    np.testing.assert_allclose(backend.to_numpy(tg.data(tracked)), expected, rtol=1e-12)
    check(backend, lambda *a: f(tg, ix, *a), *xs)


@pytest.mark.parametrize("name", NESTED)
def test_second_derivative(backend, name):
    shapes, f = CASES[name]
    _, xs = _inputs(backend, shapes)
    ix = _index(backend)
    check_nested(backend, lambda *a: f(tg, ix, *a), *xs)


# --- cumulative_prod at zeros: exact, against sums of products that leave one element out
def _cumprod_grad_reference(x, w):
    """d/dx[j] sum_k w[k] prod_{i<=k} x[i], by brute force over the 1-d x."""
    n = len(x)
    g = np.zeros(n)
    for j in range(n):
        for k in range(j, n):
            g[j] += w[k] * np.prod(np.delete(x[: k + 1], j))
    return g


def _cumprod_hessian_reference(x, w):
    n = len(x)
    h = np.zeros((n, n))
    for j in range(n):
        for m in range(n):
            if j != m:
                for k in range(max(j, m), n):
                    h[j, m] += w[k] * np.prod(np.delete(x[: k + 1], [j, m]))
    return h


ZEROS = [
    [2.0, 0.0, 3.0, -1.5, 0.5],
    [0.0, 1.5, 2.0, -0.5],
    [1.5, -2.0, 0.0, 0.0, 3.0, 0.7],
    [0.0, 0.0, 0.0],
    [1.2, 0.8, -1.1, 0.0],
]


@pytest.mark.parametrize("values", ZEROS, ids=str)
def test_cumulative_prod_gradient_exact_at_zeros(backend, values):
    x_np = np.array(values)
    w_np = np.random.default_rng(3).uniform(0.5, 1.5, size=x_np.shape)
    x, w = backend.asarray(x_np), backend.asarray(w_np)
    g = tg.gradient(lambda x: tg.sum(tg.cumulative_prod(x) * w), x)[0]
    check_like(backend, g, x)
    np.testing.assert_allclose(
        backend.to_numpy(g), _cumprod_grad_reference(x_np, w_np), rtol=1e-13, atol=1e-13
    )
    # the second derivative too: a Hessian-vector product against the brute-force Hessian
    v_np = np.random.default_rng(4).uniform(-1.0, 1.0, size=x_np.shape)
    v = backend.asarray(v_np)

    def first_dot_v(x):
        first = tg.gradient(lambda y: tg.sum(tg.cumulative_prod(y) * w), x, nest=True)[0]
        return tg.sum(first * v)

    hv = tg.gradient(first_dot_v, x)[0]
    check_like(backend, hv, x)
    np.testing.assert_allclose(
        backend.to_numpy(hv), _cumprod_hessian_reference(x_np, w_np) @ v_np, rtol=1e-12, atol=1e-13
    )


@pytest.mark.parametrize("axis, include_initial", [(0, False), (1, True), (-1, False)])
def test_cumulative_prod_gradient_exact_at_zeros_2d(backend, axis, include_initial):
    x_np = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 1.5], [1.5, -1.0, 0.0]])
    w_np = np.random.default_rng(5).uniform(0.5, 1.5, size=(3, 4) if include_initial else (3, 3))
    if axis == 0:
        w_np = w_np.T.copy()
    x, w = backend.asarray(x_np), backend.asarray(w_np)

    def f(x):
        return tg.sum(tg.cumulative_prod(x, axis=axis, include_initial=include_initial) * w)

    g = tg.gradient(f, x)[0]
    check_like(backend, g, x)
    moved_x, moved_w = np.moveaxis(x_np, axis, -1), np.moveaxis(w_np, axis, -1)
    if include_initial:
        moved_w = moved_w[..., 1:]
    expected = np.stack([_cumprod_grad_reference(r, s) for r, s in zip(moved_x, moved_w)])
    np.testing.assert_allclose(backend.to_numpy(g), np.moveaxis(expected, -1, axis), atol=1e-13)


def test_cumulative_prod_large_and_tiny_values(backend):
    # no division: a gradient stays finite and right where a quotient by 0 or by a denormal
    # product would not
    x_np = np.array([1e-200, 1e-200, 0.0, 1e200, 3.0])
    x = backend.asarray(x_np)
    g = tg.gradient(lambda x: tg.sum(tg.cumulative_prod(x)), x)[0]
    np.testing.assert_allclose(backend.to_numpy(g), _cumprod_grad_reference(x_np, np.ones(5)))
    assert np.all(np.isfinite(backend.to_numpy(g)))


@pytest.mark.parametrize("name", ["cumulative_sum", "cumulative_prod"])
def test_scan_dtype_gives_the_output_dtype_and_the_gradient_the_input_dtype(backend, name):
    x = backend.asarray(np.array([[1.0, 2.0, 0.5], [3.0, -1.0, 2.0]]))
    f = getattr(tg, name)
    out = f(tg.param(x), axis=1, dtype=backend.xp.float32)
    assert out.dtype == backend.xp.float32
    g = tg.gradient(lambda x: tg.sum(f(x, axis=1, dtype=backend.xp.float32)), x)[0]
    check_like(backend, g, x)
    g64 = tg.gradient(lambda x: tg.sum(f(x, axis=1)), x)[0]
    np.testing.assert_allclose(backend.to_numpy(g), backend.to_numpy(g64), rtol=1e-6)


# --- take and sort: where the gradient goes
def test_take_repeated_indices_accumulate(backend):
    x = backend.asarray(np.arange(8.0).reshape(2, 4))
    index = backend.asarray(np.array([3, 1, 3, 3], dtype=np.int64))
    g = tg.gradient(lambda x: tg.sum(tg.take(x, index, axis=1)), x)[0]
    check_like(backend, g, x)
    np.testing.assert_array_equal(backend.to_numpy(g), [[0, 1, 0, 3], [0, 1, 0, 3]])


INDEX_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64"]


# how each function reads index arrays: f(ns, x, index), `ns` tg or NumPy's (the reference)
INDEXING = {
    "take axis 0": lambda ns, x, i: ns.take(x, i, axis=0),
    "take axis 1": lambda ns, x, i: ns.take(x, i, axis=1),
    "x[i, 1]": lambda ns, x, i: x[i, 1],
    "x[1, i]": lambda ns, x, i: x[1, i],
    "take_along_axis": lambda ns, x, i: ns.take_along_axis(x, ns.stack([i] * 3), axis=1),
}


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("how", list(INDEXING))
def test_indices_of_every_integer_dtype(backend, dtype, how):
    """As NumPy takes them (PyTorch's indexing and `take` refuse the narrow ones, and read
    uint8 as a mask)."""
    values = np.arange(12.0).reshape(3, 4)
    x = backend.asarray(values)
    index = backend.asarray(np.array([2, 0, 2], dtype=dtype))
    f = INDEXING[how]
    reference = f(cnp, cnp.asarray(values), np.array([2, 0, 2]))
    taken = tg.data(f(tg, tg.param(x), index))  # a tracked x: tracker_gpu's indexing
    np.testing.assert_array_equal(backend.to_numpy(taken), reference)
    g = tg.gradient(lambda x: tg.sum(f(tg, x, index) ** 2), x)[0]
    positions = f(cnp, cnp.reshape(cnp.arange(12), (3, 4)), np.array([2, 0, 2]))
    expected = np.zeros(12)
    np.add.at(expected, np.ravel(positions), 2 * np.ravel(reference))  # d sum(y^2) = 2y
    np.testing.assert_array_equal(backend.to_numpy(g), expected.reshape(3, 4))


@pytest.mark.parametrize("descending", [False, True])
def test_sort_gradient_follows_the_permutation_with_ties(backend, descending):
    x_np = np.array([[3.0, 1.0, 3.0, 2.0, 1.0], [0.5, 0.5, 0.5, -1.0, 4.0]])
    w_np = np.arange(1.0, 11.0).reshape(2, 5)
    x, w = backend.asarray(x_np), backend.asarray(w_np)
    g = tg.gradient(lambda x: tg.sum(tg.sort(x, descending=descending) * w), x)[0]
    check_like(backend, g, x)
    # a stable sort: equal values keep their order, so position k of the output is the
    # k-th (first-come) element of x in (reverse) sorted order
    expected = np.zeros_like(x_np)
    for r in range(2):
        keys = -x_np[r] if descending else x_np[r]
        for k, j in enumerate(np.argsort(keys, kind="stable")):
            expected[r, j] = w_np[r, k]
    np.testing.assert_array_equal(backend.to_numpy(g), expected)


def test_unstack_meshgrid_broadcast_arrays_return_tuples_of_tracked(backend):
    x = tg.param(backend.asarray(np.ones((2, 3))))
    y = tg.param(backend.asarray(np.ones(4)))
    for out, n in [
        (tg.unstack(x, axis=1), 3),
        (tg.meshgrid(y, y[:2]), 2),
        (tg.broadcast_arrays(x, y[:3]), 2),
    ]:
        assert isinstance(out, tuple) and len(out) == n
        assert all(tg.istracked(o) for o in out)


# --- not differentiable: plain arrays out of plain arguments, constants out of tracked ones
X = [[3.0, -1.0, 0.0, 2.0], [0.0, 5.0, 5.0, -1.0]]
PLAIN = {
    "argsort": (lambda ns, x: ns.argsort(x, axis=0, descending=True)),
    "argsort-flat": (lambda ns, x: ns.argsort(x[1, :])),
    "argmax": (lambda ns, x: ns.argmax(x, axis=1, keepdims=True)),
    "argmin": (lambda ns, x: ns.argmin(x)),
    "nonzero": (lambda ns, x: ns.nonzero(x)),
    "searchsorted": (lambda ns, x: ns.searchsorted(ns.sort(x[0, :]), x[1, :], side="right")),
    "count_nonzero": (lambda ns, x: ns.count_nonzero(x, axis=0)),
    "unique_values": (lambda ns, x: ns.unique_values(x)),
    "unique_counts": (lambda ns, x: ns.unique_counts(x)),
    "unique_inverse": (lambda ns, x: ns.unique_inverse(x)),
    "unique_all": (lambda ns, x: ns.unique_all(x)),
    "all": (lambda ns, x: ns.all(x, axis=1)),
    "any": (lambda ns, x: ns.any(x)),
}


def _parts(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("tracked", [False, True], ids=["plain", "tracked"])
def test_non_differentiable_functions_give_no_gradient(backend, name, tracked):
    if backend.name == "torch" and name == "unique_all":
        pytest.skip("array-api-compat does not implement unique_all for PyTorch")
    f = PLAIN[name]
    x = backend.asarray(np.array(X))
    expected = _parts(f(cnp, np.array(X)))
    given = tg.param(x) if tracked else x
    got = _parts(f(tg, given))
    assert len(got) == len(expected)
    xp = array_api_compat.array_namespace(given)
    for a, e in zip(got, expected):
        assert not tg.istracked(a) and isinstance(a, tg.TrackedArray) == tracked
        assert array_api_compat.array_namespace(a) is xp
        assert tg.backend.device_of(a) == backend.device
        np.testing.assert_array_equal(backend.to_numpy(a), e)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_diff_of_booleans_is_numpys_not_equal(backend, n):
    """Booleans have no subtraction: NumPy's diff says where neighbours differ (a TypeError
    from NumPy's subtract before)."""
    b = np.array([[True, False, False, True], [False, False, True, True]])
    xp = array_api_compat.array_namespace(tg.param(backend.asarray([1.0])))
    got = xp.diff(xp.asarray(backend.asarray(b)), n=n, axis=1)
    assert np.array_equal(backend.to_numpy(tg.data(got)), np.diff(b, n=n, axis=1))


def test_isin_takes_integer_arrays(backend):
    x = backend.asarray(np.array([[3, 1], [4, 1]]))
    out = tg.isin(x, backend.asarray(np.array([1, 5])))
    assert not tg.istracked(out)
    np.testing.assert_array_equal(backend.to_numpy(out), [[False, True], [False, True]])


# --- errors
@pytest.mark.parametrize(
    "f, error",
    [
        (lambda x: tg.cumulative_sum(x), "needs an axis"),
        (lambda x: tg.cumulative_prod(x, axis=2), "out of range"),
        (lambda x: tg.cumulative_sum(x[0, 0]), "at least one dimension"),
        (lambda x: tg.take(x, x), "plain integer array"),
        (lambda x: tg.meshgrid(x), "1-d arrays"),
        (lambda x: tg.roll(x, (1, 2, 3), axis=(0, 1)), "same number"),
    ],
)
def test_errors_name_the_problem(backend, f, error):
    x = tg.param(backend.asarray(np.ones((2, 3))))
    with pytest.raises((ValueError, TypeError), match=error):
        f(x)
