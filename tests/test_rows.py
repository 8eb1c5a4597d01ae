"""The row statistics of the normalising rules (`rules/rows.py`) over the whole domain, against
references computed independently: the exact maximum, and sums exact in float64 (`math.fsum`)
rounded once. Both the short-row path (einsum, an initial maximum) and the library's own (long
rows, other axes) are checked, on NumPy and through array-api-strict."""

import math

import numpy as np
import pytest

from tests.domain import assert_agree, domain
from tracker_gpu.rules.rows import (
    SHORT,
    leading_sum,
    row_max,
    row_mean,
    row_mean_of_products,
    row_sum,
    row_sum_of_products,
)

SHAPES = [(6, 1), (5, 7), (3, 4, 64), (4, SHORT), (3, SHORT + 5)]
DTYPES = [np.float32, np.float64]


def _rows(x):
    return x.reshape(-1, x.shape[-1]).astype(np.float64)


def _reference_max(x):
    out = []
    for row in _rows(x):
        out.append(np.nan if np.isnan(row).any() else max(row.tolist()))
    return np.array(out).reshape(*x.shape[:-1], 1)


def _reference_sum(x, divide=1):
    """The exact sum of each row rounded once (nan where it is undefined), and whether to
    check it: not where the row's finite magnitudes overflow the dtype (an order of addition
    may then overflow, to either infinity, or not: no single answer)."""
    big = np.finfo(x.dtype).max
    out, checked = [], []
    for row in _rows(x):
        finite = row[np.isfinite(row)]
        infinities = set(row[np.isinf(row)].tolist())
        checked.append(bool(np.isnan(row).any() or np.abs(finite).sum() < big))
        if np.isnan(row).any() or len(infinities) == 2:
            out.append(np.nan)
        elif infinities:
            out.append(infinities.pop())
        else:
            out.append(math.fsum(finite.tolist()) / divide)
    shape = (*x.shape[:-1], 1)
    return np.array(out).astype(x.dtype).reshape(shape), np.array(checked).reshape(shape)


def _magnitudes(x):
    return np.abs(np.where(np.isfinite(x), x, 0)).astype(np.float64).sum(-1, keepdims=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_row_max_is_the_exact_maximum(shape, dtype):
    x = domain(shape, dtype, seed=len(shape))
    got = row_max(np, x, -1)
    assert got.dtype == x.dtype and got.shape == (*shape[:-1], 1)
    expected = _reference_max(x)
    # a maximum is exact: the same value, nan where a row has one (either zero on a tie)
    np.testing.assert_array_equal(got, expected.astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("statistic", ["sum", "mean", "sum_of_products", "mean_of_products"])
def test_row_sums_agree_with_exact_sums(shape, dtype, statistic):
    x = domain(shape, dtype, seed=3)
    y = domain(shape, dtype, seed=4, special=0.05)
    divide = shape[-1] if "mean" in statistic else 1
    with np.errstate(all="ignore"):
        summed = x * y if "products" in statistic else x
        got = {
            "sum": lambda: row_sum(np, x, -1),
            "mean": lambda: row_mean(np, x, -1),
            "sum_of_products": lambda: row_sum_of_products(np, x, y, -1),
            "mean_of_products": lambda: row_mean_of_products(np, x, y, -1),
        }[statistic]()
        expected, checked = _reference_sum(summed, divide)
        scale = _magnitudes(summed) / divide
    assert got.dtype == x.dtype and got.shape == (*shape[:-1], 1)
    assert checked.any()
    assert_agree(got[checked], expected[checked], ulps=4 * shape[-1], scale=scale[checked],
                 what=statistic)  # fmt: skip


@pytest.mark.parametrize("function", [row_max, row_sum, row_mean])
def test_other_axes_and_libraries_keep_the_library_reduction(function):
    x = domain((4, 5, 6), np.float64, seed=5, special=0.0)
    name = {row_max: "max", row_sum: "sum", row_mean: "mean"}[function]
    for axis in (0, 1, (0, 2)):
        expected = getattr(np, name)(x, axis=axis, keepdims=True)
        np.testing.assert_array_equal(function(np, x, axis), expected)
    strict = pytest.importorskip("array_api_strict")
    xs = strict.asarray(x)
    got = function(strict, xs, -1)
    assert type(got) is type(xs)
    np.testing.assert_array_equal(np.asarray(got), getattr(np, name)(x, axis=-1, keepdims=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 1), (300, 2), (2, 3, 4), (64, 7, 103), (1000, 3), (0, 4)])
@pytest.mark.parametrize("lead", [1, 2])
def test_leading_sum_is_numpy_sum_bit_for_bit(shape, dtype, lead):
    """A bias's gradient summed over the batch: NumPy's sum over the leading axes, every bit
    (signed zeros, infinities, nan where NumPy has one), contiguous or not."""
    lead = min(lead, len(shape) - 1)
    x = domain(shape, dtype, seed=len(shape), special=0.1)
    for layout in (x, np.asfortranarray(x), x[::-1]):
        with np.errstate(all="ignore"):
            got, expected = leading_sum(layout, lead), np.sum(layout, axis=tuple(range(lead)))
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
        assert (np.signbit(got) == np.signbit(expected))[~np.isnan(expected)].all()
