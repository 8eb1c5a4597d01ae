"""Fusion of the backward passes: each chain of elementwise pullbacks one generated kernel.

In a recorded backward pass (`Walk`), the nodes are pulled back in the tape's order
(`codegen._order`). A chain is a run of consecutive nodes, each of a rule whose vjps are
elementwise arithmetic (`VJPS`: the templates' formulas, `templates.py`, operation for
operation), each sending its gradient to one node only, which is the next of the chain and
receives nothing else: `y * c` repeated, `tanh` after an addition. Its gradients in between are
never made: one kernel (the target of the forward regions, `loops.py`) computes the last
contribution from the chain's first gradient and the values the pullbacks save, in the same
operations and order as the eager vjps, each in the node's dtype; the contribution is then added
into its gradient where the eager pass adds it. A chain keeps to one dtype and to contributions
of its node's shape (no fitting); `sin`'s vjp reads `cos`, NumPy's own loop as in forward
regions (`numpy_loops.py`; where it cannot be had, `fuse="exact"` leaves the vjp out); small
ones are left to NumPy as forward regions are.
Where a replay finds something else than the recorded arrays, a view is copied and a NumPy
scalar (a 0-d comparison's) made a 0-d array for the kernel; anything else (another dtype)
runs the chain's operations as NumPy's, with the same result.
"""

from dataclasses import dataclass

import numpy as np

from ..backend import is_complex_dtype
from ..rules import elementwise as ew
from ..rules import nn, reductions
from ..tape import Node
from . import fusion, opened

__all__ = ["Chain", "plan", "VJPS"]


class _Ops:
    """A region's operations under construction: an operand is `("in", k)`, `("op", j)` or
    `("const", number)`, in the chain's dtype; an input is an array of the chain's dtype or
    a boolean one (`where`'s condition)."""

    def __init__(self, dtype, shape):
        self.dtype, self.shape, self.ops = dtype, shape, []
        self.inputs = []  # (key, shape, dtype)

    def value(self, key, shape, dtype=None):
        for k, (seen, _, _) in enumerate(self.inputs):
            if seen == key:
                return ("in", k)
        self.inputs.append((key, shape, self.dtype if dtype is None else dtype))
        return ("in", len(self.inputs) - 1)

    def op(self, name, *operands):
        """An operation's result; a `("lazy", key, shape, dtype)` operand (a saved value)
        becomes an input here, where it is read."""
        operands = [self.value(*o[1:]) if o is not None and o[0] == "lazy" else o
                    for o in operands]  # fmt: skip
        self.ops.append((name, self.dtype, operands))
        return ("op", len(self.ops) - 1)


def _c(number):
    return ("const", number)


# what each template's vjp computes (templates.py), as operations: vjp(ops, g, ans, *values)
VJPS = {
    ew.add: (lambda o, g, a, x, y: g,) * 2,
    ew.subtract: (lambda o, g, a, x, y: g, lambda o, g, a, x, y: o.op("negative", g)),
    ew.multiply: (
        lambda o, g, a, x, y: o.op("multiply", g, y),
        lambda o, g, a, x, y: o.op("multiply", g, x),
    ),
    ew.divide: (
        lambda o, g, a, x, y: o.op("divide", g, y),
        lambda o, g, a, x, y: o.op("divide", o.op("multiply", o.op("negative", g), a), y),
    ),
    ew.negative: (lambda o, g, a, x: o.op("negative", g),),
    ew.exp: (lambda o, g, a, x: o.op("multiply", g, a),),
    ew.log: (lambda o, g, a, x: o.op("divide", g, x),),
    ew.sqrt: (lambda o, g, a, x: o.op("divide", g, o.op("multiply", a, _c(2))),),
    ew.square: (lambda o, g, a, x: o.op("multiply", g, o.op("multiply", x, _c(2))),),
    ew.sin: (lambda o, g, a, x: o.op("multiply", g, o.op("cos", x)),),
    ew.cos: (lambda o, g, a, x: o.op("multiply", o.op("negative", g), o.op("sin", x)),),
    ew.tanh: (
        lambda o, g, a, x: o.op("multiply", g, o.op("subtract", _c(1), o.op("multiply", a, a))),
    ),
    nn.relu: (lambda o, g, a, x: o.op("where", o.op("le", a, _c(0)), _c(0.0), g),),
    ew.where: (
        None,  # the condition: none
        lambda o, g, a, c, x, y: o.op("where", c, g, _c(0.0)),
        lambda o, g, a, c, x, y: o.op("where", c, _c(0.0), g),
    ),
}


