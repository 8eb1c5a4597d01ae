"""`gradcheck`: compare a function's gradients with central finite differences.

Shipped in the package so that users can check their own rules.

>>> import numpy as np, tracker_gpu as tg
>>> tg.testing.gradcheck(lambda x: tg.sin(x) * x, np.array([0.5, 1.5]))
True
"""

import numpy as np

from . import backend, pytree
from .api import gradient, top_levels
from .pytree import is_container, tree_leaves, tree_map
from .rules.elementwise import is_complex, multiply, real
from .rules.reductions import sum as _sum
from .tracked import data

__all__ = ["gradcheck", "GradcheckError"]


class GradcheckError(AssertionError):
    """Analytic and numerical gradients disagree."""


def gradcheck(f, *xs, eps=1e-6, rtol=1e-5, atol=1e-5, directions=None, seed=0):
    """Check `gradient` of `sum(w * f(*xs))` (w random, fixed) against finite differences.

    `xs` are float64 or complex128 arrays of any library, Python floats, or structures of them
    (tuples, lists, dicts, named tuples, dataclasses), the way `gradient` takes them: every
    floating-point array in them is checked, and a Python float given as an argument itself (a
    0-d float64 array); integer and boolean arrays are data, and numbers inside a structure are
    constants, so they are not checked. An array that appears more than once is one parameter,
    perturbed everywhere at once. With nothing to check, a ValueError. Every element is
    perturbed when the inputs are small (or `directions=None` and they hold at most 64
    elements), else `directions` random directions are checked; a complex element is
    perturbed along its real and its imaginary axis. A complex `f` is checked through
    `real(sum(w * f(*xs)))`, w complex. The gradient of a real loss L in z = x + iy is
    dL/dx + i dL/dy (PyTorch's convention), so its derivative along a direction v is
    real(sum(conj(grad) * v)). Returns True, or raises `GradcheckError` naming the input (and
    where in it) and the largest disagreement.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.testing.gradcheck(lambda z: tg.exp(z) * tg.conj(z), np.array([0.5 + 1j, -1 - 2j]))
    True
    >>> tg.testing.gradcheck(lambda p: tg.sum(p["w"] * p["x"]), {"w": np.ones(2), "x": 0.5})
    True
    """
    # a Python float given as an argument itself is a parameter, a 0-d array, as for gradient
    xs = top_levels(xs, {i for i, x in enumerate(xs) if type(x) in (float, complex)})
    checked = _float_leaves(xs)
    if not checked:
        raise ValueError(
            "gradcheck found nothing to check: no argument is or holds a floating-point array "
            "(or is a Python float itself); integer and boolean arrays are data and numbers "
            "inside a structure are constants, none of them differentiated; pass float64 "
            "arrays"
        )
    rng = np.random.default_rng(seed)
    weights = _weights(f, xs, rng)

    def loss(*args):
        weighted = _sum(multiply(f(*args), weights))
        return real(weighted) if is_complex(weighted) else weighted

    analytic = gradient(loss, *xs)
    for i, path, x in checked:
        g = _leaf_at(analytic[i], [index for _, index in path])
        g = np.zeros(x.shape) if g is None else _to_numpy(data(g))
        along = list(_directions(x, directions, rng))
        if is_complex(x):
            along += [1j * v for v in along]
        numerics = _central_differences(loss, xs, x, along, eps)
        for v, numeric in zip(along, numerics):
            expected = float(np.real(np.sum(np.conj(g) * v)))
            if not abs(numeric - expected) <= atol + rtol * abs(numeric):
                where = "".join(label for label, _ in path)
                raise GradcheckError(
                    f"input {i}{where}: gradient gives {expected!r} along a direction, finite "
                    f"differences {numeric!r} (difference {abs(numeric - expected):.3g})"
                )
    return True


def _float_leaves(xs):
    """`[(argument, path, leaf)]` for each floating-point array in the arguments (the
    parameters `gradient` differentiates), each array once (by identity), in order; `path` is
    the `(label, index)` of each step that leads to it inside its argument."""
    found, seen = [], set()
    for i, x in enumerate(xs):
        tree_leaves(x)  # a clear error for a structure that contains itself, or is too deep
        for path, leaf in _walk(x, ()):
            if id(leaf) not in seen and _is_float_array(leaf):
                seen.add(id(leaf))
                found.append((i, path, leaf))
    return found


def _walk(tree, path):
    """`(path, leaf)` of each leaf of `tree`, in `tree_map`'s order."""
    if not is_container(tree):
        yield path, tree
        return
    for index, (label, child) in enumerate(pytree._children(tree)):
        yield from _walk(child, (*path, (label, index)))


def _leaf_at(tree, indices):
    """The leaf of `tree` (a gradient, shaped like its argument) at the child `indices`; None
    where the gradient is None."""
    for index in indices:
        if tree is None:
            return None
        tree = pytree._children(tree)[index][1]
    return tree


def _is_float_array(x):
    x = data(x)
    if not backend.is_array(x):
        return False
    return backend.isdtype(backend.namespace_of(x), x.dtype, ("real floating", "complex floating"))


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


def _central_differences(loss, xs, x, directions, eps):
    """The derivative of `loss` along each direction of the input array `x` (every place in the
    arguments `xs` that holds it). Lazy (dask) losses are computed together, in one pass over
    the data, rather than one computation each."""
    xp = backend.namespace_of(data(x))
    values = []
    for v in directions:
        step = xp.asarray(eps * v, dtype=x.dtype, device=backend.device_of(data(x)))
        for moved in (x + step, x - step):
            values.append(data(loss(*_replaced(xs, x, moved))))
    if values and backend.is_lazy(values[0]):
        import dask

        values = dask.compute(*values)
    values = [float(v) for v in values]
    return [(up - down) / (2 * eps) for up, down in zip(values[::2], values[1::2])]


def _replaced(xs, x, moved):
    """The arguments `xs` with `moved` in every place that holds the array `x`."""
    return tuple(tree_map(lambda y: moved if y is x else y, a) for a in xs)


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
