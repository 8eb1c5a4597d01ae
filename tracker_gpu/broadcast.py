"""Tracker's broadcast: a scalar function of several arrays as ONE tape node.

`broadcast(f, *args)` traces `f` once per function and dtype signature into an expression (by
running it on symbols whose namespace records what is done to them), differentiates the
expression symbolically, and records one node whose forward evaluates the expression and whose
pullback evaluates every partial derivative at once. On CuPy both are single generated kernels
(`cuda.codegen`); elsewhere the expression is evaluated with the array namespace, and in a nested
pass with tracked functions, so it stays differentiable.

>>> import numpy as np, tracker_gpu as tg
>>> f = lambda x, y: tg.exp(x) * y + tg.sin(y)
>>> x, y = np.array([0.0, 1.0]), np.array([2.0])
>>> tg.gradient(lambda x, y: tg.sum(tg.broadcast(f, x, y)), x, y)[0]
array([2.        , 5.43656366])
"""

import sys
import threading
from collections import OrderedDict

import numpy as np

from .backend import SCALARS, device_of, full_exactly, is_floating_dtype, namespace_of
from .cuda import codegen
from .expr import (
    ONE,
    RULES,
    SPECIAL,
    ZERO,
    Expr,
    const,
    derivatives,
    narrow_nodes,
    partials,
    pullbacks,
    topological,
)
from .primitive import ByPosition, Primitive
from .rules import special, special_julia
from .rules.elementwise import conjugate_derivative, is_complex, real_dtype
from .tracked import TrackedArray, data

__all__ = ["broadcast", "trace", "Expr"]


# --- symbols: what `f` is traced with
class Symbol:
    """Stands for one scalar argument while `f` is traced; records every operation on it."""

    __array_priority__ = 1000
    __array_ufunc__ = None
    dtype = "float64"
    device = "symbolic"
    shape = ()
    ndim = 0

    def __init__(self, expr):
        self.expr = expr

    def __array_namespace__(self, api_version=None):
        return SYMBOLIC

    def __getattr__(self, name):
        raise AttributeError(f"broadcast: {name!r} of a traced value is not supported inside f")


def _expr(a):
    if isinstance(a, Symbol):
        return a.expr
    if type(a) is complex:
        raise TypeError(
            f"broadcast: f may combine its arguments and real Python numbers, got {a!r}; pass "
            "the complex number as an argument of f instead"
        )
    if type(a) in SCALARS:
        return const(a)
    raise TypeError(
        f"broadcast: f may combine its arguments and Python numbers only, got {type(a).__name__}"
    )


def _op(name, *args):
    return Symbol(Expr(name, tuple(_expr(a) for a in args)))


def _operator(name, reflected=False):
    if reflected:
        return lambda self, other: _op(name, other, self)
    return lambda self, other: _op(name, self, other)


for _name, _op_name in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                        ("truediv", "divide"), ("pow", "pow")]:  # fmt: skip
    setattr(Symbol, f"__{_name}__", _operator(_op_name))
    setattr(Symbol, f"__r{_name}__", _operator(_op_name, reflected=True))
for _name in ("gt", "ge", "lt", "le"):
    setattr(Symbol, f"__{_name}__", _operator(_name))


def _equality(name):
    """`==` and `!=` on a traced value: an operation with a number or another traced value;
    with anything else, Python's identity comparison."""

    def compare(self, other):
        if isinstance(other, Symbol) or type(other) in SCALARS:
            return _op(name, self, other)
        return NotImplemented

    return compare


def _no_truth_value(self):
    raise TypeError("broadcast: a traced value has no truth value inside f; select with tg.where")


Symbol.__eq__, Symbol.__ne__ = _equality("eq"), _equality("ne")
Symbol.__hash__ = object.__hash__
Symbol.__bool__ = _no_truth_value
Symbol.__neg__ = lambda self: _op("negative", self)
Symbol.__pos__ = lambda self: self
Symbol.__abs__ = lambda self: _op("abs", self)


