"""Tracker's gradient API: back, gradient, withgradient (implicit `Params` too), nobacksies.

>>> import numpy as np, tracker_gpu as tg
>>> f = lambda x: tg.sum(x**2) + tg.prod(x[1:])
>>> tg.gradient(f, np.array([1.0, 2.0, 3.0]))
(array([2., 7., 8.]),)
>>> float(tg.withgradient(f, np.array([1.0, 2.0, 3.0])).val)
20.0
"""

import math
import sys
import warnings
import weakref
from collections import namedtuple

import numpy as np

from . import backend, nesting, recording
from .backend import SCALARS
from .checks import checking
from .params import Grads, Params
from .primitive import record, traced_data
from .pytree import is_container, tree_leaves, tree_map
from .tape import BackError, noted_on_the_way, walk
from .tracked import TrackedArray, alias, data, identity, istracked, leaf

__all__ = [
    "back",
    "gradient",
    "withgradient",
    "WithGradient",
    "nobacksies",
    "NestedDerivativeError",
]

WithGradient = namedtuple("WithGradient", ["val", "grad"])


def back(y, dy=None, *, once=True):
    """Backpropagate from `y` into the leaves it depends on (Tracker's `back!`).

    A scalar `y` is seeded with 1 (it must be finite: checked where that costs no device
    synchronisation, see `tg.sync_checks`); any other `y` needs a seed `dy` of its shape. Leaf
    gradients accumulate across passes. With `once=True` the graph is freed as it is walked and
    a second pass raises; `once=False` keeps it.

    >>> import numpy as np, tracker_gpu as tg
    >>> x = tg.param(np.array([1.0, 2.0]))
    >>> tg.back(x * 3, np.array([1.0, 1.0]))
    >>> tg.grad(x)
    array([3., 3.])
    """
    if not istracked(y):
        kind = "a tracked constant" if isinstance(y, TrackedArray) else type(y).__name__
        raise TypeError(
            f"back needs a value on the tape, got {kind}: it does not depend on any tg.param "
            "(creation functions, non-differentiable functions such as floor, sign or "
            "comparisons, and tg.data give values with no gradient); differentiate a value "
            "computed from a parameter"
        )
    with backend.on_device_of(y.data):  # buffers and kernels on y's GPU, not the current one
        seed = scalar_seed(y.data, y._xp) if dy is None else given_seed(y, dy)
        hand_out = HandOut()
        for node, g in walk(y._node, seed, once=once):
            if node.rule is None:
                node.grad = hand_out(g if node.grad is None else node.grad + g)


def scalar_seed(value, xp, finite=True):
    """The seed of a pass from the plain loss `value` (of library `xp`): a one of its dtype,
    after the checks that it is real, a scalar and (where checks run, and `finite` asks)
    finite."""
    _check_real(value)
    if value.ndim != 0:
        raise BackError(
            f"value is not scalar (shape {tuple(value.shape)}): use back(sum(y)) or back(y, dy) "
            "with a seed dy of y's shape"
        )
    if finite and checking(value):
        number = float(value)
        if not math.isfinite(number):
            raise BackError(
                f"loss is {number} (not finite): the backward pass needs a finite loss; look for "
                "overflow, log(0) or 0/0 in the forward pass"
            )
    if xp is np:  # np.ones_like is Python, five times slower than making the 0-d array
        return np.array(1, dtype=value.dtype)
    return xp.ones_like(value)


def given_seed(y, dy):
    """The seed `dy` checked against `y`, as a new array (the user's `dy` is never aliased)."""
    xp = y._xp
    dy = data(dy)
    if type(dy) in SCALARS or isinstance(dy, (list, tuple)):
        dy = xp.asarray(dy, dtype=y.dtype, device=y.device)
    backend.check_same_library(xp, dy)
    if backend.isdtype(xp, dy.dtype, "complex floating") and not backend.isdtype(
        xp, y.dtype, "complex floating"
    ):
        raise TypeError("a complex seed for a real value; pass a real seed of y's dtype")
    if tuple(dy.shape) != tuple(y.shape):
        raise ValueError(f"seed of shape {tuple(dy.shape)} for a value of shape {tuple(y.shape)}")
    if backend.device_of(dy) != y.device:
        raise ValueError(
            f"seed on device {backend.device_of(dy)} for a value on device {y.device}; "
            f"create the seed on {y.device}"
        )
    return xp.astype(dy, y.dtype, copy=True)


