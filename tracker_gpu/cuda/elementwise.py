"""Fused elementwise pullbacks: unary functions, the sum of squares, the squared error, and
broadcast arithmetic, whose gradients are summed over broadcast axes by a parallel reduction
(`kernels/binary.cu`). All of them take float16 and bfloat16 too, computing in float32."""

import math

from .dispatch import register
from .fused import (
    STORAGE,
    accumulate,
    device_scalar,
    gradient_step,
    merge_axes,
    readable,
    ready,
    tracked,
)
from .launch import BLOCK, MAX_GRID, PER_THREAD, device_int64, empty, grid_for, launch, scalar
from .sources import compute_dtype

__all__ = ["UNARY", "BINARY", "reduction_plan"]

UNARY = ("tanh", "sigmoid", "relu", "exp", "log", "sqrt", "sin", "cos", "square", "abs")
BINARY = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "pow": "pow"}

# A reduction aims at this many blocks (a few per multiprocessor of a large GPU), each thread
# summing at least MIN_PER_THREAD elements, in at most MAX_PARTS slices per output.
TARGET_BLOCKS = 512
MIN_PER_THREAD = 8
MAX_PARTS = 1024


# --- unary: acc += contribution(g, x, y)
def _unary(name):
    kernel = f"{name}_bwd_acc"

    def fused(ans, args, values, kw, g, pending):
        x, y = _saved_pair(values[0], ans)
        if x is None:
            return None
        step = gradient_step(g, x.shape)
        if step is None or not (ready(x, y) and g.dtype == x.dtype):
            return None
        if not readable(pending, args[0], x):
            return None
        operands = (x, y, g, step)
        return [accumulate(kernel, pending, args[0], x, operands, (x.size,), per_thread=PER_THREAD)]

    return fused


def _saved_pair(x, y):
    """`(x, y)` of a unary pullback, the one its rule did not save (a node: its formula does
    not read it) replaced by the other, so that the kernel gets two arrays."""
    if tracked(x):
        x = y
    if tracked(y):
        y = x
    return (None, None) if tracked(x) else (x, y)


for _name in UNARY:
    register("pullback", _name)(_unary(_name))


# --- sum of squares: acc += x * (g * 2), g a device scalar
@register("pullback", "sumabs2")
def sumsq_pullback(ans, args, values, kw, g, pending):
    x, g = values[0], device_scalar(g)
    if not (ready(x, g) and readable(pending, args[0], x)):
        return None
    return [
        accumulate("sumsq_bwd_acc", pending, args[0], x, (x, g), (x.size,), per_thread=PER_THREAD)
    ]


# --- squared error: one launch per tracked side
@register("pullback", "mse")
def mse_pullback(ans, args, values, kw, g, pending):
    yhat, y = values
    g = device_scalar(g)
    sides = [(side, a) for side, a in enumerate(args) if tracked(a)]
    if not (ready(yhat, y, g) and yhat.shape == y.shape):
        return None
    if not all(readable(pending, a, yhat) for _, a in sides):
        return None
    n = yhat.size if kw.get("agg", "mean") == "mean" else 1
    factor = 2.0 / n if n else 0.5  # the generic rule's g * (2 / n); g itself when n is 0
    grads = [None, None]
    for side, arg in sides:
        operands = (yhat, y, g, factor, side)
        grads[side] = accumulate(
            "mse_bwd_acc", pending, arg, yhat, operands, (yhat.size,), per_thread=PER_THREAD
        )
    return grads


# --- broadcast arithmetic
def _binary(name):
    def fused(ans, args, values, kw, g, pending):
        step = gradient_step(g, ans.shape)
        if step is None or str(g.dtype) not in STORAGE:
            return None
        if name == "pow" and type(args[1]) in (int, float) and args[1] == 0:
            return None  # the rule's zeros: the kernel, written for an array y, takes y x ** -1
        x, y = (_operand(v, g) for v in values)
        arrays = [a for a in (ans, x, y) if not tracked(a)]  # what the rule saved
        if arrays and not (ready(*arrays) and arrays[0].dtype == g.dtype):
            return None
        sides = [(side, a) for side, a in enumerate(args) if tracked(a)]
        if not all(readable(pending, a, g) for _, a in sides):
            return None
        if any(a.dtype != g.dtype for _, a in sides):  # a float32 operand of a float64 result:
            return None  # the generic rule casts its gradient back to float32
        grads = [None, None]
        for side, arg in sides:  # x * x: the second side adds into the first's total
            if _passes_g_through(name, side, arg, ans, args):
                grads[side] = g  # what the generic rule returns: no kernel to launch
            else:
                grads[side] = _operand_gradient(name, side, arg, g, step, x, y, ans, pending)
        return grads

    return fused


