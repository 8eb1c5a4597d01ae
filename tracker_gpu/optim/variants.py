"""Adam's variants and the older per-element rules that PyTorch users reach for: `AMSGrad`,
`NAdam`, `RAdam`, `AdaMax`, `AdaDelta` and `Rprop`, with Optimisers.jl's names, argument order
and defaults, and PyTorch's arithmetic where the two differ (each docstring says how).

As in `adaptive`, each new state is computed into arrays made here; a state that counts steps
keeps Python numbers for the coming step `t` (1 at first), which tg.compile reads as inputs.

>>> import numpy as np
>>> rule = AdaMax(0.1)
>>> state, delta = rule.apply(rule.init(np.zeros(2)), np.zeros(2), np.array([1.0, -2.0]))
>>> delta.round(6)
array([ 0.1, -0.1])
"""

import math
from dataclasses import dataclass

import numpy as np

from ..backend import namespace_of
from ..rules.elementwise import maximum, where
from .adaptive import _moving, _root, _scalar, _wide
from .rules import (
    Rule,
    _error,
    _is_number,
    ascent,
    check_beta,
    check_flags,
    check_fraction,
    check_nonnegative,
    weakened,
)

__all__ = ["AMSGrad", "NAdam", "RAdam", "AdaMax", "AdaDelta", "Rprop"]


def _check_adam(rule):
    check_nonnegative(rule, eta=rule.eta, epsilon=rule.epsilon)
    check_beta(rule, rule.beta)
    check_flags(rule, maximize=rule.maximize)


@dataclass(frozen=True)
class AMSGrad(Rule):
    """AMSGrad (Reddi et al. 2018): Adam whose second moment is the largest seen so far,
    `x -= eta * m_hat / (sqrt(max(v)_hat) + epsilon)`. PyTorch's `Adam(lr=eta, betas=beta,
    eps=epsilon, amsgrad=True, maximize=...)`, bias corrections included; Optimisers.jl's
    `AMSGrad` has none and starts the maximum at epsilon. The state is `(m, v, max v,
    (beta1**t, beta2**t))`."""

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8
    maximize: bool = False

    __post_init__ = _check_adam

    def init(self, x):
        xp = namespace_of(x)
        return (xp.zeros_like(x), xp.zeros_like(x), xp.zeros_like(x), tuple(self.beta))

    def apply(self, state, x, dx):
        m, v, most, (beta1_t, beta2_t) = state
        beta1, beta2 = self.beta
        dx = ascent(self, dx)
        xp = namespace_of(dx)
        new_m, new_v = _moving(m, dx, beta1), _moving(v, dx * dx, beta2)
        new_most = xp.maximum(most, new_v)
        correction = _root(1 - beta2_t)  # folded as in Adam
        direction = xp.sqrt(new_most)
        direction += _scalar(self.epsilon * correction, direction)
        direction = new_m / direction
        direction *= _scalar(_wide(self.eta) * (correction / (1 - beta1_t)), direction)
        return (new_m, new_v, new_most, (beta1_t * beta1, beta2_t * beta2)), direction


@dataclass(frozen=True)
class NAdam(Rule):
    """NAdam (Dozat 2016), as PyTorch writes it: Adam with Nesterov momentum whose factor
    `mu_t = beta1 * (1 - 0.5 * 0.96**(t * momentum_decay))` warms up over the steps. PyTorch's
    `NAdam(lr=eta, betas=beta, eps=epsilon, momentum_decay=..., maximize=...)`, same defaults;
    its `weight_decay` is `OptimiserChain(WeightDecay(wd), NAdam(...))`. Optimisers.jl's
    `NAdam` is this with a constant `mu_t = beta1`. The state is `(m, v, (0.96**(t *
    momentum_decay), mu_1 * ... * mu_(t-1), beta2**t))`."""

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8
    momentum_decay: float = 4e-3
    maximize: bool = False

    def __post_init__(self):
        _check_adam(self)
        check_nonnegative(self, momentum_decay=self.momentum_decay)

    def init(self, x):
        xp = namespace_of(x)
        decay = 0.96 ** float(self.momentum_decay)
        return (xp.zeros_like(x), xp.zeros_like(x), (decay, 1.0, self.beta[1]))

    def apply(self, state, x, dx):
        m, v, (decay_t, product, beta2_t) = state
        beta1, beta2 = self.beta
        decay = 0.96 ** float(self.momentum_decay)
        mu = beta1 * (1 - 0.5 * decay_t)
        mu_next = beta1 * (1 - 0.5 * (decay_t * decay))
        product = product * mu
        dx = ascent(self, dx)
        new_m, new_v = _moving(m, dx, beta1), _moving(v, dx * dx, beta2)
        root = namespace_of(dx).sqrt(new_v / _scalar(1 - beta2_t, new_v))
        root += self.epsilon
        eta = _wide(self.eta)
        now = dx * _scalar(eta * ((1 - mu) / (1 - product)), dx)
        now += new_m * _scalar(eta * (mu_next / (1 - product * mu_next)), new_m)
        new_state = (new_m, new_v, (decay_t * decay, product, beta2_t * beta2))
        return new_state, now / root


