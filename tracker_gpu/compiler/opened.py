"""Rules the host target opens: a primitive whose forward or pullback is elementwise arithmetic
around one function of the library (GELU's `tanh`), replayed as generated loops around that
very function.

Eagerly, `nn.gelu`'s forward makes nine passes over its array and its pullback eighteen, each
a NumPy call; fused, each is two loops (`loops.py`) around NumPy's own `tanh`, written in place
into the first loop's output. The loops compute the operations of the rule's NumPy code
(`nn/primitives.py`) in its order and dtype, and the `tanh` is NumPy's: bit for bit the eager
step, with `fuse="exact"` too (the C library's `tanh` would differ in the last bits). The
forward stands where the rule's call stood, as one `Fused` step (`fusion.py`); the pullback as a
chain of one node (`backward.py`). Arrays other than the recording's (another layout, a NumPy
scalar) take the rule's own forward or vjp.

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

from ..nn.primitives import GELU_C, GELU_K, _gelu_forward, _gelu_vjp, gelu_tanh
from . import fusion
from .recorder import Call

__all__ = ["Opening", "forward", "pullback", "OPENED"]


def _ops(dtype, *ops):
    """A region's ops from `(op, operand, operand)`: an int is an earlier op, `"x"`-like names
    are inputs (by the position given in `inputs`), a float a constant."""
    return [(op, dtype, list(operands)) for op, *operands in ops]


def _inner(dtype):
    """`c * (x * (1 + k x^2))` of `x`, as `_gelu_forward` computes it before its `tanh`."""
    x = ("in", 0)
    return _ops(dtype, ("multiply", x, x), ("multiply", ("op", 0), ("const", GELU_K)),
                ("add", ("op", 1), ("const", 1.0)), ("multiply", ("op", 2), x),
                ("multiply", ("op", 3), ("const", GELU_C)))  # fmt: skip


def _activation(dtype):
    """`0.5 * (x * (1 + t))` of `(t, x)`: the forward after its `tanh`."""
    t, x = ("in", 0), ("in", 1)
    return _ops(dtype, ("add", t, ("const", 1.0)), ("multiply", ("op", 0), x),
                ("multiply", ("op", 1), ("const", 0.5)))  # fmt: skip


def _slope(dtype):
    """`g * gelu'(x)` of `(t, x, g)`, as `_gelu_vjp` computes it after its `tanh`."""
    t, x, g = ("in", 0), ("in", 1), ("in", 2)
    return _ops(
        dtype,
        ("multiply", t, t),  # 0: slope = t * t
        ("multiply", ("op", 0), ("const", -1.0)),
        ("add", ("op", 1), ("const", 1.0)),  # 2: 1 - t^2, exactly
        ("multiply", ("op", 2), x),
        ("multiply", ("op", 3), ("const", GELU_C)),  # 4
        ("multiply", x, x),  # 5: square
        ("multiply", ("op", 5), ("const", 3 * GELU_K)),
        ("add", ("op", 6), ("const", 1.0)),  # 7
        ("multiply", ("op", 4), ("op", 7)),  # 8: slope *= square
        ("add", t, ("const", 1.0)),
        ("add", ("op", 9), ("op", 8)),  # 10: t + 1 + slope
        ("multiply", ("op", 10), ("const", 0.5)),
        ("multiply", ("op", 11), g),  # t *= g
    )


@dataclass(frozen=True)
class Opening:
    """How a rule opens: the ops of the loop before its library function `function` (of the
    arrays the rule's forward or vjp reads), and of the loop after it (of that function's
    value, then the same arrays); `eager` the rule's own code, for anything else."""

    before: object  # dtype -> ops
    function: str
    after: object  # dtype -> ops
    eager: object

    def regions(self, dtype, shape, count):
        """The two regions, on `count` input arrays of `dtype` and `shape`."""
        first = fusion.Region(self.before(dtype), [(dtype, shape)], shape)
        second = fusion.Region(self.after(dtype), [(dtype, shape)] * (count + 1), shape)
        return [first, second]

    def run(self, kernels, dtype, shape):
        """`run(*arrays)`: the two loops around the library's function, where the arrays are
        the recording's (C-contiguous, of `dtype` and `shape`); the rule's own code else."""
        before, after = kernels
        function, eager, ndarray = getattr(np, self.function), self.eager, np.ndarray

        def run(*arrays):
            for a in arrays:
                if type(a) is not ndarray or a.dtype != dtype or a.shape != shape or (
                        not a.flags.carray):  # fmt: skip
                    return eager(*arrays)
            inner = before(arrays[0])
            return after(function(inner, out=inner), *arrays)

        return run


OPENED = {  # rule -> (its forward's opening, its one vjp's)
    gelu_tanh: (
        Opening(_inner, "tanh", _activation, lambda x: _gelu_forward(np, x)),
        Opening(_inner, "tanh", _slope, lambda x, g: _gelu_vjp(g, None, x)),
    ),
}
_BY_FORWARD = {rule.forward: (rule, openings[0]) for rule, openings in OPENED.items()}


def _opens(node, shape):
    """Whether a node of this dtype and shape is worth opening (the loops' calls cost about
    2 us each: small arrays stay NumPy's)."""
    return np.dtype(node.dtype) in fusion.FLOATS and int(np.prod(shape)) >= fusion.SMALL_SIZE


def forward(step, types):
    """`(opening, dtype, shape)` for a forward step the host target opens, else None: the
    rule's own forward, on one array of the node's dtype and shape."""
    found = _BY_FORWARD.get(getattr(step, "function", None))
    if type(step) is not Call or found is None or step.makes_ctx or step.kw:
        return None
    if step.xp is not np or len(step.inputs) != 1:
        return None
    dtype, shape = np.dtype(step.node.dtype), tuple(step.node.shape)
    if types.get(step.inputs[0]) != ("array", dtype, shape) or not _opens(step.node, shape):
        return None
    return found[1], dtype, shape


def pullback(node, call, types):
    """`(opening, dtype, shape, slot of x)` for a node whose one vjp the host target opens,
    its gradient of the node's dtype and shape and its `x` saved; else None."""
    openings = OPENED.get(node.rule)
    if openings is None or call.makes_ctx or node.ctx or call.xp is not np:
        return None
    dtype, shape = np.dtype(node.dtype), tuple(node.shape)
    saved = dict(call.saves)
    if 1 not in saved or types.get(saved[1]) != ("array", dtype, shape):
        return None
    if not _opens(node, shape):
        return None
    return openings[1], dtype, shape, saved[1]
