"""array-api-extra on tracked arrays: each function gives the value it gives on NumPy arrays, as
an array of the tracked namespace, and a gradient that agrees with finite differences and with
PyTorch (the same call on tensors). `xpx.at` writes, with and without copies."""

import numpy as np
import pytest

import tracker_gpu as tg
from tests.clients import loss, ns, torch, weights
from tracker_gpu.testing import gradcheck

xpx = pytest.importorskip("array_api_extra")

pytestmark = pytest.mark.filterwarnings("ignore:torch.asarray:UserWarning")

RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 4))
V = RNG.standard_normal(5)
WITH_ZERO = np.array([0.0, 0.5, -1.25, 2.0])


def fresh(f):
    """`f` on copies of its NumPy arguments: a write without copy=True (which changes a NumPy
    argument in place) then leaves the caller's array, e.g. gradcheck's, as it was."""
    return lambda *a: f(*(np.array(v) if isinstance(v, np.ndarray) else v for v in a))


def check_value(f, *xs):
    """`f` on tracked arrays matches `f` on NumPy arrays and is an array of the namespace."""
    params = [tg.param(x) for x in xs]
    got = f(*params)
    assert ns(got) is ns(*params)
    np.testing.assert_allclose(tg.data(got), fresh(f)(*xs), rtol=1e-10, atol=1e-12)
    return got


def check_torch(f, *xs):
    """The gradient of sum(w * f(xs)) matches PyTorch's for the same call on tensors."""
    if torch is None:
        pytest.skip("PyTorch is not installed")
    w = weights(fresh(f)(*xs))
    expected = tg.gradient(lambda *a: loss(f(*a), w), *xs)
    leaves = [torch.tensor(x, requires_grad=True) for x in xs]
    loss(f(*(t.clone() for t in leaves)), w).backward()  # clones: PyTorch can't write to leaves
    for g, t in zip(expected, leaves):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-9, atol=1e-12)


FUNCTIONS = {
    "cov": (lambda a: xpx.cov(a), A),
    "cov-transposed": (lambda a: xpx.cov(a.T), A),
    "cov-1d": (lambda a: xpx.cov(a), V),
    "kron-2d": (lambda a: xpx.kron(a, a[:2, 1:3]), A),
    "kron-1d-2d": (lambda a: xpx.kron(a[0], a[1:]), A),
    "kron-1d": (lambda a: xpx.kron(a, a[:2]), V),
    "sinc": (lambda a: xpx.sinc(a), V),
    "sinc-at-zero": (lambda a: xpx.sinc(a), WITH_ZERO),
    "pad-int": (lambda a: xpx.pad(a, 2), A),
    "pad-pairs": (lambda a: xpx.pad(a, ((1, 0), (0, 2)), constant_values=1.5), A),
    "pad-pair": (lambda a: xpx.pad(a, (1, 2)), A),
    "pad-1d": (lambda a: xpx.pad(a, 3, constant_values=-1.0), V),
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_value(name):
    f, x = FUNCTIONS[name]
    assert tg.istracked(check_value(f, x))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_gradient(name):
    f, x = FUNCTIONS[name]
    assert gradcheck(f, x)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_gradient_like_torch(name):
    f, x = FUNCTIONS[name]
    check_torch(f, x)


METHODS = ["set", "add", "subtract", "multiply", "divide", "power", "min", "max"]
COPIES = [True, None, False]


def write(method, copy):
    """`xpx.at(a, idx).<method>(y, copy=copy)`, y taken from `a` itself (a positive power)."""

    def f(a):
        y = 2.0 if method == "power" else a[2, 1:3]
        return getattr(xpx.at(a, (slice(0, 2), 1)), method)(y, copy=copy)

    return f


def test_at_has_the_methods_tested():
    assert sorted(m for m in dir(xpx.at) if not m.startswith("_")) == sorted(METHODS)


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize("method", METHODS)
def test_at_value(method, copy):
    assert tg.istracked(check_value(write(method, copy), A))


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize("method", METHODS)
def test_at_leaves_input_when_copying(method, copy):
    x = tg.param(A)
    got = write(method, copy)(x)
    if copy:
        np.testing.assert_array_equal(tg.data(x), A)
        assert got is not x
        a = A.copy()
        write(method, copy)(a)
        np.testing.assert_array_equal(a, A)
    else:  # written in place where the array is writable, which a tracked array is
        np.testing.assert_array_equal(tg.data(x), tg.data(got))


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize("method", METHODS)
def test_at_gradient(method, copy):
    assert gradcheck(fresh(write(method, copy)), A.copy())


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize("method", METHODS)
def test_at_gradient_like_torch(method, copy):
    if method in ("min", "max") or (method in ("multiply", "divide") and not copy):
        pytest.skip("PyTorch refuses: the write changes a tensor its backward pass saved")
    check_torch(write(method, copy), A)


@pytest.mark.parametrize("copy", COPIES)
def test_at_write_leaves_gradient_argument_unchanged(copy):
    a = A.copy()
    (g,) = tg.gradient(lambda x: ns(x).sum(xpx.at(x, (0, slice(1, 3))).multiply(x[1, :2])), a)
    np.testing.assert_array_equal(a, A)
    expected = np.ones_like(A)
    expected[0, 1:3] = A[1, :2]
    expected[1, :2] += A[0, 1:3]
    np.testing.assert_allclose(g, expected)


INDEXES = {
    "mask-set": (lambda a: xpx.at(a, a > 0).set(0.0), V),
    "mask-multiply": (lambda a: xpx.at(a, a > 0).multiply(a[a > 0] ** 2, copy=True), V),
    "integers-add": (lambda a: xpx.at(a, ns(a).asarray([0, 2])).add(a[1:3], copy=True), V),
    "ellipsis-divide": (lambda a: xpx.at(a, (..., 1)).divide(a[:, 2], copy=True), A),
    "getitem-subtract": (lambda a: xpx.at(a)[::-2].subtract(1.5, copy=True), V),
    "xp-power": (lambda a: xpx.at(ns(a).exp(a), 1).power(a[2], copy=True, xp=ns(a)), V),
    "max-negative-step": (lambda a: xpx.at(a)[::-2].max(a[1:4] - 0.1), V),
    "into-zeros": (
        lambda a: xpx.at(ns(a).zeros(7, dtype=a.dtype), ns(a).asarray([1, 4])).set(a[:2]),
        V,
    ),
    "into-0d": (lambda a: xpx.at(ns(a).sum(a), ()).add(a[0]), V),
    "into-complex": (
        lambda a: xpx.at(ns(a).astype(a, ns(a).complex128) * (1 + 2j), 1).multiply(a[2] + 1j),
        V,
    ),
    "integer-index-written": (
        lambda a: ns(a).take(a, xpx.at(ns(a).asarray([3, 0, 1]), 0).set(2)),
        V,
    ),
    "mask-written": (lambda a: ns(a).where(xpx.at(a > 0, 1).set(True), a, -a), V),
}


@pytest.mark.parametrize("name", INDEXES)
def test_at_index_kinds(name):
    f, x = INDEXES[name]
    check_value(f, x)
    assert gradcheck(fresh(f), x.copy())
