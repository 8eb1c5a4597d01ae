"""NumPy's array manipulation beyond the standard: `atleast_1d/2d/3d`, the stacks (`vstack`,
`hstack`, `dstack`, `column_stack`), the split family (`split`, `array_split`, `hsplit`,
`vsplit`, `dsplit`), `append`, `rot90` and `pad`, with NumPy's semantics.

Each is a composite of the shape rules (reshape, concat, getitem, flip, permute_dims, take), so
it is differentiable to any order for free, on every library. NumPy's index tricks `r_` and
`c_` are not here: write `concat` (or `hstack`/`vstack`) instead.

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(lambda x: tg.sum(tg.pad(x, 2, mode="reflect")), np.array([1.0, 2.0, 3.0]))[0]
array([2., 3., 2.])
"""

import builtins

import numpy as np

from .. import backend
from ..backend import device_of, namespace_of
from ..tracked import data
from .elementwise import _as_arrays, astype
from .manipulation import take
from .shape import concat, flip, getitem, permute_dims, reshape

__all__ = [
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "vstack",
    "hstack",
    "dstack",
    "column_stack",
    "split",
    "array_split",
    "hsplit",
    "vsplit",
    "dsplit",
    "append",
    "rot90",
    "pad",
]


# --- helpers
def as_arrays(*values):
    """Python numbers among `values` as 0-d arrays beside the first array (tracked or plain):
    of its library, device and dtype (complex for a complex number beside a real array), as
    the standard's operators treat them; of NumPy's default dtypes where all are numbers."""
    like = next((data(v) for v in values if type(v) not in backend.SCALARS), None)
    if like is None:
        return tuple(np.asarray(v) for v in values)
    return _as_arrays(namespace_of(like), *values)


def _one_or_all(results):
    return results[0] if len(results) == 1 else tuple(results)


def _along(axis, index):
    return (slice(None),) * axis + (index, Ellipsis)


def _cast(x, dtype):
    return x if dtype is None or x.dtype == dtype else astype(x, dtype)


# --- at least n dimensions: NumPy's placement of the added axes
def atleast_1d(*arys):
    """Each array with at least one dimension (a 0-d one becomes shape (1,)); one array for
    one argument, else a tuple.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.atleast_1d(np.asarray(2.0))
    array([2.])
    """
    return _one_or_all([x if x.ndim >= 1 else reshape(x, (1,)) for x in as_arrays(*arys)])


def atleast_2d(*arys):
    """Each array with at least two dimensions: (n,) becomes (1, n)."""
    return _one_or_all([x if x.ndim >= 2 else reshape(x, (1, -1)) for x in as_arrays(*arys)])


def _three(x):
    if x.ndim >= 3:
        return x
    if x.ndim == 2:
        return reshape(x, tuple(x.shape) + (1,))
    return reshape(x, (1, -1, 1))


def atleast_3d(*arys):
    """Each array with at least three dimensions: (n,) becomes (1, n, 1), (m, n) (m, n, 1)."""
    return _one_or_all([_three(x) for x in as_arrays(*arys)])


# --- stacks
def _listed(tup, name):
    arrays = list(tup)
    if not arrays:
        raise ValueError(f"{name} needs at least one array to join")
    return arrays


def vstack(tup, *, dtype=None):
    """The arrays (at least 2-d) joined along the first axis (rows).

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.vstack([np.array([1.0, 2.0]), np.array([3.0, 4.0])]).shape
    (2, 2)
    """
    arrays = atleast_2d(*_listed(tup, "vstack"))
    arrays = arrays if isinstance(arrays, tuple) else (arrays,)
    return concat([_cast(a, dtype) for a in arrays], axis=0)


def hstack(tup, *, dtype=None):
    """The arrays joined along the second axis (the first for 1-d arrays)."""
    arrays = atleast_1d(*_listed(tup, "hstack"))
    arrays = arrays if isinstance(arrays, tuple) else (arrays,)
    axis = 0 if arrays[0].ndim == 1 else 1
    return concat([_cast(a, dtype) for a in arrays], axis=axis)


