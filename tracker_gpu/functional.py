"""Tracker's functional API beyond `gradient`: forward, jacobian, hessian, hvp, hook,
checkpoint, and ways to stop tracking (stop_gradient, notrack).

>>> import numpy as np, tracker_gpu as tg
>>> y, back = tg.forward(lambda x: tg.stack([3 * x**2, 2 * x]), 5.0)
>>> y, [float(g) for g in back([1, 1])]
(array([75., 10.]), [32.0])
"""

import contextlib
import threading

import numpy as np

from . import draws, nesting, primitive, recording, tracked
from .api import (
    captured,
    check_one_array,
    cut_off,
    given_seed,
    gradient,
    gradients_in_place,
    loss_pass,
    nested_seed,
    positions,
    quiet_gradient,
    track_inputs,
)
from .backend import is_array, is_complex_dtype, isdtype, namespace_of
from .forward_mode import check_directions, directional, untied
from .primitive import Primitive, record_saving_arguments, resolve, tracked_values
from .recording import ACTIVE
from .rules.elementwise import identity
from .rules.shape import reshape, stack
from .tape import Node, older_nodes, serial_now, walk
from .tracked import TrackedArray, alias, constant, data, istracked, leaf

__all__ = [
    "forward",
    "jacobian",
    "hessian",
    "hvp",
    "hook",
    "checkpoint",
    "stop_gradient",
    "notrack",
]


@nesting.transform
def forward(f, *args):
    """`(y, back)`: the plain value of `f(*args)` and a pullback `back(dy)` giving the gradients
    of `sum(dy * y)` with respect to the arguments. `back` may be called any number of times.
    Inside another transform's function both nest: `y` and the gradients stay tracked, and
    `back` is differentiable in `dy` too."""
    nest, since = nesting.begin()
    args, inputs, tracked_args = track_inputs(args, nest)
    with nesting.inside():
        y = f(*tracked_args)

    check_one_array(y, "forward", "tg.forward(lambda x: f(x)[0], x)")

    def back(dy):
        if not istracked(y):
            return gradients_in_place(args, inputs, {}, nest=nest)
        stop = [made._node for made in inputs.values()]
        seed = _cotangent(y, dy) if nest else given_seed(y, dy)
        reached = walk(y._node, seed, once=False, nested=nest, stop=stop, since=since)
        found = {id(node): g for node, g in reached}
        outer = captured((node for node, _ in reached), since)  # the inputs are newer
        return gradients_in_place(args, inputs, found, nest, closed_over=outer)

    return (y if nest else primitive.detached(y)), back  # while tg.compile records, traced data


def _cotangent(y, dy):
    """The seed of a nested pullback: `dy` itself when it is tracked (the pullback is then
    differentiable in it), else a checked copy as a nested seed."""
    if isinstance(dy, TrackedArray) and istracked(dy):
        if tuple(dy.shape) != tuple(y.shape):
            raise ValueError(f"seed of shape {tuple(dy.shape)} for a value of shape {y.shape}")
        return dy
    return nested_seed(given_seed(y, dy), y._xp)


@nesting.transform
def jacobian(f, *args, wrt=0):
    """The Jacobian of `f` at the array `args[wrt]`, of shape `f(*args).shape + x.shape` (as
    JAX lays it out: for vectors, one row per output, one column per input); the other
    arguments are data. `wrt` a tuple of positions gives a tuple of Jacobians, in its order (as
    JAX's `argnums`). Seeds are made on the data's device. Each row is the gradient of one
    element of `f(x)`, in `gradient`'s convention (PyTorch's) for a complex `x`: for a
    holomorphic `f` the entries are `conj(f'(z))`, the conjugate of what
    `jax.jacrev(f, holomorphic=True)` gives.

    >>> import numpy as np, tracker_gpu as tg
    >>> A = np.array([[1.0, 2.0], [3.0, 4.0]])
    >>> tg.jacobian(lambda x: A @ x, np.array([1.0, 1.0]))
    array([[1., 2.],
           [3., 4.]])
    >>> tg.jacobian(lambda A, x: A @ x, A, np.array([1.0, -1.0]), wrt=1)
    array([[1., 2.],
           [3., 4.]])
    >>> tg.jacobian(lambda z: z**2, np.array([1 + 2j]))  # conj(2z)
    array([[2.-4.j]])
    """
    if not args:
        raise TypeError("jacobian needs the point: tg.jacobian(f, x)")
    if isinstance(wrt, tuple):
        positions(wrt, len(args))  # checked
        return tuple(jacobian(f, *args, wrt=i) for i in wrt)
    along, x = _along(f, args, wrt)
    return _jacobian(along, x)


