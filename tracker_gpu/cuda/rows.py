"""Fused row-wise operations over the last axis: softmax and logsoftmax (forward and
pullback), the softmax cross-entropy of logits (forward and pullback) and the one-hot targets it
makes of class labels (forward), one block per row
(`kernels/softmax.cu`). Rows longer than MAX_COLUMNS take the generic path: a block per row
would leave most of a GPU idle when such rows are few. float16 and bfloat16 rows are computed in
float32 (the row's maximum, sums and the cross-entropy's per-row sums included)."""

import numpy as np

from ..backend import device_of
from .dispatch import register, takes
from .fused import STORAGE, accumulate, device_scalar, readable, ready, tracked
from .launch import MAX_GRID, empty, empty_like, launch
from .sources import compute_dtype

__all__ = ["MAX_COLUMNS", "row_block"]

MAX_COLUMNS = 1 << 14


def row_block(cols):
    """Threads per row: a power of two from 32 to 256, about one per column."""
    return min(256, max(32, 1 << max(cols - 1, 0).bit_length()))


def _rows(x, axis):
    return x.ndim >= 1 and axis in (-1, x.ndim - 1) and 0 < x.shape[-1] <= MAX_COLUMNS


def _launch_rows(kernel, x, *args):
    rows, cols = x.size // x.shape[-1], x.shape[-1]
    launch(kernel, x.dtype, min(max(rows, 1), MAX_GRID), *args, block=row_block(cols))


def _row_forward(name):
    def fused(x, /, *, axis=-1):
        if not (ready(x) and _rows(x, axis)):
            return None
        out = empty_like(x)
        rows, cols = x.size // x.shape[-1], x.shape[-1]
        _launch_rows(f"{name}_fwd", x, x, out, rows, cols)
        return out

    return fused


def _row_pullback(name):
    kernel = f"{name}_bwd_acc"

    def fused(ans, args, values, kw, g, pending):
        y = ans  # the kernels read the saved output only
        if tracked(y) or not (ready(y, g) and g.shape == y.shape and _rows(y, kw.get("axis", -1))):
            return None
        if not readable(pending, args[0], y):
            return None
        rows, cols = y.size // y.shape[-1], y.shape[-1]
        grid = min(max(rows, 1), MAX_GRID)
        total = accumulate(kernel, pending, args[0], y, (y, g), (rows, cols), grid=grid,
                           block=row_block(cols))  # fmt: skip
        return [total]

    return fused


for _name in ("softmax", "logsoftmax"):
    register("forward", _name)(_row_forward(_name))
    register("pullback", _name)(_row_pullback(_name))


def _row_pairs(logits, targets, axis):
    return logits.ndim == 2 and axis in (-1, 1) and targets.shape == logits.shape


@register("forward", "logitcrossentropy")
def logitcrossentropy_forward(logits, targets, /, *, axis=-1, agg="mean", normalized=False):
    """The cross-entropy of (rows, classes) logits against targets shaped like them: per-row sums
    from one launch, then their sum on the device."""
    if tracked(targets) or not (ready(logits, targets) and _row_pairs(logits, targets, axis)):
        return None
    if not _rows(logits, -1):
        return None
    rows, cols = logits.shape
    rowsum = empty((rows,), logits, compute_dtype(str(logits.dtype)))
    _launch_rows("logitcrossentropy_fwd", logits, logits, targets, rowsum, rows, cols)
    total = -rowsum.sum()
    total = total / rows if agg == "mean" else total
    if rowsum.dtype == logits.dtype:
        return total
    return total.astype(logits.dtype)  # rounded once (a NumPy scalar has astype too)


@register("pullback", "logitcrossentropy")
def logitcrossentropy_pullback(ans, args, values, kw, g, pending):
    logits, targets, g = values[0], values[1], device_scalar(g)
    axis = kw.get("axis", -1)
    if tracked(args[1]) or not (ready(logits, targets, g) and _row_pairs(logits, targets, axis)):
        return None
    if not (_rows(logits, -1) and readable(pending, args[0], logits)):
        return None
    rows, cols = logits.shape
    count = rows if kw.get("agg", "mean") == "mean" else 1
    operands = (logits, targets, g, count, int(bool(kw.get("normalized", False))))
    total = accumulate("logitcrossentropy_bwd_acc", pending, args[0], logits, operands,
                       (rows, cols), grid=min(rows, MAX_GRID), block=row_block(cols))  # fmt: skip
    return [total, None]


@register("forward", "onehot")
def onehot_forward(labels, /, *, classes, axis, ndim, dtype, check, device, **_):
    """One-hot targets of `dtype` from integer class labels, the classes on the last axis, in
    one launch; a label out of range gives a row of nan. Where the rule checks the range
    (`check`: a synchronisation, the host's default), or the labels are on another device
    than the scores (`device`), the generic rule runs instead."""
    if check or not (axis == ndim - 1 and labels.ndim == ndim - 1 and takes(labels)):
        return None
    if device != ("cpu" if type(labels) is np.ndarray else device_of(labels)):
        return None
    if str(dtype) not in STORAGE or labels.dtype.kind not in "iu":
        return None
    if labels.dtype != "int64" or not labels.flags.c_contiguous:
        labels = labels.astype("int64", order="C")
    out = empty((*labels.shape, classes), labels, dtype)
    rows = labels.size
    launch("onehot_fwd", out.dtype, min(max(rows, 1), MAX_GRID), labels, out, rows, classes,
           block=row_block(classes))  # fmt: skip
    return out
