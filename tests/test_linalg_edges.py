"""linalg at its edges, against PyTorch (CPU, float64 and complex128): forward mode through
the vectors of `eigh` and `svd` (their rules must stay linear in the cotangent, which `jvp`
differentiates at zero), `svd` where a singular value is exactly 0, the 2-norm's second
derivative where the norm is 0, and the Cholesky factor on every backend (Dask's own factor is
the upper one)."""

import math

import numpy as np
import pytest
from helpers import numpy_of

import tracker_gpu as tg

torch = pytest.importorskip("torch")
la = tg.linalg


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def symmetric(*shape, seed=0):
    """Symmetric matrices with well-separated eigenvalues."""
    x = randn(*shape, seed=seed)
    n = shape[-1]
    return (x + np.swapaxes(x, -1, -2)) / 2 + np.diag(3.0 * np.arange(n))


def torch_of(x):
    return torch.tensor(np.asarray(x))


def _T(lib, x):
    return tg.matrix_transpose(x) if lib is tg else x.mT


def _eigh(lib, a):
    return tg.linalg.eigh(a) if lib is tg else torch.linalg.eigh(a)


def _svd(lib, a):
    return tg.linalg.svd(a, full_matrices=False) if lib is tg else torch.linalg.svd(a, False)


# Losses of the vectors that do not depend on their signs, written once for both libraries.
EIGH_LOSSES = {
    "rebuilt-with-squares": lambda lib, a: (lambda w, v: (v * w[..., None, :] ** 2) @ _T(lib, v))(
        *_eigh(lib, a)
    ),
    "vectors-squared": lambda lib, a: _eigh(lib, a)[1] ** 2,
    "first-projector": lambda lib, a: (lambda v: v @ _T(lib, v))(_eigh(lib, a)[1][..., :, :1]),
}
SVD_LOSSES = {
    "U-squared": lambda lib, a: _svd(lib, a)[0] ** 2,
    "Vh-squared": lambda lib, a: _svd(lib, a)[2] ** 2,
    "U-times-S": lambda lib, a: (lambda u, s, vh: (u * s[..., None, :]) ** 2)(*_svd(lib, a)),
}


def _torch_jvp(f, a, t):
    return torch.func.jvp(f, (torch_of(a),), (torch_of(t),))[1].numpy()


def test_jvp_through_eigenvectors_the_reported_case():
    A = np.array([[2.0, 1.0], [1.0, 3.0]])
    T = np.array([[0.0, 1.0], [1.0, 0.0]])
    _, tangent = tg.jvp(lambda a: EIGH_LOSSES["rebuilt-with-squares"](tg, a), (A,), (T,))
    np.testing.assert_allclose(tangent, A @ T + T @ A, atol=1e-12)  # d(A^2) = A T + T A


VECTOR_CASES = [  # (decomposition, loss, shape): eigh's of symmetric matrices, svd's of any
    *(("eigh", name, shape) for name in EIGH_LOSSES for shape in [(3, 3), (2, 4, 4)]),
    *(("svd", name, shape) for name in SVD_LOSSES for shape in [(3, 3), (4, 3), (3, 4), (2, 4, 3)]),
]


@pytest.mark.parametrize("kind, name, shape", VECTOR_CASES, ids=str)
def test_jvp_through_eigenvectors_and_singular_vectors_matches_torch(backend, kind, name, shape):
    f = (EIGH_LOSSES if kind == "eigh" else SVD_LOSSES)[name]
    draw = symmetric if kind == "eigh" else randn
    a, t = draw(*shape), draw(*shape, seed=1)
    _, tangent = tg.jvp(lambda x: f(tg, x), (backend.asarray(a),), (backend.asarray(t),))
    expected = _torch_jvp(lambda x: f(torch, x), a, t)
    assert np.abs(expected).max() > 1e-3
    np.testing.assert_allclose(numpy_of(backend, tangent), expected, rtol=1e-9, atol=1e-10)


def test_jacfwd_through_the_vectors_matches_torch():
    a = randn(3, 2)
    got = tg.jacfwd(lambda x: SVD_LOSSES["U-squared"](tg, x), a)
    expected = torch.autograd.functional.jacobian(lambda x: _svd(torch, x)[0] ** 2, torch_of(a))
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-9, atol=1e-10)
    s = symmetric(3, 3)
    got = tg.jacfwd(lambda x: EIGH_LOSSES["vectors-squared"](tg, x), s)
    expected = torch.func.jacfwd(lambda x: torch.linalg.eigh(x)[1] ** 2)(torch_of(s)).numpy()
    expected = (expected + np.swapaxes(expected, -1, -2)) / 2  # eigh reads x as symmetric
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10)


