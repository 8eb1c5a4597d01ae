"""Shared helpers of the rule tests: inputs on the backend under test, and gradient checks.

`check(backend, f, *xs)` is the one check every rule goes through: the gradient has the input's
library, dtype, device and shape, and agrees with finite differences (`tg.testing.gradcheck`).
"""

import array_api_compat
import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu.testing import gradcheck

# How an input is laid out in memory: a fresh array, or a view that is not C-contiguous.
CONTIGUOUS, TRANSPOSED, STRIDED = "contiguous", "transposed", "strided"


def uniform(shape, domain, seed=0):
    """NumPy float64 values uniform in `domain` = (low, high), or in the union of such pairs."""
    rng = np.random.default_rng(seed)
    if isinstance(domain[0], tuple):  # a union of intervals, e.g. both signs away from zero
        pieces = [rng.uniform(lo, hi, size=shape) for lo, hi in domain]
        pick = rng.integers(0, len(pieces), size=shape)
        return np.choose(pick, pieces) if pieces[0].ndim else pieces[int(pick)]
    return rng.uniform(*domain, size=shape)


def on_backend(backend, a, layout=CONTIGUOUS, dtype=None):
    """NumPy `a` as an array of `backend`; `layout` makes it a transposed or strided view."""
    a = np.asarray(a, dtype=dtype)
    if layout == CONTIGUOUS or a.ndim == 0:
        return backend.asarray(a)
    xp = backend.xp
    if layout == TRANSPOSED:  # the transpose of a C-contiguous array holding a's transpose
        reverse = tuple(range(a.ndim - 1, -1, -1))
        return xp.permute_dims(backend.asarray(np.ascontiguousarray(np.transpose(a))), reverse)
    if layout == STRIDED:  # every other element of an array twice as long on the last axis
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
        wide[..., ::2] = a
        return backend.asarray(wide)[..., ::2]
    raise ValueError(layout)


def check_like(backend, g, x):
    """`g` is a plain gradient for `x`: same library, dtype, device and shape."""
    assert g is not None, "no gradient came back"
    assert not tg.istracked(g)
    assert array_api_compat.array_namespace(g) is array_api_compat.array_namespace(x)
    assert tuple(g.shape) == tuple(x.shape)
    assert g.dtype == x.dtype
    assert tg.backend.device_of(g) == backend.device
    if backend.name == "strict-device1":
        assert tg.data(g).device == backend.device


def check(backend, f, *xs, zero=False, **options):
    """Check `f`'s gradient with respect to each array in `xs` (see the module docstring).

    `zero` allows a gradient of `None` (a function whose derivative is zero everywhere).
    """
    weights = np.random.default_rng(1).uniform(0.5, 1.5, size=tuple(f(*xs).shape))
    w = backend.asarray(weights)
    grads = tg.gradient(lambda *args: tg.sum(f(*args) * w), *xs)
    for x, g in zip(xs, grads):
        if tg.backend.is_array(x) and not (zero and g is None):
            check_like(backend, g, x)
    assert gradcheck(f, *xs, **lazy_options(backend, options))
    return grads


def check_nested(backend, f, *xs, **options):
    """Check the second derivative: gradcheck the (nest=True) gradient of `sum(w * f(xs))`."""
    weights = np.random.default_rng(2).uniform(0.5, 1.5, size=tuple(f(*xs).shape))
    w = backend.asarray(weights)

    def first(*args):
        return tg.gradient(lambda *a: tg.sum(f(*a) * w), *args, nest=True)[0]

    assert tg.istracked(first(*xs))
    assert gradcheck(first, *xs, **lazy_options(backend, options))


def lazy_options(backend, options):
    """gradcheck's options; on Dask, where every perturbed input builds a graph of the whole
    function (milliseconds an operation), one random direction rather than every element: a
    wrong gradient is wrong along a random direction (almost surely), and the other rows check
    every element of the same functions."""
    if backend.name == "dask":
        return {"directions": 1} | options
    return options


def numpy_of(backend, x):
    return backend.to_numpy(tg.data(x))


def is_contiguous_numpy(a):
    return isinstance(a, np.ndarray) and a.flags.c_contiguous


def require(backend, *names):
    """Skip where the backend's namespace lacks a function of the standard (`names` such as
    "take_along_axis" or "linalg.det"), saying which."""
    for name in names:
        where = backend.xp
        for part in name.split("."):
            where = getattr(where, part, None)
        if where is None:
            pytest.skip(f"{_library(backend)} lacks {name} of the Array API standard")


def require_array_attribute(backend, x, name):
    """Skip where the backend's arrays lack an attribute of the standard (e.g. "mT")."""
    if not hasattr(x, name):
        pytest.skip(
            f"{_library(backend)} arrays lack the {name} attribute of the Array API standard"
        )


def _library(backend):
    """The backend's library as its skip reasons name it (the same words as conftest's)."""
    return "Dask" if backend.name == "dask" else backend.name
