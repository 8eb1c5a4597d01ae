"""The host target's row loop (`compiler/row_loops.py`): each row less its maximum, bit for bit
NumPy's `x - max(x)` (as `rules/rows.py` computes it) over the whole domain, rows of every
length around its vector lanes, float32 and float64; a zero maximum is +0 on both ways."""

import contextlib

import numpy as np
import pytest
from domain import domain
from test_compile_fusion import _quiet, _same_bits

from tracker_gpu.compiler import loops, row_loops
from tracker_gpu.rules.rows import row_max

pytestmark = pytest.mark.skipif(loops.compiler() is None, reason="no C++ compiler")

LENGTHS = [1, 2, 7, 8, 9, 15, 16, 17, 64, 103, 257, 300]


def _numpy(x, axis=-1):
    return _quiet(lambda: x - row_max(np, x, axis))


def _rows_of_zeros(n, dtype, seed):
    """Rows whose maximum is a zero: zeros of both signs in every order, some rows with a nan,
    a -inf or only -inf."""
    rng = np.random.default_rng(seed)
    x = -np.abs(domain((12, n), dtype, seed=seed, special=0.5))
    x[np.isnan(x)] = -1.0
    zeros = rng.random((12, n)) < 0.5
    x[zeros] = np.where(rng.random((12, n)) < 0.5, 0.0, -0.0)[zeros]
    x[:, 0] = -0.0  # a -0 first: the loop's first lane meets it before any +0
    x[1] = -np.inf
    x[2, n // 2] = np.nan
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", LENGTHS)
def test_the_row_loop_is_numpys_shift_bit_for_bit(n, dtype):
    for seed in range(3):
        for x in (domain((40, n), dtype, seed=seed, special=0.4), _rows_of_zeros(n, dtype, seed)):
            got = _quiet(row_loops.shifted, np, x, -1)
            _same_bits(got, _numpy(x), f"rows of {n}, {np.dtype(dtype).name}, seed {seed}")


def test_a_zero_maximum_is_plus_zero():
    for row in ([-0.0, 0.0], [0.0, -0.0], [-0.0, -0.0], [-0.0, -1.0, 0.0, -np.inf]):
        for dtype in (np.float32, np.float64):
            x = np.array([row], dtype)
            assert not np.signbit(row_max(np, x, -1)).any(), row
            # x - (+0) keeps each zero's sign: -0 stays -0
            assert np.signbit(row_loops.shifted(np, x, -1)).tolist() == np.signbit(x).tolist()


@contextlib.contextmanager
def _calls_of_the_row_loop(dtype):
    """The calls of the row loop's float64 function while the block runs."""
    assert row_loops._functions() is not None, "the row loop was not built"
    table, dtype = row_loops._built["functions"], np.dtype(dtype)
    held, released = table[dtype]
    calls = []
    spy = lambda function: lambda *a: calls.append(a) or function(*a)  # noqa: E731
    table[dtype] = (spy(held), spy(released))
    try:
        yield calls
    finally:
        table[dtype] = (held, released)


def test_the_row_loop_computes_c_contiguous_rows():
    for shape in ((3, 4), (2, 3, 70000)):  # holding the GIL, and releasing it
        with _calls_of_the_row_loop(np.float64) as calls:
            row_loops.shifted(np, np.ones(shape), -1)
        assert len(calls) == 1, shape


def test_other_arrays_take_numpys_code():
    x = domain((6, 5, 4), np.float64, seed=3)
    for other, axis in ((np.asfortranarray(x), -1), (x, 0), (x[:, ::2], -1),
                        (_quiet(x.astype, np.float16), -1)):  # fmt: skip
        with _calls_of_the_row_loop(np.float64) as calls:
            got = _quiet(row_loops.shifted, np, other, axis)
        assert not calls, (other.dtype, other.strides, axis)
        _same_bits(got, _numpy(other, axis), f"axis {axis}")