class _SymbolicNamespace:
    """The namespace the symbols report: each function records an operation."""

    __name__ = "tracker_gpu.broadcast.symbolic"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in RULES:
            return lambda *args: _op(name, *args)
        if name in _COMPARISONS:
            return lambda *args: _op(_COMPARISONS[name], *args)
        raise TypeError(f"broadcast: {name!r} is not an elementwise function broadcast can fuse")

    def special_function(self, name):
        """`tg.special`'s function `name` on traced values (`special_libraries` asks for it):
        an operation of the generated kernels, or a TypeError naming what is not one."""
        if name == "polygamma":
            return _polygamma
        if name not in SPECIAL:
            raise TypeError(
                f"broadcast: tg.special.{name} is not a function broadcast can fuse (it fuses "
                f"{', '.join(sorted(SPECIAL))}); call it on the arrays outside f"
            )
        return lambda *args: _op(name, *args)

    def zeros_like(self, x, **kw):
        return Symbol(ZERO)

    def ones_like(self, x, **kw):
        return Symbol(ONE)

    def asarray(self, value, **kw):
        return Symbol(const(value))

    def traced_rule(self, rule, args, kw):
        """A rule of the namespace called inside f: its forward traced, and differentiated by
        the rule's own vjps (traced too), so that broadcast's derivative is the rule's at every
        point, where the forward's formula may take another branch (at 0, at infinities). An
        operation of the table (`expr.RULES`, `SPECIAL`) is that operation."""
        out = rule.forward(self, *args, **kw)
        if (rule.name in RULES or rule.name in SPECIAL or kw or not isinstance(out, Symbol)
                or out.expr.op in ("arg", "const")):  # fmt: skip
            return out
        derivatives = _Derivatives(rule, args)
        ruled = derivatives.out = Symbol(Expr("ruled", (out.expr, *map(_expr, args)),
                                              value=derivatives))  # fmt: skip
        return ruled

    def isdtype(self, dtype, kind):
        """A symbol's dtype (`Symbol.dtype`) is real floating."""
        kinds = (kind,) if isinstance(kind, str) else kind
        return any(k in ("real floating", "numeric") for k in kinds)


class _Derivatives:
    """A traced rule's partial derivatives, each its vjp of a gradient 1, traced when first
    asked for (a rule's vjp may call another whose vjp calls the first: sind and cosd)."""

    def __init__(self, rule, args):
        self.rule, self.args, self.traced = rule, args, None
        self.out = None  # the rule's value, as the vjps read it: differentiated as the rule

    def __call__(self, forward, args):
        """The partials in the expressions `args`, as expressions (None: no gradient); where a
        vjp does not trace, the derivatives of the rule's traced `forward` itself."""
        if self.traced is None:
            try:
                self.traced = tuple(self._partial(vjp) for _, vjp in zip(self.args, self.rule.vjps))
            except (TypeError, AttributeError, ValueError, NotImplementedError):
                self.traced = tuple(derivatives(forward, list(args)))
        return self.traced

    def _partial(self, vjp):
        if vjp is None:
            return None
        d = vjp(Symbol(ONE), self.out, *self.args)
        return None if d is None else _expr(d)


POLYGAMMA_MAX_ORDER = 16  # kernels/special.cuh computes up to 24, for derivatives of these


def _polygamma(n, x):
    if not (type(n) is int and 0 <= n <= POLYGAMMA_MAX_ORDER):
        raise TypeError(
            f"broadcast: tg.special.polygamma fuses orders 0 to {POLYGAMMA_MAX_ORDER} given as a "
            f"Python int, got {n!r}; call it on the arrays outside f"
        )
    return _op("digamma", x) if n == 0 else _op("polygamma", n, x)


_COMPARISONS = {"greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le",
                "equal": "eq", "not_equal": "ne"}  # fmt: skip
SYMBOLIC = _SymbolicNamespace()


def trace(f, n):
    """The expression `f` computes from `n` scalar arguments."""
    out = f(*(Symbol(Expr("arg", value=i)) for i in range(n)))
    return _expr(out)


def evaluate(expr, xp, args):
    """The value of `expr` for these arguments, computed with namespace `xp`.

    An operation on Python numbers alone runs on 0-d arrays of the dtype a kernel computes in
    (`_Numbers`), so it gives the IEEE result (`1 / 0.0` is inf, `log(-1.0)` nan) as a kernel
    does, where Python's own arithmetic would raise or round in another precision."""
    numbers = _Numbers(xp, args)
    values = {}
    for node in topological([expr], rules_whole=True):
        if node.op == "arg":
            values[id(node)] = args[node.value]
        elif node.op == "const":
            values[id(node)] = node.value
        elif node.op == "narrow":  # a gradient cast to its node's dtype, as the tape fits it
            value = values[id(node.args[0])]
            values[id(node)] = value if type(value) in SCALARS else xp.astype(value, node.value)
        elif node.op == "ruled":  # the rule itself: in a nested pass, its own vjps
            operands = [values[id(c)] for c in node.args[1:]]
            if all(type(v) in SCALARS for v in operands):
                operands = list(map(numbers, operands))
            values[id(node)] = node.value.rule(*operands)
        else:
            operands = [values[id(c)] for c in node.args]
            values[id(node)] = _apply(xp, node.op, operands, numbers)
    return values[id(expr)]


