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

from ..backend import device_of, namespace_of
from ..tracked import Primitive, TrackedArray, data
from .elementwise import abs as _abs
from .elementwise import add, divide, multiply, subtract, where
from .reductions import expand, sumabs2
from .reductions import max as _max
from .reductions import min as _min
from .reductions import sum as _sum
from .shape import concat, expand_dims, permute_dims, reshape, squeeze, stack

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
    "cholesky",
    "qr",
    "eigh",
    "eigvalsh",
    "svd",
    "svdvals",
    "pinv",
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
    "QRResult",
    "EighResult",
    "SVDResult",
]

SlogdetResult = namedtuple("SlogdetResult", ["sign", "logabsdet"])
QRResult = namedtuple("QRResult", ["Q", "R"])
EighResult = namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
SVDResult = namedtuple("SVDResult", ["U", "S", "Vh"])


# --- helpers: constants of the derivative are built from plain values, on the data's device
def _xp(x):
    return namespace_of(data(x))


def _tracked(*args):
    return any(isinstance(a, TrackedArray) for a in args)


def _eye(like, n, k=0):
    x = data(like)
    return namespace_of(x).eye(n, k=k, dtype=x.dtype, device=device_of(x))


def _tril(like, n, k=0):
    """A plain lower-triangular mask of ones (diagonal `k` and below), shaped (n, n)."""
    x = data(like)
    xp = namespace_of(x)
    return xp.tril(xp.ones((n, n), dtype=x.dtype, device=device_of(x)), k=k)


def _native(xp, name):
    """The backend's `xp.linalg.<name>`, or None where it has none."""
    return getattr(getattr(xp, "linalg", None), name, None)


def _T(x):
    return matrix_transpose(x)


def _as_matrix(v):
    """A batch of scalars (...) as (..., 1, 1), to scale a batch of matrices."""
    return reshape(v, tuple(v.shape) + (1, 1))


def _diag_embed(v):
    """(..., n) -> (..., n, n) with `v` on the diagonal."""
    return multiply(expand_dims(v, axis=-1), _eye(v, v.shape[-1]))


def _inverse_gaps(w):
    """F[..., i, j] = 1 / (w_j - w_i) off the diagonal, 0 on it (differentiable in `w`)."""
    n = w.shape[-1]
    eye = _eye(w, n)
    gaps = add(subtract(expand_dims(w, axis=-2), expand_dims(w, axis=-1)), eye)
    return divide(1 - eye, gaps)


def _pack(xp, batch, parts):
    """Plain arrays with leading shape `batch`, flattened and joined along the last axis."""
    flat = [xp.reshape(p, batch + (math.prod(p.shape[len(batch) :]),)) for p in parts]
    return xp.concat(flat, axis=-1)


def _unpack(packed, batch, shapes):
    """The arrays `_pack` joined (tracked slices of a tracked `packed`)."""
    parts, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        part = packed[..., start : start + size]
        parts.append(part if len(shape) == 1 else reshape(part, batch + shape))
        start += size
    return parts


# --- products and transposes
matrix_transpose = Primitive(
    "matrix_transpose",
    lambda xp, x: xp.matrix_transpose(x),
    (lambda g, ans, x: matrix_transpose(g),),
)


def _matmul_vjp_x(g, ans, x, y):
    if y.ndim == 1:
        return g * y if x.ndim == 1 else expand_dims(g, axis=-1) * y
    if x.ndim == 1:
        return squeeze(matmul(y, expand_dims(g, axis=-1)), axis=-1)
    return matmul(g, matrix_transpose(y))


def _matmul_vjp_y(g, ans, x, y):
    if x.ndim == 1:
        return g * x if y.ndim == 1 else expand_dims(g, axis=-2) * expand_dims(x, axis=-1)
    if y.ndim == 1:
        return squeeze(matmul(matrix_transpose(x), expand_dims(g, axis=-1)), axis=-1)
    return matmul(matrix_transpose(x), g)


matmul = Primitive("matmul", lambda xp, x, y: x @ y, (_matmul_vjp_x, _matmul_vjp_y))


