"""What tg.compile sees while a function runs once: the program a replay runs.

The core shows the recorder every node made (`node`), leaf made (`leaf`), random draw
(`draw`), first-order backward pass (`walk`), and every read and write of a layer's buffer
(`read`, `write`: BatchNorm's running statistics), so that a replay reads the buffers anew and
writes them back as the recording call did, and every write into an argument that `f` gets as
a plain array eagerly (`written`, `rebound`: `c += 1.0`, `out[...] = v` into an argument
outside `wrt`, or any with `gradient=False`), so that a replay writes the caller's array as
the eager call does (`argument_writes`). Each value gets a slot of the replay's
environment: the arguments' arrays first, then constants (values made before or outside the
recording), then each step's output in order. A step is one of

- `Call`: a node's value from the values of its inputs (the rule's forward, or what the node
  said a replay computes), and what the node saves for its pullback;
- `Draw`: fresh uniform numbers from a generator (a Dropout's mask);
- `Walk`: a backward pass over recorded nodes, its counts taken once, its gradients new slots.
"""

from dataclasses import dataclass, field
from weakref import ref as _weakref

import numpy as np

from .. import draws, recording
from ..backend import namespace_of
from ..checks import checking
from ..primitive import detached, traced_data
from ..pytree import tree_leaves
from ..rules.shape import _getitem_forward  # a view eagerly, a copy while recording
from ..tape import (
    SPENT_MESSAGE,
    BackError,
    Node,
    interior_nodes,
    leaf_node,
    replay,
    run,
    serial_now,
)
from ..tracked import TrackedArray
from .argument_writes import (
    PLAIN_OPERATOR,
    PLAIN_WRITE,
    READ_AFTER_WRITE,
    AsEagerly,
    described,
    shares,
    view,
    view_key,
)

__all__ = ["Recorder", "Call", "Draw", "Walk"]


@dataclass(slots=True)  # one per operation: no __dict__
class Call:
    out: int  # the slot of the value
    node: Node
    function: object  # function(xp, *values, **kw) -> value, or (value, ctx) if makes_ctx
    xp: object
    inputs: tuple  # slots
    kw: dict
    makes_ctx: bool
    saves: tuple  # ((position in the node's saved list, slot), ...)


@dataclass(slots=True)
class Draw:
    out: int
    rng: object
    shape: tuple
    like: object  # an array of the library and device to draw into, or None


@dataclass(slots=True)
class Walk:
    root: Node
    seed: int  # the slot of the seed
    stop: list  # nodes
    nodes: list  # the interior nodes it may go through, in its order (`tape.interior_nodes`)
    outputs: list = field(default_factory=list)  # [(node, slot)]
    release: bool = True  # whether it frees the saved values (no later walk goes over them)


def _own_identity(tracked):
    """A traced NumPy boolean made a 0-d array of its own: values are found by identity while
    recording, and NumPy's booleans are two objects (`np.True_`, `np.False_`), so that two
    traced flags of one value (`finite` and `grow`, say) would share the slot of the last.
    (Other NumPy scalars are new objects, held while recording: their identity is theirs.)"""
    if type(tracked.data) is np.bool_:
        tracked.data = np.asarray(tracked.data)


def placed(steps, slots, others):
    """Every node placed in a slot: the nodes of the steps (`Call`s, but a pass's seed) and
    `others` (a recorder's `nodes`)."""
    for step in steps:
        if type(step) is Call and step.node.serial in slots:
            yield step.node
    yield from others


def slots_by_id(steps, slots, others):
    """`{id(node): slot}` for every node placed (`placed`), as the program's planners and its
    generator read them."""
    return {id(node): slots[node.serial] for node in placed(steps, slots, others)}


class BySerial:
    """`{node.serial: slot}` for the nodes a recording places: a list indexed from the first
    serial of the recording (`base`), 8 bytes a node where a dict takes about 50, with a
    dict for any older node; `None` in the list is no slot."""

    __slots__ = ("base", "table", "older")

    def __init__(self, base):
        self.base, self.table, self.older = base, [], {}

    def get(self, serial, default=None):
        k = serial - self.base
        if k < 0:
            return self.older.get(serial, default)
        slot = self.table[k] if k < len(self.table) else None
        return default if slot is None else slot

    def __getitem__(self, serial):
        slot = self.get(serial)
        if slot is None:
            raise KeyError(serial)
        return slot

    def __contains__(self, serial):
        return self.get(serial) is not None

    def __setitem__(self, serial, slot):
        k, table = serial - self.base, self.table
        if k < 0:
            self.older[serial] = slot
            return
        if k >= len(table):
            table.extend([None] * (k + 1 - len(table)))
        table[k] = slot


