"""Fused pullbacks: one kernel launch each, adding into the tape's pending gradient (in place
when the tape owns it), with no temporary of the data's size.

Each `*_pullback` function returns the `fused` callable of a `Primitive`: it answers `None` (the
generic vjps then run) unless every array is a contiguous float32/float64 array the fused path
takes (see `launch.active`). Nested passes never come here.
"""

import sys

import numpy as np

from ..tape import Node, Total
from .launch import active, device_int64, empty, empty_like, launch

__all__ = [
    "UNARY",
    "BINARY",
    "unary_pullback",
    "binary_pullback",
    "sumsq_pullback",
    "softmax_pullback",
    "logitcrossentropy_pullback",
    "mse_pullback",
    "rowwise_forward",
    "logitcrossentropy_forward",
    "descent_step",
    "momentum_step",
    "nesterov_step",
    "adam_step",
]

UNARY = ("tanh", "sigmoid", "relu", "exp", "log", "sqrt", "sin", "cos", "square", "abs")
BINARY = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "pow": "pow"}
_FLOATS = ("float32", "float64")


def _ready(*arrays):
    """All device arrays of one float dtype, C-contiguous."""
    if not active(*arrays):
        return False
    dtype = arrays[0].dtype
    return str(dtype) in _FLOATS and all(a.dtype == dtype and a.flags.c_contiguous for a in arrays)


def _gradient_step(g, shape):
    """1 for a contiguous gradient of `shape`, 0 for a scalar broadcast to it (after a sum),
    None for any other layout (the generic path takes those)."""
    if g.shape != shape or not active(g):
        return None
    if g.flags.c_contiguous:
        return 1
    return 0 if all(stride == 0 for stride in g.strides) else None


def _readable(pending, parent, like):
    """Whether the gradient waiting at `parent` (if any) can be read as a flat device array."""
    prev, _ = pending.current(parent)
    return prev is None or (_ready(prev, like) and prev.shape == like.shape)


def _accumulate(kernel, pending, parent, like, threads, args, tail):
    """Launch `kernel` to write `prev + contribution` for `parent` (in place when the tape owns
    `prev`), record it as the parent's pending total, and return it as a `Total`."""
    prev, owned = pending.current(parent)
    out = prev if owned else empty_like(like)
    launch(
        kernel,
        like.dtype,
        threads,
        *args,
        out if prev is None else prev,
        out,
        *tail,
        int(prev is not None),
    )
    pending.replace(parent, out)
    return Total(out)


def _scalar(g):
    """The gradient of a scalar as a 0-d device array (it is never read on the host)."""
    return np.asarray(g) if isinstance(g, np.generic) else g


def _tracked(a):
    return isinstance(a, Node)


# --- elementwise unary: acc += g * f'(x), from x or the saved output y
def unary_pullback(name):
    kernel = f"{name}_bwd_acc"

    def fused(node, args, kw, g, pending):
        x, y = args[0].data, node.data
        step = _gradient_step(g, x.shape)
        if step is None or not (_ready(x, y) and g.dtype == x.dtype):
            return None
        if not _readable(pending, args[0], x):
            return None
        return [_accumulate(kernel, pending, args[0], x, x.size, (x, y, g, step), (x.size,))]

    return fused


# --- sum of squares: acc += 2 * x * g, g a device scalar
def sumsq_pullback(node, args, kw, g, pending):
    x, g = args[0].data, _scalar(g)
    if not (_ready(x, g) and _readable(pending, args[0], x)):
        return None
    return [_accumulate("sumsq_bwd_acc", pending, args[0], x, x.size, (x, g), (x.size,))]


# --- broadcast arithmetic: each operand's gradient summed over its broadcast axes in-kernel
def binary_pullback(name):
    kernel = f"{BINARY[name]}_bwd_acc"

    def fused(node, args, kw, g, pending):
        out = node.data
        step = _gradient_step(g, out.shape)
        if step is None or not (_ready(out) and g.dtype == out.dtype):
            return None
        x, y = (_operand(a, out) for a in args)
        sides = [(side, a, v) for side, (a, v) in enumerate(zip(args, (x, y))) if _tracked(a)]
        if not _ready(out, x, y):
            return None
        if not all(_readable(pending, a, v) for _, a, v in sides):
            return None
        grads = [None, None]
        for side, arg, target in sides:  # x * x: the second side adds into the first's total
            meta = device_int64(_meta(out.shape, x.shape, y.shape, target.shape), out)
            operands = (g, step, x, y, out, meta)
            tail = (len(out.shape), side, target.size)
            grads[side] = _accumulate(kernel, pending, arg, target, target.size, operands, tail)
        return grads

    return fused


def _operand(a, out):
    value = a.data if _tracked(a) else a
    if isinstance(value, (int, float)):
        xp = np if type(out) is np.ndarray else sys.modules["cupy"]
        return xp.full((), value, dtype=out.dtype)
    return value


def _meta(out_shape, x_shape, y_shape, target_shape):
    ndim = len(out_shape)
    return (
        list(out_shape)
        + _broadcast_strides(x_shape, out_shape)
        + _broadcast_strides(y_shape, out_shape)
        + [int(d == o) for d, o in zip(_aligned(target_shape, ndim), out_shape)]
    )


