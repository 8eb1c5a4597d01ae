"""Rules the host target opens: a primitive whose forward or pullback is elementwise arithmetic
around calls of the library (GELU's `tanh`, the row statistics of softmax, the normalisations
and cross-entropy), replayed as generated loops around those very calls.

Eagerly each elementwise operation of such a rule is a NumPy pass over its arrays (GELU's
forward makes nine, its pullback eighteen; the normalisations' pullback four after its
statistics). Opened, the arithmetic between two library calls is one loop (`loops.py`), and
the library's calls are the rule's own: the loops compute the operations of the rule's NumPy
code in its order and dtype, so the opened rule is eager's bit for bit, with `fuse="exact"`
too (a loop calling the C library's `tanh`, or summing a row in its own order, would differ in
the last bits). Where softmax and cross-entropy subtract each row's maximum, the row loop of
`row_loops.py` finds it and subtracts it in one pass. A forward stands where the rule's call
stood, as one `Fused` step (`fusion.py`); a pullback as a chain of one node (`backward.py`).
Arrays other than the recording's (another layout or dtype, a NumPy scalar) take the rule's
own code.

>>> import numpy as np, tracker_gpu as tg
>>> step = tg.compile(lambda x: tg.sum(tg.nn.gelu(x)))
>>> x = np.linspace(-3, 3, 4096)
>>> val, (g,) = step(x)
>>> eager = tg.withgradient(lambda x: tg.sum(tg.nn.gelu(x)), x)
>>> bool(val == eager[0]) and bool(np.array_equal(g, eager[1][0]))
True
"""

from dataclasses import dataclass

import numpy as np

from ..cuda import fp_status
from ..nn.primitives import GELU_C, GELU_K, _gelu_forward, _gelu_vjp, gelu_tanh
from ..rules import losses, nn
from ..rules.rows import row_sum, row_sum_of_products
from . import fusion, row_loops
from .recorder import Call

__all__ = ["Opening", "forward", "pullback", "OPENED"]

# the operands of a loop's ops: its inputs, earlier ops, numbers
_IN = [("in", k) for k in range(8)]


def _op(j):
    return ("op", j)


def _c(number):
    return ("const", number)


def _ops(dtype, *ops):
    return [(name, dtype, list(operands)) for name, *operands in ops]


# --- GELU: `0.5 x (1 + tanh(c (x + k x^3)))`, as nn/primitives.py computes it
def _gelu_inner(dtype):
    """`c * (x * (1 + k x^2))` of `x`, before the `tanh` (forward and pullback alike)."""
    x = _IN[0]
    return _ops(dtype, ("multiply", x, x), ("multiply", _op(0), _c(GELU_K)),
                ("add", _op(1), _c(1.0)), ("multiply", _op(2), x),
                ("multiply", _op(3), _c(GELU_C)))  # fmt: skip


def _gelu_activation(dtype):
    """`0.5 * (x * (1 + t))` of `(t, x)`."""
    t, x = _IN[:2]
    return _ops(dtype, ("add", t, _c(1.0)), ("multiply", _op(0), x), ("multiply", _op(1), _c(0.5)))


def _gelu_slope(dtype):
    """`g * gelu'(x)` of `(t, x, g)`."""
    t, x, g = _IN[:3]
    return _ops(
        dtype,
        ("multiply", t, t),  # 0: slope = t * t
        ("multiply", _op(0), _c(-1.0)),
        ("add", _op(1), _c(1.0)),  # 2: 1 - t^2, exactly
        ("multiply", _op(2), x),
        ("multiply", _op(3), _c(GELU_C)),  # 4
        ("multiply", x, x),  # 5: square
        ("multiply", _op(5), _c(3 * GELU_K)),
        ("add", _op(6), _c(1.0)),  # 7
        ("multiply", _op(4), _op(7)),  # 8: slope *= square
        ("add", t, _c(1.0)),
        ("add", _op(9), _op(8)),  # 10: t + 1 + slope
        ("multiply", _op(10), _c(0.5)),
        ("multiply", _op(11), g),  # t *= g
    )


def _gelu_forward_opened(kernels, x):
    inner, activation = kernels
    t = inner(x)
    return activation(np.tanh(t, out=t), x)


def _gelu_vjp_opened(kernels, x, g):
    inner, slope = kernels
    t = inner(x)
    return slope(np.tanh(t, out=t), x, g)


# --- softmax's forward: `exp(x - max(x)) / sum(...)`, the shift by the row loop
def _softmax_scaled(dtype):
    e, total = _IN[:2]
    return _ops(dtype, ("divide", e, total))


def _softmax_forward_opened(kernels, x, axis=-1):
    (scaled,) = kernels
    e = row_loops.shifted(np, x, axis)
    np.exp(e, out=e)
    return scaled(e, row_sum(np, e, axis))


# --- softmax's pullback: `(g - sum(g * ans)) * ans`, the sum over `axis` NumPy's (rows.py)
def _softmax_last(dtype):
    g, s, ans = _IN[:3]
    return _ops(dtype, ("subtract", g, s), ("multiply", _op(0), ans))


