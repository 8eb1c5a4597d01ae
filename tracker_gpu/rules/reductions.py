"""Reductions with `axis` and `keepdims`: sum, prod, mean, max, min, var, std, and sumabs2
(Julia's `sum(abs2, x)`), which `sum(x**2)`, `sum(square(x))` and `sum(x * x)` become.

A reduction's vjp passes the gradient back as a broadcast view, never a filled array.
`max`/`min` share the gradient evenly among all the extrema along the reduced axes (PyTorch's
`amax`/`amin`; `maximum`/`minimum` split ties evenly too), and among the nans where the
extremum is nan (PyTorch's `max`: a nan loss keeps a gradient that shows it). `std` has
gradient 0 where it is 0 (constant features), as PyTorch. `prod` is exact at zeros, to any
order of differentiation. Every reduction refuses, when called, an axis outside the standard's
`[-ndim, ndim)`, `axis=0` of a 0-d array included (NumPy's `sum` takes it, its `mean` does not;
PyTorch takes it): one rule for all of them, and never a pullback that fails after the forward.

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(tg.prod, np.array([2.0, 0.0, 3.0]))[0]
array([0., 6., 0.])
"""

import builtins

import numpy as np

from ..backend import HALF, device_of, dtype_name, namespace_of
from ..primitive import Primitive, no_gradient, record, tracking
from ..tape import Node
from ..tracked import TrackedArray, data
from .elementwise import (
    astype,
    conjugate_derivative,
    is_complex,
    mask,
    multiply,
    nonzero_divide,
    pow,
    real,
    square,
    where,
)
from .shape import broadcast_to, permute_dims, reshape


def normalize_axes(axis, ndim):
    """`axis` (None, an int or a tuple) as a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % ndim if ndim else a for a in axes))


def check_axes(name, axis, ndim):
    """Refuse an `axis` (None, an int or a tuple) outside the standard's `[-ndim, ndim)`."""
    if axis is None:
        return
    for a in (axis,) if isinstance(axis, int) else tuple(axis):
        if not -ndim <= a < ndim:
            raise ValueError(
                f"{name}: axis {a} is out of range for an array of {ndim} dimensions (the "
                f"standard's range is [-{ndim}, {ndim})); a 0-d array takes axis=None only"
            )


def expand(g, x, axis, keepdims):
    """The gradient of a reduction of `x`, broadcast back to `x`'s shape (a view)."""
    shape = tuple(x.shape)
    if not keepdims and axis is not None:
        reduced = normalize_axes(axis, len(shape))
        g = reshape(g, tuple(1 if i in reduced else n for i, n in enumerate(shape)))
    return broadcast_to(g, shape)


def _count(shape, axis):
    n = 1
    for a in normalize_axes(axis, len(shape)):
        n *= shape[a]
    return n


def _in_float32(a):
    """`a` in float32 where it is float16 or bfloat16 (whose arithmetic NumPy and PyTorch
    accumulate in float32), else None."""
    if dtype_name(a.dtype) not in HALF:
        return None
    return astype(a, namespace_of(data(a)).float32)


def _over_count(a, n):
    """`a / n`, `n` a count of elements: through float32 where `a` is a half dtype (a count
    over 65,504 is infinite in float16, and `a / inf` is 0), back in `a`'s dtype."""
    wide = _in_float32(a)
    return a / n if wide is None else astype(wide / n, a.dtype)


def _reduction(name):
    """The forward of a reduction that takes a `dtype` (sum, prod), with the standard's
    signature."""

    reduce = _NUMPY_REDUCE[name]

    def forward(xp, x, /, *, axis=None, dtype=None, keepdims=False):
        check_axes(name, axis, x.ndim)
        if type(x) is np.ndarray:  # what np.sum does for an ndarray, without its dispatch
            return reduce(x, axis=axis, dtype=dtype, keepdims=keepdims)
        return getattr(xp, name)(x, axis=axis, dtype=dtype, keepdims=keepdims)

    return forward


_NUMPY_REDUCE = {"sum": np.add.reduce, "prod": np.multiply.reduce}


def _reduction_without_dtype(name):
    def forward(xp, x, /, *, axis=None, keepdims=False):
        check_axes(name, axis, x.ndim)
        return getattr(xp, name)(x, axis=axis, keepdims=keepdims)

    return forward


_sum = Primitive(
    "sum",
    _reduction("sum"),
    (lambda g, ans, x, axis=None, keepdims=False, dtype=None: expand(g, x, axis, keepdims),),
    saves="",
)