def _aligned(shape, ndim):
    return (1,) * (ndim - len(shape)) + tuple(shape)


def _broadcast_strides(shape, out_shape):
    shape = _aligned(shape, len(out_shape))
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step if d != 1 else 0)
        step *= d
    return strides[::-1]


# --- row-wise: softmax, logsoftmax, logitcrossentropy over the last axis
def _rows(x, axis):
    return x.ndim >= 1 and axis in (-1, x.ndim - 1) and x.shape[-1] > 0


def rowwise_forward(name, x, axis):
    """`softmax`/`logsoftmax` of a device array in one launch, or None."""
    if not (_ready(x) and _rows(x, axis)):
        return None
    out = empty_like(x)
    cols = x.shape[-1]
    launch(f"{name}_fwd", x.dtype, x.size // cols, x, out, x.size // cols, cols)
    return out


def softmax_pullback(name):
    kernel = f"{name}_bwd_acc"

    def fused(node, args, kw, g, pending):
        x, y = args[0].data, node.data
        if not (_ready(x, y, g) and g.shape == y.shape and _rows(y, kw.get("axis", -1))):
            return None
        if not _readable(pending, args[0], x):
            return None
        rows, cols = y.size // y.shape[-1], y.shape[-1]
        return [_accumulate(kernel, pending, args[0], x, rows, (y, g), (rows, cols))]

    return fused


def logitcrossentropy_forward(logits, targets, axis, agg):
    """The cross-entropy of (rows, classes) logits against targets shaped like them, with the
    per-row losses from one launch, or None."""
    if not (_ready(logits, targets) and _row_pairs(logits, targets, axis)):
        return None
    rows, cols = logits.shape
    loss = empty((rows,), logits)
    launch("logitcrossentropy_fwd", logits.dtype, rows, logits, targets, loss, rows, cols)
    total = loss.sum()
    return total / rows if agg == "mean" else total


def _row_pairs(logits, targets, axis):
    return logits.ndim == 2 and axis in (-1, 1) and targets.shape == logits.shape


def logitcrossentropy_pullback(node, args, kw, g, pending):
    logits, targets, g = args[0].data, args[1], _scalar(g)
    if _tracked(targets) or not (
        _ready(logits, targets, g) and _row_pairs(logits, targets, kw.get("axis", -1))
    ):
        return None
    if not _readable(pending, args[0], logits):
        return None
    rows, cols = logits.shape
    count = rows if kw.get("agg", "mean") == "mean" else 1
    operands = (logits, targets, g, count, int(bool(kw.get("normalized", False))))
    kernel = "logitcrossentropy_bwd_acc"
    return [_accumulate(kernel, pending, args[0], logits, rows, operands, (rows, cols)), None]


def mse_pullback(node, args, kw, g, pending):
    yhat, y = (a.data if _tracked(a) else a for a in args)
    g = _scalar(g)
    sides = [(side, a) for side, a in enumerate(args) if _tracked(a)]
    if not (_ready(yhat, y, g) and yhat.shape == y.shape):
        return None
    if not all(_readable(pending, a, yhat) for _, a in sides):
        return None
    count = yhat.size if kw.get("agg", "mean") == "mean" else 1
    grads = [None, None]
    for side, arg in sides:
        operands = (yhat, y, g, count, 1 - 2 * side)
        grads[side] = _accumulate(
            "mse_bwd_acc", pending, arg, yhat, yhat.size, operands, (yhat.size,)
        )
    return grads


# --- optimiser steps: one launch per parameter, into fresh buffers (nothing is mutated)
def descent_step(rule, x, dx, state):
    if not _ready(x, dx):
        return None
    out = empty_like(x)
    launch("descent_step", x.dtype, x.size, x, dx, out, x.size, rule.eta)
    return out, state


def _velocity_step(kernel):
    def step(rule, x, dx, v):
        if not _ready(x, dx, v):
            return None
        out, v_out = empty_like(x), empty_like(x)
        launch(kernel, x.dtype, x.size, x, dx, v, out, v_out, x.size, rule.eta, rule.rho)
        return out, v_out

    return step


momentum_step = _velocity_step("momentum_step")
nesterov_step = _velocity_step("nesterov_step")


def adam_step(rule, x, dx, state):
    """Adam and AdamW (`weight_decay`, `couple`): moments and parameter in one launch."""
    m, v, (beta1_t, beta2_t) = state
    if not _ready(x, dx, m, v):
        return None
    beta1, beta2 = rule.beta
    out, m_out, v_out = empty_like(x), empty_like(x), empty_like(x)
    decay = getattr(rule, "weight_decay", 0.0)
    couple = int(getattr(rule, "couple", True))
    launch("adam_step", x.dtype, x.size, x, dx, m, v, out, m_out, v_out, x.size, rule.eta,
           beta1, beta2, rule.epsilon, 1 - beta1_t, 1 - beta2_t, decay, couple)  # fmt: skip
    return out, (m_out, v_out, (beta1_t * beta1, beta2_t * beta2))