def _check_real(y):
    if backend.is_complex_dtype(y.dtype):
        raise TypeError(
            f"cannot differentiate a complex value (dtype {y.dtype}) without a seed: a loss "
            "must be real; take tg.real, tg.abs or a sum of squares of it, or pass a seed "
            "(back(y, dy))"
        )


def gradient(f, *args, nest=False, wrt=None):
    """The gradients of the scalar `f(*args)` with respect to each argument.

    Arguments may be nested structures (tuples, lists, dicts, named tuples, dataclasses). What
    is differentiated is decided by type, the same way everywhere: floating-point arrays are
    parameters and get their gradient in the same place; integer and boolean arrays (labels,
    indices, masks) are data and get `None`, and so does anything else, and an input the loss
    does not depend on. A Python float given as an argument itself is a parameter (a 0-d
    array); numbers inside a structure are constants (a layer's `eps`). A top-level integer,
    or a list of floats, warns (they get no gradient). `f` may return `(loss, aux...)`. With
    `nest=True` the gradients are tracked, so they can be differentiated again. `wrt` (an
    argument's position, or a tuple of them) differentiates only those arguments: the others
    are data, passed to `f` as they are, and get `None`. A loss cut from the graph (a plain
    array computed from `tg.data(x)`, or a value of other parameters than the arguments: every
    gradient `None`) warns once, naming `f`, so that a training loop that learns nothing does
    not pass unnoticed; a loss whose derivative is zero (a tracked constant: floor, sign, the
    derivative of a linear function) gets `None` without a warning.

    The implicit form `gradient(lambda: loss, Params([W, b]))` returns `Grads`, looked up by
    parameter.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.gradient(lambda p: tg.sum(p["w"] * p["x"]), {"w": np.ones(2), "x": np.arange(2.0)})
    ({'w': array([0., 1.]), 'x': array([1., 1.])},)
    >>> tg.gradient(lambda w, x: tg.sum(w * x), np.ones(2), np.arange(2.0), wrt=0)
    (array([0., 1.]), None)
    """
    return withgradient(f, *args, nest=nest, wrt=wrt).grad


@nesting.transform
def withgradient(f, *args, nest=False, wrt=None):
    """`(val, grad)`: the value of `f(*args)` (its whole output, with plain arrays of the data's
    library where it returned tracked ones) and `gradient(f, *args)`. With `nest=True` the
    value stays tracked, like the gradients, for an outer derivative.

    >>> import numpy as np, tracker_gpu as tg
    >>> val, (g,) = tg.withgradient(lambda x: tg.sum(x**2), np.array([1.0, 2.0]))
    >>> val, g
    (np.float64(5.0), array([2., 4.]))
    """
    if not callable(f):
        raise TypeError(
            f"gradient needs the function to differentiate first, got {type(f).__name__}: "
            "write tg.gradient(lambda x: loss(x), x), not tg.gradient(loss(x), x)"
        )
    if len(args) == 1 and isinstance(args[0], Params):
        if wrt is not None:
            raise TypeError("wrt= names arguments by position; Params already says what to track")
        losses = []
        result = _implicit(lambda: _kept(f(), losses), args[0], nest)
        if len(args[0]) and all(g is None for _, g in result.grad.items()):
            if not isinstance(losses[0], TrackedArray):  # a plain loss: cut from the graph
                _warn_no_dependence(f, losses[0], "of the Params")
        return result
    return _withgradient(f, args, nest, wrt)


def _kept(val, losses):
    """`val`, with its loss noted in `losses`."""
    losses.append(val[0] if isinstance(val, tuple) else val)
    return val


def _withgradient(f, args, nest, wrt, quiet=False):
    """`withgradient`; `quiet` for a caller in this package whose `f` may return a number.
    Inside another transform's function it nests by itself (see `nesting`)."""
    chosen = positions(wrt, len(args))
    nest, since = nesting.begin(nest)
    given, (args, inputs, tracked_args) = args, track_inputs(args, nest, chosen)
    with nesting.inside():
        val = f(*tracked_args)
    found, others = loss_pass(f, val, inputs, nest, since, quiet)
    plain = not nest and recording.current() is None  # a recording keeps the values traced
    grads = gradients_in_place(args, inputs, found, nest, chosen, captured(others, since))
    if plain and given is not args:
        grads = tuple(map(_as_given, given, grads))
    return WithGradient(untracked(val) if plain else val, grads)


