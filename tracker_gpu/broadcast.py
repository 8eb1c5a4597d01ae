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

import math
import sys

from .backend import SCALARS, namespace_of
from .tracked import ByPosition, Primitive, TrackedArray, data

__all__ = ["broadcast", "trace", "Expr"]


class Expr:
    """A node of a traced expression: an operation on sub-expressions, an argument or a constant."""

    __slots__ = ("op", "args", "value")

    def __init__(self, op, args=(), value=None):
        self.op, self.args, self.value = op, args, value

    def __repr__(self):
        if self.op == "arg":
            return f"x{self.value}"
        if self.op == "const":
            return repr(self.value)
        return f"{self.op}({', '.join(map(repr, self.args))})"


def const(value):
    return Expr("const", value=float(value))


ZERO, ONE = const(0.0), const(1.0)


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
Symbol.__neg__ = lambda self: _op("negative", self)
Symbol.__pos__ = lambda self: self
Symbol.__abs__ = lambda self: _op("abs", self)


# --- the operations: evaluation with a namespace, C code, and partial derivatives
RULES = {
    # name: the partials as a function of (args, out), one Expr per argument (None: no gradient)
    "add": lambda a, out: (ONE, ONE),
    "subtract": lambda a, out: (ONE, const(-1.0)),
    "multiply": lambda a, out: (a[1], a[0]),
    "divide": lambda a, out: (e("divide", ONE, a[1]), e("negative", e("divide", out, a[1]))),
    "pow": lambda a, out: (
        e("multiply", a[1], e("pow", a[0], e("subtract", a[1], ONE))),
        e("multiply", e("log", a[0]), out),
    ),
    "negative": lambda a, out: (const(-1.0),),
    "exp": lambda a, out: (out,),
    "expm1": lambda a, out: (e("add", out, ONE),),
    "log": lambda a, out: (e("divide", ONE, a[0]),),
    "log1p": lambda a, out: (e("divide", ONE, e("add", a[0], ONE)),),
    "sqrt": lambda a, out: (e("divide", const(0.5), out),),
    "square": lambda a, out: (e("multiply", const(2.0), a[0]),),
    "reciprocal": lambda a, out: (e("negative", e("multiply", out, out)),),
    "sin": lambda a, out: (e("cos", a[0]),),
    "cos": lambda a, out: (e("negative", e("sin", a[0])),),
    "tan": lambda a, out: (e("add", ONE, e("multiply", out, out)),),
    "sinh": lambda a, out: (e("cosh", a[0]),),
    "cosh": lambda a, out: (e("sinh", a[0]),),
    "tanh": lambda a, out: (e("subtract", ONE, e("multiply", out, out)),),
    "abs": lambda a, out: (e("where", e("ge", a[0], ZERO), ONE, const(-1.0)),),
    "sign": lambda a, out: (ZERO,),
    "maximum": lambda a, out: (
        e("where", e("gt", a[0], a[1]), ONE, ZERO),
        e("where", e("gt", a[0], a[1]), ZERO, ONE),
    ),
    "minimum": lambda a, out: (
        e("where", e("lt", a[0], a[1]), ONE, ZERO),
        e("where", e("lt", a[0], a[1]), ZERO, ONE),
    ),
    "where": lambda a, out: (None, e("where", a[0], ONE, ZERO), e("where", a[0], ZERO, ONE)),
    "gt": lambda a, out: (None, None),
    "ge": lambda a, out: (None, None),
    "lt": lambda a, out: (None, None),
    "le": lambda a, out: (None, None),
}


def e(op, *args):
    """Build an expression, folding the trivial cases that derivatives produce."""
    if op == "multiply":
        if any(a is ZERO or (a.op == "const" and a.value == 0.0) for a in args):
            return ZERO
        if args[0].op == "const" and args[0].value == 1.0:
            return args[1]
        if args[1].op == "const" and args[1].value == 1.0:
            return args[0]
    if op == "add":
        if args[0].op == "const" and args[0].value == 0.0:
            return args[1]
        if args[1].op == "const" and args[1].value == 0.0:
            return args[0]
    if all(a.op == "const" for a in args) and op in _FOLD:
        return const(_FOLD[op](*(a.value for a in args)))
    return Expr(op, args)


_FOLD = {"add": float.__add__, "subtract": float.__sub__, "multiply": float.__mul__,
         "negative": float.__neg__}  # fmt: skip


