"""The linalg extension and Tracker's extras: every function's gradient against finite
differences on every backend (with batches), second derivatives, forward values against NumPy,
and behaviour checks against independent NumPy references."""

import array_api_compat
import numpy as np
import pytest
from helpers import check, check_like, check_nested, numpy_of

import tracker_gpu as tg
from tracker_gpu.rules import linalg as linalg_rules
from tracker_gpu.tape import PullbackError
from tracker_gpu.testing import gradcheck

la = tg.linalg


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def well_conditioned(*shape, seed=0):
    """Square matrices (..., n, n) far from singular: random plus n on the diagonal."""
    n = shape[-1]
    return randn(*shape, seed=seed) + n * np.eye(n)


class Cases:
    """Builds `(f, inputs)` for a named case on a backend: `f` takes the inputs."""

    def __init__(self, backend):
        self.b = backend

    def a(self, x):
        return self.b.asarray(x)

    def spd(self, x):
        """x @ x.T + n I: symmetric positive definite, built differentiably from any x."""
        n = x.shape[-2]
        return tg.matmul(x, la.matrix_transpose(x)) + self.a(n * np.eye(n))

    def sym(self, x):
        """(x + x.T) / 2 plus distinct, well-separated diagonal entries."""
        n = x.shape[-1]
        return (x + la.matrix_transpose(x)) * 0.5 + self.a(np.diag(3.0 * np.arange(n)))


def _np_sym(x):
    return (x + np.swapaxes(x, -1, -2)) / 2 + np.diag(3.0 * np.arange(x.shape[-1]))


