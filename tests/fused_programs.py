"""The random programs of tests/test_fused_fuzz.py: what they are, how Hypothesis draws them, how
one runs in tracker_gpu, and how far the fused and generic computations of their operations may
be apart.

A program applies zero to three operations to its first input and ends with a loss, each one
with a fused implementation, so that every pullback (and the forward of softmax, logsoftmax,
the cross-entropy and `tg.broadcast`) can take the fused path:

- a unary function: tanh sigmoid relu exp log sqrt sin cos square abs;
- `+ - * / **` with a second operand that broadcasts against the first (an earlier value or a
  new input, of any shape that broadcasts, 0-d included), a Python number on either side, or
  the value itself on both sides;
- `tg.broadcast` of a random expression tree (`+ - * / **`, exp log sin cos tanh sqrt abs,
  maximum, minimum, `where` of a comparison, Python-number constants with inf and nan) over the
  value, operands of broadcasting shapes and Python numbers;
- softmax or logsoftmax over the last axis;
- `nn.normalise` over axes whose complement is one run of neighbouring axes (the layout of
  LayerNorm, GroupNorm and BatchNorm), and an LSTM cell (`lstm_cell`) whose cell state is the
  value and whose gates' pre-activations are a new input;
- the loss: `sum(v**2)` in its three spellings (one `sumabs2` node), `nn.mse` against another
  operand or itself, `nn.logitcrossentropy` of 2-d logits against class indices, one-hot or
  probability targets, or, most often, `sum(v * w)`: its weights carry special values, so that
  the pullbacks meet incoming gradients over the whole domain too.

Inputs, tracked or constant, are float32 or float64 over the whole domain (`domain.py`): a
share of special values (signed zeros, subnormals, the largest finite values, infinities, nan,
and as many again zeros, units, infinities and nan, where formulas break), the others ordinary
values of magnitudes from 1e-3 to 1e3.

Trees may leave an argument out (the result is still broadcast against it) and may compute with
Python numbers alone (both paths give the IEEE result: 1 / 0 is inf, log(-1) nan).
"""

import functools
import math
import operator
from dataclasses import dataclass, field

import numpy as np
from domain import SPECIAL, domain
from hypothesis import strategies as st

import tracker_gpu as tg
from tracker_gpu.broadcast import evaluate as evaluate_expression
from tracker_gpu.broadcast import trace
from tracker_gpu.expr import COMPARISONS, topological
from tracker_gpu.rules.nn import lstm_cell

UNARY = ("tanh", "sigmoid", "relu", "exp", "log", "sqrt", "sin", "cos", "square", "abs")
BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
          "**": operator.pow}  # fmt: skip
ROWS = ("softmax", "logsoftmax")
LAYERS = ("normalise", "lstm")
SUMS_OF_SQUARES = {
    "sum(v**2)": lambda v: tg.sum(v**2),
    "sum(v*v)": lambda v: tg.sum(v * v),
    "sum(square(v))": lambda v: tg.sum(tg.square(v)),
}
# No 1.5: NumPy computes `x ** 0.5` for a scalar exponent as sqrt ((-inf) ** 0.5 is nan, where
# C's pow gives inf), and the generic gradient of x ** 1.5 is 1.5 * x ** 0.5.
NUMBERS = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -3.0, 2.5, 1e-3, 1e3, math.inf, -math.inf, math.nan)
SPECIAL_SHARES = (0.0, 0.2, 0.5)

TREE_UNARY = ("exp", "log", "sin", "cos", "tanh", "sqrt", "abs")
TREE_BINARY = {"add": operator.add, "subtract": operator.sub, "multiply": operator.mul,
               "divide": operator.truediv, "pow": operator.pow}  # fmt: skip
COMPARE = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le}


@dataclass
class Step:
    """`op` applied to the values at positions `args` (an "input" step reads input `index`)."""

    op: str
    args: tuple = ()
    params: dict = field(default_factory=dict)


@dataclass
class Program:
    """Inputs `(shape, const, fill)` (`fill`: the share of special values, or a kind of labels),
    the steps (the last one the loss), the dtype and the seed of the data."""

    dtype: str
    inputs: list
    steps: list
    seed: int = 0

    def arrays(self):
        return [
            _values(shape, self.dtype, self.seed + i, fill)
            if isinstance(fill, float)
            else _labels(fill, shape, self.dtype, self.seed + i)
            for i, (shape, _, fill) in enumerate(self.inputs)
        ]


