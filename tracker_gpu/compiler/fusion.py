"""Fusion: the elementwise regions of a recorded program, each replaced by one generated kernel.

After recording, the forward steps (`Call`s) that are elementwise operations this pass knows
(`OPS`: arithmetic with broadcasting, the standard's unary functions, `maximum`, `minimum`,
`where`, `clip`, comparisons, casts between the float dtypes, `relu` and `sigmoid`, with Python
numbers as weakly typed constants; float16 and bfloat16 too, each operation computed in float32
and rounded to the half type, as NumPy and ml_dtypes compute it) are grouped into regions. A
step joins the region of the steps that read its value; where something outside the region
reads it too (a pullback that saved it, another step, the result), the region writes it out as
one more output of the same loop, provided that the value has the region's shape and that every
outside reader comes after the region (which stands where its last step stood). Each region
that pays becomes one `Fused` step that reads the region's inputs once and writes its outputs
once; the replaced steps stay with it, so that the backward pass pulls their nodes back exactly
as before.

A region computes what the steps computed, operation for operation, each in the dtype NumPy
computes it in (`np.result_type`, Python numbers weak), inputs cast as NumPy casts them: the
arithmetic is the eager replay's bit for bit, and so are `exp`, `sin`, `tanh`... of float32 and
float64 on the host, where the loop calls NumPy's own inner loop (`numpy_loops.py`), and
`sigmoid`, there the operations of its rule around NumPy's `exp` (`_sigmoid_ops`); the
functions of the C library (`pow`, the half types' functions with `fuse=True`, and CUDA's)
agree with NumPy's to a few units in the last place. The target that generates and
builds the kernel is one function (`build`) and a `Target` (the arrays and namespaces it takes,
the regions that pay, the guard around a kernel): `HOST` for NumPy arrays (`loops.py`), the
CUDA target's for CuPy (`cuda_target.py`, which gathers regions into launches); arrays of other
libraries are not fused. The backward passes' chains of elementwise pullbacks are fused by
`backward.py`, with the host target.

>>> import numpy as np, tracker_gpu as tg
>>> step = tg.compile(lambda x: tg.sum(tg.exp(x * 2.0 + 1.0)), fuse=True)
>>> val, (g,) = step(np.array([0.0, 1.0]))
>>> bool(np.allclose(g, 2 * np.exp(np.array([0.0, 1.0]) * 2 + 1)))
True
"""

from dataclasses import dataclass

import numpy as np

from ..backend import NUMPY_FLOATS, is_numpy_namespace
from ..cuda import fp_status
from ..cuda.codegen import POWERS
from ..primitive import Primitive
from ..rules import elementwise as ew
from ..rules import nn
from . import numpy_loops
from .recorder import Call, Walk

__all__ = ["Fused", "Region", "Target", "HOST", "fuse", "regions", "OPS", "INEXACT"]

FLOATS = NUMPY_FLOATS  # what backward chains take
BOOL = np.dtype(bool)


def _halves():
    """float16, and ml_dtypes' bfloat16 where it is installed."""
    try:
        import ml_dtypes
    except ImportError:
        return (np.dtype(np.float16),)
    return np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)


# What forward regions compute in: a half type's operation in float32, rounded to it, as NumPy
# and ml_dtypes compute each (exact for the correctly rounded operations: float32 has more than
# twice the bits of either, so rounding twice rounds as once).
HALVES = _halves()
VALUES = FLOATS + HALVES


@dataclass
class Fused:
    """One generated kernel standing for the steps `calls` (in their order): it reads the
    arrays of `inputs` (slots) and writes the values of the slots `outs` (one launch, several
    stores), the region's last value last."""

    outs: list
    inputs: list
    calls: list
    run: object  # run(*values of inputs) -> the value of `outs[0]` if alone, else a tuple

    @property
    def out(self):
        """The slot of the region's last value."""
        return self.outs[-1]


