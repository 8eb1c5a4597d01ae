"""NumPy's mathematical functions beyond the standard: `fmax`, `fmin`, `logaddexp2`, `angle`,
`nan_to_num`, `select`, `dot`, `inner`, `partition`, and `numerical_gradient` (NumPy's
`np.gradient`, the finite differences of sampled values, renamed because `tg.gradient` is
Tracker's transform).

Each is written with the library's differentiable functions (where, matmul, tensordot, the
elementwise rules, take_along_axis), so it is differentiable to any order, on every library.

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(lambda x: tg.sum(tg.fmax(x, np.array([np.nan, 2.0]))), np.array([1.0, 1.0]))[0]
array([1., 0.])
"""

import math

import numpy as np

from ..backend import device_of, finfo, isdtype, namespace_of
from ..primitive import Primitive
from ..tracked import data
from .elementwise import (
    PLAIN_FUNCTIONS,
    _as_arrays,
    _binary_signature,
    add,
    astype,
    atan2,
    divide,
    imag,
    is_complex,
    maximum,
    minimum,
    multiply,
    real,
    subtract,
    where,
    zeros_like,
)
from .linalg import tensordot
from .linalg import trace as linalg_trace
from .linalg_base import matmul
from .manipulation import argsort, moveaxis, take_along_axis
from .nn import sigmoid
from .numpy_arrays import as_arrays
from .shape import concat, getitem, reshape

__all__ = [
    "fmax",
    "fmin",
    "logaddexp2",
    "angle",
    "nan_to_num",
    "select",
    "dot",
    "inner",
    "trace",
    "partition",
    "numerical_gradient",
]

_isnan, _isinf = PLAIN_FUNCTIONS["isnan"], PLAIN_FUNCTIONS["isinf"]
_isfinite = PLAIN_FUNCTIONS["isfinite"]
_greater, _less = PLAIN_FUNCTIONS["greater"], PLAIN_FUNCTIONS["less"]
_and = PLAIN_FUNCTIONS["logical_and"]


# --- elementwise
def _nan_ignoring(choose):
    def function(x1, x2, /):
        x1, x2 = as_arrays(x1, x2)
        return where(_isnan(x2), x1, where(_isnan(x1), x2, choose(x1, x2)))

    return function


fmax = _nan_ignoring(maximum)
fmax.__name__ = fmax.__qualname__ = "fmax"
fmax.__doc__ = """The larger of `x1` and `x2`, ignoring nan: where one is nan, the other is the
result and gets the gradient (nan where both are, the gradient going to `x1`). Elsewhere as
`maximum`: a tie splits the gradient evenly.

>>> import numpy as np, tracker_gpu as tg
>>> tg.fmax(np.array([1.0, np.nan]), np.array([np.nan, 2.0]))
array([1., 2.])
"""
fmin = _nan_ignoring(minimum)
fmin.__name__ = fmin.__qualname__ = "fmin"
fmin.__doc__ = """The smaller of `x1` and `x2`, ignoring nan (see `fmax`)."""


def _logaddexp2_forward(xp, x, y):
    x, y = _as_arrays(xp, x, y)
    if hasattr(xp, "logaddexp2"):  # the library's own: NumPy's values and dtypes exactly
        return xp.logaddexp2(x, y)
    return xp.logaddexp(x * _LN2, y * _LN2) / _LN2


_LN2 = math.log(2)


# d/dx logaddexp2(x, y) = sigmoid((x - y) ln 2): 1 and 0 beside an infinite argument, and
# differentiable again where 2**(y - x) overflows, as logaddexp's
def _logaddexp2_vjp(g, ans, x, y):
    return g * sigmoid(multiply(subtract(x, y), _LN2))


logaddexp2 = Primitive(
    "logaddexp2",
    _logaddexp2_forward,
    (_logaddexp2_vjp, lambda g, ans, x, y: _logaddexp2_vjp(g, ans, y, x)),
    saves=("x y", "x y"),
    signature=_binary_signature,
)
logaddexp2.__doc__ = """`log2(2**x1 + 2**x2)`, without overflow (the library's own where it
has one); its gradient is `2**x1 / (2**x1 + 2**x2)`.

>>> import numpy as np, tracker_gpu as tg
>>> float(tg.logaddexp2(np.asarray(1.0), np.asarray(1.0)))
2.0
"""


