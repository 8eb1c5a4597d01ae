"""L-BFGS: a quasi-Newton method that evaluates the loss several times per step, so that it
takes the loss function rather than a gradient (PyTorch's `LBFGS.step(closure)`).

    state = setup(LBFGS(history=10), model)
    for _ in range(steps):
        state, model, loss = lbfgs_step(state, model, lambda m: loss_of(m, x, y))

The function takes the model and returns the loss (a 0-d tracked array); `lbfgs_step`
differentiates it with `withgradient` as often as it needs, where PyTorch's closure zeroes the
gradients and calls `backward` itself. The loss returned is the one before the step, as
PyTorch's. The history of curvature pairs is shared by all the parameters (one vector, as in
PyTorch), kept in `LBFGSState`. The step reads numbers back (its stopping tests), so it runs
eagerly: it is not for `tg.compile`, and its state is not saved by `save_checkpoint` (start it
again after a resume: the history fills again in `history` steps).

>>> import numpy as np, tracker_gpu as tg
>>> model = {"x": np.array([3.0, -1.0])}
>>> state = lbfgs_setup(LBFGS(), model)               # or optim.setup
>>> state, model, loss = lbfgs_step(state, model, lambda m: tg.sum((m["x"] - 1.0) ** 2))
>>> np.round(model["x"], 6), float(loss)
(array([1., 1.]), 8.0)
"""

from dataclasses import dataclass
from typing import ClassVar

from ..backend import namespace_of
from ..tracked import data
from .rules import Descent, check_nonnegative
from .state import Leaf, setup
from .tree import tree_map_with_path

__all__ = ["LBFGS", "LBFGSState", "lbfgs_step"]


@dataclass(frozen=True)
class LBFGS:
    """L-BFGS without a line search: each step of length `eta` along the direction from the
    last `history` curvature pairs (the first scaled to at most 1 by the gradient's 1-norm),
    up to `max_iter` of them per call and `max_eval` evaluations of the loss (5/4 of
    `max_iter` by default), stopping when the gradient's largest element is at most
    `tolerance_grad` or the step or the loss changes by less than `tolerance_change`.
    PyTorch's `LBFGS(params, lr=eta, max_iter, max_eval, tolerance_grad, tolerance_change,
    history_size=history, line_search_fn=None)`, same defaults; PyTorch's `step(closure)` is
    `lbfgs_step(state, model, loss)` here. Its `line_search_fn="strong_wolfe"` is not here."""

    eta: float = 1.0
    max_iter: int = 20
    max_eval: object = None
    tolerance_grad: float = 1e-7
    tolerance_change: float = 1e-9
    history: int = 100

    def __post_init__(self):
        check_nonnegative(self, eta=self.eta, tolerance_grad=self.tolerance_grad,
                          tolerance_change=self.tolerance_change)  # fmt: skip
        for name in ("max_iter", "history") + (("max_eval",) if self.max_eval is not None else ()):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"LBFGS: {name} must be an int >= 1, got {value!r}")

    def own_state(self, model):
        """The state for `model` (what `setup(LBFGS(), model)` returns)."""
        return lbfgs_setup(self, model)

    @property
    def evaluations(self):
        return self.max_iter * 5 // 4 if self.max_eval is None else self.max_eval


@dataclass(frozen=True)
class LBFGSState:
    """The state of `LBFGS` for one model: the marks of its parameters (a `setup` tree), the
    last direction `d` and step length `t`, the curvature pairs `(y, s)` with their `1 / y.s`,
    the diagonal scale `h`, the last gradient and loss, and the counts of iterations and
    evaluations (PyTorch's `state` entries of the same names)."""

    refused_by_update: ClassVar[str] = (
        "this is the state of LBFGS, which evaluates the loss several times per step: call "
        "state, model, loss = lbfgs_step(state, model, loss_function)"
    )

    rule: LBFGS
    marks: object
    d: tuple = None
    t: float = None
    dirs: tuple = ()
    steps: tuple = ()
    rho: tuple = ()
    h: float = 1.0
    last_grad: tuple = None
    last_loss: float = None
    n_iter: int = 0
    func_evals: int = 0


def lbfgs_setup(rule, model):
    """The state of `rule` (an `LBFGS`) for `model`; `setup(rule, model)` calls this."""
    return LBFGSState(rule, setup(Descent(0.0), model))


# --- the parameters and gradients as lists of arrays, in the order of the model's leaves
def _is_mark(x):
    return type(x) is Leaf


def _gather(marks, tree, like=None):
    """The arrays of `tree` at the marked places, each tie once; zeros of `like` where `tree`
    has none (a parameter without a gradient)."""
    found, seen = [], set()

    def visit(path, mark, x):
        if _is_mark(mark) and id(mark) not in seen:
            seen.add(id(mark))
            found.append(x)
        return mark

    tree_map_with_path(visit, marks, tree, is_leaf=_is_mark)
    if like is not None:
        found = [namespace_of(p).zeros_like(p) if g is None else g for g, p in zip(found, like)]
    return [data(x) for x in found]


def _scatter(marks, model, arrays):
    """`model` with the marked arrays replaced by `arrays` (in `_gather`'s order)."""
    index = {}

    def put(path, mark, x):
        if not _is_mark(mark):
            return x
        return arrays[index.setdefault(id(mark), len(index))]

    return tree_map_with_path(put, marks, model, is_leaf=_is_mark)


