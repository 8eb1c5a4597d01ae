"""Linear algebra: the Array API `linalg` extension (standard 2024.12) and Tracker's extras
(`kron`, `diagm`, `logdet`), all differentiable and batched over leading dimensions.

Forwards call the backend's `xp.linalg`; functions that are exact in terms of other rules
(`trace`, `diagonal`, `outer`, `cross`, `matrix_power`, the norms, `kron`, `diagm`) are
composites, differentiable to any order for free. Every vjp is written with this package's
functions, so every rule here is twice differentiable (`nest=True`).

Conventions, as in PyTorch and JAX:
- `cholesky`, `eigh` and `eigvalsh` read one triangle of their input, which is taken to be
  symmetric: the gradient they return is symmetric.
- `eigh` and `svd` need distinct eigenvalues / singular values for the gradient of their
  vectors (it involves 1 / (w_j - w_i)); `eigvalsh` and `svdvals` do not (to first order).
  Losses of eigen- or singular vectors should not depend on their signs (the gauge).
- `svd(x, full_matrices=True)` (the standard's default) is differentiable for square `x` only;
  pass `full_matrices=False` for the reduced, differentiable factorisation. Likewise
  `qr(x, mode="complete")` for `x` with more rows than columns.
- `det`, `slogdet`, `logdet`, `inv` and `solve` need a nonsingular matrix for the gradient;
  `pinv` a matrix of locally constant rank. The `sign` of `slogdet`, `matrix_rank` and the
  `ord=0` vector norm are not differentiable (no gradient).

Complex matrices (PyTorch's convention: the gradient of a real loss in z = a + ib is
dL/da + i dL/db) are differentiated by every function here: the vjps use conjugate
transposes; `vecdot` conjugates its first argument, as the standard says; `cholesky`, `eigh`
and `eigvalsh` take Hermitian input and return Hermitian gradients; eigenvalues, singular
values and `logabsdet` are real, and the `sign` of a complex `slogdet` is differentiable;
`logdet` of a complex matrix is the complex logarithm. Losses of the vectors of `eigh` and
`svd` must not depend on their phases (e.g. `abs` of them, or `U @ diag(S) @ Vh`); that is
not checked. A real argument of a complex product gets the real part of its gradient.

The rules live in three modules: `linalg_base` (the products, `solve` and `inv`, and the shared
helpers), `decompositions` (`cholesky`, `qr`, `eigh`, `eigvalsh`, `svd`, `svdvals`, `pinv`) and
this one, which holds the rest and lists the whole extension in `__all__`.

Multi-output factorisations (`qr`, `eigh`, `svd`) are one tape node holding their outputs
packed along the last axis; the named tuple's fields are slices of it.

>>> import numpy as np, tracker_gpu as tg
>>> A = np.array([[1.0, 2.0], [3.0, 4.0]])
>>> tg.gradient(lambda x: tg.sum(A @ x), np.array([1.0, 1.0]))[0]
array([4., 6.])
>>> tg.gradient(tg.linalg.det, A)[0]  # det(A) * inv(A).T
array([[ 4., -3.],
       [-2.,  1.]])
"""

import math
import operator
from collections import namedtuple

import numpy as np

from ..backend import device_of
from ..primitive import Primitive, no_gradient, tracking
from ..tracked import data, istracked
from . import decompositions
from .decompositions import *  # noqa: F403 (re-exported: part of the extension)
from .decompositions import svdvals
from .elementwise import abs as _abs
from .elementwise import (
    as_floating,
    conj,
    is_complex,
    mask,
    multiply,
    real,
    real_dtype,
    subtract,
    where,
)
from .elementwise import conjugate_derivative as _conj
from .elementwise import sign as _sign
from .linalg_base import _H, _eye, _tracked, _xp, inv, matmul, matrix_transpose, solve
from .reductions import expand, sumabs2_of
from .reductions import max as _max
from .reductions import min as _min
from .reductions import sum as _sum
from .shape import concat, expand_dims, permute_dims, reshape