def tensordot(x1, x2, /, *, axes=2):
    """Contract `axes` of `x1` with those of `x2` (an int: the last of x1 with the first of x2)."""
    if isinstance(axes, int):
        a1 = tuple(range(x1.ndim - axes, x1.ndim))
        a2 = tuple(range(axes))
    else:
        a1 = tuple(a % x1.ndim for a in axes[0])
        a2 = tuple(a % x2.ndim for a in axes[1])
    free1 = tuple(a for a in range(x1.ndim) if a not in a1)
    free2 = tuple(a for a in range(x2.ndim) if a not in a2)
    k = 1
    for a in a1:
        k *= x1.shape[a]
    left = reshape(permute_dims(x1, free1 + a1), (-1, k))
    right = reshape(permute_dims(x2, a2 + free2), (k, -1))
    out_shape = tuple(x1.shape[a] for a in free1) + tuple(x2.shape[a] for a in free2)
    return reshape(matmul(left, right), out_shape)


def vecdot(x1, x2, /, *, axis=-1):
    """The dot product of `x1` and `x2` along `axis` (real arrays), with broadcasting."""
    if x1 is x2 and isinstance(x1, TrackedArray) and x1.ndim == 1:
        return sumabs2(x1)
    return _sum(multiply(x1, x2), axis=axis)


def outer(x1, x2, /):
    """The outer product of two vectors: `out[i, j] = x1[i] * x2[j]`."""
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
    if axis >= 0:
        axis -= max(x1.ndim, x2.ndim)
    if x1.shape[axis] != 3 or x2.shape[axis] != 3:
        raise ValueError(
            f"cross needs vectors of length 3 along axis {axis}, got shapes "
            f"{tuple(x1.shape)} and {tuple(x2.shape)}"
        )
    if not _tracked(x1, x2) and _native(_xp(x1), "cross"):
        return _xp(x1).linalg.cross(x1, x2, axis=axis)
    tail = (slice(None),) * (-axis - 1)
    a = [x1[(Ellipsis, i) + tail] for i in range(3)]
    b = [x2[(Ellipsis, i) + tail] for i in range(3)]

    def term(i, j):
        return subtract(multiply(a[i], b[j]), multiply(a[j], b[i]))

    return stack([term(1, 2), term(2, 0), term(0, 1)], axis=axis)


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


# --- solve and inverse
def _solve_forward(xp, a, b):
    if b.ndim == 1:  # a vector, whatever a's batch shape (the standard's rule)
        return xp.linalg.solve(a, b[:, None])[..., 0]
    return xp.linalg.solve(a, b)


def _solve_adjoint(g, a, vector):
    """inv(a).T @ g: the gradient with respect to the right-hand side."""
    if vector:
        return squeeze(solve(_T(a), expand_dims(g, axis=-1)), axis=-1)
    return solve(_T(a), g)


def _solve_vjp_a(g, ans, a, b):
    gb = _solve_adjoint(g, a, b.ndim == 1)
    if b.ndim == 1:
        return -multiply(expand_dims(gb, axis=-1), expand_dims(ans, axis=-2))
    return -matmul(gb, _T(ans))


solve = Primitive(
    "solve",
    _solve_forward,
    (_solve_vjp_a, lambda g, ans, a, b: _solve_adjoint(g, a, b.ndim == 1)),
    doc="Solve `x1 @ out = x2` for square `x1` (..., M, M); `x2` is a vector (M,) or a "
    "batch of matrices (..., M, K).",
)


def _inv_vjp(g, ans, x):
    at = _T(ans)
    return -matmul(matmul(at, g), at)


inv = Primitive("inv", lambda xp, x: xp.linalg.inv(x), (_inv_vjp,), doc="The matrix inverse.")


# --- determinants
det = Primitive(
    "det",
    lambda xp, x: xp.linalg.det(x),
    (lambda g, ans, x: multiply(_as_matrix(g * ans), _T(inv(x))),),
    doc="The determinant of each matrix in `x`.",
)


def _slogdet_forward(xp, x):
    sign, logabsdet = xp.linalg.slogdet(x)
    return xp.stack([sign, logabsdet], axis=-1)


_slogdet = Primitive(
    "slogdet",
    _slogdet_forward,
    (lambda g, ans, x: multiply(_as_matrix(g[..., 1]), _T(inv(x))),),
)


def slogdet(x, /):
    """`(sign, logabsdet)` of the determinant; only `logabsdet` is differentiable."""
    if not _tracked(x):
        return SlogdetResult(*_xp(x).linalg.slogdet(x))
    both = _slogdet(x)
    return SlogdetResult(data(both)[..., 0], both[..., 1])