def angle(z, deg=False):
    """The argument of complex `z` (radians, or degrees with `deg`), `atan2(imag, real)`;
    0 or pi for real `z`. As in PyTorch, the gradient for complex `z` is `g * 1j * z / |z|**2`
    (0 at 0) and none for real `z` (the result is piecewise constant).

    >>> import numpy as np, tracker_gpu as tg
    >>> float(tg.angle(np.asarray(1j), deg=True))
    90.0
    """
    if is_complex(z):
        out = atan2(imag(z), real(z))
    else:
        out = atan2(zeros_like(z), z)
    return multiply(out, 180 / math.pi) if deg else out


def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """`x` with nan, +inf and -inf replaced by `nan`, `posinf` and `neginf` (the largest and
    smallest finite values of the dtype by default); complex values part by part. The gradient
    passes where `x` is finite, and is zero where a value was replaced. `copy` is accepted for
    NumPy's signature: nothing is written in place.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.nan_to_num(np.array([np.nan, 1.0, -np.inf]), neginf=-9.0)
    array([ 0.,  1., -9.])
    """
    (x,) = as_arrays(x)
    xp = namespace_of(data(x))
    if is_complex(x):  # part by part (a finite part's gradient passes), rebuilt where a part
        # was replaced; a finite value is x itself (rebuilt as re + im * 1j, -2 - 0j was -2 + 0j)
        parts = [nan_to_num(p, nan=nan, posinf=posinf, neginf=neginf) for p in (real(x), imag(x))]
        unit = xp.asarray(1j, dtype=x.dtype, device=device_of(data(x)))
        rebuilt = add(astype(parts[0], x.dtype), multiply(astype(parts[1], x.dtype), unit))
        return where(_isfinite(x), x, rebuilt)
    if not isdtype(xp, x.dtype, "real floating"):
        return x
    info = finfo(xp, x.dtype)
    posinf = float(info.max) if posinf is None else posinf
    neginf = float(info.min) if neginf is None else neginf
    infinite = _isinf(x)
    x = where(_and(infinite, _greater(x, 0)), posinf, x)
    x = where(_and(infinite, _less(x, 0)), neginf, x)
    return where(_isnan(x), nan, x)


def select(condlist, choicelist, default=0):
    """The element of the first choice whose condition holds, `default` where none does;
    conditions, choices and `default` broadcast. Differentiable in the choices and `default`.

    >>> import numpy as np, tracker_gpu as tg
    >>> x = np.array([-1.0, 0.5, 3.0])
    >>> tg.select([x < 0, x > 1], [-x, x * 10], default=x)
    array([ 1. ,  0.5, 30. ])
    """
    condlist, choicelist = list(condlist), list(choicelist)
    if len(condlist) != len(choicelist):
        raise ValueError("select: condlist and choicelist must have the same length")
    if not condlist:
        raise ValueError("select with an empty condition list is not possible")
    out = default
    for condition, choice in zip(reversed(condlist), reversed(choicelist)):
        condition = data(condition)
        if not isdtype(namespace_of(condition), condition.dtype, "bool"):
            raise TypeError(f"select: conditions must be boolean arrays, got {condition.dtype}")
        both_numbers = not hasattr(choice, "dtype") and not hasattr(out, "dtype")
        out = where(condition, *(as_arrays(choice, out) if both_numbers else (choice, out)))
    return out


# --- products
def _scalar(x):
    """A Python number or a 0-d array: `dot` and `inner` multiply by it."""
    return isinstance(x, (int, float, complex)) or x.ndim == 0


def trace(x, /, offset=0, axis1=0, axis2=1, dtype=None):
    """NumPy's trace: the sums along the diagonal `offset` of the axes `axis1` and `axis2`, the
    first two by default (`linalg.trace`, the standard's, takes the last two).

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.trace(np.arange(24.0).reshape(2, 3, 4))
    array([16., 18., 20., 22.])
    """
    return linalg_trace(moveaxis(x, (axis1, axis2), (-2, -1)), offset=offset, dtype=dtype)


