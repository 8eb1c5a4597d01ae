"""Fused layers: the normalisation statistics (`normalise`, forward and pullback, one block per
group) and an LSTM cell's gates (`lstm_cell`, forward and pullback, one thread per unit), from
`kernels/layers.cu`. A normalisation over axes whose complement is not one run of neighbouring
axes takes the generic path. The kernels take float32 and float64 only: float16 and bfloat16
take the generic path."""

import math

from ..tape import Total
from .dispatch import register, takes
from .fused import FLOATS, accumulate, readable, ready, tracked
from .launch import MAX_GRID, empty, empty_like, grid_for, launch
from .rows import row_block

__all__ = ["layout"]


def layout(shape, axes):
    """`(outer, groups, inner)` of a normalisation of an array of `shape` over `axes`: the axes
    kept must be neighbours; None otherwise (or when there is nothing to normalise)."""
    ndim = len(shape)
    try:
        normalised = {a % ndim for a in axes} if ndim else set()
    except (TypeError, ZeroDivisionError):
        return None
    kept = [a for a in range(ndim) if a not in normalised]
    if kept and kept != list(range(kept[0], kept[-1] + 1)):
        return None
    first, stop = (kept[0], kept[-1] + 1) if kept else (0, 0)
    sizes = (math.prod(shape[:first]), math.prod(shape[first:stop]), math.prod(shape[stop:]))
    return sizes if sizes[0] * sizes[2] > 0 and sizes[1] > 0 else None


@register("forward", "normalise")
def normalise_forward(x, /, *, axes, eps=1e-5):
    plan = layout(x.shape, axes) if ready(x, dtypes=FLOATS) else None
    if plan is None:
        return None
    out = empty_like(x)
    outer, groups, inner = plan
    launch("normalise_fwd", x.dtype, min(groups, MAX_GRID), x, out, outer, groups, inner, eps,
           block=row_block(outer * inner))  # fmt: skip
    return out


@register("pullback", "normalise")
def normalise_pullback(ans, args, values, kw, g, pending):
    x, y = values[0], ans
    if tracked(x) or tracked(y):
        return None
    taken = ready(x, y, g, dtypes=FLOATS) and g.shape == y.shape
    plan = layout(x.shape, kw["axes"]) if taken else None
    if plan is None or not readable(pending, args[0], x):
        return None
    outer, groups, inner = plan
    total = accumulate("normalise_bwd_acc", pending, args[0], x, (x, y, g),
                       (outer, groups, inner, kw.get("eps", 1e-5)), grid=min(groups, MAX_GRID),
                       block=row_block(outer * inner))  # fmt: skip
    return [total]


def _cell_shapes(z, c, *others):
    """`(rows, hidden, c_stride)` of an LSTM cell's arrays, or None for a layout the kernels do
    not take: all contiguous but the cell state `c`, which may also be a matrix whose rows are
    apart (the second half of the step before's output)."""
    if not (ready(z, *others, dtypes=FLOATS) and takes(c) and c.dtype == z.dtype):
        return None
    if z.ndim < 1 or z.ndim != c.ndim or z.shape[:-1] != c.shape[:-1]:
        return None
    hidden = c.shape[-1]
    if z.shape[-1] != 4 * hidden or hidden == 0 or z.size == 0:
        return None
    if c.flags.c_contiguous:
        return c.size // hidden, hidden, hidden
    if c.ndim == 2 and c.strides[1] == c.itemsize and c.strides[0] % c.itemsize == 0:
        return c.shape[0], hidden, c.strides[0] // c.itemsize
    return None


@register("forward", "lstm_cell")
def lstm_cell_forward(z, c):
    shapes = _cell_shapes(z, c)
    if shapes is None:
        return None
    rows, hidden, stride = shapes
    out = empty((*c.shape[:-1], 2 * hidden), z)
    launch("lstm_fwd", z.dtype, grid_for(rows * hidden), z, c, out, rows, hidden, stride)
    return out


@register("pullback", "lstm_cell")
def lstm_cell_pullback(ans, args, values, kw, g, pending):
    (z, c), out = values, ans
    if tracked(z) or tracked(c) or tracked(out):
        return None
    shapes = _cell_shapes(z, c, out, g) if g.shape == out.shape else None
    if shapes is None:
        return None
    if not all(_readable(pending, a, v, z) for a, v in zip(args, (z, c)) if tracked(a)):
        return None
    targets = [_target(pending, a, v) if tracked(a) else (z, z, 0, False)
               for a, v in zip(args, (z, c))]  # fmt: skip
    (prev_z, acc_z, has_z, want_z), (prev_c, acc_c, has_c, want_c) = targets
    rows, hidden, stride = shapes
    launch("lstm_bwd_acc", z.dtype, grid_for(rows * hidden), z, c, out, g, prev_z, acc_z,
           prev_c, acc_c, rows, hidden, stride, int(want_z), has_z, int(want_c),
           has_c)  # fmt: skip
    grads = []
    for arg, (_, acc, _, want) in zip(args, targets):
        if want:
            pending.replace(arg, acc)
        grads.append(Total(acc) if want else None)
    return grads


def _readable(pending, parent, value, like):
    """Whether the gradient waiting at `parent` (if any) is a contiguous array of `value`'s
    shape and `like`'s dtype (the cell state itself may be a strided view)."""
    prev, _ = pending.current(parent)
    return prev is None or (ready(prev, like) and prev.shape == value.shape)


def _target(pending, parent, like):
    """`(prev, acc, has_prev, True)`: where a kernel adds `parent`'s contribution (contiguous),
    in place when the tape owns its pending gradient (as `fused.accumulate` does)."""
    prev, owned = pending.current(parent)
    acc = prev if owned else empty(like.shape, like)
    return (acc if prev is None else prev), acc, int(prev is not None), True
