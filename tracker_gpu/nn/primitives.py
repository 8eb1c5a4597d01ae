"""The primitives the layers are made of: `linear`, `gelu_tanh`, `im2col` and `col2im`.

`linear` is the affine map of `Dense` and `Conv` as one tape node, whose weight gradient comes
out laid out like the weight. `im2col` turns the windows of an image with any number of
spatial axes (`(n, c, length)`, NCHW, `(n, c, depth, height, width)`) into the rows of a
matrix, so that convolutions and pools are matmuls and reductions, and `col2im` is its adjoint
(each one's vjp is the other).
"""

import itertools
import math

import numpy as np

from ..backend import HALF, added_into, device_of, dtype_name, into, namespace_of
from ..primitive import Primitive
from ..rules.elementwise import add, astype, multiply, subtract, tanh
from ..rules.linalg import matmul, matrix_transpose
from ..rules.native_hook import native
from ..rules.reductions import sum as _sum
from ..rules.rows import is_numpy_float, leading_sum
from ..rules.shape import reshape
from ..tracked import TrackedArray, data

__all__ = ["linear", "gelu_tanh", "im2col", "col2im"]


# --- im2col and col2im: adjoint primitives, so convolutions and pools are matmuls
def _sides(pad):
    """One axis's padding as `(before, after)`: an int pads both sides alike."""
    return (pad, pad) if isinstance(pad, int) else tuple(pad)


def _output_size(size, kernel, stride, pad, dilation=1):
    before, after = _sides(pad)
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def _geometry(shape, kernel, stride, pad, dilation):
    """Every argument as one tuple per spatial axis: sizes, kernel, stride, (before, after)
    padding, dilation; and the output's spatial size."""
    size, rank = tuple(shape[2:]), len(kernel)
    dilation = (1,) * rank if dilation is None else tuple(dilation)
    sides = tuple(_sides(p) for p in pad)
    out = tuple(map(_output_size, size, kernel, stride, sides, dilation))
    return size, sides, dilation, out


def _windows(kernel, stride, out, dilation):
    """The slices of a padded image that each kernel offset sees, offsets in row-major order."""
    for offset in itertools.product(*(range(k) for k in kernel)):
        yield (slice(None), slice(None)) + tuple(
            slice(i * d, i * d + s * (o - 1) + 1, s)
            for i, d, s, o in zip(offset, dilation, stride, out)
        )


def _inner(size, sides):
    """The key of the unpadded image inside the padded one."""
    return (slice(None), slice(None)) + tuple(
        slice(before, before + n) for n, (before, _) in zip(size, sides)
    )


def _im2col_forward(xp, x, *, kernel, stride, pad, fill=0.0, dilation=None):
    size, sides, dilation, out = _geometry(x.shape, kernel, stride, pad, dilation)
    n, c = x.shape[:2]
    if any(before or after for before, after in sides):
        shape = (n, c, *(m + before + after for m, (before, after) in zip(size, sides)))
        padded = xp.full(shape, fill, dtype=x.dtype, device=device_of(x))
        padded[_inner(size, sides)] = x
        x = padded
    patches = xp.stack([x[key] for key in _windows(kernel, stride, out, dilation)], axis=-1)
    rank = len(size)  # (n, c, *out, k) to (n, *out, c, k)
    patches = xp.permute_dims(patches, (0, *range(2, 2 + rank), 1, 2 + rank))
    return xp.reshape(patches, (n * math.prod(out), c * math.prod(kernel)))


def _col2im_forward(xp, cols, *, shape, kernel, stride, pad, dilation=None):
    size, sides, dilation, out = _geometry(shape, kernel, stride, pad, dilation)
    n, c, rank = shape[0], shape[1], len(size)
    cols = xp.reshape(cols, (n, *out, c, math.prod(kernel)))
    cols = xp.permute_dims(cols, (0, rank + 1, *range(1, rank + 1), rank + 2))  # (n, c, *out, k)
    padded = (n, c, *(m + before + after for m, (before, after) in zip(size, sides)))
    z = xp.zeros(padded, dtype=cols.dtype, device=device_of(cols))
    for k, key in enumerate(_windows(kernel, stride, out, dilation)):
        z[key] = z[key] + cols[..., k]
    return z[_inner(size, sides)] if padded != tuple(shape) else z


im2col = Primitive(
    "im2col",
    _im2col_forward,
    (
        lambda g, ans, x, *, kernel, stride, pad, fill=0.0, dilation=None: col2im(
            g, shape=tuple(x.shape), kernel=kernel, stride=stride, pad=pad, dilation=dilation
        ),
    ),
    saves="",
    doc="""Patches of an `(n, c, *spatial)` image (any number of spatial axes) as rows:
    `(n * prod(out), c * prod(kernel))`, the rows in the order of `(n, *out)`.

    `kernel`, `stride`, `pad` and `dilation` (the spacing of the kernel's taps, 1 by default)
    hold one entry per spatial axis; an entry of `pad` is an int (both sides) or a pair
    `(before, after)`, filled with `fill`. Its vjp is `col2im`.

    >>> import numpy as np
    >>> x = np.arange(5.0).reshape(1, 1, 5)
    >>> im2col(x, kernel=(2,), stride=(2,), pad=((0, 1),))
    array([[0., 1.],
           [2., 3.],
           [4., 0.]])
    """,
)
col2im = Primitive(
    "col2im",
    _col2im_forward,
    (
        lambda g, ans, cols, *, shape, kernel, stride, pad, dilation=None: im2col(
            g, kernel=kernel, stride=stride, pad=pad, dilation=dilation
        ),
    ),
    saves="",
    doc="The adjoint of `im2col`: patch rows summed back into an image of `shape`.",
)


