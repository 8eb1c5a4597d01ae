"""What tg.compile sees while a function runs once: the program a replay runs.

The core shows the recorder every node made (`node`), leaf made (`leaf`), random draw
(`draw`), first-order backward pass (`walk`), and every read and write of a layer's buffer
(`read`, `write`: BatchNorm's running statistics), so that a replay reads the buffers anew and
writes them back as the recording call did. Each value gets a slot of the replay's
environment: the arguments' arrays first, then constants (values made before or outside the
recording), then each step's output in order. A step is one of

- `Call`: a node's value from the values of its inputs (the rule's forward, or what the node
  said a replay computes), and what the node saves for its pullback;
- `Draw`: fresh uniform numbers from a generator (a Dropout's mask);
- `Walk`: a backward pass over recorded nodes, its counts taken once, its gradients new slots.
"""

from dataclasses import dataclass, field
from weakref import ref as _weakref

from .. import draws, recording
from ..backend import namespace_of
from ..checks import checking
from ..primitive import traced_data
from ..tape import BackError, Node, counts, leaf_node, run
from ..tracked import TrackedArray

__all__ = ["Recorder", "Call", "Draw", "Walk"]


@dataclass
class Call:
    out: int  # the slot of the value
    node: Node
    function: object  # function(xp, *values, **kw) -> value, or (value, ctx) if makes_ctx
    xp: object
    inputs: list  # slots
    kw: dict
    makes_ctx: bool
    saves: list  # [(position in the node's saved list, slot)]


@dataclass
class Draw:
    out: int
    rng: object
    shape: tuple
    like: object  # an array of the library and device to draw into, or None


@dataclass
class Walk:
    root: Node
    seed: int  # the slot of the seed
    stop: list  # nodes
    counted: list  # [(node, count)]
    outputs: list = field(default_factory=list)  # [(node, slot)]


SPENT_MESSAGE = (
    "back was already used on this graph: a single-use pass (once=True) frees it. Recompute "
    "the forward pass, or pass once=False to keep the graph for another pass."
)


def checked_seed(xp, loss):
    """The seed of a scalar loss's pass, after `back`'s check of the loss where checks run."""
    if checking(loss):
        from ..api import scalar_seed  # the API sits above the compiler's recorder

        scalar_seed(TrackedArray(loss, xp))
    return xp.ones_like(loss)


