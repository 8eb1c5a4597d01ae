"""The matrix decompositions of the linalg extension: `cholesky`, `qr`, `eigh`, `eigvalsh`,
`svd`, `svdvals` and `pinv`, with their result tuples.

Each forward calls the backend's `xp.linalg`; multi-output factorisations (`qr`, `eigh`, `svd`)
are one tape node holding their outputs packed along the last axis, and the named tuple's
fields are slices of it (the real eigen- and singular values of a complex matrix are packed as
complex numbers and returned as their real part). The conventions (symmetric gradients,
distinct eigenvalues, reduced factorisations) are in `tracker_gpu.rules.linalg`, which
re-exports everything here.
"""

import math
from collections import namedtuple

from array_api_compat import is_dask_array

from .. import recording
from ..backend import device_of, namespace_of
from ..primitive import Primitive
from ..tracked import TrackedArray, data, istracked
from .elementwise import (
    add,
    complex_dtype,
    conj,
    is_complex,
    mask,
    multiply,
    real,
    real_dtype,
    subtract,
    where,
)
from .linalg_base import _H, _eye, _tracked, _xp, matmul, solve
from .reductions import sum as _sum
from .shape import concat, expand_dims, reshape

__all__ = [
    "cholesky",
    "qr",
    "eigh",
    "eigvalsh",
    "svd",
    "svdvals",
    "pinv",
    "eig",
    "eigvals",
    "QRResult",
    "EighResult",
    "EigResult",
    "SVDResult",
]

QRResult = namedtuple("QRResult", ["Q", "R"])
EighResult = namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
EigResult = namedtuple("EigResult", ["eigenvalues", "eigenvectors"])
SVDResult = namedtuple("SVDResult", ["U", "S", "Vh"])


# --- helpers: triangular masks, and multi-output factorisations packed into one array
def _tril(like, n, k=0):
    """A plain lower-triangular mask of ones (diagonal `k` and below), shaped (n, n)."""
    x = data(like)
    xp = namespace_of(x)
    if not is_complex(x):
        return xp.tril(xp.ones((n, n), dtype=x.dtype, device=device_of(x)), k=k)
    # Dask's tril warns that it casts a complex array to real: build the mask real
    mask = xp.tril(xp.ones((n, n), dtype=real_dtype(xp, x.dtype), device=device_of(x)), k=k)
    return xp.astype(mask, x.dtype)


def _diag_embed(v):
    """(..., n) -> (..., n, n) with `v` on the diagonal."""
    return multiply(expand_dims(v, axis=-1), _eye(v, v.shape[-1]))


def _inverse_gaps(w):
    """F[..., i, j] = 1 / (w_j - w_i), 0 where the values tie (on the diagonal and at a tie;
    differentiable in `w`)."""
    return _reciprocal_or_zero(subtract(expand_dims(w, axis=-2), expand_dims(w, axis=-1)))


def _undefined_at_read_ties(inner, w, *products):
    """`inner` with nan at (i, j) where values i and j tie and the loss reads the vectors of the
    pair (either product, `V^H gV` or the like, nonzero at (i, j) or (j, i)). There the
    gradient is the limit of a 0/0 that the values at the tie cannot give: a loss of
    `V diag(w) V^H` (which does not depend on the choice of vectors) has a finite one, nonzero,
    that leaving the term out would silently drop. PyTorch's and JAX's rules give nan or inf
    there too; a loss that reads no vector of a tied pair keeps its finite gradient."""
    plain = data(w)
    xp = namespace_of(plain)
    n = plain.shape[-1]
    off_diagonal = ~xp.eye(n, dtype=xp.bool, device=device_of(plain))
    tied = (plain[..., None, :] == plain[..., :, None]) & off_diagonal
    read = None
    for product in products:
        p = data(product)
        nonzero = (p != 0) | (xp.matrix_transpose(p) != 0)
        read = nonzero if read is None else read | nonzero
    return where(tied & read, float("nan"), inner)