# --- the affine map of Dense and Conv: one primitive
def _linear_forward(xp, x, weight, bias):
    y = _rows_matmul(xp, x, _transposed(xp, weight))
    return y if bias is None else added_into(xp, y, bias)  # in place, as `into` says why


def _rows_matmul(xp, x, w):
    """`x @ w` for a 2-d `w`, the leading axes of `x` made one (one BLAS call, not one per
    matrix of a stack: two to three times faster on a `(batch, length, features)` input)."""
    if len(x.shape) <= 2:
        return xp.matmul(x, w)
    rows = xp.reshape(x, (math.prod(x.shape[:-1]), x.shape[-1]))
    return xp.reshape(xp.matmul(rows, w), (*x.shape[:-1], w.shape[-1]))


def _transposed(xp, a):
    """`xp.matrix_transpose(a)` (NumPy's is Python around the array's own `mT`)."""
    return a.mT if type(a) is np.ndarray else xp.matrix_transpose(a)


# The vjps call the library directly on plain arrays (a first-order pass: the hot path of
# training) and this package's functions on tracked ones (a nested pass, differentiable again).
def _plain_namespace(*values):
    """The library of plain arrays, or None if any of `values` is tracked."""
    if any(type(v) is TrackedArray for v in values):
        return None
    return namespace_of(values[0])


def _linear_vjp_x(g, ans, x, weight, bias):
    xp = _plain_namespace(g, weight)
    return _rows_matmul(xp, g, weight) if xp is not None else matmul(g, weight)


def _linear_vjp_weight(g, ans, x, weight, bias):
    # g.T @ x over every leading axis: a fresh (out, in) array, laid out like the weight
    n_out, n_in = weight.shape
    if len(x.shape) == 1:
        return multiply(reshape(g, (n_out, 1)), reshape(x, (1, n_in)))
    if len(x.shape) > 2:
        rows = math.prod(x.shape[:-1])
        g, x = reshape(g, (rows, n_out)), reshape(x, (rows, n_in))
    xp = _plain_namespace(g, x)
    if xp is not None:
        return xp.matmul(_transposed(xp, g), x)
    return matmul(matrix_transpose(g), x)


def _linear_vjp_bias(g, ans, x, weight, bias):
    if len(g.shape) == 1:
        return g
    if is_numpy_float(g):
        return leading_sum(g, len(g.shape) - 1)
    axes = tuple(range(len(g.shape) - 1))
    xp = _plain_namespace(g)
    return xp.sum(g, axis=axes) if xp is not None else _sum(g, axis=axes)


linear = Primitive(
    "linear",
    _linear_forward,
    (_linear_vjp_x, _linear_vjp_weight, _linear_vjp_bias),
    saves=("weight", "x", ""),
    doc="""`x @ weight.T + bias` (`bias` may be None), one primitive: `weight` is `(out, in)`.

    The weight's gradient is computed as `g.T @ x`, so it comes out laid out like the weight.
    """,
)


# --- GELU in the tanh approximation: one node, where its composite takes nine
GELU_C, GELU_K = math.sqrt(2 / math.pi), 0.044715


def _gelu_forward(xp, x):
    done = native("gelu", x)
    if done is not None:
        return done
    # in place on the arrays made here: the activations are the largest arrays of a
    # transformer, and each new one is memory to fault in (the same operations in the same order)
    inner = x * x
    inner *= GELU_K
    inner += 1.0
    inner *= x
    inner *= GELU_C
    out = into(xp, "tanh", inner)
    out += 1.0
    out *= x
    out *= 0.5
    return out


def _gelu_vjp(g, ans, x):
    """`g * gelu'(x)`: `0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2)`, `t` the tanh. Half
    dtypes go through float32: `x^2` overflows float16 from |x| = 256, and 0 * inf is nan
    where the slope is 1 or 0."""
    if dtype_name(x.dtype) in HALF:
        wide = namespace_of(data(x)).float32
        return astype(_gelu_vjp(astype(g, wide), ans, astype(x, wide)), g.dtype)
    xp = _plain_namespace(g, x)
    if xp is None:  # a nested pass: the same formula, differentiable again
        square = multiply(x, x)
        t = tanh(multiply(multiply(add(multiply(square, GELU_K), 1.0), x), GELU_C))
        slope = multiply(multiply(x, subtract(1.0, multiply(t, t))), GELU_C)
        slope = multiply(slope, add(multiply(square, 3 * GELU_K), 1.0))
        return multiply(g, multiply(add(add(t, 1.0), slope), 0.5))
    done = native("gelu_vjp", x, g)
    if done is not None:
        return done
    square = x * x  # then as written above, in place on the arrays made here
    t = square * GELU_K
    t += 1.0
    t *= x
    t *= GELU_C
    t = into(xp, "tanh", t)
    slope = t * t
    slope *= -1.0
    slope += 1.0  # 1 - t^2, exactly
    slope *= x
    slope *= GELU_C
    square *= 3 * GELU_K
    square += 1.0
    slope *= square
    t += 1.0
    t += slope
    t *= 0.5
    if g.dtype != t.dtype or g.shape != t.shape:
        return g * t
    t *= g
    return t


gelu_tanh = Primitive(
    "gelu_tanh",
    _gelu_forward,
    (_gelu_vjp,),
    saves="x",
    doc="""GELU in the tanh approximation, `0.5 x (1 + tanh(c (x + 0.044715 x^3)))` with
    `c = sqrt(2 / pi)`, as one primitive (the activation `nn.gelu`).""",
)
