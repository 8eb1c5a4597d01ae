"""A recorded program, replayed: the steps over an environment of slots, no tape built.

A replay binds the arguments' arrays to the first slots, runs each step (a forward, a draw, a
backward pass in its recorded order), reads the result from its slots and writes the layers'
buffers that the recording run wrote (BatchNorm's running statistics) in place. For arrays in host
memory the steps are one generated function (`codegen.py`); for arrays on a GPU, or while the
fused path runs on the host (`cuda.on_host`), they are interpreted here, each backward pass a
walk of the recorded nodes with its counts known (`tape.replay`), so that the fused pullbacks
serve it, and on a GPU the whole replay is one CUDA graph (`graphs.py`).
"""

import copy
import sys
import threading
import warnings

import numpy as np

from .. import draws, recording
from ..backend import is_array, is_cupy, namespace_of
from ..cuda.dispatch import on_host_now
from ..pytree import tree_leaves, tree_map
from ..tape import replay
from ..tracked import TrackedArray
from . import backward, fusion, graphs, loops
from .codegen import _calls, _order, generate
from .recorder import Call, Draw, Walk

__all__ = ["Program"]


class _Slot:
    """Where a value of the result lives."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


class Program:
    """The steps of a recording and the shape of its result (`result`: the values as recorded,
    tracked ones standing for their slots). `arrays` are the recording's arguments; with
    `fuse` (True, or "exact": correctly rounded operations only), the elementwise regions of a
    host program become generated kernels (`fusion.py`): `fused` counts them."""

    def __init__(self, recorder, result, arrays, use_graphs=True, fuse=False):
        self.inputs = len(arrays)
        self.steps = recorder.steps
        self.slots = dict(recorder.slots)  # id(node) -> slot
        self.made = {s.out for s in self.steps if not isinstance(s, Walk)}
        self.made |= {slot for s in self.steps if isinstance(s, Walk) for _, slot in s.outputs}
        values = enumerate(recorder.values)
        self.start = [None if i < self.inputs or i in self.made else v for i, v in values]
        self.result = tree_map(lambda v: _slot(recorder, v), result)
        # the layers' buffers written by the run: (buffer's slot, its last value's slot)
        self.writes = [(target, value) for target, value, _ in recorder.writes.values()]
        returned = {v.index for v in tree_leaves(self.result) if isinstance(v, _Slot)}
        self.outputs = sorted(returned | {value for _, value in self.writes})
        self._rebuild = _builder(self.result)
        self._kept = {id(v) for v in self.start if v is not None}  # the program's own arrays
        for node in recorder.nodes:  # the recording's values are not the program's
            node.saved = None
        self.interpreted = on_host_now() or any(is_cupy(a) for a in arrays)
        self.graphs = use_graphs and any(is_cupy(a) for a in arrays)
        self.graph = None
        self._lock = threading.Lock()
        self._releases = None  # for `interpret`, made by its first run
        self.source = None
        self.fused = 0
        self.chains = {}  # (id(walk), position) -> a fused chain of its pullbacks
        if not self.interpreted:
            if fuse:
                self._fuse(arrays, fuse)
            self._run, self.source = generate(self)
            self.slots = None

    def _fuse(self, arrays, fuse):
        """Each elementwise region of the steps made one kernel (`fusion.py`), and each chain of
        elementwise pullbacks of the backward passes (`backward.py`), for NumPy arrays on the
        host (`loops.py`, one library for both); other libraries' programs stay as they are."""
        if not all(type(a) is np.ndarray for a in arrays):
            return
        orders = {i: _order(s, self.slots) for i, s in enumerate(self.steps)
                  if isinstance(s, Walk)}  # fmt: skip
        exact = fuse == "exact"
        chains = backward.plan(self, fusion._types(self, arrays), orders, _calls(self.steps), exact)
        built = {}

        def build(regions):  # the forward regions and the chains, one library
            built["kernels"] = loops.build(regions + [c.region for c in chains])
            return None if built["kernels"] is None else built["kernels"][: len(regions)]

        self.steps, self.fused = fusion.fuse(self, arrays, orders, build, exact)
        if chains and "kernels" not in built:  # no forward region: the chains alone
            built["kernels"] = loops.build([c.region for c in chains])
        if chains and built["kernels"] is not None:
            for chain, kernel in zip(chains, built["kernels"][-len(chains) :]):
                chain.run = backward.guarded(kernel, chain.region)
                self.chains[id(chain.walk), chain.start] = chain

    def run(self, arrays):
        """The result for new arguments (their arrays, in the recording's order)."""
        if not self.interpreted:
            env = dict(zip(self.outputs, self._run(*arrays)))
        else:
            with self._lock:  # the recorded nodes hold this run's pending gradients
                graph = self._captured(arrays)
                env = graph.run(arrays) if graph is not None else self.interpret(arrays)
        for target, value in self.writes:  # in place, as the eager run writes them
            buffer = arrays[target] if target < self.inputs else self.start[target]
            buffer[...] = env[value]
        self._hand_out(env, arrays)
        return self._rebuild(env)

    def _hand_out(self, env, arrays):
        """Make every array of the result one that no later replay writes or returns and that
        neither the caller nor another output holds: a program's constant (the seed handed
        straight to a 0-d parameter), an argument or an output given twice is copied."""
        fresh = self._freshener(arrays)
        for i in self.outputs:
            env[i] = fresh(env[i])

    def handed_out(self, result, arrays):
        """The recording run's own result, made fresh as a replay's is (`_hand_out`)."""
        return tree_map(self._freshener(arrays), result)

    def _freshener(self, arrays):
        taken = set(self._kept) | {id(a) for a in arrays}

        def fresh(value):
            if id(value) in taken and is_array(value):
                return namespace_of(value).asarray(value, copy=True)
            taken.add(id(value))
            return value

        return fresh

    def interpret(self, arrays):
        """The environment after running the steps one by one on `arrays`."""
        env = list(self.start)
        env[: self.inputs] = arrays
        if self._releases is None:
            self._releases = _last_uses(self.steps, self.outputs)
        for step, released in zip(self.steps, self._releases):
            _RUN[type(step)](step, env)
            for slot in released:
                env[slot] = None
        return env

    def _captured(self, arrays):
        """The CUDA graph of this program (captured at its first replay), or None where it
        cannot be captured: a host program, or one `graphs.plan` refuses, or a failed capture
        (then a warning says why, and the program is replayed step by step)."""
        if self.graph is not None or not self.graphs:
            return self.graph or None
        self.graphs = False  # one attempt
        if not graphs.plan(self, arrays).capturable:
            return None
        try:
            self.graph = graphs.Captured(self, arrays, sys.modules["cupy"])
        except Exception as error:
            warnings.warn(
                f"tg.compile: no CUDA graph ({error}); replaying step by step", stacklevel=4
            )
            return None
        return self.graph