def _along(f, args, wrt):
    """`(g, x)`: `f` as a function of its argument at position `wrt` alone, and that argument."""
    (i,) = positions(wrt, len(args))
    return (lambda x: f(*args[:i], x, *args[i + 1 :])), args[i]


def _jacobian(f, x):
    """One reverse pass per element of `f(x)`. Inside another transform's function the passes
    are recorded (a Jacobian of a Jacobian, a penalty on a Jacobian's norm)."""
    if type(x) in (int, float, complex):  # a Python number: a 0-d array, as `gradient` takes it
        x = np.asarray(x)
    nest, since = nesting.begin()
    outer = None if nest or not istracked(x) else x._node  # a tracked x at top level is cut
    if istracked(x):
        x_in = identity(x) if nest else leaf(x.data)
    else:
        x_in = leaf(_as_float(data(x)))
    x_in, given = alias(x_in), x_in  # `x_in` as given: f may write into `given` (x[0] = v)
    with nesting.inside():
        y = f(given)
    check_one_array(y, "jacobian", "tg.jacobian(lambda x: f(x)[0], x)")
    _check_real_to_real(x_in, y)
    xp = namespace_of(data(x_in))
    n = _size(x_in.shape)
    shape = tuple(getattr(y, "shape", ())) + tuple(x_in.shape)  # JAX's layout
    m = _size(getattr(y, "shape", ()))
    if not istracked(y) or m * n == 0:  # constant, or nothing to lay out
        return xp.zeros(shape, dtype=x_in.dtype, device=x_in.device)
    eye = xp.eye(m, dtype=y.dtype, device=y.device)
    rows = []
    for i in range(m):
        seed = xp.reshape(eye[i, :], tuple(y.shape))
        seed = nested_seed(seed, y._xp) if nest else seed
        reached = walk(y._node, seed, once=False, nested=nest, stop=(x_in._node,), since=since)
        g = next((g for node, g in reached if node is x_in._node), None)
        rows.append(xp.zeros(n, dtype=x_in.dtype, device=x_in.device) if g is None else g)
        outer = outer or captured((node for node, _ in reached), since)  # x_in is newer
    jac = reshape(stack([reshape(r, (n,)) for r in rows]), shape)
    if nest or outer is None or recording.current() is not None:
        return jac
    return cut_off(jac, outer, x_in._xp)


def _check_real_to_real(x, y):
    """A complex output of a real input has a complex Jacobian, which the reverse passes (each
    a real gradient) would give only the real part of: refused, as JAX and PyTorch refuse it."""
    if is_array(data(y)) and is_complex_dtype(y.dtype) and not is_complex_dtype(x.dtype):
        raise TypeError(
            f"jacobian: f returns complex values ({y.dtype}) of a real input, whose Jacobian is "
            "complex; take the parts apart: tg.jacobian(lambda x: tg.real(f(x)), x) and "
            "tg.jacobian(lambda x: tg.imag(f(x)), x), or give a complex input"
        )


@nesting.transform
def hessian(f, *args, wrt=0):
    """The Hessian of the scalar `f` at the array `args[wrt]` (the other arguments are data):
    the Jacobian of its nested gradient, of shape `x.shape + x.shape`. `wrt` a tuple of
    positions gives the blocks, `h[a][b]` the derivative in the `b`-th of the gradient in the
    `a`-th, of shape `x_a.shape + x_b.shape` (JAX's `argnums`).

    Reverse over reverse: the nested gradient is recorded once, then walked back once per row.
    Forward over reverse (`jacfwd` of the nested gradient) gives the same matrix but measured
    3x to 12x slower at every size tried (`benchmarks/higher_order.py`): each of its columns
    records the nested gradient anew, and its forward mode is itself a nested reverse pass.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.hessian(lambda x: tg.sum(x**3), np.array([1.0, 2.0]))
    array([[ 6.,  0.],
           [ 0., 12.]])
    """
    if not args:
        raise TypeError("hessian needs the point: tg.hessian(f, x)")
    if isinstance(wrt, tuple):  # JAX's argnums: blocks[i][j] of shape x_i.shape + x_j.shape
        positions(wrt, len(args))  # checked
        return tuple(tuple(_hessian_block(f, args, i, j) for j in wrt) for i in wrt)
    if not isinstance(wrt, int) or isinstance(wrt, bool):
        raise TypeError(
            f"hessian takes an argument's position, or a tuple of them, as wrt; got {wrt!r}"
        )
    along, x = _along(f, args, wrt)
    return _jacobian(lambda x: _gradient_or_zeros(along, x), x)


