"""Activations and normalisers: sigmoid, relu, softmax, logsoftmax, logsumexp, `normalise`
(the statistics of the normalisation layers) and `lstm_cell` (an LSTM cell's gates).

Forwards are numerically stable; vjps reuse the saved output where the maths allows. On the GPU
softmax, logsoftmax, normalise and the LSTM cell run as fused kernels both ways (`cuda.rows`,
`cuda.layers`).

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(lambda x: tg.logsumexp(x), np.array([0.0, 0.0]))[0]
array([0.5, 0.5])
"""

import math

from ..backend import into, isdtype, namespace_of
from ..primitive import Primitive
from ..tracked import TrackedArray
from .elementwise import (
    add,
    divide,
    exp,
    multiply,
    real_only,
    sigmoid,
    sigmoid_values,
    sqrt,
    subtract,
    tanh,
    where,
    zeros_like,
)
from .native_hook import native
from .reductions import check_axes, expand, mean
from .reductions import sum as _sum
from .rows import row_max, row_mean, row_mean_of_products, row_sum, row_sum_of_products
from .shape import concat, getitem


def _relu_forward(xp, x):
    real_only("relu", x)
    return xp.where(x < 0, xp.zeros_like(x), x)  # PyTorch's: nan stays nan, -0.0 stays -0.0


relu = Primitive(
    "relu",
    _relu_forward,
    (lambda g, ans, x: where(ans <= 0, zeros_like(g), g),),  # PyTorch's: g at nan
    saves="ans",
)


def _softmax_forward(xp, x, /, *, axis=-1):
    real_only("softmax", x)
    check_axes("softmax", axis, x.ndim)
    x = _floating(xp, x)
    if _empty_along(x, axis):  # nothing to normalise (NumPy's max of nothing raises)
        return xp.zeros_like(x)
    done = native("softmax", x, axis=axis)
    if done is not None:
        return done
    e = into(xp, "exp", x - row_max(xp, x, axis))
    e /= row_sum(xp, e, axis)  # in place, as `into` says why
    return e


def _logsoftmax_forward(xp, x, /, *, axis=-1):
    real_only("logsoftmax", x)
    check_axes("logsoftmax", axis, x.ndim)
    x = _floating(xp, x)
    if _empty_along(x, axis):
        return xp.zeros_like(x)
    shifted, lse = logsoftmax_parts(xp, x, axis)
    return shifted - lse


def _floating(xp, x):
    """Integers and booleans as float64, as SciPy's softmax and logsumexp take them: in their own
    dtype the shift by the maximum wraps (uint8) or overflows (int8)."""
    if isdtype(xp, x.dtype, ("real floating", "complex floating")):
        return x
    return xp.astype(x, xp.float64)


def _empty_along(x, axis):
    """Whether `x` has no element along `axis` (an axis or a tuple of them)."""
    return any(x.shape[a] == 0 for a in (axis if isinstance(axis, tuple) else (axis,)))


def logsoftmax_parts(xp, x, axis):
    """`(x - max(x), log(sum(exp(x - max(x)))))` over `axis` on plain arrays: the log-softmax
    is their difference (cross-entropy takes them; `tg.compile`'s opened cross-entropy takes
    the second, of the row loop's shift)."""
    shifted = x - row_max(xp, x, axis)
    return shifted, log_sum_exp_shifted(xp, shifted, axis)


def log_sum_exp_shifted(xp, shifted, axis):
    """`log(sum(exp(shifted)))` over `axis`: the log-softmax's second part."""
    return xp.log(row_sum(xp, xp.exp(shifted), axis))


softmax = Primitive(
    "softmax",
    _softmax_forward,
    (lambda g, ans, x, axis=-1: _softmax_vjp(g, ans, axis),),
    saves="ans",
)


def _softmax_vjp(g, ans, axis):
    """`ans * (g - sum(g * ans))`; on plain arrays with the library, in place on what it makes."""
    xp = _plain(g, ans)
    if xp is None:
        return ans * (g - _sum(g * ans, axis=axis, keepdims=True))
    done = native("softmax_vjp", ans, g, axis=axis)
    if done is not None:
        return done
    out = g - row_sum_of_products(xp, g, ans, axis)
    if out.dtype != ans.dtype or out.shape != ans.shape:
        return ans * out
    out *= ans
    return out


