"""Learning-rate schedules, and `Scheduled`, the rule that follows one step by step.

A schedule is a function of the step `t` (0 for the first step) to a learning rate: `Step`
(multiplied by `decay` every `every` steps), `Exp` (by `decay` every step), `Cosine` (a
linear warm-up, then half a cosine down to `eta_min`), `CosineRestarts` (cosines that start
again, each `mult` times longer), `OneCycle` (up to `eta`, then down far below the start),
`Linear` and `Polynomial` decay. Each matches one of `torch.optim.lr_scheduler`'s (see its
docstring); a rate that follows a validation metric is `ReduceLROnPlateau` (`plateau`).
`Scheduled(rule, schedule)` sets the rule's `eta` from the schedule before each step; its state
counts the steps a parameter has taken, so a saved and reloaded state goes on where it stopped.

>>> [round(Cosine(1.0, steps=5, warmup=1)(t), 3) for t in range(6)]
[1.0, 1.0, 0.854, 0.5, 0.146, 0.0]
>>> import numpy as np
>>> rule = Scheduled(Descent(), Exp(0.1, decay=0.5))
>>> state = rule.init(np.zeros(1))
>>> for _ in range(3):
...     state, delta = rule.apply(state, np.zeros(1), np.ones(1))
>>> float(delta[0]), int(state[0])
(0.025, 3)
"""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..backend import device_of, is_array, namespace_of
from ..rules.elementwise import PLAIN_FUNCTIONS, astype, cos, floor_divide, log, minimum, where
from ..tracked import data
from .rules import (
    Descent,
    OptimiserChain,
    Rule,
    check_flags,
    check_nonnegative,
    check_number,
    hyperparameters,
)

__all__ = [
    "Step",
    "Exp",
    "Cosine",
    "CosineRestarts",
    "OneCycle",
    "Linear",
    "Polynomial",
    "Scheduled",
]


def _check_steps(schedule, **values):
    for name, value in values.items():
        if not (isinstance(value, int) and value >= 0):
            raise ValueError(
                f"{type(schedule).__name__}: {name} must be an int >= 0, got {value!r}"
            )


@dataclass(frozen=True)
class Step:
    """`eta * decay ** (t // every)`: the rate multiplied by `decay` every `every` steps."""

    eta: float
    decay: float = 0.5
    every: int = 1000

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, decay=self.decay)
        _check_steps(self, every=self.every)
        if self.every == 0:
            raise ValueError("Step: every must be at least 1 step")

    def __call__(self, t):
        return self.eta * self.decay ** (t // self.every)


@dataclass(frozen=True)
class Exp:
    """`eta * decay ** t`: the rate multiplied by `decay` at every step."""

    eta: float
    decay: float = 0.999

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, decay=self.decay)

    def __call__(self, t):
        return self.eta * self.decay**t


@dataclass(frozen=True)
class Cosine:
    """A linear warm-up, `eta * (t + 1) / warmup` at step `t` (`eta` at the warm-up's last
    step, `warmup - 1`), then half a cosine from `eta` at step `warmup` down to `eta_min` at
    step `steps` (and `eta_min` after it): PyTorch's `CosineAnnealingLR(T_max=steps -
    warmup)` after `LinearLR(start_factor=1 / warmup, total_iters=warmup - 1)`."""

    eta: float
    steps: int
    warmup: int = 0
    eta_min: float = 0.0

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, eta_min=self.eta_min)
        _check_steps(self, steps=self.steps, warmup=self.warmup)
        _check_positive_steps(self, steps=self.steps)  # 0: eta_min from the second step on
        if self.warmup > self.steps:
            raise ValueError(
                f"Cosine: the warm-up ({self.warmup} steps) is longer than the schedule "
                f"({self.steps} steps); make steps the whole run's length"
            )

    def __call__(self, t):
        if type(t) not in (int, float):  # a count in an array (NumPy's scalars too)
            return self._traced(t)
        if t < self.warmup:
            return self.eta * (t + 1) / self.warmup
        progress = min(1.0, (t - self.warmup) / max(self.steps - self.warmup, 1))
        return self.eta_min + (self.eta - self.eta_min) * 0.5 * (1 + math.cos(math.pi * progress))

    def _traced(self, t):
        """The rate at a step count held in a 0-d array (as `Scheduled` keeps it, and
        tg.compile traces it): the same formula, without a Python branch."""
        progress = minimum((t - self.warmup) / max(self.steps - self.warmup, 1), 1.0)
        rate = self.eta_min + (self.eta - self.eta_min) * 0.5 * (1 + cos(progress * math.pi))
        if not self.warmup:
            return rate
        return where(t < self.warmup, self.eta * (t + 1) / self.warmup, rate)