@dataclass
class Region:
    """What a target generates a kernel from: `ops`, in order, each `(op, dtype, operands)`
    computing a value of `dtype` from operands `("in", k)` (input k), `("op", j)` (an earlier
    op's value) or `("const", value)` (a number of that dtype); the values of the ops
    `outputs` (indices, in order; None: the last op alone) are written, each of `shape`.
    `inputs` are `(dtype, shape)` of each input array."""

    ops: list
    inputs: list
    shape: tuple
    outputs: list = None

    def written(self):
        """The indices of the ops whose values are written, the last op's last."""
        return self.outputs or [len(self.ops) - 1]


# --- the operations: what each recorded forward computes, as the C table (cuda/codegen.C) names it
_BINARY = {ew.add: "add", ew.subtract: "subtract", ew.multiply: "multiply",
           ew.divide: "divide", ew.pow: "pow", ew.maximum: "maximum",
           ew.minimum: "minimum"}  # fmt: skip
_UNARY = {getattr(ew, name): name for name in (
    "negative exp expm1 log log1p sqrt square reciprocal sin cos tan sinh cosh tanh abs"
).split()}  # fmt: skip
_UNARY[ew.identity] = "identity"
COMPARISON_OPS = {"greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le",
                  "equal": "eq", "not_equal": "ne"}  # fmt: skip


def _plain_forward(function):
    """The forward a no-gradient function records (`no_gradient`'s primitive), or None."""
    primitive = getattr(function, "primitive", None)
    return primitive.forward if isinstance(primitive, Primitive) else None


OPS = {rule.forward: ("binary", name) for rule, name in _BINARY.items()}
OPS.update({rule.forward: ("unary", name) for rule, name in _UNARY.items()})
OPS.update({ew.where.forward: ("where", "where"), ew._clip.forward: ("clip", "clip"),
            ew.astype.forward: ("astype", "astype"), nn.relu.forward: ("unary", "relu"),
            nn.sigmoid.forward: ("unary", "sigmoid")})  # fmt: skip
for _name, _op in COMPARISON_OPS.items():
    _forward = _plain_forward(ew.PLAIN_FUNCTIONS[_name])
    if _forward is not None:
        OPS[_forward] = ("compare", _op)


def _weak(value):
    """Whether `value` is a Python number a region takes as a weakly typed constant."""
    if type(value) is float:
        return True
    return type(value) is int and abs(value) <= 2**53


def _typed(slot, types, start):
    """`("array", dtype, shape)`, `("weak", value)`, `("none",)` or None (not fusable)."""
    if slot in types:
        return types[slot]
    value = start[slot] if slot < len(start) else None
    if value is None:
        return ("none",)
    if _weak(value):
        return ("weak", value)
    return None


# the operations whose C library function may differ from NumPy's in the last bits
INEXACT = frozenset("pow exp expm1 log log1p sin cos tan sinh cosh tanh sigmoid".split())


def exact_on_host(op, dtype, kinds=()):
    """Whether the host loops compute `op` of `dtype` (of operands `kinds`) as NumPy does, bit
    for bit: correctly rounded, NumPy's own loop called (`numpy_loops`), a power NumPy computes
    by its fast path (`_fast_power`), or `sigmoid` as its rule's operations around NumPy's
    `exp` (`_sigmoid_ops`)."""
    if op not in INEXACT or numpy_loops.available(op, dtype) or _fast_power(op, kinds):
        return True
    return op == "sigmoid" and numpy_loops.available("exp", dtype)


