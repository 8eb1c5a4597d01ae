"""Activation functions: composites of the rules, so differentiable to any order.

The rules' own `relu`, `sigmoid`, `tanh`, `softmax` and `logsoftmax` are re-exported beside
Flux's other activations (`leakyrelu`, `elu`, `gelu`, `swish`, ...), each written in terms of this
package's differentiable functions; `flatten` merges every axis but the batch. A layer applies
its activation with `_activate`, which skips `None` and `identity`.
"""

import math

from ..primitive import no_gradient
from ..rules import special
from ..rules.elementwise import abs as _abs
from ..rules.elementwise import (
    add,
    divide,
    expm1,
    logaddexp,
    multiply,
    negative,
    tanh,
    where,
)
from ..rules.nn import logsoftmax, relu, sigmoid, softmax
from ..rules.shape import reshape
from .primitives import gelu_tanh

__all__ = [
    "identity",
    "relu",
    "sigmoid",
    "tanh",
    "softmax",
    "logsoftmax",
    "leakyrelu",
    "elu",
    "selu",
    "celu",
    "gelu",
    "swish",
    "mish",
    "softplus",
    "logsigmoid",
    "softsign",
    "hardtanh",
    "relu6",
    "flatten",
]


def identity(x):
    return x


def leakyrelu(x, a=0.01):
    """`x` where positive, `a * x` elsewhere."""
    return where(x > 0, x, multiply(x, a))


def _negative_part(x):
    """`min(x, 0)`, with the gradient 1 at 0 (so that elu'(0) = a, as NNlib)."""
    return where(x > 0, 0.0, x)


def elu(x, a=1.0):
    """`x` where positive, `a * (exp(x) - 1)` elsewhere."""
    return where(x > 0, x, multiply(expm1(_negative_part(x)), a))


def selu(x):
    """Scaled exponential linear unit, with the constants of Klambauer et al. (2017)."""
    scale, alpha = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717
    return multiply(where(x > 0, x, multiply(expm1(_negative_part(x)), alpha)), scale)


def celu(x, a=1.0):
    """`x` where positive, `a * (exp(x / a) - 1)` elsewhere."""
    return where(x > 0, x, multiply(expm1(divide(_negative_part(x), a)), a))


def gelu(x, approximate="tanh"):
    """Gaussian error linear unit, `x * ndtr(x)`, by PyTorch's names: `approximate="tanh"` (the
    default: Flux's `gelu`, one primitive whose derivative is differentiable again) or
    `"none"`, exact: `0.5 x (1 + erf(x / sqrt(2)))` (PyTorch's default; `erf` from the array's
    library, see `tg.special`).

    >>> import numpy as np, tracker_gpu as tg
    >>> x = np.array([-1.0, 1.0])
    >>> np.round(tg.nn.gelu(x, approximate="none") - tg.nn.gelu(x), 6)
    array([0.000153, 0.000153])
    """
    if approximate == "tanh":
        return gelu_tanh(x)
    if approximate != "none":
        raise ValueError(f'gelu: approximate must be "tanh" or "none", got {approximate!r}')
    return multiply(multiply(x, 0.5), add(special.erf(multiply(x, math.sqrt(0.5))), 1.0))


def swish(x):
    """`x * sigmoid(x)` (also called SiLU)."""
    return multiply(x, sigmoid(x))


def softplus(x):
    """`log(1 + exp(x))`, computed stably."""
    return logaddexp(x, 0.0)


def mish(x):
    """`x * tanh(softplus(x))`."""
    return multiply(x, tanh(softplus(x)))


def logsigmoid(x):
    """`log(sigmoid(x))`, computed stably."""
    return negative(softplus(negative(x)))


def softsign(x):
    """`x / (1 + |x|)`."""
    return divide(x, add(_abs(x), 1.0))


def hardtanh(x):
    """`x` clipped to [-1, 1]; flat at the bounds, as relu at 0 (PyTorch's)."""
    return _clamp(x, -1.0, 1.0)


def relu6(x):
    """`x` clipped to [0, 6]; flat at the bounds, as relu at 0 (PyTorch's)."""
    return _clamp(x, 0.0, 6.0)


def _clamp(x, lo, hi):
    """`clip(x, lo, hi)` whose gradient is 0 on the bounds and at nan too (`clip` passes it on
    the bounds), PyTorch's hardtanh: x itself on a bound (-0.0 stays -0.0), nan stays nan. The
    conditions compare `x` itself, not its plain value: on a tracked array a comparison is a
    constant that a tg.compile replay computes anew."""
    still = _without_gradient(x)
    return where((x > lo) & (x < hi), x, where(still < lo, lo, where(still > hi, hi, still)))


# x's value, a constant to the tape (a replay computes it anew)
_without_gradient = no_gradient("without_gradient", lambda xp, x: x)


def flatten(x):
    """Every axis but the first (the batch) made one."""
    return reshape(x, (x.shape[0], math.prod(x.shape[1:])))


def _activate(activation, y):
    return y if activation is None or activation is identity else activation(y)
