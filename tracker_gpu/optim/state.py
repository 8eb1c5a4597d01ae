"""The optimiser state of a model, and one step of it.

`setup(rule, model)` makes a tree shaped like the model with a `Leaf` (the rule and its state)
at each parameter; `update(state, model, grads)` returns the new state and model, mutating
nothing. An array that appears in several places of a model (tied weights) is one parameter:
one `Leaf`, one update, and the same new array in every place, as in Optimisers.jl.
`adjust` changes hyperparameters, `freeze` and `thaw` stop and restart the updates of parts of a
model, all keeping the rules' states. A parameter and its state keep their dtypes step after step
(a step that promotes them is cast back); float16 and bfloat16 parameters step in float32, their
states kept in float32 (`STEP_DTYPES`).

>>> import numpy as np
>>> from tracker_gpu.optim import Descent
>>> shared = np.array([1.0, 2.0])
>>> model = {"embed": shared, "out": shared, "bias": np.zeros(2)}
>>> state = setup(Descent(0.1), model)
>>> state["embed"] is state["out"]
True
>>> grads = {"embed": np.ones(2), "out": np.ones(2), "bias": np.ones(2)}
>>> state, model = update(freeze(state, "bias"), model, grads)
>>> model["embed"] is model["out"], model["embed"], model["bias"]
(True, array([0.9, 1.9]), array([0., 0.]))
"""

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import recording
from ..backend import NUMPY_FLOATS, device_of, dtype_name, is_array, isdtype, namespace_of
from ..cuda import dispatch
from ..cuda.fp_status import Flagged
from ..primitive import detached
from ..pytree import TypeTable, tree_map
from ..rules.elementwise import astype
from ..tracked import data
from .rules import Rule, hyperparameters
from .schedules import Scheduled, next_count
from .tree import matching, name, structure, tree_map_with_path

__all__ = ["Leaf", "setup", "update", "adjust", "freeze", "thaw", "step"]


@dataclass(eq=False, repr=False)  # eq=False: a Leaf is one object, compared and hashed by identity
class Leaf:
    """The optimiser state of one parameter: its rule, the rule's state, and whether it is
    frozen (then `update` leaves the parameter and the state as they are). A dataclass, so
    that `tg.compile` sees the state's arrays inside it."""

    rule: Rule
    state: Any
    frozen: bool = False

    def __tracker_compile__(self):
        """This Leaf as `tg.compile` takes it: the Python numbers of the state (Adam's step
        counts `beta**t`) as 0-d float64 arrays beside the state's arrays, so that a recording
        reads them as inputs and every replay advances them, instead of a signature per step."""
        leaves = _flat(self.state)
        counts, array = False, None
        for v in leaves:  # loops, not generators: this runs at every compiled call
            if _is_count(v):
                counts = True
            elif array is None and (
                type(v) is np.ndarray or (is_array(v) and not isinstance(v, np.generic))
            ):
                array = v
        if not counts:
            return self
        if array is None and not any(isinstance(v, np.generic) for v in leaves):
            return self
        if array is None or type(array) is np.ndarray:  # NumPy scalars: a NumPy replay's
            made = _numpy_count
        else:
            xp, device = namespace_of(array), device_of(array)
            made = functools.partial(xp.asarray, dtype=xp.float64, device=device)
        return Leaf(self.rule, _counted(self.state, made), self.frozen)

    def __repr__(self):
        return f"Leaf({self.rule!r}{', frozen' if self.frozen else ''})"


_numpy_count = functools.partial(np.array, dtype=np.float64)


def _counted(state, made):
    """`state` with each count made an array by `made` (NumPy scalars too: what a replay on
    NumPy returns for 0-d arrays)."""
    kind = type(state)
    if kind is not tuple and kind is not list:
        return made(state) if _is_count(state) else state
    parts = []
    for part in state:  # a loop, not recursion per leaf: this runs at every compiled call
        inner = type(part)
        if inner is tuple or inner is list:
            parts.append(_counted(part, made))
        else:
            parts.append(made(part) if _is_count(part) else part)
    return kind(parts)


def _is_count(v):
    """A Python number of a state (Adam's `beta**t`, a schedule's step `t`), or the NumPy
    scalar a replay on NumPy gives back for it."""
    return type(v) is float or type(v) is int or isinstance(v, np.floating)