# --- values that tie: a gradient is finite only where it is the limit
W = randn(3, 3, seed=7)
TIED = {  # matrices with two eigenvalues (singular values) exactly equal: 1, 1 and 2
    "eigh": np.diag([1.0, 1.0, 2.0]),
    "svd": np.diag([1.0, 1.0, 2.0]) @ np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0, 0, 1]]),
}
TIE_LOSSES = {  # (decomposition, loss of (library, matrix, weights), whether it reads the
    # vectors of the tied pair)
    "eigh rebuilt": ("eigh", lambda lib, a, W: (lambda w, v: v * w[None, :] @ _T(lib, v) * W)(
        *_eigh(lib, a)), True),
    "eigh values": ("eigh", lambda lib, a, W: _eigh(lib, a)[0] ** 3, False),
    "eigh untied vector": ("eigh", lambda lib, a, W: _eigh(lib, a)[1][:, 2] ** 2 * W[0], False),
    "eigh tied vector": ("eigh", lambda lib, a, W: _eigh(lib, a)[1][:, 0] * W[0], True),
    "svd rebuilt": ("svd", lambda lib, a, W: (lambda u, s, vh: (u * s[None, :]) @ vh * W)(
        *_svd(lib, a)), True),
    "svd values": ("svd", lambda lib, a, W: _svd(lib, a)[1] ** 3, False),
    "svd untied vectors": ("svd", lambda lib, a, W: (
        lambda u, s, vh: u[:, :1] * _T(lib, vh[:1, :]) * W)(*_svd(lib, a)), False),  # s = 2
}  # fmt: skip


def _differences(f, a, h=1e-6):
    grad = np.zeros_like(a)
    for index in np.ndindex(a.shape):
        e = np.zeros_like(a)
        e[index] = h
        grad[index] = (f(a + e) - f(a - e)) / (2 * h)
    return grad


@pytest.mark.parametrize("name", TIE_LOSSES)
def test_at_tied_values_a_gradient_is_the_limit_or_nan(name):
    """At a tie the vectors' term is 0/0: a loss that reads the tied pair's vectors gets nan, as
    PyTorch's (its limit, finite for `V diag(w) V^T`, is not in the values at the tie: leaving
    the term out once gave the identity's gradient only its diagonal, silently); any other
    loss gets its gradient, against central differences (eigh's of the symmetric part)."""
    kind, f, reads_tied = TIE_LOSSES[name]
    a = TIED[kind]
    got = tg.gradient(lambda x: tg.sum(f(tg, x, W)), a)[0]
    if reads_tied:
        assert np.isnan(got).any()
        t = torch_of(a).requires_grad_()
        torch.sum(f(torch, t, torch_of(W))).backward()
        assert not np.isfinite(t.grad.numpy()).all()  # PyTorch has no finite answer either
        return
    symmetric_part = (lambda x: (x + x.T) / 2) if kind == "eigh" else (lambda x: x)
    plain = lambda x: float(np.sum(f(tg, symmetric_part(x), W)))  # noqa: E731, not tracked
    np.testing.assert_allclose(got, _differences(plain, a), atol=1e-6)


# --- svd with a singular value of exactly 0 (distinct from the others)
def crandn(*shape, seed=0):
    return randn(*shape, seed=seed) + 1j * randn(*shape, seed=seed + 10)


E1 = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
RANK_DEFICIENT = {
    "tall": lambda r: E1,
    "wide": lambda r: E1.T,
    "square": lambda r: np.array([[2.0, 0.0], [0.0, 0.0]]),
    "tall-rank-2": lambda r: r(4, 2) @ r(2, 3, seed=1),
    "wide-rank-1": lambda r: r(2, 1) @ r(1, 4, seed=1),
    "batch": lambda r: np.stack([E1, r(3, 2)]),
}


@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("name", RANK_DEFICIENT)
def test_singular_values_at_a_zero_singular_value_match_torch(name, complex_):
    x = RANK_DEFICIENT[name](crandn if complex_ else randn)
    x = x + 0j if complex_ else x
    weights = np.arange(1.0, 1.0 + min(x.shape[-2:]))
    if "rank" in name:  # a rounding error, not 0: its vectors, and so its gradient, arbitrary
        weights[-1] = 0.0
    got = tg.gradient(lambda a: tg.sum(_svd(tg, a)[1] * weights), x)[0]
    t = torch_of(x).requires_grad_()
    torch.sum(_svd(torch, t)[1] * torch_of(weights)).backward()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, t.grad.numpy(), atol=1e-12)


def test_a_zero_singular_value_gives_no_nan_to_a_zero_weighted_vector_loss():
    """The terms over S^-1 are left out where S is 0: a loss that reads U and Vh with a zero
    weight (present, but zero-valued) gets the gradient of S alone, not nan."""
    x = E1

    def loss(a):
        u, s, vh = la.svd(a, full_matrices=False)
        return tg.sum(s) + 0.0 * (tg.sum(u**2) + tg.sum(vh**2))

    np.testing.assert_array_equal(tg.gradient(loss, x)[0], [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])