def _reciprocal_or_zero(x):
    """1 / x, and 0 where `x` is 0, with no slope there either (no inf * 0 in a nested pass).

    The vjps divide by gaps between values and by singular values: where one is 0 the term is
    left out, by the primal's value alone, so that the rule stays linear in its cotangent
    (`jvp` differentiates it at a zero cotangent). Where the loss reads no direction of the
    vectors those terms are 0 anyway (PyTorch leaves them out); where it reads the vectors of
    a tied pair, `_undefined_at_read_ties` makes the gradient nan."""
    nonzero = x != 0
    return mask(nonzero, 1.0 / where(nonzero, x, 1.0))


def _pack(xp, batch, parts):
    """Plain arrays with leading shape `batch`, flattened and joined along the last axis."""
    flat = [xp.reshape(p, batch + (math.prod(p.shape[len(batch) :]),)) for p in parts]
    dtype = parts[-1].dtype  # the vectors' (complex where the values are real)
    flat = [p if p.dtype == dtype else xp.astype(p, dtype) for p in flat]
    return xp.concat(flat, axis=-1)


def _real_if_complex(x):
    """The real part of complex values that are real by construction (eigenvalues, singular
    values, and their gradients): `_pack` made them complex to join them with their vectors.
    The vjps read them through it too, so that a nested pass sends no gradient into their
    (constant zero) imaginary parts."""
    return real(x) if is_complex(x) else x


def _unpack(packed, batch, shapes):
    """The arrays `_pack` joined (tracked slices of a tracked `packed`)."""
    parts, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        part = packed[..., start : start + size]
        parts.append(part if len(shape) == 1 else reshape(part, batch + shape))
        start += size
    return parts


# --- Cholesky
def _cholesky_vjp(g, L, x):
    # A = L L^H: gA = herm(L^-H Phi(L^H gL) L^-1), Phi = lower triangle with half the diagonal.
    n = L.shape[-1]
    phi = _tril(L, n) - _eye(L, n) * 0.5
    p = multiply(matmul(_H(L), g), phi)
    left = solve(_H(L), p)  # L^-H P
    s = _H(solve(_H(L), _H(left)))  # L^-H P L^-1
    return (s + _H(s)) * 0.5


def _cholesky_forward(xp, x):
    if is_dask_array(x):  # array-api-compat's Dask cholesky gives Dask's default, the upper
        import dask.array

        return dask.array.linalg.cholesky(x, lower=True)
    return xp.linalg.cholesky(x)


_cholesky = Primitive("cholesky", _cholesky_forward, (_cholesky_vjp,))


def cholesky(x, /, *, upper=False):
    """The Cholesky factor of each symmetric (complex: Hermitian) positive-definite matrix in
    `x`: lower `L` with `x = L @ L^H`, or with `upper=True` its conjugate transpose. The
    gradient is symmetric (Hermitian)."""
    L = _cholesky(x)
    return _H(L) if upper else L


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
    gx = _qr_tall_vjp(q, u, add(gq, matmul(x[..., :, m:], _H(gv))), gu)
    return concat([gx, matmul(q, gv)], axis=-1)


def _qr_tall_vjp(q, r, gq, gr):
    # gA = (gQ + Q copyltu(M)) R^-H, M = R gR^H - gQ^H Q (Walter & Lehmann; PyTorch), where
    # copyltu(M) = tril(M, -1) + tril(M, -1)^H + Re(diag(M)) (R's diagonal is real).
    n = r.shape[-1]
    m = subtract(matmul(r, _H(gr)), matmul(_H(gq), q))
    if is_complex(m):
        low = multiply(m, _tril(m, n, -1))
        sym = add(add(low, _H(low)), multiply(real(m), _eye(m, n)))
    else:
        sym = add(multiply(m, _tril(m, n)), _H(multiply(m, _tril(m, n, -1))))
    b = add(gq, matmul(q, sym))
    return _H(solve(r, _H(b)))