def _operation(step, types, start, exact=False, library=is_numpy_namespace, own=False):
    """`(op, dtype, operand kinds)` for a step a region may take, else None: `dtype` the one it
    computes in (a comparison's operands' promoted dtype; its result is bool). An operand kind
    is the slot's type (`_typed`); a weak number is converted to `dtype` as NumPy does.
    `library(xp)`: whether the target takes the step's namespace (NumPy for the host loops);
    `own`: whether it computes as NumPy's own loops (then `exact` takes what `exact_on_host`
    says it computes as NumPy does)."""
    if type(step) is not Call or step.makes_ctx or not library(step.xp):
        return None
    known = OPS.get(step.function)
    if known is None:
        return None
    kind, op = known
    inputs = step.inputs
    if kind == "astype":  # the dtype, a constant: the node's
        if len(inputs) != 2 or start[inputs[1]] is None:
            return None
        inputs = inputs[:1]
    kinds = [_typed(slot, types, start) for slot in inputs]
    if any(k is None for k in kinds):
        return None
    out = np.dtype(step.node.dtype)
    if exact and not (exact_on_host(op, out, kinds) if own else op not in INEXACT):
        return None
    if not _CHECKS[kind](op, out, kinds, step):
        return None
    return op, _promoted(kinds) if kind == "compare" else out, kinds  # the dtype computed in


def _fast_power(op, kinds):
    """Whether `op` is an array to a number's power that NumPy computes as a square, a square
    root or a reciprocal (correctly rounded: the host loops compute it so, `POWERS`)."""
    if op != "pow" or len(kinds) != 2 or kinds[0][0] != "array" or kinds[1][0] != "weak":
        return False
    return float(kinds[1][1]) in POWERS


def _arrays(kinds):
    return [k for k in kinds if k[0] == "array"]


def _promoted(kinds):
    """NumPy's result dtype of these operands (Python numbers weak), or None."""
    arrays = _arrays(kinds)
    if not arrays:
        return None
    try:
        return np.result_type(*(k[1] for k in arrays), *(k[1] for k in kinds if k[0] == "weak"))
    except TypeError:  # float16 and bfloat16 have none: the step stays NumPy's (ml_dtypes')
        return None


def _check_binary(op, out, kinds, step):
    if len(kinds) != 2 or step.kw or out not in VALUES:
        return False
    if any(k[0] == "none" or (k[0] == "array" and k[1] not in (*VALUES, BOOL)) for k in kinds):
        return False
    return _promoted(kinds) == out


def _check_unary(op, out, kinds, step):
    if op == "sigmoid" and out in HALVES:  # several operations in the rule, each rounded
        return False
    return (len(kinds) == 1 and not step.kw and kinds[0][0] == "array"
            and kinds[0][1] == out and out in VALUES)  # fmt: skip


def _check_compare(op, out, kinds, step):
    if len(kinds) != 2 or step.kw or out != BOOL:
        return False
    if any(k[0] == "none" or (k[0] == "array" and k[1] not in VALUES) for k in kinds):
        return False
    weak = any(k[0] == "weak" for k in kinds)
    if weak and any(k[0] == "array" and str(k[1]) == "bfloat16" for k in kinds):
        return False  # NumPy's result_type is float64 there, and neither eager path compares so
    promoted = _promoted(kinds)  # None is no dtype (though np.dtype(None) is float64)
    return promoted is not None and promoted in VALUES


def _check_where(op, out, kinds, step):
    if len(kinds) != 3 or step.kw or out not in VALUES:
        return False
    condition, *values = kinds
    if condition[0] != "array" or condition[1] != BOOL:
        return False
    return all(k[0] == "weak" or (k[0] == "array" and k[1] in VALUES) for k in values)


def _check_clip(op, out, kinds, step):
    """`clip(x, lo, hi)` with bounds that are None or numbers (not nan)."""
    if len(kinds) != 3 or step.kw or out not in VALUES:
        return False
    x, *bounds = kinds
    if x[0] != "array" or x[1] != out or all(b[0] == "none" for b in bounds):
        return False
    return all(b[0] == "none" or (b[0] == "weak" and b[1] == b[1]) for b in bounds)


def _check_astype(op, out, kinds, step):
    if out not in VALUES or set(step.kw) - {"copy"}:
        return False
    if out in HALVES and kinds[0][1] == np.float64:  # through float32 would round twice
        return False
    return kinds[0][0] == "array" and kinds[0][1] in VALUES


_CHECKS = {"binary": _check_binary, "unary": _check_unary, "compare": _check_compare,
           "where": _check_where, "clip": _check_clip, "astype": _check_astype}  # fmt: skip