# --- the schedules below take a step count as a Python number (eagerly) or in a 0-d array
# (under tg.compile), through these few functions, with the same arithmetic either way
def _plain(t):
    return type(t) in (int, float)


def _cos(x):
    return math.cos(x) if _plain(x) else cos(x)


def _least(x, y):
    return min(x, y) if _plain(x) else minimum(x, y)


def _choose(condition, chosen, otherwise):
    """`chosen()` if `condition`, else `otherwise`; elementwise for a condition in an array."""
    if isinstance(condition, (bool, np.bool_)):
        return chosen() if condition else otherwise
    return where(condition, chosen(), otherwise)


def _half_cosine(start, end, progress):
    """From `start` (progress 0) to `end` (progress 1) along half a cosine, as PyTorch's."""
    return end + (start - end) / 2 * (_cos(math.pi * progress) + 1)


def _check_positive_steps(schedule, **values):
    _check_steps(schedule, **values)
    for name, value in values.items():
        if value == 0:
            raise ValueError(f"{type(schedule).__name__}: {name} must be at least 1 step, got 0")


@dataclass(frozen=True)
class CosineRestarts:
    """Half cosines from `eta` down to `eta_min`, starting again after `period` steps, each
    next one `mult` times longer (SGDR, Loshchilov & Hutter 2017). PyTorch's
    `CosineAnnealingWarmRestarts(T_0=period, T_mult=mult, eta_min=eta_min)` for an optimiser
    of lr `eta`.

    >>> [round(CosineRestarts(1.0, period=2)(t), 3) for t in range(5)]
    [1.0, 0.5, 1.0, 0.5, 1.0]
    """

    eta: float
    period: int
    mult: int = 1
    eta_min: float = 0.0

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, eta_min=self.eta_min)
        _check_positive_steps(self, period=self.period, mult=self.mult)

    def __call__(self, t):
        done, length = self._cycle(t) if _plain(t) else self._traced_cycle(t)
        return _half_cosine(self.eta, self.eta_min, (t - done) / length)

    def _cycle(self, t):
        """(the step where the current cosine started, its length), in integers."""
        done, length = 0, self.period
        while t - done >= length:
            done, length = done + length, length * self.mult
        return done, length

    def _traced_cycle(self, t):
        period, mult = self.period, self.mult
        if mult == 1:
            return floor_divide(t, period) * period, period
        start = lambda n: (mult**n - 1) * period / (mult - 1)  # noqa: E731, exact in float64
        n = PLAIN_FUNCTIONS["floor"](log(t * (mult - 1) / period + 1) / math.log(mult))
        n = where(start(n) > t, n - 1, n)  # the logarithm's rounding, undone
        n = where(start(n + 1) <= t, n + 1, n)
        return start(n), period * mult**n