__all__ = [
    "matmul",
    "matrix_transpose",
    "tensordot",
    "vecdot",
    "solve",
    "inv",
    "det",
    "slogdet",
    "logdet",
    "matrix_rank",
    "matrix_norm",
    "vector_norm",
    "matrix_power",
    "trace",
    "diagonal",
    "outer",
    "cross",
    "kron",
    "diagm",
    "SlogdetResult",
] + decompositions.__all__  # the factorisations, listed once in their module

SlogdetResult = namedtuple("SlogdetResult", ["sign", "logabsdet"])


# --- helpers
def _native(xp, name):
    """The backend's `xp.linalg.<name>`, or None where it has none."""
    return getattr(getattr(xp, "linalg", None), name, None)


def _as_matrix(v):
    """A batch of scalars (...) as (..., 1, 1), to scale a batch of matrices."""
    return reshape(v, tuple(v.shape) + (1, 1))


# --- products (matrix_transpose and matmul are in linalg_base)
def tensordot(x1, x2, /, *, axes=2):
    """Contract `axes` of `x1` with those of `x2` (an int: the last of x1 with the first of x2)."""
    a1, a2 = _contracted(x1, x2, axes)
    free1 = tuple(a for a in range(x1.ndim) if a not in a1)
    free2 = tuple(a for a in range(x2.ndim) if a not in a2)
    rows, k, cols = (math.prod(x1.shape[a] for a in free1), math.prod(x1.shape[a] for a in a1),
                     math.prod(x2.shape[a] for a in free2))  # fmt: skip
    left = reshape(permute_dims(x1, free1 + a1), (rows, k))  # explicit sizes: k may be 0
    right = reshape(permute_dims(x2, a2 + free2), (k, cols))
    out_shape = tuple(x1.shape[a] for a in free1) + tuple(x2.shape[a] for a in free2)
    return reshape(matmul(left, right), out_shape)


def _contracted(x1, x2, axes):
    """tensordot's `axes` as two tuples of axes of `x1` and `x2`, checked as NumPy checks them
    (a wrong pair was reshaped into a product of other axes, silently)."""
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        n = int(axes)
        if not 0 <= n <= min(x1.ndim, x2.ndim):
            raise ValueError(f"tensordot: axes={n} contracts more axes than x1 ({x1.ndim}) or "
                             f"x2 ({x2.ndim}) has")  # fmt: skip
        pairs = (tuple(range(x1.ndim - n, x1.ndim)), tuple(range(n)))
    else:
        first, second = axes
        pairs = tuple(tuple(p) if isinstance(p, (list, tuple)) else (p,) for p in (first, second))
    found = []
    for name, x, part in (("x1", x1, pairs[0]), ("x2", x2, pairs[1])):
        if any(not -x.ndim <= int(a) < x.ndim for a in part):
            raise ValueError(f"tensordot: axes {part} out of range for {name} of {x.ndim} dims")
        part = tuple(int(a) % x.ndim for a in part)
        if len(set(part)) != len(part):
            raise ValueError(f"tensordot: duplicate axes {part} of {name}")
        found.append(part)
    sizes = [tuple(x.shape[a] for a in part) for x, part in zip((x1, x2), found)]
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"tensordot: the contracted axes {found[0]} of x1 (sizes {sizes[0]}) and {found[1]} "
            f"of x2 (sizes {sizes[1]}) must pair off with equal sizes"
        )
    return found


def _from_the_end(name, x1, x2, axis):
    """`axis` counted from the end (negative). A positive one counts in each operand (NumPy's
    meaning), which differs between operands of different ranks: refused, as the standard
    (array-api-strict) refuses it (the gradient took it in the broadcast shape)."""
    if axis < 0:
        return axis
    if x1.ndim != x2.ndim:
        raise ValueError(
            f"{name}: axis={axis} is a different axis of x1 ({x1.ndim} dims) and x2 ({x2.ndim} "
            f"dims); count it from the end, as the standard does: axis={axis - x1.ndim} (x1's) "
            f"or axis={axis - x2.ndim} (x2's)"
        )
    return axis - x1.ndim