_qr = Primitive("qr", _qr_forward, (_qr_vjp,))


def qr(x, /, *, mode="reduced"):
    """The QR factorisation `x = Q @ R` of each matrix in `x` (..., M, N), as `(Q, R)`.

    Differentiable for full-rank `x`. With `mode="complete"` and M > N, Q's added columns are
    not unique: a loss that reads Q then has no gradient (a clear error in the backward pass);
    R (its added rows are zeros) differentiates.
    """
    if not _tracked(x):
        return QRResult(*_xp(x).linalg.qr(x, mode=mode))
    m, n = x.shape[-2:]
    if mode not in ("reduced", "complete"):
        raise ValueError(f"qr mode must be 'reduced' or 'complete', got {mode!r}")
    batch, shapes = _qr_shapes(x)
    q, r = _unpack(_qr(x), batch, shapes)
    if mode == "complete" and m > n:
        q = concat([q, _complement(x, of="qr")], axis=-1)
        plain = data(r)
        zeros = _xp(plain).zeros((*plain.shape[:-2], m - n, n), dtype=plain.dtype,
                                 device=device_of(plain))  # fmt: skip
        r = concat([r, zeros], axis=-2)
    return QRResult(q, r)


# --- symmetric eigendecomposition
def _eigh_forward(xp, x):
    w, v = xp.linalg.eigh(x)
    return _pack(xp, tuple(x.shape[:-2]), (w, v))


def _eigh_shapes(x):
    n = x.shape[-1]
    return tuple(x.shape[:-2]), ((n,), (n, n))


def _eigh_vjp(g, ans, x):
    # gA = V (diag(gw) + F o (V^H gV)) V^H, F_ij = 1 / (w_j - w_i); then made Hermitian (which
    # keeps F o skew(V^H gV), as PyTorch does; the loss must not depend on the vectors' phases).
    batch, shapes = _eigh_shapes(x)
    w, v = _unpack(ans, batch, shapes)
    gw, gv = _unpack(g, batch, shapes)
    w, gw = _real_if_complex(w), _real_if_complex(gw)
    vgv = matmul(_H(v), gv)
    inner = add(multiply(_inverse_gaps(w), vgv), _diag_embed(gw))
    inner = _undefined_at_read_ties(inner, w, vgv)
    ga = matmul(matmul(v, inner), _H(v))
    return (ga + _H(ga)) * 0.5


def _eigvalsh_vjp(g, ans, x):
    batch, shapes = _eigh_shapes(x)
    # A nested pass takes the vectors from the full rule, so that they are differentiated too.
    v = eigh(x).eigenvectors if isinstance(x, TrackedArray) else _unpack(ans, batch, shapes)[1]
    gw = _real_if_complex(_unpack(g, batch, shapes)[0])
    return matmul(multiply(v, expand_dims(gw, axis=-2)), _H(v))


_eigh = Primitive("eigh", _eigh_forward, (_eigh_vjp,))


def _eigvalsh_forward(xp, x):
    """The decomposition, with the library's `eigvalsh` values (as `_svdvals_forward`)."""
    w, v = xp.linalg.eigh(x)
    return _pack(xp, tuple(x.shape[:-2]), (xp.linalg.eigvalsh(x), v))


_eigvalsh = Primitive("eigvalsh", _eigvalsh_forward, (_eigvalsh_vjp,))


def eigh(x, /):
    """Eigenvalues (ascending, real) and eigenvectors of each symmetric (complex: Hermitian)
    matrix in `x`.

    The gradient needs distinct eigenvalues, and a loss that does not depend on the signs
    (complex: phases) of the eigenvectors; it is symmetric (Hermitian). Use `eigvalsh` when
    only the eigenvalues are needed.
    """
    if not _tracked(x):
        return EighResult(*_xp(x).linalg.eigh(x))
    batch, shapes = _eigh_shapes(x)
    w, v = _unpack(_eigh(x), batch, shapes)
    return EighResult(_real_if_complex(w), v)