@dataclass(frozen=True)
class OneCycle:
    """The one-cycle policy (Smith & Topin 2019): from `eta / div_factor` up to `eta` over the
    first `warmup` fraction of `steps`, then down to `eta / div_factor / final_div_factor` at
    the last step; `three_phase=True` comes back to the start before going down, and
    `anneal="linear"` goes in straight lines instead of half cosines. PyTorch's
    `OneCycleLR(max_lr=eta, total_steps=steps, pct_start=warmup, anneal_strategy=anneal,
    div_factor=..., final_div_factor=..., three_phase=..., cycle_momentum=False)`: this sets
    the rate only (PyTorch also cycles the momentum by default). After `steps` steps the rate
    stays at its last value, where PyTorch raises.

    >>> [round(OneCycle(1.0, steps=5, warmup=0.4, div_factor=10)(t), 4) for t in range(5)]
    [0.1, 1.0, 0.75, 0.25, 0.0]
    """

    eta: float
    steps: int
    warmup: float = 0.3
    div_factor: float = 25.0
    final_div_factor: float = 1e4
    anneal: str = "cos"
    three_phase: bool = False

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta)
        check_number(self, "warmup", self.warmup, "in (0, 1)", lambda v: 0 < v < 1)
        for name in ("div_factor", "final_div_factor"):
            check_number(self, name, getattr(self, name), "> 0 and finite",
                         lambda v: 0 < v < math.inf)  # fmt: skip
        _check_positive_steps(self, steps=self.steps)
        check_flags(self, three_phase=self.three_phase)
        if self.anneal not in ("cos", "linear"):
            raise ValueError(f"OneCycle: anneal must be 'cos' or 'linear', got {self.anneal!r}")
        if self.warmup * self.steps - 1 <= 0 or self.steps < 2 + 2 * self.three_phase:
            raise ValueError(
                f"OneCycle: {self.steps} steps with warmup {self.warmup} leave no warm-up "
                "phase; give more steps or a larger warmup"
            )

    def _phases(self):
        """(first step, last step, rate at the first, rate at the last) of each phase."""
        start, top = self.eta / self.div_factor, self.eta
        bottom = start / self.final_div_factor
        rise, last = self.warmup * self.steps - 1, self.steps - 1
        if self.three_phase:
            fall = 2 * self.warmup * self.steps - 2
            return [(0, rise, start, top), (rise, fall, top, start), (fall, last, start, bottom)]
        return [(0, rise, start, top), (rise, last, top, bottom)]

    def __call__(self, t):
        phases = self._phases()

        def at(phase):
            first, last, begin, end = phase
            progress = _least((t - first) / (last - first), 1.0)
            if self.anneal == "linear":
                return (end - begin) * progress + begin
            return _half_cosine(begin, end, progress)

        rate = at(phases[-1])
        for phase in reversed(phases[:-1]):
            rate = _choose(t <= phase[1], lambda phase=phase: at(phase), rate)
        return rate


@dataclass(frozen=True)
class Linear:
    """From `eta` at step 0 to `eta_end` at step `steps` in a straight line, then `eta_end`:
    a linear decay (or warm-up, with `eta_end > eta`). PyTorch's `LinearLR(start_factor=1,
    end_factor=eta_end / eta, total_iters=steps)` for an optimiser of lr `eta`.

    >>> [Linear(1.0, steps=4)(t) for t in range(6)]
    [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    """

    eta: float
    steps: int
    eta_end: float = 0.0

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, eta_end=self.eta_end)
        _check_positive_steps(self, steps=self.steps)

    def __call__(self, t):
        return self.eta + (self.eta_end - self.eta) * (_least(t, self.steps) / self.steps)


@dataclass(frozen=True)
class Polynomial:
    """`eta_min + (eta - eta_min) * (1 - t / steps) ** power` up to step `steps`, then
    `eta_min`: a polynomial decay. PyTorch's `PolynomialLR(total_iters=steps, power=power)` for
    an optimiser of lr `eta` (which decays to 0: `eta_min=0`).

    >>> [Polynomial(1.0, steps=4, power=2.0)(t) for t in range(5)]
    [1.0, 0.5625, 0.25, 0.0625, 0.0]
    """

    eta: float
    steps: int
    power: float = 1.0
    eta_min: float = 0.0

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, power=self.power, eta_min=self.eta_min)
        _check_positive_steps(self, steps=self.steps)

    def __call__(self, t):
        left = (1 - _least(t, self.steps) / self.steps) ** self.power
        return self.eta_min + (self.eta - self.eta_min) * left


def _field_names(rule):
    """The hyperparameters of a rule (of every rule of a chain), or None if unknown."""
    if isinstance(rule, OptimiserChain):
        found = [_field_names(r) for r in rule.rules]
        return None if None in found else set().union(*found)
    if isinstance(rule, Scheduled):  # its own schedule sets its field; the rest pass on
        return None
    if dataclasses.is_dataclass(rule):
        return {f.name for f in dataclasses.fields(rule)}
    return None