# --- the regions
def regions(program, arrays, orders, exact=False, target=None):
    """`(regions, operations, exported)`: the regions of `program`, lists of step indices, each
    in order, its last step the one whose value ends it, only those that pay (`_pays`: two
    steps or more); each step's `_operation`; and the steps whose value a region writes out
    besides its last one's, read outside it. `orders` are the walks' nodes in the order their
    pullbacks run (`codegen._order`); `exact` leaves out the operations of the C library
    (`INEXACT`). `target` (a `Target`: the host loops by default) says which arrays and
    namespaces the kernels take, and which regions pay."""
    target = target or HOST
    types, operations = _types(program, arrays, target.array), {}
    for index, step in enumerate(program.steps):
        found = _operation(step, types, program.start, exact, target.library, target.own_loops)
        if found is not None:
            operations[index] = found
    readers = _readers(program, orders)
    owner, sizes, exported = {}, {}, set()  # step -> its region's last step; region sizes
    for index in range(len(program.steps) - 1, -1, -1):
        if index in operations:
            owner[index], out = _joined(program, index, readers, owner, sizes)
            sizes[owner[index]] = sizes.get(owner[index], 0) + 1
            if out and owner[index] != index:
                exported.add(index)
    grouped = {}
    for index in sorted(owner):
        grouped.setdefault(owner[index], []).append(index)
    pays = target.pays or _pays
    found = [members for members in grouped.values() if pays(program, members)]
    kept = {i for members in found for i in members}
    return found, operations, exported & kept


def _joined(program, index, readers, owner, sizes):
    """`(last, exported)`: the region step `index` joins (its readers' region of the earliest
    last step; `index` itself for a new one), and whether its value is written out too: read
    outside that region, each outside reader after it (a step of another region counted at
    its own place: that region may not pay), the value of the region's shape."""
    steps = program.steps
    reads = readers.get(steps[index].out, ())
    inside = {owner[r] for r in reads if r in owner}
    if not inside:
        return index, True
    last = min(inside)
    if sizes[last] >= MAX_OPS:  # a full region: a new one
        return index, True
    outside = [r for r in reads if owner.get(r) != last]
    if not outside:
        return last, False
    same = tuple(steps[index].node.shape) == tuple(steps[last].node.shape)
    if same and all(position > last for position in outside):
        return last, True
    return index, True


def _readers(program, orders):
    """`{slot: positions of the steps reading it}`: the steps' inputs, each walk's seed and
    what its pullbacks saved (at the walk's position), the result (after every step)."""
    calls = {id(s.node): s for s in program.steps if type(s) is Call}
    readers, end = {}, len(program.steps)
    for slot in program.outputs:
        readers.setdefault(slot, set()).add(end)
    for index, step in enumerate(program.steps):
        if type(step) is Call:
            slots = step.inputs
        elif type(step) is Walk:
            slots = [step.seed]
            for node in orders.get(index, ()):
                call = calls.get(id(node))
                if call is not None:
                    slots += [call.out if p == 0 else slot for p, slot in call.saves]
        else:
            slots = getattr(step, "inputs", ())
        for slot in slots:
            readers.setdefault(slot, set()).add(index)
    return readers


# A kernel call costs about 2 us on a small array (its guards, ctypes), a NumPy call 0.4 us: a
# region of fewer than SMALL_OPS operations on fewer than SMALL_SIZE elements is left to NumPy.
# A region, or a chain of pullbacks, of MAX_OPS operations is full: the next one begins there
# (the compiler's time grows faster than the source: a chain of 100,000 operations as one
# function did not build in ten minutes).
SMALL_OPS, SMALL_SIZE, MAX_OPS = 8, 1024, 256


def _pays(program, members):
    if len(members) < 2:
        return False
    shape = program.steps[members[-1]].node.shape
    return len(members) >= SMALL_OPS or int(np.prod(shape)) >= SMALL_SIZE


