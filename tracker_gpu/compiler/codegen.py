"""A recorded program as one generated Python function (a long one cut into functions of
bounded size, `chunks.py`), for arrays in host memory.

Each slot is a local variable, `v<slot>` (the arguments are the function's parameters, the
constants its globals); each step is one line: a rule's forward, or, for the hottest rules, the
expression itself (`templates.py`). A backward pass becomes straight-line code too, node by node
in its recorded order: each vjp called directly, its result fitted to its argument's shape and
added into the argument's gradient `g<slot>`; a fused chain of pullbacks (`backward.py`) is one
kernel call. Values are deleted after their last use, so the
replay keeps no more than the eager tape. No tape is built, nothing is counted, and the
interpreter's loop over steps is gone: what remains is close to the same computation written
by hand.
"""

import math

from .. import draws
from ..backend import is_complex_dtype, is_numpy_namespace
from ..primitive import Primitive, _fit
from ..rules import elementwise as ew
from ..rules.reductions import _sum as _SUM
from ..tape import Node
from .chunks import link
from .fusion import Fused
from .recorder import Call, Draw, Walk
from .templates import TEMPLATES

__all__ = ["generate"]


class _Source:
    """The generated function's lines and the globals they name."""

    def __init__(self, constants):
        self.lines = []
        self.names = dict(constants)
        self.names.update(FIT=_fit, DRAW=draws.draw)
        self._bound = {}  # id(value) -> name
        self.cuts = []  # the line counts after which the body may be cut (`chunks.py`)
        self.suffix = None  # of a walk's gradient names: unique to it (a name is bound once)

    def bind(self, prefix, value):
        """A global name for `value` (one per object)."""
        name = self._bound.get(id(value))
        if name is None:
            name = self._bound[id(value)] = f"{prefix}{len(self.names)}"
            self.names[name] = value
        return name

    def emit(self, line, indent=1):
        self.lines.append("    " * indent + line)


def generate(program):
    """`(run, source)`: the function `run(*arrays)` returning the values of
    `program.outputs` (slots) as a tuple, and its source (None for a program long enough to
    be cut into several functions: `chunks.py`)."""
    constants = {  # None too: an argument left out (a Dense layer's bias=None, say)
        f"v{i}": v
        for i, v in enumerate(program.start)
        if i >= program.inputs and i not in program.made
    }
    src = _Source(constants)
    calls = _calls(program.steps)
    local = set(range(program.inputs)) | set(program.made)  # constants are globals: never del
    orders = {i: _order(s, program.slots) for i, s in enumerate(program.steps)
              if isinstance(s, Walk)}  # fmt: skip
    last = _last_reads(program, calls, orders)
    outputs = set(program.outputs)
    src.release = lambda point: [
        src.emit(f"del v{slot}", point[2])
        for slot in last.get(point[:2], ())
        if slot in local and slot not in outputs
    ]
    reusable = _Reuse(program, last, local)
    for index, step in enumerate(program.steps):
        if isinstance(step, Call):
            _forward(src, step, reusable.buffer(index, step))
        elif isinstance(step, Fused):  # a region of elementwise steps: one kernel
            kernel = src.bind("FK", step.run)
            outs = ", ".join(f"v{slot}" for slot in step.outs)  # one kernel, several outputs
            src.emit(f"{outs} = {kernel}({', '.join(f'v{i}' for i in step.inputs)})")
        elif isinstance(step, Draw):
            rng, like = src.bind("R", step.rng), src.bind("L", step.like)
            src.emit(f"v{step.out} = DRAW({rng}, {step.shape!r}, {like})")
        else:
            _walk(src, index, step, calls, program.slots, orders.pop(index), program.chains)
        src.release((index, None, 1))
        src.cuts.append(len(src.lines))
    params = [f"v{i}" for i in range(program.inputs)]
    names = [f"v{s}" for s in program.outputs]
    body, src.lines, src.release = src.lines, None, None
    return link(body, src.cuts, params, names, _is_local(local), dict(src.names))


def _calls(steps):
    """{id(node): its Call}, the steps of fused regions included (their nodes are pulled back
    as before)."""
    calls = {}
    for s in steps:
        for call in s.calls if isinstance(s, Fused) else [s]:
            if isinstance(call, Call):
                calls[id(call.node)] = call
    return calls


def _is_local(local):
    return lambda name: name[0] != "v" or int(name[1:]) in local


