"""The statistics over one axis that the normalising rules compute on plain arrays (softmax,
logsoftmax, cross-entropy, the normalisation layers): the library's `max`, `sum` and `mean`
with `keepdims=True`, except on NumPy float32 and float64 arrays reduced over short rows of
their last axis. There NumPy's reductions pay per row whatever its length (about 20 ns a sum,
65 ns a max, on the rows of 64 of a transformer's attention scores, which are 8,192 such rows
at batch 32): `einsum` sums such rows about five times faster, and a max given its initial
value (-inf, which changes no maximum) runs about twice as fast.

An `einsum` sum adds in another order than NumPy's pairwise `sum`: the statistics differ from
`xp.sum`'s in the last bits, as every library's do (the rules' results are checked against
PyTorch and finite differences, not against NumPy's order), and an eager step and its
`tg.compile` replay, which call these same functions, agree bit for bit.

>>> import numpy as np
>>> x = np.array([[1.0, 2.0, 3.0]])
>>> row_max(np, x, -1), row_sum(np, x, -1), row_mean(np, x, -1)
(array([[3.]]), array([[6.]]), array([[2.]]))
"""

import math

import numpy as np

from ..backend import NUMPY_FLOATS

try:  # NumPy's `einsum` is Python around this one (about 0.7 us a call, several a step)
    from numpy._core.multiarray import c_einsum as _einsum
except ImportError:  # another layout of NumPy's modules: its public function
    _einsum = np.einsum

__all__ = [
    "row_max",
    "row_sum",
    "row_mean",
    "row_sum_of_products",
    "row_mean_of_products",
    "leading_sum",
    "is_numpy_float",
]

# Rows longer than this take NumPy's pairwise sum: its per-row cost no longer dominates, and
# its error grows as log n where einsum's running sums' grow as n.
SHORT = 256


def _short_rows(xp, x, axis):
    """Whether `x` is a NumPy float array reduced over the short rows of its last axis."""
    return (
        xp is np
        and type(x) is np.ndarray
        and x.dtype in NUMPY_FLOATS
        and x.ndim > 0
        and axis in (-1, x.ndim - 1, (-1,), (x.ndim - 1,))
        and 0 < x.shape[-1] <= SHORT
    )


def row_max(xp, x, axis):
    """`xp.max(x, axis=axis, keepdims=True)` (a nan in a row makes its maximum nan); on NumPy
    a zero maximum is +0, whichever zeros its row holds, so that every way of finding it agrees
    (NumPy's vector loops may find either zero, and so may `compiler/row_loops.py`)."""
    if _short_rows(xp, x, axis):
        m = np.maximum.reduce(x, axis=-1, keepdims=True, initial=-np.inf)
    else:
        m = xp.max(x, axis=axis, keepdims=True)
    if type(m) is np.ndarray and m.dtype.kind == "f":
        m += 0.0  # -0 + 0 is +0; every other maximum stays itself
    return m


def row_sum(xp, x, axis):
    """`xp.sum(x, axis=axis, keepdims=True)`."""
    if _short_rows(xp, x, axis):
        return _einsum("...i->...", x)[..., None]
    return xp.sum(x, axis=axis, keepdims=True)


def row_mean(xp, x, axis):
    """`xp.mean(x, axis=axis, keepdims=True)`: the sum divided by the count, as NumPy's mean."""
    if _short_rows(xp, x, axis):
        total = row_sum(xp, x, axis)
        total /= x.shape[-1]
        return total
    return xp.mean(x, axis=axis, keepdims=True)


def _both_short(xp, a, b, axis):
    return (_short_rows(xp, a, axis) and type(b) is np.ndarray and b.shape == a.shape
            and b.dtype == a.dtype)  # fmt: skip


def row_sum_of_products(xp, a, b, axis):
    """`xp.sum(a * b, axis=axis, keepdims=True)`, the products never stored on short rows."""
    if _both_short(xp, a, b, axis):
        return _einsum("...i,...i->...", a, b)[..., None]
    return xp.sum(a * b, axis=axis, keepdims=True)


def row_mean_of_products(xp, a, b, axis):
    """`xp.mean(a * b, axis=axis, keepdims=True)`, the products never stored on short rows."""
    if _both_short(xp, a, b, axis):
        total = row_sum_of_products(xp, a, b, axis)
        total /= a.shape[-1]
        return total
    return xp.mean(a * b, axis=axis, keepdims=True)


def is_numpy_float(x):
    """Whether `x` is a NumPy float32 or float64 array (which `leading_sum` takes)."""
    return type(x) is np.ndarray and x.dtype in NUMPY_FLOATS


def leading_sum(x, lead):
    """`np.sum(x, axis=tuple(range(lead)))` of a NumPy float array: a bias's or a norm's
    gradient summed over the batch. NumPy adds such rows one after another in the order
    `einsum` does (the results agree bit for bit where a row has two or more elements), but
    through its general reduction machinery, at about three times `einsum`'s time.

    >>> leading_sum(np.ones((2, 3, 4)), 2)
    array([6., 6., 6., 6.])
    """
    tail = x.shape[lead:]
    size = math.prod(tail)
    if size >= 2 and x.flags.c_contiguous:
        rows = x if len(x.shape) == 2 and lead == 1 else x.reshape(-1, size)
        total = _einsum("ij->j", rows)
        return total if len(tail) == 1 else total.reshape(tail)
    return np.sum(x, axis=tuple(range(lead)))
