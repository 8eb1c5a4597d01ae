"""Rules that adapt the step of each element: `Adam`, `AdamW`, `RMSProp`, `AdaGrad`,
`AdaBelief` and `Lion`, with Optimisers.jl's argument order and defaults.

Each new state is computed into arrays made here, and in-place operators act only on those, which
saves allocations: the parameter, the gradient and the old state are never written (an old
optimiser state stays valid). A state that counts steps keeps `(beta1**t, beta2**t)` for the
coming step `t` (1 at first), as Optimisers.jl does.

>>> import numpy as np
>>> rule = RMSProp(0.01)
>>> state, delta = rule.apply(rule.init(np.zeros(2)), np.zeros(2), np.array([1.0, -2.0]))
>>> delta.round(6)
array([ 0.031623, -0.031623])
"""

import math
from dataclasses import dataclass

from ..backend import namespace_of
from ..rules.elementwise import astype, sqrt
from ..tracked import data
from .rules import Rule, ascent, check_beta, check_flags, check_fraction, check_nonnegative

__all__ = ["Adam", "AdamW", "RMSProp", "AdaGrad", "AdaBelief", "Lion"]


def _moving(average, value, beta):
    """`beta * average + (1 - beta) * value`, as `average + (1 - beta) * (value - average)`,
    into a new array."""
    out = value - average
    out *= 1 - beta
    out += average
    return out


def _root(value):
    return math.sqrt(value) if isinstance(value, (int, float)) else sqrt(value)


def _scalar(value, like):
    """A step's scalar as the arrays take it: a Python number as it is; a 0-d array (a step
    count under tg.compile, in float64) cast to `like`'s dtype, so that it does not promote."""
    return value if type(value) in (int, float) else astype(value, like.dtype)  # np.float64 too


def _wide(eta):
    """A rate in float64 before it meets a bias correction: a scheduled rate comes as a 0-d
    array of the parameters' dtype, and the correction is a Python float eagerly but a float64
    0-d array under tg.compile; in float64 both ways, the step is the same bit for bit."""
    if type(eta) in (int, float):
        return eta
    return astype(eta, namespace_of(data(eta)).float64)


def _adam_moments(rule, state, dx):
    """Adam's moments after `dx`, and the direction `m_hat / (sqrt(v_hat) + epsilon)` up to the
    scalar factor returned with it: a Python float, or a float64 0-d array under tg.compile, to
    be combined with the rate before it meets the arrays (in float64, as eagerly)."""
    m, v, (beta1_t, beta2_t) = state
    beta1, beta2 = rule.beta
    new_m = _moving(m, dx, beta1)
    new_v = _moving(v, dx * dx, beta2)
    # the bias corrections folded into two scalars (Kingma & Ba, end of section 2)
    correction = _root(1 - beta2_t)
    direction = namespace_of(v).sqrt(new_v)
    direction += _scalar(rule.epsilon * correction, direction)
    direction = new_m / direction
    scale = correction / (1 - beta1_t)
    return (new_m, new_v, (beta1_t * beta1, beta2_t * beta2)), direction, scale


def _moments_init(rule, x):
    xp = namespace_of(x)
    return (xp.zeros_like(x), xp.zeros_like(x), tuple(rule.beta))


@dataclass(frozen=True)
class Adam(Rule):
    """Adam (Kingma & Ba 2015): moments `m`, `v` of the gradient and its square, bias-corrected,
    `x -= eta * m_hat / (sqrt(v_hat) + epsilon)`.

    The state is `(m, v, (beta1**t, beta2**t))`; a fused kernel for `step` reads and returns
    the same. PyTorch's `Adam(lr=eta, betas=beta, eps=epsilon, maximize=...)`, same defaults;
    its `weight_decay` is `OptimiserChain(WeightDecay(wd), Adam(...))`, its `amsgrad=True` is
    `AMSGrad`.
    """

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8
    maximize: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, epsilon=self.epsilon)
        check_beta(self, self.beta)
        check_flags(self, maximize=self.maximize)

    init = _moments_init

    def apply(self, state, x, dx):
        state, direction, scale = _adam_moments(self, state, ascent(self, dx))
        direction *= _scalar(_wide(self.eta) * scale, direction)
        return state, direction


@dataclass(frozen=True)
class AdamW(Rule):
    """Adam with weight decay `weight_decay` (Loshchilov & Hutter 2019). With `couple=True` (as
    PyTorch and Optimisers.jl) `x -= eta * (adam + weight_decay * x)`; with `couple=False`
    `x -= eta * adam + weight_decay * x`. PyTorch's `AdamW(lr=eta, betas=beta, eps=epsilon,
    weight_decay=..., maximize=...)`, whose default weight_decay is 1e-2 (Optimisers.jl's 0).
    """

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    weight_decay: float = 0.0
    epsilon: float = 1e-8
    couple: bool = True
    maximize: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, epsilon=self.epsilon, weight_decay=self.weight_decay)
        check_beta(self, self.beta)
        check_flags(self, couple=self.couple, maximize=self.maximize)

    init = _moments_init

    def apply(self, state, x, dx):
        state, direction, scale = _adam_moments(self, state, ascent(self, dx))
        delta = direction * _scalar(scale, direction)
        if self.couple:
            return state, (delta + x * self.weight_decay) * self.eta
        return state, delta * self.eta + x * self.weight_decay