def _types(program, arrays, array=np.ndarray):
    """`{slot: ("array", dtype, shape)}` for the arguments, the constants that are arrays of
    the type `array` and the values the steps make (their nodes' dtype and shape)."""
    types = {}
    for slot, value in enumerate(arrays):
        if type(value) is array:
            types[slot] = ("array", np.dtype(value.dtype), tuple(value.shape))
    for slot, value in enumerate(program.start):
        if type(value) is array:
            types[slot] = ("array", np.dtype(value.dtype), tuple(value.shape))
    for step in program.steps:
        if type(step) is Call:
            types[step.out] = ("array", np.dtype(step.node.dtype), tuple(step.node.shape))
        elif type(step) is Walk:
            for node, slot in step.outputs:
                types[slot] = ("array", np.dtype(node.dtype), tuple(node.shape))
    return types


def describe(program, members, operations, exported=(), own_loops=False):
    """The `Region` of the steps `members`, the slots of its inputs, and those of its outputs
    (the values of the members in `exported`, then the last member's). `own_loops` (the host's):
    a `sigmoid` is the operations of its rule (`_sigmoid_ops`), where NumPy's `exp` is had."""
    steps = program.steps
    made, at = {}, {}  # a member's slot -> its value's op; a member -> the same
    inputs, ops, specs = [], [], []
    for index in members:
        step = steps[index]
        op, dtype, kinds = operations[index]
        operands = []
        for slot, kind in zip(step.inputs, kinds):  # astype: its dtype left out
            if slot in made:
                operands.append(("op", made[slot]))
            elif kind[0] == "array":
                if slot not in inputs:
                    inputs.append(slot)
                    specs.append((kind[1], kind[2]))
                operands.append(("in", inputs.index(slot)))
            elif kind[0] == "weak":
                operands.append(("const", kind[1]))
            else:
                operands.append(("none", None))
        if op == "sigmoid" and own_loops and exact_on_host(op, dtype):
            ops += _sigmoid_ops(dtype, operands[0], len(ops))
        else:
            ops.append((op, dtype, operands))
        made[step.out] = at[index] = len(ops) - 1
    shape = tuple(steps[members[-1]].node.shape)
    exports = [i for i in members[:-1] if i in exported] + [members[-1]]
    written = [at[i] for i in exports]
    outs = [steps[i].out for i in exports]
    return Region(ops, specs, shape, written if len(written) > 1 else None), inputs, outs


def _sigmoid_ops(dtype, x, first):
    """The operations of the sigmoid rule's NumPy code (`sigmoid_values`), from the op `first`
    on: `e = exp(-abs(x))`, then `where(x >= 0, 1 / (1 + e), e / (1 + e))`."""
    e, d = ("op", first + 2), ("op", first + 3)
    quotients, positive = [("op", first + 4), ("op", first + 5)], ("op", first + 6)
    return [("abs", dtype, [x]), ("negative", dtype, [("op", first)]),
            ("exp", dtype, [("op", first + 1)]), ("add", dtype, [("const", 1), e]),
            ("divide", dtype, [("const", 1), d]), ("divide", dtype, [e, d]),
            ("ge", dtype, [x, ("const", 0)]), ("where", dtype, [positive, *quotients])]  # fmt: skip


def fuse(program, arrays, orders, build, exact=False, target=None):
    """`(steps, count)`: `program.steps` with each region (two elementwise steps or more)
    replaced by one `Fused` step, its kernel made by `build(regions)` (a target: a list of
    kernels, one per `Region`, or None where it cannot build them: then the steps stay as they
    are), and the number of regions. `exact`: what is eager's bit for bit only; `target` as
    in `regions` (its `guard` wraps each kernel, as `_guarded` does for the host loops)."""
    target = target or HOST
    found, operations, exported = regions(program, arrays, orders, exact, target)
    if not found:
        return program.steps, 0
    described = [describe(program, members, operations, exported, target.own_loops)
                 for members in found]  # fmt: skip
    kernels = build([region for region, _, _ in described])
    if kernels is None:
        return program.steps, 0
    replaced, steps = {}, []
    for members, (region, inputs, outs), kernel in zip(found, described, kernels):
        calls = [program.steps[i] for i in members]
        run = target.guard(kernel, region, calls, inputs, program.start, outs)
        replaced[members[-1]] = Fused(outs, inputs, calls, run)
        replaced.update(dict.fromkeys(members[:-1]))
    for index, step in enumerate(program.steps):
        if index not in replaced:
            steps.append(step)
        elif replaced[index] is not None:
            steps.append(replaced[index])
    return steps, len(found)