_NO_KEYWORDS = {}  # the keywords of the steps that take none (never written)
NUMBERS = frozenset((float, int, bool, complex))  # immutable constants: one slot per object


def checked_seed(xp, loss):
    """The seed of a scalar loss's pass, after `back`'s check of the loss where checks run."""
    if checking(loss):
        from ..api import scalar_seed  # the API sits above the compiler's recorder

        return scalar_seed(loss, xp)  # the checks, then the seed
    return xp.ones_like(loss)


class Recorder:
    """Collects the steps of one run of a function. `arrays` are the arguments' arrays, in
    order (their slots are 0 .. len - 1)."""

    def __init__(self, arrays, lenient=False):
        self.lenient = lenient  # a refusal stops the recording, and the run goes on eagerly
        self.refused = None  # the RecordingError that stopped it
        self.values = list(arrays)  # each slot's value kept: arguments, constants (else None)
        self.constants = []  # the constants' slots; the others after the arguments' are made
        self._input_slots = {id(a): i for i, a in enumerate(arrays)}
        self.slots = BySerial(serial_now())  # node.serial -> slot
        self.value_slots = {}  # id(value) -> its _Ref (slot and reference), while it lives
        self._forget = _forget(self.value_slots)
        self.nodes = []  # the nodes placed by other hooks than `node` (leaves, data)
        self.steps = []
        self.walks = 0
        self.draws = 0
        self._spent = []  # the nodes of each single-use pass (`_spend`)
        self._tracks = {}  # id(node) -> whether it would be tracked eagerly
        self.writes = {}  # id(buffer) -> [buffer's slot, slot of its last value, traced value]
        self._numbers = {}  # id(number) -> its slot: a Python number used again, one slot
        # the writes into arguments (`rebound`): node.serial -> (argument's slot, its leaf) for
        # an argument's traced array and each value a write made of it; the arguments' traced
        # arrays, [(slot, tracked, leaf)]; slot -> [first write's step, the slots that held
        # the argument's memory then (itself, its views), the last written value (a tracked)]
        self._arguments, self._handles, self._written = {}, [], {}

    # --- the hooks
    def leaf(self, tracked):
        """A leaf: an argument's array, or else a constant (a leaf made inside f)."""
        slot = self._input_slots.get(id(tracked.data))
        if slot is not None:  # an argument: a write into it may be the caller's (`rebound`)
            self._arguments[tracked._node.serial] = (slot, tracked._node)
            self._handles.append((slot, tracked, tracked._node))
        if slot is None:  # over a traced value's data (a leaf of an inner gradient): its slot
            slot = self._lookup(tracked.data)
        if slot is None:
            slot = self._new_slot(tracked.data)
        self._place(tracked, slot)

    def node(self, out, how):
        """A node made by a rule (or traced data computed by one): a step computing its value."""
        function, inputs, kw, makes_ctx = how
        node = out._node
        if not kw and type(kw) is dict and kw is not _NO_KEYWORDS:  # one empty dict for all
            if node.ctx is kw:
                node.ctx = _NO_KEYWORDS
            kw = _NO_KEYWORDS
        table, base, numbers = self.slots.table, self.slots.base, self._numbers
        found, plain = [], False
        for a in inputs:  # `_slot_of`, its common cases inline
            kind = type(a)
            if kind is Node:
                k = a.serial - base
                slot = table[k] if 0 <= k < len(table) else None
                if slot is None:  # older than the recording, or made outside f
                    slot = self._slot_of(a)  # raises, naming it
            elif kind in NUMBERS and id(a) in numbers:
                slot = numbers[id(a)]
            else:
                plain = plain or kind not in NUMBERS
                slot = self._slot_of(a)
            found.append(slot)
        slot = len(self.values)
        self.values.append(None)
        if node.saved is None and not plain and inputs is node.args:
            saves = ()  # nothing saved, no traced constant: nothing read by the pullback
        else:
            saves = self._saves(node)
        self.steps.append(Call(slot, node, function, out._xp, tuple(found), kw, makes_ctx, saves))
        if node.serial - base == len(table):  # `_place`, the node found in its step
            table.append(slot)
        else:
            self.slots[node.serial] = slot
        _own_identity(out)
        self._remember(out.data, slot)

    def draw(self, rng, shape, like):
        """Uniform numbers from `rng`, drawn anew by every replay: traced data."""
        value = draws.draw(rng, shape, like)
        self.draws += 1
        step = Draw(self._made_slot(), rng, tuple(shape), like)
        out = traced_data(value, namespace_of(value))
        self.steps.append(step)
        self._place(out, step.out)
        return out

    def walk(self, root, seed, stop, once=None):
        """A first-order backward pass, run now and recorded: its gradients are traced data
        (slots of this step) for what the function computes from them. A second pass over a
        graph that a single-use pass (`once`) went through raises, as eagerly."""
        stop = list(stop)
        nodes = interior_nodes(root, stop)
        if once is not None:
            self._spend(root, nodes, once)
        step = Walk(root, self._seed_slot(root, seed), stop, nodes)
        self.walks += 1
        self.steps.append(step)
        with recording.paused():  # what the pullbacks do, the replay's walk does again
            if once and nodes:  # saved values freed as the pass goes
                reached = replay(root, seed, stop)
            else:  # the graph may be walked again: its saved values kept
                reached = run(root, seed, once=False, stop=stop)
        traced = []
        for node, g in reached:
            slot = self._made_slot()
            step.outputs.append((node, slot))
            out = traced_data(g, namespace_of(g))
            self._place(out, slot)
            traced.append((node, out))
        return traced

    def read(self, buffer):
        """A layer's buffer (plain or tracked) as traced data: its last value written by this
        run, or else the buffer itself, read anew by every replay (an argument's array, or a
        constant that the replay reads in its state then)."""
        plain = buffer.data if type(buffer) is TrackedArray else buffer
        written = self.writes.get(id(plain))
        if written is not None:
            return written[2]
        out = traced_data(plain, namespace_of(plain))
        if type(buffer) is TrackedArray and buffer._node is not None:
            self.alias(out, buffer)
        else:
            self.leaf(out)
        return out

    def write(self, buffer, value):
        """Write `value` (traced data) into the plain array `buffer` in place, now and at the end
        of every replay."""
        slot = self._input_slots.get(id(buffer))
        written = self.writes.get(id(buffer))
        if written is not None:
            slot = written[0]
        elif slot is None:
            slot = self._new_slot(buffer)
        value_slot = self._slot_of(value)
        self.writes[id(buffer)] = [slot, value_slot, value]
        self._remember(buffer, value_slot)  # read from now on: the value
        for _, handle, node in self._handles:  # and through the argument's traced array
            if handle.data is buffer:
                self.slots[node.serial] = value_slot
        buffer[...] = value.data if type(value) is TrackedArray else value

    def written(self, x, key, value):
        """`value` as `x[key] = value` writes it (`indexed.write`): where `x` is an argument
        that `f` gets as a plain array eagerly and `value` carries a gradient, the write does
        what NumPy's does eagerly: one element takes the 0-d value's number (its gradient
        dropped), anything else raises."""
        if self._argument(x) is None or not self._tracked(value):
            return value
        parts = key if type(key) is tuple else (key,)
        one = len(parts) == len(x.shape) and all(
            isinstance(k, (int, np.integer)) and type(k) is not bool for k in parts
        )
        if not one:
            raise AsEagerly(PLAIN_WRITE)
        if len(value.shape):
            raise ValueError("setting an array element with a sequence.")
        return detached(value)  # traced data: every replay writes the new number

    def in_place(self, x, other):
        """Before `x op= other` (`indexed.in_place_operator`): where `x` is an argument that `f`
        gets as a plain array eagerly, a tracked `other` raises as NumPy's operator does."""
        if type(other) is TrackedArray and self._argument(x) is not None:
            if other._node is None or self._tracked(other):
                raise AsEagerly(PLAIN_OPERATOR)

    def rebound(self, x, written):
        """`x` is about to stand for `written` (`indexed._rebind`: `x[key] = v`, `x += v`).
        Where `x` is an argument that `f` gets as a plain array eagerly, the eager write goes
        into the caller's array: remember it (`argument_writes` replays it)."""
        slot = self._argument(x)
        if slot is None or written._node is None:
            return
        self._arguments[written._node.serial] = (slot, self._arguments[x._node.serial][1])
        found = self._written.get(slot)
        if found is None:  # the first write: what holds the argument's memory now
            found = self._written[slot] = [len(self.steps), self._sharing(slot), None]
        found[2] = written

    def argument_writes(self, result, arrays):
        """Register the writes into arguments (`rebound`) as writes of the program, written
        into the caller's arrays at the end of every replay: `[(array, value)]`, the writes
        the recording run itself makes once the program is made. A write whose argument's
        old value is read after it (a view made before it, a value a gradient pass saved, the
        array read again from elsewhere) is refused: eagerly that read sees the new value."""
        pending = []
        for slot, (start, sharing, value) in self._written.items():
            if id(arrays[slot]) in self.writes or self._reads_after(start, sharing, result):
                raise recording.RecordingError(READ_AFTER_WRITE.format(described(arrays[slot])))
            self.writes[id(arrays[slot])] = [slot, self._slot_of(value), value]
            pending.append((arrays[slot], value.data))
        return pending

    def refused_writes(self, arrays):
        """The writes into arguments of a run that a refusal finished eagerly (`lenient`):
        `[(array, value)]`, each argument's last value (written after the refusal too)."""
        last = {slot: value.data for slot, (_, _, value) in self._written.items()}
        for slot, tracked, node in self._handles:
            if tracked._node is not node and not self.tracks(node):
                last[slot] = tracked.data
        return [(arrays[slot], value) for slot, value in last.items()]

    def _argument(self, x):
        """The slot of the argument that `x` stands for, if `f` gets it as a plain array
        eagerly (outside `wrt`, or with `gradient=False`), else None."""
        node = getattr(x, "_node", None)
        found = None if node is None else self._arguments.get(node.serial)
        if found is None or self.tracks(found[1]):
            return None
        return found[0]

    def _tracked(self, value):
        """Whether `value` is a tracked array eagerly (on the tape)."""
        return type(value) is TrackedArray and value._node is not None and self.tracks(value._node)

    def _sharing(self, slot):
        """The slots that hold the memory of the argument in `slot` now, or would eagerly:
        itself, the values alive now that share its memory, and, step by step, each view made
        of one of them (a step whose value is a view, and `x[key]`, a view eagerly where `x`
        is a plain array, a copy here: `shape._getitem_forward`)."""
        array = self.values[slot]
        alive = {}
        for ref in list(self.value_slots.values()):
            value = ref()
            if value is not None:
                alive[ref.slot] = value
        found = {slot} | {s for s, value in alive.items() if shares(value, array)}
        for step in self.steps:
            if type(step) is Call and step.inputs and step.inputs[0] in found:
                if view(alive.get(step.out)) or (
                    step.function is _getitem_forward and view_key(step, self.values)
                ):
                    found.add(step.out)
        return found

    def _reads_after(self, start, sharing, result):
        """Whether a step from `start` on, a pass from then that reads a saved value, a value
        of the result or another write reads one of the slots `sharing`."""
        saving = set()
        for step in self.steps:
            if type(step) is Call and any(
                (slot if position else step.out) in sharing for position, slot in step.saves
            ):
                saving.add(id(step.node))
        for step in self.steps[start:]:
            kind = type(step)
            if kind is Call:
                reads = [*step.inputs, *(slot for position, slot in step.saves if position)]
                if any(slot in sharing for slot in reads):
                    return True
            elif kind is Walk:
                if step.seed in sharing or id(step.root) in saving:
                    return True
                if saving and any(id(node) in saving for node in step.nodes):
                    return True
        for leaf in tree_leaves(result):
            if type(leaf) is TrackedArray and leaf._node is not None:
                if self.slots.get(leaf._node.serial) in sharing:
                    return True
        return any(value in sharing for _, value, _ in self.writes.values())

    def tracked_as(self, nodes, tracked):
        """Say whether the values of `nodes` are tracked eagerly, where their kind does not
        tell: the arguments of a function compiled with `gradient=False` (plain eagerly) and
        the inputs an inner transform makes of them (tracked)."""
        for node in nodes:
            self._tracks[id(node)] = tracked

    def tracks(self, node):
        """Whether the value of `node` would be tracked eagerly: it is computed from a parameter
        (a leaf that is not data), not from data only (arguments outside `wrt`, labels, draws),
        which eagerly are plain arrays."""
        known = self._tracks
        stack = [node]
        while stack:
            top = stack[-1]
            if id(top) in known:
                stack.pop()
                continue
            if top.rule is None or recording.is_data(top):
                known[id(top)] = top.rule is None and not recording.is_data(top)
                stack.pop()
                continue
            parents = [a for a in top.args if type(a) is Node and id(a) not in known]
            if parents:
                stack.extend(parents)
                continue
            known[id(top)] = any(type(a) is Node and known[id(a)] for a in top.args)
            stack.pop()
        return known[id(node)]

    def _spend(self, root, nodes, once):
        """Raise if this pass goes through a node that a single-use pass went through; remember
        the pass if it is one. The sets are made only where there was one before (most
        recordings have a single pass)."""
        if self._spent:
            walked = {id(node) for node in nodes or [root]}
            if any(id(node) in walked for spent in self._spent for node in spent):
                raise BackError(SPENT_MESSAGE)
        if once:
            self._spent.append(nodes or [root])  # the root is the first of its nodes

    def _seed_slot(self, root, seed):
        """The slot of a pass's seed: a traced seed's, or, for the ones that start a scalar
        loss's pass, a step that checks the loss as `back` does (a non-finite loss raises
        where checks run) and makes them anew."""
        slot = self._lookup(seed)
        if slot is not None:
            return slot
        loss = self.slots.get(root.serial)
        if loss is None or getattr(seed, "shape", None) != () or not bool(seed == 1):
            return self._new_slot(seed)
        node = leaf_node(seed.shape, seed.dtype)
        step = Call(self._made_slot(), node, checked_seed, namespace_of(seed), (loss,), {},
                    False, ())  # fmt: skip
        self.steps.append(step)
        return step.out

    def alias(self, out, tracked):
        """`out` (traced data) stands for the value of `tracked`: they share a slot."""
        self._place(out, self._slot_of(tracked))

    # --- slots
    def _new_slot(self, value):
        """A slot for a value the program keeps: an argument's array or a constant."""
        self.values.append(value)
        self.constants.append(len(self.values) - 1)
        return len(self.values) - 1

    def _made_slot(self):
        """A slot for a value a step makes: the program does not keep the recorded one."""
        self.values.append(None)
        return len(self.values) - 1

    def slot_of_node(self, node):
        """The slot of a node placed by this recording, or None."""
        return self.slots.get(node.serial)

    def _place(self, tracked, slot):
        self.slots[tracked._node.serial] = slot
        _own_identity(tracked)
        self._remember(tracked.data, slot)
        self.nodes.append(tracked._node)

    def _remember(self, value, slot):
        """`value` (traced data) is found in `slot` by `_lookup` while it lives. It is held
        weakly, so that an intermediate no pullback saved is freed during the recording as
        eagerly, and its entry goes with it (a later array may take its id)."""
        table = self.value_slots
        try:
            ref = _Ref(value, self._forget)
        except TypeError:  # no weak references to it: held
            ref = _Held(value)
        ref.slot, ref.key = slot, id(value)
        table[ref.key] = ref

    def _lookup(self, value):
        """The slot of `value` if it is traced data (`_remember`), else None."""
        found = self.value_slots.get(id(value))
        return found.slot if found is not None and found() is value else None

    def _slot_of(self, value):
        """The slot of an input of a step: its node's (a node, or a tracked array), a traced
        value's (a constant that is one: data, or tg.data of a traced array), or a new
        constant's."""
        if type(value) is TrackedArray:
            value = value.data if value._node is None else value._node
        if type(value) is Node:
            slot = self.slots.get(value.serial)
            if slot is None:
                raise recording.RecordingError(
                    "tg.compile: f uses a tracked array it did not receive as an argument (a "
                    "tg.param made outside f, say); pass it to f as an argument, so that every "
                    "replay reads its current value"
                )
            return slot
        slot = self._lookup(value)
        if slot is not None:
            return slot
        if type(value) not in NUMBERS:
            return self._new_slot(value)
        slot = self._numbers.get(id(value))  # held by `values`: its id is its own
        if slot is None:
            slot = self._numbers[id(value)] = self._new_slot(value)
        return slot

    def _saves(self, node):
        """Where the values a node's pullback reads come from at a replay: `((position, slot),
        ...)`; position 0 is the node's own value (filled by its step), k its argument k - 1:
        each one it saved, and each constant that is traced data (read anew, saved or not)."""
        saved = node.saved or [None, *node.args]
        found = [(0, None)] if saved[0] is not None else []
        for k, (arg, value) in enumerate(zip(node.args, saved[1:]), start=1):
            if type(arg) is Node and value is not arg:
                found.append((k, self.slots[arg.serial]))
            elif type(arg) is not Node:
                slot = self._lookup(arg)
                if slot is not None:
                    found.append((k, slot))
        return tuple(found) if found else ()


class _Ref(_weakref):
    """A weak reference to a traced value, with its slot and its key in `value_slots`."""

    __slots__ = ("slot", "key")


def _forget(table):
    """The callback that drops a value's entry from `table` when the value dies (unless the
    entry is a newer one's)."""

    def forget(ref):
        if table.get(ref.key) is ref:
            table.pop(ref.key, None)

    return forget


class _Held:
    """A strong reference with a weak reference's call."""

    __slots__ = ("value", "slot", "key")

    def __init__(self, value):
        self.value = value

    def __call__(self):
        return self.value
