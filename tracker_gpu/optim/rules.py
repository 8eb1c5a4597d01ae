"""The rules without per-element adaptation: `Descent`, `Momentum`, `Nesterov`, `SGD`
(PyTorch's), the gradient transforms `WeightDecay`, `SignDecay`, `ClipGrad`, `ClipNorm`, and
`OptimiserChain`.

A rule is `init(x) -> state` and `apply(state, x, dx) -> (state, delta)` (the parameter becomes
`x - delta`), written with the Array API on the parameter's own library, so it runs where the
parameter lives. Rules are frozen dataclasses: their hyperparameters are their fields, with
Optimisers.jl's names, order and defaults.

>>> import numpy as np
>>> rule = OptimiserChain(SignDecay(0.1), Descent(0.5))
>>> rule.apply(rule.init(None), np.array([2.0, -3.0]), np.array([1.0, 1.0]))[1]
array([0.55, 0.45])
"""

import dataclasses
import math
import numbers
from dataclasses import dataclass

import numpy as np

from ..backend import is_array, namespace_of
from ..primitive import no_gradient
from ..rules.elementwise import astype
from ..tracked import data

__all__ = [
    "Rule",
    "Descent",
    "Momentum",
    "Nesterov",
    "SGD",
    "WeightDecay",
    "SignDecay",
    "ClipGrad",
    "ClipNorm",
    "OptimiserChain",
]


class Rule:
    """An optimisation rule: `init(x)` makes a parameter's state, `apply(state, x, dx)` returns
    the new state and the step `delta` (the parameter becomes `x - delta`)."""

    def init(self, x):
        return None

    def apply(self, state, x, dx):
        raise NotImplementedError

    def adjust(self, **changes):
        """A copy with the given hyperparameters changed (those it does not have are ignored)."""
        names = self.hyperparameters()
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if k in names})

    def hyperparameters(self):
        """The names `adjust` changes."""
        return frozenset(f.name for f in dataclasses.fields(self))


# What each hyperparameter is, for the error messages.
MEANINGS = {
    "eta": "the learning rate", "rho": "the momentum", "beta": "the moments' decay rates",
    "epsilon": "the guard against division by zero", "weight_decay": "the weight decay",
    "kappa": "the L1 penalty", "delta": "the clipping bound", "omega": "the largest norm",
    "p": "the norm's order", "decay": "the factor of the learning rate",
    "eta_min": "the last learning rate", "throw": "raise on a NaN or infinite norm",
    "couple": "weight decay scaled by eta", "centred": "use the gradient's variance",
    "maximize": "climb the objective instead",
    "dampening": "the gradient's damping in the momentum",
    "nesterov": "Nesterov's look-ahead", "momentum": "the momentum of the step",
    "ell": "the step sizes' factors (shrink, grow)", "gamma": "the step sizes' bounds (min, max)",
    "momentum_decay": "the decay of NAdam's momentum schedule", "eta_end": "the last rate",
    "period": "the first cosine's length", "mult": "each cosine's growth",
    "warmup": "the fraction of the steps spent warming up", "power": "the polynomial's power",
    "div_factor": "the first rate's divisor", "final_div_factor": "the last rate's divisor",
}  # fmt: skip
# May be infinite: no clipping.
UNBOUNDED = frozenset({"delta", "omega"})


def _error(error, rule, name, value, requirement):
    """`Adam: eta must be >= 0 (the learning rate), got -1.0`: the rule, the argument, what
    it must be and the value given."""
    meaning = MEANINGS.get(name)
    plain = _is_number(value) or isinstance(value, (tuple, list))
    kind = "" if plain else f" (a {type(value).__name__})"
    return error(
        f"{type(rule).__name__}: {name} must be {requirement}"
        + (f" ({meaning})" if meaning else "")
        + f", got {value!r}{kind}"
    )


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def plain_number(value):
    """A NumPy scalar (`np.float64(0.1)`) or 0-d NumPy array as the Python number it holds,
    a tuple of them as a tuple of Python numbers; anything else as it is. A Python number is
    weakly typed: float32 parameters stay float32 (a NumPy float64 is not, under NumPy 2)."""
    if isinstance(value, np.generic) or (type(value) is np.ndarray and value.ndim == 0):
        return value.item()
    if type(value) is tuple or type(value) is list:
        return type(value)(plain_number(v) for v in value)
    return value