# name: (function of (cases, *inputs), NumPy inputs, NumPy reference of the forward or None)
CASES = {
    # solve, with either side tracked, vector and matrix right-hand sides, batches
    "solve": (
        lambda c, a, b: la.solve(a, b),
        [well_conditioned(3, 3), randn(3, 2, seed=1)],
        np.linalg.solve,
    ),
    "solve-vector": (
        lambda c, a, b: la.solve(a, b),
        [well_conditioned(3, 3), randn(3, seed=1)],
        np.linalg.solve,
    ),
    "solve-batch": (
        lambda c, a, b: la.solve(a, b),
        [well_conditioned(2, 3, 3), randn(2, 3, 2, seed=1)],
        np.linalg.solve,
    ),
    "solve-broadcast": (
        lambda c, a, b: la.solve(a, b),
        [well_conditioned(2, 3, 3), randn(3, 2, seed=1)],
        np.linalg.solve,
    ),
    "solve-batch-vector": (
        lambda c, a, b: la.solve(a, b),
        [well_conditioned(2, 3, 3), randn(3, seed=1)],
        lambda a, b: np.linalg.solve(a, b[:, None])[..., 0],
    ),
    "solve-left-tracked": (
        lambda c, a: la.solve(a, c.a(randn(3, 2, seed=1))),
        [well_conditioned(3, 3)],
        lambda a: np.linalg.solve(a, randn(3, 2, seed=1)),
    ),
    "solve-right-tracked": (
        lambda c, b: la.solve(c.a(well_conditioned(3, 3)), b),
        [randn(3, 2, seed=1)],
        lambda b: np.linalg.solve(well_conditioned(3, 3), b),
    ),
    "inv": (lambda c, x: la.inv(x), [well_conditioned(3, 3)], np.linalg.inv),
    "inv-batch": (lambda c, x: la.inv(x), [well_conditioned(2, 3, 3)], np.linalg.inv),
    "det": (lambda c, x: la.det(x), [randn(3, 3)], np.linalg.det),
    "det-batch": (lambda c, x: la.det(x), [randn(2, 3, 3)], np.linalg.det),
    "slogdet": (
        lambda c, x: la.slogdet(x).logabsdet,
        [randn(2, 3, 3)],
        lambda x: np.linalg.slogdet(x).logabsdet,
    ),
    "logdet": (
        lambda c, x: la.logdet(c.spd(x)),
        [randn(3, 3)],
        lambda x: np.log(np.linalg.det(x @ x.T + 3 * np.eye(3))),
    ),
    "logdet-batch": (lambda c, x: la.logdet(c.spd(x)), [randn(2, 3, 4)], None),
    "cholesky": (
        lambda c, x: la.cholesky(c.spd(x)),
        [randn(3, 3)],
        lambda x: np.linalg.cholesky(x @ x.T + 3 * np.eye(3)),
    ),
    "cholesky-upper-batch": (
        lambda c, x: la.cholesky(c.spd(x), upper=True),
        [randn(2, 3, 3)],
        lambda x: np.linalg.cholesky(x @ np.swapaxes(x, -1, -2) + 3 * np.eye(3), upper=True),
    ),
    # QR, SVD and eigh: gauge-invariant losses (squares) or the sign-free factor
    "qr-tall-Q": (lambda c, x: la.qr(x).Q ** 2, [randn(4, 3)], lambda x: np.linalg.qr(x).Q ** 2),
    "qr-tall-R": (lambda c, x: la.qr(x).R ** 2, [randn(2, 4, 3)], lambda x: np.linalg.qr(x).R ** 2),
    "qr-square": (
        lambda c, x: la.qr(x).Q ** 2 + la.qr(x).R ** 2,
        [randn(3, 3)],
        lambda x: np.linalg.qr(x).Q ** 2 + np.linalg.qr(x).R ** 2,
    ),
    "qr-wide": (
        lambda c, x: tg.concat([la.qr(x).Q ** 2, la.qr(x).R ** 2], axis=-1),
        [randn(2, 3, 5)],
        lambda x: np.concatenate([np.linalg.qr(x).Q ** 2, np.linalg.qr(x).R ** 2], -1),
    ),
    "eigh-values": (
        lambda c, x: la.eigh(c.sym(x)).eigenvalues,
        [randn(2, 3, 3)],
        lambda x: np.linalg.eigh(_np_sym(x)).eigenvalues,
    ),
    "eigh-vectors": (
        lambda c, x: la.eigh(c.sym(x)).eigenvectors ** 2,
        [randn(2, 3, 3)],
        lambda x: np.linalg.eigh(_np_sym(x)).eigenvectors ** 2,
    ),
    "eigvalsh": (
        lambda c, x: la.eigvalsh(c.spd(x)),
        [randn(2, 3, 3)],
        lambda x: np.linalg.eigvalsh(x @ np.swapaxes(x, -1, -2) + 3 * np.eye(3)),
    ),
    "svd-tall": (
        lambda c, x: la.svd(x, full_matrices=False).U ** 2 @ la.svd(x, full_matrices=False).Vh ** 2,
        [randn(4, 3)],
        lambda x: (
            np.linalg.svd(x, full_matrices=False).U ** 2
            @ np.linalg.svd(x, full_matrices=False).Vh ** 2
        ),
    ),
    "svd-wide-batch": (
        lambda c, x: tg.concat(
            [la.svd(x, full_matrices=False).U ** 2, la.svd(x, full_matrices=False).Vh ** 2], axis=-1
        ),
        [randn(2, 3, 4)],
        None,
    ),
    "svd-square-S": (lambda c, x: la.svd(x).S, [randn(3, 3)], lambda x: np.linalg.svd(x).S),
    "svd-reconstruct": (
        lambda c, x: _reconstruct(la.svd(x, full_matrices=False)),
        [randn(2, 4, 3)],
        lambda x: x,
    ),
    "svdvals": (lambda c, x: la.svdvals(x), [randn(2, 3, 4)], np.linalg.svdvals),
    "pinv-tall": (lambda c, x: la.pinv(x), [randn(4, 3)], np.linalg.pinv),
    "pinv-wide-batch": (lambda c, x: la.pinv(x), [randn(2, 3, 4)], np.linalg.pinv),
    # norms
    "matrix_norm-fro": (
        lambda c, x: la.matrix_norm(x),
        [randn(2, 3, 4)],
        lambda x: np.linalg.matrix_norm(x),
    ),
    "matrix_norm-nuc": (
        lambda c, x: la.matrix_norm(x, ord="nuc"),
        [randn(2, 3, 4)],
        lambda x: np.linalg.matrix_norm(x, ord="nuc"),
    ),
    "matrix_norm-2": (
        lambda c, x: la.matrix_norm(x, ord=2, keepdims=True),
        [randn(2, 4, 3)],
        lambda x: np.linalg.matrix_norm(x, ord=2, keepdims=True),
    ),
    "matrix_norm--2": (
        lambda c, x: la.matrix_norm(x, ord=-2),
        [randn(3, 3)],
        lambda x: np.linalg.matrix_norm(x, ord=-2),
    ),
    "matrix_norm-1": (
        lambda c, x: la.matrix_norm(x, ord=1),
        [randn(2, 3, 4)],
        lambda x: np.linalg.matrix_norm(x, ord=1),
    ),
    "matrix_norm--1": (
        lambda c, x: la.matrix_norm(x, ord=-1),
        [randn(3, 4)],
        lambda x: np.linalg.matrix_norm(x, ord=-1),
    ),
    "matrix_norm-inf": (
        lambda c, x: la.matrix_norm(x, ord=np.inf, keepdims=True),
        [randn(2, 3, 4)],
        lambda x: np.linalg.matrix_norm(x, ord=np.inf, keepdims=True),
    ),
    "matrix_norm--inf": (
        lambda c, x: la.matrix_norm(x, ord=-np.inf),
        [randn(3, 4)],
        lambda x: np.linalg.matrix_norm(x, ord=-np.inf),
    ),
    "vector_norm-2": (
        lambda c, x: la.vector_norm(x),
        [randn(2, 3)],
        lambda x: np.linalg.vector_norm(x),
    ),
    "vector_norm-2-axes": (
        lambda c, x: la.vector_norm(x, axis=(0, 2), keepdims=True),
        [randn(2, 3, 4)],
        lambda x: np.linalg.vector_norm(x, axis=(0, 2), keepdims=True),
    ),
    "vector_norm-1": (
        lambda c, x: la.vector_norm(x, ord=1, axis=-1),
        [randn(2, 3)],
        lambda x: np.linalg.vector_norm(x, ord=1, axis=-1),
    ),
    "vector_norm-inf": (
        lambda c, x: la.vector_norm(x, ord=np.inf, axis=0),
        [randn(3, 4)],
        lambda x: np.linalg.vector_norm(x, ord=np.inf, axis=0),
    ),
    "vector_norm--inf": (
        lambda c, x: la.vector_norm(x, ord=-np.inf),
        [randn(5)],
        lambda x: np.linalg.vector_norm(x, ord=-np.inf),
    ),
    "vector_norm-3.5": (
        lambda c, x: la.vector_norm(x, ord=3.5, axis=1),
        [randn(2, 3)],
        lambda x: np.linalg.vector_norm(x, ord=3.5, axis=1),
    ),
    "vector_norm--1.5": (
        lambda c, x: la.vector_norm(x, ord=-1.5),
        [randn(4)],
        lambda x: np.linalg.vector_norm(x, ord=-1.5),
    ),
    # diagonals, products, powers
    "trace": (
        lambda c, x: la.trace(x),
        [randn(2, 3, 3)],
        lambda x: np.trace(x, axis1=-2, axis2=-1),
    ),
    "trace-offset": (
        lambda c, x: la.trace(x, offset=1),
        [randn(4, 3)],
        lambda x: np.trace(x, offset=1),
    ),
    "diagonal": (
        lambda c, x: la.diagonal(x),
        [randn(2, 3, 4)],
        lambda x: np.diagonal(x, axis1=-2, axis2=-1),
    ),
    "diagonal-offset": (
        lambda c, x: la.diagonal(x, offset=-2),
        [randn(4, 3)],
        lambda x: np.diagonal(x, offset=-2),
    ),
    "outer": (lambda c, x, y: la.outer(x, y), [randn(3), randn(4, seed=1)], np.outer),
    "cross": (
        lambda c, x, y: la.cross(x, y),
        [randn(2, 3), randn(3, seed=1)],
        lambda x, y: np.cross(x, y),
    ),
    "cross-axis": (
        lambda c, x, y: la.cross(x, y, axis=-2),
        [randn(3, 2), randn(3, 2, seed=1)],
        lambda x, y: np.cross(x, y, axis=-2),
    ),
    "matrix_power": (
        lambda c, x: la.matrix_power(x, 3),
        [randn(2, 3, 3) / 2],
        lambda x: np.linalg.matrix_power(x, 3),
    ),
    "matrix_power-negative": (
        lambda c, x: la.matrix_power(x, -2),
        [well_conditioned(3, 3)],
        lambda x: np.linalg.matrix_power(x, -2),
    ),
    "kron": (lambda c, x, y: la.kron(x, y), [randn(2, 3), randn(3, 2, seed=1)], np.kron),
    "kron-vector": (lambda c, x, y: la.kron(x, y), [randn(2), randn(3, seed=1)], np.kron),
    "diagm": (lambda c, x: la.diagm(x), [randn(3)], np.diag),
    "diagm-above": (lambda c, x: la.diagm(x, k=1), [randn(3)], lambda x: np.diag(x, k=1)),
    "diagm-below": (lambda c, x: la.diagm(x, k=-2), [randn(3)], lambda x: np.diag(x, k=-2)),
    "vecdot": (
        lambda c, x, y: la.vecdot(x, y),
        [randn(2, 3), randn(3, seed=1)],
        lambda x, y: np.sum(x * y, axis=-1),
    ),
    "tensordot": (
        lambda c, x, y: la.tensordot(x, y, axes=1),
        [randn(2, 3), randn(3, 2, seed=1)],
        lambda x, y: np.tensordot(x, y, axes=1),
    ),
    "matmul": (lambda c, x, y: tg.matmul(x, y), [randn(2, 2, 3), randn(3, 2, seed=1)], np.matmul),
}

