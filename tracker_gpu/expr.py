"""Scalar expressions, as `tg.broadcast` traces them, and their symbolic derivatives.

An `Expr` is an operation on sub-expressions, an argument (`x0`, `x1`, ...) or a constant. Its
canonical text (`str(expr)`) names it exactly: two expressions with the same text compute the
same thing, which is what generated kernels are keyed by.

>>> x = Expr("arg", value=0)
>>> y = Expr("multiply", (x, Expr("exp", (x,))))
>>> str(y), [str(p) for p in partials(y, 1)]
('multiply(x0, exp(x0))', ['add(exp(x0), multiply(x0, exp(x0)))'])
"""

import math

__all__ = [
    "Expr",
    "const",
    "ZERO",
    "ONE",
    "RULES",
    "SPECIAL",
    "e",
    "partials",
    "derivatives",
    "pullbacks",
    "contributions",
    "narrow_nodes",
    "topological",
]


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


def e(op, *args):
    """Build an expression, folding what IEEE arithmetic keeps exact: a product with 1 and
    operations on constants alone (never `0 * x` to 0, which is nan at infinity, nor `0 + x`
    to x, which is +0 at -0)."""
    if op == "multiply":
        if args[0].op == "const" and args[0].value == 1.0:
            return args[1]
        if args[1].op == "const" and args[1].value == 1.0:
            return args[0]
    if all(a.op == "const" for a in args) and op in _FOLD:
        return const(_FOLD[op](*(a.value for a in args)))
    return Expr(op, args)


_FOLD = {"add": float.__add__, "subtract": float.__sub__, "multiply": float.__mul__,
         "negative": float.__neg__}  # fmt: skip

# name: the partial derivatives as a function of (args, out), one Expr per argument (None: no
# gradient). They follow the rules of `rules/elementwise.py` (pow at zero, abs at zero, ties).
RULES = {
    "add": lambda a, out: (ONE, ONE),
    "subtract": lambda a, out: (ONE, const(-1.0)),
    "multiply": lambda a, out: (a[1], a[0]),
    "divide": lambda a, out: (e("divide", ONE, a[1]), e("negative", e("divide", out, a[1]))),
    "pow": lambda a, out: (
        e(
            "multiply",
            a[1],
            e("pow", a[0], _where_both_zero(a[0], a[1], ONE, e("subtract", a[1], ONE))),
        ),  # fmt: skip
        e("multiply", e("log", _pow_log_argument(a)), out),
    ),
    "negative": lambda a, out: (const(-1.0),),
    "exp": lambda a, out: (out,),
    "expm1": lambda a, out: (e("exp", a[0]),),
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
    "abs": lambda a, out: (_sign(a[0]),),
    "sign": lambda a, out: (ZERO,),
    "maximum": lambda a, out: (_selected("gt", a[0], a[1]), _selected("lt", a[0], a[1])),
    "minimum": lambda a, out: (_selected("lt", a[0], a[1]), _selected("gt", a[0], a[1])),
    "where": lambda a, out: (None, e("where", a[0], ONE, ZERO), e("where", a[0], ZERO, ONE)),
    # a rule of the namespace: `ruled(forward, *args)`, its partials traced from its own vjps
    "ruled": lambda a, out: (None, *out.value(a[0], a[1:])),
    "gt": lambda a, out: (None, None),
    "ge": lambda a, out: (None, None),
    "lt": lambda a, out: (None, None),
    "le": lambda a, out: (None, None),
    "eq": lambda a, out: (None, None),
    "ne": lambda a, out: (None, None),
    "zeros_like": lambda a, out: (None,),
    "narrow": lambda a, out: (ONE,),
}


def _where_both_zero(x, y, value, elsewhere):
    """`value` where `x == 0` and `y == 0`, else `elsewhere` (pow's exponent of x in its x
    partial: 0 ** 0 has slope 0, and x ** -1 stays the y-derivative of y * x ** (y - 1))."""
    return e("where", e("eq", y, ZERO), e("where", e("eq", x, ZERO), value, elsewhere), elsewhere)


