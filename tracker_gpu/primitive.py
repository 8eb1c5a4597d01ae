"""How an operation on tracked arrays is recorded, what its node keeps, and its pullback.

A `Primitive` is a forward `f(xp, *args, **kw)` and one vector-Jacobian product per positional
argument, `vjp(g, ans, *args, **kw)` (`None` for an argument with no gradient). The vjps are
written with this package's functions and operators, which accept plain and tracked arrays alike:
a first-order pass calls them on plain arrays (fast), a nested pass on tracked ones (so the
gradient is itself differentiable). Broadcasting is undone in one place, `rules.shape.fit`.

Each primitive declares what its vjps read (`saves`), and its node keeps exactly that of the
output and of its tracked arguments: `multiply` saves its inputs, `exp` its output, `add`, `sum`
and reshapes nothing. A value a vjp does not read reaches it as a stand-in (its node) with the
value's shape and dtype only. Constants (numbers, plain arrays, keys) stay with the node as
they were given.

>>> import numpy as np, tracker_gpu as tg
>>> y = tg.exp(tg.param(np.array([0.0, 1.0])))
>>> tg.sum(y * 2.0)._node.saved is None  # the sum saves nothing; y * 2.0 saves only 2.0
True
"""

import functools
import importlib
import inspect
import math
import pickle
import sys
import threading
from types import ModuleType

import numpy as np

from . import backend, recording
from .backend import SCALARS, namespace_of
from .cuda import dispatch
from .cuda.dispatch import SKIPPED_TYPES  # changed in place, never rebound
from .nesting import NOT_TRACKING
from .recording import ACTIVE
from .tape import Node, leaf_node, next_serial

__all__ = ["Primitive", "ByPosition", "record", "tracking", "NOT_TRACKING", "no_gradient"]


def tracking():
    """Whether operations on tracked arrays record in this thread (not inside `notrack()`)."""
    return not (NOT_TRACKING and threading.get_ident() in NOT_TRACKING)


