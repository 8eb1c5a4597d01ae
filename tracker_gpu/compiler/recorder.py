"""What tg.compile sees while a function runs once: the program a replay runs.

The core shows the recorder every node made (`node`), leaf made (`leaf`), random draw
(`draw`) and first-order backward pass (`walk`). Each value gets a slot of the replay's
environment: the arguments' arrays first, then constants (values made before or outside the
recording), then each step's output in order. A step is one of

- `Call`: a node's value from the values of its inputs (the rule's forward, or what the node
  said a replay computes), and what the node saves for its pullback;
- `Draw`: fresh uniform numbers from a generator (a Dropout's mask);
- `Walk`: a backward pass over recorded nodes, its counts taken once, its gradients new slots.
"""

from dataclasses import dataclass, field

from .. import draws, recording
from ..backend import namespace_of
from ..primitive import traced_data
from ..tape import Node, counts, run
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


class Recorder:
    """Collects the steps of one run of a function. `arrays` are the arguments' arrays, in
    order (their slots are 0 .. len - 1)."""

    def __init__(self, arrays):
        self.values = list(arrays)  # the recording run's value of every slot
        self._input_slots = {id(a): i for i, a in enumerate(arrays)}
        self.slots = {}  # id(node) -> slot
        self.value_slots = {}  # id(value) -> slot, for a traced value passed on as a constant
        self.nodes = []  # every node recorded, in order of creation
        self.steps = []
        self.walks = 0
        self.draws = 0

    # --- the hooks
    def leaf(self, tracked):
        """A leaf: an argument's array, or else a constant (a leaf made inside f)."""
        slot = self._input_slots.get(id(tracked.data))
        if slot is None:
            slot = self._new_slot(tracked.data)
        self._place(tracked, slot)

    def node(self, out, how):
        """A node made by a rule (or traced data computed by one): a step computing its value."""
        function, inputs, kw, makes_ctx = how
        node = out._node
        inputs = [self._slot_of(a) for a in inputs]
        call = Call(self._new_slot(out.data), node, function, out._xp, inputs, kw, makes_ctx,
                    self._saves(node))  # fmt: skip
        self.steps.append(call)
        self._place(out, call.out)

    def draw(self, rng, shape, like):
        """Uniform numbers from `rng`, drawn anew by every replay: traced data."""
        value = draws.draw(rng, shape, like)
        self.draws += 1
        step = Draw(self._new_slot(value), rng, tuple(shape), like)
        out = traced_data(value, namespace_of(value))
        self.steps.append(step)
        self._place(out, step.out)
        return out

    def walk(self, root, seed, stop):
        """A first-order backward pass, run now and recorded: its gradients are traced data
        (slots of this step) for what the function computes from them."""
        stop = list(stop)
        step = Walk(root, self._new_slot(seed), stop, counts(root, stop))
        self.walks += 1
        self.steps.append(step)
        with recording.paused():  # what the pullbacks do, the replay's walk does again
            reached = run(root, seed, once=False, stop=stop)
        traced = []
        for node, g in reached:
            slot = self._new_slot(g)
            step.outputs.append((node, slot))
            out = traced_data(g, namespace_of(g))
            self._place(out, slot)
            traced.append((node, out))
        return traced

    def alias(self, out, tracked):
        """`out` (traced data) stands for the value of `tracked`: they share a slot."""
        self._place(out, self._slot_of(tracked))

    # --- slots
    def _new_slot(self, value):
        self.values.append(value)
        return len(self.values) - 1

    def _place(self, tracked, slot):
        self.slots[id(tracked._node)] = slot
        self.value_slots[id(tracked.data)] = slot
        self.nodes.append(tracked._node)

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
        slot = self.value_slots.get(id(value))
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
            elif type(arg) is not Node and id(arg) in self.value_slots:
                found.append((k, self.value_slots[id(arg)]))
        return found
