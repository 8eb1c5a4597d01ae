"""Optimisers, the Optimisers.jl way, over any nested structure of arrays of any library.

    state = setup(Adam(1e-3), model)               # a state per parameter, shaped like the model
    state, model = update(state, model, grads)     # after each gradient; nothing is mutated

Rules: `Descent`, `Momentum`, `Nesterov`, `Adam`, `AdamW`, and the gradient transforms
`ClipGrad`, `ClipNorm` and `WeightDecay`, composed by `OptimiserChain` (in order: clip first,
then the step). `adjust(state, eta=...)` changes hyperparameters without losing the state.

A rule is `init(param) -> state` and `apply(state, param, grad) -> (state, delta)`, written with
the Array API on the parameter's own library (`xp = array_namespace(param)`), so it runs where
the parameter lives. Each parameter is updated by one call of `step(rule, param, grad, state)`,
the seam where a fused kernel takes over (registered by rule name in `cuda.dispatch`).

>>> import numpy as np
>>> model = {"w": np.array([1.0, 2.0]), "name": "toy"}
>>> state = setup(Descent(0.1), model)
>>> state, model = update(state, model, {"w": np.array([1.0, -1.0]), "name": None})
>>> model["w"]
array([0.9, 2.1])
"""

import copy
import dataclasses
import math
from dataclasses import dataclass

from .backend import is_array, namespace_of
from .cuda import dispatch
from .tracked import data

__all__ = [
    "Rule",
    "Descent",
    "Momentum",
    "Nesterov",
    "Adam",
    "AdamW",
    "ClipGrad",
    "ClipNorm",
    "WeightDecay",
    "OptimiserChain",
    "Leaf",
    "setup",
    "update",
    "adjust",
    "step",
    "tree_map_with_path",
]


# --- the rules
class Rule:
    """An optimisation rule: `init(x)` makes a parameter's state, `apply(state, x, dx)` returns
    the new state and the step `delta` (the parameter becomes `x - delta`)."""

    def init(self, x):
        return None

    def apply(self, state, x, dx):
        raise NotImplementedError

    def adjust(self, **changes):
        """A copy with the given hyperparameters changed (those it does not have are ignored)."""
        names = {f.name for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if k in names})


def _check_nonnegative(rule, **values):
    for name, value in values.items():
        if not value >= 0:
            raise ValueError(f"{type(rule).__name__}: {name} must be >= 0, got {value!r}")


def _check_beta(rule, beta):
    if len(beta) != 2 or not all(0 <= b < 1 for b in beta):
        raise ValueError(f"{type(rule).__name__}: beta must be two numbers in [0, 1), got {beta!r}")


@dataclass(frozen=True)
class Descent(Rule):
    """Gradient descent: `x -= eta * dx`."""

    eta: float = 0.1

    def __post_init__(self):
        _check_nonnegative(self, eta=self.eta)

    def apply(self, state, x, dx):
        return state, dx * self.eta


@dataclass(frozen=True)
class Momentum(Rule):
    """Gradient descent with momentum: `v = rho * v + eta * dx; x -= v`."""

    eta: float = 0.01
    rho: float = 0.9

    def __post_init__(self):
        _check_nonnegative(self, eta=self.eta, rho=self.rho)

    def init(self, x):
        return namespace_of(x).zeros_like(x)

    def apply(self, state, x, dx):
        velocity = state * self.rho
        velocity += dx * self.eta
        return velocity, velocity


@dataclass(frozen=True)
class Nesterov(Rule):
    """Nesterov momentum, in the form of Optimisers.jl (Bengio et al. 2012):
    `x -= -rho**2 * v + (1 + rho) * eta * dx; v = rho * v - eta * dx`."""

    eta: float = 0.001
    rho: float = 0.9

    def __post_init__(self):
        _check_nonnegative(self, eta=self.eta, rho=self.rho)

    def init(self, x):
        return namespace_of(x).zeros_like(x)

    def apply(self, state, x, dx):
        rho, eta = self.rho, self.eta
        delta = dx * ((1 + rho) * eta) - state * rho**2
        return state * rho - dx * eta, delta


