"""What every fused pullback shares: which layouts it takes, and how it adds its contribution
into the gradient pending at a tape node in the same launch (in place when the tape owns that
buffer), with no temporary of the data's size.

A fused pullback answers `None` (the generic vjps then run) unless every array is a
C-contiguous array that `dispatch.takes`, of a dtype its kernels take: float32 and float64, and
float16 and bfloat16 for the kernels written for a storage type (`kernels/half.cuh`: they load
and store the half types and compute in float32). Nested passes never come here.
"""

import numpy as np

from ..tape import Node, Total
from .dispatch import takes
from .launch import empty, grid_for, launch

__all__ = [
    "FLOATS",
    "HALVES",
    "STORAGE",
    "ready",
    "gradient_step",
    "readable",
    "accumulate",
    "device_scalar",
    "tracked",
    "merge_axes",
]

FLOATS = ("float32", "float64")
HALVES = ("float16", "bfloat16")  # stored as such, computed in float32
STORAGE = FLOATS + HALVES


def ready(*arrays, dtypes=STORAGE):
    """All arrays the fused path takes, of one dtype of `dtypes`, C-contiguous."""
    if not takes(*arrays):
        return False
    dtype = arrays[0].dtype
    return str(dtype) in dtypes and all(a.dtype == dtype and a.flags.c_contiguous for a in arrays)


def gradient_step(g, shape):
    """1 for a contiguous gradient of `shape`, 0 for a scalar broadcast to it (after a sum),
    None for any other layout (the generic path takes those)."""
    if g.shape != shape or not takes(g):
        return None
    if g.flags.c_contiguous:
        return 1
    return 0 if all(stride == 0 for stride in g.strides) else None


def readable(pending, parent, like):
    """Whether the gradient waiting at `parent` (if any) can be read as a flat array of the
    parent's shape and `like`'s dtype."""
    prev, _ = pending.current(parent)
    return prev is None or (ready(prev) and prev.shape == parent.shape and prev.dtype == like.dtype)


def accumulate(kernel, pending, parent, like, args, tail, grid=None, block=256, per_thread=1):
    """Launch `kernel(*args, prev, acc, *tail, has_prev)` to write `prev + contribution` for
    `parent` (a node: in place when the tape owns `prev`, else into a new buffer of its shape,
    of `like`'s dtype and device), record it as the parent's pending total, and return it as a
    `Total`. The grid defaults to one thread per `per_thread` elements of the parent (a kernel
    whose loop takes `PER_THREAD` elements a pass is given `per_thread=PER_THREAD`)."""
    prev, owned = pending.current(parent)
    out = prev if owned else empty(parent.shape, like)
    grid = grid_for(-(-parent.size // per_thread), block) if grid is None else grid
    has_prev = int(prev is not None)
    launch(kernel, like.dtype, grid, *args, out if prev is None else prev, out, *tail, has_prev,
           block=block)  # fmt: skip
    pending.replace(parent, out)
    return Total(out)


def device_scalar(g):
    """A scalar gradient as a 0-d array (on a GPU it always is one; a NumPy reduction on the
    host may return a NumPy scalar instead)."""
    return np.asarray(g) if isinstance(g, np.generic) else g


def tracked(a):
    return isinstance(a, Node)


def merge_axes(axes):
    """Axes `[length, stride, stride, ...]` (outermost first), neighbours merged into one where
    every stride allows it: fewer divisions per element in the kernels."""
    merged = []
    for axis in axes:
        last = merged[-1] if merged else None
        if last and all(last[k] == axis[k] * axis[0] for k in range(1, len(axis))):
            merged[-1] = [last[0] * axis[0], *axis[1:]]
        else:
            merged.append(axis)
    return merged