class Primitive:
    """A differentiable operation: forward `f(xp, *args, **kw)` and a vjp per argument.

    `saves` says what the vjps read besides the gradient: for each vjp, the names it reads
    among "ans" (the output) and the forward's parameters, as one string (`"ans"`, `"x y"`,
    `""` for nothing but shapes); a single string applies to every vjp. `None` (the default)
    saves the output and every tracked argument.

    `fused` is a fast path for first-order passes (by default the one `cuda.dispatch` has
    registered under `name`): `fused(ans, args, values, kw, g, pending)` returns the list of
    gradients (`tape.Total` where it added into the pending gradient itself, in one fused
    kernel, say) or None to fall back to the vjps. Nested passes always take the vjps, so
    that they stay differentiable. A fused forward registered under `name` likewise runs first
    and may decline.

    `signature` is a function whose signature the primitive shows instead of the forward's (the
    standard's `(x1, x2, /)` where the forward and `saves` say `x, y`).
    """

    def __init__(
        self,
        name,
        forward,
        vjps,
        doc=None,
        fused=None,
        saves=None,
        differentiable=True,
        signature=None,
    ):
        self.name = self.__name__ = self.__qualname__ = name
        self.differentiable = differentiable
        self.__signature__ = (
            _signature_without_namespace(forward)
            if signature is None
            else inspect.signature(signature)
        )
        fused_forward = dispatch.FORWARDS.get(name)
        self.forward = forward if fused_forward is None else _fused_first(fused_forward, forward)
        self._own_forward = forward  # its signature tells a caller's mistake from its own
        self.vjps = vjps
        self._first_vjp = next(iter(vjps), None)  # a variadic primitive's is by position
        if isinstance(vjps, tuple) and len(vjps) in (1, 2):
            self.pullback = self._pullback_one if len(vjps) == 1 else self._pullback_two
        self.fused = fused if fused is not None else dispatch.PULLBACKS.get(name)
        self.__doc__ = doc
        self._reads = _reads(saves, forward, vjps)
        self._plans = {}

    def __call__(self, *args, **kw):
        try:  # free where nothing is raised
            if len(args) == 1 and not NOT_TRACKING:
                kind = type(args[0])
                if kind is TrackedArray and (not ACTIVE or self._as_eager(args[0]._node)):
                    return _record_one(self, args[0], kw)  # the hot path: nothing to check
                if kind is np.ndarray:  # a plain NumPy array, as in a vjp (sin's of cos(x))
                    return self.forward(np, args[0], **kw) if kw else self.forward(np, args[0])
            for a in args:
                if type(a) is TrackedArray:
                    return _record(self, args, kw)
            xp = _namespace_of_plain(args)
            if xp is None:  # Python numbers in, a Python number out
                _check_number(self.name, args)
                return _as_number(self.forward(np, *args, **kw))
            if type(xp) is not ModuleType and hasattr(xp, "traced_rule"):  # tg.broadcast's
                return xp.traced_rule(self, args, kw)
            return self.forward(xp, *args, **kw)
        except TypeError as error:
            mismatch = _arguments_mismatch(
                self.name, self.__signature__, self._own_forward, error, args, kw
            )
            if mismatch is None:
                raise
            raise mismatch from None

    def _as_eager(self, node):
        """Whether, while tg.compile records, an operation on a tracked array of `node` is
        recorded as eagerly (`record` shows the recorder its node): a rule with a gradient of
        a value that is not data (`_record_traced` otherwise)."""
        return self.differentiable and not recording.is_data(node)

    def keeps(self, tracked_mask):
        """Which of `(output, *args)` a node keeps (positions, 0 for the output) when the
        arguments whose bits are set in `tracked_mask` are tracked."""
        plan = self._plans.get(tracked_mask)
        if plan is None:
            plan = self._plans[tracked_mask] = _plan(self._reads, tracked_mask)
        return plan

    def pullback(self, node, args, kw, saved, g, nested, pending=None):
        """The gradients of `args` given the gradient `g` of the output. One- and two-argument
        rules answer through `_pullback_one` and `_pullback_two` instead (set on the instance
        at construction: one Python call less a node on the hot path)."""
        if nested:
            ans, values = tracked_values(node, args, saved, g)
        else:
            if saved is None:
                ans, values = node, args
            else:
                ans, values = saved[0], saved[1:]
                if ans is None:
                    ans = node
            if self.fused is not None and type(g) not in SKIPPED_TYPES:
                grads = self.fused(ans, args, values, kw, g, pending)
                if grads is not None:
                    return grads
        grads = []
        for a, vjp in zip(args, self.vjps):
            if vjp is None or type(a) is not Node:
                grads.append(None)
                continue
            ga = vjp(g, ans, *values, **kw) if kw else vjp(g, ans, *values)
            if ga is not None and (
                ga.shape != a.shape or ga.dtype is not a.dtype and ga.dtype != a.dtype
            ):
                ga = _fit(ga, a, self.name)
            grads.append(ga)
        return grads

    def _pullback_one(self, node, args, kw, saved, g, nested, pending=None):
        """`pullback` of a one-argument rule, the same steps, fewer of them (the fused path,
        where it may apply, is `pullback`'s)."""
        fused = not nested and self.fused is not None and type(g) not in SKIPPED_TYPES
        if fused or len(args) != 1:
            return Primitive.pullback(self, node, args, kw, saved, g, nested, pending)
        vjp, a = self._first_vjp, args[0]
        if vjp is None or type(a) is not Node:
            return (None,)
        if nested:  # `tracked_values`, written out for one argument
            if saved is None:
                ans, x = node, a
            else:
                xp = g._xp if type(g) is TrackedArray else namespace_of(g)
                ans, x = saved
                ans = node if ans is None else _linked(ans, xp, node)
                if x is not a:
                    x = _linked(x, xp, a)
        elif saved is None:
            ans, x = node, a
        else:
            ans, x = saved
            if ans is None:
                ans = node
        ga = vjp(g, ans, x, **kw) if kw else vjp(g, ans, x)
        if ga is not None and (
            ga.shape != a.shape or ga.dtype is not a.dtype and ga.dtype != a.dtype
        ):
            ga = _fit(ga, a, self.name)
        return (ga,)

    def _pullback_two(self, node, args, kw, saved, g, nested, pending=None):
        """`pullback` of a two-argument rule: each tracked argument's vjp called directly (the
        fused path, where it may apply, is `pullback`'s)."""
        fused = not nested and self.fused is not None and type(g) not in SKIPPED_TYPES
        if fused or len(args) != 2:
            return Primitive.pullback(self, node, args, kw, saved, g, nested, pending)
        a, b = args
        if nested:  # `tracked_values`, written out for two arguments
            if saved is None:
                ans, x, y = node, a, b
            else:
                xp = g._xp if type(g) is TrackedArray else namespace_of(g)
                ans, x, y = saved
                ans = node if ans is None else _linked(ans, xp, node)
                if type(a) is Node and x is not a:
                    x = _linked(x, xp, a)
                if type(b) is Node and y is not b:
                    y = _linked(y, xp, b)
        elif saved is None:
            ans, x, y = node, a, b
        else:
            ans, x, y = saved
            if ans is None:
                ans = node
        vjp_x, vjp_y = self.vjps
        ga = gb = None
        if type(a) is Node and vjp_x is not None:
            ga = vjp_x(g, ans, x, y, **kw) if kw else vjp_x(g, ans, x, y)
            if ga is not None and (
                ga.shape != a.shape or ga.dtype is not a.dtype and ga.dtype != a.dtype
            ):
                ga = _fit(ga, a, self.name)
        if type(b) is Node and vjp_y is not None:
            gb = vjp_y(g, ans, x, y, **kw) if kw else vjp_y(g, ans, x, y)
            if gb is not None and (
                gb.shape != b.shape or gb.dtype is not b.dtype and gb.dtype != b.dtype
            ):
                gb = _fit(gb, b, self.name)
        return ga, gb

    def __repr__(self):
        return f"<tracked primitive {self.name}>"

    def __reduce__(self):
        # A primitive is one object that its vjps and the fused path know by identity: it is
        # pickled (and copied) as the module global that holds it, as a function is.
        return _global, _bound_at(self)