# --- the 2-norm's second derivative where the norm is 0: 0, as torch.func.hessian
NORM_POINTS = {
    "vector": (np.zeros(2), {}),
    "vector-3": (np.zeros(3), {}),
    "zero-row": (np.array([[0.0, 0.0], [3.0, 4.0]]), {"axis": 1}),
    "zero-column-keepdims": (
        np.array([[0.0, 1.0], [0.0, -2.0], [0.0, 0.5]]),
        {"axis": 0, "keepdims": True},
    ),  # fmt: skip
    "all-axes-zero-matrix": (np.zeros((2, 2)), {"axis": (0, 1)}),
}


@pytest.mark.parametrize("name", NORM_POINTS)
def test_second_derivative_of_the_2_norm_at_zero_matches_torch(backend, name):
    x, kw = NORM_POINTS[name]
    torch_kw = {"dim": kw.get("axis"), "keepdim": kw.get("keepdims", False)}
    got = tg.hessian(lambda a: tg.sum(la.vector_norm(a, **kw)), backend.asarray(x))
    expected = torch.func.hessian(lambda t: torch.linalg.vector_norm(t, **torch_kw).sum())(
        torch_of(x)
    )
    np.testing.assert_allclose(numpy_of(backend, got), expected.numpy(), atol=1e-12)


def test_frobenius_norm_second_derivative_at_zero():
    got = tg.hessian(lambda a: la.matrix_norm(a), np.zeros((2, 2)))
    np.testing.assert_array_equal(got, np.zeros((2, 2, 2, 2)))


# --- Cholesky: the lower factor (and with upper=True the upper) on every backend
def _hpd(n, complex_, seed=0):
    x = randn(n, n, seed=seed) + (1j * randn(n, n, seed=seed + 1) if complex_ else 0)
    return x @ x.conj().T + n * np.eye(n)


@pytest.mark.parametrize("upper", [False, True], ids=["lower", "upper"])
@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
def test_cholesky_value_and_gradient_match_torch(backend, upper, complex_):
    a = _hpd(3, complex_)
    c = randn(3, 3, seed=5) + (1j * randn(3, 3, seed=6) if complex_ else 0)
    factor = la.cholesky(backend.asarray(a), upper=upper)
    expected = np.linalg.cholesky(a, upper=upper)
    np.testing.assert_allclose(numpy_of(backend, factor), expected, atol=1e-12)
    got = tg.gradient(
        lambda x: tg.sum(tg.real(la.cholesky(x, upper=upper) * backend.asarray(c))),
        backend.asarray(a),
    )[0]
    t = torch_of(a).requires_grad_()
    torch.sum(torch.real(torch.linalg.cholesky(t, upper=upper) * torch_of(c))).backward()
    hermitian = (t.grad + t.grad.mT.conj()).numpy() / 2  # the input is read as Hermitian
    np.testing.assert_allclose(numpy_of(backend, got), hermitian, atol=1e-12)


_VECTOR_ORDS = [2, 1, 0, math.inf, -math.inf, 3, -1]
_MATRIX_ORDS = ["fro", "nuc", 2, -2, 1, -1, math.inf, -math.inf]


def _same_as_plain(norm, x, **kw):
    """The tracked norm's value and dtype are the plain library's, or both raise."""
    import array_api_compat.numpy as plain

    try:
        expected = getattr(plain.linalg, norm)(x, **kw)
    except ValueError:
        with pytest.raises(ValueError):
            getattr(tg.linalg, norm)(tg.param(x) if x.dtype.kind == "f" else tg.asarray(x), **kw)
        return
    got = getattr(tg.linalg, norm)(tg.param(x) if x.dtype.kind == "f" else tg.asarray(x), **kw)
    assert tg.data(got).dtype == np.asarray(expected).dtype, (norm, kw)
    np.testing.assert_array_equal(tg.data(got), expected)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.parametrize("shape, axis", [((0,), None), ((0, 3), 0), ((2, 0), None)])
@pytest.mark.parametrize("ord", _VECTOR_ORDS)
def test_the_vector_norm_of_an_empty_array_is_numpys(shape, axis, ord):
    """The largest |x| of no element raised NumPy's reduction error; NumPy's norm is 0."""
    _same_as_plain("vector_norm", np.zeros(shape), ord=ord, axis=axis)


@pytest.mark.parametrize("shape", [(2, 0), (0, 3), (0, 0)])
@pytest.mark.parametrize("ord", _MATRIX_ORDS)
def test_the_matrix_norm_of_an_empty_matrix_is_numpys(shape, ord):
    _same_as_plain("matrix_norm", np.zeros(shape), ord=ord)


@pytest.mark.parametrize("ord", _VECTOR_ORDS)
def test_the_vector_norm_of_integers_is_a_float_as_numpys(ord):
    """ord 1, 0 and inf gave integers (2 gave a float)."""
    _same_as_plain("vector_norm", np.array([1, -2, 3]), ord=ord)