def guard(kernel, region, fallback):
    """The kernel, called on arrays of the recorded dtypes and shapes (made C-contiguous where
    their axes are in C order; a NumPy scalar made a 0-d array); anything else (a transposed
    input, or a view that a NumPy loop of the kernel reads as it is) goes to
    `fallback(values)`."""
    expected, ndarray, flagged = list(region.inputs), np.ndarray, fp_status.Flagged
    # NumPy's function of a view is not always the same as of its copy (reversed, its float64
    # exp and log; unaligned): the steps give eager's
    as_is = numpy_loops.read_directly(region)

    def checked(values):
        ready = []
        for k, (value, (dtype, shape)) in enumerate(zip(values, expected)):
            if isinstance(value, np.generic):  # a 0-d result (a reduction's, a comparison's)
                value = np.asarray(value)
            if type(value) is not ndarray or value.dtype != dtype or value.shape != shape:
                return fallback(values)
            if not value.flags.c_contiguous or not value.flags.aligned:
                if k in as_is or not _c_ordered(value):  # NumPy's outputs keep its order
                    return fallback(values)
                value = np.ascontiguousarray(value)
            ready.append(value)
        try:
            return kernel(*ready)
        except flagged:  # an overflow, say, that NumPy's steps report as they would eagerly
            return fallback(values)

    def run(*values):  # the common case first: aligned, contiguous (and writeable) arrays
        for value, (dtype, shape) in zip(values, expected):
            if (type(value) is not ndarray or value.dtype != dtype or value.shape != shape
                    or not value.flags.carray):  # fmt: skip
                return checked(values)
        try:
            return kernel(*values)
        except flagged:
            return fallback(values)

    return run


def _c_ordered(value):
    """Whether `value`'s axes (those longer than 1) are laid out outermost first, as C order's:
    then NumPy writes an elementwise result in C order, as the kernels do (a transposed or
    Fortran-ordered input gives a result in its own order, which a later sum adds in)."""
    strides = [abs(s) for s, n in zip(value.strides, value.shape) if n > 1]
    return all(a >= b for a, b in zip(strides, strides[1:]))


def _guarded(kernel, region, calls, inputs, start, outs):
    """`guard` of a region: anything else than its recorded arrays (a gradient that is None,
    say) takes the steps one by one."""
    slots = list(inputs)
    return guard(kernel, region, lambda values: _stepwise(calls, slots, values, start, outs))


@dataclass(frozen=True)
class Target:
    """What a fusion target takes: `array` the type of its arrays, `library(xp)` whether it
    takes a step's namespace, `pays(program, members)` whether a region is worth a kernel (None:
    `_pays`), `guard(kernel, region, calls, input slots, start, output slots)` the step's
    `run`; `own_loops` whether its kernels compute as NumPy's own loops: its functions of
    `numpy_loops` and its fast powers (the host's)."""

    array: type
    library: object
    pays: object
    guard: object
    own_loops: bool = False


HOST = Target(np.ndarray, is_numpy_namespace, None, _guarded, own_loops=True)


def _stepwise(calls, slots, values, start, outs):
    """The region's steps one by one, as an unfused replay runs them: the value of `outs[0]`
    if alone, else a tuple of theirs."""
    env = dict(zip(slots, values))
    for call in calls:
        operands = [env[i] if i in env else start[i] for i in call.inputs]
        env[call.out] = call.function(call.xp, *operands, **call.kw)
    return env[outs[0]] if len(outs) == 1 else tuple(env[slot] for slot in outs)