def _bound_at(primitive):
    """`(module, name)` of a module global that is `primitive`, this package's modules first."""
    modules = sorted(sys.modules.items(), key=lambda item: not item[0].startswith("tracker_gpu"))
    for module_name, module in modules:
        for name, value in list(getattr(module, "__dict__", {}).items()):
            if value is primitive:
                return module_name, name
    raise pickle.PicklingError(
        f"cannot pickle {primitive!r}: it is not a module's global; define it at the top level "
        "of a module (as the package's own primitives are) so that it is found by name"
    )


def _global(module_name, name):
    return getattr(importlib.import_module(module_name), name)


class ByPosition:
    """The vjps of a variadic primitive: `vjp(i, g, ans, *args, **kw)` for argument `i`."""

    def __init__(self, vjp):
        self.vjp = vjp

    def __iter__(self):
        i = 0
        while True:
            yield functools.partial(self.vjp, i)
            i += 1


# --- what a node saves
EVERYTHING = None


def _reads(saves, forward, vjps):
    """`saves` as a tuple of frozensets of positions in `(output, *args)` per vjp (one set for
    all when a single string is given), or EVERYTHING."""
    if saves is None:
        return EVERYTHING
    names = [p.name for p in list(inspect.signature(forward).parameters.values())[1:]]

    def positions(text):
        return frozenset(0 if word == "ans" else names.index(word) + 1 for word in text.split())

    if isinstance(saves, str):
        return positions(saves)
    if len(saves) != len(vjps):
        raise ValueError(f"saves names what {len(saves)} vjps read, for {len(vjps)} vjps")
    return tuple(positions(text) for text in saves)


def _plan(reads, tracked_mask):
    tracked = [i + 1 for i in range(tracked_mask.bit_length()) if tracked_mask >> i & 1]
    if reads is EVERYTHING:
        return (0, *tracked)
    if isinstance(reads, frozenset):
        wanted = reads if tracked else frozenset()
    else:
        wanted = frozenset().union(*(reads[i - 1] for i in tracked if i - 1 < len(reads)))
    return tuple(k for k in sorted(wanted) if k == 0 or k in tracked)


def saved_values(keep, value, values, args):
    """What a node keeps, as its pullback will read it: aligned with `(output, *args)`, the
    kept values, and the node's own arguments elsewhere (a parent's node stands in for a value
    that was not kept; constants are themselves); None when nothing is kept."""
    if not keep:
        return None
    saved = [None, *args]
    for k in keep:
        saved[k] = value if k == 0 else values[k - 1]
    return saved


def resolve(node, args, saved):
    """`(ans, values)` for a first-order pullback: the saved values, and stand-ins (nodes) for
    the values that were not saved; constants as they were given."""
    if saved is None:
        return node, args
    ans = saved[0]
    return (node if ans is None else ans), saved[1:]