# Second derivatives: the cases whose rules are checked to be twice differentiable.
NESTED = [
    "solve",
    "solve-vector",
    "solve-left-tracked",
    "solve-right-tracked",
    "inv",
    "det-batch",
    "slogdet",
    "logdet",
    "cholesky",
    "qr-tall-Q",
    "qr-wide",
    "eigh-vectors",
    "eigvalsh",
    "svd-tall",
    "svdvals",
    "pinv-wide-batch",
    "matrix_norm-fro",
    "matrix_norm-nuc",
    "vector_norm-2",
    "matrix_power-negative",
    "diagonal-offset",
    "diagm-below",
    "kron",
]


def _reconstruct(usv):
    u, s, vh = usv
    return tg.matmul(u * tg.expand_dims(s, axis=-2), vh)


def test_outer_of_arrays_that_are_not_vectors_is_refused():
    """As the standard's linalg.outer (and array-api-strict); NumPy's np.outer flattens: a
    batched product, silently, was neither."""
    with pytest.raises(ValueError, match="outer takes two vectors, got 2 and 1 dimensions"):
        la.outer(tg.param(np.ones((2, 2))), np.ones(3))


def _build(backend, name):
    f, inputs, _ = CASES[name]
    cases = Cases(backend)
    return (lambda *xs: f(cases, *xs)), [backend.asarray(x) for x in inputs]