def _choose(condition, chosen, otherwise):
    """`chosen()` where `condition` holds, else `otherwise`: a Python branch for a Python
    condition, an elementwise choice (both computed) for one in an array (under tg.compile)."""
    if isinstance(condition, (bool, np.bool_)):
        return chosen() if condition else otherwise
    return where(condition, chosen(), otherwise)


def _nonnegative(value):
    return max(value, 0.0) if type(value) in (int, float) else maximum(value, 0.0)


@dataclass(frozen=True)
class RAdam(Rule):
    """RAdam (Liu et al. 2020), as PyTorch writes it: while the variance of the adaptive rate is
    intractable (`rho_t <= 5`) a momentum step `x -= eta * m_hat`, then Adam's step with the
    rectification `r_t`, `x -= eta * r_t * m_hat * sqrt(1 - beta2**t) / (sqrt(v) + epsilon)`.
    PyTorch's `RAdam(lr=eta, betas=beta, eps=epsilon, maximize=...)`, same defaults; its
    `weight_decay` is `OptimiserChain(WeightDecay(wd), RAdam(...))`. Optimisers.jl's `RAdam`
    switches at `rho_t > 4` and adds epsilon to `sqrt(v_hat)`. The state is `(m, v, (t,
    beta1**t, beta2**t))`."""

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8
    maximize: bool = False

    __post_init__ = _check_adam

    def init(self, x):
        xp = namespace_of(x)
        return (xp.zeros_like(x), xp.zeros_like(x), (1, *self.beta))

    def apply(self, state, x, dx):
        m, v, (t, beta1_t, beta2_t) = state
        beta1, beta2 = self.beta
        dx = ascent(self, dx)
        new_m, new_v = _moving(m, dx, beta1), _moving(v, dx * dx, beta2)
        step = new_m * _scalar(_wide(self.eta) / (1 - beta1_t), new_m)
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * t * beta2_t / (1 - beta2_t)

        def rectified():
            ratio = (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
            root = namespace_of(new_v).sqrt(new_v)
            root += self.epsilon
            scale = _root(1 - beta2_t) * _root(_nonnegative(ratio))
            return step * _scalar(scale, step) / root

        delta = _choose(rho_t > 5, rectified, step)
        return (new_m, new_v, (t + 1, beta1_t * beta1, beta2_t * beta2)), delta


@dataclass(frozen=True)
class AdaMax(Rule):
    """AdaMax (Kingma & Ba 2015, section 7.1): Adam with the infinity norm, `u = max(beta2 *
    u, |dx| + epsilon)`, `x -= eta / (1 - beta1**t) * m / u`. PyTorch's `Adamax(lr=eta,
    betas=beta, eps=epsilon, maximize=...)` (its default lr is 2e-3; Optimisers.jl's 1e-3,
    whose `AdaMax` adds epsilon to `u` instead). `Adamax` is the same rule. The state is `(m,
    u, beta1**t)`."""

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8
    maximize: bool = False

    __post_init__ = _check_adam

    def init(self, x):
        xp = namespace_of(x)
        return (xp.zeros_like(x), xp.zeros_like(x), self.beta[0])

    def apply(self, state, x, dx):
        m, u, beta1_t = state
        beta1, beta2 = self.beta
        dx = ascent(self, dx)
        xp = namespace_of(dx)
        new_m = _moving(m, dx, beta1)
        size = xp.abs(dx)
        size += self.epsilon
        new_u = xp.maximum(u * beta2, size)
        delta = new_m * _scalar(_wide(self.eta) / (1 - beta1_t), new_m) / new_u
        return (new_m, new_u, beta1_t * beta1), delta


@dataclass(frozen=True)
class AdaDelta(Rule):
    """AdaDelta (Zeiler 2012): `acc = rho * acc + (1 - rho) * dx**2`, `step = dx *
    sqrt(acc_step + epsilon) / sqrt(acc + epsilon)`, `acc_step = rho * acc_step + (1 - rho) *
    step**2`, `x -= eta * step`. Optimisers.jl's `AdaDelta(rho, epsilon)` (no rate: `eta` is 1,
    last so that its argument order holds); PyTorch's `Adadelta(lr=eta, rho=rho,
    eps=epsilon, maximize=...)`, whose eps is 1e-6 (ours 1e-8). `Adadelta` is the same rule.
    The state is `(acc, acc_step)`."""

    rho: float = 0.9
    epsilon: float = 1e-8
    eta: float = 1.0
    maximize: bool = False

    def __post_init__(self):
        check_fraction(self, "rho", self.rho)
        check_nonnegative(self, epsilon=self.epsilon, eta=self.eta)
        check_flags(self, maximize=self.maximize)

    def init(self, x):
        xp = namespace_of(x)
        return (xp.zeros_like(x), xp.zeros_like(x))

    def apply(self, state, x, dx):
        acc, acc_step = state
        dx = ascent(self, dx)
        xp = namespace_of(dx)
        acc = _moving(acc, dx * dx, self.rho)
        step = acc_step + self.epsilon
        step = xp.sqrt(step) / xp.sqrt(acc + self.epsilon) * dx
        return (acc, _moving(acc_step, step * step, self.rho)), step * self.eta


def _check_rprop(rule):
    for name, value, holds, requirement in (
        ("ell", rule.ell, lambda a, b: 0 < a < 1 < b, "(shrink, grow) with 0 < shrink < 1 < grow"),
        ("gamma", rule.gamma, lambda a, b: 0 <= a <= b < math.inf, "(min, max), 0 <= min <= max"),
    ):
        value = weakened(rule, name, value)
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise _error(TypeError, rule, name, value, f"a pair {requirement} (a tuple)")
        if not all(_is_number(v) for v in value):
            raise _error(TypeError, rule, name, value, f"two numbers {requirement}")
        if not holds(*value):
            raise _error(ValueError, rule, name, value, requirement)


@dataclass(frozen=True)
class Rprop(Rule):
    """Rprop (Riedmiller & Braun 1993): each element's step size grows by `ell[1]` while its
    gradient keeps its sign and shrinks by `ell[0]` when it flips, within `gamma`;
    `x -= step * sign(dx)`, and a flipped gradient is forgotten (no step, no shrink next
    time). The sizes start at `eta`. PyTorch's `Rprop(lr=eta, etas=ell, step_sizes=gamma,
    maximize=...)`, whose lr is 1e-2 (ours Optimisers.jl's 1e-3); like PyTorch the sizes are
    kept within `gamma` at every step. The state is `(last gradient, step sizes)`."""

    eta: float = 1e-3
    ell: tuple = (0.5, 1.2)
    gamma: tuple = (1e-6, 50.0)
    maximize: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta)
        _check_rprop(self)
        check_flags(self, maximize=self.maximize)

    def init(self, x):
        xp = namespace_of(x)
        return (xp.zeros_like(x), xp.full_like(x, self.eta))

    def apply(self, state, x, dx):
        last, sizes = state
        dx = ascent(self, dx)
        xp = namespace_of(dx)
        product = dx * last
        flipped = product < 0
        factor = xp.where(product > 0, xp.full_like(dx, self.ell[1]), xp.ones_like(dx))
        factor = xp.where(flipped, xp.full_like(dx, self.ell[0]), factor)
        sizes = xp.clip(sizes * factor, min=self.gamma[0], max=self.gamma[1])
        kept = xp.where(flipped, xp.zeros_like(dx), dx)
        return (kept, sizes), xp.sign(kept) * sizes


Adamax, Adadelta = AdaMax, AdaDelta  # PyTorch's spellings