def tracked_values(node, args, saved, g):
    """`(ans, values)` for a nested pullback: the output and the tracked arguments as tracked
    arrays linked to their nodes, so that what the vjps compute is recorded too.
    A value that was not saved stays its node, the stand-in a first-order pullback reads too
    (its vjps read its shape and dtype only)."""
    ans, values = resolve(node, args, saved)
    xp = g._xp if type(g) is TrackedArray else namespace_of(g)
    if ans is not node:
        ans = _linked(ans, xp, node)
    return ans, [_linked(v, xp, a) if type(a) is Node and v is not a else v
                 for a, v in zip(args, values)]  # fmt: skip


def _linked(value, xp, node):
    """A tracked array of `value` at `node`."""
    out = _new(TrackedArray)
    out.data, out._node, out._xp = value, node, xp
    return out


# --- recording
def _record(prim, args, kw):
    xp = None
    values, parents = [], []
    plain_arrays = False
    mask, bit = 0, 1
    for a in args:
        if type(a) is TrackedArray:
            if xp is None:
                xp = a._xp
            elif a._xp is not xp:
                xp = backend.common_library(xp, a.data)
            values.append(a.data)
            if a._node is None:  # a constant: to the node, like a plain array
                parents.append(a.data)
            else:
                parents.append(a._node)
                mask |= bit
        else:
            plain_arrays = plain_arrays or type(a) not in _NOT_ARRAYS
            values.append(a)
            parents.append(a)
        bit <<= 1
    if plain_arrays:
        xp = _library_with_plain_operands(xp, values)
    if len(values) > 1 and xp is not np:
        backend.check_same_device([v for v in values if backend.is_array(v)])
    if NOT_TRACKING and threading.get_ident() in NOT_TRACKING:
        return prim.forward(xp, *values, **kw)
    if not mask:  # constants (and plain arrays) only
        return constant(prim.forward(xp, *values, **kw), xp)
    if ACTIVE and recording.current() is not None:
        return _record_traced(prim, args, kw, xp, values)
    value = prim.forward(xp, *values, **kw)
    keep = prim._plans.get(mask)
    if keep is None:
        keep = prim.keeps(mask)
    saved = saved_values(keep, value, values, parents) if keep else None
    return record(value, xp, prim, tuple(parents), kw, saved)


def _record_traced(prim, args, kw, xp, values):
    """`_record` while tg.compile records: data (a traced value with no gradient: see
    `recording.DATA`) reaches the node as the constant it stands for, and what a rule with no
    gradient, or one of data alone, computes is data too."""
    parents, mask = [], 0
    for i, (a, v) in enumerate(zip(args, values)):
        tracked = type(a) is TrackedArray and a._node is not None and not recording.is_data(a._node)
        parents.append(a._node if tracked else v)
        mask |= tracked << i
    value = prim.forward(xp, *values, **kw)
    if not mask or not prim.differentiable:
        return traced_data(value, xp, (prim.forward, args, kw, False))
    keep = prim.keeps(mask)
    saved = saved_values(keep, value, values, parents) if keep else None
    return record(value, xp, prim, tuple(parents), kw, saved)


def traced_data(value, xp, how=None):
    """A data node's tracked array of `value` (see `recording.DATA`), shown to the recorder with
    how a replay computes it (None: the recorder places it itself)."""
    node = leaf_node(value.shape, value.dtype)
    node.grad = recording.DATA
    out = TrackedArray(value, xp, node)
    if how is not None:
        recording.current().node(out, how)
    return out


def detached(x):
    """`data(x)`, except while tg.compile records: a traced value then stays traced, as data
    (no gradient flows through it), so that what is computed from it (an optimiser's update,
    say) is replayed too."""
    if not (ACTIVE and type(x) is TrackedArray):
        return data(x)
    recorder = recording.current()
    if recorder is None:
        return x.data
    if recording.is_data(x._node):
        return x
    out = traced_data(x.data, x._xp)
    recorder.alias(out, x)
    return out