def dstack(tup):
    """The arrays (at least 3-d) joined along the third axis (depth)."""
    arrays = atleast_3d(*_listed(tup, "dstack"))
    arrays = arrays if isinstance(arrays, tuple) else (arrays,)
    return concat(list(arrays), axis=2)


def column_stack(tup):
    """1-d arrays as columns, 2-d arrays as they are, joined along the second axis."""
    arrays = as_arrays(*_listed(tup, "column_stack"))
    columns = [reshape(a, (-1, 1)) if a.ndim < 2 else a for a in arrays]
    return concat(columns, axis=1)


# --- the split family: slices of the array (NumPy returns a list)
def _bounds(n, indices_or_sections, name, equal):
    """The (start, stop) of each piece of an axis of length `n`."""
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0:
            raise ValueError(f"{name}: the number of sections must be larger than 0")
        if equal and n % sections:
            raise ValueError(f"{name}: array split does not result in an equal division")
        size, extra = divmod(n, sections)
        stops = np.cumsum([size + 1] * extra + [size] * (sections - extra)).tolist()
        starts = [0] + stops[:-1]
        return list(zip(starts, stops))
    points = [int(i) for i in indices_or_sections]
    starts, stops = [0] + points, points + [n]
    return [slice(a, b).indices(n)[:2] for a, b in zip(starts, stops)]


def _split(ary, indices_or_sections, axis, name, equal):
    axis = _axis(axis, ary.ndim, name)
    pieces = _bounds(ary.shape[axis], indices_or_sections, name, equal)
    return [getitem(ary, _along(axis, slice(a, builtins.max(a, b)))) for a, b in pieces]


def _axis(axis, ndim, name):
    if not -ndim <= axis < builtins.max(ndim, 1):
        raise ValueError(f"{name}: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def split(ary, indices_or_sections, axis=0):
    """`ary` cut along `axis` into equal sections (an int, which must divide the length) or at
    the given indices; a list of views, each differentiable.

    >>> import numpy as np, tracker_gpu as tg
    >>> [p.tolist() for p in tg.split(np.arange(6.0), [2, 3])]
    [[0.0, 1.0], [2.0], [3.0, 4.0, 5.0]]
    """
    return _split(ary, indices_or_sections, axis, "split", equal=True)


def array_split(ary, indices_or_sections, axis=0):
    """As `split`, but `sections` need not divide the length: the first pieces are longer."""
    return _split(ary, indices_or_sections, axis, "array_split", equal=False)


def _need(ary, ndim, name):
    if ary.ndim < ndim:
        raise ValueError(f"{name} needs an array of at least {ndim} dimensions, got {ary.ndim}")


def hsplit(ary, indices_or_sections):
    """`split` along the second axis (the first for 1-d arrays)."""
    _need(ary, 1, "hsplit")
    return split(ary, indices_or_sections, axis=1 if ary.ndim > 1 else 0)


def vsplit(ary, indices_or_sections):
    """`split` along the first axis of an array of at least two dimensions."""
    _need(ary, 2, "vsplit")
    return split(ary, indices_or_sections, axis=0)


def dsplit(ary, indices_or_sections):
    """`split` along the third axis of an array of at least three dimensions."""
    _need(ary, 3, "dsplit")
    return split(ary, indices_or_sections, axis=2)


def append(arr, values, axis=None):
    """`values` joined after `arr` along `axis`; both flattened when `axis` is None."""
    arr, values = as_arrays(arr, values)
    if axis is None:
        return concat([reshape(arr, (-1,)), reshape(values, (-1,))], axis=0)
    return concat([arr, values], axis=axis)


# --- rotation
def rot90(m, k=1, axes=(0, 1)):
    """`m` rotated by 90 degrees `k` times in the plane of `axes`, from the first axis towards
    the second (counter-clockwise for a matrix).

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.rot90(np.array([[1, 2], [3, 4]])).tolist()
    [[2, 4], [1, 3]]
    """
    axes = tuple(axes)
    if len(axes) != 2:
        raise ValueError("rot90: axes must name two axes")
    if m.ndim < 2:
        raise ValueError(f"rot90 needs an array of at least two dimensions, got {m.ndim}")
    a, b = (_axis(ax, m.ndim, "rot90") for ax in axes)
    if a == b:
        raise ValueError("rot90: the two axes must differ")
    k %= 4
    if k == 0:
        return m
    if k == 2:
        return flip(flip(m, axis=a), axis=b)
    order = list(range(m.ndim))
    order[a], order[b] = order[b], order[a]
    if k == 1:
        return permute_dims(flip(m, axis=b), tuple(order))
    return flip(permute_dims(m, tuple(order)), axis=b)


# --- pad: constant blocks joined on, or the other modes as an index map along each axis
_INDEX_MODES = {
    "edge": lambda p, n: np.clip(p, 0, n - 1),
    "wrap": lambda p, n: p % n,
    "reflect": lambda p, n: _fold(p % (2 * n - 2), 2 * n - 2) if n > 1 else p * 0,
    "symmetric": lambda p, n: _fold(p % (2 * n), 2 * n - 1),
}


def _fold(q, top):
    """Positions of one period mirrored back into range: `q` below n, `top - q` above."""
    return np.minimum(q, top - q)


def _widths(pad_width, ndim):
    widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (ndim, 2))
    if (widths < 0).any():
        raise ValueError("pad: pad_width must not be negative")
    return widths.tolist()