def _values(shape, dtype, seed, share):
    values = domain(shape, dtype, seed, share)
    rng = np.random.default_rng(seed + 1)
    return np.where(rng.random(shape) < share, rng.choice(SPECIAL, shape), values).astype(dtype)


def _labels(kind, shape, dtype, seed):
    """Class indices ("index:<classes>"), one-hot targets or probabilities of any mass."""
    rng = np.random.default_rng(seed)
    if kind.startswith("index"):
        return rng.integers(0, int(kind.split(":")[1]), shape)
    if kind == "onehot":
        return np.eye(shape[1], dtype=dtype)[rng.integers(0, shape[1], shape[0])]
    return rng.uniform(0.0, 2.0, shape).astype(dtype)


# --- running a program
def evaluate(program, inputs):
    """Every value of the program, from `inputs` (arrays, tracked or not)."""
    values = []
    for step in program.steps:
        args = [values[i] for i in step.args]
        values.append(inputs[step.params["index"]] if step.op == "input" else apply(step, args))
    return values


def apply(step, args):
    op, p = step.op, step.params
    if op in UNARY:
        return getattr(tg, op)(args[0])
    if op in BINARY:
        return BINARY[op](*operands(step, args))
    if op == "tree":
        return tg.broadcast(function(p["tree"]), *operands(step, args))
    if op in ROWS:
        return getattr(tg, op)(args[0], axis=-1)
    if op == "normalise":
        return tg.nn.normalise(args[0], axes=p["axes"])
    if op == "lstm":
        return lstm_cell(args[1], args[0])
    if op in SUMS_OF_SQUARES:
        return SUMS_OF_SQUARES[op](args[0])
    if op == "mse":
        return tg.nn.mse(args[0], args[1])
    if op == "lce":
        return tg.nn.logitcrossentropy(args[0], args[1])
    assert op == "weighted", op
    return tg.sum(args[0] * args[1])


def operands(step, args):
    """The operands of arithmetic or of a tree: the values `args` and Python numbers, in order."""
    p = step.params
    if step.op == "tree":
        return [args[v] if kind == "value" else v for kind, v in p["operands"]]
    if "number" not in p:
        return list(args)
    return [p["number"], args[0]] if p["swap"] else [args[0], p["number"]]


def function(tree):
    """The scalar function a tree stands for, for `tg.broadcast`."""
    return lambda *xs: _build(tree, xs)


def expression(step):
    """The expression `tg.broadcast` traces from a tree step."""
    return trace(function(step.params["tree"]), len(step.params["operands"]))


def _build(node, xs):
    op = node[0]
    if op == "arg":
        return xs[node[1]]
    if op == "const":
        return node[1]
    if op == "where":
        _, compare, a, b, yes, no = node
        condition = COMPARE[compare](_build(a, xs), _build(b, xs))
        return tg.where(condition, _build(yes, xs), _build(no, xs))
    args = [_build(child, xs) for child in node[1:]]
    if op in TREE_BINARY:
        return TREE_BINARY[op](*args)
    return getattr(tg, op)(*args)


# --- how far the two paths' computations may be apart
LIBM = 4  # ulp between NumPy's and the C library's exp, log, tanh, sin, cos, pow (measured <= 3)