def _hessian_block(f, args, i, j):
    """The Jacobian, in the argument at `j`, of the gradient of `f` in the one at `i`."""

    def gradient_in_i(x_j):
        along, x_i = _along(f, (*args[:j], x_j, *args[j + 1 :]), i)
        return _gradient_or_zeros(along, x_i)

    return _jacobian(gradient_in_i, args[j])


def _gradient_or_zeros(f, x):
    """The nested gradient of `f` at `x`; zeros where it is None (`f` constant in `x`, or
    piecewise so: `sum(floor(x))`), whose Jacobian is zeros."""
    g = gradient(f, x, nest=True)[0]
    return g if g is not None else namespace_of(data(x)).zeros_like(data(x))


@nesting.transform
def hvp(f, x, v):
    """The Hessian of the scalar `f` at `x` times `v`, without building the Hessian.

    `None` where the gradient of `f` does not depend on `x` (as `gradient` gives `None`).
    Written as `jvp` takes its arguments, `hvp(f, (x, y), (v, w))` differentiates `f(x, y)`
    with respect to all its arguments and returns a tuple: the product of the whole Hessian
    with the direction `(v, w)`, one part per argument.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.hvp(lambda x: tg.sum(x**3), np.array([1.0, 2.0]), np.array([1.0, 1.0]))
    array([ 6., 12.])
    >>> tg.hvp(lambda x: tg.sum(x**3), (np.array([1.0, 2.0]),), (np.array([1.0, 1.0]),))
    (array([ 6., 12.]),)
    """
    if isinstance(x, tuple) or isinstance(v, tuple):
        return _hvp(f, *_tuple_form(x, v))
    check_directions((x,), (v,), "hvp")
    if type(x) is not np.ndarray:  # an array in two places of a structure: two variables
        x = untied(x)
    if callable(f) and not nesting.active() and recording.current() is None:
        return _hvp_one(f, x, v)

    def along(x):  # inside another transform, or recorded: two transforms, nested
        return directional(gradient(f, x, nest=True)[0], v)

    return quiet_gradient(along, x)[0]


def _hvp_one(f, x, v):
    """`hvp` of one argument at top level, one transform: the nested pass walks from the
    loss of `f` straight to the transform's tracked input (no second set of inputs, no
    identity node between them), then the outer pass from `sum(g * v)` to it; what
    `gradient` warns of, it warns of."""
    nest, since = nesting.begin(False)
    args, inputs, (tracked_x,) = track_inputs((x,), nest)
    with nesting.inside():
        found, _ = loss_pass(f, f(tracked_x), inputs, True, since)
        g = gradients_in_place(args, inputs, found, True)[0]  # tracked: nested
        along = directional(g, v)
    found, others = loss_pass(f, along, inputs, nest, since, quiet=True)
    return gradients_in_place(args, inputs, found, nest, None, captured(others, since))[0]


def _tuple_form(primals, tangents):
    if not (isinstance(primals, tuple) and isinstance(tangents, tuple)):
        given = "the point" if isinstance(primals, tuple) else "the direction"
        raise TypeError(
            f"hvp: {given} is a tuple, the other is not; write hvp(f, x, v) for one argument, "
            "or hvp(f, (x, y), (v, w)) with a tuple of each, as jvp takes them"
        )
    if len(primals) != len(tangents):
        raise ValueError(
            f"hvp: {len(primals)} arguments but {len(tangents)} directions; give one direction "
            "per argument"
        )
    check_directions(primals, tangents, "hvp")
    return primals, tangents


def _hvp(f, primals, tangents):
    """The products of the Hessian of `f(*primals)` with the direction `tangents`, a tuple."""

    def along(*xs):
        return directional(gradient(f, *xs, nest=True), tangents)

    return quiet_gradient(along, *untied(primals))