@pytest.mark.parametrize("name", list(CASES))
def test_gradient(backend, name):
    f, xs = _build(backend, name)
    check(backend, f, *xs)


@pytest.mark.parametrize("name", NESTED)
def test_second_derivative(backend, name):
    f, xs = _build(backend, name)
    check_nested(backend, f, *xs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[2] is not None])
@pytest.mark.parametrize("tracked", [False, True], ids=["plain", "tracked"])
def test_forward_matches_numpy(backend, name, tracked):
    f, xs = _build(backend, name)
    reference = CASES[name][2](*CASES[name][1])
    out = f(*[tg.param(x) for x in xs]) if tracked else f(*xs)
    assert tg.istracked(out) == tracked
    np.testing.assert_allclose(numpy_of(backend, out), reference, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["solve-broadcast", "solve-batch-vector"])
def test_solve_broadcasts_for_a_library_that_does_not(monkeypatch, name):
    """CuPy's solve broadcasts no batch dimensions and takes no vector against a batch of
    matrices (imitated on NumPy): solve makes both explicit, in the forward pass and pullback."""
    _, (a, b), reference = CASES[name]
    expected, numpy_solve = reference(a, b), np.linalg.solve

    def unbroadcasting(a, b):
        if b.ndim > 1 and a.shape[:-1] != b.shape[:-1]:
            raise ValueError("a must have (..., M, M) shape and b must have (..., M, K)")
        return numpy_solve(a, b)

    monkeypatch.setattr(np.linalg, "solve", unbroadcasting)
    np.testing.assert_allclose(tg.data(la.solve(a, b)), expected, rtol=1e-12)
    assert gradcheck(la.solve, a, b)