def _flat(state):
    """The leaves of a rule's state (nested tuples), quickly: this runs at every compiled call."""
    kind = type(state)
    if kind is not tuple and kind is not list:
        return [state]
    leaves = []
    for part in state:
        inner = type(part)
        if inner is tuple or inner is list:
            leaves.extend(_flat(part))
        else:
            leaves.append(part)
    return leaves


# --- one parameter's step: the seam for fused kernels
# The dtype a parameter of a half-precision dtype steps in: float16's range loses Adam's
# epsilon (1e-8 is 0 in float16) and small squared gradients, bfloat16's 8 bits of precision
# lose the moments' small updates (1 - beta2 = 0.001 of them). Their states live in float32,
# the step is computed there, and the new parameter is rounded back once.
STEP_DTYPES = {"float16": "float32", "bfloat16": "float32"}


def step_dtype(x):
    """The dtype that the rules step parameter `x` in (and keep its state in): float32 for a
    float16 or bfloat16 parameter (`STEP_DTYPES`), else None (its own dtype)."""
    if type(x) is np.ndarray and x.dtype in NUMPY_FLOATS:  # without naming the dtype
        return None
    wide = STEP_DTYPES.get(dtype_name(x.dtype) or str(x.dtype).rpartition(".")[2])
    return None if wide is None else getattr(namespace_of(data(x)), wide)


def step(rule, param, grad, state):
    """`(new_param, new_state)`: one rule's update of one parameter, by the fused kernel that
    `cuda.dispatch` has registered for the rule where it takes the arrays, else by `rule.apply`
    in the Array API. A `Scheduled` rule steps its rule as it runs at this step.

    The new parameter and the state's arrays keep their dtypes (as PyTorch's in-place updates
    do): a step that promotes them (a rule of one's own computing in float64, a hyperparameter
    in a 0-d float64 array of another library) is cast back. A float16 or bfloat16 parameter
    steps in float32 (`step_dtype`), its state made in float32 by `setup`."""
    wide = step_dtype(param)
    if wide is not None:
        new_param, new_state = _step(rule, astype(param, wide), astype(grad, wide), state)
        return astype(new_param, param.dtype), _kept(new_state, state)
    done = _fused_step(rule, param, grad, state)
    if done is not None:  # a kernel writes the one dtype it reads: nothing to cast back
        return done
    new_param, new_state = _own_step(rule, param, grad, state)
    return _kept(new_param, param), _kept(new_state, state)


def _kept(new, old):
    """`new` with each of its arrays in the dtype of the same array in `old` (a state or a
    parameter before its step), where a step changed it."""
    if type(new) is np.ndarray and type(old) is np.ndarray and new.dtype == old.dtype:
        return new  # the common case, without lookups
    if type(old) is tuple or type(old) is list:
        if type(new) is type(old) and len(new) == len(old):
            return type(old)(_kept(n, o) for n, o in zip(new, old))
        return new
    if old is None or type(old) in (int, float) or new is None:
        return new
    if is_array(data(old)) and is_array(data(new)) and new.dtype != old.dtype:
        return astype(new, old.dtype)
    return new


def _step(rule, param, grad, state):
    done = _fused_step(rule, param, grad, state)
    return done if done is not None else _own_step(rule, param, grad, state)


def _own_step(rule, param, grad, state):
    """The rule's own operations (`rule.apply`); a `Scheduled` rule steps its rule as it runs
    at this step, by a kernel where one takes it."""
    if type(rule) is Scheduled:
        t, inner = state
        new_param, inner = _step(rule.at(t, like=grad), param, grad, inner)
        return new_param, (next_count(t), inner)
    state, delta = rule.apply(state, param, grad)
    return param - delta, state