def _as_given(x, g):
    """The gradient `g` of the argument `x`: a NumPy scalar for a Python or NumPy number (a
    0-d array for a 0-d array)."""
    number = type(x) in (float, complex) or isinstance(x, np.generic)
    if number and type(g) is np.ndarray and g.shape == ():
        return g[()]
    return g


def loss_pass(f, val, inputs, nest, since, quiet=False):
    """`(found, others)`: the backward pass of the loss of `f`'s value `val` to the tracked
    `inputs` (`backprop`), warning (unless `quiet`) where the loss is a Python number or
    reaches none of them."""
    if isinstance(val, tuple) and not val:
        raise TypeError("the function returned an empty tuple: return the loss, or (loss, aux...)")
    loss = val[0] if isinstance(val, tuple) else val
    if type(loss) in SCALARS and inputs and not quiet:
        _warn(
            f"the function returned a Python {type(loss).__name__}, which carries no gradient: "
            "the computation left the tracked arrays (float(x), x.item(), or a library that "
            "converts its result to a Python number, as scikit-learn's metrics do), so every "
            "gradient is None. Return the 0-d tracked array instead"
        )
    others = []
    found = backprop(loss, inputs.values(), nest, others, since, finite=not quiet)
    if inputs and not quiet and _none_reached(inputs.values(), found):
        _warn_no_dependence(f, loss, "argument", others)
    return found, others


def captured(reached, since):
    """The first node among `reached` made before the serial `since`: a tracked value the
    function closed over (its gradient, taken at top level, cannot be differentiated again
    with respect to it); None if none. A pass's own inputs, made after `since`, never are."""
    return next((node for node in reached if node.serial < since), None)


def _none_reached(inputs, found):
    """Whether the backward pass reached none of the tracked `inputs`."""
    return not any(id(made._node) in found for made in inputs)


def _warn_no_dependence(f, loss, what, others=()):
    """One warning for a loss cut from the graph, where every gradient is None (which a
    training loop would take for a step that changes nothing): a plain array, or a value on
    the tape that depends on none of the parameters given. A Python number has its own
    warning; a tracked constant does not warn: the function's derivative is zero (floor,
    sign, a comparison, the derivative of a linear function), as PyTorch gives zeros there."""
    if type(loss) in SCALARS or (isinstance(loss, TrackedArray) and loss._node is None):
        return
    if isinstance(loss, TrackedArray):
        if not others:  # nothing but nested seeds: a derivative that is constant, zero
            return
        _warn(
            f"the loss of {_describe(f)} does not depend on any {what} given to differentiate, "
            "only on other tracked arrays (a model's parameters read from a closure, say), so "
            "every gradient is None. Pass what is to be differentiated as an argument"
        )
    else:
        _warn(
            f"the loss of {_describe(f)} is a plain {type(loss).__name__}, not a tracked array: "
            "it was computed from plain values (tg.data(x), NumPy on the data, a library that "
            "converts to NumPy), so it does not depend on any argument given to differentiate "
            "and every gradient is None. Compute it with tracker_gpu's functions (tg.*)"
        )


def _describe(f):
    """`name (file:line)` of a function, for a message."""
    name = getattr(f, "__qualname__", None) or type(f).__name__
    code = getattr(f, "__code__", None)
    return name if code is None else f"{name} ({code.co_filename}:{code.co_firstlineno})"


def quiet_gradient(f, *args, nest=False):
    """`gradient` for this package's own functions (hvp, jvp), whose `f` returns a number
    where it is constant: no warning."""
    return _withgradient(f, args, nest, None, quiet=True).grad


def quiet_withgradient(f, *args, nest=False):
    """`withgradient` for this package's loss-scaled steps: a loss that is not finite passes
    its inf and nan on to the gradients (which the loss scale then sees and skips), rather
    than raising `BackError`."""
    return _withgradient(f, args, nest, None, quiet=True)


def positions(wrt, count):
    """The positions `wrt` names among `count` arguments, as a frozenset (all when None)."""
    if wrt is None:
        return frozenset(range(count))
    chosen = (wrt,) if isinstance(wrt, int) and not isinstance(wrt, bool) else wrt
    if not isinstance(chosen, tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in chosen
    ):
        raise TypeError(f"wrt takes an argument's position or a tuple of them, got {wrt!r}")
    bad = [i for i in chosen if not -count <= i < count]
    if bad:
        raise ValueError(
            f"wrt={wrt!r} names position {bad[0]}, but the function is given {count} "
            f"argument{'s' * (count != 1)} (positions 0 to {count - 1})"
        )
    return frozenset(i % count for i in chosen)