def no_gradient(name, forward, *, signature=None, shaped_by_data=False):
    """A function of arrays that carries no gradient, `forward(xp, *values, **kw)`: plain
    arrays in, plain arrays out; tracked ones in, tracked constants out, or, while tg.compile
    records, traced data that every replay computes anew (never a value frozen at the
    recording; refused where the result's shape depends on the data, `shaped_by_data`). The
    standard's functions with no gradient (comparisons, `argmax`, `unique_values`...) are
    these, shown with the standard's `signature` (a function's), and so is what library code
    computes from a traced value without a gradient (a mask, a sign, a statistic)."""
    traced = Primitive(name, forward, ByPosition(lambda i, *a, **k: None), saves="",
                       differentiable=False)  # fmt: skip

    shown = None if signature is None else inspect.signature(signature)
    most, keywords = _what_fits(shown)

    def function(*args, **kw):
        # checked first: the forward passes what it gets to the library, whose functions may
        # take more (NumPy's ufuncs take `out` second: tg.isnan(x, y) wrote into y)
        if len(args) > most or (kw and keywords is not None and not kw.keys() <= keywords):
            raise _arguments_mismatch(name, shown, None, TypeError(), args, kw)
        try:  # free where nothing is raised
            tracked = next((a for a in args if type(a) is TrackedArray), None)
            if tracked is not None and ACTIVE and recording.current() is not None:
                if shaped_by_data:
                    recording.refuse(f"{name}(x) of a traced array (its shape depends on the data)")
                return traced(*args, **kw)
            values = [data(a) for a in args]
            plain_kw = {k: data(v) for k, v in kw.items()} if kw else kw
            xp = tracked._xp if tracked is not None else _namespace_of_plain(values)
            value = traced.forward(xp, *values, **plain_kw)  # a fused forward registered first
            return value if tracked is None else constants(value, tracked._xp)
        except TypeError as error:
            mismatch = _arguments_mismatch(name, shown, None, error, args, kw)
            if mismatch is None:
                raise
            raise mismatch from None

    function.__name__ = function.__qualname__ = name
    function.primitive = traced  # what a recording records (`compiler.fusion` reads it)
    if shown is not None:
        function.__doc__ = f"The standard's `{name}`; not differentiable (a constant out)."
        function.__signature__ = shown
    return function


def _what_fits(signature):
    """`(most, keywords)`: how many positional arguments `signature` takes at most, and the
    names it takes by keyword (None: any)."""
    if signature is None:
        return math.inf, None
    parameters = signature.parameters.values()
    kinds = {p.kind for p in parameters}
    keywords = None
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        keywords = frozenset(p.name for p in parameters
                             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))  # fmt: skip
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return math.inf, keywords
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional for p in parameters), keywords


def _record_one(prim, x, kw):
    xp, data = x._xp, x.data
    value = prim.forward(xp, data, **kw) if kw else prim.forward(xp, data)
    if x._node is None:
        return constant(value, xp)
    keep = prim._plans.get(1)
    if keep is None:
        keep = prim.keeps(1)
    if not keep:
        saved = None
    elif keep == _INPUT:
        saved = [None, data]
    else:
        saved = saved_values(keep, value, (data,), (x._node,))
    return record(value, xp, prim, (x._node,), kw, saved)


_INPUT = (1,)  # what a unary rule's node keeps when its vjp reads its input (sin, log...)


_new = object.__new__


def record(value, xp, rule, args, ctx, saved=None, replay=None):
    """A tracked array of `value`, made by `rule` from `args` (parents' nodes and constants),
    its node keeping `saved` (aligned with `(value, *args)`, or None).

    While `tg.compile` records, the recorder sees the node, and `replay` says how a replay
    computes the value: `(function, inputs, keywords, makes_context)`, where
    `function(xp, *values, **keywords)` gives the value (or `(value, ctx)` if `makes_context`)
    from the values of `inputs` (nodes and constants). By default, the rule's forward on `args`.

    A value of a dtype that carries no gradient (integers, booleans) is a tracked constant (or,
    while tg.compile records, data that a replay computes).
    """
    dtype = value.dtype
    if dtype is not _FLOAT64 and dtype is not _FLOAT32:  # NumPy's: two identity tests
        differentiable = _DIFFERENTIABLE.get(id(dtype))  # (the id, a new integer, and the
        if differentiable is None:  # lookup: about 3% of an operation on a small array)
            differentiable = _differentiable(dtype)
        if not differentiable:
            if ACTIVE and recording.current() is not None:
                return traced_data(value, xp, replay or (rule.forward, args, ctx, False))
            return constant(value, xp)
    node = _new(Node)
    node.rule = rule  # one attribute a statement: four at once build a tuple
    node.args = args
    node.ctx = ctx
    node.saved = saved
    node.serial = next_serial()
    node.shape, node.dtype, node._g = value.shape, dtype, None
    out = _new(TrackedArray)
    out.data, out._node, out._xp = value, node, xp
    if ACTIVE:
        recorder = recording.current()
        if recorder is not None:
            recorder.node(out, replay or (rule.forward, args, ctx, False))
    return out


