"""tg.einsum: values against numpy.einsum, first and second derivatives against finite
differences, on every backend (array-api-strict through the composed fallback)."""

import numpy as np
import pytest
from helpers import check, check_nested, numpy_of

import tracker_gpu as tg


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# name: (subscripts, shapes of the operands)
CASES = {
    "matmul": ("ij,jk->ik", [(3, 4), (4, 2)]),
    "matmul-implicit": ("ij,jk", [(3, 4), (4, 2)]),
    "batched": ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "dot": ("i,i->", [(4,), (4,)]),
    "trace": ("ii->", [(3, 3)]),
    "trace-implicit": ("ii", [(3, 3)]),
    "diagonal": ("ii->i", [(3, 3)]),
    "batch-diagonal": ("bii->bi", [(2, 3, 3)]),
    "repeated-with-other": ("iij,jk->ik", [(3, 3, 2), (2, 4)]),
    "sum-away": ("ijk->i", [(2, 3, 4)]),
    "sum-away-two": ("ij,jk->i", [(3, 4), (4, 2)]),
    "transpose": ("ij->ji", [(3, 4)]),
    "transpose-implicit": ("ba", [(3, 4)]),
    "three": ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    "three-shared": ("ij,ij,ij->i", [(2, 3), (2, 3), (2, 3)]),
    "bilinear": ("i,ij,j->", [(3,), (3, 4), (4,)]),
    "ellipsis": ("...ij,...jk->...ik", [(2, 3, 4), (4, 2)]),
    "ellipsis-broadcast": ("...i,...i->...", [(2, 1, 3), (4, 3)]),
    "uppercase": ("Ab,bc->cA", [(2, 3), (3, 4)]),
    # a letter of size 1 in one operand and larger in another (NumPy broadcasts it)
    "broadcast-summed": ("ij,jk->ik", [(3, 1), (4, 5)]),
    "broadcast-summed-right": ("ij,jk->ik", [(3, 4), (1, 5)]),
    "broadcast-dot": ("ij,ij->", [(1, 3), (2, 3)]),
    "broadcast-batch-summed": ("bij,bjk->ik", [(1, 2, 3), (4, 3, 2)]),
    "broadcast-batch-kept": ("bij,bjk->bik", [(4, 2, 3), (1, 3, 2)]),
    "broadcast-both": ("ij,ij->i", [(3, 1), (1, 4)]),
    "broadcast-three": ("i,ij,j->", [(1,), (3, 4), (1,)]),
}


def operands(backend, shapes):
    return [backend.asarray(randn(*s, seed=k)) for k, s in enumerate(shapes)]


@pytest.mark.parametrize("name", CASES)
def test_value(backend, name):
    sub, shapes = CASES[name]
    xs = operands(backend, shapes)
    expected = np.einsum(sub, *[randn(*s, seed=k) for k, s in enumerate(shapes)])
    got = tg.einsum(sub, *xs)
    assert not tg.istracked(got)
    np.testing.assert_allclose(numpy_of(backend, got), expected, rtol=1e-12, atol=1e-12)
    tracked = tg.einsum(sub, *[tg.param(x) for x in xs])
    assert tg.istracked(tracked)
    np.testing.assert_allclose(numpy_of(backend, tracked), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_gradient(backend, name):
    sub, shapes = CASES[name]
    check(backend, lambda *xs: tg.einsum(sub, *xs), *operands(backend, shapes))


@pytest.mark.parametrize(
    "name", ["matmul", "batched", "outer", "trace", "diagonal", "sum-away", "three", "bilinear",
             "ellipsis-broadcast", "repeated-with-other", "broadcast-summed", "broadcast-dot",
             "broadcast-batch-summed"]
)  # fmt: skip
def test_second_order(backend, name):
    sub, shapes = CASES[name]
    xs = operands(backend, shapes)
    # the first argument moves, the others stay fixed: a second derivative of a product needs
    # the product of two tracked operands, so square the first one's einsum
    for i in range(len(xs)):

        def f(x, i=i):
            args = list(xs)
            args[i] = x
            y = tg.einsum(sub, *args)
            return y * y

        check_nested(backend, f, xs[i])


BROADCAST = [name for name in CASES if name.startswith("broadcast-")]


@pytest.mark.parametrize("name", BROADCAST)
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_broadcast_letters_match_torch(name, dtype):
    """Each operand's gradient has its own shape and torch.einsum's values, where a summed or
    batch letter has size 1 in one operand and n in another."""
    torch = pytest.importorskip("torch")
    sub, shapes = CASES[name]
    xs = [randn(*s, seed=k).astype(dtype) for k, s in enumerate(shapes)]
    if dtype == np.complex128:
        xs = [x + 1j * randn(*x.shape, seed=9 + k) for k, x in enumerate(xs)]
    weights = randn(*np.einsum(sub, *xs).shape, seed=7)
    got = tg.gradient(lambda *a: tg.sum(tg.abs(tg.einsum(sub, *a) * weights) ** 2), *xs)
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    out = torch.einsum(sub, *ts) * torch.tensor(weights)
    torch.sum(torch.abs(out) ** 2).backward()
    for g, t in zip(got, ts):
        assert g.shape == tuple(t.shape)
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_second_order_mixed(backend):
    """d/dB of the gradient with respect to A: the vjp's einsum is differentiated in B."""
    a, b = operands(backend, [(3, 4), (4, 2)])
    w = backend.asarray(randn(3, 2, seed=5))

    def grad_a(b):
        return tg.gradient(lambda a, b: tg.sum(tg.einsum("ij,jk->ik", a, b) * w), a, b,
                           nest=True)[0]  # fmt: skip

    from tracker_gpu.testing import gradcheck

    assert tg.istracked(grad_a(b))
    assert gradcheck(grad_a, b)


def test_matches_matmul_gradient(backend):
    a, b = operands(backend, [(3, 4), (4, 2)])
    g1 = tg.gradient(lambda a, b: tg.sum(tg.einsum("ij,jk->ik", a, b) ** 2), a, b)
    g2 = tg.gradient(lambda a, b: tg.sum(tg.matmul(a, b) ** 2), a, b)
    for x, y in zip(g1, g2):
        np.testing.assert_allclose(numpy_of(backend, x), numpy_of(backend, y), rtol=1e-12)


@pytest.mark.parametrize(
    "sub, shapes, message",
    [
        ("ij,jk->ik", [(3, 4)], "operands"),
        ("ij->ii", [(3, 3)], "more than once"),
        ("ij->k", [(3, 3)], "no operand"),
        ("ijk->i", [(3, 3)], "dimensions"),
        ("ij,jk->ik", [(3, 4), (5, 2)], "size"),
        ("i1->i", [(3, 3)], "invalid"),
        ("...i->i", [(2, 3)], "'...'"),
    ],
)
def test_refused(backend, sub, shapes, message):
    with pytest.raises(ValueError, match=message):
        tg.einsum(sub, *operands(backend, shapes))
