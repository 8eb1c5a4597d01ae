"""A recorded program on a GPU: captured once as CUDA graphs, then launched as them per call.

`plan` decides what a capture needs, and whether it can be made: a static buffer per argument
array (each call copies its arguments into them), the result's slots (their buffers are the
capture's own; each call copies them out, so a result is never overwritten by the next call),
and the reasons a program cannot be captured (random numbers drawn on the host, arrays outside
the GPU or on several devices): such a program is replayed step by step instead.

`Captured` makes the graphs with CuPy's stream capture: the program runs once on the static
inputs with a memory pool of its own (so that it allocates the buffers the capture will use,
and compiles every kernel), then again under capture, drawing the same buffers from that pool
without allocating; the pool stays with the graphs, whose buffers no one else may use.

CuPy refuses to capture a call of cuBLAS or cuSOLVER (a matrix product, a factorisation), and
a join of several arrays (`stack`, `concat`), whose single kernel reads a table of the arrays'
addresses copied from the host (found on an H200, in the text model's step). The capture is
cut at each such library call (`LIBRARY_CALLS`): the graph so far is closed and launched, the
call runs live, and a new graph opens. A call replays the parts in order: graph,
library call (its value copied into the buffer the capture's later graphs read), graph. The
capturing run is a real run, and its result must equal the first run's value for value (nan
where nan: `_equal`), or the program is replayed step by step (with a warning): a graph never
answers differently.
"""

import functools
import threading
from dataclasses import dataclass

from ..backend import device_of, is_array, is_cupy, namespace_of
from .recorder import Draw

__all__ = ["Plan", "plan", "Captured", "LIBRARY_CALLS"]

# The namespace's functions (by submodule) that may call cuBLAS or cuSOLVER on CuPy arrays, or
# copy from the host (the joins).
LIBRARY_CALLS = {
    "": ("matmul", "tensordot", "vecdot", "einsum", "dot", "inner", "vdot", "kron", "stack",
         "concat", "concatenate"),
    "linalg": ("matmul", "tensordot", "vecdot", "cholesky", "det", "eig", "eigh", "eigvals",
               "eigvalsh", "inv", "lstsq", "matrix_norm", "matrix_power", "matrix_rank", "norm",
               "pinv", "qr", "slogdet", "solve", "svd", "svdvals", "tensorinv", "tensorsolve",
               "vector_norm"),
}  # fmt: skip


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
    """`program` as CUDA graphs for arguments like `arrays` (CuPy arrays on one device)."""

    def __init__(self, program, arrays, cp):
        self.cp = cp
        self.plan = plan(program, arrays)
        self.device = arrays[0].device.id
        with cp.cuda.Device(self.device):
            self.pool = cp.cuda.MemoryPool()
            self.stream = cp.cuda.Stream(non_blocking=True)
            with cp.cuda.using_allocator(self.pool.malloc), self.stream:
                self.inputs = [cp.empty(shape, dtype=dtype) for shape, dtype in self.plan.inputs]
                copy_into(self.inputs, arrays, cp)
                first = program.interpret(self.inputs)  # allocates, compiles, loads every kernel
                expected = [first[slot] for slot in self.plan.outputs]
                del first
                self.stream.synchronize()
                parts = Parts(self.stream)
                with cut_at_library_calls(namespace_of(arrays[0]), parts):
                    self.env = program.interpret(self.inputs)
                    self.parts = parts.done()
                found = [self.env[slot] for slot in self.plan.outputs]
                if not all(map(functools.partial(_equal, cp), found, expected)):
                    raise RuntimeError("the captured run's result differs from the first run's")

    def describe(self):
        """`{"graphs": n, "library_calls": m}`: the parts a call launches or runs."""
        calls = sum(isinstance(part, _LiveCall) for part in self.parts)
        return {"graphs": len(self.parts) - calls, "library_calls": calls}

    def run(self, arrays):
        """The result's values for new arguments: copy in, launch the parts, copy out. Nothing
        is allocated from the graphs' pool: its free blocks are the graphs' intermediates."""
        cp = self.cp
        with cp.cuda.Device(self.device):
            copy_into(self.inputs, arrays, cp)
            stream = cp.cuda.get_current_stream()
            for part in self.parts:
                part(stream)
            return copy_out(self.env, self.plan.outputs, cp)