@dataclass(frozen=True)
class Scheduled(Rule):
    """`rule` with its learning rate (the field `field`, `eta` by default) set by `schedule(t)`
    at each step `t`. The state is `(t, state of rule)`. `adjust` changes the rule's other
    hyperparameters; the schedule keeps setting the rate (adjusting the rate itself raises)."""

    rule: Rule = Descent()
    schedule: object = Exp(0.1)
    field: str = "eta"

    def __post_init__(self):
        if not isinstance(self.rule, Rule):
            raise TypeError(f"Scheduled needs a rule to schedule, got {self.rule!r}")
        if not callable(self.schedule) or isinstance(self.schedule, type):
            made = (
                f" (make one: {self.schedule.__name__}(...))"
                if isinstance(self.schedule, type)
                else ""
            )
            raise TypeError(
                f"Scheduled needs a schedule (a function of the step), got {self.schedule!r}{made}"
            )
        names = _field_names(self.rule)
        if names is not None and self.field not in names:
            raise ValueError(
                f"Scheduled: field {self.field!r} is not a hyperparameter of "
                f"{type(self.rule).__name__} (it has {', '.join(sorted(names))}); the schedule "
                "sets the field named so, usually eta"
            )

    def at(self, t, like=None):
        """The rule as it runs at step `t`. A step count held in a 0-d array (as tg.compile
        gives it, so that a replay reads it) gives a rate in an array, cast to the dtype of the
        array `like`, as a Python number would be."""
        rate = self.schedule(t)
        if like is None:
            return self.rule.adjust(**{self.field: rate})
        if type(rate) in (int, float):
            rate = _rounded(rate, like.dtype)
        else:  # an array (a count under tg.compile), or NumPy's scalar
            rate = astype(rate, like.dtype)
        return self.rule.adjust(**{self.field: rate})

    def init(self, x):
        inner = self.at(0).init(x)  # as the rule starts (Rprop's step sizes start at its rate)
        return (0 if _holds_array(inner) else _zero_count(x), inner)

    def apply(self, state, x, dx):
        t, inner = state
        inner, delta = self.at(t, like=dx).apply(inner, x, dx)
        return (next_count(t), inner), delta

    def adjust(self, **changes):
        if self.field in changes:
            raise ValueError(
                f"adjust: {self.field} of Scheduled({type(self.rule).__name__}) is set by its "
                f"schedule at every step, so {self.field}={changes[self.field]!r} would change "
                "nothing; set up the state with a new Scheduled (or another schedule) instead"
            )
        return Scheduled(self.rule.adjust(**changes), self.schedule, self.field)

    def hyperparameters(self):
        inner = hyperparameters(self.rule)
        return None if inner is None else inner | {self.field}


def _rounded(rate, dtype):
    """A Python float rate rounded to the parameters' floating dtype, as a Python float: the
    value a replay's rate (a 0-d array cast to that dtype) has, so that a compiled step is the
    eager step bit for bit, and it stays a weakly typed number. Dtypes NumPy does not know
    (bfloat16) are left alone."""
    try:
        return float(np.asarray(rate, dtype=str(dtype).rpartition(".")[2]))
    except (TypeError, ValueError):
        return rate


def next_count(t):
    """The count after `t`, kept in an array where it was one (NumPy's 0-d arithmetic gives
    a scalar)."""
    t = t + 1
    return np.asarray(t) if isinstance(t, np.generic) else t


def _holds_array(state):
    if type(state) is tuple or type(state) is list:
        return any(_holds_array(part) for part in state)
    return is_array(state)


def _zero_count(x):
    """A step count of 0 in a 0-d float64 array beside `x`: for a rule whose state holds no
    array (Descent's), so that tg.compile reads the count as an input and replays one
    recording for every step, as it does for the counts beside Adam's moments."""
    x = data(x)
    xp = namespace_of(x)
    return xp.zeros((), dtype=xp.float64, device=device_of(x))