def _fused_step(rule, param, grad, state):
    """The step by the kernel `cuda.dispatch` registered for the rule (this package's rules
    only), or None where the rule's own operations step: the kernel does not take the arrays
    (each decides: CuPy's, or NumPy's natively), the rule maximises (the kernels know only
    descent), its rate is an array (a schedule's: the kernels take their scalars by value), or
    the kernel raised a floating-point exception that NumPy's settings report (the rule's
    operations then warn or raise as they do)."""
    cls = type(rule)
    fused = _FUSED_STEPS.get(cls)
    if fused is None:
        fused = _FUSED_STEPS[cls] = _registered_step(cls)
    if fused is False or getattr(rule, "maximize", False):
        return None
    if is_array(getattr(rule, "eta", 0.0)):
        return None
    try:
        return fused(rule, param, grad, state)
    except Flagged:
        return None


_FUSED_STEPS = TypeTable()  # a rule's class -> its registered kernel step, or False


def _registered_step(cls):
    own = cls.__module__.rpartition(".")[0] == __package__
    return (dispatch.STEPS.get(cls.__name__) if own else None) or False


def _is_parameter(x):
    x = data(x)
    return is_array(x) and isdtype(namespace_of(x), x.dtype, "real floating")


def _widened(x):
    """`x` in the dtype its rule steps it in (`step_dtype`): a state is made from this."""
    wide = step_dtype(x)
    return x if wide is None else namespace_of(x).astype(x, wide)


def fresh_state(rule, x):
    """`rule`'s state for the parameter `x` (plain), as `setup` makes it: of the dtype `x`
    steps in (float32 for a half-precision `x`)."""
    return rule.init(_widened(x))


# --- setup
def setup(rule, model):
    """The optimiser state for `model`: shaped like it, a `Leaf` at each floating array (a
    parameter), None elsewhere and in fields declared not trainable. An array found in several
    places gets one `Leaf`, the same object in each. For `LBFGS`, an `LBFGSState` instead (to
    step with `lbfgs_step`)."""
    own = getattr(rule, "own_state", None)  # a rule with a state of its own (LBFGS)
    if own is not None:
        return own(model)
    if not isinstance(rule, Rule):
        raise TypeError(f"setup needs an optimisation rule (e.g. Adam()), got {rule!r}")
    return _setup(rule, model, {})


def _setup(rule, x, seen):
    found = structure(type(x))
    if found is None:
        if not _is_parameter(x):
            return None
        key = id(data(x))
        if key not in seen:
            seen[key] = Leaf(rule, fresh_state(rule, data(x)))
        return seen[key]
    keys = found.keys(x)
    train = found.trainable
    children = [
        _setup(rule, child, seen) if train is None or key in train else None
        for key, child in zip(keys, found.values(x, keys))
    ]
    return found.rebuild(x, keys, children)


# --- update
def update(state, model, grads, *, allow_no_gradient=False):
    """`(state, model)` after one step of each parameter along its gradient in `grads` (shaped
    like the model, as `withgradient` returns it; a None gradient leaves its parameter as it is).
    A tied parameter is updated once, with the gradient found at its first place
    (`withgradient` puts the whole gradient in every place), and stays one array. Nothing is
    mutated: the old state and model stay valid.

    A step with no gradient for any trainable (not frozen) parameter raises ValueError: the
    loss was cut from the graph, and the step would change nothing (as PyTorch refuses a loss
    that does not require grad). `allow_no_gradient=True` lets such a step pass, unchanged;
    `freeze` the parameters that are not to be trained."""
    refused = getattr(state, "refused_by_update", None)  # a state stepped otherwise (LBFGS)
    if refused is not None:
        raise TypeError(f"update: {refused}")
    if isinstance(grads, tuple) and len(grads) == 1 and not isinstance(model, tuple):
        raise ValueError(
            "update: the gradient is a tuple of one, the model is not; withgradient returns a "
            "gradient per argument: pass grads[0]"
        )
    done, skipped = {}, set()
    new_model, new_state = _update(model, grads, state, (), done, skipped)
    if skipped & done.keys():  # a tied parameter without a gradient at its first place
        new_model, new_state = _update(model, grads, state, (), done, set())
    if not done and not allow_no_gradient:
        _check_nothing_to_train(state)
    return new_state, new_model