# --- forward
def _forward(src, step, buffer=None):
    values = [f"v{i}" for i in step.inputs]
    if buffer is not None:  # an arithmetic step into an input's buffer, read here for the last time
        xp = src.bind("XP", step.xp)
        name = _UFUNCS[step.function]
        src.emit(f"v{step.out} = {xp}.{name}({', '.join(values)}, out=v{buffer})")
        return
    template = _template_of(step)
    if template is not None:
        xp = src.bind("XP", step.xp)
        src.emit(f"v{step.out} = {template.forward(xp, *values)}")
        return
    function = src.bind("F", step.function)
    xp = src.bind("XP", step.xp)
    kw = f", **{src.bind('K', step.kw)}" if step.kw else ""
    target = f"v{step.out}, x{step.out}" if step.makes_ctx else f"v{step.out}"
    src.emit(f"{target} = {function}({xp}{''.join(', ' + v for v in values)}{kw})")


def _own_forward(step):
    """Whether the step runs its rule's own forward (where a template may stand in)."""
    rule = step.node.rule
    return isinstance(rule, Primitive) and step.function is rule.forward


def _template(rule, kw):
    template = TEMPLATES.get(rule) if isinstance(rule, Primitive) else None
    return template if template is not None and template.applies(kw) else None


def _template_of(step):
    """The template standing in for a step's forward: its rule's, or, for a value computed
    with no gradient (an optimiser's update), the template of the forward it called."""
    if _own_forward(step):
        return _template(step.node.rule, step.kw)
    template = _BY_FORWARD.get(step.function)
    return template if template is not None and template.applies(step.kw) else None


_BY_FORWARD = {rule.forward: template for rule, template in TEMPLATES.items()}
_UFUNCS = {ew.add.forward: "add", ew.subtract.forward: "subtract",
           ew.multiply.forward: "multiply", ew.divide.forward: "divide"}  # fmt: skip


class _Reuse:
    """Which arithmetic steps may write into the buffer of an operand (NumPy only, arrays of
    REUSE_FROM elements or more): one that this program made itself with an arithmetic template
    (a fresh array, no view of another), of the result's shape and dtype, read here for the
    last time, and never handed to anything
    but these templates (a reshape, a rule's forward or a pullback could keep a view of it)."""

    def __init__(self, program, last, local):
        self.last, self.local, self.outputs = last, local, set(program.outputs)
        self.fresh = {}  # slot -> (shape, dtype) of a fresh array made by an arithmetic step
        self.exposed = _exposed(program)

    def buffer(self, index, step):
        function = step.function
        template = _template_of(step)
        if template is None or not is_numpy_namespace(step.xp):
            return None
        shape, dtype = tuple(step.node.shape), step.node.dtype
        found = None
        if function in _UFUNCS and len(step.inputs) == 2 and math.prod(shape) >= REUSE_FROM:
            dying = set(self.last.get((index, None), ())) - self.outputs
            for slot in step.inputs:
                if slot in dying and slot in self.local and self.fresh.get(slot) == (shape, dtype):
                    found = slot
                    break
        if shape and function in _FRESH and step.out not in self.exposed:
            self.fresh[step.out] = (shape, dtype)
        return found


_FRESH = {rule.forward for rule in TEMPLATES if rule is not _SUM}
# Elements from which writing into a buffer pays: below, `out=` costs more than a new array.
REUSE_FROM = 1 << 12


def _exposed(program):
    """The slots read by anything but an arithmetic template: forwards without a template,
    random draws' shapes, and every backward pass (its seed and what its pullbacks read)."""
    calls = _calls(program.steps)
    found = set()
    for step in program.steps:
        if isinstance(step, Fused):
            found.update(step.inputs)
        elif isinstance(step, Call):
            if _template_of(step) is None or step.function not in _FRESH:
                found.update(step.inputs)
        elif isinstance(step, Walk):
            found.add(step.seed)
            for node in step.nodes:
                call = calls.get(id(node))
                if call is not None:
                    found.update(call.out if p == 0 else slot for p, slot in call.saves)
    return found


# --- backward
UNSET, MAYBE, SET = "unset", "maybe", "set"  # what is known of a gradient at a point of the code


def _order(step, slots):
    """A walk's interior nodes in the order the tape's walk pulls them back (`tape.run`: the
    newest first), so that a gradient with several contributions adds them in the same order,
    and a replay's gradients are the eager ones bit for bit. A walk that stops at given nodes (a
    gradient's inputs) keeps only the nodes that lead to one of them: a float array that
    reaches no input (a data batch, read by a function that takes its own gradient) is not
    differentiated."""
    nodes = step.nodes  # in that order (`tape.interior_nodes`)
    if step.stop:
        useful = _leading_to_stop(step, sorted(nodes, key=lambda n: slots[id(n)]))
        nodes = [node for node in nodes if id(node) in useful]
    return nodes