# --- behaviour checks against independent NumPy references
@pytest.mark.parametrize("form", ["function", "operator"])
def test_gradient_of_matrix_vector_product(backend, form):
    if form == "operator" and backend.name.startswith("strict"):
        pytest.skip("array_api_strict raises on a tracked right operand instead of deferring")
    A = randn(3, 4)
    product = (lambda a, x: a @ x) if form == "operator" else tg.matmul
    g = tg.gradient(lambda x: tg.sum(product(backend.asarray(A), x)), backend.asarray(np.ones(4)))
    g = g[0]
    check_like(backend, g, backend.asarray(np.ones(4)))
    np.testing.assert_allclose(backend.to_numpy(g), A.sum(axis=0), rtol=1e-12)


def test_det_gradient_is_cofactor_matrix(backend):
    A = randn(2, 3, 3)
    g = tg.gradient(lambda x: tg.sum(la.det(x)), backend.asarray(A))[0]
    expected = np.linalg.det(A)[:, None, None] * np.swapaxes(np.linalg.inv(A), -1, -2)
    np.testing.assert_allclose(backend.to_numpy(g), expected, rtol=1e-10)


def test_logdet_of_spd_gradient(backend):
    A = randn(3, 3)
    g = tg.gradient(lambda x: la.logdet(x @ la.matrix_transpose(x)), backend.asarray(A))[0]
    np.testing.assert_allclose(backend.to_numpy(g), 2 * np.linalg.inv(A).T, rtol=1e-10)


def test_logdet_of_negative_determinant_is_nan(backend):
    x = tg.param(backend.asarray(np.diag([-1.0, 2.0])))
    assert np.isnan(float(la.logdet(x)))


def test_slogdet_sign_is_plain(backend):
    A = np.diag([-1.0, 2.0, 3.0])
    sign, logabsdet = la.slogdet(tg.param(backend.asarray(A)))
    assert not tg.istracked(sign) and tg.istracked(logabsdet)
    assert float(sign) == -1.0
    np.testing.assert_allclose(float(logabsdet), np.log(6.0))