def _adam_moments(rule, state, dx):
    """Adam's moments after `dx`, and the direction `m_hat / (sqrt(v_hat) + epsilon)` up to the
    scalar factor returned with it. In-place operators act only on arrays made here, which
    saves allocations (the parameter, the gradient and the old state are never written)."""
    m, v, (beta1_t, beta2_t) = state
    beta1, beta2 = rule.beta
    new_m = dx - m  # m + (1 - beta1) * (dx - m) = beta1 * m + (1 - beta1) * dx
    new_m *= 1 - beta1
    new_m += m
    new_v = dx * dx  # likewise for v and dx**2
    new_v -= v
    new_v *= 1 - beta2
    new_v += v
    # the bias corrections folded into two scalars (Kingma & Ba, end of section 2)
    correction = math.sqrt(1 - beta2_t)
    direction = namespace_of(v).sqrt(new_v)
    direction += rule.epsilon * correction
    direction = new_m / direction
    return (new_m, new_v, (beta1_t * beta1, beta2_t * beta2)), direction, correction / (1 - beta1_t)


@dataclass(frozen=True)
class Adam(Rule):
    """Adam (Kingma & Ba 2015): moments `m`, `v` of the gradient and its square, bias-corrected,
    `x -= eta * m_hat / (sqrt(v_hat) + epsilon)`.

    The state is `(m, v, (beta1**t, beta2**t))` for the coming step `t` (1 at first), as in
    Optimisers.jl; a fused kernel for `step` reads and returns the same.
    """

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8

    def __post_init__(self):
        _check_nonnegative(self, eta=self.eta, epsilon=self.epsilon)
        _check_beta(self, self.beta)

    def init(self, x):
        xp = namespace_of(x)
        return (xp.zeros_like(x), xp.zeros_like(x), tuple(self.beta))

    def apply(self, state, x, dx):
        state, direction, scale = _adam_moments(self, state, dx)
        direction *= self.eta * scale
        return state, direction


@dataclass(frozen=True)
class AdamW(Rule):
    """Adam with weight decay `weight_decay` (Loshchilov & Hutter 2019). With `couple=True` (as
    PyTorch and Optimisers.jl) `x -= eta * (adam + weight_decay * x)`; with `couple=False`
    `x -= eta * adam + weight_decay * x`."""

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    weight_decay: float = 0.0
    epsilon: float = 1e-8
    couple: bool = True

    def __post_init__(self):
        _check_nonnegative(self, eta=self.eta, epsilon=self.epsilon, weight_decay=self.weight_decay)
        _check_beta(self, self.beta)

    def init(self, x):
        xp = namespace_of(x)
        return (xp.zeros_like(x), xp.zeros_like(x), tuple(self.beta))

    def apply(self, state, x, dx):
        state, direction, scale = _adam_moments(self, state, dx)
        delta = direction * scale
        if self.couple:
            return state, (delta + x * self.weight_decay) * self.eta
        return state, delta * self.eta + x * self.weight_decay


@dataclass(frozen=True)
class WeightDecay(Rule):
    """Adds `weight_decay * x` to the gradient (L2 regularisation); put it before the step."""

    weight_decay: float = 5e-4

    def __post_init__(self):
        _check_nonnegative(self, weight_decay=self.weight_decay)

    def apply(self, state, x, dx):
        return state, dx + x * self.weight_decay


@dataclass(frozen=True)
class ClipGrad(Rule):
    """Clamps every element of the gradient to `[-delta, delta]`."""

    delta: float = 10.0

    def __post_init__(self):
        _check_nonnegative(self, delta=self.delta)

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
        _check_nonnegative(self, omega=self.omega)

    def apply(self, state, x, dx):
        xp = namespace_of(dx)
        norm = xp.linalg.vector_norm(dx, ord=self.p)
        if not self.throw:
            return state, dx * xp.clip(self.omega / norm, max=1.0)
        value = float(norm)
        if not math.isfinite(value):
            raise FloatingPointError(
                f"ClipNorm: the gradient of an array of shape {tuple(x.shape)} has {self.p}-norm "
                f"{value}; look for a NaN or infinite loss (ClipNorm(throw=False) skips this)"
            )
        return state, (dx * (self.omega / value) if value > self.omega else dx)


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

    def __eq__(self, other):
        return isinstance(other, OptimiserChain) and self.rules == other.rules

    def __hash__(self):
        return hash(self.rules)

    def __repr__(self):
        return f"OptimiserChain({', '.join(map(repr, self.rules))})"