def weakened(rule, name, value):
    """`value` as a Python number where it was a NumPy one (`plain_number`), written into
    the field `name` of the frozen dataclass `rule`, so that the rule steps in the parameters'
    dtype whatever the hyperparameters were given as."""
    plain = plain_number(value)
    if plain is not value and dataclasses.is_dataclass(rule) and hasattr(rule, name):
        object.__setattr__(rule, name, plain)
    return plain


def check_number(rule, name, value, requirement, holds):
    """`value` is a real number (not a bool or a string) for which `holds(value)`; else an
    error naming the rule, the argument and the value. A rate in an array (a schedule's,
    under tg.compile) is not read: it would stall a replay. A NumPy scalar or 0-d NumPy array
    is checked, and kept in the rule, as the Python number it holds (`weakened`)."""
    value = weakened(rule, name, value)
    if is_array(data(value)):
        return
    if not _is_number(value):
        raise _error(TypeError, rule, name, value, f"a number {requirement}")
    if not holds(value):
        raise _error(ValueError, rule, name, value, requirement)


def check_nonnegative(rule, **values):
    """Each of `values` a number >= 0, finite except the bounds named in UNBOUNDED."""
    for name, value in values.items():
        if name in UNBOUNDED:
            check_number(rule, name, value, ">= 0", lambda v: v >= 0)
        else:
            check_number(rule, name, value, ">= 0 and finite", lambda v: 0 <= v < math.inf)


def check_beta(rule, beta, name="beta"):
    """`beta` a pair of numbers in [0, 1)."""
    requirement = "two numbers in [0, 1)"
    beta = weakened(rule, name, beta)
    if not (isinstance(beta, (tuple, list)) and len(beta) == 2):
        raise _error(TypeError, rule, name, beta, requirement + " (a tuple)")
    if not all(_is_number(b) for b in beta):
        raise _error(TypeError, rule, name, beta, requirement)
    if not all(0 <= b < 1 for b in beta):
        raise _error(ValueError, rule, name, beta, requirement)


def check_fraction(rule, name, value):
    check_number(rule, name, value, "in [0, 1)", lambda v: 0 <= v < 1)


def check_flags(rule, **values):
    for name, value in values.items():
        if not isinstance(value, (bool, np.bool_)):
            raise _error(TypeError, rule, name, value, "True or False")


def ascent(rule, dx):
    """`dx`, negated where the rule has `maximize=True` (PyTorch's option: the parameters climb
    the objective)."""
    return -dx if rule.maximize else dx


@dataclass(frozen=True)
class Descent(Rule):
    """Gradient descent: `x -= eta * dx`. PyTorch's `SGD(lr=eta)` (whose default lr is 1e-3;
    Flux's is 0.1); `maximize=True` as PyTorch's."""

    eta: float = 0.1
    maximize: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta)
        check_flags(self, maximize=self.maximize)

    def apply(self, state, x, dx):
        return state, ascent(self, dx) * self.eta


@dataclass(frozen=True)
class Momentum(Rule):
    """Gradient descent with momentum: `v = rho * v + eta * dx; x -= v`. PyTorch's
    `SGD(lr=eta, momentum=rho)` while `eta` is constant (PyTorch keeps the rate out of `v`: use
    `SGD` for a scheduled rate, or `dampening`); `maximize=True` as PyTorch's."""

    eta: float = 0.01
    rho: float = 0.9
    maximize: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, rho=self.rho)
        check_flags(self, maximize=self.maximize)

    def init(self, x):
        return namespace_of(x).zeros_like(x)

    def apply(self, state, x, dx):
        velocity = state * self.rho
        velocity += ascent(self, dx) * self.eta
        return velocity, velocity


