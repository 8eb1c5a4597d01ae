"""The tracked array object: attributes, operators, comparisons, conversions, repr."""

import numpy as np
import pytest

import tracker_gpu as tg


def test_attributes_follow_the_data(backend):
    x = tg.param(backend.asarray(np.arange(6.0).reshape(2, 3)))
    assert tuple(x.shape) == (2, 3) and x.ndim == 2 and x.size == 6
    assert x.dtype == backend.xp.float64 and x.device == backend.device
    assert tuple(x.T.shape) == (3, 2) and tuple(x.mT.shape) == (3, 2)


def test_operators_with_scalars_on_either_side(backend):
    x = tg.param(backend.asarray([1.0, 2.0]))
    y = 2.0 - x + 3.0 * x / 4.0 - 1.0 / x + x**2.0 + 2.0**x - (-x) + abs(-x)
    (g,) = tg.gradient(
        lambda x: tg.sum(2.0 - x + 3.0 * x / 4.0 - 1.0 / x + x**2.0 + 2.0**x - (-x) + abs(-x)),
        backend.asarray([1.0, 2.0]),
    )
    xn = np.array([1.0, 2.0])
    expected = -1 + 0.75 + 1 / xn**2 + 2 * xn + np.log(2.0) * 2.0**xn + 1 + 1
    assert np.allclose(backend.to_numpy(g), expected)
    assert tg.istracked(y)


def test_matmul_operator_and_reflected_numpy_operands():
    A = np.array([[1.0, 2.0], [3.0, 4.0]])
    (g,) = tg.gradient(lambda x: tg.sum(A @ x + np.ones(2) * x), np.array([1.0, 1.0]))
    assert np.allclose(g, A.sum(axis=0) + 1.0)


def test_comparisons_are_boolean_constants(backend):
    x = tg.param(backend.asarray([-1.0, 2.0]))
    for m in (x > 0, x >= 0, x < 0, x <= 0, x == 2.0, x != 2.0):
        assert isinstance(m, tg.TrackedArray) and not tg.istracked(m)
        assert backend.xp.isdtype(m.dtype, "bool")
    assert backend.to_numpy(x > 0).tolist() == [False, True]


def test_zero_d_conversions_and_iteration():
    x = tg.param(np.array([1.5, 2.5]))
    s = tg.sum(x)
    assert float(s) == 4.0 and bool(s) and int(s) == 4
    assert len(x) == 2
    parts = list(x)
    assert all(tg.istracked(p) for p in parts)
    tg.back(parts[0] * 2.0 + parts[1] * 3.0)
    assert np.allclose(tg.grad(x), [2.0, 3.0])


def test_repr_says_tracked():
    x = tg.param(np.array([1.0]))
    assert "TrackedArray" in repr(x) and "leaf" in repr(x)
    assert "multiply" in repr(x * 2.0)


def test_numpy_on_the_left_defers_to_the_tracked_operand():
    x = tg.param(np.array([1.0, 2.0]))
    for y in (np.ones(2) + x, np.ones(2) * x, np.ones(2) - x, np.ones(2) / x, np.float64(2.0) * x):
        assert tg.istracked(y)


# --- integer and boolean tracked arrays: bitwise operators, assignment, __index__
def _tracked_integers(backend, values):
    """A tracked int64 array: a cast of a parameter (the way one arises inside a function)."""
    x = tg.param(backend.asarray(np.array(values, dtype=np.float64)))
    return tg.astype(x, x.__array_namespace__().int64)


def test_bitwise_operators_give_constants(backend):
    a, b = np.array([12, 5, 7]), np.array([10, 3, 1])
    x, y = _tracked_integers(backend, a), _tracked_integers(backend, b)
    other = backend.asarray(b)
    results = {
        "x & y": (x & y, a & b),
        "x | other": (x | other, a | b),
        "x ^ other": (x ^ other, a ^ b),
        "x << 2": (x << 2, a << 2),
        "1 << y": (1 << y, 1 << b),
        "x >> y": (x >> y, a >> b),
        "96 >> y": (96 >> y, 96 >> b),
        "6 & x": (6 & x, 6 & a),
        "3 | x": (3 | x, 3 | a),
        "x ^ 15": (x ^ 15, a ^ 15),
        "~x": (~x, ~a),
    }
    for text, (got, expected) in results.items():
        assert isinstance(got, tg.TrackedArray) and not tg.istracked(got), text
        assert backend.to_numpy(tg.data(got)).tolist() == expected.tolist(), text
    z = x
    z &= y  # as NumPy's: the array itself changes, seen through every name for it
    assert z is x and backend.to_numpy(tg.data(x)).tolist() == (a & b).tolist()


def test_bitwise_operators_on_masks(backend):
    x = tg.param(backend.asarray([-1.0, 0.5, 2.0]))
    inside = (x > 0) & (x < 1)
    assert backend.to_numpy(inside).tolist() == [False, True, False]
    assert backend.to_numpy(~inside | (x > 1.5)).tolist() == [True, False, True]
    assert backend.to_numpy((x > 0) ^ (x > 1)).tolist() == [False, True, False]


def test_numpy_bitwise_operators_on_the_left():
    x = _tracked_integers(np, [6, 3])  # np.asarray stands in for a backend
    assert np.asarray(np.array([3, 3]) & x).tolist() == [2, 3]
    assert np.asarray(np.array([1, 4]) << x).tolist() == [64, 32]
    assert np.asarray(np.invert(x)).tolist() == [-7, -4]
    assert np.asarray(np.array([5, 5]) ^ x).tolist() == [3, 6]
    x[np.array([1])] = x[0:1]  # integer-array indices, where the library takes them
    assert tg.data(x).tolist() == [6, 6]