class _Numbers:
    """Python numbers as 0-d arrays of the arguments' promoted floating dtype, on their device
    (made once asked for: a plain expression of arrays never needs one)."""

    def __init__(self, xp, args):
        self.xp, self.arrays = xp, [a for a in args if type(a) not in SCALARS]
        self.dtype = None

    def __call__(self, value):
        if type(value) not in SCALARS:
            return value
        if self.dtype is None:
            self.dtype = _computing_dtype(self.xp, self.arrays)
        device = device_of(data(self.arrays[0])) if self.arrays else None
        return full_exactly(self.xp, (), value, dtype=self.dtype, device=device)


def _computing_dtype(xp, arrays):
    """The real floating dtype the arrays promote to (float64 for none, or for integers)."""
    if not arrays:
        return xp.float64
    dtype = xp.result_type(*arrays)
    if is_floating_dtype(dtype):
        return real_dtype(xp, dtype)
    return xp.float64


def _apply(xp, op, values, numbers):
    if op in SPECIAL:
        return _special(op, values, numbers)
    if op in _COMPARE:
        return _COMPARE[op](values[0], values[1])
    if op == "where":
        if type(values[0]) is bool:  # a condition on Python numbers only
            return values[1] if values[0] else values[2]
        return xp.where(values[0], *map(numbers, values[1:]))
    if all(type(v) in SCALARS for v in values):
        values = list(map(numbers, values))
    if op in _ARITHMETIC:  # operators: a Python number on one side stays weakly typed
        return _ARITHMETIC[op](*values)
    if op in ("maximum", "minimum"):
        return getattr(xp, op)(*map(numbers, values))
    return getattr(xp, op)(values[0])


def _special(op, values, numbers):
    """tg.special's function `op` (its rule, so a nested pass stays differentiable)."""
    if op == "polygamma":  # the order is a number, not an array
        return special.polygamma(int(values[0]), numbers(values[1]))
    function = getattr(special, op, None) or getattr(special_julia, op)
    return function(*map(numbers, values))


_COMPARE = {"gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b,
            "le": lambda a, b: a <= b, "eq": lambda a, b: a == b,
            "ne": lambda a, b: a != b}  # fmt: skip
_ARITHMETIC = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b,
               "multiply": lambda a, b: a * b, "divide": lambda a, b: a / b,
               "pow": lambda a, b: a**b}  # fmt: skip


def _as_broadcast(xp, value, args):
    """`value` with the shape of all of `args` broadcast together, and a floating value with
    their promoted dtype, as a kernel writes it: an argument the expression does not use
    still broadcasts (and promotes) the result."""
    arrays = [a for a in args if type(a) not in SCALARS]
    if not arrays:
        return value
    shape = np.broadcast_shapes(*(tuple(a.shape) for a in arrays))
    floating = all(is_floating_dtype(a.dtype) for a in arrays)
    if type(value) in SCALARS:  # f used Python numbers alone
        dtype = xp.result_type(*arrays) if floating else None
        return xp.full(shape, value, dtype=dtype, device=device_of(arrays[0]))
    if floating and is_floating_dtype(value.dtype):
        dtype = xp.result_type(*arrays)
        value = value if value.dtype == dtype else xp.astype(value, dtype)
    return value if tuple(value.shape) == shape else xp.broadcast_to(value, shape)


