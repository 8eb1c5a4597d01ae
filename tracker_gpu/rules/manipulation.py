"""Manipulation, indexing, scan, sorting, searching and set functions of the standard.

Most are composites of the shape rules (getitem, concat, reshape, broadcast_to, permute_dims), so
they are differentiable to any order for free. Three are primitives: `cumulative_sum`,
`cumulative_prod` and the linear recurrence behind the latter's gradient, which is exact at zeros
(it never divides). `sort` sends the gradient through the permutation found by `argsort`.
Searching, sorting indices, set functions and truth tests are not differentiable: they take the
plain values of tracked arguments and return tracked constants (plain arrays for plain ones).

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(lambda x: tg.sum(tg.cumulative_prod(x)), np.array([2.0, 0.0, 3.0]))[0]
array([1., 8., 0.])
"""

import builtins

import array_api_compat
import numpy as np

from .. import backend, recording
from ..backend import device_of, isdtype, namespace_of
from ..primitive import Primitive, no_gradient
from ..tracked import TrackedArray, data
from .elementwise import PLAIN_FUNCTIONS, conjugate_derivative, multiply, subtract
from .shape import (
    _index_adjoint,
    _normalize_index,
    broadcast_to,
    concat,
    expand_dims,
    flip,
    getitem,
    index_dtype,
    permute_dims,
    reshape,
)

__all__ = [
    "cumulative_sum",
    "cumulative_prod",
    "take",
    "take_along_axis",
    "moveaxis",
    "repeat",
    "tile",
    "roll",
    "unstack",
    "sort",
    "diff",
    "meshgrid",
    "broadcast_arrays",
    "argsort",
    "argmax",
    "argmin",
    "nonzero",
    "searchsorted",
    "count_nonzero",
    "unique_values",
    "unique_counts",
    "unique_inverse",
    "unique_all",
    "isin",
    "all",
    "any",
]