# Whether a dtype carries a gradient, by the dtype's id: libraries' dtypes do not compare with
# each other, and an id is the cheapest key. A dtype answered here is kept alive (`_SEEN`), so
# that its id is never another's; past `_MOST_SEEN` of them (dtypes made anew, as a parametric
# one may be) the answer is computed each time.
_DIFFERENTIABLE = {}
_SEEN = []
_FLOAT32, _FLOAT64 = backend.NUMPY_FLOATS


def _differentiable(dtype):
    """Whether values of `dtype` carry a gradient (real and complex floating point)."""
    known = backend.is_floating_dtype(dtype)
    if len(_SEEN) < _MOST_SEEN:
        _SEEN.append(dtype)
        _DIFFERENTIABLE[id(dtype)] = known
    return known


_MOST_SEEN = 256


def _signature_without_namespace(forward):
    """The forward's signature without its first parameter (the namespace `xp`)."""
    try:
        parameters = list(inspect.signature(forward).parameters.values())[1:]
        return inspect.Signature(parameters)
    except (TypeError, ValueError):
        return None


def _arguments_mismatch(name, signature, own, error, args, kw):
    """A TypeError naming the function's `signature` (the standard's) where `error` came of
    `args` and `kw` that do not fit it (`tg.max(x, 0)` said `_reduction_without_dtype.<locals>.
    forward() takes 2 positional arguments`); None for any other error: a subclass (a refusal
    to record), or one raised inside a forward (`own`, its function, takes the arguments)."""
    if type(error) is not TypeError or signature is None:
        return None
    if own is not None:
        try:
            inspect.signature(own).bind(None, *args, **kw)  # None for the namespace
            return None
        except (TypeError, ValueError):
            pass
    try:
        signature.bind(*args, **kw)
    except TypeError as mismatch:
        return TypeError(f"{name}{signature}: {mismatch}")
    return None


def _fused_first(fused, forward):
    """`forward`, with the fused forward tried first (it returns None where it does not apply)."""

    def forward_fused_first(xp, *args, **kw):
        if type(args[0]) in dispatch.SKIPPED_TYPES:  # NumPy outside on_host(): not taken
            return forward(xp, *args, **kw)
        value = fused(*args, **kw)
        return forward(xp, *args, **kw) if value is None else value

    return forward_fused_first


def _namespace_of_plain(args):
    for a in args:
        if type(a) is np.ndarray:  # the common case, without the general test
            return backend.widened(np, args)
        if backend.is_array(a):
            xp = namespace_of(a)
            return backend.widened(xp, args) if xp is np else xp
    return None


def _check_number(name, args):
    if args and type(args[0]) not in SCALARS:
        raise TypeError(
            f"{name} expects an array (or a Python number), got {type(args[0]).__name__}; "
            "convert it with the array library's asarray first"
        )


def _as_number(y):
    return y.item() if isinstance(y, (np.ndarray, np.generic)) and y.ndim == 0 else y


# Operands that are never arrays: numbers, and an index's parts (a key of getitem)
_NOT_ARRAYS = frozenset((*SCALARS, slice, tuple, type(None), type(Ellipsis)))


def _library_with_plain_operands(xp, values):
    for v in values:
        if backend.is_array(v):
            xp = backend.common_library(xp, v)
    return xp


# How a gradient is fitted to its argument (summed over the axes it was broadcast along, cast to
# its dtype): written with the rules' own functions, so that it is differentiable, and
# registered by them (rules.shape) when they load.
_fit = None


def fit_gradients_with(fit):
    """Have every pullback fit its gradients with `fit(ga, node, name)`."""
    global _fit
    _fit = fit


def fitted(ga, node, name):
    """`ga` fitted to its argument's node (summed over the axes it was broadcast along, cast to
    its dtype), as every pullback fits it; `name` the rule's, for a message."""
    return _fit(ga, node, name)


def record_saving_arguments(value, xp, rule, args, ctx, replay):
    """A tracked array of `value` whose node keeps every tracked argument's data (for a rule
    that runs a forward again: a custom rule's nested pass, a checkpoint); `replay(*values)`
    gives `(value, ctx)` again, for tg.compile."""
    saved = [None] + [a.data if type(a) is TrackedArray else a for a in args]
    parents = tuple(a._node if type(a) is TrackedArray else a for a in args)
    how = (lambda xp, *values: replay(*values), parents, {}, True)
    return record(value, xp, rule, parents, ctx, saved, how)


# The tracked array and the rules are defined in terms of each other: resolved once both exist.
from .tracked import TrackedArray, constant, constants, data  # noqa: E402