def vecdot(x1, x2, /, *, axis=-1):
    """The dot product of `x1` and `x2` along `axis`, broadcasting the other axes: the sum of
    `conj(x1) * x2` (the standard conjugates the first argument). The contracted axis must
    have the same size in both, as the standard says."""
    axis = _from_the_end("vecdot", x1, x2, axis)
    if x1.shape[axis] != x2.shape[axis]:
        raise ValueError(
            f"vecdot: axis {axis} has size {x1.shape[axis]} in x1 and {x2.shape[axis]} in x2; "
            f"it must be the same in both (it is not broadcast)"
        )
    same = x1 is x2 and x1.ndim == 1 and istracked(x1)
    if same and tracking() and not is_complex(x1):  # sum(x * x): a sumabs2 node
        value, how = x1._xp.vecdot(x1.data, x1.data), (_vecdot.forward, (x1._node,) * 2, {}, False)
        return sumabs2_of(x1._node, x1.data, x1._xp, value, how)
    return _vecdot(x1, x2, axis=axis)


def _vecdot_vjp(other):
    def vjp(g, ans, x1, x2, axis=-1):  # axis < 0 (`_from_the_end`): where g lacks it
        if other:  # x1's: out = sum(conj(x1) * x2) is conjugate-linear in x1: conj(g) * x2
            g = _conj(g)
        return multiply(expand_dims(g, axis=axis), (x1, x2)[other])

    return vjp


_vecdot = Primitive(
    "vecdot",
    lambda xp, x1, x2, axis=-1: xp.vecdot(x1, x2, axis=axis),
    (_vecdot_vjp(1), _vecdot_vjp(0)),
    saves=("x2", "x1"),
)


def outer(x1, x2, /):
    """The outer product of two vectors: `out[i, j] = x1[i] * x2[j]`."""
    if x1.ndim != 1 or x2.ndim != 1:
        raise ValueError(
            f"outer takes two vectors, got {x1.ndim} and {x2.ndim} dimensions (as the standard's "
            "linalg.outer); flatten them first for NumPy's np.outer: outer(reshape(x1, (-1,)), "
            "reshape(x2, (-1,)))"
        )
    return multiply(expand_dims(x1, axis=-1), x2)


def kron(x1, x2, /):
    """The Kronecker product (Tracker's `kron`): blocks `x1[i, j] * x2`, for any equal rank
    (the lower-rank argument gets leading axes of length 1, as in NumPy)."""
    nd = max(x1.ndim, x2.ndim)
    s1 = (1,) * (nd - x1.ndim) + tuple(x1.shape)
    s2 = (1,) * (nd - x2.ndim) + tuple(x2.shape)
    a = reshape(x1, tuple(d for n in s1 for d in (n, 1)))
    b = reshape(x2, tuple(d for n in s2 for d in (1, n)))
    return reshape(multiply(a, b), tuple(n * m for n, m in zip(s1, s2)))


def cross(x1, x2, /, *, axis=-1):
    """The cross product of 3-vectors along `axis`, with broadcasting."""
    axis = _from_the_end("cross", x1, x2, axis)
    if x1.shape[axis] != 3 or x2.shape[axis] != 3:
        raise ValueError(
            f"cross needs vectors of length 3 along axis {axis}, got shapes "
            f"{tuple(x1.shape)} and {tuple(x2.shape)}"
        )
    if not _tracked(x1, x2) and _native(_xp(x1), "cross"):
        return _xp(x1).linalg.cross(x1, x2, axis=axis)
    return _cross(x1, x2, axis=axis)