def _softmax_vjp_opened(kernels, ans, g, axis=-1):
    (last,) = kernels
    return last(g, row_sum_of_products(np, g, ans, axis), ans)


# --- normalise's pullback: `((g - mean(g)) - ans * mean(g * ans)) / sigma`
def _normalise_last(dtype):
    g, mean_g, ans, mean_ga, sigma = _IN[:5]
    return _ops(dtype, ("subtract", g, mean_g), ("multiply", ans, mean_ga),
                ("subtract", _op(0), _op(1)), ("divide", _op(2), sigma))  # fmt: skip


def _normalise_vjp_opened(kernels, ans, x, g, *, axes, eps=1e-5):
    (last,) = kernels
    mean_g, mean_ga, sigma = nn.normalise_statistics(np, g, ans, x, axes, eps)
    return last(g, mean_g, ans, mean_ga, sigma)


# --- cross-entropy's forward: `-sum(t * where(t != 0, logsoftmax(z), 0))`, aggregated
def _crossentropy_terms(dtype):
    shifted, lse, t = _IN[:3]
    return _ops(dtype, ("subtract", shifted, lse), ("ne", t, _c(0)),
                ("where", _op(1), _op(0), _c(0.0)), ("multiply", t, _op(2)))  # fmt: skip


def _crossentropy_opened(kernels, logits, targets, *, axis=-1, agg="mean", normalized=False):
    (terms,) = kernels
    shifted = row_loops.shifted(np, logits, axis)
    lse = nn.log_sum_exp_shifted(np, shifted, axis)
    total = -np.sum(terms(shifted, lse, targets))
    return total / losses._samples(logits, axis) if agg == "mean" else total


def _kept_axes(shape, axes):
    """`shape` with 1 on `axes` (an int or a tuple): a row statistic's, kept dims."""
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    kept = {a % len(shape) for a in axes}
    return tuple(1 if a in kept else n for a, n in enumerate(shape))


@dataclass(frozen=True)
class Opening:
    """How a rule's forward or one vjp opens: `loops` the ops of each generated loop (functions
    of the dtype), `inputs(shape, kw)` each loop's input shapes, the rule's arrays being of
    `shape` (None where it does not open: a keyword it does not know); `composed(kernels,
    *arrays, **kw)` the rule's code with the loops' kernels for its elementwise parts, `eager(
    *arrays, **kw)` the rule's own code; `reads` the node's saved values a pullback reads
    (positions: 0 its output, k its argument k), before the gradient; `loop_first` whether its
    code's first operation is its first loop (`with_fallbacks`)."""

    loops: tuple
    inputs: object
    composed: object
    eager: object
    reads: tuple = ()
    loop_first: bool = False

    def regions(self, dtype, shape, kw):
        """The regions of its loops, for arrays of `dtype` and `shape`."""
        return [fusion.Region(ops(dtype), [(dtype, s) for s in shapes], shape)
                for ops, shapes in zip(self.loops, self.inputs(shape, kw))]  # fmt: skip

    def run(self, kernels, dtype, shape, kw):
        """`run(*arrays)`: the composed code where the arrays are the recording's (C-contiguous,
        of `dtype` and `shape`), the rule's own code else."""
        composed, eager = self.composed, self.eager
        kernels = with_fallbacks(kernels, self.regions(dtype, shape, kw), self.loop_first)

        def run(*arrays):
            if not takes(arrays, dtype, shape):
                return own_code(eager, arrays, kw)
            try:
                return composed(kernels, *arrays, **kw)
            except RunWhole:
                return own_code(eager, arrays, kw)

        return run


def takes(arrays, dtype, shape):
    """Whether loops built for `dtype` and `shape` take `arrays`: NumPy arrays of them, C-contiguous
    and aligned (`carray`)."""
    for a in arrays:
        if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or (
                not a.flags.carray):  # fmt: skip
            return False
    return True


class RunWhole(Exception):
    """The first loop of a `loop_first` opening raised: the rule's own code runs whole."""


def with_fallbacks(kernels, regions, loop_first):
    """The `kernels` of the `regions`, each of which, where it raised a floating-point exception
    that NumPy's settings report, computes its operations again by NumPy's functions
    (`by_numpy`), which warn or raise as the rule's own code, the same functions in the same
    order, does: the library calls before it, which warned already, are not made twice. Where
    the opening is `loop_first`, nothing has warned before its first loop, and that loop raises
    `RunWhole` instead (GELU's later loop computes `x * x` again, which its own code computes
    once: by NumPy's functions it would warn twice)."""

    def guarded(kernel, region, whole):
        def loop(*arrays):
            try:
                return kernel(*arrays)
            except fp_status.Flagged:
                if whole:
                    raise RunWhole from None
                return by_numpy(region, arrays)

        return loop

    return [guarded(kernel, region, loop_first and not j)
            for j, (kernel, region) in enumerate(zip(kernels, regions))]  # fmt: skip


