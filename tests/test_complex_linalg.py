"""The linalg extension, einsum and Tracker's extras on complex matrices: every function's
gradient against finite differences on every backend (complex128, PyTorch's convention: the
gradient of a real loss in z = a + ib is dL/da + i dL/db), some second derivatives too, and
values and gradients against PyTorch's autograd on the same inputs, an independent reference.

Each case is written once against a small adapter (`m`), which is tracker_gpu on the backend
under test or PyTorch. Losses of the gauge-dependent factorisations (qr, eigh, svd) do not
depend on the phases of the vectors: absolute values, or products such as U diag(S) V^H (QR's
factors are unique once R's diagonal is real, as LAPACK makes it, and are checked as they are).
"""

import numpy as np
import pytest
from helpers import check_like, lazy_options

import tracker_gpu as tg
from tracker_gpu.testing import gradcheck

la = tg.linalg


def crandn(*shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def well_conditioned(*shape, seed=0):
    n = shape[-1]
    return crandn(*shape, seed=seed) + n * np.eye(n)


class Tracked:
    """The adapter over tracker_gpu, with constants made on `backend`."""

    def __init__(self, backend):
        self.backend = backend

    def const(self, a):
        return self.backend.asarray(a)

    def __getattr__(self, name):
        return getattr(la, name, None) or getattr(tg, name)

    def H(self, x):
        return la.matrix_transpose(tg.conj(x))

    def svd(self, x):
        return la.svd(x, full_matrices=False)

    def tensordot1(self, x, y):
        return la.tensordot(x, y, axes=1)


class _NumPy:
    """A stand-in backend for constants made as NumPy arrays."""

    asarray = staticmethod(np.asarray)


class Torch:
    """The same functions in PyTorch."""

    def __init__(self, torch):
        self.t = torch
        self.linalg = torch.linalg

    def const(self, a):
        return self.t.from_numpy(np.asarray(a))

    def __getattr__(self, name):  # matmul, conj, abs, real, concat, einsum, kron, ...
        if name == "concat":
            return self.t.cat
        return getattr(self.linalg, name, None) or getattr(self.t, name)

    def H(self, x):
        return x.mH

    def matmul(self, x, y):  # PyTorch does not promote a real operand
        dtype = self.t.promote_types(x.dtype, y.dtype)
        return self.t.matmul(x.to(dtype), y.to(dtype))

    def einsum(self, subscripts, *xs):
        dtype = self.t.complex128
        return self.t.einsum(subscripts, *(x.to(dtype) for x in xs))

    def svd(self, x):
        return self.linalg.svd(x, full_matrices=False)

    def tensordot1(self, x, y):
        return self.t.tensordot(x, y, dims=1)

    def matrix_transpose(self, x):
        return x.mT

    def vecdot(self, x, y):
        return self.linalg.vecdot(x, y)

    def trace(self, x, offset=0):
        return self.t.diagonal(x, offset, -2, -1).sum(-1)

    def diagonal(self, x, offset=0):
        return self.t.diagonal(x, offset, -2, -1)

    def diagm(self, v, k=0):
        return self.t.diag_embed(v, offset=k)

    def vector_norm(self, x, ord=2, axis=None):
        return self.linalg.vector_norm(x, ord=ord, dim=axis)

    def logdet(self, x):
        return self.t.logdet(x)


def hpd(m, x):
    """x x^H + n I: Hermitian positive definite, built differentiably from any x."""
    n = x.shape[-2]
    return m.matmul(x, m.H(x)) + m.const(n * np.eye(n))


def hermitian(m, x):
    """(x + x^H) / 2 plus distinct, well-separated real diagonal entries."""
    n = x.shape[-1]
    return (x + m.H(x)) * 0.5 + m.const(np.diag(3.0 * np.arange(n)))


def reconstruct(m, usv):
    u, s, vh = usv
    return m.matmul(u * s[..., None, :], vh)


def slogdet_both(m, x):
    sign, logabsdet = m.slogdet(x)
    return sign * logabsdet + sign  # the complex sign is differentiable too


def qr_moduli(m, x, axis):
    q, r = m.qr(x)
    return m.concat([m.abs(q), m.abs(r)], axis=axis)


# name: (function of (adapter, *inputs), NumPy complex inputs)
CASES = {
    "matmul": (lambda m, x, y: m.matmul(x, y), [crandn(2, 2, 3), crandn(3, 2, seed=1)]),
    "matmul-vector": (lambda m, x, y: m.matmul(x, y), [crandn(2, 3), crandn(3, seed=1)]),
    "matmul-real-left": (
        lambda m, x, y: m.matmul(x, y),
        [np.random.default_rng(2).standard_normal((2, 3)), crandn(3, 2, seed=1)],
    ),
    "matrix_transpose": (lambda m, x: m.matrix_transpose(x), [crandn(2, 3)]),
    "tensordot": (lambda m, x, y: m.tensordot1(x, y), [crandn(2, 3), crandn(3, 2, seed=1)]),
    "vecdot": (lambda m, x, y: m.vecdot(x, y), [crandn(2, 3), crandn(3, seed=1)]),
    "vecdot-self": (lambda m, x: m.vecdot(x, x), [crandn(4)]),
    "outer": (lambda m, x, y: m.outer(x, y), [crandn(3), crandn(2, seed=1)]),
    "trace": (lambda m, x: m.trace(x, offset=1), [crandn(2, 3, 3)]),
    "diagonal": (lambda m, x: m.diagonal(x, offset=-1), [crandn(3, 4)]),
    "cross": (lambda m, x, y: m.cross(x, y), [crandn(2, 3), crandn(2, 3, seed=1)]),
    "kron": (lambda m, x, y: m.kron(x, y), [crandn(2, 2), crandn(2, 3, seed=1)]),
    "diagm": (lambda m, x: m.diagm(x, k=1), [crandn(3)]),
    "einsum": (lambda m, x, y: m.einsum("bij,jk->bik", x, y), [crandn(2, 2, 3), crandn(3, 2)]),
    "einsum-real-right": (
        lambda m, x, y: m.einsum("ij,j->i", x, y),
        [crandn(2, 3), np.random.default_rng(2).standard_normal(3)],
    ),
    "einsum-diagonal": (lambda m, x, y: m.einsum("ii,i->", x, y), [crandn(3, 3), crandn(3)]),
    "inv": (lambda m, x: m.inv(x), [well_conditioned(2, 3, 3)]),
    "solve": (lambda m, a, b: m.solve(a, b), [well_conditioned(3, 3), crandn(3, 2, seed=1)]),
    "solve-vector": (
        lambda m, a, b: m.solve(a, b[..., None])[..., 0],
        [well_conditioned(2, 3, 3), crandn(2, 3, seed=1)],
    ),  # fmt: skip
    "det": (lambda m, x: m.det(x), [crandn(2, 3, 3)]),
    "slogdet": (slogdet_both, [crandn(2, 3, 3)]),
    "logdet": (lambda m, x: m.logdet(x), [well_conditioned(3, 3)]),
    "matrix_power": (lambda m, x: m.matrix_power(x, 3), [crandn(3, 3) / 2]),
    "matrix_power-negative": (lambda m, x: m.matrix_power(x, -2), [well_conditioned(3, 3)]),
    "cholesky": (lambda m, x: m.cholesky(hpd(m, x)), [crandn(2, 3, 3)]),
    "cholesky-upper": (lambda m, x: m.cholesky(hpd(m, x), upper=True), [crandn(3, 3)]),
    "qr-tall": (lambda m, x: qr_moduli(m, x, -2), [crandn(4, 3)]),
    "qr-wide": (lambda m, x: qr_moduli(m, x, -1), [crandn(2, 3, 5)]),
    # the factors themselves: unique once R's diagonal is real (LAPACK's, and PyTorch's, choice)
    "qr-factors": (lambda m, x: m.concat(list(m.qr(x)), axis=-2), [crandn(2, 4, 3)]),
    "eigh-values": (lambda m, x: m.eigh(hermitian(m, x))[0], [crandn(2, 3, 3)]),
    "eigh-vectors": (lambda m, x: m.abs(m.eigh(hermitian(m, x))[1]), [crandn(2, 3, 3)]),
    "eigvalsh": (lambda m, x: m.eigvalsh(hpd(m, x)), [crandn(2, 3, 3)]),
    "svd-tall": (lambda m, x: reconstruct(m, m.svd(x)), [crandn(2, 4, 3)]),
    "svd-wide-moduli": (
        lambda m, x: m.concat([m.abs(m.svd(x)[0]), m.abs(m.svd(x)[2])], axis=-1),
        [crandn(3, 4)],
    ),
    "svdvals": (lambda m, x: m.svdvals(x), [crandn(2, 3, 4)]),
    "pinv": (lambda m, x: m.pinv(x), [crandn(2, 4, 3)]),
    "matrix_norm-fro": (lambda m, x: m.matrix_norm(x), [crandn(2, 3, 4)]),
    "matrix_norm-nuc": (lambda m, x: m.matrix_norm(x, ord="nuc"), [crandn(3, 4)]),
    "matrix_norm-2": (lambda m, x: m.matrix_norm(x, ord=2), [crandn(2, 4, 3)]),
    "matrix_norm-1": (lambda m, x: m.matrix_norm(x, ord=1), [crandn(3, 4)]),
    "vector_norm": (lambda m, x: m.vector_norm(x), [crandn(2, 3)]),
    "vector_norm-1": (lambda m, x: m.vector_norm(x, ord=1, axis=-1), [crandn(2, 3)]),
    "vector_norm-3": (lambda m, x: m.vector_norm(x, ord=3, axis=-1), [crandn(2, 3)]),
}


def _build(backend, name):
    f, inputs = CASES[name]
    m = Tracked(backend)
    return (lambda *xs: f(m, *xs)), [backend.asarray(x) for x in inputs]


def _weights(shape, seed=3):
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 1.5, size=shape) + 1j * rng.uniform(-1.0, 1.0, size=shape)