def dot(a, b, /):
    """NumPy's dot product: a product with a 0-d operand, the inner product of vectors, the
    matrix product of matrices, and otherwise the sum over the last axis of `a` and the
    second-to-last of `b` (the last for a vector `b`). Nothing is conjugated.

    >>> import numpy as np, tracker_gpu as tg
    >>> float(tg.dot(np.array([1.0, 2.0]), np.array([3.0, 4.0])))
    11.0
    """
    if _scalar(a) or _scalar(b):
        return multiply(a, b)
    if b.ndim == 1 or a.ndim == 1 or (a.ndim == 2 and b.ndim == 2):
        return matmul(a, b)
    return tensordot(a, b, axes=((a.ndim - 1,), (b.ndim - 2,)))


def inner(a, b, /):
    """The sum of products over the last axes of `a` and `b` (a product with a 0-d operand);
    the result's shape is `a.shape[:-1] + b.shape[:-1]`. Nothing is conjugated."""
    if _scalar(a) or _scalar(b):
        return multiply(a, b)
    if a.ndim == 1 and b.ndim == 1:
        return matmul(a, b)
    return tensordot(a, b, axes=((a.ndim - 1,), (b.ndim - 1,)))


# --- partition: the values follow the permutation that sorts them
def partition(a, kth, axis=-1):
    """`a` rearranged along `axis` so that the element at each `kth` position is where sorting
    puts it, smaller (or equal) ones before and larger after. This returns `a` sorted along
    `axis` (one arrangement that NumPy's contract allows: NumPy's own order within each
    part is unspecified); the gradient goes back through the permutation, as `sort`'s does.
    `axis=None` partitions the flattened array.

    >>> import numpy as np, tracker_gpu as tg
    >>> float(tg.partition(np.array([3.0, 1.0, 2.0]), 1)[1])
    2.0
    """
    if axis is None:
        a, axis = reshape(a, (-1,)), 0
    if a.ndim == 0:
        raise ValueError("partition needs an array of at least one dimension")
    n = a.shape[axis]
    for k in np.atleast_1d(np.asarray(kth)).tolist():
        if not -n <= int(k) < n:
            raise ValueError(f"partition: kth {k} is out of bounds for an axis of length {n}")
    order = argsort(a, axis=axis, stable=True)
    return take_along_axis(a, order, axis=axis)


# --- numerical_gradient: NumPy's np.gradient
def numerical_gradient(f, *varargs, axis=None, edge_order=1):
    """NumPy's `np.gradient`: the derivative of sampled values `f` along each of `axis` (all
    by default), by second-order central differences inside and first- or second-order
    (`edge_order`) one-sided differences at the ends. `varargs` gives the spacing: nothing
    (1), one number for every axis, or one per axis, each a number or the 1-d coordinates of
    the samples (unevenly spaced ones allowed). One array for one axis, else a tuple.

    Differentiable in `f` and in tracked spacings or coordinates. Named apart from NumPy's
    function because `tg.gradient` is Tracker's transform.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.numerical_gradient(np.array([1.0, 2.0, 4.0, 7.0]))
    array([1. , 1.5, 2.5, 3. ])
    """
    (f,) = as_arrays(f)
    xp = namespace_of(data(f))
    if not isdtype(xp, f.dtype, ("real floating", "complex floating")):
        f = astype(f, xp.float64)
    axes = _gradient_axes(axis, f.ndim)
    spacings = _spacings(varargs, len(axes))
    if edge_order not in (1, 2):
        raise ValueError("numerical_gradient: edge_order must be 1 or 2")
    out = []
    for ax, spacing in zip(axes, spacings):
        if f.shape[ax] < edge_order + 1:
            raise ValueError(
                "numerical_gradient: shape of the array too small to calculate a numerical "
                f"gradient, at least (edge_order + 1) = {edge_order + 1} elements are required"
            )
        out.append(_derivative(f, ax, _steps(spacing, f.shape[ax]), edge_order))
    return out[0] if len(out) == 1 else tuple(out)