def test_factorisations_reconstruct(backend):
    x = tg.param(backend.asarray(randn(2, 4, 3)))
    q, r = la.qr(x)
    np.testing.assert_allclose(numpy_of(backend, q @ r), numpy_of(backend, x), atol=1e-12)
    u, s, vh = la.svd(x, full_matrices=False)
    np.testing.assert_allclose(
        numpy_of(backend, _reconstruct((u, s, vh))), numpy_of(backend, x), atol=1e-12
    )
    spd = Cases(backend).spd(x)
    w, v = la.eigh(spd)
    back = (v * tg.expand_dims(w, axis=-2)) @ la.matrix_transpose(v)
    np.testing.assert_allclose(numpy_of(backend, back), numpy_of(backend, spd), atol=1e-10)
    L = la.cholesky(spd)
    np.testing.assert_allclose(
        numpy_of(backend, L @ la.matrix_transpose(L)), numpy_of(backend, spd), atol=1e-10
    )


@pytest.mark.parametrize("shape", [(4, 2), (2, 5)], ids=["tall", "wide"])
def test_full_singular_vectors_of_a_non_square_matrix(backend, shape):
    """The added vectors complete U (or Vh) to an orthogonal matrix; the singular values keep
    their gradient; a loss reading U or Vh is refused in the backward pass, by name."""
    x = backend.asarray(randn(*shape))
    u, s, vh = la.svd(tg.param(x))
    m, n = shape
    assert tuple(u.shape) == (m, m) and tuple(vh.shape) == (n, n)
    k = min(m, n)
    np.testing.assert_allclose(
        numpy_of(backend, (u[:, :k] * s) @ vh[:k, :]), numpy_of(backend, x), atol=1e-12
    )
    for q in (u, vh):
        np.testing.assert_allclose(numpy_of(backend, q @ la.matrix_transpose(q)), np.eye(len(q)),
                                   atol=1e-12)  # fmt: skip
    (g,) = tg.gradient(lambda x: tg.sum(la.svd(x).S), x)
    (reduced,) = tg.gradient(lambda x: tg.sum(la.svd(x, full_matrices=False).S), x)
    np.testing.assert_allclose(numpy_of(backend, g), numpy_of(backend, reduced), atol=1e-12)
    with pytest.raises(PullbackError, match="not unique.*pass full_matrices=False"):
        tg.gradient(lambda x: tg.sum(la.svd(x).U) + tg.sum(la.svd(x).Vh), x)


def test_eigvalsh_gradient_with_repeated_eigenvalues(backend):
    # sum of eigenvalues = trace: the gradient is the identity, also at a multiple of it.
    g = tg.gradient(lambda x: tg.sum(la.eigvalsh(x)), backend.asarray(2 * np.eye(3)))[0]
    np.testing.assert_allclose(backend.to_numpy(g), np.eye(3), atol=1e-12)


def test_nuclear_norm_gradient_at_orthogonal_matrix(backend):
    # All singular values are 1; the gradient of their sum is U @ Vh = Q itself.
    Q = np.linalg.qr(randn(3, 3)).Q
    g = tg.gradient(lambda x: la.matrix_norm(x, ord="nuc"), backend.asarray(Q))[0]
    np.testing.assert_allclose(backend.to_numpy(g), Q, atol=1e-10)


def test_vector_norm_gradient_at_zero_is_zero(backend):
    g = tg.gradient(la.vector_norm, backend.asarray(np.zeros(3)))[0]
    np.testing.assert_array_equal(backend.to_numpy(g), np.zeros(3))


def test_non_differentiable_results(backend):
    x = backend.asarray(randn(3, 3))
    n0 = la.vector_norm(tg.param(x), ord=0)
    assert float(n0) == 9.0
    assert tg.gradient(lambda x: la.vector_norm(x, ord=0), x)[0] is None
    rank = la.matrix_rank(tg.param(x))
    assert not tg.istracked(rank) and int(rank) == 3
    eye = la.matrix_power(tg.param(x), 0)
    np.testing.assert_array_equal(numpy_of(backend, eye), np.eye(3))
    assert tg.gradient(lambda x: tg.sum(la.matrix_power(x, 0)), x)[0] is None


