"""The tracked array object: attributes, operators, comparisons, conversions, repr."""

import numpy as np

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


def test_comparisons_are_plain_boolean_arrays(backend):
    x = tg.param(backend.asarray([-1.0, 2.0]))
    for m in (x > 0, x >= 0, x < 0, x <= 0, x == 2.0, x != 2.0):
        assert not tg.istracked(m)
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