@dataclass(frozen=True)
class Nesterov(Rule):
    """Nesterov momentum, in the form of Optimisers.jl (Bengio et al. 2012):
    `x -= -rho**2 * v + (1 + rho) * eta * dx; v = rho * v - eta * dx`. PyTorch's
    `SGD(lr=eta, momentum=rho, nesterov=True)` is written differently: use `SGD(...,
    nesterov=True)` for it. `maximize=True` as PyTorch's."""

    eta: float = 0.001
    rho: float = 0.9
    maximize: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, rho=self.rho)
        check_flags(self, maximize=self.maximize)

    def init(self, x):
        return namespace_of(x).zeros_like(x)

    def apply(self, state, x, dx):
        rho, eta, dx = self.rho, self.eta, ascent(self, dx)
        delta = dx * ((1 + rho) * eta) - state * rho**2
        return state * rho - dx * eta, delta


@dataclass(frozen=True)
class SGD(Rule):
    """PyTorch's `SGD`, option for option, with its defaults: `b = rho * b + (1 - dampening) *
    g` (`b = g` at the first step), `g = dx + weight_decay * x` (negated first with
    `maximize`), then `x -= eta * (g + rho * b)` with `nesterov`, else `x -= eta * b`; with
    `rho = 0` (no momentum), `x -= eta * g`. `SGD(lr, momentum, dampening, weight_decay,
    nesterov, maximize=...)` in PyTorch is `SGD(eta=lr, rho=momentum, ...)` here. Unlike
    `Momentum` the rate stays out of the buffer, so a scheduled rate acts as in PyTorch. The
    state is `(b, damping of the coming step)` (0 at the first), None without momentum.

    >>> import numpy as np
    >>> rule = SGD(0.1, rho=0.9, dampening=0.5)
    >>> state, delta = rule.apply(rule.init(np.zeros(1)), np.zeros(1), np.ones(1))
    >>> state, delta = rule.apply(state, np.zeros(1), np.ones(1))
    >>> delta
    array([0.14])
    """

    eta: float = 0.001
    rho: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    maximize: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, rho=self.rho, weight_decay=self.weight_decay)
        check_number(self, "dampening", self.dampening, "in [0, 1]", lambda v: 0 <= v <= 1)
        check_flags(self, nesterov=self.nesterov, maximize=self.maximize)
        if self.nesterov and (not self.rho or self.dampening):
            raise ValueError(
                f"SGD: nesterov=True needs a momentum rho > 0 and no dampening (as PyTorch), "
                f"got rho={self.rho!r}, dampening={self.dampening!r}"
            )

    def init(self, x):
        return (namespace_of(x).zeros_like(x), 0.0) if self.rho else None

    def apply(self, state, x, dx):
        g = ascent(self, dx)
        if self.weight_decay:
            g = g + x * self.weight_decay
        if state is None:
            return state, g * self.eta
        buffer, damping = state
        new = buffer * self.rho
        new += g * _weak(1 - damping, g)
        step = g + new * self.rho if self.nesterov else new
        return (new, _constant(damping, self.dampening)), step * self.eta


def _weak(value, like):
    """A scalar of a step as the arrays take it: a Python float as it is, a 0-d array (a
    count under tg.compile, float64) cast to `like`'s dtype."""
    return value if type(value) in (int, float) else astype(value, like.dtype)


def _constant(old, value):
    """`value` as the state's number `old` is held: a Python float, or (under tg.compile) a
    0-d float64 array, so that a replay reads it as an input."""
    return float(value) if type(old) in (int, float) else old * 0 + value


@dataclass(frozen=True)
class WeightDecay(Rule):
    """Adds `weight_decay * x` to the gradient (L2 regularisation); put it before the step.
    PyTorch's `weight_decay=wd` of Adam, NAdam, RAdam, Adamax, Adadelta, Adagrad and RMSprop is
    `OptimiserChain(WeightDecay(wd), rule)`. A rule with `maximize=True` negates the decayed
    gradient, where PyTorch decays after negating: for that, use `SGD`'s own `weight_decay`, or
    minimise the negated objective."""

    weight_decay: float = 5e-4

    def __post_init__(self):
        check_nonnegative(self, weight_decay=self.weight_decay)

    def apply(self, state, x, dx):
        return state, dx + x * self.weight_decay