# --- helpers
def _axis(axis, ndim, name):
    """`axis` as a non-negative int, checked against `ndim`."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: axis {axis} is out of range for an array of {ndim} dimensions")
    return axis % ndim


def _scan_axis(x, axis, name):
    if x.ndim == 0:
        raise ValueError(f"{name} needs an array of at least one dimension, got a 0-d array")
    if axis is None:
        if x.ndim != 1:
            raise ValueError(f"{name} of an array of {x.ndim} dimensions needs an axis")
        return 0
    return _axis(axis, x.ndim, name)


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _ints(v):
    """An int or a sequence of ints as a tuple of Python ints."""
    return (int(v),) if _is_int(v) else tuple(int(a) for a in v)


def _along(axis, index):
    """A key applying `index` (an int or a slice) to `axis` and keeping every other axis."""
    return (slice(None),) * axis + (index, Ellipsis)


def _plain_namespace(x):
    return namespace_of(data(x))


def _shift(v, axis, d):
    """`out[j] = v[j - d]` along `axis`, zero where `j - d` falls outside (differentiable)."""
    n = v.shape[axis]
    plain = data(v)
    xp = namespace_of(plain)
    if builtins.abs(d) >= n:
        return multiply(v, 0.0)
    zeros = xp.zeros_like(plain[_along(axis, slice(0, builtins.abs(d)))])
    if d > 0:
        return concat([zeros, getitem(v, _along(axis, slice(0, n - d)))], axis=axis)
    return concat([getitem(v, _along(axis, slice(-d, n))), zeros], axis=axis)


# --- cumulative sums: the gradient is the reversed cumulative sum of the incoming gradient
def _cumulative_sum_forward(xp, x, *, axis, dtype, include_initial):
    return xp.cumulative_sum(x, axis=axis, dtype=dtype, include_initial=include_initial)


def _cumulative_sum_vjp(g, ans, x, *, axis, dtype, include_initial):
    if include_initial:
        g = getitem(g, _along(axis, slice(1, None)))
    return flip(_cumulative_sum(flip(g, axis=axis), axis=axis), axis=axis)


def _cumulative_sum(x, *, axis, dtype=None, include_initial=False):
    return _cumulative_sum_primitive(x, axis=axis, dtype=dtype, include_initial=include_initial)


_cumulative_sum_primitive = Primitive(
    "cumulative_sum", _cumulative_sum_forward, (_cumulative_sum_vjp,), saves=""
)


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    """Cumulative sum along `axis` (optional for 1-d `x`); `include_initial` prepends a zero."""
    axis = _scan_axis(x, axis, "cumulative_sum")
    return _cumulative_sum(x, axis=axis, dtype=dtype, include_initial=include_initial)


# --- the linear recurrence r[j] = b[j] + a[j] * r[j -/+ 1], by doubling steps (no division)
def _plain_shift(xp, v, axis, d):
    """`out[j] = v[j - d]` on plain arrays, zero-filled; `0 < |d| < n`."""
    n = v.shape[axis]
    zeros = xp.zeros_like(v[_along(axis, slice(0, builtins.abs(d)))])
    if d > 0:
        return xp.concat([zeros, v[_along(axis, slice(0, n - d))]], axis=axis)
    return xp.concat([v[_along(axis, slice(-d, n))], zeros], axis=axis)


def _linear_scan_forward(xp, a, b, *, axis, reverse):
    """`r[j] = b[j] + a[j] * r[j + 1]` (reverse) or `r[j - 1]`, the missing end term being 0."""
    n = b.shape[axis]
    step = -1 if reverse else 1
    d = 1
    while d < n:
        b = b + a * _plain_shift(xp, b, axis, step * d)
        if 2 * d < n:
            a = a * _plain_shift(xp, a, axis, step * d)
        d *= 2
    return b


def _linear_scan_vjp_b(g, ans, a, b, *, axis, reverse):
    # The adjoint recurrence runs the other way, with its coefficients moved by one place:
    # s[k] = g[k] + a[k - 1] * s[k - 1] for a reverse scan.
    a = conjugate_derivative(a)  # complex coefficients: the adjoint's are their conjugates
    return _linear_scan(_shift(a, axis, 1 if reverse else -1), g, axis=axis, reverse=not reverse)


def _linear_scan_vjp_a(g, ans, a, b, *, axis, reverse):
    # a[j] multiplies the neighbour r[j + 1] (reverse) or r[j - 1] in the equation of r[j].
    neighbour = conjugate_derivative(_shift(ans, axis, -1 if reverse else 1))
    return multiply(_linear_scan_vjp_b(g, ans, a, b, axis=axis, reverse=reverse), neighbour)


_linear_scan = Primitive(
    "linear_scan",
    _linear_scan_forward,
    (_linear_scan_vjp_a, _linear_scan_vjp_b),
    saves=("a ans", "a"),
)


# --- cumulative products
def _cumulative_prod_forward(xp, x, *, axis, dtype, include_initial):
    return xp.cumulative_prod(x, axis=axis, dtype=dtype, include_initial=include_initial)


def _cumulative_prod_vjp(g, ans, x, *, axis, dtype, include_initial):
    # d/dx[j] sum_k g[k] prod_{i<=k} x[i] = prod_{i<j} x[i] * r[j], where
    # r[j] = sum_{k>=j} g[k] prod_{j<i<=k} x[i] = g[j] + x[j+1] * r[j+1]: no division, exact at 0.
    if include_initial:
        g = getitem(g, _along(axis, slice(1, None)))
    if x.shape[axis] == 0:
        return g
    x = conjugate_derivative(x)  # complex x: the same formula on its conjugate
    before = _cumulative_prod(x, axis=axis, include_initial=True)
    before = getitem(before, _along(axis, slice(0, -1)))
    r = _linear_scan(_shift(x, axis, -1), g, axis=axis, reverse=True)
    return multiply(before, r)


def _cumulative_prod(x, *, axis, dtype=None, include_initial=False):
    return _cumulative_prod_primitive(x, axis=axis, dtype=dtype, include_initial=include_initial)


_cumulative_prod_primitive = Primitive(
    "cumulative_prod", _cumulative_prod_forward, (_cumulative_prod_vjp,), saves="x"
)


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    """Cumulative product along `axis`; its gradient is exact where `x` has zeros."""
    axis = _scan_axis(x, axis, "cumulative_prod")
    return _cumulative_prod(x, axis=axis, dtype=dtype, include_initial=include_initial)


# --- indexing: integer-array keys over every axis, so that the core's getitem (and its
# accumulating adjoint) does the work on every library, array-api-strict included
def _check_indices(indices, name):
    """Indices as a plain array (a tracked integer array carries no gradient), or traced ones
    while tg.compile records."""
    if isinstance(indices, TrackedArray) and recording.current() is None:
        if not isdtype(indices._xp, indices.dtype, "integral"):
            raise TypeError(
                f"{name}: indices must be a plain integer array, not a tracked one of dtype "
                f"{indices.dtype}"
            )
        return indices.data
    return indices


def _open_mesh(xp, shape, axis, indices, device):
    """An integer-array key over every axis of `shape`: `indices` on `axis`, every position of
    the other axes (the one integer-array key every library's indexing takes)."""
    ndim = len(shape)
    key = []
    for d in range(ndim):
        if d == axis:
            key.append(indices)
            continue
        ones = tuple(shape[d] if e == d else 1 for e in range(ndim))
        key.append(xp.reshape(xp.arange(shape[d], device=device), ones))
    return tuple(key)


# --- take: the library's own `take`, one gather of slices (the open mesh's key gathers element
# by element: forty times slower on NumPy for an embedding's rows)
def _take_forward(xp, x, indices, *, axis):
    return xp.take(x, index_dtype(xp, indices), axis=axis)


def _take_adjoint_forward(xp, g, indices, *, shape, axis):
    """Zeros of `shape` with the slices of `g` added at `indices` along `axis` (a repeated
    index accumulates: in the order of `indices` where the library has a scatter)."""
    indices = index_dtype(xp, indices)
    if not backend.own_scatter(xp, g):
        return _one_hot_adjoint(xp, g, indices, shape[axis], axis)
    if axis == 0 and xp is np:
        key = (indices,)  # whole rows: NumPy accumulates them by rows (backend.scatter_add)
    else:
        key = _open_mesh(xp, shape, axis, xp.reshape(indices, _along_axis(len(shape), axis)),
                         device_of(g))  # fmt: skip
    return _index_adjoint.forward(xp, g, shape, key)


def _one_hot_adjoint(xp, g, indices, n, axis):
    """The adjoint as a product with the one-hot matrix of `indices` (the standard has no
    scatter; Dask takes no integer-array key over several axes)."""
    positions = xp.arange(n, device=device_of(g))
    hits = xp.remainder(indices, n)[:, None] == positions[None, :]
    return xp.moveaxis(backend.one_hot_sum(xp, hits, xp.moveaxis(g, axis, 0)), 0, axis)


def _along_axis(ndim, axis):
    """The shape that lays a 1-d array of indices along `axis` of an open mesh."""
    return tuple(-1 if d == axis else 1 for d in range(ndim))


def _take_vjp(g, ans, x, indices, *, axis):
    return _take_adjoint(g, indices, shape=x.shape, axis=axis)


_take = Primitive("take", _take_forward, (_take_vjp, None), saves="indices")
_take_adjoint = Primitive(
    "take_adjoint",
    _take_adjoint_forward,
    (lambda gg, ans, g, indices, *, shape, axis: _take(gg, indices, axis=axis), None),
    saves="indices",
)


def take(x, indices, /, *, axis=None):
    """The elements of `x` at the 1-d `indices` along `axis` (repeated ones accumulate)."""
    indices = _check_indices(indices, "take")
    if axis is None:
        if x.ndim != 1:
            raise ValueError(f"take from an array of {x.ndim} dimensions needs an axis")
        axis = 0
    axis = _axis(axis, x.ndim, "take")
    if not isinstance(indices, TrackedArray):  # a list, or another library's array
        indices = _normalize_index(_plain_namespace(x), x, indices)
    if indices.ndim != 1:
        raise ValueError(f"take needs 1-d indices, got {indices.ndim} dimensions")
    return _take(x, indices, axis=axis)


def take_along_axis(x, indices, /, *, axis=-1):
    """`x` at `indices` along `axis`; the other axes of the two broadcast."""
    indices = _check_indices(indices, "take_along_axis")
    if indices.ndim != x.ndim:
        raise ValueError(
            f"take_along_axis needs indices with x's {x.ndim} dimensions, got {indices.ndim}"
        )
    axis = _axis(axis, x.ndim, "take_along_axis")
    mesh = _open_mesh(_plain_namespace(x), x.shape, axis, indices, device_of(data(x)))
    return getitem(x, mesh)


# --- manipulation
def moveaxis(x, source, destination, /):
    """Move the axes `source` to the positions `destination` (ints or tuples of ints)."""
    ndim = x.ndim
    source, destination = _ints(source), _ints(destination)
    if len(source) != len(destination):
        raise ValueError("moveaxis: source and destination need the same number of axes")
    source = tuple(_axis(a, ndim, "moveaxis") for a in source)
    destination = tuple(_axis(a, ndim, "moveaxis") for a in destination)
    if len(set(source)) != len(source) or len(set(destination)) != len(destination):
        raise ValueError("moveaxis: repeated axes")
    order = [a for a in range(ndim) if a not in source]
    for dest, src in sorted(zip(destination, source)):
        order.insert(dest, src)
    order = tuple(order)
    return x if order == tuple(range(ndim)) else permute_dims(x, order)


def repeat(x, repeats, /, *, axis=None):
    """Repeat each element of `x` along `axis` (`x` flattened if None) `repeats` times.

    `repeats` is an int, or an integer array with one count per element along `axis` (or one).
    """
    if axis is None:
        x = reshape(x, (-1,))
        axis = 0
    axis = _axis(axis, x.ndim, "repeat")
    shape = tuple(x.shape)
    if _is_int(repeats):
        repeats = int(repeats)
        if repeats < 0:
            raise ValueError(f"repeat: repeats must be non-negative, got {repeats}")
        wide = broadcast_to(
            expand_dims(x, axis=axis + 1), shape[: axis + 1] + (repeats,) + shape[axis + 1 :]
        )
        return reshape(wide, shape[:axis] + (shape[axis] * repeats,) + shape[axis + 1 :])
    repeats = _check_indices(repeats, "repeat")
    if isinstance(repeats, TrackedArray):  # traced while tg.compile records
        recording.refuse("repeat(x, repeats) with traced repeats (its shape depends on the data)")
    xp = array_api_compat.array_namespace(data(x))
    index = xp.repeat(xp.arange(shape[axis], device=device_of(data(x))), repeats)
    return take(x, index, axis=axis)


def tile(x, repetitions, /):
    """`x` repeated `repetitions[i]` times along axis `i` (leading axes added as needed)."""
    reps = tuple(repetitions)
    ndim = builtins.max(len(reps), x.ndim)
    shape = (1,) * (ndim - x.ndim) + tuple(x.shape)
    reps = (1,) * (ndim - len(reps)) + reps
    if builtins.all(r == 1 for r in reps):
        return reshape(x, shape) if ndim != x.ndim else x
    spread = tuple(n for pair in zip((1,) * ndim, shape) for n in pair)
    target = tuple(n for pair in zip(reps, shape) for n in pair)
    tiled = broadcast_to(reshape(x, spread), target)
    return reshape(tiled, tuple(r * n for r, n in zip(reps, shape)))


def roll(x, /, shift, *, axis=None):
    """Shift the elements of `x` cyclically by `shift` along `axis` (flattened if None)."""
    if axis is None:
        return reshape(roll(reshape(x, (-1,)), shift, axis=0), tuple(x.shape))
    shifts, axes = _ints(shift), _ints(axis)
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    if len(shifts) != len(axes):
        raise ValueError("roll: shift and axis need the same number of entries")
    total = {}
    for s, a in zip(shifts, axes):
        a = _axis(a, x.ndim, "roll")
        total[a] = total.get(a, 0) + s
    for a, s in total.items():
        n = x.shape[a]
        s = s % n if n else 0
        if s:
            head = getitem(x, _along(a, slice(n - s, n)))
            tail = getitem(x, _along(a, slice(0, n - s)))
            x = concat([head, tail], axis=a)
    return x


def unstack(x, /, *, axis=0):
    """The slices of `x` along `axis`, as a tuple of arrays."""
    if x.ndim == 0:
        raise ValueError("unstack needs an array of at least one dimension")
    axis = _axis(axis, x.ndim, "unstack")
    return tuple(getitem(x, _along(axis, i)) for i in range(x.shape[axis]))


def diff(x, /, *, axis=-1, n=1, prepend=None, append=None):
    """The `n`-th forward difference along `axis`, after joining `prepend` and `append`."""
    if x.ndim == 0:
        raise ValueError("diff needs an array of at least one dimension")
    axis = _axis(axis, x.ndim, "diff")
    if n < 0:
        raise ValueError(f"diff: n must be non-negative, got {n}")
    if n == 0:
        return x
    parts = [_edge(x, p, axis) for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = concat(parts, axis=axis)
    # booleans differ where they are not equal, as NumPy's diff says (they have no subtraction)
    difference = (
        PLAIN_FUNCTIONS["not_equal"]
        if isdtype(namespace_of(data(x)), x.dtype, "bool")
        else subtract
    )
    for _ in range(n):
        m = x.shape[axis]
        x = difference(
            getitem(x, _along(axis, slice(1, m))),
            getitem(x, _along(axis, slice(0, builtins.max(m - 1, 0)))),
        )
    return x


def _edge(x, part, axis):
    """`prepend`/`append` of diff; a Python number becomes a slice of `x`'s shape."""
    if type(part) not in backend.SCALARS:
        return part
    plain = data(x)
    xp = namespace_of(plain)
    shape = tuple(1 if d == axis else n for d, n in enumerate(plain.shape))
    return xp.full(shape, part, dtype=plain.dtype, device=device_of(plain))


def broadcast_arrays(*arrays):
    """The arrays broadcast against each other, as a tuple."""
    shape = np.broadcast_shapes(*(tuple(a.shape) for a in arrays))
    return tuple(a if tuple(a.shape) == shape else broadcast_to(a, shape) for a in arrays)


def meshgrid(*arrays, indexing="xy"):
    """Coordinate grids from 1-d arrays; `indexing` 'xy' (Cartesian) or 'ij' (matrix)."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    for a in arrays:
        if a.ndim != 1:
            raise ValueError(f"meshgrid needs 1-d arrays, got one of {a.ndim} dimensions")
    sizes = [a.shape[0] for a in arrays]
    positions = list(range(len(arrays)))
    if indexing == "xy" and len(arrays) > 1:
        positions[0], positions[1] = 1, 0
    shape = [0] * len(arrays)
    for size, p in zip(sizes, positions):
        shape[p] = size
    shape = tuple(shape)
    grids = []
    for a, size, p in zip(arrays, sizes, positions):
        column = tuple(size if d == p else 1 for d in range(len(arrays)))
        grids.append(broadcast_to(reshape(a, column), shape))
    return tuple(grids)


# --- sorting: the values follow the permutation of argsort
def sort(x, /, *, axis=-1, descending=False, stable=True):
    """`x` sorted along `axis`; the gradient goes back through the sorting permutation."""
    if x.ndim == 0:
        raise ValueError("sort needs an array of at least one dimension")
    order = argsort(x, axis=axis, descending=descending, stable=stable)
    return take_along_axis(x, order, axis=axis)


# --- not differentiable: tracked arguments are unwrapped, and the results are constants (plain
# arrays for plain arguments); while tg.compile records, traced ones (recorded, with no
# gradient), or refused where the result's shape depends on the data
def _plain(name, signature, shaped_by_data=False):
    """`name`, with no gradient, showing the standard's `signature` (a function's)."""

    def forward(xp, *args, **kw):
        # the standard's signature (argsort's `descending`, say) is array-api-compat's, not
        # always the library's own
        xp = array_api_compat.array_namespace(*(a for a in args if backend.is_array(a)))
        return getattr(xp, name)(*args, **kw)

    return no_gradient(name, forward, signature=signature, shaped_by_data=shaped_by_data)


argsort = _plain("argsort", lambda x, /, *, axis=-1, descending=False, stable=True: None)
argmax = _plain("argmax", lambda x, /, *, axis=None, keepdims=False: None)
argmin = _plain("argmin", lambda x, /, *, axis=None, keepdims=False: None)
nonzero = _plain("nonzero", lambda x, /: None, shaped_by_data=True)
searchsorted = _plain("searchsorted", lambda x1, x2, /, *, side="left", sorter=None: None)
count_nonzero = _plain("count_nonzero", lambda x, /, *, axis=None, keepdims=False: None)
unique_values = _plain("unique_values", lambda x, /: None, shaped_by_data=True)
unique_counts = _plain("unique_counts", lambda x, /: None, shaped_by_data=True)
unique_inverse = _plain("unique_inverse", lambda x, /: None, shaped_by_data=True)
unique_all = _plain("unique_all", lambda x, /: None, shaped_by_data=True)
isin = _plain("isin", lambda x1, x2, /, *, invert=False: None)
all = _plain("all", lambda x, /, *, axis=None, keepdims=False: None)
any = _plain("any", lambda x, /, *, axis=None, keepdims=False: None)
