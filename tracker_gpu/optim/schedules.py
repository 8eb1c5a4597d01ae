"""Learning-rate schedules, and `Scheduled`, the rule that follows one step by step.

A schedule is a function of the step `t` (0 for the first step) to a learning rate: `Step`
(multiplied by `decay` every `every` steps), `Exp` (by `decay` every step) and `Cosine` (a
linear warm-up, then half a cosine down to `eta_min`). `Scheduled(rule, schedule)` sets the
rule's `eta` from the schedule before each step; its state counts the steps a parameter has
taken, so a saved and reloaded state goes on where it stopped.

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
from ..rules.elementwise import astype, cos, minimum, where
from ..tracked import data
from .rules import Descent, OptimiserChain, Rule, check_nonnegative

__all__ = ["Step", "Exp", "Cosine", "Scheduled"]


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
    """A linear warm-up from `eta / warmup` to `eta` over the first `warmup` steps, then half a
    cosine from `eta` down to `eta_min` at step `steps` (and `eta_min` after it), as PyTorch's
    cosine annealing after a linear warm-up."""

    eta: float
    steps: int
    warmup: int = 0
    eta_min: float = 0.0

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, eta_min=self.eta_min)
        _check_steps(self, steps=self.steps, warmup=self.warmup)
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
    hyperparameters; the schedule keeps setting the rate."""

    rule: Rule = Descent()
    schedule: object = Exp(0.1)
    field: str = "eta"

    def __post_init__(self):
        if not isinstance(self.rule, Rule):
            raise TypeError(f"Scheduled needs a rule to schedule, got {self.rule!r}")
        if not callable(self.schedule):
            raise TypeError(
                f"Scheduled needs a schedule (a function of the step), got {self.schedule!r}"
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
        inner = self.rule.init(x)
        return (0 if _holds_array(inner) else _zero_count(x), inner)

    def apply(self, state, x, dx):
        t, inner = state
        inner, delta = self.at(t, like=dx).apply(inner, x, dx)
        return (next_count(t), inner), delta

    def adjust(self, **changes):
        changes.pop(self.field, None)
        return Scheduled(self.rule.adjust(**changes), self.schedule, self.field)


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