def eigvalsh(x, /):
    """The eigenvalues (ascending) of each symmetric matrix in `x`; differentiable also where
    eigenvalues repeat (to first order)."""
    if not _tracked(x):
        return _xp(x).linalg.eigvalsh(x)
    batch, shapes = _eigh_shapes(x)
    return _real_if_complex(_unpack(_eigvalsh(x), batch, shapes)[0])


# --- general eigendecomposition: complex eigenvalues and unit-norm eigenvectors
def _eig_native(xp):
    found = getattr(getattr(xp, "linalg", None), "eig", None)
    if found is None:
        name = getattr(xp, "__name__", "this array library").replace("array_api_compat.", "")
        raise NotImplementedError(
            f"linalg.eig needs the array library's own eig, and {name} has none; NumPy, "
            "PyTorch and array-api-strict have it (convert with from_dlpack or asarray)"
        )
    return found


def _eig_forward(xp, x):
    w, v = _eig_native(xp)(x)
    dtype = v.dtype if is_complex(v) else complex_dtype(xp, v.dtype)
    w, v = (p if p.dtype == dtype else xp.astype(p, dtype) for p in (w, v))
    return _pack(xp, tuple(x.shape[:-2]), (w, v))


def _eig_vjp(g, ans, x):
    # With X = V^-1 dA V: dL = diag(X) and dV = V (E o X) + V diag(d), E_ij = 1 / (L_j - L_i)
    # off the diagonal, d keeping each column at unit norm (Re(v^H dv) = 0). The adjoint:
    # gA = V^-H (diag(gL) + conj(E) o (V^H gV - V^H V diag(Re diag(V^H gV)))) V^H
    # (PyTorch's; the phase of each vector is free, so the loss must not depend on it).
    batch, shapes = _eigh_shapes(x)
    w, v = _unpack(ans, batch, shapes)
    gw, gv = _unpack(g, batch, shapes)
    vh = _H(v)
    vhgv = matmul(vh, gv)
    norm_part = multiply(matmul(vh, v), expand_dims(_diagonal(real(vhgv)), axis=-2))
    inner = multiply(conj(_inverse_gaps(w)), subtract(vhgv, norm_part))
    ga = solve(vh, matmul(add(inner, _diag_embed(gw)), vh))
    return ga if is_complex(x) else real(ga)


def _diagonal(x):
    """The diagonal (..., n) of (..., n, n) `x` (differentiable)."""
    eye = _eye(x, x.shape[-1])
    return _sum(multiply(x, eye), axis=-1)


_eig = Primitive("eig", _eig_forward, (_eig_vjp,), saves="ans")


def eig(x, /):
    """Eigenvalues and right eigenvectors of each square matrix in `x` (general, not
    symmetric), as complex arrays whatever the dtype of `x` (NumPy returns real ones where
    every eigenvalue is real; PyTorch and JAX complex, as here). Each eigenvector has unit
    norm; its phase is the library's choice.

    The gradient follows PyTorch's and JAX's gauge: the eigenvectors normalised to unit norm,
    and a loss that does not depend on their phases (`abs(v)`, `v * conj(v)`, the
    eigenvalues); for a loss that does, the result is PyTorch's. It needs distinct
    eigenvalues. For a real `x`, the gradient is the real part of the complex one. Needs a
    library with its own eig (NumPy, PyTorch, array-api-strict); others raise.

    >>> import numpy as np, tracker_gpu as tg
    >>> a = np.array([[0.0, 1.0], [-2.0, -3.0]])
    >>> np.sort(tg.linalg.eig(a).eigenvalues.real)
    array([-2., -1.])
    >>> tg.gradient(lambda a: tg.sum(tg.real(tg.linalg.eig(a).eigenvalues)), a)[0]
    array([[1., 0.],
           [0., 1.]])
    """
    if not _tracked(x):
        xp = _xp(x)
        w, v = _unpack(_eig_forward(xp, x), tuple(x.shape[:-2]), _eigh_shapes(x)[1])
        return EigResult(w, v)
    batch, shapes = _eigh_shapes(x)
    w, v = _unpack(_eig(x), batch, shapes)
    return EigResult(w, v)