# the loops' comparisons by NumPy's functions (the other operations are named as NumPy's are)
_NUMPY = {op: getattr(np, name) for name, op in fusion.COMPARISON_OPS.items()}


def by_numpy(region, arrays):
    """The value of `region`'s written operation, each operation by NumPy's function of its
    name on `arrays`, earlier values and numbers (weakly typed, as the rules write them)."""
    values = []
    for op, _, operands in region.ops:
        args = [arrays[what] if kind == "in" else values[what] if kind == "op" else what
                for kind, what in operands]  # fmt: skip
        values.append((_NUMPY.get(op) or getattr(np, op))(*args))
    (written,) = region.written()
    return values[written]


def own_code(eager, arrays, kw):
    """An opened rule's own code, where a replay hands it other arrays than the recording's."""
    return eager(*arrays, **kw)


def _gelu_shapes(count):
    """The inner loop reads `x`; the second `t` and the rule's `count - 1` arrays."""
    return lambda shape, kw: None if kw else [[shape], [shape] * count]


def _with_rows(kind):
    """Input shapes of a loop reading the arrays and row statistics (`kind`: "a" an array, "s"
    a statistic over the rule's `axis` or `axes`)."""

    def inputs(shape, kw):
        axes = kw.get("axis", kw.get("axes", -1))
        if set(kw) - {"axis", "axes", "eps", "agg", "normalized"} or not shape:
            return None
        stat = _kept_axes(shape, axes)
        return [[shape if k == "a" else stat for k in kind]]

    return inputs


OPENED = {  # rule -> (its forward's opening or None, its first vjp's or None)
    gelu_tanh: (
        Opening(
            (_gelu_inner, _gelu_activation),
            _gelu_shapes(2),
            _gelu_forward_opened,
            lambda x: _gelu_forward(np, x),
            loop_first=True,
        ),
        Opening(
            (_gelu_inner, _gelu_slope),
            _gelu_shapes(3),
            _gelu_vjp_opened,
            lambda x, g: _gelu_vjp(g, None, x),
            reads=(1,),
            loop_first=True,
        ),
    ),
    nn.softmax: (
        Opening(
            (_softmax_scaled,),
            _with_rows("as"),
            _softmax_forward_opened,
            lambda x, axis=-1: nn._softmax_forward(np, x, axis=axis),
        ),
        Opening(
            (_softmax_last,),
            _with_rows("asa"),
            _softmax_vjp_opened,
            lambda ans, g, axis=-1: nn._softmax_vjp(g, ans, axis),
            reads=(0,),
        ),
    ),
    nn.normalise: (
        None,
        Opening(
            (_normalise_last,),
            _with_rows("asass"),
            _normalise_vjp_opened,
            lambda ans, x, g, **kw: nn._normalise_vjp(g, ans, x, **kw),
            reads=(0, 1),
        ),
    ),
    losses.logitcrossentropy_primitive: (
        Opening(
            (_crossentropy_terms,),
            _with_rows("asa"),
            _crossentropy_opened,
            lambda z, t, **kw: losses._lce_forward(np, z, t, **kw),
        ),
        None,
    ),
}
_BY_FORWARD = {rule.forward: (rule, pair[0]) for rule, pair in OPENED.items() if pair[0]}


def _opens(dtype, shape):
    """Whether arrays of this dtype and shape are worth opening for (a loop's call costs about
    2 us: small arrays stay NumPy's)."""
    return dtype in fusion.FLOATS and int(np.prod(shape)) >= fusion.SMALL_SIZE


def forward(step, types):
    """`(opening, dtype, shape, kw)` for a forward step the host target opens, else None: the
    rule's own forward, on arrays of one dtype and shape."""
    found = _BY_FORWARD.get(getattr(step, "function", None))
    if type(step) is not Call or found is None or step.makes_ctx or step.xp is not np:
        return None
    kinds = {types.get(slot) for slot in step.inputs}
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    if kind is None or kind[0] != "array" or not _opens(kind[1], kind[2]):
        return None
    opening, kw = found[1], dict(step.kw)
    if opening.inputs(kind[2], kw) is None:
        return None
    return opening, kind[1], kind[2], kw


def pullback(node, call, types):
    """`(opening, dtype, shape, kw, slots)` for a node whose one vjp the host target opens:
    the saved values it reads (`slots`) and its gradient of the node's dtype and shape; else
    None."""
    pair = OPENED.get(node.rule)
    if pair is None or pair[1] is None or call.makes_ctx or call.xp is not np:
        return None
    opening, kw = pair[1], dict(node.ctx or {})
    dtype, shape = np.dtype(node.dtype), tuple(node.shape)
    saved = {p: call.out if p == 0 else slot for p, slot in call.saves}
    if any(p not in saved or types.get(saved[p]) != ("array", dtype, shape)
           for p in opening.reads):  # fmt: skip
        return None
    if not _opens(dtype, shape) or opening.inputs(shape, kw) is None:
        return None
    return opening, dtype, shape, kw, [saved[p] for p in opening.reads]