@dataclass
class Chain:
    """A fused chain of walk `walk` (a `Walk`): its nodes' positions in the walk's order
    `start`, `start + 1`, ...; `inputs` what the kernel reads, in order (`("g", slot)`: the
    first node's gradient, `("v", slot)`: a value); `parent` the node whose gradient receives
    the result; `run(*values)` the kernel behind its guard."""

    walk: object
    start: int
    count: int
    inputs: list
    parent: Node
    region: object
    run: object = None
    opening: tuple = None  # an opened rule's pullback (`opened.py`): (opening, dtype, shape, kw)

    def regions(self):
        """The regions its kernels are built from: one, or an opened rule's."""
        if self.opening is None:
            return [self.region]
        opening, *described = self.opening
        return opening.regions(*described)

    def built(self, kernels):
        """Its `run`, from the kernels of its `regions()`."""
        if self.opening is None:
            self.run = guarded(kernels[0], self.region)
        else:
            self.run = self.opening[0].run(kernels, *self.opening[1:])


def plan(program, types, orders, calls, exact):
    """The chains worth fusing of every backward pass of `program` (after its forward fusion):
    `types` the slots' types (`fusion._types`), `orders` each walk's nodes in pull-back order
    (by the walk's index in `program.steps`), `calls` {id(node): its Call}."""
    chains = []
    for index, order in orders.items():
        walk = program.steps[index]
        chains += _chains(program, walk, order, types, calls, exact)
    return chains


def _chains(program, walk, order, types, calls, exact):
    slots = {id(node): calls[id(node)].out for node in order}
    terminals = {id(node) for node, _ in walk.outputs}
    stops = {id(n) for n in walk.stop}
    reached = {id(n) for n in order}
    reached |= {id(n) for n, _ in walk.outputs if not stops or id(n) in stops}
    received = {}  # id(node) -> the contributions it receives in this walk
    for node in order:  # a rule of its own (custom, checkpoint) pulls back to every node
        vjps = getattr(node.rule, "vjps", None) or [True] * len(node.args)
        for arg, vjp in zip(node.args, vjps):
            if vjp is not None and type(arg) is Node and id(arg) in reached:
                received[id(arg)] = received.get(id(arg), 0) + 1
    found, position = [], 0
    while position < len(order):
        chain = _chain(program, order, position, types, calls, exact, slots, received, terminals)
        if chain is None:
            chain = _opened(order[position], position, calls, types, slots, received)
        if chain is None:
            position += 1
            continue
        chain.walk = walk
        found.append(chain)
        position += chain.count
    return found


def _chain(program, order, start, types, calls, exact, slots, received, terminals):
    """The chain starting at `order[start]`, if it pays, else None. A chain may start with a
    sum of all elements (its vjp broadcasts the 0-d gradient: read as such, not copied)."""
    first, parent = order[start], None
    dtype, shape = np.dtype(first.dtype), tuple(first.shape)
    summed = _full_sum(first, calls[id(first)], received)
    if summed is not None:
        parent, shape = summed, tuple(summed.shape)
    if dtype not in fusion.FLOATS or not shape:  # a 0-d gradient may be a NumPy scalar
        return None
    ops = _Ops(dtype, shape)
    g = ops.value(("g", slots[id(first)]), tuple(first.shape))
    position = start + (parent is not None)
    while position < len(order) and len(ops.ops) < fusion.MAX_OPS:
        node = order[position]
        if parent is not None and (
            id(node) != id(parent) or received.get(id(node)) != 1 or id(node) in terminals
        ):
            break
        step = _pullback(program, node, calls[id(node)], ops, g, types, exact, received)
        if step is None:
            break
        g, parent = step
        position += 1
    count = position - start
    if not count or not ops.ops or g[0] != "op":
        return None
    if not _pays(len(ops.ops), shape):
        return None
    inputs = [key for key, _, _ in ops.inputs]
    region = fusion.Region(ops.ops, [(d, s) for _, s, d in ops.inputs], shape)
    return Chain(None, start, count, inputs, parent, region)


def _opened(node, position, calls, types, slots, received):
    """A chain of the one node at `position` whose vjp the host target opens (`opened.py`),
    its contribution going to its argument `x`; else None."""
    found = opened.pullback(node, calls[id(node)], types)
    if found is None or len(node.args) != 1:
        return None
    (arg,) = node.args
    if type(arg) is not Node or id(arg) not in received:
        return None
    *described, saved = found
    inputs = [("v", slot) for slot in saved] + [("g", slots[id(node)])]
    return Chain(None, position, 1, inputs, arg, None, opening=tuple(described))