class _SymbolicNamespace:
    """The namespace the symbols report: each function records an operation."""

    __name__ = "tracker_gpu.broadcast.symbolic"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in RULES:
            return lambda *args: _op(name, *args)
        if name in ("greater", "greater_equal", "less", "less_equal"):
            return lambda *args: _op(_COMPARISONS[name], *args)
        raise TypeError(f"broadcast: {name!r} is not an elementwise function broadcast can fuse")

    def zeros_like(self, x, **kw):
        return Symbol(ZERO)

    def ones_like(self, x, **kw):
        return Symbol(ONE)

    def asarray(self, value, **kw):
        return Symbol(const(value))


_COMPARISONS = {"greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le"}
SYMBOLIC = _SymbolicNamespace()


def trace(f, n):
    """The expression `f` computes from `n` scalar arguments."""
    out = f(*(Symbol(Expr("arg", value=i)) for i in range(n)))
    return _expr(out)


# --- reverse mode over the expression
def partials(out, n):
    """One expression per argument: the derivative of `out` with respect to it."""
    order = _topological(out)
    adjoint = {id(out): ONE}
    grads = [ZERO] * n
    for node in reversed(order):
        g = adjoint.pop(id(node), None)
        if g is None or node.op == "const":
            continue
        if node.op == "arg":
            grads[node.value] = e("add", grads[node.value], g)
            continue
        for child, d in zip(node.args, RULES[node.op](node.args, node)):
            if d is not None:
                contribution = e("multiply", g, d)
                previous = adjoint.get(id(child))
                adjoint[id(child)] = (
                    contribution if previous is None else e("add", previous, contribution)
                )
    return grads


def _topological(root):
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in node.args)
    return order


def evaluate(expr, xp, args):
    """The value of `expr` for these arguments, computed with namespace `xp`."""
    template = next((a for a in args if type(a) not in SCALARS), None)
    values = {}
    for node in _topological(expr):
        if node.op == "arg":
            values[id(node)] = args[node.value]
        elif node.op == "const":
            values[id(node)] = node.value
        else:
            values[id(node)] = _apply(xp, node.op, [values[id(c)] for c in node.args], template)
    return values[id(expr)]


def _apply(xp, op, values, template):
    if op in _COMPARE:
        return _COMPARE[op](values[0], values[1])
    if op == "where":
        return xp.where(values[0], *_arrays(xp, values[1:], template))
    if all(type(v) is float for v in values):
        return _SCALAR[op](*values)
    if op in ("add", "subtract", "multiply", "divide", "pow"):
        return _ARITHMETIC[op](*values)
    if op in ("maximum", "minimum"):
        return getattr(xp, op)(*_arrays(xp, values, template))
    return getattr(xp, op)(values[0])


def _arrays(xp, values, template):
    """Python numbers as arrays shaped like `template` (functions other than operators need
    arrays on some libraries)."""
    return [xp.full_like(template, v) if type(v) is float else v for v in values]


_COMPARE = {"gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b,
            "le": lambda a, b: a <= b}  # fmt: skip
_ARITHMETIC = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b,
               "multiply": lambda a, b: a * b, "divide": lambda a, b: a / b,
               "pow": lambda a, b: a**b}  # fmt: skip
_SCALAR = dict(_ARITHMETIC, negative=lambda a: -a, exp=math.exp, log=math.log, sin=math.sin,
               cos=math.cos, tanh=math.tanh, sqrt=math.sqrt)  # fmt: skip


# --- the tape node
class _Compiled:
    def __init__(self, f, n):
        self.name = f"broadcast({getattr(f, '__name__', 'f')})"
        self.out = trace(f, n)
        self.partials = partials(self.out, n)
        self.primitive = Primitive(
            self.name, self.forward, ByPosition(self.vjp), fused=self.fused_pullback
        )

    def forward(self, xp, *args):
        from .cuda import codegen

        fused = codegen.forward(self, args)
        return fused if fused is not None else evaluate(self.out, xp, list(args))

    def vjp(self, i, g, ans, *args):
        tracked = any(isinstance(a, TrackedArray) for a in (g, *args))
        xp = sys.modules["tracker_gpu.namespace"] if tracked else namespace_of(data(g))
        return g * evaluate(self.partials[i], xp, list(args))

    def fused_pullback(self, node, args, kw, g, pending):
        from .cuda import codegen

        return codegen.backward(self, node, args, g)


_CACHE = {}
_CACHE_SIZE = 512  # traced expressions kept; define f once rather than a new lambda per call


def broadcast(f, *args):
    """`f` applied elementwise to the broadcast arguments, as one differentiable operation.

    `f` is a scalar function written with tracker_gpu's elementwise functions and operators; it
    is traced once per function, argument count and dtypes.
    """
    key = (f, tuple(str(getattr(data(a), "dtype", type(a).__name__)) for a in args))
    compiled = _CACHE.get(key)
    if compiled is None:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        compiled = _CACHE[key] = _Compiled(f, len(args))
    return compiled.primitive(*args)
