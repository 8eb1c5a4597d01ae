"""Activations and normalisers: sigmoid, relu, softmax, logsoftmax, logsumexp.

Forwards are numerically stable; vjps reuse the saved output where the maths allows. On the GPU
softmax and logsoftmax run as fused kernels both ways (`cuda.rows`).

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(lambda x: tg.logsumexp(x), np.array([0.0, 0.0]))[0]
array([0.5, 0.5])
"""

from ..primitive import Primitive
from ..tracked import data
from .elementwise import exp, mask
from .reductions import expand
from .reductions import sum as _sum


def _sigmoid_forward(xp, x):
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


sigmoid = Primitive(
    "sigmoid",
    _sigmoid_forward,
    (lambda g, ans, x: g * ans * (1 - ans),),
    saves="ans",
)
relu = Primitive(
    "relu",
    lambda xp, x: xp.where(x > 0, x, xp.zeros_like(x)),
    (lambda g, ans, x: mask(data(ans) > 0, g),),
    saves="ans",
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
    saves="ans",
)
logsoftmax = Primitive(
    "logsoftmax",
    _logsoftmax_forward,
    (lambda g, ans, x, axis=-1: g - exp(ans) * _sum(g, axis=axis, keepdims=True),),
    saves="ans",
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
    saves="x ans",
)