def logdet(x, /):
    """Tracker's `logdet`: `log(det(x))`, NaN where the determinant is negative."""
    sign, logabsdet = slogdet(x)
    return where(sign < 0, math.nan, logabsdet)


# --- Cholesky
def _cholesky_vjp(g, L, x):
    # A = L L^T: gA = sym(L^-T Phi(L^T gL) L^-1), Phi = lower triangle with half the diagonal.
    n = L.shape[-1]
    phi = _tril(L, n) - _eye(L, n) * 0.5
    p = multiply(matmul(_T(L), g), phi)
    left = solve(_T(L), p)  # L^-T P
    s = _T(solve(_T(L), _T(left)))  # L^-T P L^-1
    return (s + _T(s)) * 0.5


_cholesky = Primitive("cholesky", lambda xp, x: xp.linalg.cholesky(x), (_cholesky_vjp,))


def cholesky(x, /, *, upper=False):
    """The Cholesky factor of each symmetric positive-definite matrix in `x`: lower `L` with
    `x = L @ L.T`, or with `upper=True` its transpose. The gradient is symmetric."""
    L = _cholesky(x)
    return _T(L) if upper else L


# --- QR
def _qr_shapes(x):
    m, n = x.shape[-2:]
    k = min(m, n)
    return tuple(x.shape[:-2]), ((m, k), (k, n))


def _qr_forward(xp, x):
    q, r = xp.linalg.qr(x, mode="reduced")
    return _pack(xp, tuple(x.shape[:-2]), (q, r))


def _qr_vjp(g, ans, x):
    batch, shapes = _qr_shapes(x)
    q, r = _unpack(ans, batch, shapes)
    gq, gr = _unpack(g, batch, shapes)
    m, n = x.shape[-2:]
    if m >= n:
        return _qr_tall_vjp(q, r, gq, gr)
    # x = [X | Y], r = [U | V]: X = q U is a square QR, and Y = q V.
    u, gu, gv = r[..., :, :m], gr[..., :, :m], gr[..., :, m:]
    gx = _qr_tall_vjp(q, u, add(gq, matmul(x[..., :, m:], _T(gv))), gu)
    return concat([gx, matmul(q, gv)], axis=-1)


def _qr_tall_vjp(q, r, gq, gr):
    # gA = (gQ + Q copyltu(M)) R^-T, M = R gR^T - gQ^T Q (Walter & Lehmann; PyTorch).
    n = r.shape[-1]
    m = subtract(matmul(r, _T(gr)), matmul(_T(gq), q))
    sym = add(multiply(m, _tril(m, n)), _T(multiply(m, _tril(m, n, -1))))
    b = add(gq, matmul(q, sym))
    return _T(solve(r, _T(b)))


_qr = Primitive("qr", _qr_forward, (_qr_vjp,))


def qr(x, /, *, mode="reduced"):
    """The QR factorisation `x = Q @ R` of each matrix in `x` (..., M, N), as `(Q, R)`.

    Differentiable for full-rank `x` in `mode="reduced"` (and "complete" when M <= N, where the
    two agree).
    """
    if not _tracked(x):
        return QRResult(*_xp(x).linalg.qr(x, mode=mode))
    m, n = x.shape[-2:]
    if mode not in ("reduced", "complete"):
        raise ValueError(f"qr mode must be 'reduced' or 'complete', got {mode!r}")
    if mode == "complete" and m > n:
        raise ValueError(
            "qr(x, mode='complete') of a matrix with more rows than columns is not "
            "differentiable (Q's extra columns are not unique); use mode='reduced'"
        )
    batch, shapes = _qr_shapes(x)
    return QRResult(*_unpack(_qr(x), batch, shapes))


# --- symmetric eigendecomposition
def _eigh_forward(xp, x):
    w, v = xp.linalg.eigh(x)
    return _pack(xp, tuple(x.shape[:-2]), (w, v))


def _eigh_shapes(x):
    n = x.shape[-1]
    return tuple(x.shape[:-2]), ((n,), (n, n))


def _eigh_vjp(g, ans, x):
    # gA = V (diag(gw) + F o (V^T gV)) V^T, F_ij = 1 / (w_j - w_i); then symmetrised.
    batch, shapes = _eigh_shapes(x)
    w, v = _unpack(ans, batch, shapes)
    gw, gv = _unpack(g, batch, shapes)
    inner = add(multiply(_inverse_gaps(w), matmul(_T(v), gv)), _diag_embed(gw))
    ga = matmul(matmul(v, inner), _T(v))
    return (ga + _T(ga)) * 0.5