@dataclass(frozen=True)
class RMSProp(Rule):
    """RMSProp (Tieleman & Hinton 2012): `quad = rho * quad + (1 - rho) * dx**2`,
    `x -= eta * dx / (sqrt(quad) + epsilon)`. With `centred=True` the running mean `lin` of the
    gradient is kept too and `quad - lin**2` (a variance) replaces `quad`. With `momentum > 0`
    the scaled gradient goes through a buffer, `b = momentum * b + dx / (sqrt(quad) +
    epsilon)`, `x -= eta * b`. PyTorch's `RMSprop(lr=eta, alpha=rho, eps=epsilon, momentum=...,
    centered=centred, maximize=...)`, whose defaults are lr 1e-2, alpha 0.99 (ours
    Optimisers.jl's: 1e-3, 0.9). The state is `(quad, lin)`, `lin` None unless centred, and
    `b` after them with a momentum."""

    eta: float = 0.001
    rho: float = 0.9
    epsilon: float = 1e-8
    centred: bool = False
    momentum: float = 0.0
    maximize: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, epsilon=self.epsilon, momentum=self.momentum)
        check_fraction(self, "rho", self.rho)
        check_flags(self, centred=self.centred, maximize=self.maximize)

    def init(self, x):
        xp = namespace_of(x)
        state = (xp.zeros_like(x), xp.zeros_like(x) if self.centred else None)
        return state + (xp.zeros_like(x),) if self.momentum else state

    def apply(self, state, x, dx):
        quad, lin = state[:2]
        xp = namespace_of(dx)
        dx = ascent(self, dx)
        quad = _moving(quad, dx * dx, self.rho)
        if self.centred:
            lin = _moving(lin, dx, self.rho)
            root = xp.sqrt(quad - lin * lin)
        else:
            root = xp.sqrt(quad)
        root += self.epsilon
        if not self.momentum:
            return (quad, lin), dx * self.eta / root
        buffer = state[2] * self.momentum
        buffer += dx / root
        return (quad, lin, buffer), buffer * self.eta


@dataclass(frozen=True)
class AdaGrad(Rule):
    """AdaGrad (Duchi et al. 2011): `acc += dx**2`, `x -= eta * dx / (sqrt(acc) + epsilon)`, the
    sum starting at `epsilon` as in Optimisers.jl (PyTorch's `Adagrad` with
    `initial_accumulator_value=epsilon` and `eps=epsilon`, whose defaults are lr 1e-2, 0 and
    1e-10; its `weight_decay` is `OptimiserChain(WeightDecay(wd), AdaGrad(...))`), and
    `maximize=True` as PyTorch's."""

    eta: float = 0.1
    epsilon: float = 1e-8
    maximize: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, epsilon=self.epsilon)
        check_flags(self, maximize=self.maximize)

    def init(self, x):
        return namespace_of(x).full_like(x, self.epsilon)

    def apply(self, state, x, dx):
        dx = ascent(self, dx)
        acc = dx * dx
        acc += state
        root = namespace_of(dx).sqrt(acc)
        root += self.epsilon
        return acc, dx * self.eta / root


@dataclass(frozen=True)
class AdaBelief(Rule):
    """AdaBelief (Zhuang et al. 2020): Adam whose second moment is the variance of the gradient
    around its moving average, `s = beta2 * s + (1 - beta2) * (dx - m)**2 + epsilon`, then
    `x -= eta * m_hat / (sqrt(s_hat) + epsilon)`. The state is `(m, s, (beta1**t, beta2**t))`."""

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-16

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, epsilon=self.epsilon)
        check_beta(self, self.beta)

    init = _moments_init

    def apply(self, state, x, dx):
        m, s, (beta1_t, beta2_t) = state
        beta1, beta2 = self.beta
        xp = namespace_of(dx)
        new_m = _moving(m, dx, beta1)
        surprise = dx - new_m
        new_s = _moving(s, surprise * surprise, beta2)
        new_s += self.epsilon
        root = xp.sqrt(new_s / _scalar(1 - beta2_t, new_s))
        root += self.epsilon
        delta = new_m * _scalar(_wide(self.eta) / (1 - beta1_t), new_m) / root
        return (new_m, new_s, (beta1_t * beta1, beta2_t * beta2)), delta


@dataclass(frozen=True)
class Lion(Rule):
    """Lion (Chen et al. 2023): `x -= eta * (sign(beta1 * m + (1 - beta1) * dx) +
    weight_decay * x)` (the paper's decoupled weight decay, scaled by the rate as AdamW's),
    then the momentum `m = beta2 * m + (1 - beta2) * dx`. The state is `m`. PyTorch has no
    Lion; this is the paper's Algorithm 2 (and the `lion-pytorch` package's `Lion(lr, betas,
    weight_decay)`)."""

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    weight_decay: float = 0.0

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, weight_decay=self.weight_decay)
        check_beta(self, self.beta)

    def init(self, x):
        return namespace_of(x).zeros_like(x)

    def apply(self, state, x, dx):
        beta1, beta2 = self.beta
        xp = namespace_of(dx)
        direction = xp.sign(_moving(state, dx, beta1))
        if self.weight_decay:
            direction += x * self.weight_decay
        return _moving(state, dx, beta2), direction * self.eta
