"""`ReduceLROnPlateau`: a learning rate that follows a validation metric, lowered by `factor`
when the metric has not improved for `patience` evaluations (PyTorch's scheduler of that name).

The rate cannot be a function of the step (it depends on the metric), so it is not a schedule
for `Scheduled`: `watch = plateau.init()` starts it, `watch = plateau.step(watch, metric)`
takes each evaluation, and `adjust(state, eta=watch.eta)` gives the optimiser the rate. The
watch is a named tuple of numbers: keep it in a checkpoint's info (`watch._asdict()`) and
resume with `Plateau(**info["plateau"])`.

>>> plateau = ReduceLROnPlateau(0.1, factor=0.5, patience=1)
>>> watch = plateau.init()
>>> for metric in [1.0, 0.9, 0.95, 0.93, 0.8]:
...     watch = plateau.step(watch, metric)
>>> watch.eta, watch.best
(0.05, 0.8)
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..tracked import data
from .rules import check_fraction, check_nonnegative
from .schedules import _check_steps

__all__ = ["ReduceLROnPlateau", "Plateau"]


class Plateau(NamedTuple):
    """Where a `ReduceLROnPlateau` stands: the rate, the best metric so far, the evaluations
    since it improved, and those left in the cool-down."""

    eta: float
    best: float
    bad: int = 0
    cooldown: int = 0


@dataclass(frozen=True)
class ReduceLROnPlateau:
    """The rate `eta`, multiplied by `factor` (never below `eta_min`, and only by more than
    `eps`) once the metric has not improved for more than `patience` evaluations; then
    `cooldown` evaluations pass before counting again. Improving means below the best so far
    by `threshold` (`mode="min"`; above for `"max"`), relative to it (`threshold_mode="rel"`)
    or absolute (`"abs"`). PyTorch's `ReduceLROnPlateau(optimizer, mode, factor, patience,
    threshold, threshold_mode, cooldown, min_lr=eta_min, eps)`, same defaults, for an
    optimiser of lr `eta`; its `scheduler.step(metric)` is `watch = plateau.step(watch,
    metric)` here, followed by `state = adjust(state, eta=watch.eta)`."""

    eta: float
    factor: float = 0.1
    patience: int = 10
    threshold: float = 1e-4
    mode: str = "min"
    threshold_mode: str = "rel"
    cooldown: int = 0
    eta_min: float = 0.0
    eps: float = 1e-8

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, threshold=self.threshold, eta_min=self.eta_min,
                          eps=self.eps)  # fmt: skip
        check_fraction(self, "factor", self.factor)
        _check_steps(self, patience=self.patience, cooldown=self.cooldown)
        for name, allowed in (("mode", ("min", "max")), ("threshold_mode", ("rel", "abs"))):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"ReduceLROnPlateau: {name} must be {' or '.join(map(repr, allowed))}, "
                    f"got {getattr(self, name)!r}"
                )

    def init(self):
        """The watch before the first evaluation: the rate `eta`, no best metric yet."""
        return Plateau(float(self.eta), math.inf if self.mode == "min" else -math.inf)

    def step(self, watch, metric):
        """The watch after an evaluation that gave `metric` (a number, or a 0-d array, read
        back as a Python float)."""
        if not isinstance(watch, Plateau):
            raise TypeError(
                f"ReduceLROnPlateau.step takes the watch from init() or step(), got {watch!r}"
            )
        try:
            current = float(data(metric))
        except (TypeError, ValueError):
            raise TypeError(
                f"ReduceLROnPlateau.step: the metric must be a number (a validation loss), got "
                f"{metric!r}"
            ) from None
        eta, best, bad, cooldown = watch
        best, bad = (current, 0) if self._better(current, best) else (best, bad + 1)
        if cooldown > 0:
            cooldown, bad = cooldown - 1, 0
        if bad > self.patience:
            lower = max(eta * self.factor, self.eta_min)
            eta = lower if eta - lower > self.eps else eta
            cooldown, bad = self.cooldown, 0
        return Plateau(eta, best, bad, cooldown)

    def _better(self, current, best):
        relative = self.threshold_mode == "rel"
        if self.mode == "min":
            return current < (best * (1 - self.threshold) if relative else best - self.threshold)
        return current > (best * (1 + self.threshold) if relative else best + self.threshold)