@pytest.mark.parametrize("shape", [(3, 2), (5, 2)])
def test_complete_qr_of_a_tall_matrix(backend, shape):
    """Q completed to an orthogonal matrix, R padded with zero rows; R keeps its gradient; a
    loss reading Q is refused in the backward pass, by name."""
    x = backend.asarray(randn(*shape))
    q, r = la.qr(tg.param(x), mode="complete")
    m, n = shape
    assert tuple(q.shape) == (m, m) and tuple(r.shape) == (m, n)
    np.testing.assert_allclose(numpy_of(backend, q @ r), numpy_of(backend, x), atol=1e-12)
    np.testing.assert_allclose(numpy_of(backend, q @ la.matrix_transpose(q)), np.eye(m),
                               atol=1e-12)  # fmt: skip
    (g,) = tg.gradient(lambda x: tg.sum(la.qr(x, mode="complete").R ** 2), x)
    (reduced,) = tg.gradient(lambda x: tg.sum(la.qr(x).R ** 2), x)
    np.testing.assert_allclose(numpy_of(backend, g), numpy_of(backend, reduced), atol=1e-12)
    with pytest.raises(PullbackError, match="not unique.*pass mode='reduced'"):
        tg.gradient(lambda x: tg.sum(la.qr(x, mode="complete").Q), x)


def test_namespace_exposes_linalg(backend):
    x = tg.param(backend.asarray(well_conditioned(3, 3)))
    xp = array_api_compat.array_namespace(x)
    assert xp.linalg is la
    assert tg.istracked(xp.linalg.inv(x))
    for name in linalg_rules.__all__:
        assert getattr(xp.linalg, name) is getattr(linalg_rules, name), name


@pytest.mark.parametrize("which", ["cholesky", "cholesky-upper", "eigh"])
def test_symmetric_input_gives_symmetric_gradient(backend, which):
    A = randn(3, 3) @ randn(3, 3, seed=1).T + 3 * np.eye(3)
    c = backend.asarray(np.arange(9.0).reshape(3, 3))
    f = {
        "cholesky": lambda x: la.cholesky(x) ** 3,
        "cholesky-upper": lambda x: la.cholesky(x, upper=True) ** 3,
        "eigh": lambda x: la.eigh(x).eigenvectors ** 2 * c + la.eigh(x).eigenvalues ** 2,
    }[which]
    g = backend.to_numpy(tg.gradient(lambda x: tg.sum(f(x)), backend.asarray(A))[0])
    np.testing.assert_allclose(g, g.T, atol=1e-12)
    assert np.abs(g - np.tril(g)).max() > 1e-3  # not the gradient of one triangle only


FLOAT32 = {
    "solve": lambda x: la.solve(x, x[0, :, 0]),
    "det": la.det,
    "logdet": lambda x: la.logdet(x @ la.matrix_transpose(x)),
    "cholesky": lambda x: la.cholesky(x @ la.matrix_transpose(x)),
    "qr": lambda x: la.qr(x).R,
    "eigh": lambda x: la.eigh(x).eigenvectors ** 2,
    "svd": lambda x: la.svd(x).U ** 2,
    "pinv": la.pinv,
    "matrix_norm-nuc": lambda x: la.matrix_norm(x, ord="nuc"),
    "vector_norm": la.vector_norm,
    "matrix_power": lambda x: la.matrix_power(x, -2),
    "diagm": lambda x: la.diagm(x[..., 0], k=1),
}


@pytest.mark.parametrize("name", list(FLOAT32))
def test_float32_gradients_keep_dtype_and_device(backend, name):
    x = backend.asarray(well_conditioned(2, 3, 3).astype(np.float32))
    g = tg.gradient(lambda x: tg.sum(FLOAT32[name](x)), x)[0]
    check_like(backend, g, x)
    assert np.all(np.isfinite(backend.to_numpy(g)))