def _check_nothing_to_train(state):
    """Raise when `state` has a parameter to train (a Leaf not frozen): none got a gradient."""
    trainable = []
    tree_map_with_path(
        lambda path, leaf: trainable.append(path) if type(leaf) is Leaf and not leaf.frozen else 0,
        state,
        is_leaf=lambda x: type(x) is Leaf,
    )
    if trainable:
        raise ValueError(
            f"update: no gradient for any trainable parameter ({len(trainable)} of them, "
            f"{', '.join(trainable[:3])}{', ...' if len(trainable) > 3 else ''}): every gradient "
            "is None, so this step would change nothing. The loss does not depend on the "
            "model's parameters: it was computed from tg.data(x), a Python number (float(x), "
            "x.item()) or another cut from the graph. Pass allow_no_gradient=True if such a "
            "step is meant to do nothing, or freeze(state, path) what is not to be trained"
        )


_UPDATE_NAMES = ("model", "gradient", "optimiser state")


def _update(x, dx, leaf, path, done, skipped):
    """`(new x, new state)` of one subtree; `path` is a chain of `(parent, key)` pairs, made
    into a name only for an error message; `done` maps each Leaf updated so far (by id) to its
    results, so that a tied parameter is stepped once, and `skipped` collects the Leaves
    passed without a step."""
    if type(leaf) is Leaf:
        if id(leaf) in done:
            return done[id(leaf)]
        if dx is None or leaf.frozen:
            skipped.add(id(leaf))
            return x, leaf
        dx = _checked_gradient(path, x, dx)
        _check_state(path, x, leaf.state)
        state = tree_map(detached, leaf.state) if recording.ACTIVE else leaf.state
        new_x, new_state = step(leaf.rule, detached(x), dx, state)
        done[id(leaf)] = result = (new_x, Leaf(leaf.rule, new_state))
        return result
    if dx is None:
        return x, leaf
    found = structure(type(x))
    if found is None:
        return x, _check_no_state(path, x, leaf)
    keys = found.keys(x)
    grads = matching(x, dx, keys, found, path, _UPDATE_NAMES, 1)
    states = matching(x, leaf, keys, found, path, _UPDATE_NAMES, 2)
    train = found.trainable
    results = [
        _update(child, g, s, (path, key), done, skipped)
        if train is None or key in train
        else (child, s)
        for key, child, g, s in zip(keys, found.values(x, keys), grads, states)
    ]
    new_x = found.rebuild(x, keys, [r[0] for r in results])
    new_leaf = None if leaf is None else found.rebuild(leaf, keys, [r[1] for r in results])
    return new_x, new_leaf


def _check_no_state(path, x, leaf):
    if leaf is not None:
        raise ValueError(
            f"update: the optimiser state at {name(path)} is a {type(leaf).__name__}, not a "
            "Leaf; make the state with setup(rule, model)"
        )
    if _is_parameter(x):
        raise ValueError(
            f"update: no optimiser state for {name(path)}; make the state with "
            "setup(rule, model) for this model"
        )
    x = data(x)
    if is_array(x) and isdtype(namespace_of(x), x.dtype, "complex floating"):
        raise ValueError(  # `setup` makes states for real floats: it would never be trained
            f"update: {name(path)} is complex ({x.dtype}) and has a gradient, but the optimisers "
            "step real parameters only, so it would never be trained: keep its real and "
            "imaginary parts as two real parameters, or give it the gradient None if it is a "
            "constant"
        )
    return leaf


def _checked_gradient(path, x, dx):
    if type(dx) is np.ndarray and type(x) is np.ndarray and dx.shape == x.shape:
        return dx if dx.dtype == x.dtype else astype(dx, x.dtype)  # the common case, at once
    traced = detached(dx)
    dx, x = data(dx), data(x)
    if not is_array(dx) or tuple(dx.shape) != tuple(x.shape):
        got = f"shape {tuple(dx.shape)}" if is_array(dx) else f"a {type(dx).__name__}"
        raise ValueError(
            f"update: the gradient of {name(path)} has {got}, the parameter shape {tuple(x.shape)}"
        )
    if dx.dtype != x.dtype:
        return astype(traced, x.dtype)
    return traced