class Recorder:
    """Collects the steps of one run of a function. `arrays` are the arguments' arrays, in
    order (their slots are 0 .. len - 1)."""

    def __init__(self, arrays, lenient=False):
        self.lenient = lenient  # a refusal stops the recording, and the run goes on eagerly
        self.refused = None  # the RecordingError that stopped it
        self.values = list(arrays)  # each slot's value kept: arguments, constants (else None)
        self._input_slots = {id(a): i for i, a in enumerate(arrays)}
        self.slots = {}  # id(node) -> slot
        self.value_slots = {}  # id(value) -> (slot, reference), for traced values (`_lookup`)
        self.nodes = []  # every node recorded, in order of creation
        self.steps = []
        self.walks = 0
        self.draws = 0
        self._spent = set()  # ids of the nodes a single-use pass went through
        self._tracks = {}  # id(node) -> whether it would be tracked eagerly
        self.writes = {}  # id(buffer) -> [buffer's slot, slot of its last value, traced value]

    # --- the hooks
    def leaf(self, tracked):
        """A leaf: an argument's array, or else a constant (a leaf made inside f)."""
        slot = self._input_slots.get(id(tracked.data))
        if slot is None:  # over a traced value's data (a leaf of an inner gradient): its slot
            slot = self._lookup(tracked.data)
        if slot is None:
            slot = self._new_slot(tracked.data)
        self._place(tracked, slot)

    def node(self, out, how):
        """A node made by a rule (or traced data computed by one): a step computing its value."""
        function, inputs, kw, makes_ctx = how
        node = out._node
        inputs = [self._slot_of(a) for a in inputs]
        call = Call(self._made_slot(), node, function, out._xp, inputs, kw, makes_ctx,
                    self._saves(node))  # fmt: skip
        self.steps.append(call)
        self._place(out, call.out)

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
        counted = counts(root, stop)
        if once is not None:
            self._spend(root, counted, once)
        step = Walk(root, self._seed_slot(root, seed), stop, counted)
        self.walks += 1
        self.steps.append(step)
        with recording.paused():  # what the pullbacks do, the replay's walk does again
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
        self.writes[id(buffer)] = [slot, self._slot_of(value), value]
        self._remember(buffer, self.writes[id(buffer)][1])  # read from now on: the value
        buffer[...] = value.data if type(value) is TrackedArray else value

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

    def _spend(self, root, counted, once):
        walked = {id(root)} | {id(node) for node, _ in counted}
        if walked & self._spent:
            raise BackError(SPENT_MESSAGE)
        if once:
            self._spent |= walked

    def _seed_slot(self, root, seed):
        """The slot of a pass's seed: a traced seed's, or, for the ones that start a scalar
        loss's pass, a step that checks the loss as `back` does (a non-finite loss raises
        where checks run) and makes them anew."""
        slot = self._lookup(seed)
        if slot is not None:
            return slot
        loss = self.slots.get(id(root))
        if loss is None or getattr(seed, "shape", None) != () or not bool(seed == 1):
            return self._new_slot(seed)
        node = leaf_node(seed.shape, seed.dtype)
        step = Call(self._made_slot(), node, checked_seed, namespace_of(seed), [loss], {},
                    False, [])  # fmt: skip
        self.steps.append(step)
        return step.out

    def alias(self, out, tracked):
        """`out` (traced data) stands for the value of `tracked`: they share a slot."""
        self._place(out, self._slot_of(tracked))

    # --- slots
    def _new_slot(self, value):
        """A slot for a value the program keeps: an argument's array or a constant."""
        self.values.append(value)
        return len(self.values) - 1

    def _made_slot(self):
        """A slot for a value a step makes: the program does not keep the recorded one."""
        self.values.append(None)
        return len(self.values) - 1

    def _place(self, tracked, slot):
        self.slots[id(tracked._node)] = slot
        self._remember(tracked.data, slot)
        self.nodes.append(tracked._node)

    def _remember(self, value, slot):
        """`value` (traced data) is found in `slot` by `_lookup`. It is held weakly, so that an
        intermediate no pullback saved is freed during the recording as eagerly; its id, which
        a later array may take, is checked against the reference."""
        try:
            ref = _weakref(value)
        except TypeError:  # no weak references to it: held
            ref = _Held(value)
        self.value_slots[id(value)] = (slot, ref)

    def _lookup(self, value):
        """The slot of `value` if it is traced data (`_remember`), else None."""
        found = self.value_slots.get(id(value))
        return found[0] if found is not None and found[1]() is value else None

    def _slot_of(self, value):
        """The slot of an input of a step: its node's (a node, or a tracked array), a traced
        value's (a constant that is one: data, or tg.data of a traced array), or a new
        constant's."""
        if type(value) is TrackedArray:
            value = value.data if value._node is None else value._node
        if type(value) is Node:
            slot = self.slots.get(id(value))
            if slot is None:
                raise recording.RecordingError(
                    "tg.compile: f uses a tracked array it did not receive as an argument (a "
                    "tg.param made outside f, say); pass it to f as an argument, so that every "
                    "replay reads its current value"
                )
            return slot
        slot = self._lookup(value)
        return self._new_slot(value) if slot is None else slot

    def _saves(self, node):
        """Where the values a node's pullback reads come from at a replay: `[(position, slot)]`;
        position 0 is the node's own value (filled by its step), k its argument k - 1: each
        one it saved, and each constant that is traced data (read anew, saved or not)."""
        saved = node.saved or [None, *node.args]
        found = [(0, None)] if saved[0] is not None else []
        for k, (arg, value) in enumerate(zip(node.args, saved[1:]), start=1):
            if type(arg) is Node and value is not arg:
                found.append((k, self.slots[id(arg)]))
            elif type(arg) is not Node:
                slot = self._lookup(arg)
                if slot is not None:
                    found.append((k, slot))
        return found


class _Held:
    """A strong reference with a weak reference's call."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __call__(self):
        return self.value