def _as_float(x):
    return tracked.param(x).data if not isdtype(namespace_of(x), x.dtype, "real floating") else x


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# --- hook and checkpoint
def _hook_vjp(g, ans, x, fn):
    changed = fn(g)
    if changed is None:  # a hook that only looks (prints) keeps g
        return g
    _check_hooked(fn, g, changed)
    if type(changed) is TrackedArray and type(g) is not TrackedArray:
        return changed.data  # a first-order pass, whose gradients are plain: `g * W` of a param
    return changed


def _check_hooked(fn, g, changed):
    """What a hook returns replaces the gradient: of its shape, and not complex for a real one
    (a larger array was summed down, an imaginary part dropped, silently)."""
    name = getattr(fn, "__name__", type(fn).__name__)
    if not (isinstance(changed, TrackedArray) or is_array(changed)):
        raise TypeError(
            f"the hook {name!r} returned a {type(changed).__name__}: a hook returns the new "
            "gradient (an array shaped like the one it got) or None to keep it"
        )
    if tuple(changed.shape) != tuple(g.shape):
        raise ValueError(
            f"the hook {name!r} returned a gradient of shape {tuple(changed.shape)} for one of "
            f"shape {tuple(g.shape)}: a hook returns the new gradient, shaped like the one it got"
        )
    if is_complex_dtype(changed.dtype) and not is_complex_dtype(g.dtype):
        raise ValueError(
            f"the hook {name!r} returned a complex gradient ({changed.dtype}) for a real one "
            f"({g.dtype}): its imaginary part would be dropped; return a real array"
        )


_hook = Primitive("hook", lambda xp, x, fn: x, (_hook_vjp, None), saves="")


def hook(f, x):
    """`x` unchanged; the backward pass applies `f` to the gradient arriving at it, and passes
    on what `f` returns, or the gradient itself where `f` returns None (PyTorch's convention: a
    hook that only looks, as `print`, changes nothing).

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.gradient(lambda x: tg.hook(lambda g: -g, x) * 1.0, 2.0)
    (np.float64(-1.0),)
    """
    if not callable(f):
        given = "the array first" if callable(x) else f"a {type(f).__name__} as the function"
        raise TypeError(
            f"tg.hook takes the function first, then the array (Flux's order), got {given}: "
            "write tg.hook(lambda g: ..., x)"
        )
    return _hook(x, f)


class _Checkpoint:
    """A checkpoint's node: its parents are the block's tracked arguments, then the nodes of
    the tracked values the block closes over (`count` arguments first)."""

    name = "checkpoint"

    def __init__(self, fn, kw, count):
        self.fn, self.kw, self.count = fn, kw, count

    def pullback(self, node, args, states, saved, g, nested, pending=None):
        given, closed_over = args[: self.count], args[self.count :]
        since = serial_now()
        if nested:  # fresh nodes linked to the arguments' own, so the outer pass goes through
            _, values = tracked_values(node, given, saved[: 1 + self.count], g)
            inputs = [identity(v) if isinstance(v, TrackedArray) else v for v in values]
        else:
            _, values = resolve(node, given, saved)
            inputs = [leaf(v) if type(a) is Node else v for a, v in zip(given, values)]
        inputs, given = [alias(i) if istracked(i) else i for i in inputs], inputs
        with draws.replayed(states), nesting.inside():  # fn may write into what it is given
            y = self.fn(*given, **self.kw)
        if not istracked(y):
            return [None] * len(args)
        stops = [i._node for i in inputs if istracked(i)]
        _check_closed_over(y, since, stops, closed_over)
        reached = walk(y._node, g, once=not nested, nested=nested, stop=stops, since=since)
        found = {id(node): grad for node, grad in reached}
        grads = [found.get(id(i._node)) if istracked(i) else None for i in inputs]
        return grads + [found.get(id(node)) for node in closed_over]


def _check_closed_over(y, since, stops, closed_over):
    """Refuse a re-run that read tracked values the first run did not: a value the block
    closes over, written or rebound since (`y[0] = ...`), would give the gradient of another
    function than the one whose value the forward pass used."""
    recorded = {id(node) for node in closed_over}
    if any(id(node) not in recorded for node in older_nodes(y._node, since, stops)):
        raise ValueError(
            "checkpoint: the backward pass's re-run of the block read a tracked value the "
            "forward pass did not (one it closes over was written or rebound after the block "
            "ran, or the block took another branch); pass such values to tg.checkpoint as "
            "arguments"
        )