def test_bitwise_operators_are_replayed_by_compile(backend):
    def f(x, k):
        inside = (x > 0.8) & (x < 1.2) | ((k & 1) == 1)
        return tg.sum(tg.where(inside, x * x, 0.0 * x) * tg.astype(k >> 1, x.dtype))

    step = tg.compile(f)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = backend.asarray(rng.uniform(0.5, 1.5, 6))
        k = backend.asarray(rng.integers(0, 8, 6))
        got, expected = step(x, k), tg.withgradient(f, x, k)
        assert float(got.val) == float(expected.val)
        assert np.array_equal(backend.to_numpy(got.grad[0]), backend.to_numpy(expected.grad[0]))
        xn, kn = backend.to_numpy(x), backend.to_numpy(k)
        inside = ((xn > 0.8) & (xn < 1.2)) | (kn % 2 == 1)
        assert np.allclose(float(got.val), np.sum(np.where(inside, xn * xn, 0.0) * (kn // 2)))
    assert step.cache_info().hits == 2


def test_assignment_into_integer_and_boolean_arrays(backend):
    x = _tracked_integers(backend, [1, 2, 3, 4])
    x[0] = 10
    x[backend.asarray([False, True, False, True])] = 0
    x[2:3] = backend.asarray([7])
    assert backend.to_numpy(tg.data(x)).tolist() == [10, 0, 7, 0]
    m = tg.param(backend.asarray([1.0, -1.0])) > 0
    flags = tg.astype(tg.param(backend.asarray([1.0, 0.0])), backend.xp.bool)
    flags[1] = True
    flags[0:1] = m[1:]
    assert backend.to_numpy(tg.data(flags)).tolist() == [False, True]


def test_assignment_leaves_what_a_pullback_saved(backend):
    w = tg.param(backend.asarray([1.0, 1.0, 1.0]))
    counts = _tracked_integers(backend, [2, 3, 4])
    loss = tg.sum(w * tg.astype(counts, w.dtype))
    counts[...] = 0  # after recording: the gradient is still the counts that were multiplied
    tg.back(loss)
    assert backend.to_numpy(tg.grad(w)).tolist() == [2.0, 3.0, 4.0]
    assert backend.to_numpy(tg.data(counts)).tolist() == [0, 0, 0]


def test_a_tracked_float_written_into_an_integer_array_is_refused(backend):
    x = tg.param(backend.asarray([0.0, 1.0]))
    k = _tracked_integers(backend, [1, 2])
    with pytest.raises(TypeError, match=r"gradient would be lost.*tg\.data\(value\)"):
        k[0] = x[1]
    assert backend.to_numpy(tg.data(k)).tolist() == [1, 2]


def test_assignment_is_replayed_by_compile():
    def f(x):
        k = tg.astype(x, tg.int64)
        k[0] = 1
        y = x * 1.0
        y[1:] = x[:-1] * 3.0
        y[x > 2.5] = 0.0
        return tg.sum(y * tg.astype(k, x.dtype))

    compiled = tg.compile(f)
    for values in ([2.0, 3.0, 4.0], [5.0, 1.0, 2.0], [1.0, 3.0, 2.0]):
        x = np.array(values)
        val, (g,) = compiled(x)
        expected_val, (expected_g,) = tg.withgradient(f, x)
        assert np.allclose(val, expected_val) and np.allclose(g, expected_g)
    assert compiled.cache_info().hits == 2


def test_a_write_with_a_traced_index_that_depends_on_the_data_is_refused():
    def f(x):
        y = x * 1.0
        y[x > 0] = x[x > 0] * 2.0
        return tg.sum(y)

    with pytest.raises(Exception, match=r"traced"):
        tg.compile(f)(np.ones(3))


def test_index_of_a_zero_d_integer_array():
    assert [10, 20, 30][_tracked_integers(np, 2.0)] == 30
    with pytest.raises(TypeError, match="float64 cannot be used as an index.*astype"):
        [10, 20][tg.param(np.asarray(1.0))]


def test_tracked_integer_arrays_index_like_plain_ones(backend):
    x = tg.param(backend.asarray([10.0, 20.0, 30.0]))
    k = _tracked_integers(backend, [2, 0])
    picked = x[k]
    taken = tg.take(x, k)
    masked = x[x > 15.0]
    for got, expected in ((picked, [30.0, 10.0]), (taken, [30.0, 10.0]), (masked, [20.0, 30.0])):
        assert backend.to_numpy(tg.data(got)).tolist() == expected
    tg.back(tg.sum(picked) + tg.sum(taken))
    assert backend.to_numpy(tg.grad(x)).tolist() == [2.0, 0.0, 2.0]


def test_asarray_of_a_nested_list_of_tracked_values_is_differentiable(backend):
    x = tg.param(backend.asarray([[1.0, 2.0], [3.0, 4.0]]))
    transposed = tg.asarray([[x[i, j] for i in range(2)] for j in range(2)])
    assert backend.to_numpy(tg.data(transposed)).tolist() == [[1.0, 3.0], [2.0, 4.0]]
    tg.back(tg.sum(transposed * backend.asarray([[1.0, 10.0], [100.0, 1000.0]])))
    assert backend.to_numpy(tg.grad(x)).tolist() == [[1.0, 100.0], [10.0, 1000.0]]


def test_dlpack_takes_the_standards_keywords():
    x = tg.stop_gradient(tg.param(np.array([1.0, 2.0])))
    assert np.from_dlpack(x).tolist() == [1.0, 2.0]
    assert x.__dlpack__(max_version=(1, 0)) is not None