def _builder(template):
    """A function of the environment that builds `template` with each slot's value in its
    place, made once: cheaper on every replay than mapping over the structure."""
    if isinstance(template, _Slot):
        index = template.index
        return lambda env: env[index]
    if isinstance(template, dict):
        keys, parts = list(template), [_builder(v) for v in template.values()]
        kind = type(template)
        return lambda env: kind(zip(keys, [part(env) for part in parts]))
    if isinstance(template, (tuple, list)):
        parts, kind = [_builder(v) for v in template], type(template)
        if hasattr(template, "_fields"):  # a named tuple
            return lambda env: kind(*[part(env) for part in parts])
        return lambda env: kind([part(env) for part in parts])
    fields = getattr(type(template), "__dataclass_fields__", None)
    if fields is None or isinstance(template, type):
        return lambda env: template
    parts = [(name, _builder(getattr(template, name))) for name in fields]

    def dataclass_instance(env):
        out = shallow_copy(template)
        for name, part in parts:
            object.__setattr__(out, name, part(env))
        return out

    return dataclass_instance


def shallow_copy(x):
    """`copy.copy(x)`, quicker for the plain objects (dataclasses) a replay rebuilds."""
    kind = type(x)
    plain = _PLAIN.get(kind)
    if plain is None:
        plain = _PLAIN[kind] = not (
            hasattr(kind, "__copy__") or hasattr(kind, "__slots__") or not hasattr(x, "__dict__")
        )
    if not plain:
        return copy.copy(x)
    out = _new(kind)
    out.__dict__.update(x.__dict__)
    return out


_PLAIN = {}  # type -> whether a copy of its instances is a new object with the same __dict__
_new = object.__new__


def _slot(recorder, value):
    """A value of the result as the program gives it: a slot for a tracked one."""
    if not isinstance(value, TrackedArray):
        return value
    if value._node is None:  # a constant: the same value at every replay
        return value.data
    slot = recorder.slots.get(id(value._node))
    if slot is None:
        raise recording.RecordingError(
            "tg.compile: f returns a tracked array it did not compute from its arguments (made "
            "outside f); return values computed inside f, or pass the array as an argument"
        )
    return _Slot(slot)


# --- the interpreter
def _run_call(step, env):
    value = step.function(step.xp, *[env[i] for i in step.inputs], **step.kw)
    node = step.node
    if step.makes_ctx:
        value, node.ctx = value
    env[step.out] = value
    if step.saves:
        saved = [None, *node.args]
        for position, slot in step.saves:
            saved[position] = value if position == 0 else env[slot]
        node.saved = saved


def _run_draw(step, env):
    env[step.out] = draws.draw(step.rng, step.shape, step.like)


def _run_walk(step, env):
    seed = env[step.seed]
    if step.counted:
        reached = replay(step.root, seed, step.stop, step.counted)
    else:  # the root is itself a leaf or a stop
        reached = [(step.root, seed)]
    found = {id(node): g for node, g in reached}
    for node, slot in step.outputs:
        env[slot] = found.get(id(node))


def _run_fused(step, env):
    """A fused region (host programs only; interpreted by tests): its value, and what its
    steps' nodes save from outside the region."""
    value = env[step.out] = step.run(*[env[i] for i in step.inputs])
    for call in step.calls:
        if call.saves:
            saved = [None, *call.node.args]
            for position, slot in call.saves:
                if position:
                    saved[position] = env[slot]
                elif call.out == step.out:  # an inner value is never saved (`fusion.regions`)
                    saved[0] = value
            call.node.saved = saved


_RUN = {Call: _run_call, Draw: _run_draw, Walk: _run_walk, fusion.Fused: _run_fused}


def _last_uses(steps, outputs):
    """For each step, the slots no later step and no output reads: dropped after it."""
    last = {}
    for i, step in enumerate(steps):
        if isinstance(step, Call):  # its inputs, and the arguments its node saves
            reads = [*step.inputs, *(slot for position, slot in step.saves if position)]
        elif isinstance(step, fusion.Fused):  # and those its steps' nodes save
            saved = (slot for c in step.calls for position, slot in c.saves if position)
            reads = [*step.inputs, *saved]
        else:
            reads = [getattr(step, "seed", None)]
        for slot in reads:
            last[slot] = i
    last.pop(None, None)
    releases = [[] for _ in steps]
    for slot, i in last.items():
        if slot not in outputs:
            releases[i].append(slot)
    return releases