@pytest.mark.parametrize("name", list(CASES))
def test_gradient(backend, name):
    f, xs = _build(backend, name)
    w = backend.asarray(_weights(tuple(f(*xs).shape)))
    grads = tg.gradient(lambda *a: tg.real(tg.sum(f(*a) * w)), *xs)
    for x, g in zip(xs, grads):
        check_like(backend, g, x)
    assert gradcheck(f, *xs, **lazy_options(backend, {}))


# Second derivatives: the vjps on complex values are differentiable again (nest=True).
NESTED = ["matmul", "vecdot", "einsum", "solve", "slogdet", "logdet", "cholesky", "qr-factors",
          "eigh-vectors", "svd-tall", "svd-wide-moduli", "pinv", "matrix_norm-nuc"]  # fmt: skip


@pytest.mark.parametrize("name", NESTED)
def test_second_derivative(backend, name):
    f, xs = _build(backend, name)
    w = backend.asarray(_weights(tuple(f(*xs).shape)))

    def first(*args):
        return tg.gradient(lambda *a: tg.real(tg.sum(f(*a) * w)), *args, nest=True)[0]

    assert tg.istracked(first(*xs))
    assert gradcheck(first, *xs, **lazy_options(backend, {"rtol": 1e-4, "atol": 1e-4}))


