"""The pullback of indexing by integer arrays (`index_adjoint`: zeros of the indexed array's
shape with the gradient added at the key, repeated indices accumulating) in a fixed order, bit
for bit NumPy's `add.at` (`kernels/scatter.cu`). CuPy's own scatter-add adds with atomics in
whatever order they land, so an embedding's gradient changed in its last bits from one run to
the next, and a compiled step could not repeat its eager step."""

import math

from ..backend import has_integer_array
from .dispatch import register
from .fused import ready
from .launch import grid_for, launch, library, on_device

__all__ = []


@register("forward", "index_adjoint")
def index_adjoint_forward(g, shape, key):
    """Zeros of `shape` with `g` added at `key`: the positions that `key` reads, sorted stably,
    then one launch adding up each position's run of elements in order. A `tg.compile` replay,
    whose indices are traced arguments, comes here through the same rule's forward."""
    if not (ready(g) and has_integer_array(key)):
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