def eigvals(x, /):
    """The (complex) eigenvalues of each square matrix in `x`; see `eig`."""
    return eig(x).eigenvalues


# --- singular value decomposition
def _svd_shapes(x):
    m, n = x.shape[-2:]
    k = min(m, n)
    return tuple(x.shape[:-2]), ((m, k), (k,), (k, n))


def _svd_forward(xp, x):
    u, s, vh = xp.linalg.svd(x, full_matrices=False)
    return _pack(xp, tuple(x.shape[:-2]), (u, s, vh))


def _svd_vjp(g, ans, x):
    # Townsend (2016); F_ij = 1 / (s_j^2 - s_i^2), skew(X) = X - X^H:
    # gA = U [(F o skew(U^H gU)) S + S (F o skew(V^H gV)) + diag(gS)] V^H
    #      + (I - U U^H) gU S^-1 V^H + U S^-1 gV^H (I - V V^H),
    # and for complex x also U diag(i Im(diag(U^H gU)) / S) V^H, the phase term (PyTorch's; the
    # loss must not depend on the phases of the singular vectors); 1 / 0 is taken as 0 there.
    batch, shapes = _svd_shapes(x)
    u, s, vh = _unpack(ans, batch, shapes)
    gu, gs, gvh = _unpack(g, batch, shapes)
    s, gs = _real_if_complex(s), _real_if_complex(gs)
    m, n = x.shape[-2:]
    k = min(m, n)
    f = _inverse_gaps(s * s)
    over_s = _reciprocal_or_zero(s)
    utgu = matmul(_H(u), gu)
    vtgv = matmul(vh, _H(gvh))
    skew_u = subtract(utgu, _H(utgu))
    j = multiply(f, skew_u)
    kk = multiply(f, subtract(vtgv, _H(vtgv)))
    inner = add(multiply(j, expand_dims(s, axis=-2)), multiply(expand_dims(s, axis=-1), kk))
    inner = _undefined_at_read_ties(add(inner, _diag_embed(gs)), s * s, utgu, vtgv)
    if is_complex(skew_u):
        phase = multiply(skew_u, _eye(skew_u, k)) * 0.5  # i Im(diag(U^H gU))
        inner = add(inner, multiply(phase, expand_dims(over_s, axis=-1)))
    ga = matmul(matmul(u, inner), vh)
    if m > k:
        rest = subtract(gu, matmul(u, utgu))
        ga = add(ga, matmul(multiply(rest, expand_dims(over_s, axis=-2)), vh))
    if n > k:
        rest = subtract(gvh, matmul(_H(vtgv), vh))
        ga = add(ga, matmul(u, multiply(rest, expand_dims(over_s, axis=-1))))
    return ga


def _svdvals_vjp(g, ans, x):
    batch, shapes = _svd_shapes(x)
    if isinstance(x, TrackedArray):  # nested: vectors from the full rule, differentiated too
        u, _, vh = svd(x, full_matrices=False)
    else:
        u, _, vh = _unpack(ans, batch, shapes)
    gs = _real_if_complex(_unpack(g, batch, shapes)[1])
    return matmul(multiply(u, expand_dims(gs, axis=-2)), vh)


def _svdvals_forward(xp, x):
    """The decomposition, with the values of the library's `svdvals` where it has one: the
    plain value bit for bit (LAPACK's values without the vectors differ in the last bits; the
    vectors are for the pullback)."""
    u, s, vh = xp.linalg.svd(x, full_matrices=False)
    if getattr(xp.linalg, "svdvals", None) is not None and not is_dask_array(x):
        s = xp.linalg.svdvals(x)  # (Dask's asks for a full decomposition, which it refuses)
    return _pack(xp, tuple(x.shape[:-2]), (u, s, vh))