@dataclass(frozen=True)
class SignDecay(Rule):
    """Adds `kappa * sign(x)` to the gradient (L1 regularisation, the LASSO penalty's
    subgradient, Optimisers.jl's `SignDecay`); put it before the step."""

    kappa: float = 1e-3

    def __post_init__(self):
        check_nonnegative(self, kappa=self.kappa)

    def apply(self, state, x, dx):
        return state, dx + namespace_of(x).sign(x) * self.kappa


@dataclass(frozen=True)
class ClipGrad(Rule):
    """Clamps every element of the gradient to `[-delta, delta]`."""

    delta: float = 10.0

    def __post_init__(self):
        check_nonnegative(self, delta=self.delta)

    def apply(self, state, x, dx):
        return state, namespace_of(dx).clip(dx, -self.delta, self.delta)


@dataclass(frozen=True)
class ClipNorm(Rule):
    """Scales each gradient array whose `p`-norm exceeds `omega` down to norm `omega` (per
    array, as Optimisers.jl). With `throw=True`, a norm that is infinite or NaN raises."""

    omega: float = 10.0
    p: float = 2.0
    throw: bool = True

    def __post_init__(self):
        check_nonnegative(self, omega=self.omega)
        check_number(self, "p", self.p, "> 0 (inf for the largest element)", lambda v: v > 0)
        check_flags(self, throw=self.throw)

    def apply(self, state, x, dx):
        if self.throw:  # one function, so that tg.compile replays the check as it is
            return state, _clipped(dx, omega=self.omega, p=self.p)
        xp = namespace_of(dx)
        norm = xp.linalg.vector_norm(dx, ord=self.p)
        return state, dx * xp.clip(self.omega / norm, max=1.0)


def _clipped_forward(xp, dx, *, omega, p):
    """ClipNorm(throw=True)'s step: `dx` scaled down to norm `omega`, the norm read back as a
    Python float (as Optimisers.jl); a norm that is not finite raises."""
    value = float(xp.linalg.vector_norm(dx, ord=p))
    if not math.isfinite(value):
        raise FloatingPointError(
            f"ClipNorm: the gradient of an array of shape {tuple(dx.shape)} has {p}-norm "
            f"{value}; look for a NaN or infinite loss (ClipNorm(throw=False) skips this)"
        )
    return dx * (omega / value) if value > omega else dx


_clipped = no_gradient("clipnorm", _clipped_forward)


class OptimiserChain(Rule):
    """Rules applied in turn to the gradient: `OptimiserChain(ClipNorm(1.0), Adam(1e-3))`."""

    def __init__(self, *rules):
        for r in rules:
            if not isinstance(r, Rule):
                raise TypeError(f"OptimiserChain takes rules, got {type(r).__name__}")
        self.rules = tuple(rules)

    def init(self, x):
        return tuple(r.init(x) for r in self.rules)

    def apply(self, state, x, dx):
        states = []
        for r, s in zip(self.rules, state):
            s, dx = r.apply(s, x, dx)
            states.append(s)
        return tuple(states), dx

    def adjust(self, **changes):
        return OptimiserChain(*(r.adjust(**changes) for r in self.rules))

    def hyperparameters(self):
        names = [hyperparameters(r) for r in self.rules]
        return None if None in names else frozenset().union(*names)

    def __eq__(self, other):
        return isinstance(other, OptimiserChain) and self.rules == other.rules

    def __hash__(self):
        return hash(self.rules)

    def __repr__(self):
        return f"OptimiserChain({', '.join(map(repr, self.rules))})"


def hyperparameters(rule):
    """The names `rule.adjust` changes; None where the rule does not say (a rule of the user's
    own that does not derive from `Rule`)."""
    names = getattr(rule, "hyperparameters", None)
    return None if names is None else names()
