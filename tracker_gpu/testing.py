"""`gradcheck`: compare a function's gradients with central finite differences.

Shipped in the package so that users can check their own rules.

>>> import numpy as np, tracker_gpu as tg
>>> tg.testing.gradcheck(lambda x: tg.sin(x) * x, np.array([0.5, 1.5]))
True
"""

import numpy as np

from . import backend
from .api import gradient
from .rules.elementwise import is_complex, multiply, real
from .rules.reductions import sum as _sum
from .tracked import data

__all__ = ["gradcheck", "GradcheckError"]


class GradcheckError(AssertionError):
    """Analytic and numerical gradients disagree."""


def gradcheck(f, *xs, eps=1e-6, rtol=1e-5, atol=1e-5, directions=None, seed=0):
    """Check `gradient` of `sum(w * f(*xs))` (w random, fixed) against finite differences.

    `xs` are float64 or complex128 arrays of any library. Every element is perturbed when the
    inputs are small (or `directions=None` and they hold at most 64 elements), else `directions`
    random directions are checked; a complex element is perturbed along its real and its
    imaginary axis. A complex `f` is checked through `real(sum(w * f(*xs)))`, w complex. The
    gradient of a real loss L in z = x + iy is dL/dx + i dL/dy (PyTorch's convention), so its
    derivative along a direction v is real(sum(conj(grad) * v)). Returns True, or raises
    `GradcheckError` naming the input and the largest disagreement.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.testing.gradcheck(lambda z: tg.exp(z) * tg.conj(z), np.array([0.5 + 1j, -1 - 2j]))
    True
    """
    rng = np.random.default_rng(seed)
    weights = _weights(f, xs, rng)

    def loss(*args):
        weighted = _sum(multiply(f(*args), weights))
        return real(weighted) if is_complex(weighted) else weighted

    analytic = gradient(loss, *xs)
    for i, x in enumerate(xs):
        if not backend.is_array(x):
            continue
        g = analytic[i]
        g = np.zeros(x.shape) if g is None else _to_numpy(data(g))
        along = list(_directions(x, directions, rng))
        if is_complex(x):
            along += [1j * v for v in along]
        numerics = _central_differences(loss, xs, i, along, eps)
        for v, numeric in zip(along, numerics):
            expected = float(np.real(np.sum(np.conj(g) * v)))
            if not abs(numeric - expected) <= atol + rtol * abs(numeric):
                raise GradcheckError(
                    f"input {i}: gradient gives {expected!r} along a direction, finite "
                    f"differences {numeric!r} (difference {abs(numeric - expected):.3g})"
                )
    return True


def _weights(f, xs, rng):
    y = data(f(*xs))
    xp = backend.namespace_of(y)
    w = rng.uniform(0.5, 1.5, size=tuple(y.shape))
    if is_complex(y):
        w = w + 1j * rng.uniform(-1.0, 1.0, size=tuple(y.shape))
    return xp.asarray(w, dtype=y.dtype, device=backend.device_of(y))


def _directions(x, count, rng):
    n = int(np.prod(x.shape))
    if count is None and n <= 64:
        for k in range(n):
            v = np.zeros(n)
            v[k] = 1.0
            yield v.reshape(x.shape)
        return
    for _ in range(count or 8):
        yield rng.standard_normal(x.shape)


def _central_differences(loss, xs, i, directions, eps):
    """The derivative of `loss` along each direction of input `i`. Lazy (dask) losses are
    computed together, in one pass over the data, rather than one computation each."""
    x = xs[i]
    xp = backend.namespace_of(x)
    values = []
    for v in directions:
        step = xp.asarray(eps * v, dtype=x.dtype, device=backend.device_of(x))
        for moved in (x + step, x - step):
            values.append(data(loss(*xs[:i], moved, *xs[i + 1 :])))
    if values and backend.is_lazy(values[0]):
        import dask

        values = dask.compute(*values)
    values = [float(v) for v in values]
    return [(up - down) / (2 * eps) for up, down in zip(values[::2], values[1::2])]


def _to_numpy(x):
    xp = backend.namespace_of(x)
    if xp is np:
        return np.asarray(x)
    if hasattr(x, "cpu") and hasattr(x, "numpy"):
        return x.detach().cpu().numpy()
    if backend.is_cupy(x):
        return x.get()
    if backend.is_lazy(x):
        return _to_numpy(x.compute())  # its chunks may be CuPy arrays
    cpu = xp.__array_namespace_info__().default_device()
    return np.asarray(xp.to_device(x, cpu) if hasattr(xp, "to_device") else x.to_device(cpu))