def _dot(a, b):
    return sum(float(namespace_of(u).sum(u * v)) for u, v in zip(a, b))


def _add(a, scale, b):
    return [u + v * scale for u, v in zip(a, b)]


def _scale(a, scale):
    return [u * scale for u in a]


def _abs_max(a):
    return max(float(namespace_of(u).max(namespace_of(u).abs(u))) for u in a if u.size)


def _abs_sum(a):
    return sum(float(namespace_of(u).sum(namespace_of(u).abs(u))) for u in a)


def _check_shapes(params, grads):
    """The model's parameters are shaped as those the state's history was made of."""
    for i, (p, g) in enumerate(zip(params, grads)):
        if tuple(p.shape) != tuple(g.shape):
            raise ValueError(
                f"lbfgs_step: the state was made for another model: its parameter {i} had "
                f"shape {tuple(g.shape)}, this model's has {tuple(p.shape)}; make the state "
                "with setup(LBFGS(), model) for this model"
            )


# --- the step
def lbfgs_step(state, model, loss):
    """`(state, model, loss)` after one call of L-BFGS (up to `max_iter` iterations) on
    `loss(model)`, a function returning a 0-d tracked array; `loss` is the value before the
    step."""
    if not isinstance(state, LBFGSState):
        raise TypeError(
            f"lbfgs_step takes the state of setup(LBFGS(), model), got a {type(state).__name__}"
        )
    if not callable(loss):
        raise TypeError(
            "lbfgs_step takes the loss as a function of the model (it evaluates it several "
            f"times), got a {type(loss).__name__}; pass lambda m: loss_of(m, x, y)"
        )
    return _Run(state, model, loss).run()


class _Run:
    """One call of `lbfgs_step`, line for line PyTorch's `LBFGS.step` without a line search:
    the fields of `LBFGSState` as attributes, updated as it goes."""

    def __init__(self, state, model, loss):
        self.state, self.model, self.loss = state, model, loss
        self.rule, self.marks = state.rule, state.marks
        self.__dict__.update({k: getattr(state, k) for k in _KEPT})
        self.params = _gather(state.marks, model)
        if self.last_grad is not None:
            _check_shapes(self.params, self.last_grad)

    def evaluate(self):
        """The loss at the current parameters and its gradient; one more evaluation."""
        from ..api import withgradient

        value, (grads,) = withgradient(self.loss, _scatter(self.marks, self.model, self.params))
        self.func_evals += 1
        if isinstance(value, tuple):  # (loss, aux...), as gradient takes it: the loss
            value = value[0]
        return value, _gather(self.marks, grads, like=self.params)

    def run(self):
        rule = self.rule
        first, g = self.evaluate()
        loss, evals = float(data(first)), 1
        if _abs_max(g) <= rule.tolerance_grad:
            return self.result(first)
        for k in range(1, rule.max_iter + 1):
            self.n_iter += 1
            self.d = _scale(g, -1.0) if self.n_iter == 1 else self.direction(g)
            self.last_grad, self.last_loss = g, loss
            t = min(1.0, 1.0 / _abs_sum(g)) * rule.eta if self.n_iter == 1 else rule.eta
            self.t = t
            if _dot(g, self.d) > -rule.tolerance_change:
                break
            self.params = _add(self.params, t, self.d)
            if k == rule.max_iter:
                break
            value, g = self.evaluate()
            loss, evals = float(data(value)), evals + 1
            if evals >= rule.evaluations or _abs_max(g) <= rule.tolerance_grad:
                break
            if _abs_max(_scale(self.d, t)) <= rule.tolerance_change:
                break
            if abs(loss - self.last_loss) < rule.tolerance_change:
                break
        return self.result(first)

    def direction(self, g):
        """The history updated with the last step's curvature pair, and the new direction."""
        y, step = _add(g, -1.0, self.last_grad), _scale(self.d, self.t)
        ys = _dot(y, step)
        if ys > 1e-10:  # a pair of positive curvature joins the history
            drop = 1 if len(self.dirs) == self.rule.history else 0
            self.dirs, self.steps = self.dirs[drop:] + (y,), self.steps[drop:] + (step,)
            self.rho, self.h = self.rho[drop:] + (1.0 / ys,), ys / _dot(y, y)
        return _direction(g, self.dirs, self.steps, self.rho, self.h)

    def result(self, first):
        kept = {k: getattr(self, k) for k in _KEPT}
        state = LBFGSState(self.rule, self.marks, **kept)
        return state, _scatter(self.marks, self.model, self.params), first


_KEPT = "d t dirs steps rho h last_grad last_loss n_iter func_evals".split()


def _direction(g, dirs, steps, rho, h):
    """The two-loop recursion: minus the inverse Hessian estimate times `g`."""
    q, alphas = _scale(g, -1.0), [0.0] * len(dirs)
    for i in reversed(range(len(dirs))):
        alphas[i] = _dot(steps[i], q) * rho[i]
        q = _add(q, -alphas[i], dirs[i])
    r = _scale(q, h)
    for i in range(len(dirs)):
        beta = _dot(dirs[i], r) * rho[i]
        r = _add(r, alphas[i] - beta, steps[i])
    return r