class Parts:
    """A capture on `stream` cut at library calls: the graphs and the live calls, in order."""

    def __init__(self, stream):
        self.stream, self.parts, self.live = stream, [], False

    def _close(self):
        graph = self.stream.end_capture()
        graph.launch(stream=self.stream)  # the capturing run is a real run
        self.parts.append(graph.launch)

    def call(self, function, args, kwargs):
        """`function(*args, **kwargs)`, run live between two graphs, and replayed there."""
        self._close()
        self.live = True
        try:
            value = function(*args, **kwargs)
        finally:
            self.live = False
            self.stream.begin_capture()
        if not all(map(is_array, value if isinstance(value, tuple) else (value,))):
            raise TypeError(f"{function.__name__} gave {type(value).__name__}, not arrays")
        self.parts.append(_LiveCall(function, args, kwargs, value))
        return value

    def done(self):
        self._close()
        return self.parts

    def abandon(self):
        """End the capture a failure left open, if any (the failure itself is what counts)."""
        try:
            self.stream.end_capture()
        except Exception:  # none was open, or the failure invalidated it
            pass


class _LiveCall:
    """A library call of a replay: its value made again and copied into the capture's
    buffer, which the later graphs read (from the caller's memory pool, not the graphs')."""

    def __init__(self, function, args, kwargs, value):
        self.function, self.args, self.kwargs, self.value = function, args, kwargs, value

    def __call__(self, stream):
        fresh = self.function(*self.args, **self.kwargs)
        if isinstance(self.value, tuple):
            for buffer, part in zip(self.value, fresh):
                buffer[...] = part
        else:
            self.value[...] = fresh


_PARTS = {}  # thread id -> the Parts that this thread's library calls cut
_PATCH = threading.Lock()
_patched = {}  # (id(module), name) -> [original function, users]


@functools.cache
def _cutting(function):
    @functools.wraps(function)
    def cut(*args, **kwargs):
        parts = _PARTS.get(threading.get_ident())
        if parts is None or parts.live:  # another thread, or a call inside a live one
            return function(*args, **kwargs)
        return parts.call(function, args, kwargs)

    return cut


class cut_at_library_calls:
    """While it is entered, this thread's calls of `xp`'s `LIBRARY_CALLS` cut `parts`."""

    def __init__(self, xp, parts):
        modules = {"": xp, **{name: getattr(xp, name, None) for name in LIBRARY_CALLS if name}}
        self.names = [(modules[m], name) for m, names in LIBRARY_CALLS.items() if modules[m]
                      for name in names if hasattr(modules[m], name)]  # fmt: skip
        self.parts = parts

    def __enter__(self):
        with _PATCH:
            for module, name in self.names:
                entry = _patched.setdefault((id(module), name), [getattr(module, name), 0])
                entry[1] += 1
                setattr(module, name, _cutting(entry[0]))
        _PARTS[threading.get_ident()] = self.parts
        try:
            self.parts.stream.begin_capture()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *failure):
        del _PARTS[threading.get_ident()]
        if failure[0] is not None:
            self.parts.abandon()
        with _PATCH:
            for module, name in self.names:
                entry = _patched[id(module), name]
                entry[1] -= 1
                if entry[1] == 0:
                    setattr(module, name, entry[0])
                    del _patched[id(module), name]


def _equal(cp, a, b):
    """Bit for bit where it matters: the same values, nan where nan."""
    if not (is_array(a) and is_array(b)):  # None, or a value that is no array
        return a is b or type(a) is type(b) and a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(cp.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
