"""What the client tests (test_client_*.py) share: the namespace of arrays, the weighted loss
that turns a client's output into a scalar, its weights, PyTorch where installed, and SciPy with
its Array API switch on."""

import os

import array_api_compat
import numpy as np
import pytest

import tracker_gpu as tg

try:
    import torch
except ImportError:
    torch = None


def ns(*arrays):
    return array_api_compat.array_namespace(*arrays)


def loss(out, w):
    """sum(w * out), real part for a complex `out`, in the namespace of `out`."""
    xp = ns(out)
    total = xp.sum(out * xp.asarray(w))
    return xp.real(total) if xp.isdtype(total.dtype, "complex floating") else total


def weights(ref):
    """Weights of the shape of `ref`, complex where `ref` is."""
    rng = np.random.default_rng(1)
    w = rng.uniform(0.5, 1.5, size=np.shape(ref))
    return w + 1j * rng.uniform(-1.0, 1.0, size=np.shape(ref)) if np.iscomplexobj(ref) else w


def require_scipy_array_api():
    """Skip the calling module where SciPy ignores the Array API: SciPy reads SCIPY_ARRAY_API
    once, when first imported (tests/conftest.py sets it before anything imports SciPy)."""
    os.environ.setdefault("SCIPY_ARRAY_API", "1")
    if not pytest.importorskip("scipy._lib._array_api").SCIPY_ARRAY_API:
        pytest.skip(
            "SciPy was imported before this module without SCIPY_ARRAY_API=1, so it ignores "
            "the Array API; run with SCIPY_ARRAY_API=1",
            allow_module_level=True,
        )


def check_value(f, xs, rtol):
    """`f` on tracked `xs` gives the namespace's array of `f`'s value on NumPy copies of them."""
    params = [tg.param(x) for x in xs]
    got = f(*params)
    assert ns(got) is ns(*params)
    np.testing.assert_allclose(tg.data(got), f(*(x.copy() for x in xs)), rtol=rtol, atol=1e-12)
    return got


def check_like_torch(f, xs, takes_torch, rtol):
    """The gradient of `loss(f(xs))` is PyTorch's, where PyTorch can take the client's code
    (`takes_torch` is True, else the reason it cannot)."""
    if torch is None:
        pytest.skip("PyTorch is not installed")
    if takes_torch is not True:
        pytest.skip(takes_torch)
    w = weights(f(*xs))
    expected = tg.gradient(lambda *a: loss(f(*a), w), *xs)
    leaves = [torch.tensor(x, requires_grad=True) for x in xs]
    loss(f(*leaves), w).backward()
    for g, t in zip(expected, leaves):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=rtol, atol=1e-11)