def sum(x, /, *, axis=None, dtype=None, keepdims=False):
    """The sum over `axis`. The sum of a square recorded on the tape (`x**2`, `square(x)`,
    `x * x`) is recorded as `sumabs2(x)`, whose pullback is one fused kernel on the GPU; its
    value is the plain sum of the square, bit for bit."""
    if axis is None and dtype is None and not keepdims and tracking():
        base = squared_base(x)
        if base is not None:
            how = (_sum.forward, (x._node,), {}, False)  # what a tg.compile replay computes
            return sumabs2_of(*base, x._xp, _sum.forward(x._xp, x.data), how)
    return _sum(x, axis=axis, dtype=dtype, keepdims=keepdims)


def _sumabs2_forward(xp, x):
    flat = xp.reshape(x, (-1,))
    # the namespace's matmul (NumPy's `@`), where a CUDA graph's capture is cut on CuPy
    if is_complex(flat):  # |z|^2 = re^2 + im^2, a real number
        re, im = xp.real(flat), xp.imag(flat)
        return xp.matmul(re, re) + xp.matmul(im, im)
    return xp.matmul(flat, flat)


def _sumabs2_vjp(g, ans, x):
    if is_complex(g):  # vecdot(z, z), complex in dtype but real in value: its real part counts
        g = real(g)
    return x * (g * 2)  # the gradient of |z|^2 is 2z


# Julia's sum(abs2, x), computed as the dot product of x with itself (as `x @ x` would be):
# one node, and on the GPU one fused kernel for its pullback.
sumabs2 = Primitive("sumabs2", _sumabs2_forward, (_sumabs2_vjp,), saves="x")


def sumabs2_of(node, x, xp, value, how):
    """A `sumabs2` node over `node` (whose value is `x`) with the value `value`, computed as
    the plain expression it stands for computes it (and so by tg.compile's replay: `how`)."""
    return record(value, xp, sumabs2, (node,), {}, [None, x], how)


def squared_base(y):
    """`(node, value)` of `x` when the real tracked `y` was recorded as `x**2`, `square(x)` or
    `x * x` (each of which saved `x`), else None (the sum of complex squares is no `sumabs2`)."""
    if not isinstance(y, TrackedArray) or y._node is None or is_complex(y.data):
        return None
    node = y._node
    rule, args = node.rule, node.args
    squared = (
        rule is square
        or (rule is multiply and args[0] is args[1])
        or (rule is pow and type(args[1]) in (int, float) and args[1] == 2)
    )
    if not squared or type(args[0]) is not Node or node.saved is None:
        return None
    return args[0], node.saved[1]


mean = Primitive(
    "mean",
    _reduction_without_dtype("mean"),
    (
        lambda g, ans, x, axis=None, keepdims=False: _over_count(
            expand(g, x, axis, keepdims), _count(x.shape, axis)
        ),
    ),
    saves="",
)


# --- prod: the gradient is the product of all the other elements, computed without dividing
def _prod_vjp(g, ans, x, axis=None, keepdims=False, dtype=None):
    if 0 in tuple(x.shape):  # no element, no product of the others (Dask cannot reshape it)
        return expand(g, x, axis, keepdims) * 0
    return expand(g, x, axis, keepdims) * conjugate_derivative(_others_along(x, axis))


prod = Primitive("prod", _reduction("prod"), (_prod_vjp,), saves="x")


def _others_along(x, axis):
    """For each element, the product of the other elements along `axis` (moved last)."""
    ndim = len(x.shape)
    reduced = normalize_axes(axis, ndim)
    kept = tuple(a for a in range(ndim) if a not in reduced)
    order = kept + reduced
    moved = permute_dims(x, order) if order != tuple(range(ndim)) else x
    lead = tuple(moved.shape[: len(kept)])
    others = _others(reshape(moved, lead + (_count(x.shape, axis),)))  # not -1: x may be empty
    others = reshape(others, tuple(moved.shape))
    if order == tuple(range(ndim)):
        return others
    inverse = tuple(sorted(range(ndim), key=lambda i: order[i]))
    return permute_dims(others, inverse)


def _others_forward(xp, x):
    """Exclusive products from the left and the right along the last axis: no division."""
    if x.shape[-1] == 0:
        return xp.ones_like(x)
    ones = xp.ones_like(x[..., :1])
    left = xp.cumulative_prod(xp.concat([ones, x[..., :-1]], axis=-1), axis=-1)
    right = xp.flip(
        xp.cumulative_prod(xp.concat([ones, xp.flip(x, axis=-1)[..., :-1]], axis=-1), axis=-1),
        axis=-1,
    )
    return left * right