def checkpoint(f, *args, **kw):
    """`f(*args)`, keeping only its value: the backward pass runs `f` again to differentiate it,
    trading compute for the memory of `f`'s intermediate values.

    `f` runs on tracked arguments both times, so layers that act only while differentiating
    (`nn.Dropout`) act in both runs, and the random numbers drawn through tracker_gpu's layers
    are replayed: the re-run sees the numbers the first run drew. Tracked values `f` closes
    over get their gradients too (eagerly; `tg.compile` refuses such a block: pass them as
    arguments).

    >>> import numpy as np, tracker_gpu as tg
    >>> block = lambda x: tg.tanh(x) * x
    >>> tg.gradient(lambda x: tg.sum(tg.checkpoint(block, x)), np.array([0.5]))[0]
    array([0.85534102])
    """
    if not any(istracked(a) for a in args):
        return f(*args, **kw)
    closed_over = []
    forward = _checkpoint_forward(f, kw, [istracked(a) for a in args], closed_over)
    y, states = forward(*(data(a) for a in args))
    if closed_over and recording.current() is not None:
        recording.refuse("a tg.checkpoint block closing over a tracked value (pass it in)", True)
    xp = next(a._xp for a in args if istracked(a))
    rule = _Checkpoint(f, kw, len(args))
    return record_saving_arguments(y, xp, rule, (*args, *closed_over), states, forward)


def _checkpoint_forward(f, kw, tracked, closed_over):
    """`f`'s value on tracked leaves of the values of the tracked arguments, and the states of
    the generators it drew from; tg.compile replays it as a whole, recording nothing inside.
    The first run lists in `closed_over` the nodes of the tracked values `f` closes over."""

    def forward(*values):
        since = serial_now()
        inputs = [leaf(v) if t else v for v, t in zip(values, tracked)]
        with recording.paused(), draws.noted() as states:
            y = f(*inputs, **kw)
        if not (isinstance(y, TrackedArray) or is_array(y)):
            raise TypeError(
                f"checkpoint: the block must return one array, it returned a "
                f"{type(y).__name__}; checkpoint a block per output, or return them joined "
                "(tg.concat or tg.stack) and take them apart after"
            )
        if istracked(y) and not closed_over:
            closed_over.extend(older_nodes(y._node, since))
        return data(y), states

    return forward


# --- not tracking
def stop_gradient(x):
    """`x` with no gradient flowing through it: a tracked constant of its value (a plain
    array stays plain).

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.gradient(lambda x: tg.sum(x * tg.stop_gradient(x)), np.array([3.0]))[0]
    array([3.])
    """
    if isinstance(x, TrackedArray):
        if x._node is not None and ACTIVE and recording.current() is not None:
            return primitive.detached(x)  # traced data: every replay reads the new value
        return constant(x.data, x._xp)
    return x


class _ThreadEnd:
    """Kept in a thread's local storage, which Python clears when the thread ends: its ident
    leaves NOT_TRACKING then, so that a later thread given the same ident (Python reuses them)
    does not start inside a block its predecessor left open (a suspended generator's)."""

    def __init__(self, ident):
        self.ident = ident

    def __del__(self):
        primitive.NOT_TRACKING.discard(self.ident)


_thread_end = threading.local()


def _forget_at_thread_exit(ident):
    if getattr(_thread_end, "guard", None) is None:
        _thread_end.guard = _ThreadEnd(ident)


@contextlib.contextmanager
def notrack():
    """Within this block, operations on tracked arrays return plain arrays and record nothing
    (in this thread only). Refused while tg.compile records: what the block computes would
    be fixed at its recorded value."""
    if ACTIVE and recording.current() is not None:
        recording.refuse(
            "tg.notrack() (a block whose plain results the replay cannot compute)", True
        )
    ident = threading.get_ident()
    outer = ident in primitive.NOT_TRACKING
    primitive.NOT_TRACKING.add(ident)
    _forget_at_thread_exit(ident)
    try:
        yield
    finally:
        if not outer:
            primitive.NOT_TRACKING.discard(ident)