# |partial derivative| as a pullback computes it (a term it subtracts is added)
UNARY_PARTIALS = {
    "tanh": lambda x, y: 1 + y * y,
    "sigmoid": lambda x, y: np.abs(y) * (1 + np.abs(y)),
    "relu": lambda x, y: (y > 0) * 1.0,
    "exp": lambda x, y: y,
    "log": lambda x, y: 1 / x,
    "sqrt": lambda x, y: 0.5 / y,
    "sin": lambda x, y: np.cos(x),
    "cos": lambda x, y: np.sin(x),
    "square": lambda x, y: 2 * x,
    "abs": lambda x, y: np.ones_like(x),
}
BINARY_PARTIALS = {
    "+": lambda x, y, out: (1.0, 1.0),
    "-": lambda x, y, out: (1.0, 1.0),
    "*": lambda x, y, out: (y, x),
    "/": lambda x, y, out: (1 / y, out / y),
    "**": lambda x, y, out: (
        y * x ** np.where(y == 0, 1.0, y - 1),
        np.log(np.where(x == 0, 1.0, x)) * out,
    ),
}
SENSITIVITY = {  # |d op / d argument| of each argument, from the value v and the arguments
    "add": lambda v, a, b: (1.0, 1.0),
    "subtract": lambda v, a, b: (1.0, 1.0),
    "multiply": lambda v, a, b: (np.abs(b), np.abs(a)),
    "divide": lambda v, a, b: (1 / np.abs(b), np.abs(v / b)),
    "pow": lambda v, a, b: (np.abs(b * v / a), np.abs(np.log(np.abs(a)) * v)),
    "negative": lambda v, a: (1.0,),
    "abs": lambda v, a: (1.0,),
    "exp": lambda v, a: (np.abs(v),),
    "log": lambda v, a: (1 / np.abs(a),),
    "sqrt": lambda v, a: (0.5 / np.abs(v),),
    "sin": lambda v, a: (np.abs(np.cos(a)),),
    "cos": lambda v, a: (np.abs(np.sin(a)),),
    "tanh": lambda v, a: (np.abs(1 - v * v),),
}
IN_LIBM = {"exp", "log", "sin", "cos", "tanh", "pow"}
# The first-order bound holds while an argument is known to a millionth of its magnitude (log,
# sqrt, a divisor and a base of `**` have a pole at zero) or of 1 (the others bend over a unit).
RELATIVE = {"log": (True,), "sqrt": (True,), "divide": (False, True), "pow": (True, False)}


def expression_bounds(roots, args, eps):
    """For each expression of `roots` over `args` (arrays and numbers) `(value, bound, unsure)`:
    its generic value, how far a kernel's value may be from it (both compute every operation the
    same way, but not every function), and where even its sign or finiteness is uncertain."""
    known = {}
    for node in topological(roots):
        known[id(node)] = _node_bound(node, [known[id(c)] for c in node.args], args, eps)
    return [known[id(root)] for root in roots]


def _node_bound(node, children, args, eps):
    value = np.asarray(evaluate_expression(node, np, args))
    if not children:
        return value, np.zeros(value.shape), np.zeros(value.shape, bool)
    xs = [np.asarray(c[0], dtype=np.float64) for c in children]
    ds = [c[1] for c in children]
    unsure = _any(c[2] for c in children)
    if node.op in COMPARISONS or node.op in ("maximum", "minimum", "where"):
        return _select_bound(node, value, xs, ds, unsure)
    v = value.astype(np.float64)
    terms = [np.where(d == 0, 0.0, s * d) for s, d in zip(SENSITIVITY[node.op](v, *xs), ds)]
    bound = sum(terms) + np.where(_any(d > 0 for d in ds), eps * np.abs(v), 0.0)
    if node.op in IN_LIBM:
        bound = bound + LIBM * eps * np.abs(v)
    for relative, x, d in zip(RELATIVE.get(node.op, ()), xs, ds):
        unsure = unsure | (d > 1e-6 * (np.abs(x) if relative else 1.0))
    unsure = unsure | _uncertain_finiteness(v, xs, ds) | (np.isfinite(v) & ~np.isfinite(bound))
    if node.op == "pow" and np.ndim(children[1][0]) == 0 and children[1][0] == 0.5:
        unsure = unsure | (xs[0] == -np.inf) | ((xs[0] == 0) & np.signbit(xs[0]))  # NumPy: sqrt
    return value, np.where(np.isfinite(v) & np.isfinite(bound), bound, 0.0), unsure


def _select_bound(node, value, xs, ds, unsure):
    """Comparisons and selections: exact, unless a comparison of inexact values may flip."""
    if node.op != "where":
        close = np.abs(xs[0] - xs[1]) <= ds[0] + ds[1]
        unsure = unsure | (close & (ds[0] + ds[1] > 0))
    if node.op in COMPARISONS:
        return value, np.zeros(value.shape), unsure
    chosen = np.where(xs[0] != 0, ds[1], ds[2]) if node.op == "where" else np.maximum(*ds)
    return value, chosen + np.zeros(value.shape), unsure