# tg.special's functions (their names there), with derivatives written with functions of this
# table, so that they are differentiable again; at the edges they follow `rules/special.py`.
SPECIAL = frozenset(
    "erf erfc erfinv erfcinv erfcx gammaln gamma digamma polygamma ndtr ndtri log_ndtr logit "
    "expit xlogy xlog1py entr i0 i1 i0e i1e j0 j1 y0 y1 sinc cbrt exp2 sinpi cospi".split()
)
_SQRT_PI, _SQRT_2PI = math.sqrt(math.pi), math.sqrt(2 * math.pi)


def _times(scale, a):
    return e("multiply", const(scale), a)


def _gauss(a, scale, half=False):
    """`scale * exp(-a**2)` (`exp(-a**2 / 2)` with `half`)."""
    square = e("multiply", a, a)
    return _times(scale, e("exp", _times(-0.5 if half else -1.0, square)))


def _at_zero(a, value, elsewhere):
    """`value` where `a == 0`, else `elsewhere(a)` computed with a = 1 there (so that the branch
    not taken, and its derivative, stay finite)."""
    zero = e("eq", a, ZERO)
    return e("where", zero, const(value), elsewhere(e("where", zero, ONE, a)))


def _logarithm_taken(x, y, edge):
    """1 where xlogy's (xlog1py's: `edge` -1) partial in x is the logarithm: but at x == 0 with
    y <= edge (rules/special.py)."""
    return e("where", e("ne", x, ZERO), ONE, e("where", e("gt", y, const(edge)), ONE, ZERO))


def _sinc_partial(a, out):
    """`(cos(pi a) - out) / a`, by its Taylor series below |a| = 0.3, where those terms cancel
    (rules/special.py's float64 branch; each branch kept finite)."""
    near = e("lt", e("abs", a), const(0.3))
    small = e("where", near, a, ZERO)
    x = e("where", near, ONE, a)
    far = e("divide", e("subtract", e("cos", _times(math.pi, x)), out), x)
    return e("where", near, _sinc_series(small), far)