def untracked(val):
    """`f`'s output with each tracked array replaced by its plain value. An auxiliary output
    holding no tracked array is returned as it is (the object itself)."""
    if type(val) is tuple:
        return tuple(_plain(v) for v in val)
    return _plain(val)


nesting.serve_untracked(untracked)


def _plain(x):
    if isinstance(x, TrackedArray):
        return x.data
    if is_container(x) and any(isinstance(leaf, TrackedArray) for leaf in tree_leaves(x)):
        return tree_map(data, x)
    return x


def track_inputs(args, nest, chosen=None):
    """`(args, inputs, tracked_args)`: top-level floats made arrays, a tracked input for each
    parameter (keyed by the id of the user's array) and the arguments with the inputs in place.

    What is a parameter: a floating-point array, wherever it is in the arguments, and a Python
    float given as an argument itself. Integer and boolean arrays are data (labels, indices,
    masks) wherever they are, and numbers inside a structure are constants (a layer's eps).
    Only the arguments at the positions `chosen` (all when None) are looked into; the others
    are data.
    """
    if chosen is None:
        chosen = frozenset(range(len(args)))
    args = top_levels(args, chosen)
    inputs, given = {}, {}
    tracked_args = tuple(
        _track(a, inputs, given, nest) if i in chosen else _as_data(a) for i, a in enumerate(args)
    )
    return args, inputs, tracked_args


def gradients_in_place(args, inputs, found, nest, chosen=None, closed_over=None):
    """The arguments' structure with each parameter's gradient (from `found`) in its place;
    None for an argument not among the positions `chosen` (all when None). Plain gradients of
    a pass that read a tracked value (a tracked argument, or the node `closed_over`) are
    linked to it by `nobacksies`, so that differentiating them again raises."""
    plain = not nest and recording.current() is None  # a recording keeps the gradients traced
    hand_out = HandOut(made.data for made in inputs.values()) if plain else None
    return tuple(
        tree_map(lambda x: _grad_of(x, inputs, found, hand_out, closed_over), a)
        if chosen is None or i in chosen
        else None
        for i, a in enumerate(args)
    )


def _as_data(tree):
    """An argument not differentiated: as it is, or, while tg.compile records, with its arrays
    traced as data (read anew by every replay): a copy of its containers, where it has arrays
    (without, the caller's own, as eagerly: what `f` changes there changes the signature)."""
    if recording.current() is None or not any(map(backend.is_array, tree_leaves(tree))):
        return tree
    traced = {}
    return tree_map(lambda x: _traced_data(x, traced), tree)


def top_levels(args, chosen):
    """`args` with each top-level number at the positions `chosen` made a parameter."""
    if all(type(a) is np.ndarray for a in args):  # the common case: nothing to make or warn of
        return args
    home = _home(args) if any(type(a) in (float, complex) for a in args) else None
    return tuple(top_level(a, i, home) if i in chosen else a for i, a in enumerate(args))


def _home(args):
    """`(namespace, device)` of the arguments' first array of a library that does not mix with
    NumPy's arrays (CuPy, PyTorch, array-api-strict), or None."""
    for x in tree_leaves(args):
        x = x.data if isinstance(x, TrackedArray) else x
        if backend.is_array(x) and not isinstance(x, (np.ndarray, np.generic)):
            if not backend.is_lazy(x):  # Dask takes NumPy's arrays as operands
                return backend.namespace_of(x), backend.device_of(x)
    return None


def top_level(x, position, home=None):
    """A top-level float (complex) becomes a 0-d float64 (complex128) array, a parameter: of the
    library and device of the other arguments' arrays (`home`), else NumPy's. The surprising
    cases warn."""
    if type(x) in (float, complex):
        if home is None:
            return np.asarray(x)
        xp, device = home
        dtype = xp.float64 if type(x) is float else xp.complex128
        return backend.full_exactly(xp, (), x, dtype=dtype, device=device)
    if type(x) is int:
        _warn(
            f"argument {position} is the integer {x}: integers are data and get no gradient; "
            f"pass {float(x)} to differentiate with respect to it"
        )
    elif isinstance(x, (list, tuple)) and x and all(type(v) is float for v in x):
        _warn(
            f"argument {position} is a {type(x).__name__} of Python floats: numbers inside a "
            "structure are constants and get no gradient; pass an array (np.asarray(...)) to "
            "differentiate with respect to them"
        )
    return x