def _uncertain_finiteness(v, xs, ds):
    """A non-finite value is certain where its arguments are exact, or where it comes from a
    non-finite argument and every finite one has a certain sign and is not zero."""
    exact = _all(d == 0 for d in ds)
    from_nonfinite = _any(~np.isfinite(x) for x in xs)
    firm = _all(~np.isfinite(x) | (d == 0) | (d < np.abs(x)) for x, d in zip(xs, ds))
    return ~np.isfinite(v) & ~(exact | (from_nonfinite & firm))


def _any(masks):
    return functools.reduce(np.logical_or, masks)


def _all(masks):
    return functools.reduce(np.logical_and, masks)


# --- drawing programs
def pick(draw, options):
    """One of `options`, each as likely (`sampled_from` favours the first ones in programs)."""
    return draw(st.permutations(options))[0]


@st.composite
def partners(draw, shape):
    """A shape that broadcasts with `shape` into at most 3 dimensions: dims kept or made 1, size-1
    dims grown, leading dims dropped (down to 0-d) or one added."""
    dims = [draw(st.sampled_from([n, 1])) if n > 1 else draw(st.integers(1, 3)) for n in shape]
    if draw(st.booleans()):
        dims = dims[draw(st.integers(0, len(dims))) :]
    elif len(dims) < 3 and draw(st.integers(0, 3)) == 0:
        dims = [draw(st.integers(1, 3))] + dims
    return tuple(dims)


class _Builder:
    def __init__(self, draw):
        self.draw = draw
        self.inputs, self.steps, self.shapes = [], [], []

    def add(self, step, shape):
        self.steps.append(step)
        self.shapes.append(tuple(shape))
        return len(self.steps) - 1

    def input(self, shape, const, fill):
        self.inputs.append((tuple(shape), const, fill))
        return self.add(Step("input", params={"index": len(self.inputs) - 1}), shape)

    def operand(self, shape, current):
        """An earlier value of `shape` other than `current`, or a new input (constant one time in
        three)."""
        draw = self.draw
        earlier = [k for k, s in enumerate(self.shapes) if s == shape and k != current]
        if earlier and draw(st.booleans()):
            return draw(st.sampled_from(earlier))
        const = draw(st.integers(0, 2)) == 0
        return self.input(shape, const, draw(st.sampled_from(SPECIAL_SHARES)))

    def unary(self, a):
        return self.add(Step(pick(self.draw, UNARY), (a,)), self.shapes[a])

    def binary(self, a):
        draw = self.draw
        op = pick(draw, sorted(BINARY))
        how = pick(draw, ["value", "value", "number", "same"])
        if how == "number":
            params = {"number": draw(st.sampled_from(NUMBERS)), "swap": draw(st.booleans())}
            return self.add(Step(op, (a,), params), self.shapes[a])
        b = a if how == "same" else self.operand(draw(partners(self.shapes[a])), a)
        args = (b, a) if draw(st.booleans()) else (a, b)
        return self.add(Step(op, args), np.broadcast_shapes(self.shapes[a], self.shapes[b]))

    def tree(self, a):
        draw = self.draw
        args, kinds, shape = [a], [("value", 0)], self.shapes[a]
        for _ in range(draw(st.integers(0, 2))):
            if draw(st.integers(0, 3)) == 0:
                kinds.append(("number", draw(st.sampled_from(NUMBERS))))
                continue
            b = self.operand(draw(partners(shape)), a)
            kinds.append(("value", len(args)))
            args.append(b)
            shape = np.broadcast_shapes(shape, self.shapes[b])
        arrays = [i for i, (kind, _) in enumerate(kinds) if kind == "value"]
        numbers = [i for i, (kind, _) in enumerate(kinds) if kind == "number"]
        tree = draw(trees(arrays, numbers))
        params = {"tree": tree, "operands": tuple(kinds)}
        return self.add(Step("tree", tuple(args), params), shape)

    def rows(self, a):
        return self.add(Step(pick(self.draw, ROWS), (a,)), self.shapes[a])

    def normalise(self, a):
        """Over every axis but a run of neighbours `[first, stop)` (at least one axis)."""
        shape = self.shapes[a]
        first = self.draw(st.integers(0, len(shape)))
        stop = self.draw(st.integers(first, len(shape)))
        axes = tuple(i for i in range(len(shape)) if not first <= i < stop)
        return self.add(Step("normalise", (a,), {"axes": axes or (len(shape) - 1,)}), shape)

    def lstm(self, a):
        """The value as the cell state `(..., h)`, a new input as the gates `(..., 4h)`."""
        draw, shape = self.draw, self.shapes[a]
        gates = shape[:-1] + (4 * shape[-1],)
        z = self.input(gates, draw(st.integers(0, 2)) == 0, draw(st.sampled_from(SPECIAL_SHARES)))
        return self.add(Step("lstm", (a, z)), shape[:-1] + (2 * shape[-1],))

    def loss(self, a):
        draw, shape = self.draw, self.shapes[a]
        kinds = ["weighted", "squares", "weighted", "mse", "weighted"] + ["lce"] * (len(shape) == 2)
        kind = pick(draw, kinds)
        if kind == "squares":
            kind = pick(draw, sorted(SUMS_OF_SQUARES))
        if kind == "mse":
            b = a if draw(st.integers(0, 4)) == 0 else self.operand(shape, a)
            return self.add(Step("mse", (a, b)), ())
        if kind == "weighted":
            w = self.input(shape, True, draw(st.sampled_from(SPECIAL_SHARES[1:])))
            return self.add(Step("weighted", (a, w)), ())
        if kind == "lce":
            fill = pick(draw, [f"index:{shape[1]}", "onehot", "soft"])
            labels = self.input(shape[:1] if fill.startswith("index") else shape, True, fill)
            return self.add(Step("lce", (a, labels)), ())
        return self.add(Step(kind, (a,)), ())