def _cross_forward(xp, x1, x2, *, axis):
    if _native(xp, "cross"):  # the library's own: its value bit for bit
        return xp.linalg.cross(x1, x2, axis=axis)
    tail = (slice(None),) * (-axis - 1)
    a = [x1[(Ellipsis, i) + tail] for i in range(3)]
    b = [x2[(Ellipsis, i) + tail] for i in range(3)]
    return xp.stack([a[i] * b[j] - a[j] * b[i] for i, j in ((1, 2), (2, 0), (0, 1))], axis=axis)


# x1 x x2 is linear in each: the adjoint of x1 -> x1 x x2 is g -> conj(x2) x g, and of
# x2 -> x1 x x2 is g -> g x conj(x1) (a cross product's matrix is antisymmetric)
_cross = Primitive(
    "cross",
    _cross_forward,
    (
        lambda g, ans, x1, x2, *, axis: cross(_conj(x2), g, axis=axis),
        lambda g, ans, x1, x2, *, axis: cross(g, _conj(x1), axis=axis),
    ),
    saves=("x2", "x1"),
)


# --- diagonals
def diagonal(x, /, *, offset=0):
    """The diagonal `offset` of each matrix in `x` (..., M, N): a strided slice, so its
    gradient scatters back onto that diagonal."""
    if not _tracked(x) and _native(_xp(x), "diagonal"):
        return _xp(x).linalg.diagonal(x, offset=offset)
    m, n = x.shape[-2:]
    length = min(m, n - offset) if offset >= 0 else min(m + offset, n)
    flat = reshape(x, tuple(x.shape[:-2]) + (m * n,))
    if length <= 0:
        return flat[..., 0:0]
    start = offset if offset >= 0 else -offset * n
    return flat[..., start : start + (length - 1) * (n + 1) + 1 : n + 1]


def trace(x, /, *, offset=0, dtype=None):
    """The sum of the diagonal `offset` of each matrix in `x`."""
    if not _tracked(x) and _native(_xp(x), "trace"):
        return _xp(x).linalg.trace(x, offset=offset, dtype=dtype)
    return _sum(diagonal(x, offset=offset), axis=-1, dtype=dtype)


def diagm(v, /, *, k=0):
    """Tracker's `diagm(k => v)`: the square matrix with `v` (..., L) on diagonal `k`
    (shape (..., L + |k|, L + |k|))."""
    length = v.shape[-1]
    size = length + abs(k)
    if k:
        plain = data(v)
        pad_shape = tuple(v.shape[:-1]) + (abs(k),)
        pad = _xp(v).zeros(pad_shape, dtype=plain.dtype, device=device_of(plain))
        v = concat([v, pad], axis=-1)
    # Rows (k >= 0) or columns (k < 0) of the shifted identity, scaled by v.
    return multiply(expand_dims(v, axis=-1 if k >= 0 else -2), _eye(v, size, k))


# --- determinants
det = Primitive(
    "det",
    lambda xp, x, /: xp.linalg.det(x),
    (lambda g, ans, x: multiply(_as_matrix(g * _conj(ans)), _H(inv(x))),),
    saves="x ans",
    doc="The determinant of each matrix in `x`.",
)


def _slogdet_forward(xp, x):
    sign, logabsdet = xp.linalg.slogdet(x)
    if logabsdet.dtype != sign.dtype:  # complex: packed with the complex sign
        logabsdet = xp.astype(logabsdet, sign.dtype)
    return xp.stack([sign, logabsdet], axis=-1)


def _slogdet_vjp(g, ans, x):
    # d logabsdet = Re tr(x^-1 dx); a complex sign s moves too: ds = s i Im tr(x^-1 dx), so
    # the gradient is c x^-H with c = g_logabsdet - i Im(conj(g_sign) s) (PyTorch's rule).
    c = g[..., 1]
    if is_complex(ans):
        c = real(c)  # logabsdet is real
        t = multiply(conj(g[..., 0]), ans[..., 0])
        c = subtract(c, subtract(t, conj(t)) * 0.5)
    return multiply(_as_matrix(c), _H(inv(x)))