def _gradient_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"numerical_gradient: axis {a} is out of range for {ndim} dims")
    axes = tuple(int(a) % ndim for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError("numerical_gradient: repeated axes")
    return axes


def _spacings(varargs, count):
    if not varargs:
        return [1.0] * count
    if len(varargs) == 1 and np.ndim(data(varargs[0])) == 0:
        return [varargs[0]] * count
    if len(varargs) != count:
        raise TypeError("numerical_gradient: give one spacing, or one per axis")
    return list(varargs)


def _steps(spacing, n):
    """A scalar step, or the steps between coordinates (a scalar if they are all equal)."""
    if np.ndim(data(spacing)) == 0:
        return spacing
    if spacing.ndim != 1 or spacing.shape[0] != n:
        raise ValueError("numerical_gradient: coordinates must be 1-d, one per sample")
    steps = subtract(getitem(spacing, slice(1, None)), getitem(spacing, slice(None, -1)))
    plain = data(steps)
    if n > 1 and bool(namespace_of(plain).all(plain == plain[0])):  # as NumPy decides
        return getitem(steps, 0)
    return steps


def _part(f, ax, start, stop=None):
    """`f[start:stop]` along `ax` (one position, kept as an axis, where `stop` is None)."""
    stop = start + 1 if stop is None else stop
    key = (slice(None),) * ax + (slice(start, stop if stop != 0 else None), Ellipsis)
    return getitem(f, key)


def _derivative(f, ax, dx, edge_order):
    uniform = np.ndim(data(dx)) == 0
    n = f.shape[ax]
    if uniform:
        inside = divide(subtract(_part(f, ax, 2, n), _part(f, ax, 0, n - 2)), multiply(dx, 2.0))
        first, last = _ends_uniform(f, ax, dx, edge_order)
    else:
        inside = _inside_uneven(f, ax, dx)
        first, last = _ends_uneven(f, ax, dx, edge_order)
    return concat([first, inside, last], axis=ax)


def _ends_uniform(f, ax, dx, edge_order):
    n = f.shape[ax]
    if edge_order == 1:
        first = divide(subtract(_part(f, ax, 1), _part(f, ax, 0)), dx)
        last = divide(subtract(_part(f, ax, n - 1), _part(f, ax, n - 2)), dx)
        return first, last
    first = _combine(f, ax, (0, 1, 2), [divide(c, dx) for c in (-1.5, 2.0, -0.5)])
    last = _combine(f, ax, (n - 3, n - 2, n - 1), [divide(c, dx) for c in (0.5, -2.0, 1.5)])
    return first, last


def _combine(f, ax, positions, weights):
    """`sum(w * f[p])` over the positions along `ax`, in order."""
    total = None
    for p, w in zip(positions, weights):
        term = multiply(_weight(w, f, ax), _part(f, ax, p))
        total = term if total is None else add(total, term)
    return total


def _weight(w, f, ax):
    """A weight (a number, or one per position along `ax`) shaped to multiply slices of `f`."""
    if np.ndim(data(w)) == 0:
        return w
    return reshape(w, (-1,) + (1,) * (f.ndim - ax - 1))


def _inside_uneven(f, ax, dx):
    # The three-point derivative at x_i from the steps h1 = x_i - x_{i-1}, h2 = x_{i+1} - x_i.
    h1, h2 = getitem(dx, slice(None, -1)), getitem(dx, slice(1, None))
    total = add(h1, h2)
    a = divide(-h2, multiply(h1, total))
    b = divide(subtract(h2, h1), multiply(h1, h2))
    c = divide(h1, multiply(h2, total))
    n = f.shape[ax]
    parts = [_part(f, ax, 0, n - 2), _part(f, ax, 1, n - 1), _part(f, ax, 2, n)]
    out = None
    for w, p in zip((a, b, c), parts):
        term = multiply(_weight(w, f, ax), p)
        out = term if out is None else add(out, term)
    return out


def _ends_uneven(f, ax, dx, edge_order):
    n = f.shape[ax]
    m = dx.shape[0]
    if edge_order == 1:
        first = divide(subtract(_part(f, ax, 1), _part(f, ax, 0)), getitem(dx, 0))
        last = divide(subtract(_part(f, ax, n - 1), _part(f, ax, n - 2)), getitem(dx, m - 1))
        return first, last
    h1, h2 = getitem(dx, 0), getitem(dx, 1)
    total = add(h1, h2)
    weights = (
        -divide(add(multiply(h1, 2.0), h2), multiply(h1, total)),
        divide(total, multiply(h1, h2)),
        -divide(h1, multiply(h2, total)),
    )
    first = _combine(f, ax, (0, 1, 2), weights)
    h1, h2 = getitem(dx, m - 2), getitem(dx, m - 1)
    total = add(h1, h2)
    weights = (
        divide(h2, multiply(h1, total)),
        -divide(total, multiply(h1, h2)),
        divide(add(multiply(h2, 2.0), h1), multiply(h2, total)),
    )
    last = _combine(f, ax, (n - 3, n - 2, n - 1), weights)
    return first, last