def _others_vjp(g, ans, x):
    # d others_i / d x_k = product of all but x_i and x_k (k != i): the "others" of x with x_i
    # set to 1, a tensor one axis larger; n is small wherever second derivatives are taken.
    n = x.shape[-1]
    xp = namespace_of(data(x))
    eye = xp.eye(n, dtype=xp.bool, device=_device(x))
    rows = where(eye, xp.ones_like(data(x))[..., None, :], _expand_rows(x, n))
    return sum(mask(~eye, conjugate_derivative(_others(rows))) * g[..., :, None], axis=-2)


def _expand_rows(x, n):
    return broadcast_to(reshape(x, tuple(x.shape[:-1]) + (1, n)), tuple(x.shape[:-1]) + (n, n))


def _device(x):

    return device_of(data(x))


_others = Primitive("prod_others", _others_forward, (_others_vjp,), saves="x")


# --- max and min: the gradient is shared evenly among the tied extrema (PyTorch's amax), and
# among the nans where the extremum is nan
def _extremum_vjp(g, ans, x, axis=None, keepdims=False):
    reduced = normalize_axes(axis, len(x.shape))
    hit = _extremum_hits(x, ans, reduced=reduced)  # traced in a recorded nested pass
    count = _extremum_count(hit, x, reduced=reduced)
    share = expand(g, x, axis, keepdims) / count
    return mask(hit, share if share.dtype == g.dtype else astype(share, g.dtype))


def _hits_forward(xp, x, ans, *, reduced):
    kept_shape = tuple(1 if i in reduced else n for i, n in enumerate(x.shape))
    ans = xp.reshape(ans, kept_shape)
    # a nan extremum is every nan's (PyTorch's max): the gradient of a nan loss is not lost
    return (x == ans) | (xp.isnan(x) & xp.isnan(ans))


def _count_forward(xp, hit, x, *, reduced):
    # counted in int64, a float32 count for half dtypes: in float16, 65,505 ties were inf
    count = xp.sum(xp.astype(hit, xp.int64), axis=reduced, keepdims=True)
    count = xp.where(count == 0, xp.ones_like(count), count)
    return xp.astype(count, xp.float32 if dtype_name(x.dtype) in HALF else x.dtype)


_extremum_hits = no_gradient("extremum_hits", _hits_forward)
_extremum_count = no_gradient("extremum_count", _count_forward)


max = Primitive("max", _reduction_without_dtype("max"), (_extremum_vjp,), saves="x ans")
min = Primitive("min", _reduction_without_dtype("min"), (_extremum_vjp,), saves="x ans")


# --- composites: differentiable through the rules above
def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    """Variance over `axis`, divided by `n - correction` (real data, as the standard says)."""
    _check_real("var", x)
    check_axes("var", axis, x.ndim)
    wide = _in_float32(x)
    if wide is not None:  # accumulated in float32, as NumPy and PyTorch do; x's dtype out
        return astype(var(wide, axis=axis, correction=correction, keepdims=keepdims), x.dtype)
    return _var(x, axis=axis, correction=correction, keepdims=keepdims)


def _var_forward(xp, x, /, *, axis=None, correction=0.0, keepdims=False):
    # the library's own: its value bit for bit (PyTorch's differs from the sum of squares of
    # the centred values in the last bits)
    return xp.var(x, axis=axis, correction=correction, keepdims=keepdims)


def _var_vjp(g, ans, x, axis=None, correction=0.0, keepdims=False):
    centred = x - mean(x, axis=axis, keepdims=True)
    denominator = builtins.max(_count(x.shape, axis) - correction, 0)
    return expand(g, x, axis, keepdims) * centred * 2.0 / denominator


_var = Primitive("var", _var_forward, (_var_vjp,), saves="x")


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    """Standard deviation over `axis` (the square root of `var`; real data, as the standard
    says)."""
    _check_real("std", x)
    check_axes("std", axis, x.ndim)
    wide = _in_float32(x)
    if wide is not None:  # the root of the float32 variance: rounded to half first, 9e-10 was 0
        return astype(std(wide, axis=axis, correction=correction, keepdims=keepdims), x.dtype)
    return _std_sqrt(var(x, axis=axis, correction=correction, keepdims=keepdims))


def _std_sqrt_vjp(g, ans, v):
    # 1 / (2 std), and 0 where std is 0 (constant data), as PyTorch: not inf * 0 = nan
    return nonzero_divide(g, 1.0, ans * 2)


_std_sqrt = Primitive("std_sqrt", lambda xp, v: xp.sqrt(v), (_std_sqrt_vjp,), saves="ans")


def _check_real(name, x):
    if is_complex(x):
        raise TypeError(
            f"{name} of complex data: the Array API standard defines {name} for real data only; "
            f"take it of the real and imaginary parts (tg.real, tg.imag), or of tg.abs(x)"
        )
