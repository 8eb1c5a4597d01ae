"""A recorded program on a GPU: captured once as a CUDA graph, then launched as one per call.

`plan` decides what a capture needs, and whether it can be made: a static buffer per argument
array (each call copies its arguments into them), the result's slots (their buffers are the
capture's own; each call copies them out, so a result is never overwritten by the next call),
and the reasons a program cannot be captured (random numbers drawn on the host, arrays outside
the GPU or on several devices): such a program is replayed step by step instead.

`Captured` makes the graph with CuPy's stream capture: the program runs once on the static
inputs with a memory pool of its own (so that it allocates the buffers the capture will use,
and compiles every kernel), then again under capture, drawing the same buffers from that pool
without allocating; the pool stays with the graph, whose buffers no one else may use.
"""

from dataclasses import dataclass

from ..backend import device_of, is_cupy
from .recorder import Draw

__all__ = ["Plan", "plan", "Captured"]


@dataclass
class Plan:
    inputs: list  # [(shape, dtype)]: the static input buffers, one per argument array
    outputs: list  # the result's slots, copied out after each launch
    reasons: list  # why the program cannot be captured; empty when it can

    @property
    def capturable(self):
        return not self.reasons


def plan(program, arrays):
    """The capture of `program` for arguments like `arrays` (see the module's docstring)."""
    reasons = []
    if any(isinstance(step, Draw) for step in program.steps):
        reasons.append("it draws random numbers on the host (each draw would be replayed)")
    if not all(is_cupy(a) for a in arrays):
        reasons.append("an argument is not a CuPy array (a host copy cannot be captured)")
    elif len({str(device_of(a)) for a in arrays}) > 1:
        reasons.append("its arguments lie on several GPUs")
    inputs = [(tuple(a.shape), a.dtype) for a in arrays]
    return Plan(inputs, list(program.outputs), reasons)


def copy_into(buffers, arrays, xp):
    """Each array into its static buffer (a device copy; no allocation)."""
    for buffer, array in zip(buffers, arrays):
        xp.copyto(buffer, array)


def copy_out(env, slots, xp):
    """The result's values, copied out of the capture's buffers (None stays None)."""
    return {slot: None if env[slot] is None else xp.copy(env[slot]) for slot in slots}


class Captured:
    """`program` as a CUDA graph for arguments like `arrays` (CuPy arrays on one device)."""

    def __init__(self, program, arrays, cp):
        self.program, self.cp = program, cp
        self.plan = plan(program, arrays)
        with cp.cuda.Device(arrays[0].device.id):
            self.pool = cp.cuda.MemoryPool()
            self.stream = cp.cuda.Stream(non_blocking=True)
            with cp.cuda.using_allocator(self.pool.malloc), self.stream:
                self.inputs = [cp.empty(shape, dtype=dtype) for shape, dtype in self.plan.inputs]
                copy_into(self.inputs, arrays, cp)
                program.interpret(self.inputs)  # allocates, compiles and loads every kernel
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    self.env = program.interpret(self.inputs)
                finally:
                    self.graph = self.stream.end_capture()
            self.device = arrays[0].device.id

    def run(self, arrays):
        """The result's values for new arguments: copy in, one launch, copy out. Nothing is
        allocated from the graph's pool: its free blocks are the graph's intermediates."""
        cp = self.cp
        with cp.cuda.Device(self.device):
            copy_into(self.inputs, arrays, cp)
            self.graph.launch(stream=cp.cuda.get_current_stream())
            return copy_out(self.env, self.plan.outputs, cp)