logsoftmax = Primitive(
    "logsoftmax",
    _logsoftmax_forward,
    (lambda g, ans, x, axis=-1: g - exp(ans) * _sum(g, axis=axis, keepdims=True),),
    saves="ans",
)


def _logsumexp_forward(xp, x, /, *, axis=None, keepdims=False):
    real_only("logsumexp", x)
    check_axes("logsumexp", axis, x.ndim)
    x = _floating(xp, x)
    if _reduces_nothing(x, axis):  # the log of an empty sum (NumPy's max of nothing raises)
        m = xp.full_like(xp.sum(x, axis=axis, keepdims=True), -math.inf)
        return m if keepdims else xp.squeeze(m, axis=_squeezed(axis, x.ndim))
    m = xp.max(x, axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
    out = xp.log(xp.sum(xp.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else xp.squeeze(out, axis=_squeezed(axis, x.ndim))


def _reduces_nothing(x, axis):
    axes = range(x.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
    return any(x.shape[a] == 0 for a in axes)


def _squeezed(axis, ndim):
    return tuple(range(ndim)) if axis is None else axis


logsumexp = Primitive(
    "logsumexp",
    _logsumexp_forward,
    (
        lambda g, ans, x, axis=None, keepdims=False: (
            expand(g, x, axis, keepdims) * exp(x - expand(ans, x, axis, keepdims))
        ),
    ),
    saves="x ans",
)


# The vjps below compute with the library directly on plain arrays (a first-order pass: the hot
# path of training, and the formulas the fused kernels follow operation for operation), and
# with this package's functions on tracked ones (a nested pass, differentiable again).
def _plain(*values):
    """The library of plain arrays, or None if any of `values` is tracked."""
    if any(isinstance(v, TrackedArray) for v in values):
        return None
    return namespace_of(values[0])


# --- the normalisation layers' statistics: one primitive
def _normalise_forward(xp, x, /, *, axes, eps=1e-5):
    real_only("normalise", x)
    centred = x - row_mean(xp, x, axes)
    variance = row_mean_of_products(xp, centred, centred, axes)
    centred /= xp.sqrt(variance + eps)  # in place on what this made, as `into` says why
    return centred


def normalise_statistics(xp, g, ans, x, axes, eps):
    """`(mean(g), mean(g * ans), sigma)` over `axes` on plain arrays, sigma recomputed from `x`
    as the forward computes it: what `normalise`'s pullback reads besides `g` and `ans` (and
    `tg.compile`'s opened pullback, `compiler/opened.py`)."""
    centred = x - row_mean(xp, x, axes)
    sigma = xp.sqrt(row_mean_of_products(xp, centred, centred, axes) + eps)
    return row_mean(xp, g, axes), row_mean_of_products(xp, g, ans, axes), sigma


def _normalise_vjp(g, ans, x, *, axes, eps=1e-5):
    """`((g - mean(g)) - y * mean(g * y)) / sigma`, sigma recomputed from `x` as the forward
    computes it."""
    xp = _plain(g, ans, x)
    if xp is not None:
        done = native("normalise_vjp", ans, x, g, axes=axes, eps=eps)
        if done is not None:
            return done
        mean_g, mean_ga, sigma = normalise_statistics(xp, g, ans, x, axes, eps)
        spread = g - mean_g
        slope = ans * mean_ga
        if not spread.dtype == slope.dtype == sigma.dtype or spread.shape != slope.shape:
            return (spread - slope) / sigma
        spread -= slope  # in place on what this made, as `into` says why
        spread /= sigma
        return spread
    centred = subtract(x, mean(x, axis=axes, keepdims=True))
    sigma = sqrt(add(mean(multiply(centred, centred), axis=axes, keepdims=True), eps))
    spread = subtract(g, mean(g, axis=axes, keepdims=True))
    slope = multiply(ans, mean(multiply(g, ans), axis=axes, keepdims=True))
    return divide(subtract(spread, slope), sigma)


normalise = Primitive(
    "normalise",
    _normalise_forward,
    (_normalise_vjp,),
    saves="ans x",
    doc="""`(x - mean) / sqrt(var + eps)`, mean and (biased) variance over `axes` (a tuple).

    The statistics of LayerNorm, GroupNorm and BatchNorm, as one tape node; on the GPU one
    kernel each way when the axes not normalised are neighbours (all three layers' cases).
    """,
)


# --- an LSTM cell's gates: one primitive
def _quarters(z, hidden, take):
    return [take(z, (..., slice(k * hidden, (k + 1) * hidden))) for k in range(4)]


def _lstm_cell_forward(xp, z, c):
    real_only("lstm_cell", z)
    real_only("lstm_cell", c)
    hidden = c.shape[-1]
    gates = sigmoid_values(xp, z)  # the cell's quarter is not used
    i, f, _, o = _quarters(gates, hidden, lambda a, key: a[key])
    c_new = f * c + i * xp.tanh(z[..., 2 * hidden : 3 * hidden])
    return xp.concat([o * xp.tanh(c_new), c_new], axis=-1)


def _lstm_partials(g, ans, z, c):
    """The gradients `(dz, dc)` of the gates and of the old cell state, from the incoming
    gradient `g` of `[h', c']`:
    `dc' = g_c + g_h * o * (1 - t * t)` with `t = tanh(c')`, then
    `dz = [dc' * u * (i * (1 - i)), dc' * c * (f * (1 - f)), dc' * i * (1 - u * u),
    g_h * t * (o * (1 - o))]` with `u = tanh(z_cell)`, and `dc = dc' * f`."""
    hidden = c.shape[-1]
    xp = _plain(g, ans, z, c)
    if xp is not None:
        gates = sigmoid_values(xp, z)
        i, f, _, o = _quarters(gates, hidden, lambda a, key: a[key])
        u = xp.tanh(z[..., 2 * hidden : 3 * hidden])
        t = xp.tanh(ans[..., hidden:])
        g_h, g_c = g[..., :hidden], g[..., hidden:]
        d_c = g_c + g_h * o * (1 - t * t)
        parts = [d_c * u * (i * (1 - i)), d_c * c * (f * (1 - f)), d_c * i * (1 - u * u),
                 g_h * t * (o * (1 - o))]  # fmt: skip
        return xp.concat(parts, axis=-1), d_c * f
    i, f, u, o = _quarters(z, hidden, getitem)
    i, f, o, u = sigmoid(i), sigmoid(f), sigmoid(o), tanh(u)
    t = tanh(getitem(ans, (..., slice(hidden, None))))
    g_h = getitem(g, (..., slice(None, hidden)))
    g_c = getitem(g, (..., slice(hidden, None)))
    d_c = add(g_c, multiply(multiply(g_h, o), subtract(1.0, multiply(t, t))))
    parts = [
        multiply(multiply(d_c, u), multiply(i, subtract(1.0, i))),
        multiply(multiply(d_c, c), multiply(f, subtract(1.0, f))),
        multiply(multiply(d_c, i), subtract(1.0, multiply(u, u))),
        multiply(multiply(g_h, t), multiply(o, subtract(1.0, o))),
    ]
    return concat(parts, axis=-1), multiply(d_c, f)


lstm_cell = Primitive(
    "lstm_cell",
    _lstm_cell_forward,
    (
        lambda g, ans, z, c: _lstm_partials(g, ans, z, c)[0],
        lambda g, ans, z, c: _lstm_partials(g, ans, z, c)[1],
    ),  # fmt: skip
    saves="ans z c",
    doc="""An LSTM cell's gates: from the pre-activations `z` (..., 4h), in the order input,
    forget, cell, output (Flux's and PyTorch's), and the cell state `c` (..., h), the new
    hidden and cell states side by side, `[h', c']` (..., 2h):
    `c' = sigmoid(f) * c + sigmoid(i) * tanh(g)`, `h' = sigmoid(o) * tanh(c')`.

    One tape node; on the GPU one kernel each way.
    """,
)
