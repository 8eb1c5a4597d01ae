"""The pullback of indexing by integer arrays (`index_adjoint`: zeros of the indexed array's
shape with the gradient added at the key, repeated indices accumulating) in a fixed order, bit
for bit NumPy's `add.at` (`kernels/scatter.cu`). CuPy's own scatter-add adds with atomics in
whatever order they land, so an embedding's gradient changed in its last bits from one run to
the next, and a compiled step could not repeat its eager step."""

import math

from .dispatch import register
from .fused import ready
from .launch import grid_for, launch, library, on_device

__all__ = []


@register("forward", "index_adjoint")
def index_adjoint_forward(g, shape, key):
    """Zeros of `shape` with `g` added at `key`: the positions that `key` reads, sorted stably,
    then one launch adding up each position's run of elements in order."""
    if not (ready(g) and _integer_arrays(key)):
        return None  # slices and masks alone: a plain assignment, exact and in order already
    xp = library(g)
    with on_device(g):
        positions = xp.arange(math.prod(shape)).reshape(shape)[key]
        if positions.shape != g.shape:
            return None
        positions = positions.ravel()
        order = xp.argsort(positions, kind="stable")
        z = xp.zeros(shape, dtype=g.dtype)
    n = positions.size
    launch("scatter_add_ordered", g.dtype, grid_for(n), positions[order], order, g, z, n)
    return z


def _integer_arrays(key):
    parts = key if type(key) is tuple else (key,)
    return any(getattr(k, "dtype", None) is not None and k.dtype.kind in "iu" for k in parts)


@register("forward", "index_adjoint_traced")
def index_adjoint_traced_forward(g, *indices, shape, key, where):
    """The same in a `tg.compile` replay, where the key's integer arrays are arguments read
    anew (`key` holds None at the positions `where`)."""
    parts = list(key)
    for i, k in zip(where, indices):
        parts[i] = k
    return index_adjoint_forward(g, shape, tuple(parts))
