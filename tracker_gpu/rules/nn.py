"""Activations and normalisers: sigmoid, relu, softmax, logsoftmax, logsumexp, `normalise`
(the statistics of the normalisation layers) and `lstm_cell` (an LSTM cell's gates).

Forwards are numerically stable; vjps reuse the saved output where the maths allows. On the GPU
softmax, logsoftmax, normalise and the LSTM cell run as fused kernels both ways (`cuda.rows`,
`cuda.layers`).

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(lambda x: tg.logsumexp(x), np.array([0.0, 0.0]))[0]
array([0.5, 0.5])
"""

from ..tracked import Primitive, data
from .elementwise import add, divide, exp, mask, multiply, sqrt, subtract, tanh
from .reductions import expand, mean
from .reductions import sum as _sum
from .shape import concat, getitem


def _sigmoid_forward(xp, x):
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


sigmoid = Primitive(
    "sigmoid",
    _sigmoid_forward,
    (lambda g, ans, x: g * ans * (1 - ans),),
)
relu = Primitive(
    "relu",
    lambda xp, x: xp.where(x > 0, x, xp.zeros_like(x)),
    (lambda g, ans, x: mask(data(ans) > 0, g),),
)


def _softmax_forward(xp, x, /, *, axis=-1):
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def _logsoftmax_forward(xp, x, /, *, axis=-1):
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))


softmax = Primitive(
    "softmax",
    _softmax_forward,
    (lambda g, ans, x, axis=-1: ans * (g - _sum(g * ans, axis=axis, keepdims=True)),),
)
logsoftmax = Primitive(
    "logsoftmax",
    _logsoftmax_forward,
    (lambda g, ans, x, axis=-1: g - exp(ans) * _sum(g, axis=axis, keepdims=True),),
)


def _logsumexp_forward(xp, x, /, *, axis=None, keepdims=False):
    m = xp.max(x, axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
    out = xp.log(xp.sum(xp.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else xp.squeeze(out, axis=_squeezed(axis, x.ndim))


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
)


# --- the normalisation layers' statistics: one primitive
def _normalise_forward(xp, x, /, *, axes, eps=1e-5):
    centred = x - xp.mean(x, axis=axes, keepdims=True)
    variance = xp.mean(centred * centred, axis=axes, keepdims=True)
    return centred / xp.sqrt(variance + eps)


def _normalise_vjp(g, ans, x, *, axes, eps=1e-5):
    """`(g - mean(g) - y * mean(g * y)) / sigma`, sigma recomputed from `x` as the forward does."""
    centred = subtract(x, mean(x, axis=axes, keepdims=True))
    sigma = sqrt(add(mean(multiply(centred, centred), axis=axes, keepdims=True), eps))
    spread = subtract(g, mean(g, axis=axes, keepdims=True))
    slope = multiply(ans, mean(multiply(g, ans), axis=axes, keepdims=True))
    return divide(subtract(spread, slope), sigma)


normalise = Primitive(
    "normalise",
    _normalise_forward,
    (_normalise_vjp,),
    doc="""`(x - mean) / sqrt(var + eps)`, mean and (biased) variance over `axes` (a tuple).

    The statistics of LayerNorm, GroupNorm and BatchNorm, as one tape node; on the GPU one
    kernel each way when the axes not normalised are neighbours (all three layers' cases).
    """,
)


# --- an LSTM cell's gates: one primitive
def _gate_pieces(z, hidden):
    return [getitem(z, (..., slice(k * hidden, (k + 1) * hidden))) for k in range(4)]


def _lstm_cell_forward(xp, z, c):
    hidden = c.shape[-1]
    i, f, g, o = (z[..., k * hidden : (k + 1) * hidden] for k in range(4))
    i, f, o = _sigmoid_forward(xp, i), _sigmoid_forward(xp, f), _sigmoid_forward(xp, o)
    c_new = f * c + i * xp.tanh(g)
    return xp.concat([o * xp.tanh(c_new), c_new], axis=-1)


def _lstm_partials(g, ans, z, c):
    """The gradients of the cell's state `dc'` and of its gates, from the incoming gradient `g`
    of `[h', c']`."""
    hidden = c.shape[-1]
    i, f, u, o = _gate_pieces(z, hidden)
    i, f, o, u = sigmoid(i), sigmoid(f), sigmoid(o), tanh(u)
    c_new = getitem(ans, (..., slice(hidden, None)))
    t = tanh(c_new)
    g_h = getitem(g, (..., slice(None, hidden)))
    g_c = getitem(g, (..., slice(hidden, None)))
    d_c = add(g_c, multiply(multiply(g_h, o), subtract(1.0, multiply(t, t))))
    return d_c, (i, f, u, o, t, g_h)


def _lstm_vjp_z(g, ans, z, c):
    d_c, (i, f, u, o, t, g_h) = _lstm_partials(g, ans, z, c)
    return concat(
        [
            multiply(multiply(d_c, u), multiply(i, subtract(1.0, i))),
            multiply(multiply(d_c, c), multiply(f, subtract(1.0, f))),
            multiply(multiply(d_c, i), subtract(1.0, multiply(u, u))),
            multiply(multiply(g_h, t), multiply(o, subtract(1.0, o))),
        ],
        axis=-1,
    )


def _lstm_vjp_c(g, ans, z, c):
    d_c, (i, f, u, o, t, g_h) = _lstm_partials(g, ans, z, c)
    return multiply(d_c, f)


lstm_cell = Primitive(
    "lstm_cell",
    _lstm_cell_forward,
    (_lstm_vjp_z, _lstm_vjp_c),
    doc="""An LSTM cell's gates: from the pre-activations `z` (..., 4h), in the order input,
    forget, cell, output (Flux's and PyTorch's), and the cell state `c` (..., h), the new
    hidden and cell states side by side, `[h', c']` (..., 2h):
    `c' = sigmoid(f) * c + sigmoid(i) * tanh(g)`, `h' = sigmoid(o) * tanh(c')`.

    One tape node; on the GPU one kernel each way.
    """,
)