def _warn(message):
    """A warning attributed to the user's line: the first caller outside this package."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("tracker_gpu"):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, stacklevel=level)


def _track(tree, inputs, given, nest):
    """`tree` with a tracked input in place of each parameter (`given[id]`, what `f` gets);
    `inputs[id]` is a second handle on it, which keeps the input as it was given when `f`
    writes into it (`x[0] = 1.0` makes `x` a new value: the gradient is the input's)."""
    traced = {} if recording.current() is not None else None

    def track(x):
        key = input_key(x)
        if key not in inputs:
            made = _input(x, nest, traced is not None)
            if made is None:
                return x if traced is None else _traced_data(x, traced)
            given[key], inputs[key] = made, alias(made)
        return given[key]

    return tree_map(track, tree)


def input_key(x):
    """What identifies a parameter among the arguments: a tracked array's node (two handles on
    one value, `copy.copy(p)` or an unpickled pair, are one parameter, as for `back`), any
    other array itself."""
    if type(x) is TrackedArray and x._node is not None:
        return id(x._node)
    return id(x)


def _traced_data(x, traced):
    """While tg.compile records, an integer or boolean array argument reaches `f` as a traced
    array (data, with no gradient), so that what is computed from it is replayed from the new
    argument; anything else, as it is."""
    if isinstance(x, TrackedArray) or not backend.is_array(x):
        return x
    if id(x) not in traced:
        traced[id(x)] = traced_data(x, backend.namespace_of(x))
        recording.current().leaf(traced[id(x)])
    return traced[id(x)]


def _input(x, nest, recorded=False):
    """The tracked input standing for a user's value, or None if it is not a parameter."""
    if type(x) is np.ndarray and x.dtype.kind in "fc":  # the common case, without lookups
        return TrackedArray(x, np)
    if isinstance(x, TrackedArray):
        if x._node is not None and not recording.is_data(x._node):
            if not (nest or recorded):
                return leaf(x.data)
            made = identity(x)  # linked to x, and tracked: this pass's parameter
            if recorded:
                recording.current().tracked_as([made._node], True)
            return made
        x = x.data  # a constant, or traced data: a value as a plain array is
    if not backend.is_array(x):
        return None
    xp = backend.namespace_of(x)
    if backend.isdtype(xp, x.dtype, ("real floating", "complex floating")):
        # a PyTorch tensor that requires grad: its value (a view, never written), so that
        # PyTorch does not record alongside; the user's tensor keeps its requires_grad
        return leaf(x.detach() if getattr(x, "requires_grad", False) is True else x)
    return None  # integers and booleans: data, passed to f as they are


# The leaves that seed nested passes: a nested gradient depends on its seed, which is no
# parameter.
_SEEDS = weakref.WeakSet()


def backprop(loss, inputs, nest, others=None, since=0, finite=True):
    """{id(input): gradient} for the inputs the scalar `loss` depends on, walking the nodes
    made since the serial `since` (older ones are values closed over). The list `others`, if
    given, collects the other leaves and older nodes reached (not the seeds of nested passes).
    `finite=False` for this package's inner sums (a jvp's `<J^T u, t>`), whose value is not
    used: an infinite output times a zero cotangent is nan there, and that is no error."""
    _check_loss_is_scalar(loss)
    if not istracked(loss) or recording.is_data(loss._node):  # data: a plain value eagerly
        return {}
    with backend.on_device_of(loss.data):  # buffers and kernels on the loss's GPU
        seed = scalar_seed(loss.data, loss._xp, finite)
        if nest:
            seed = nested_seed(seed, loss._xp)
        stop = [made._node for made in inputs]
        reached = walk(loss._node, seed, once=not nest, nested=nest, stop=stop, since=since)
        if others is None:
            return {id(node): g for node, g in reached}
        found = {}
        for node, g in reached:
            found[id(node)] = g
            if (node.rule is None or node.serial < since) and node not in _SEEDS:
                others.append(node)
    return found


def nested_seed(value, xp):
    """The seed of a nested pass: a tracked leaf that is no parameter, so that every vjp sees
    a tracked gradient."""
    seed = TrackedArray(value, xp)
    _SEEDS.add(seed._node)
    return seed


def check_one_array(y, name, fix):
    """Refuse a structure where one array (or number) is differentiated: its parts would be
    taken for a constant, every derivative silently zero."""
    if not (isinstance(y, TrackedArray) or backend.is_array(y) or type(y) in SCALARS):
        raise TypeError(
            f"{name}: f must return one array, it returned a {type(y).__name__}; take each "
            f"output on its own ({fix}), or tg.jvp, which takes structures"
        )


def _check_loss_is_scalar(loss):
    if (
        not isinstance(loss, TrackedArray)
        and type(loss) not in SCALARS
        and not backend.is_array(loss)
    ):
        raise TypeError(
            f"the function must return a scalar loss, or a tuple (loss, aux...); it returned "
            f"{type(loss).__name__}{' (did it forget to return?)' if loss is None else ''}"
        )
    shape = getattr(loss, "shape", ())
    if tuple(shape) != ():
        raise BackError(
            f"the loss must be a scalar, got shape {tuple(shape)}: return tg.sum(...) of it, or "
            "use tg.jacobian or tg.forward to differentiate a non-scalar function"
        )


def _grad_of(x, inputs, found, hand_out, closed_over=None):
    made = inputs.get(input_key(x))
    if made is None:
        return None
    g = found.get(id(made._node))
    if g is None or hand_out is None:
        return g
    g = hand_out(g)
    if isinstance(x, TrackedArray):
        return nobacksies(NEST_MESSAGE, g, parent=x)
    return g if closed_over is None else cut_off(g, closed_over, made._xp)


def cut_off(g, node, xp):
    """The plain `g`, as a tracked array linked to `node` (a value the pass closed over) that
    raises if differentiated: at top level a pass is not recorded."""
    return record(g, xp, _NO_BACKSIES, (node,), NEST_MESSAGE)


class HandOut:
    """Gradients handed to a user own their memory: no two share a buffer, and none shares one
    with the user's arrays, so writing into one changes nothing else. A fresh gradient (the
    common case) passes as it is; a broadcast view, or one sharing the buffer of a gradient
    already handed out or of `arrays`, is copied; a NumPy scalar (NumPy's arithmetic on 0-d
    arrays makes them) is made a 0-d array, the type of the argument it is the gradient of.
    """

    def __init__(self, arrays=()):
        self._taken = {backend.memory_key(a) for a in arrays}

    def __call__(self, g):
        if isinstance(g, np.generic):  # NumPy's arithmetic on 0-d arrays gives scalars
            g = np.array(g)
        g = backend.writable(g)
        key = backend.memory_key(g)
        if key in self._taken:
            g = backend.namespace_of(g).asarray(g, copy=True)
            key = backend.memory_key(g)
        self._taken.add(key)
        return g


NEST_MESSAGE = (
    "this derivative was taken at top level without nest=True, so it cannot be differentiated "
    "again (it reads a tracked value it was given or closed over); use gradient(f, x, "
    "nest=True), or take it inside the outer transform's function, where it nests by itself"
)


# --- nobacksies: a value a backward pass must not go through
class NestedDerivativeError(RuntimeError):
    """A backward pass reached a value marked with `nobacksies`."""


class _NoBacksies:
    name = "nobacksies"

    def pullback(self, node, args, message, saved, g, nested, pending=None):
        raise NestedDerivativeError(message)


_NO_BACKSIES = _NoBacksies()


def nobacksies(message, x, *, parent=None):
    """`x` unchanged, marked so that a backward pass through it raises `message`.

    Tracker uses it to mark rules that are not twice differentiable: on plain values it does
    nothing, on tracked ones (a nested pass) it makes differentiating through them an error.
    `parent` links a plain `x` to the tape of a tracked value.
    """
    link = parent if parent is not None else x
    if not istracked(link):
        return x
    if link is not x and recording.current() is not None:
        recording.refuse("tg.nobacksies(message, x, parent=...) of another array than x")
    args = (link._node,)
    return record(data(x), link._xp, _NO_BACKSIES, args, message, None, (_same, args, {}, False))


def _same(xp, value):
    """How tg.compile replays a marked value: as it is."""
    return value


# --- the implicit interface
def _implicit(f, params, nest):
    nest, _ = nesting.begin(nest)  # the implicit form walks the whole graph
    given = [alias(p) for p in params]  # the parameters as they are before f writes into one
    with nesting.inside():
        val = f()
    loss = val[0] if isinstance(val, tuple) else val
    with noted_on_the_way([g._node for g in given]) as kept:  # a parameter made of another
        found = backprop(loss, [g for g in given if g._node.rule is None], nest)
    found.update(kept)
    found = {id(p): found.get(id(g._node)) for p, g in zip(params, given)}
    if not nest:
        hand_out = HandOut(g.data for g in given)
        found = {key: g if g is None else hand_out(g) for key, g in found.items()}
        val = untracked(val)
    return WithGradient(val, Grads(params, found))
