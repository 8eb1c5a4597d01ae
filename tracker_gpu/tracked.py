"""The tracked array, and how an operation on one is recorded.

A `Primitive` is a forward `f(xp, *args, **kw)` and one vector-Jacobian product per positional
argument, `vjp(g, ans, *args, **kw)` (`None` for an argument with no gradient). The vjps are
written with this package's functions and operators, which accept plain and tracked arrays alike:
a first-order pass calls them on plain arrays (fast), a nested pass on tracked ones (so the
gradient is itself differentiable). Broadcasting is undone in one place, `_fit`.
"""

import functools
import inspect
import threading

import numpy as np

from . import backend
from .backend import SCALARS, namespace_of
from .cuda import dispatch
from .tape import Node

__all__ = [
    "TrackedArray",
    "Primitive",
    "ByPosition",
    "rule",
    "param",
    "data",
    "grad",
    "istracked",
    "isleaf",
    "zero_grad",
    "update",
]


class TrackedArray(Node):
    """An array of any Array API library whose operations are recorded for differentiation.

    A 0-d TrackedArray plays the role of Tracker's `TrackedReal`.

    >>> import numpy as np, tracker_gpu as tg
    >>> x = tg.param(np.array([1.0, 2.0]))
    >>> y = tg.sum(x * x)
    >>> float(y)
    5.0
    """

    __slots__ = ("data", "_xp")
    # NumPy (and CuPy) defer to our reflected operators instead of unwrapping us.
    __array_ufunc__ = None
    __array_priority__ = 1000

    def __init__(self, value, xp, rule=None, args=(), ctx=None):
        self.data = value
        self._xp = xp
        self._rule = rule
        self._args = args
        self._ctx = ctx
        self._grad = None
        self._n = 0
        self._g = None

    # --- attributes of the Array API array object
    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: backend.size_of(self.data))
    device = property(lambda self: backend.device_of(self.data))
    T = property(lambda self: permute_dims(self, tuple(range(self.ndim - 1, -1, -1))))
    mT = property(lambda self: matrix_transpose(self))

    def __array_namespace__(self, *, api_version=None):
        from .namespace import namespace_for

        return namespace_for(self._xp)

    def to_device(self, device, /, *, stream=None):
        return to_device(self, device)

    def __array__(self, *args, **kwargs):
        raise TypeError(
            "converting a TrackedArray to a NumPy array would drop its gradient tape; "
            "use tg.data(x) for the plain value"
        )

    # --- arithmetic: recorded (+ - * / ** are declared with the operator table at the end)
    def __matmul__(self, other):
        return matmul(self, other)

    def __rmatmul__(self, other):
        return matmul(other, self)

    def __floordiv__(self, other):
        return floor_divide(self, other)

    def __rfloordiv__(self, other):
        return floor_divide(other, self)

    def __mod__(self, other):
        return remainder(self, other)

    def __rmod__(self, other):
        return remainder(other, self)

    def __neg__(self):
        return negative(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return abs(self)

    def __getitem__(self, key):
        return getitem(self, key)

    def __setitem__(self, key, value):
        raise TypeError(
            "cannot assign into a TrackedArray: in-place writes would corrupt the recorded "
            "gradient. Build a new array instead, e.g. tg.where(mask, value, x), "
            "tg.concat([...]), or assign into tg.data(x) outside differentiation"
        )

    # --- comparisons: plain boolean arrays, as in Tracker
    def __lt__(self, other):
        return self.data < data(other)

    def __le__(self, other):
        return self.data <= data(other)

    def __gt__(self, other):
        return self.data > data(other)

    def __ge__(self, other):
        return self.data >= data(other)

    def __eq__(self, other):
        return self.data == data(other)

    def __ne__(self, other):
        return self.data != data(other)

    __hash__ = None

    # --- Python conversions
    def __float__(self):
        return float(self.data)

    def __int__(self):
        return int(self.data)

    def __bool__(self):
        return bool(self.data)

    def __complex__(self):
        return complex(self.data)

    def __index__(self):
        raise TypeError("a TrackedArray holds floats and cannot be used as an index")

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tracked array")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        if self._rule is None:
            kind = "leaf"
        else:
            kind = f"rule={getattr(self._rule, 'name', '?')}"
        return f"TrackedArray({self.data!r}, {kind})"


class Primitive:
    """A differentiable operation: forward `f(xp, *args, **kw)` and a vjp per argument.

    `fused` is a fast path for first-order passes (by default the one `cuda.dispatch` has
    registered under `name`): `fused(node, args, kw, g, pending)` returns the list of gradients
    (`tape.Total` where it added into the pending gradient itself, in one fused kernel, say) or
    None to fall back to the vjps. Nested passes always take the vjps, so that they stay
    differentiable. A fused forward registered under `name` likewise runs first and may decline.
    """

    def __init__(self, name, forward, vjps, doc=None, fused=None):
        self.name = self.__name__ = self.__qualname__ = name
        self.__signature__ = _signature_without_namespace(forward)
        fused_forward = dispatch.FORWARDS.get(name)
        self.forward = forward if fused_forward is None else _fused_first(fused_forward, forward)
        self.vjps = vjps
        self.fused = fused if fused is not None else dispatch.PULLBACKS.get(name)
        self.__doc__ = doc

    def __call__(self, *args, **kw):
        for a in args:
            if type(a) is TrackedArray:
                return _record(self, args, kw)
        xp = _namespace_of_plain(args)
        if xp is None:  # Python numbers in, a Python number out
            return _as_number(self.forward(np, *args, **kw))
        return self.forward(xp, *args, **kw)

    def pullback(self, node, args, kw, g, nested, pending=None):
        if nested:
            ans, values = node, args
        else:
            ans = node.data
            if self.fused is not None and type(ans) not in dispatch.SKIPPED_TYPES:
                grads = self.fused(node, args, kw, g, pending)
                if grads is not None:
                    return grads
            values = [a.data if type(a) is TrackedArray else a for a in args]
        grads = []
        for a, vjp in zip(args, self.vjps):
            if vjp is None or type(a) is not TrackedArray:
                grads.append(None)
                continue
            ga = vjp(g, ans, *values, **kw) if kw else vjp(g, ans, *values)
            if ga is not None and (ga.shape != a.data.shape or ga.dtype != a.data.dtype):
                ga = _fit(ga, a, self.name)
            grads.append(ga)
        return grads

    def __repr__(self):
        return f"<tracked primitive {self.name}>"


# Threads inside a `notrack()` block: their operations record nothing.
NOT_TRACKING = set()


class ByPosition:
    """The vjps of a variadic primitive: `vjp(i, g, ans, *args, **kw)` for argument `i`."""

    def __init__(self, vjp):
        self.vjp = vjp

    def __iter__(self):
        i = 0
        while True:
            yield functools.partial(self.vjp, i)
            i += 1


def _fused_first(fused, forward):
    """`forward`, with the fused forward tried first (it returns None where it does not apply)."""

    def forward_fused_first(xp, *args, **kw):
        value = fused(*args, **kw)
        return forward(xp, *args, **kw) if value is None else value

    return forward_fused_first


def _signature_without_namespace(forward):
    """The forward's signature without its first parameter (the namespace `xp`)."""
    try:
        parameters = list(inspect.signature(forward).parameters.values())[1:]
        return inspect.Signature(parameters)
    except (TypeError, ValueError):
        return None


def _namespace_of_plain(args):
    for a in args:
        if backend.is_array(a):
            xp = namespace_of(a)
            return backend.widened(xp, args) if xp is np else xp
    return None


def _as_number(y):
    return y.item() if isinstance(y, (np.ndarray, np.generic)) and y.ndim == 0 else y


def _record(prim, args, kw):
    xp = None
    values = []
    plain_arrays = False
    for a in args:
        if type(a) is TrackedArray:
            if xp is None:
                xp = a._xp
            elif a._xp is not xp:
                xp = backend.common_library(xp, a.data)
            values.append(a.data)
        else:
            plain_arrays = plain_arrays or type(a) not in SCALARS
            values.append(a)
    if plain_arrays:
        xp = _library_with_plain_operands(xp, values)
    if len(values) > 1 and xp is not np:
        backend.check_same_device([v for v in values if backend.is_array(v)])
    if NOT_TRACKING and threading.get_ident() in NOT_TRACKING:
        return prim.forward(xp, *values, **kw)
    return _node(prim.forward(xp, *values, **kw), xp, prim, args, kw)


_new = object.__new__


def _node(value, xp, rule, args, ctx):
    """An interior node (its `_grad` slot is never read: gradients are kept for leaves only)."""
    node = _new(TrackedArray)
    node.data, node._xp, node._rule, node._args, node._ctx = value, xp, rule, args, ctx
    node._n, node._g = 0, None
    return node


def _library_with_plain_operands(xp, values):
    for v in values:
        if backend.is_array(v):
            xp = backend.common_library(xp, v)
    return xp


def _fit(ga, a, name):
    """Sum a gradient down to the shape of its argument, and cast it to the argument's dtype."""
    shape = a.shape
    if ga.shape != shape:
        ga = unbroadcast(ga, shape, name)
    if ga.dtype != a.dtype:
        ga = astype(ga, a.dtype)
    return ga


# --- custom rules: Tracker's `track` + `@grad`


class _CustomRule:
    def __init__(self, fn):
        self.fn = fn
        self.name = getattr(fn, "__name__", "custom rule")

    def pullback(self, node, args, ctx, g, nested, pending=None):
        pb, kw = ctx
        if nested:  # re-run the forward on tracked arguments, so the pullback is recorded too
            _, pb = self.fn(*args, **kw)
        grads = pb(g)
        if not isinstance(grads, tuple) or len(grads) != len(args):
            raise ValueError(
                f"the pullback of custom rule {self.name!r} must return a tuple with one "
                f"gradient (or None) per positional argument: {len(args)}, got {grads!r:.80}"
            )
        return [
            None if ga is None or not isinstance(a, TrackedArray) else self._checked(ga, a)
            for a, ga in zip(args, grads)
        ]

    def _checked(self, ga, a):
        """A user's gradient must be of the argument's library and on its device."""
        plain = data(ga)
        backend.common_library(a._xp, plain)
        if backend.device_of(plain) != a.device:
            raise ValueError(
                f"the pullback of custom rule {self.name!r} returned a gradient on device "
                f"{backend.device_of(plain)} for an argument on device {a.device}; create it "
                f"on the argument's device"
            )
        return _fit(ga, a, self.name)


def rule(fn):
    """Turn `fn(*args) -> (y, pullback)` into a tracked operation (Tracker's `@grad`).

    `fn` receives plain arrays and returns the plain result and a pullback that maps the
    gradient of the result to a tuple with one gradient (or `None`) per positional argument.
    Write the pullback with tracker_gpu functions and it is differentiable again (`nest=True`).

    >>> import numpy as np, tracker_gpu as tg
    >>> @tg.rule
    ... def cube(x):
    ...     return x**3, lambda g: (g * 3 * x**2,)
    >>> tg.gradient(lambda x: tg.sum(cube(x)), np.array([1.0, 2.0]))[0]
    array([ 3., 12.])
    """
    custom = _CustomRule(fn)

    @functools.wraps(fn)
    def tracked_fn(*args, **kw):
        if not any(isinstance(a, TrackedArray) for a in args):
            return fn(*args, **kw)[0]
        xp = next(a._xp for a in args if isinstance(a, TrackedArray))
        returned = fn(*(data(a) for a in args), **kw)
        if not (isinstance(returned, tuple) and len(returned) == 2 and callable(returned[1])):
            raise TypeError(
                f"custom rule {custom.name!r} must return (value, pullback), got "
                f"{type(returned).__name__}"
            )
        y, pb = returned
        if isinstance(y, TrackedArray):
            raise TypeError(
                f"custom rule {custom.name!r} must return a plain array, not a tracked one"
            )
        return TrackedArray(y, xp, custom, args, (pb, kw))

    return tracked_fn


# --- Tracker's API on tracked values


def param(x):
    """A leaf to differentiate with respect to: always a float copy of `x`.

    Integers and booleans become the library's default float dtype; float32 stays float32.
    `param` of a tracked value is an identity op that stays linked to its tape.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.param(np.array([1, 2]))
    TrackedArray(array([1., 2.]), leaf)
    """
    if isinstance(x, TrackedArray):
        return identity(x)
    if type(x) in SCALARS:
        x = np.float64(x)
    xp = namespace_of(x)
    device = backend.device_of(x)
    dtype = _float_dtype(xp, x, device)
    return TrackedArray(xp.asarray(x, dtype=dtype, device=device, copy=True), xp)


def _float_dtype(xp, x, device):
    if xp.isdtype(x.dtype, "real floating"):
        return x.dtype
    if xp.isdtype(x.dtype, "complex floating"):
        raise TypeError(
            "complex arrays are not supported yet; differentiate the real and imaginary "
            "parts as separate real arrays"
        )
    if xp.isdtype(x.dtype, ("integral", "bool")):
        return xp.__array_namespace_info__().default_dtypes(device=device)["real floating"]
    raise TypeError(f"cannot make a parameter of dtype {x.dtype}; pass a numeric array")


def leaf(x):
    """A leaf over `x` itself (no copy): how gradient() tracks its inputs."""
    if type(x) in SCALARS:
        return param(x)
    xp = namespace_of(x)
    if not xp.isdtype(x.dtype, "real floating"):
        return param(x)
    return TrackedArray(x, xp)


def data(x):
    """The plain array inside a tracked value; anything else is returned unchanged."""
    return x.data if isinstance(x, TrackedArray) else x


def istracked(x):
    return isinstance(x, TrackedArray)


def isleaf(x):
    return isinstance(x, TrackedArray) and x._rule is None


def grad(x):
    """The gradient accumulated in a leaf (zeros before any backward pass).

    >>> import numpy as np, tracker_gpu as tg
    >>> x = tg.param(np.array([3.0]))
    >>> tg.back(tg.sum(x * x))
    >>> tg.grad(x)
    array([6.])
    """
    if not isinstance(x, TrackedArray):
        raise TypeError(f"grad needs a tracked value (tg.param(x)), got {type(x).__name__}")
    if x._rule is not None:
        raise ValueError(
            "gradients are kept only for leaves (made by tg.param); use tg.gradient(f, x) "
            "or tg.hook to see the gradient of an intermediate value"
        )
    if x._grad is None:
        return x._xp.zeros_like(x.data)
    return x._grad


def zero_grad(x):
    """Reset the accumulated gradient of a leaf to zero."""
    if not isleaf(x):
        raise TypeError(f"zero_grad needs a leaf made by tg.param, got {type(x).__name__}")
    x._grad = None


def update(x, dx):
    """Tracker's `update!`: `x.data += dx` (as a new buffer of x's dtype), then zero the
    gradient. The step may be a number or an array of x's library that broadcasts to x."""
    if not isleaf(x):
        raise TypeError("update needs a leaf made by tg.param")
    xp, dx = x._xp, data(dx)
    if type(dx) in SCALARS or isinstance(dx, (list, tuple)):
        dx = xp.asarray(dx, dtype=x.dtype, device=x.device)
    backend.check_same_library(xp, dx)
    if xp.isdtype(dx.dtype, "complex floating"):
        raise TypeError("update: a complex step for a real parameter; pass a real step")
    shape, step_shape = tuple(x.shape), tuple(dx.shape)
    if step_shape != shape and not _broadcasts(step_shape, shape):
        raise ValueError(f"update of an array of shape {shape} by a step of shape {step_shape}")
    x.data = xp.astype(x.data + dx, x.dtype, copy=False)
    x._grad = None
    return x


def _broadcasts(shape, target):
    """Whether `shape` broadcasts to `target` without changing it."""
    lead = len(target) - len(shape)
    return lead >= 0 and all(n in (1, m) for n, m in zip(shape, target[lead:]))


# The rules are defined in terms of TrackedArray; the operators above resolve these names at
# call time, once the rule modules have been imported.
from .rules.elementwise import (  # noqa: E402
    abs,
    add,
    astype,
    divide,
    floor_divide,
    identity,
    multiply,
    negative,
    pow,
    remainder,
    subtract,
)
from .rules.linalg import matmul, matrix_transpose  # noqa: E402
from .rules.shape import getitem, permute_dims, to_device, unbroadcast  # noqa: E402

# --- the arithmetic operators. With a Python number on the other side there is nothing to
# check (no other array, library or device), so they record directly: the hottest path.
_NO_KEYWORDS = {}


def _operators(prim):
    def operator(self, other):
        if type(other) in SCALARS and not NOT_TRACKING:
            value = prim.forward(self._xp, self.data, other)
            return _node(value, self._xp, prim, (self, other), _NO_KEYWORDS)
        return prim(self, other)

    def reflected(self, other):
        if type(other) in SCALARS and not NOT_TRACKING:
            value = prim.forward(self._xp, other, self.data)
            return _node(value, self._xp, prim, (other, self), _NO_KEYWORDS)
        return prim(other, self)

    return operator, reflected


for _name, _prim in (("add", add), ("sub", subtract), ("mul", multiply), ("truediv", divide),
                     ("pow", pow)):  # fmt: skip
    _forward, _reflected = _operators(_prim)
    setattr(TrackedArray, f"__{_name}__", _forward)
    setattr(TrackedArray, f"__r{_name}__", _reflected)