# --- the tape node
class _Compiled:
    """One traced function: its expression, its partial derivatives, and the primitive that
    records it (on CuPy, its forward and pullback are generated kernels: `cuda.codegen`)."""

    def __init__(self, f, n, dtypes=()):
        self.name = f"broadcast({getattr(f, '__name__', 'f')})"
        self.out = trace(f, n)
        self.partials = partials(self.out, n)  # complex arguments: g * conj(partial)
        self.narrow_args, self.weak_args, narrow = _mixed(dtypes)
        self.narrow = narrow_nodes([self.out], self.narrow_args, self.weak_args)
        # the pullbacks read the output's gradient as one more argument
        self.pullbacks = pullbacks(self.out, n, Expr("arg", value=n), self.narrow, narrow)
        self.not_holomorphic = sorted({x.op for x in topological([self.out])} - _HOLOMORPHIC)
        self.primitive = Primitive(
            self.name, self.forward, ByPosition(self.vjp), fused=self.fused_pullback
        )

    def forward(self, xp, *args):
        fused = codegen.forward(self, args)
        if fused is not None:
            return fused
        return _as_broadcast(xp, evaluate(self.out, xp, list(args)), args)

    def vjp(self, i, g, ans, *args):
        tracked = any(isinstance(a, TrackedArray) for a in (g, *args))
        xp = sys.modules["tracker_gpu.namespace"] if tracked else namespace_of(data(g))
        if is_complex(g) or any(is_complex(a) for a in args):
            # g * conj(f'), f being holomorphic (see `broadcast`)
            return g * conjugate_derivative(evaluate(self.partials[i], xp, list(args)))
        if self.pullbacks[i] is ZERO:  # an argument f does not read
            return xp.zeros_like(g)
        return evaluate(self.pullbacks[i], xp, [*args, g])

    def fused_pullback(self, ans, args, values, kw, g, pending):
        return codegen.backward(self, ans, args, values, g)


def _mixed(dtypes):
    """`(narrow, weak, dtype)`: the positions of the float32 arguments where others are float64
    (whose operations NumPy computes in float32: `expr.narrow_nodes`), else none; those of the
    Python numbers; and float32 where some are narrow."""
    weak = frozenset(i for i, d in enumerate(dtypes) if d is None)
    names = [str(d) for d in dtypes]
    if "float64" not in names or "float32" not in names:
        return frozenset(), weak, None
    return frozenset(i for i, n in enumerate(names) if n == "float32"), weak, np.dtype("float32")


# What broadcast differentiates for complex arguments: the functions whose derivative is one
# complex number (conjugated in the vjp).
_HOLOMORPHIC = frozenset(
    "arg const add subtract multiply divide pow negative exp expm1 log log1p sqrt square "
    "reciprocal sin cos tan sinh cosh tanh ruled".split()
)

# Traced functions, least recently used first; define f once rather than a new lambda per call.
_CACHE = OrderedDict()
_CACHE_SIZE = 512
_CACHE_LOCK = threading.Lock()  # threads share it: one may evict what another just found


def _cached(key):
    """The traced function of `key`, now the most recently used, or None."""
    with _CACHE_LOCK:
        compiled = _CACHE.get(key)
        if compiled is not None:
            _CACHE.move_to_end(key)
        return compiled


def broadcast(f, *args):
    """`f` applied elementwise to the broadcast arguments, as one differentiable operation.

    `f` is a scalar function written with tracker_gpu's elementwise functions and operators and
    `tg.special`'s functions that the generated kernels know (`expr.SPECIAL`: erf, gammaln,
    digamma, polygamma of orders 0 to 16, ndtr, xlogy, the Bessel functions, ...); it is traced
    once per function, argument count and dtypes. With complex arguments, `f` must
    be holomorphic (arithmetic, exp, log, sqrt, the trigonometric and hyperbolic functions).

    The generated kernel and the generic path agree on the whole domain. Every argument
    broadcasts the result, used or not; operations on Python numbers alone compute in the
    arguments' dtype with IEEE arithmetic (`1 / 0.0` is inf). The pullback multiplies the
    incoming gradient by each partial derivative, so an infinite or nan gradient meets a zero
    partial as nan. `maximum`'s and `minimum`'s partials follow `tg.maximum`'s rule: 1 for the
    chosen argument, 1/2 each at a tie (-0 and +0 tie), 0 for both where either is nan.

    >>> import numpy as np, tracker_gpu as tg
    >>> z = np.array([1.0 + 1.0j])
    >>> tg.gradient(lambda z: tg.real(tg.sum(tg.broadcast(lambda a: a * a, z))), z)[0]
    array([2.-2.j])
    """
    key = (f, tuple(str(getattr(data(a), "dtype", type(a).__name__)) for a in args))
    compiled = _cached(key)
    if compiled is None:
        dtypes = [None if type(a) in SCALARS else data(a).dtype for a in args]
        compiled = _Compiled(f, len(args), dtypes)
        with _CACHE_LOCK:
            _CACHE[key] = compiled
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    if compiled.not_holomorphic and any(is_complex(a) for a in args):
        raise TypeError(
            f"broadcast: with complex arguments f must be holomorphic, but it uses "
            f"{', '.join(compiled.not_holomorphic)}; call f on the arrays directly (unfused)"
        )
    return compiled.primitive(*args)