_slogdet = Primitive("slogdet", _slogdet_forward, (_slogdet_vjp,), saves="x ans")


def slogdet(x, /):
    """`(sign, logabsdet)` of the determinant; `logabsdet` is differentiable, and so is the
    sign of a complex matrix (on the unit circle; a real sign is a plain array)."""
    if not _tracked(x):
        return SlogdetResult(*_xp(x).linalg.slogdet(x))
    both = _slogdet(x)
    if is_complex(both):
        return SlogdetResult(both[..., 0], real(both[..., 1]))
    return SlogdetResult(_slogdet_sign(both), both[..., 1])


_slogdet_sign = no_gradient("slogdet_sign", lambda xp, both: both[..., 0])


def _logdet_complex_forward(xp, x):
    sign, logabsdet = xp.linalg.slogdet(x)
    return xp.log(sign) + logabsdet


_logdet_complex = Primitive(
    "logdet",
    _logdet_complex_forward,
    (lambda g, ans, x: multiply(_as_matrix(g), _H(inv(x))),),  # holomorphic: g x^-H
    saves="x",
)


def logdet(x, /):
    """Tracker's `logdet`: `log(det(x))`, NaN where the determinant of a real `x` is negative;
    complex `x` has the complex logarithm (principal branch)."""
    if is_complex(x):
        return _logdet_complex(x)
    sign, logabsdet = slogdet(x)
    return where(sign < 0, math.nan, logabsdet)


# --- rank
def matrix_rank(x, /, *, rtol=None):
    """The rank of each matrix in `x` (integers; not differentiable)."""
    if rtol is None:
        return _matrix_rank(x)
    return _matrix_rank_rtol(x, rtol)


_matrix_rank = no_gradient("matrix_rank", lambda xp, x: xp.linalg.matrix_rank(x))
_matrix_rank_rtol = no_gradient(
    "matrix_rank", lambda xp, x, rtol: xp.linalg.matrix_rank(x, rtol=rtol)
)


# --- powers
def _identity_like_forward(xp, x):
    return xp.zeros_like(x) + xp.eye(x.shape[-1], dtype=x.dtype, device=device_of(x))


_power_zero = Primitive("matrix_power_0", _identity_like_forward, (None,))


def matrix_power(x, n, /):
    """`x` multiplied by itself `n` times (an integer; negative powers of the inverse)."""
    n = operator.index(n)
    if not _tracked(x) and _native(_xp(x), "matrix_power"):
        return _xp(x).linalg.matrix_power(x, n)
    if n == 0:
        return _power_zero(x)
    if n < 0:
        x, n = inv(x), -n
    if n == 3:  # NumPy's order, (x x) x, so that the value is its value bit for bit
        return matmul(matmul(x, x), x)
    result = None
    while True:  # binary powering, NumPy's order from there on
        if n & 1:
            result = x if result is None else matmul(result, x)
        n >>= 1
        if not n:
            return result
        x = matmul(x, x)


# --- norms
def _norm2_forward(xp, x, axis=None, keepdims=False):
    if _native(xp, "vector_norm"):
        return xp.linalg.vector_norm(x, axis=axis, keepdims=keepdims, ord=2)
    square = xp.abs(x) ** 2 if is_complex(x) else x * x
    return xp.sqrt(xp.sum(square, axis=axis, keepdims=keepdims))


def _norm2_vjp(g, ans, x, axis=None, keepdims=False):
    # g * x / |x|, and 0 (a subgradient) where the norm is 0: masked, so that the slope of
    # the gradient there is 0 too (PyTorch's; g / (|x| + 1) there would have slope g)
    zero = ans == 0
    share = mask(~zero, g / where(zero, 1.0, ans))
    return multiply(expand(share, x, axis, keepdims), x)


_norm2 = Primitive("vector_norm", _norm2_forward, (_norm2_vjp,), saves="x ans")