def _check_state(path, x, state):
    """Every array of a parameter's state is shaped like it (moments) or 0-d (counts): a state
    made for another model would be broadcast, or read out of bounds by a fused step."""
    shape = x.shape
    for v in _flat(state):
        held = getattr(v, "shape", None)
        if held and held != shape and tuple(held) != tuple(shape):
            raise ValueError(
                f"update: the optimiser state of {name(path)} holds an array of shape "
                f"{tuple(held)}, the parameter has shape {tuple(shape)}: the state was made for "
                "another model (or the model changed shape); make it with setup(rule, model) "
                "for this model"
            )


# --- changing the leaves: hyperparameters, frozen or not
def _dotted(paths):
    """`paths` as dotted strings: given one by one, or in a list (as the messages show them)."""
    out = []
    for p in paths:
        for q in p if isinstance(p, (list, tuple)) else (p,):
            if not isinstance(q, str):
                raise TypeError(
                    f"a parameter's path is a dotted string such as 'layers.0.weight', got {q!r}"
                )
            out.append(q)
    return tuple(out)


def _map_leaves(state, change, paths=()):
    """The state with `change(leaf)` in place of each Leaf under one of `paths` (dotted
    prefixes like "layers.0"; every Leaf when there are none), ties kept: a Leaf found in
    several places is changed once and the result put in each."""
    paths = _dotted(paths)
    chosen = {}

    def choose(path, leaf):
        if isinstance(leaf, Leaf) and (not paths or any(_under(path, p) for p in paths)):
            chosen[id(leaf)] = None
        return leaf

    is_leaf = lambda x: isinstance(x, Leaf)
    tree_map_with_path(choose, state, is_leaf=is_leaf)
    for p in paths:
        if not any(_under(q, p) for q in _leaf_paths(state)):
            raise ValueError(
                f"no parameter of the model at {p!r}; give a dotted path of the model's "
                f"parameters or a prefix of one, e.g. {_leaf_paths(state)[:1] or ['layers.0']}"
            )

    def replace(path, leaf):
        if not isinstance(leaf, Leaf) or id(leaf) not in chosen:
            return leaf
        if chosen[id(leaf)] is None:
            chosen[id(leaf)] = change(leaf)
        return chosen[id(leaf)]

    return tree_map_with_path(replace, state, is_leaf=is_leaf)


def _under(path, prefix):
    return prefix == "" or path == prefix or path.startswith(prefix + ".")


def _leaf_paths(state):
    paths = []
    tree_map_with_path(
        lambda path, x: paths.append(path) if isinstance(x, Leaf) else None,
        state,
        is_leaf=lambda x: isinstance(x, Leaf),
    )
    return paths


def adjust(state, eta=None, **changes):
    """The state with each rule's hyperparameters changed (`eta=...` the learning rate; a rule
    without such a field keeps it), the rules' states kept. A name that no rule of the state
    has (a typo, PyTorch's `lr`) raises ValueError."""
    if eta is not None:
        changes["eta"] = eta
    _check_known(state, changes)
    return _map_leaves(
        state, lambda leaf: Leaf(leaf.rule.adjust(**changes), leaf.state, leaf.frozen)
    )


def _check_known(state, changes):
    names, rules = set(), set()

    def collect(path, leaf):
        if isinstance(leaf, Leaf):
            found = hyperparameters(leaf.rule)
            names.update(changes if found is None else found)
            rules.add(type(leaf.rule).__name__)
        return leaf

    tree_map_with_path(collect, state, is_leaf=lambda x: isinstance(x, Leaf))
    unknown = sorted(set(changes) - names)
    if unknown and rules:
        raise ValueError(
            f"adjust: no rule of this state ({', '.join(sorted(rules))}) has "
            f"{', '.join(map(repr, unknown))}; their hyperparameters are "
            f"{', '.join(sorted(names))} (the learning rate is eta)"
        )


def freeze(state, *paths):
    """The state with the parameters under `paths` (dotted paths of the model such as
    "layers.0" or "layers.0.weight"; all of them when none is given) frozen: `update` leaves
    them and their optimiser state as they are until `thaw`. Optimisers.jl's `freeze!`."""
    return _map_leaves(state, lambda leaf: Leaf(leaf.rule, leaf.state, True), paths)


def thaw(state, *paths):
    """The state with the parameters under `paths` (all when none is given) updated again."""
    return _map_leaves(state, lambda leaf: Leaf(leaf.rule, leaf.state, False), paths)