# --- one parameter's step: the seam for fused kernels
def step(rule, param, grad, state):
    """`(new_param, new_state)`: one rule's update of one parameter, by the fused kernel that
    `cuda.dispatch` has registered for the rule where it takes the arrays, else by `rule.apply`
    in the Array API."""
    fused = dispatch.STEPS.get(type(rule).__name__) if type(rule).__module__ == __name__ else None
    if fused is not None and dispatch.takes(param):
        done = fused(rule, param, grad, state)
        if done is not None:
            return done
    state, delta = rule.apply(state, param, grad)
    return param - delta, state


# --- the state tree
class Leaf:
    """The optimiser state of one parameter: its rule and the rule's state."""

    __slots__ = ("rule", "state")

    def __init__(self, rule, state):
        self.rule, self.state = rule, state

    def __repr__(self):
        return f"Leaf({self.rule!r})"


def _is_parameter(x):
    x = data(x)
    return is_array(x) and namespace_of(x).isdtype(x.dtype, "real floating")


def setup(rule, model):
    """The optimiser state for `model`: shaped like it, a `Leaf` at each floating array (a
    parameter), None elsewhere."""
    if not isinstance(rule, Rule):
        raise TypeError(f"setup needs an optimisation rule (e.g. Adam()), got {rule!r}")
    return tree_map_with_path(
        lambda path, x: Leaf(rule, rule.init(data(x))) if _is_parameter(x) else None, model
    )


def update(state, model, grads):
    """`(state, model)` after one step of each parameter along its gradient in `grads` (shaped
    like the model, as `withgradient` returns it; a None gradient leaves its parameter as it is).
    Nothing is mutated: the old state and model stay valid."""
    if isinstance(grads, tuple) and len(grads) == 1 and not isinstance(model, tuple):
        raise ValueError(
            "update: the gradient is a tuple of one, the model is not; withgradient returns a "
            "gradient per argument: pass grads[0]"
        )
    model, state = _update(model, grads, state, ())
    return state, model


_UPDATE_NAMES = ("model", "gradient", "optimiser state")


def _update(x, dx, leaf, path):
    """`(new x, new state)` of one subtree; `path` is a chain of `(parent, key)` pairs, made
    into a name only for an error message."""
    if dx is None:
        return x, leaf
    if type(leaf) is Leaf:
        dx = _checked_gradient(path, x, dx)
        new_x, new_state = step(leaf.rule, data(x), dx, leaf.state)
        return new_x, Leaf(leaf.rule, new_state)
    structure = _structure(type(x))
    if structure is None:
        return x, _check_no_state(path, x, leaf)
    keys = structure.keys(x)
    grads = _matching(x, dx, keys, structure, path, _UPDATE_NAMES, 1)
    states = _matching(x, leaf, keys, structure, path, _UPDATE_NAMES, 2)
    done = [
        _update(child, g, s, (path, key))
        for key, child, g, s in zip(keys, structure.values(x, keys), grads, states)
    ]
    new_x = structure.rebuild(x, keys, [d[0] for d in done])
    new_leaf = None if leaf is None else structure.rebuild(leaf, keys, [d[1] for d in done])
    return new_x, new_leaf


def _check_no_state(path, x, leaf):
    if leaf is not None:
        raise ValueError(
            f"update: the optimiser state at {_name(path)} is a {type(leaf).__name__}, not a "
            "Leaf; make the state with setup(rule, model)"
        )
    if _is_parameter(x):
        raise ValueError(
            f"update: no optimiser state for {_name(path)}; make the state with "
            "setup(rule, model) for this model"
        )
    return leaf


def _checked_gradient(path, x, dx):
    dx = data(dx)
    x = data(x)
    if not is_array(dx) or tuple(dx.shape) != tuple(x.shape):
        got = f"shape {tuple(dx.shape)}" if is_array(dx) else f"a {type(dx).__name__}"
        raise ValueError(
            f"update: the gradient of {_name(path)} has {got}, the parameter shape {tuple(x.shape)}"
        )
    if dx.dtype != x.dtype:
        dx = namespace_of(dx).astype(dx, x.dtype)
    return dx


def adjust(state, eta=None, **changes):
    """The state with each rule's hyperparameters changed (`eta=...` the learning rate; a rule
    without such a field keeps it), the rules' states kept."""
    if eta is not None:
        changes["eta"] = eta
    return tree_map_with_path(
        lambda path, leaf: leaf if leaf is None else Leaf(leaf.rule.adjust(**changes), leaf.state),
        state,
        is_leaf=lambda x: isinstance(x, Leaf),
    )