def _sinc_series(a):
    """pi^2 a sum_n (-1)^n 2n u^(n-1) / (2n+1)!, u = (pi a)^2: sinc' near 0 (9 terms)."""
    u = _times(math.pi**2, e("multiply", a, a))
    coefficients = [(-1) ** n * 2 * n / math.factorial(2 * n + 1) for n in range(1, 10)]
    total = const(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        total = e("add", e("multiply", total, u), const(c))
    return e("multiply", total, _times(math.pi**2, a))


def _over(f, out):
    """`f - out / a` for the Bessel functions whose derivative has that form."""
    return lambda a: e("subtract", f(a), e("divide", out, a))


def _log_ndtr(a, out):
    """log_ndtr': as `rules/special.py` writes it (erfcx below 0, each branch kept finite)."""
    below = e("lt", a, ZERO)
    low, high = e("where", below, a, const(-1.0)), e("where", below, ZERO, a)
    tail = e("divide", const(math.sqrt(2 / math.pi)), e("erfcx", _times(-math.sqrt(0.5), low)))
    ans = e("where", below, const(-math.log(2.0)), out)
    body = e("exp", e("subtract", _times(-0.5, e("multiply", high, high)), ans))
    return e("where", below, tail, _times(1 / _SQRT_2PI, body))


def _erfcx_partial(a, out):
    """erfcx': its asymptotic series from x = TAIL on, where `2 x out - 2/sqrt(pi)` cancels
    (rules/special.py's `_tail`, operation for operation; each branch kept finite)."""
    from .rules.special import TAIL

    far = e("ge", a, const(TAIL))
    clamped = e("where", e("ge", e("abs", a), const(TAIL)), a, const(TAIL))
    u = e("divide", ONE, _times(2.0, e("multiply", clamped, clamped)))
    term, total = ONE, ZERO
    for k in range(1, 17):
        term = e("multiply", term, e("multiply", u, const((2 * k - 1) * -1.0)))
        total = e("add", total, term)
    near = e("subtract", _times(2.0, e("multiply", a, out)), const(2 / _SQRT_PI))
    return e("where", far, _times(2 / _SQRT_PI, total), near)


def _ie_pair(a, out, name):
    return e("subtract", e(name, a), e("multiply", e("sign", a), out))


RULES.update({
    "erf": lambda a, out: (_gauss(a[0], 2 / _SQRT_PI),),
    "erfc": lambda a, out: (_gauss(a[0], -2 / _SQRT_PI),),
    "erfinv": lambda a, out: (_times(_SQRT_PI / 2, e("exp", e("multiply", out, out))),),
    "erfcinv": lambda a, out: (_times(-_SQRT_PI / 2, e("exp", e("multiply", out, out))),),
    "erfcx": lambda a, out: (_erfcx_partial(a[0], out),),
    "gammaln": lambda a, out: (e("digamma", a[0]),),
    "gamma": lambda a, out: (e("multiply", out, e("digamma", a[0])),),
    "digamma": lambda a, out: (e("polygamma", ONE, a[0]),),
    "polygamma": lambda a, out: (None, e("polygamma", e("add", a[0], ONE), a[1])),
    "ndtr": lambda a, out: (_gauss(a[0], 1 / _SQRT_2PI, half=True),),
    "ndtri": lambda a, out: (_times(_SQRT_2PI, e("exp", _times(0.5, e("multiply", out, out)))),),
    "log_ndtr": lambda a, out: (_log_ndtr(a[0], out),),
    "logit": lambda a, out: (
        e("divide", ONE, e("multiply", a[0], e("subtract", ONE, a[0]))),
    ),
    "expit": lambda a, out: (e("multiply", out, e("subtract", ONE, out)),),
    "xlogy": lambda a, out: (
        e("xlogy", _logarithm_taken(a[0], a[1], 0), a[1]), e("divide", a[0], a[1])
    ),
    "xlog1py": lambda a, out: (
        e("xlog1py", _logarithm_taken(a[0], a[1], -1), a[1]),
        e("divide", a[0], e("add", a[1], ONE)),
    ),
    "entr": lambda a, out: (e("negative", e("add", e("log", a[0]), ONE)),),
    "i0": lambda a, out: (e("i1", a[0]),),
    "i1": lambda a, out: (_at_zero(a[0], 0.5, _over(lambda x: e("i0", x), out)),),
    "i0e": lambda a, out: (_ie_pair(a[0], out, "i1e"),),
    "i1e": lambda a, out: (
        _at_zero(a[0], 0.5, _over(lambda x: _ie_pair(x, out, "i0e"), out)),
    ),
    "j0": lambda a, out: (e("negative", e("j1", a[0])),),
    "j1": lambda a, out: (_at_zero(a[0], 0.5, _over(lambda x: e("j0", x), out)),),
    "y0": lambda a, out: (e("negative", e("y1", a[0])),),
    "y1": lambda a, out: (_over(lambda x: e("y0", x), out)(a[0]),),
    "sinc": lambda a, out: (_sinc_partial(a[0], out),),
    "cbrt": lambda a, out: (e("divide", ONE, _times(3.0, e("multiply", out, out))),),
    "exp2": lambda a, out: (_times(math.log(2.0), out),),
    "sinpi": lambda a, out: (_times(math.pi, e("cospi", a[0])),),
    "cospi": lambda a, out: (_times(-math.pi, e("sinpi", a[0])),),
})  # fmt: skip


def _sign(a):
    """abs'(a): 1 above 0, -1 below, 0 at +-0 and nan (as `sign`, Tracker and PyTorch)."""
    return e("where", e("gt", a, ZERO), ONE, e("where", e("lt", a, ZERO), const(-1.0), ZERO))


def _selected(chosen, a, b):
    """The partial of maximum/minimum for `a`: 1 where `chosen(a, b)`, 1/2 at a tie (-0 and +0
    tie), else 0, for both arguments where either is nan (the rule of `tg.maximum`)."""
    return e("where", e(chosen, a, b), ONE, e("where", e("eq", a, b), const(0.5), ZERO))


COMPARISONS = frozenset({"gt", "ge", "lt", "le", "eq", "ne"})


def _mul(a, b):
    return e("multiply", a, b)


def _div(a, b):
    return e("divide", a, b)


def _neg(a):
    return e("negative", a)


def _zeros(g):
    return Expr("zeros_like", (g,))


def _tie_split(g, chosen, a, b):
    """`g` where `chosen(a, b)`, `g * 0.5` at a tie, else 0 (rules/elementwise.py `_tie_split`)."""
    return e("where", e(chosen, a, b), g, e("where", e("eq", a, b), _mul(g, const(0.5)), _zeros(g)))


def _pow_x(g, a, out):
    """As eager: `g y x ** (y - 1)`; for a number `y == 0`, 0."""
    if a[1].op == "const":
        y = a[1].value
        return _zeros(g) if y == 0 else _mul(_mul(g, a[1]), e("pow", a[0], const(y - 1)))
    exponent = _where_both_zero(a[0], a[1], ONE, e("subtract", a[1], ONE))
    return _mul(_mul(g, a[1]), e("pow", a[0], exponent))


def _pow_y(g, a, out):
    """As eager: `g log(x) x ** y`, log(1) where `x == 0` and `y >= 0`."""
    return _mul(_mul(g, e("log", _pow_log_argument(a))), out)


def _pow_log_argument(a):
    return e("where", e("eq", a[0], ZERO), e("where", e("ge", a[1], ZERO), ONE, a[0]), a[0])


# name: each argument's contribution to the gradient from the output's gradient `g` (None:
# none), in the operations and order of the eager rules' vjps (`rules/elementwise.py`), so that
# broadcast's pullback meets inf and nan where eager does (`g * x + g * x`, not `g * (x + x)`).
# The other operations contribute `g * partial` (`RULES`).
PULLBACKS = {
    "add": lambda g, a, out: (g, g),
    "subtract": lambda g, a, out: (g, _neg(g)),
    "multiply": lambda g, a, out: (_mul(g, a[1]), _mul(g, a[0])),
    "divide": lambda g, a, out: (_div(g, a[1]), _div(_mul(_neg(g), out), a[1])),
    "pow": lambda g, a, out: (_pow_x(g, a, out), _pow_y(g, a, out)),
    "negative": lambda g, a, out: (_neg(g),),
    "exp": lambda g, a, out: (_mul(g, out),),
    "expm1": lambda g, a, out: (_mul(g, e("exp", a[0])),),
    "log": lambda g, a, out: (_div(g, a[0]),),
    "log1p": lambda g, a, out: (_div(g, e("add", a[0], ONE)),),
    "sqrt": lambda g, a, out: (_div(g, _mul(out, const(2.0))),),
    "square": lambda g, a, out: (_mul(g, _mul(a[0], const(2.0))),),
    "reciprocal": lambda g, a, out: (_mul(_mul(_neg(g), out), out),),
    "sin": lambda g, a, out: (_mul(g, e("cos", a[0])),),
    "cos": lambda g, a, out: (_mul(_neg(g), e("sin", a[0])),),
    "tan": lambda g, a, out: (_mul(g, e("add", _mul(out, out), ONE)),),
    "sinh": lambda g, a, out: (_mul(g, e("cosh", a[0])),),
    "cosh": lambda g, a, out: (_mul(g, e("sinh", a[0])),),
    "tanh": lambda g, a, out: (_mul(g, e("subtract", ONE, _mul(out, out))),),
    "abs": lambda g, a, out: (
        e("where", e("gt", a[0], ZERO), g, e("where", e("lt", a[0], ZERO), _neg(g), _zeros(g))),
    ),
    "sign": lambda g, a, out: (None,),
    "maximum": lambda g, a, out: (_tie_split(g, "gt", *a), _tie_split(g, "lt", *a)),
    "minimum": lambda g, a, out: (_tie_split(g, "lt", *a), _tie_split(g, "gt", *a)),
    "where": lambda g, a, out: (
        None,
        e("where", a[0], g, _zeros(g)),
        e("where", a[0], _zeros(g), g),
    ),  # fmt: skip
}


def contributions(node, g):
    """What `node` sends each of its arguments from its gradient `g` (None: nothing)."""
    pullback = PULLBACKS.get(node.op)
    if pullback is not None:
        return pullback(g, node.args, node)
    return [None if d is None else _mul(g, d) for d in RULES[node.op](node.args, node)]


def partials(out, n):
    """One expression per argument: the derivative of `out` with respect to it."""
    return pullbacks(out, n, ONE)


def pullbacks(out, n, seed, narrow=frozenset(), dtype=None):
    """One expression per argument: its gradient, from the gradient `seed` of `out` (an
    expression: `ONE` gives the partial derivatives); ZERO for an argument `out` does not use.
    `narrow` (ids, `narrow_nodes`) are the nodes computed in the narrower `dtype`: a gradient
    sent into one from a wider node is cast to it first, as the tape fits each contribution to
    its node's dtype."""
    args = {node.value: node for node in topological([out]) if node.op == "arg"}
    found = derivatives(out, list(args.values()), seed, narrow, dtype)
    if not narrow:  # one dtype: a zero constant is `zeros_like`'s value
        found = _zeros_as_constants(found)
    by_position = dict(zip(args, found))
    return [by_position.get(i, ZERO) for i in range(n)]


def _zeros_as_constants(roots):
    """`roots` with each `zeros_like(x)` made the constant 0."""
    made = {}
    for node in topological(roots):
        if node.op == "zeros_like":
            made[id(node)] = ZERO
        elif node.op not in ("arg", "const"):
            args = tuple(made[id(a)] for a in node.args)
            changed = any(a is not b for a, b in zip(args, node.args))
            made[id(node)] = Expr(node.op, args, node.value) if changed else node
        else:
            made[id(node)] = node
    return [made[id(root)] for root in roots]


def derivatives(out, wrt, seed=ONE, narrow=frozenset(), dtype=None):
    """The derivative of `out` with respect to each expression of `wrt`, taken as independent
    variables (what they are computed from is not differentiated), from the gradient `seed` of
    `out`: reverse mode over the expression, each operation's contributions from `PULLBACKS`
    (else `RULES`), added in the order they are made. `narrow`, `dtype`: as in `pullbacks`."""
    positions = {id(w): i for i, w in enumerate(wrt)}
    adjoint = {id(out): _narrowed(seed, id(out) in narrow, dtype)}
    grads = [ZERO] * len(wrt)
    for node in reversed(topological([out])):
        g = adjoint.pop(id(node), None)
        if g is None or node.op == "const":
            continue
        if id(node) in positions:
            grads[positions[id(node)]] = g
            continue
        if node.op == "arg":
            continue
        wide = id(node) not in narrow
        for child, c in zip(node.args, contributions(node, g)):
            if c is not None:
                c = _narrowed(c, wide and id(child) in narrow, dtype)
                previous = adjoint.get(id(child))
                adjoint[id(child)] = c if previous is None else e("add", previous, c)
    return grads


def _narrowed(g, cast, dtype):
    return Expr("narrow", (g,), value=dtype) if cast else g


# Where the generic path (`broadcast.evaluate`) makes Python numbers arrays of the arguments'
# promoted dtype: their operations take them so, as strongly typed.
_NUMBERS_PROMOTED = frozenset({"maximum", "minimum", "where"}) | SPECIAL


def narrow_nodes(roots, narrow_args, weak_args):
    """The ids of the nodes of `roots` computed in the narrower dtype where the arguments
    mix two (float32 with float64): NumPy's promotion, the arguments `narrow_args` narrow,
    `weak_args` (Python numbers) and constants weakly typed; an operation on numbers alone
    computes in the promoted dtype, as the generic path computes it (`broadcast._Numbers`), and
    a comparison's bool joins an operation as a number does."""
    narrow, weak = set(), set()
    for node in topological(roots):
        if node.op == "arg":
            if node.value in narrow_args:
                narrow.add(id(node))
            elif node.value in weak_args:
                weak.add(id(node))
        elif node.op == "const":
            weak.add(id(node))
        elif node.op == "narrow":
            narrow.add(id(node))
        elif _narrow_operation(node, narrow, weak):
            narrow.add(id(node))
    return narrow


def _narrow_operation(node, narrow, weak):
    operands = _valued(node)
    strong = [a for a in operands if id(a) not in weak and a.op not in COMPARISONS]
    if not strong or (node.op in _NUMBERS_PROMOTED and len(strong) < len(operands)):
        return False
    return all(id(a) in narrow for a in strong)


def _valued(node):
    """The operands that make a node's value (not a selection's condition, nor what a rule's
    node keeps for its derivatives)."""
    if node.op == "where":
        return node.args[1:]
    return node.args[:1] if node.op == "ruled" else node.args


def topological(roots, rules_whole=False):
    """Every node reachable from `roots`, each after its arguments, each once; `rules_whole`:
    a rule's node (`ruled`) after its arguments alone, not its traced forward."""
    order, seen = [], set()
    stack = [(root, False) for root in reversed(roots)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            children = node.args[1:] if rules_whole and node.op == "ruled" else node.args
            stack.extend((child, False) for child in reversed(children))
    return order