_svd = Primitive("svd", _svd_forward, (_svd_vjp,))
_svdvals = Primitive("svdvals", _svdvals_forward, (_svdvals_vjp,))


def _complement_forward(xp, x, *, of):
    """The vectors that a full decomposition adds to a non-square `x` (`of` "svd" or "qr"): the
    last columns of U or Q (tall `x`) or rows of Vh (wide `x`)."""
    m, n = x.shape[-2:]
    if of == "qr":
        return xp.linalg.qr(x, mode="complete")[0][..., :, n:]
    u, _, vh = xp.linalg.svd(x, full_matrices=True)
    return u[..., :, n:] if m > n else vh[..., m:, :]


_FULL = {"svd": "svd(x, full_matrices=True)", "qr": "qr(x, mode='complete')"}
_REDUCED = {"svd": "full_matrices=False", "qr": "mode='reduced'"}


def _complement_vjp(g, ans, x, *, of):
    raise ValueError(
        f"the loss depends on the vectors that {_FULL[of]} adds to a non-square matrix; they "
        f"are not unique, so they have no gradient: pass {_REDUCED[of]}, or read only the "
        "factors of the reduced decomposition"
    )


_complement = Primitive("complement", _complement_forward, (_complement_vjp,), saves="")


def svd(x, /, *, full_matrices=True):
    """`(U, S, Vh)` with `x = U @ diag(S) @ Vh`, singular values descending.

    Differentiable for distinct singular values and a loss that does not depend on the signs
    (phases) of the singular vectors. For a non-square `x`, `full_matrices=True` adds singular
    vectors that are not unique: a loss that reads U or Vh then has no gradient (a clear error
    in the backward pass, as in PyTorch); S alone, or `full_matrices=False`, differentiate.
    """
    if not _tracked(x):
        return SVDResult(*_xp(x).linalg.svd(x, full_matrices=full_matrices))
    batch, shapes = _svd_shapes(x)
    u, s, vh = _unpack(_svd(x), batch, shapes)
    m, n = x.shape[-2:]
    if full_matrices and m > n:
        u = concat([u, _complement(x, of="svd")], axis=-1)
    elif full_matrices and m < n:
        vh = concat([vh, _complement(x, of="svd")], axis=-2)
    return SVDResult(u, _real_if_complex(s), vh)


def svdvals(x, /):
    """The singular values (descending) of each matrix in `x`; differentiable also where they
    repeat (to first order)."""
    if not _tracked(x):
        return _xp(x).linalg.svdvals(x)
    batch, shapes = _svd_shapes(x)
    return _real_if_complex(_unpack(_svdvals(x), batch, shapes)[1])


# --- pseudo-inverse and rank
def _pinv_forward(xp, x, rtol=None):
    return xp.linalg.pinv(x) if rtol is None else xp.linalg.pinv(x, rtol=rtol)


def _pinv_vjp(g, p, x, rtol=None):
    # Golub & Pereyra: dP = -P dA P + P P^H dA^H (I - A P) + (I - P A) dA^H P^H P.
    pt, gt = _H(p), _H(g)
    out = -matmul(matmul(pt, g), pt)
    right = matmul(gt, matmul(p, pt))
    out = add(out, subtract(right, matmul(x, matmul(p, right))))
    left = matmul(matmul(pt, p), gt)
    return add(out, subtract(left, matmul(matmul(left, p), x)))


_pinv = Primitive("pinv", _pinv_forward, (_pinv_vjp, None))  # rtol: not differentiated


def pinv(x, /, *, rtol=None):
    """The Moore-Penrose pseudo-inverse; differentiable where the rank is locally constant."""
    if istracked(rtol) and recording.current() is not None:
        return _pinv(x, rtol)  # an argument of the node, so that every replay reads it anew
    return _pinv(x, rtol=data(rtol))  # a tolerance, not differentiated