def pad(array, pad_width, mode="constant", **kwargs):
    """`array` padded by `pad_width` (an int, a (before, after) pair, or one pair per axis).

    Modes: "constant" (`constant_values`, a number or pairs of them, default 0), "edge",
    "reflect" (without repeating the edge), "symmetric" (repeating it) and "wrap", each as
    NumPy pads, axis after axis. The gradient of a mode that repeats elements accumulates.
    """
    widths = _widths(pad_width, array.ndim)
    if mode == "constant":
        values = kwargs.pop("constant_values", 0)
        _no_more(kwargs, mode)
        values = np.broadcast_to(np.asarray(values, dtype=object), (array.ndim, 2)).tolist()
        for axis, (before, after) in enumerate(widths):
            array = _pad_constant(array, axis, before, after, values[axis])
        return array
    if mode not in _INDEX_MODES:
        raise ValueError(
            f"pad: mode {mode!r} is not supported; use 'constant', 'edge', 'reflect', "
            "'symmetric' or 'wrap'"
        )
    if kwargs.pop("reflect_type", "even") != "even":
        raise ValueError("pad: only reflect_type='even' (NumPy's default) is supported")
    _no_more(kwargs, mode)
    for axis, (before, after) in enumerate(widths):
        array = _pad_indexed(array, axis, before, after, _INDEX_MODES[mode], mode)
    return array


def _no_more(kwargs, mode):
    if kwargs:
        raise TypeError(f"pad: unexpected keyword arguments for mode {mode!r}: {sorted(kwargs)}")


def _pad_constant(x, axis, before, after, values):
    plain = data(x)
    xp = namespace_of(plain)
    parts = [x]
    for width, value, at in ((before, values[0], 0), (after, values[1], 1)):
        if width:
            shape = tuple(width if d == axis else n for d, n in enumerate(plain.shape))
            block = xp.full(shape, value, dtype=plain.dtype, device=device_of(plain))
            parts.insert(0 if at == 0 else len(parts), block)
    return concat(parts, axis=axis) if len(parts) > 1 else x


def _pad_indexed(x, axis, before, after, where_from, mode):
    n = x.shape[axis]
    if not (before or after):
        return x
    if n == 0:
        raise ValueError(f"pad: cannot pad an empty axis with mode {mode!r}")
    positions = np.arange(-before, n + after)
    plain = data(x)
    xp = namespace_of(plain)
    index = xp.asarray(where_from(positions, n).astype(np.int64), device=device_of(plain))
    return take(x, index, axis=axis)