def _full_sum(node, call, received):
    """The argument of a sum of all its elements, of its dtype and tracked, else None."""
    if node.rule is not reductions._sum or call.makes_ctx:
        return None
    kw = node.ctx or {}
    if kw.get("axis") is not None or kw.get("keepdims") or kw.get("dtype") is not None:
        return None
    (arg,) = node.args
    if type(arg) is not Node or id(arg) not in received or arg.dtype != node.dtype:
        return None
    return arg


def _pays(count, shape):
    return count >= fusion.SMALL_OPS or (count >= 2 and int(np.prod(shape)) >= fusion.SMALL_SIZE)


def _pullback(program, node, call, ops, g, types, exact, received):
    """`(the contribution's operand, the node it goes to)`, its operations added to `ops`, for
    a node whose one contribution the chain may compute; else None (nothing added)."""
    vjps = VJPS.get(node.rule)
    if vjps is None or call.makes_ctx or node.ctx or is_complex_dtype(node.dtype):
        return None
    if np.dtype(node.dtype) != ops.dtype or tuple(node.shape) != ops.shape:
        return None
    goes = [j for j, (arg, vjp) in enumerate(zip(node.args, node.rule.vjps))
            if vjp is not None and type(arg) is Node and id(arg) in received]  # fmt: skip
    if len(goes) != 1 or goes[0] >= len(vjps):
        return None
    j = goes[0]
    arg = node.args[j]
    if np.dtype(arg.dtype) != ops.dtype or tuple(arg.shape) != tuple(node.shape):
        return None  # fitted (a sum over broadcast axes, a cast): left to the pullback
    saved = {p: call.out if p == 0 else slot for p, slot in call.saves}  # 0: the output
    saved.update(_constants(program, node, call, saved))
    operands = []
    for position in range(len(node.args) + 1):
        if position not in saved and position and fusion._weak(node.args[position - 1]):
            operands.append(_c(node.args[position - 1]))  # a number the node keeps
            continue
        operand = _operand(program, saved.get(position), types, ops, node.shape)
        if operand is False:
            return None
        operands.append(operand)
    mark = (len(ops.ops), len(ops.inputs))
    result = vjps[j](ops, g, *operands)
    if any(o is None for o in _read(ops, mark)) or (
        exact and not all(fusion.exact_on_host(op, dtype) for op, dtype, _ in ops.ops)
    ):
        del ops.ops[mark[0] :], ops.inputs[mark[1] :]
        return None
    return result, arg


def _constants(program, node, call, saved):
    """`{position: slot}` of the arguments not saved that are the program's own arrays (a
    mask made while recording, say): the same at every replay, read where they stay."""
    found = {}
    for position, (arg, slot) in enumerate(zip(node.args, call.inputs), start=1):
        if position in saved or type(arg) is Node or slot >= len(program.start):
            continue
        if program.start[slot] is arg and not fusion._weak(arg):
            found[position] = slot
    return found


def _read(ops, mark):
    """The operands the operations added since `mark` read."""
    return [operand for _, _, operands in ops.ops[mark[0] :] for operand in operands]


def _operand(program, slot, types, ops, shape):
    """A saved value as an operand: None where nothing is saved (a vjp reading it is refused),
    a weak number, or an input where a vjp reads it (`"lazy"`: an array of the chain's dtype,
    or a boolean one, broadcasting to `shape`); False for anything else."""
    if slot is None:
        return None
    value = program.start[slot] if slot < len(program.start) else None
    if value is not None and fusion._weak(value):
        return _c(value)
    kind = types.get(slot)
    if kind is None or kind[0] != "array" or kind[1] not in (ops.dtype, fusion.BOOL):
        return False  # a boolean array: `where`'s condition
    if len(kind[2]) > len(shape) or any(
        n not in (1, m) for n, m in zip(reversed(kind[2]), reversed(shape))
    ):
        return False
    return ("lazy", ("v", slot), kind[2], np.dtype(kind[1]))


# --- at a replay
_UFUNCS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
           "divide": np.divide, "negative": np.negative, "gt": np.greater,
           "le": np.less_equal, "cos": np.cos, "sin": np.sin}  # fmt: skip


def guarded(kernel, region):
    """`fusion.guard` of a chain: anything else than its recorded arrays (a gradient of another
    dtype, a Python number) takes NumPy's operations (`evaluate`)."""
    return fusion.guard(kernel, region, lambda values: evaluate(region, values))


def evaluate(region, values):
    """The region's operations as NumPy computes them, each in its dtype."""
    made = []
    for op, dtype, operands in region.ops:
        args = []
        for kind, what in operands:
            if kind == "in":
                args.append(values[what])
            elif kind == "op":
                args.append(made[what])
            else:
                args.append(np.asarray(what, dtype=dtype)[()])
        if op == "where":
            made.append(np.where(*args))
        else:
            made.append(_UFUNCS[op](*args))
    return made[-1]