@pytest.mark.parametrize("name", list(CASES))
def test_value_and_gradient_match_torch(name):
    torch = pytest.importorskip("torch")
    f, inputs = CASES[name]
    w = _weights(tuple(np.shape(f(Tracked(_NumPy), *inputs))))
    theirs = [torch.tensor(x, requires_grad=True) for x in inputs]
    out = f(Torch(torch), *theirs)
    value = out.detach().resolve_conj().numpy()
    np.testing.assert_allclose(f(Tracked(_NumPy), *inputs), value, rtol=1e-10, atol=1e-10)
    torch.real(torch.sum(out * torch.tensor(np.asarray(w)))).backward()
    ours = tg.gradient(lambda *a: tg.real(tg.sum(f(Tracked(_NumPy), *a) * w)), *inputs)
    for mine, reference in zip(ours, theirs):
        expected = reference.grad.resolve_conj().numpy()
        np.testing.assert_allclose(mine, expected, rtol=1e-9, atol=1e-9)


def test_values_of_complex_factorisations_are_real(backend):
    x = tg.param(backend.asarray(crandn(3, 3)))
    for value in (la.eigh(x + la.matrix_transpose(tg.conj(x))).eigenvalues, la.svd(x).S,
                  la.svdvals(x), la.slogdet(x).logabsdet, la.matrix_norm(x, ord=2)):  # fmt: skip
        assert not tg.rules.elementwise.is_complex(value)