@st.composite
def trees(draw, arrays, numbers, depth=3):
    """An expression over arguments `arrays` (arrays) and `numbers` (Python numbers), with an
    array argument in it; its subtrees may compute with Python numbers alone."""
    return _carrier(draw, arrays, numbers, depth)


def _carrier(draw, arrays, numbers, depth):
    """A subtree with an array argument in it."""
    kinds = ["arg", "unary", "binary", "binary", "extremum", "where"]
    kind = "arg" if depth == 0 else pick(draw, kinds)
    if kind == "arg":
        return ("arg", draw(st.sampled_from(arrays)))
    carrier = lambda: _carrier(draw, arrays, numbers, depth - 1)
    free = lambda: _free(draw, arrays, numbers, depth - 1)
    if kind == "unary":
        return (pick(draw, TREE_UNARY), carrier())
    if kind == "extremum":
        constant = draw(st.sampled_from(NUMBERS))
        return (pick(draw, ["maximum", "minimum"]), ("const", constant), carrier())
    if kind == "where":
        return ("where", pick(draw, sorted(COMPARE)), carrier(), free(), free(), free())
    op = pick(draw, sorted(TREE_BINARY))
    return (op, carrier(), free()) if draw(st.booleans()) else (op, free(), carrier())


def _free(draw, arrays, numbers, depth):
    """Any subtree: a constant, an argument, a subtree of Python-number arguments alone, or a
    subtree with an array argument in it."""
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return ("const", draw(st.sampled_from(NUMBERS)))
    if choice == 1 and numbers:
        return ("arg", draw(st.sampled_from(arrays + numbers)))
    if choice in (2, 3) and numbers:
        return _carrier(draw, numbers, [], depth)
    return _carrier(draw, arrays, numbers, depth)


@st.composite
def programs(draw, trees=False):
    """A program: an input of up to 3 dimensions, up to three operations, then a loss. With
    `trees` the first operation is a `tg.broadcast` (a new tree is a new kernel to build: the
    cost of a program), without them there are none."""
    builder = _Builder(draw)
    dtype = draw(st.sampled_from(["float32", "float64"]))
    ndim = draw(st.sampled_from([2, 1, 3, 2, 1, 0]))  # NumPy makes 0-d results scalars
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    current = builder.input(shape, False, draw(st.sampled_from(SPECIAL_SHARES)))
    for i in range(draw(st.sampled_from([2, 1, 3, 0][trees:]))):
        layered = bool(builder.shapes[current])
        kinds = ["unary", "binary", "unary", "binary"] + ["rows", *LAYERS] * layered
        kind = "tree" if trees and i == 0 else pick(draw, kinds + ["tree"] * trees)
        current = getattr(builder, kind)(current)
    builder.loss(current)
    return Program(dtype, builder.inputs, builder.steps, draw(st.integers(0, 2**20)))