def _leading_to_stop(step, nodes):
    """The ids of the stop nodes and of the interior `nodes` (in order of creation, parents
    first) from which one is reached."""
    useful = {id(node) for node in step.stop}
    for node in nodes:
        if any(type(a) is Node and id(a) in useful for a in node.args):
            useful.add(id(node))
    return useful


def _walk(src, index, step, calls, slots, order, chains):
    """A backward pass: every gradient a local `g<slot>`, each node's vjps in turn (`order`),
    and the node's gradient and saved values deleted once read for the last time. Whether a
    gradient is still None, surely set, or either, is followed through the code, so that a
    chain of template rules needs no test at all."""
    src.suffix = f"_{index}" if src.suffix is not None else ""
    stops = {id(n) for n in step.stop}
    ends = [n for n, _ in step.outputs if not stops or id(n) in stops]
    reached = {id(n) for n in order} | {id(n) for n in ends}
    root = slots[id(step.root)]
    gradients = {slots[id(n)] for n in order} | {slots[id(n)] for n, _ in step.outputs} | {root}
    src.emit(f"g{root}{src.suffix} = v{step.seed}")
    state = dict.fromkeys(gradients, UNSET)  # a name is bound by its first contribution
    state[root] = SET
    terminals = {slots[id(n)] for n, _ in step.outputs}
    position = 0
    while position < len(order):
        call = calls[id(order[position])]
        chain = chains.get((id(step), position))
        if chain is not None and state[call.out] != UNSET:  # one kernel for its pullbacks
            _chain(src, chain, slots, state, call.out)
        else:
            chain = None
            _pullback(src, call, reached, slots, state)
        count = chain.count if chain else 1
        for at in range(position, position + count):
            out = calls[id(order[at])].out
            if out not in terminals and state[out] != UNSET:
                src.emit(f"del g{out}{src.suffix}")
            src.release((index, at, 1))
            src.cuts.append(len(src.lines))
        position += count
    for node, slot in step.outputs:
        k = slots[id(node)]
        src.emit(f"v{slot} = {'None' if state[k] == UNSET else f'g{k}{src.suffix}'}")


def _chain(src, chain, slots, state, k):
    """A fused chain of pullbacks (`backward.py`) from the gradient `g<k>`: its last
    contribution by one kernel, added where the chain's last pullback adds it."""
    sure = state[k] == SET
    indent, start = (1 if sure else 2), len(src.lines)
    if not sure:
        src.emit(f"if g{k}{src.suffix} is not None:")
    kernel = src.bind("BK", chain.run)
    names = [f"g{slot}{src.suffix}" if kind == "g" else f"v{slot}" for kind, slot in chain.inputs]
    slot = slots[id(chain.parent)]
    before = state[slot]
    if before == UNSET and not sure:  # maybe bound: None first
        src.lines.insert(start, f"    g{slot}{src.suffix} = None")
        before = MAYBE
    _accumulate(src, f"{kernel}({', '.join(names)})", chain.parent, slot, None, True, before,
                indent)  # fmt: skip
    state[slot] = SET if sure or before == SET else MAYBE


def _pullback(src, call, reached, slots, state):
    node, k = call.node, call.out
    if state[k] == UNSET:
        return  # no gradient ever reaches this node
    sure = state[k] == SET
    indent = 1 if sure else 2
    start = len(src.lines)
    if not sure:
        src.emit(f"if g{k}{src.suffix} is not None:")
        src.emit("pass", indent)  # the block's first line, should it stay empty
    ans, values = _operands(src, call)
    rule = node.rule
    if isinstance(rule, Primitive):
        contributions = _vjps(src, call, ans, values, indent)
    else:
        contributions = _rule_pullback(src, call, ans, values, indent)
    for j, expression, exact in contributions:
        parent = node.args[j]
        if id(parent) in reached:
            slot = slots[id(parent)]
            before = state[slot]
            if before == UNSET and (not sure or exact is None):  # maybe bound: None first
                src.lines.insert(start, f"    g{slot}{src.suffix} = None")
                before = MAYBE
            _accumulate(src, expression, parent, slot, rule, exact, before, indent)
            state[slot] = SET if (sure and exact is not None) or before == SET else MAYBE