def _eigvalsh_vjp(g, ans, x):
    batch, shapes = _eigh_shapes(x)
    # A nested pass takes the vectors from the full rule, so that they are differentiated too.
    v = eigh(x).eigenvectors if isinstance(x, TrackedArray) else _unpack(ans, batch, shapes)[1]
    gw = _unpack(g, batch, shapes)[0]
    return matmul(multiply(v, expand_dims(gw, axis=-2)), _T(v))


_eigh = Primitive("eigh", _eigh_forward, (_eigh_vjp,))
_eigvalsh = Primitive("eigvalsh", _eigh_forward, (_eigvalsh_vjp,))


def eigh(x, /):
    """Eigenvalues (ascending) and eigenvectors of each symmetric matrix in `x`.

    The gradient needs distinct eigenvalues, and a loss that does not depend on the signs of
    the eigenvectors; it is symmetric. Use `eigvalsh` when only the eigenvalues are needed.
    """
    if not _tracked(x):
        return EighResult(*_xp(x).linalg.eigh(x))
    batch, shapes = _eigh_shapes(x)
    return EighResult(*_unpack(_eigh(x), batch, shapes))


def eigvalsh(x, /):
    """The eigenvalues (ascending) of each symmetric matrix in `x`; differentiable also where
    eigenvalues repeat (to first order)."""
    if not _tracked(x):
        return _xp(x).linalg.eigvalsh(x)
    batch, shapes = _eigh_shapes(x)
    return _unpack(_eigvalsh(x), batch, shapes)[0]


# --- singular value decomposition
def _svd_shapes(x):
    m, n = x.shape[-2:]
    k = min(m, n)
    return tuple(x.shape[:-2]), ((m, k), (k,), (k, n))


def _svd_forward(xp, x):
    u, s, vh = xp.linalg.svd(x, full_matrices=False)
    return _pack(xp, tuple(x.shape[:-2]), (u, s, vh))


def _svd_vjp(g, ans, x):
    # Townsend (2016), real case; F_ij = 1 / (s_j^2 - s_i^2):
    # gA = U [(F o skew(U^T gU)) S + S (F o skew(V^T gV)) + diag(gS)] V^T
    #      + (I - U U^T) gU S^-1 V^T + U S^-1 gV^T (I - V V^T)
    batch, shapes = _svd_shapes(x)
    u, s, vh = _unpack(ans, batch, shapes)
    gu, gs, gvh = _unpack(g, batch, shapes)
    m, n = x.shape[-2:]
    k = min(m, n)
    f = _inverse_gaps(s * s)
    utgu = matmul(_T(u), gu)
    vtgv = matmul(vh, _T(gvh))
    j = multiply(f, subtract(utgu, _T(utgu)))
    kk = multiply(f, subtract(vtgv, _T(vtgv)))
    inner = add(multiply(j, expand_dims(s, axis=-2)), multiply(expand_dims(s, axis=-1), kk))
    ga = matmul(matmul(u, add(inner, _diag_embed(gs))), vh)
    if m > k:
        rest = subtract(gu, matmul(u, utgu))
        ga = add(ga, matmul(divide(rest, expand_dims(s, axis=-2)), vh))
    if n > k:
        rest = subtract(gvh, matmul(_T(vtgv), vh))
        ga = add(ga, matmul(u, divide(rest, expand_dims(s, axis=-1))))
    return ga


def _svdvals_vjp(g, ans, x):
    batch, shapes = _svd_shapes(x)
    if isinstance(x, TrackedArray):  # nested: vectors from the full rule, differentiated too
        u, _, vh = svd(x, full_matrices=False)
    else:
        u, _, vh = _unpack(ans, batch, shapes)
    gs = _unpack(g, batch, shapes)[1]
    return matmul(multiply(u, expand_dims(gs, axis=-2)), vh)


_svd = Primitive("svd", _svd_forward, (_svd_vjp,))
_svdvals = Primitive("svdvals", _svd_forward, (_svdvals_vjp,))