def _norm0_forward(xp, x, axis=None, keepdims=False):
    count = xp.astype(x != 0, real_dtype(xp, x.dtype))  # a norm is real, of x's precision
    return xp.sum(count, axis=axis, keepdims=keepdims)


_norm0 = Primitive("vector_norm_0", _norm0_forward, (None,))


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    """The `ord`-norm of `x` over `axis` (None: all axes): 2, 1, inf, -inf, 0 (the count of
    nonzeros, no gradient) or any other real `p`. The 2-norm's gradient at 0 is 0."""
    if not _tracked(x) and _native(_xp(x), "vector_norm"):
        return _xp(x).linalg.vector_norm(x, axis=axis, keepdims=keepdims, ord=ord)
    x = as_floating(x)  # a norm of integers is a float, as NumPy's
    kw = {"axis": axis, "keepdims": keepdims}
    if ord == 2:
        return _norm2(x, **kw)
    if ord == 0:
        return _norm0(x, **kw)
    if ord == 1:
        return _sum(_abs(x), **kw)
    if ord == math.inf:
        return _largest(_abs(x), **kw)
    if ord == -math.inf:
        return _min(_abs(x), **kw)
    return _normp(x, ord=ord, **kw)


def _largest(values, axis=None, keepdims=False):
    """The largest of the non-negative `values` over `axis`; 0 over none (NumPy's norms of an
    empty array: a maximum over no element has no value of its own)."""
    shape = tuple(values.shape)
    axes = range(len(shape)) if axis is None else (axis,) if isinstance(axis, int) else axis
    if math.prod(shape[a] for a in axes) == 0:
        return _sum(values, axis=axis, keepdims=keepdims)  # zeros, of the reduced shape
    return _max(values, axis=axis, keepdims=keepdims)


def _normp_forward(xp, x, ord, axis=None, keepdims=False):
    if _native(xp, "vector_norm"):
        return xp.linalg.vector_norm(x, axis=axis, keepdims=keepdims, ord=ord)
    return xp.sum(xp.abs(x) ** ord, axis=axis, keepdims=keepdims) ** (1 / ord)


def _normp_vjp(g, ans, x, ord, axis=None, keepdims=False):
    # sign(x) |x|^(p-1) / |x|_p^(p-1) (PyTorch's), 0 where x is 0 and where the norm is 0
    # (for p < 1, where |x|^(p-1) is infinite at 0, no division by the norm at all)
    scaled = _sign(x) * mask(x != 0, _abs(where(x == 0, 1.0, x)) ** (ord - 1))
    if ord < 1:
        return expand(g * ans ** (1 - ord), x, axis, keepdims) * scaled
    zero = ans == 0
    share = mask(~zero, g / where(zero, 1.0, ans) ** (ord - 1))
    return expand(share, x, axis, keepdims) * scaled


_normp = Primitive("vector_norm_p", _normp_forward, (_normp_vjp,), saves="x ans")


def matrix_norm(x, /, *, keepdims=False, ord="fro"):
    """The `ord`-norm of each matrix in `x`: 'fro', 'nuc', 2 / -2 (largest / smallest singular
    value), 1 / -1 (max / min column sum of |x|), inf / -inf (max / min row sum of |x|)."""
    if not _tracked(x) and _native(_xp(x), "matrix_norm"):
        return _xp(x).linalg.matrix_norm(x, keepdims=keepdims, ord=ord)
    if ord == "fro":
        return _norm2(x, axis=(-2, -1), keepdims=keepdims)
    if ord == "nuc":
        out = _sum(svdvals(x), axis=-1)
    elif ord in (2, -2):
        out = (_largest if ord == 2 else _min)(svdvals(x), axis=-1)
    elif ord in (1, -1, math.inf, -math.inf):
        sums = _sum(_abs(x), axis=-2 if ord in (1, -1) else -1)
        out = (_largest if ord > 0 else _min)(sums, axis=-1)
    else:
        raise ValueError(
            f"matrix_norm ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, got {ord!r}"
        )
    return _as_matrix(out) if keepdims else out