def _operands(src, call):
    """The names of the output and the arguments as the vjps read them: the saved values,
    and the nodes (stand-ins with shape and dtype) or constants for the others."""
    saved = dict(call.saves)
    node = call.node
    ans = f"v{call.out}" if 0 in saved else src.bind("N", node)
    values = []
    for position, arg in enumerate(node.args, start=1):
        if position in saved:
            values.append(f"v{saved[position]}")
        else:
            values.append(src.bind("A", arg))
    return ans, values


def _vjps(src, call, ans, values, indent):
    """`[(argument, expression, exact)]`: `exact` is None for a vjp called as it is (its
    result may be None, or need fitting), else whether a template's result needs no fitting."""
    node = call.node
    rule = node.rule
    # the templates' vjps are the real formulas: complex values take the rule's own vjps
    template = None if is_complex_dtype(node.dtype) else _template(rule, node.ctx)
    found = []
    for j, (arg, vjp) in enumerate(zip(node.args, rule.vjps)):
        if vjp is None or type(arg) is not Node:
            continue
        if template is not None and j < len(template.vjps) and template.vjps[j] is not None:
            xp = src.bind("XP", call.xp)
            expression = template.vjps[j](xp, f"g{call.out}{src.suffix}", ans, *values)
            found.append((j, expression, _fits(node, arg)))
        else:
            kw = f", **{src.bind('K', node.ctx)}" if node.ctx else ""
            function = src.bind("VJ", vjp)
            g = f"g{call.out}{src.suffix}"
            expression = f"{function}({g}, {ans}{''.join(', ' + v for v in values)}{kw})"
            found.append((j, expression, None))
    return found


def _fits(node, arg):
    """Whether a template's contribution (of the output's shape and dtype, or the argument's,
    for a sum) is already of the argument's shape and dtype: then no fitting is emitted."""
    dtypes = {node.dtype, arg.dtype}
    for other in node.args:
        if type(other) is Node or hasattr(other, "dtype"):
            dtypes.add(other.dtype)
    return len(dtypes) == 1 and (arg.shape == node.shape or node.rule is _SUM)


def _rule_pullback(src, call, ans, values, indent):
    """A rule that is not a Primitive (a custom rule, a checkpoint): its own pullback."""
    node = call.node
    pullback = src.bind("PB", node.rule.pullback)
    ctx = f"x{call.out}" if call.makes_ctx else src.bind("CTX", node.ctx)
    args = src.bind("ARGS", node.args)
    saved = f"[{ans if ans.startswith('v') else 'None'}, {', '.join(values)}]"
    g = f"g{call.out}{src.suffix}"
    src.emit(f"gs = {pullback}({src.bind('N', node)}, {args}, {ctx}, {saved}, {g}, False, None)",
             indent)  # fmt: skip
    return [(j, f"gs[{j}]", None) for j, arg in enumerate(node.args) if type(arg) is Node]


def _accumulate(src, expression, parent, slot, rule, exact, before, indent):
    """Add a contribution into `g<slot>`: directly where it is known to be an array of the
    right layout and the gradient's state is known, with the tests otherwise."""
    g = f"g{slot}{src.suffix}"
    if exact:
        if before == UNSET:
            src.emit(f"{g} = {expression}", indent)
        elif before == SET:
            src.emit(f"{g} = {g} + {expression}", indent)
        else:
            src.emit(f"c = {expression}", indent)
            src.emit(f"{g} = c if {g} is None else {g} + c", indent)
        return
    node = src.bind("N", parent)
    name = src.bind("NAME", getattr(rule, "name", "?"))
    src.emit(f"c = {expression}", indent)
    if exact is None:
        src.emit("if c is not None:", indent)
        indent += 1
    src.emit(f"if c.shape != {node}.shape or c.dtype != {node}.dtype:", indent)
    src.emit(f"c = FIT(c, {node}, {name})", indent + 1)
    src.emit(f"{g} = c" if before == UNSET else f"{g} = c if {g} is None else {g} + c", indent)


# --- liveness
def _last_reads(program, calls, orders):
    """{(step index, node position in a walk or None): the slots read there for the last time},
    reading a forward's inputs, a walk's seed, and each node's saved values in its pullback."""
    last = {}
    for index, step in enumerate(program.steps):
        if isinstance(step, (Call, Fused)):
            for slot in step.inputs:
                last[slot] = (index, None)
        elif isinstance(step, Walk):
            last[step.seed] = (index, None)
            for position, node in enumerate(orders[index]):
                call = calls[id(node)]
                for p, slot in call.saves:
                    last[call.out if p == 0 else slot] = (index, position)
    found = {}
    for slot, point in last.items():
        found.setdefault(point, []).append(slot)
    return found