def _passes_g_through(name, side, arg, ans, args):
    """The gradient of `x + y` (and of `x` in `x - y`) for an operand of the result's shape
    is `g` itself, unless both operands are one node (then both sides add into one total)."""
    same_shape = arg.shape == ans.shape
    return (
        same_shape
        and (name == "add" or (name == "subtract" and side == 0))
        and (args[0] is not args[1])
    )


def _operand(value, like):
    """An operand as the kernel reads it: a Python number as a device scalar; an array, or
    the node of a value the rule did not save (its formula does not read it), as it is."""
    if isinstance(value, (int, float)):
        return scalar(value, like)
    return value


def _operand_gradient(name, side, arg, g, step, x, y, out, pending):
    """One operand's gradient: one launch (or two, for a reduction split across blocks). An
    array the formula does not read is passed as `g`: the kernel never reads it."""
    op = BINARY[name]
    dims, kept_ndim, reduced_ndim = reduction_plan(out.shape, x.shape, y.shape, arg.shape)
    meta = device_int64(dims, g)
    x, y, out = (g if tracked(a) else a for a in (x, y, out))
    operands = (g, step, x, y, out, meta)
    if reduced_ndim == 0 or arg.size == 0:
        return accumulate(f"{op}_bwd_acc", pending, arg, g,
                          (*operands, kept_ndim, side), (arg.size,))  # fmt: skip
    outputs, reduced = arg.size, math.prod(g.shape) // max(arg.size, 1)
    out_lanes, lanes_on_outputs = _lanes(dims, kept_ndim, reduced_ndim, outputs)
    red_lanes = BLOCK // out_lanes
    tiles = -(-outputs // out_lanes)
    parts = max(1, min(-(-TARGET_BLOCKS // tiles), reduced // (red_lanes * MIN_PER_THREAD),
                       MAX_PARTS))  # fmt: skip
    wide = compute_dtype(str(g.dtype))  # the slices' totals are kept in the compute type
    partials = empty((parts * outputs,), g, wide) if parts > 1 else g  # g: never written
    shape = (*operands, kept_ndim, reduced_ndim, side, outputs, reduced, out_lanes,
             lanes_on_outputs, parts, partials)  # fmt: skip
    grid = min(tiles * parts, MAX_GRID)
    if parts == 1:
        return accumulate(f"{op}_bwd_reduce", pending, arg, g, shape, (), grid=grid)
    launch(f"{op}_bwd_reduce", g.dtype, grid, *shape, partials, partials, 0)
    return accumulate("reduce_finish", pending, arg, g, (partials, outputs, parts), (),
                      grid=grid_for(outputs))  # fmt: skip


def _lanes(dims, kept_ndim, reduced_ndim, outputs):
    """`(out_lanes, lanes_on_outputs)`: neighbouring threads take neighbouring outputs when the
    fastest-varying axis of g is kept (a column sum, as a bias's gradient), else neighbouring
    reduced positions (a row sum)."""
    fastest_kept = _fastest_stride(dims, 0, kept_ndim)
    fastest_reduced = _fastest_stride(dims, kept_ndim, kept_ndim + reduced_ndim)
    if kept_ndim and fastest_kept < fastest_reduced:
        return min(32, 1 << max(outputs - 1, 0).bit_length()), 1
    return (8 if outputs >= 8 else 1), 0


def _fastest_stride(dims, start, stop):
    strides = [dims[4 * a + 1] for a in range(start, stop)]
    return min(strides, default=float("inf"))


def reduction_plan(out_shape, x_shape, y_shape, target_shape):
    """`(dims, kept_ndim, reduced_ndim)` for the kernels of `kernels/binary.cu`: out's axes of
    length > 1 split into those the target keeps and those it is summed over, each group merged
    where g, x and y are contiguous across neighbouring axes, 4 numbers per axis."""
    ndim = len(out_shape)
    g_strides = _strides(out_shape, out_shape)
    x_strides, y_strides = _strides(x_shape, out_shape), _strides(y_shape, out_shape)
    target = _aligned(target_shape, ndim)
    kept, reduced = [], []
    for a, n in enumerate(out_shape):
        if n == 1:
            continue
        axis = [n, g_strides[a], x_strides[a], y_strides[a]]
        (kept if target[a] == n else reduced).append(axis)
    kept, reduced = merge_axes(kept), merge_axes(reduced)
    dims = [v for axis in kept + reduced for v in axis]
    return dims, len(kept), len(reduced)


def _aligned(shape, ndim):
    return (1,) * (ndim - len(shape)) + tuple(shape)


def _strides(shape, out_shape):
    """Element strides of a C-contiguous array of `shape` broadcast to `out_shape` (0 where it
    is broadcast)."""
    shape = _aligned(shape, len(out_shape))
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step if d != 1 else 0)
        step *= d
    return strides[::-1]


for _name in BINARY:
    register("pullback", _name)(_binary(_name))