# --- nested structures: tuples, lists, dicts, named tuples and dataclasses, as pytree.py
class _Structure:
    """How to list and rebuild the children of one container type."""

    def __init__(self, keys, values, rebuild):
        self.keys, self.values, self.rebuild = keys, values, rebuild


def _rebuild_dataclass(tree, keys, values):
    if hasattr(tree, "__dict__"):  # a shallow copy, faster than copy.copy
        out = object.__new__(type(tree))
        out.__dict__.update(tree.__dict__)
    else:
        out = copy.copy(tree)
    for key, value in zip(keys, values):
        object.__setattr__(out, key, value)
    return out


_DICT = _Structure(
    lambda t: list(t),
    lambda t, keys: [t[k] for k in keys],
    lambda t, keys, values: type(t)(zip(keys, values)),
)
_SEQUENCE = _Structure(
    lambda t: range(len(t)),
    lambda t, keys: list(t),
    lambda t, keys, values: type(t)(values),
)
_NAMEDTUPLE = _Structure(
    lambda t: range(len(t)),
    lambda t, keys: list(t),
    lambda t, keys, values: type(t)(*values),
)
_STRUCTURES = {}


def _structure(cls):
    """The `_Structure` of a container type, or None for a leaf (cached by type)."""
    try:
        return _STRUCTURES[cls]
    except KeyError:
        pass
    if issubclass(cls, dict):
        found = _DICT
    elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
        found = _NAMEDTUPLE
    elif issubclass(cls, (tuple, list)):
        found = _SEQUENCE
    elif dataclasses.is_dataclass(cls):
        names = tuple(f.name for f in dataclasses.fields(cls))
        found = _Structure(
            lambda t: names,
            lambda t, keys: [getattr(t, k) for k in keys],
            _rebuild_dataclass,
        )
    else:
        found = None
    _STRUCTURES[cls] = found
    return found


def tree_map_with_path(fn, tree, *rest, is_leaf=None, names=None):
    """`fn(path, leaf, *matching leaves of rest)` over the leaves of `tree`, keeping its shape.

    Containers are tuples, lists, dicts, named tuples and dataclasses; paths join field names,
    keys and positions with dots ("layers.0.weight"; "" for `tree` itself). A None in `rest`
    where `tree` has a container stands for None at each of its leaves. A structure of `rest`
    that does not match raises ValueError naming the place (`names` names the trees).
    """
    return _map(fn, tree, rest, is_leaf, names, ())


def _map(fn, tree, rest, is_leaf, names, path):
    structure = None if is_leaf is not None and is_leaf(tree) else _structure(type(tree))
    if structure is None:
        return fn(_name(path, ""), tree, *rest)
    keys = structure.keys(tree)
    matched = [_matching(tree, o, keys, structure, path, names, i + 1) for i, o in enumerate(rest)]
    values = [
        _map(fn, child, [m[k] for m in matched], is_leaf, names, (path, key))
        for k, (key, child) in enumerate(zip(keys, structure.values(tree, keys)))
    ]
    return structure.rebuild(tree, keys, values)


def _matching(tree, other, keys, structure, path, names, index):
    """The children of `other` in the order of `tree`'s (Nones for a None), checking that the
    two structures match."""
    if other is None:
        return [None] * len(keys)
    same = type(other) is type(tree) or (
        structure is _SEQUENCE and _structure(type(other)) is _SEQUENCE
    )
    if same and structure is _DICT:
        same = other.keys() == tree.keys()
    elif same and structure in (_SEQUENCE, _NAMEDTUPLE):
        same = len(other) == len(tree)
    if not same:
        first, second = (names[0], names[index]) if names else ("tree", f"tree {index + 1}")
        raise ValueError(
            f"mismatched structures at {_name(path)}: the {first} has {_kind(tree)}, the "
            f"{second} has {_kind(other)}; pass a {second} made for this {first}"
        )
    return structure.values(other, keys)


def _name(path, top="the top level"):
    """ "layers.0.weight" from the chain `((((), "layers"), 0), "weight")`."""
    parts = []
    while path:
        path, key = path
        parts.append(str(key))
    return ".".join(reversed(parts)) or top


def _kind(x):
    if isinstance(x, dict):
        return f"a {type(x).__name__} with keys {sorted(map(str, x))}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    if is_array(data(x)):
        return f"an array of shape {tuple(data(x).shape)}"
    return f"a {type(x).__name__}"