def svd(x, /, *, full_matrices=True):
    """`(U, S, Vh)` with `x = U @ diag(S) @ Vh`, singular values descending.

    Differentiable with `full_matrices=False` (or square `x`), for distinct singular values and
    a loss that does not depend on the signs of the singular vectors.
    """
    if not _tracked(x):
        return SVDResult(*_xp(x).linalg.svd(x, full_matrices=full_matrices))
    m, n = x.shape[-2:]
    if full_matrices and m != n:
        raise ValueError(
            "svd(x, full_matrices=True) of a non-square matrix is not differentiable (the "
            "extra singular vectors are not unique); pass full_matrices=False"
        )
    batch, shapes = _svd_shapes(x)
    return SVDResult(*_unpack(_svd(x), batch, shapes))


def svdvals(x, /):
    """The singular values (descending) of each matrix in `x`; differentiable also where they
    repeat (to first order)."""
    if not _tracked(x):
        return _xp(x).linalg.svdvals(x)
    batch, shapes = _svd_shapes(x)
    return _unpack(_svdvals(x), batch, shapes)[1]


# --- pseudo-inverse and rank
def _pinv_forward(xp, x, rtol=None):
    return xp.linalg.pinv(x) if rtol is None else xp.linalg.pinv(x, rtol=rtol)


def _pinv_vjp(g, p, x, rtol=None):
    # Golub & Pereyra: dP = -P dA P + P P^T dA^T (I - A P) + (I - P A) dA^T P^T P.
    pt, gt = _T(p), _T(g)
    out = -matmul(matmul(pt, g), pt)
    right = matmul(gt, matmul(p, pt))
    out = add(out, subtract(right, matmul(x, matmul(p, right))))
    left = matmul(matmul(pt, p), gt)
    return add(out, subtract(left, matmul(matmul(left, p), x)))


_pinv = Primitive("pinv", _pinv_forward, (_pinv_vjp,))


def pinv(x, /, *, rtol=None):
    """The Moore-Penrose pseudo-inverse; differentiable where the rank is locally constant."""
    return _pinv(x, rtol=rtol)


def matrix_rank(x, /, *, rtol=None):
    """The rank of each matrix in `x` (plain integers; not differentiable)."""
    x = data(x)
    linalg = _xp(x).linalg
    return linalg.matrix_rank(x) if rtol is None else linalg.matrix_rank(x, rtol=rtol)


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
    result = None
    while True:  # binary powering
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
    return xp.sqrt(xp.sum(x * x, axis=axis, keepdims=keepdims))


def _norm2_vjp(g, ans, x, axis=None, keepdims=False):
    # g * x / |x|, and 0 (a subgradient) where the norm is 0.
    plain = data(ans)
    safe = ans + namespace_of(plain).astype(plain == 0, plain.dtype)
    return multiply(expand(g / safe, x, axis, keepdims), x)


_norm2 = Primitive("vector_norm", _norm2_forward, (_norm2_vjp,))


def _norm0_forward(xp, x, axis=None, keepdims=False):
    return xp.sum(xp.astype(x != 0, x.dtype), axis=axis, keepdims=keepdims)


_norm0 = Primitive("vector_norm_0", _norm0_forward, (None,))


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    """The `ord`-norm of `x` over `axis` (None: all axes): 2, 1, inf, -inf, 0 (the count of
    nonzeros, no gradient) or any other real `p`. The 2-norm's gradient at 0 is 0."""
    if not _tracked(x) and _native(_xp(x), "vector_norm"):
        return _xp(x).linalg.vector_norm(x, axis=axis, keepdims=keepdims, ord=ord)
    kw = {"axis": axis, "keepdims": keepdims}
    if ord == 2:
        return _norm2(x, **kw)
    if ord == 0:
        return _norm0(x, **kw)
    if ord == 1:
        return _sum(_abs(x), **kw)
    if ord == math.inf:
        return _max(_abs(x), **kw)
    if ord == -math.inf:
        return _min(_abs(x), **kw)
    return _sum(_abs(x) ** ord, **kw) ** (1 / ord)


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
        out = (_max if ord == 2 else _min)(svdvals(x), axis=-1)
    elif ord in (1, -1, math.inf, -math.inf):
        sums = _sum(_abs(x), axis=-2 if ord in (1, -1) else -1)
        out = (_max if ord > 0 else _min)(sums, axis=-1)
    else:
        raise ValueError(
            f"matrix_norm ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, got {ord!r}"
        )
    return _as_matrix(out) if keepdims else out
