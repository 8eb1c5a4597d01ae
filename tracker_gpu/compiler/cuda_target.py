"""The CUDA target of fusion: the elementwise regions of a recorded CuPy program as kernels
compiled by NVRTC, several regions to a launch, captured in the step's CUDA graph.

The regions are the host loops' (`fusion.regions`: the same operations, the same dtypes, the
same order), and each operation is written by the same expression code (`loops._body`, over the
`C` table of `cuda/codegen.py`); only the loop around it differs: one thread per element of a
grid-stride loop, each input read through the strides of its broadcast. A region on the GPU pays
from one operation (a launch either way), and regions go to one launch where the program allows
it (`_Launch`): a region whose inputs nothing of the open launch makes is a segment of its own
(the threads' indices run over the segments one after the other: Adam's update of every
parameter, and its step counts, is one launch, a multi-tensor update), and a region reading, at
its own element, a value that a segment of its shape makes joins that segment (the moments and
the parameter of one update). A launch is placed where its last region was, and moved later
past steps that read nothing it makes; a backward pass ends it (its pullbacks read what the
regions' nodes saved). A launch is one `Fused` step of several outputs: every region's
values are written (its last value, and those read outside it: `fusion.regions`).

The program's kernels are one source (`Family`, compiled with `--fmad=false`: no contraction of
`a * b + c`, so that the arithmetic is the eager replay's bit for bit), launched through
`cuda/launch.py`: on CuPy arrays by NVRTC, through CuPy, on the arrays' device; on NumPy arrays,
inside `cuda.on_host()` and `numpy_too()`, through the host build of the same text (`cuda/host.py`),
which is how this target is tested without a GPU.

>>> import numpy as np, tracker_gpu as tg
>>> from tracker_gpu.compiler import cuda_target
>>> with tg.cuda.on_host(), cuda_target.numpy_too():
...     step = tg.compile(lambda x: tg.sum(tg.abs(x * 2.0 + 1.0)), fuse="exact")
...     val, (g,) = step(np.array([-1.0, 0.0, 3.0]))
>>> step.programs()[0].launches, float(val), g.tolist()
(1, 9.0, [-2.0, 2.0, 2.0])
"""

import contextlib
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..backend import is_cupy, is_numpy_namespace
from ..cuda.dispatch import on_host_now
from ..cuda.host import HostLibrary
from ..cuda.launch import _function, empty, grid_for, launch, on_device
from ..cuda.sources import EXACT_OPTIONS, Family, header
from . import fusion, loops
from .codegen import _order
from .recorder import Call, Walk

__all__ = ["applies", "fuse", "numpy_too", "source", "MAX_SEGMENTS", "MAX_POINTERS"]

# A launch's bounds: segments (branches of its kernel), and arrays passed (a kernel's parameters
# are at most 4 KiB on CUDA: 8 bytes each)
MAX_SEGMENTS, MAX_POINTERS = 64, 256
_state = {"numpy": False}


@contextlib.contextmanager
def numpy_too(enabled=True):
    """Inside `cuda.on_host()`: compiled NumPy programs take this target too (their kernels
    run through the host build), so that tests check it without a GPU."""
    previous, _state["numpy"] = _state["numpy"], enabled
    try:
        yield
    finally:
        _state["numpy"] = previous


def applies(arrays):
    """Whether a program of these arguments takes this target: CuPy arrays, or NumPy arrays
    inside `cuda.on_host()` and `numpy_too()`."""
    if arrays and all(is_cupy(a) for a in arrays):
        return True
    numpy = _state["numpy"] and on_host_now()
    return numpy and bool(arrays) and all(type(a) is np.ndarray for a in arrays)


def fuse(program, arrays, exact):
    """Replace the regions of an interpreted `program` (its steps) by launches of generated
    kernels; sets `program.fused` (regions) and `program.launches` (their launches)."""
    array = type(arrays[0])
    library = is_numpy_namespace if array is np.ndarray else _is_cupy_namespace
    target = fusion.Target(array, library, _pays, _pending)
    slots = program.slots
    orders = {i: _order(s, slots) for i, s in enumerate(program.steps) if isinstance(s, Walk)}
    steps, count = fusion.fuse(program, arrays, orders, lambda regions: regions, exact, target)
    if not count:
        program.launches = 0
        return
    launches, steps = _grouped(steps)
    family = Family.from_text("fused", source(launches), EXACT_OPTIONS)
    try:
        _built(family, arrays[0])
    except Exception as error:  # NVRTC's or the host compiler's message, then unfused
        warnings.warn(
            f"tg.compile: the fused CUDA kernels could not be built ({error}); the "
            "elementwise regions are replayed unfused",
            RuntimeWarning,
            stacklevel=4,
        )
        program.launches = 0
        return
    program.steps = _placed(steps, launches, family, array)
    program.fused, program.launches, program.family = count, len(launches), family


def _built(family, like):
    """Compile the kernels now (NVRTC through CuPy on the arrays' device, or the host build),
    so that a failure leaves the program unfused rather than failing its replays."""
    if type(like) is np.ndarray:
        HostLibrary.get(family)
        return
    with on_device(like):
        for name in family.kernels:
            _function(family, name, "float64", like.device.id)


def _pays(program, members):
    """A region pays from one operation (a launch either way), unless it only passes its input
    on (`identity` makes no copy: a launch would)."""
    return any(fusion.OPS.get(program.steps[i].function) != _IDENTITY for i in members)


_IDENTITY = ("unary", "identity")


def _is_cupy_namespace(xp):
    return getattr(xp, "__name__", "").split(".")[-1] == "cupy"


# --- regions and launches
def _pending(kernel, region, calls, inputs, start, outs):
    """The stand-in of a region until it is given a launch (`fusion.Target.guard`)."""
    return _Member(region, calls, inputs, start, outs)


@dataclass
class _Member:
    """A region standing where `fusion.fuse` put it, until it is given a launch."""

    region: fusion.Region
    calls: list
    inputs: list  # slots
    start: list
    outs: list  # the slots of the values written (`Region.written`), the last op's last


@dataclass
class _Segment:
    """Regions over one index space: `ops` (a `Region`'s, renumbered), `inputs` slots and
    `specs` their (dtype, shape), `outputs` (op index, slot) written."""

    shape: tuple
    ops: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    specs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)

    def add(self, member, made):
        """The member's operations after the segment's own, its values written; `made` {slot:
        op index} of values it reads from this segment. Returns `{slot: op index}` of its."""
        offset, remap = len(self.ops), []
        for k, slot in enumerate(member.inputs):
            if slot in made:
                remap.append(("op", made[slot]))
                continue
            if slot not in self.inputs:
                self.inputs.append(slot)
                self.specs.append(member.region.inputs[k])
            remap.append(("in", self.inputs.index(slot)))
        for op, dtype, operands in member.region.ops:
            moved = [remap[w] if kind == "in" else (kind, w + offset) if kind == "op" else (kind, w)
                     for kind, w in operands]  # fmt: skip
            self.ops.append((op, dtype, moved))
        written = [(offset + j, slot) for j, slot in zip(member.region.written(), member.outs)]
        self.outputs += written
        return {slot: j for j, slot in written}

    def region(self):
        return fusion.Region(self.ops, self.specs, self.shape)


@dataclass
class _Launch:
    """The segments of one kernel launch, and its members (regions) in order."""

    segments: list = field(default_factory=list)
    members: list = field(default_factory=list)
    made: dict = field(default_factory=dict)  # slot -> (segment index, op index)

    def take(self, member):
        """Add `member` (see the module's docstring); False where it cannot join."""
        reads = [k for k, slot in enumerate(member.inputs) if slot in self.made]
        shape = tuple(member.region.shape)
        if self.segments and self._pointers() + _arrays(member) > MAX_POINTERS:
            return False
        if not reads:  # a segment of its shape, or a new one
            same = [s for s in self.segments if s.shape == shape]
            if not same and len(self.segments) >= MAX_SEGMENTS:
                return False
            segment = same[0] if same else _Segment(shape)
            if not same:
                self.segments.append(segment)
        else:
            places = {self.made[member.inputs[k]][0] for k in reads}
            if len(places) != 1:
                return False
            segment = self.segments[places.pop()]
            if segment.shape != shape or any(member.region.inputs[k][1] != shape for k in reads):
                return False  # read at another element than its own: a launch of its own
        index = self.segments.index(segment)
        made = {member.inputs[k]: self.made[member.inputs[k]][1] for k in reads}
        for slot, j in segment.add(member, made).items():
            self.made[slot] = (index, j)
        self.members.append(member)
        return True

    def _pointers(self):
        return sum(len(s.inputs) + len(s.outputs) for s in self.segments)

    def reads(self):
        return [slot for s in self.segments for slot in s.inputs]


def _arrays(member):
    return len(member.inputs) + len(member.outs)


def _grouped(steps):
    """`(launches, steps)`: the members gathered into launches, each standing in `steps` as the
    `_Launch` itself, where it is placed."""
    launches, placed, current = [], [], None

    def close():
        nonlocal current
        if current is not None:
            launches.append(current)
            placed.append(current)
            current = None

    for step in steps:
        member = step.run if type(step) is fusion.Fused else None
        if isinstance(member, _Member):
            if current is not None and current.take(member):
                continue
            close()
            current = _Launch()
            current.take(member)
            continue
        if current is not None and (type(step) is Walk or _reads_from(step, current)):
            close()
        placed.append(step)
    close()
    return launches, placed


def _reads_from(step, launch):
    return type(step) is Call and any(slot in launch.made for slot in step.inputs)


# --- the step a launch stands as
def _placed(steps, launches, family, array):
    """The steps, each launch as one `Fused` step: one kernel, the values of all its members
    written (its outputs), the steps of all its members pulled back as before."""
    out = []
    for step in steps:
        if not isinstance(step, _Launch):
            out.append(step)
            continue
        index = launches.index(step)
        run = _guarded(step, _kernel(family, f"tg_fused_{index}", step), array)
        outs = [slot for member in step.members for slot in member.outs]
        if len(outs) == 1:
            run = lambda *values, run=run: run(*values)[0]  # noqa: E731
        calls = [call for member in step.members for call in member.calls]
        out.append(fusion.Fused(outs, step.reads(), calls, run))
    return out


def _kernel(family, name, group):
    """`kernel(*inputs) -> [each member's value]`: new arrays, written by one launch (a 0-d
    NumPy one as the scalar NumPy's own operations give)."""
    outputs = {}  # slot -> (shape, dtype)
    for segment in group.segments:
        dtypes = loops._dtypes(segment.region())
        for j, slot in segment.outputs:
            outputs[slot] = (segment.shape, np.dtype(dtypes[j]))
    total = sum(int(np.prod(s.shape)) for s in group.segments)
    order = [slot for m in group.members for slot in m.outs]

    def kernel(*values):
        like, made, args, position = values[0], {}, [], 0
        for segment in group.segments:
            args += values[position : position + len(segment.inputs)]
            position += len(segment.inputs)
            for _, slot in segment.outputs:
                made[slot] = empty(outputs[slot][0], like, outputs[slot][1])
                args.append(made[slot])
        launch(name, "float64", grid_for(total), *args, source=family)
        if type(like) is not np.ndarray:
            return [made[slot] for slot in order]
        return [made[slot][()] if not made[slot].ndim else made[slot] for slot in order]

    return kernel


def _guarded(group, kernel, array):
    """The kernel, on C-contiguous arrays of the recorded dtypes and shapes (a NumPy scalar
    made a 0-d array); anything else takes the regions' steps one by one."""
    expected = [spec for s in group.segments for spec in s.specs]

    def run(*values):
        ready = []
        for value, (dtype, shape) in zip(values, expected):
            if type(value) is not array and isinstance(value, np.generic):
                value = np.asarray(value)
            if (type(value) is not array or value.dtype != dtype or value.shape != shape
                    or not value.flags.c_contiguous):  # fmt: skip
                return _stepwise(group, values)
            ready.append(value)
        return kernel(*ready)

    return run


def _stepwise(group, values):
    """The members' steps one by one, as an unfused replay runs them."""
    env = dict(zip(group.reads(), values))
    found = []
    for member in group.members:
        made = fusion._stepwise(member.calls, member.inputs, [env[s] for s in member.inputs],
                                member.start, member.outs)  # fmt: skip
        made = made if len(member.outs) > 1 else (made,)
        env.update(zip(member.outs, made))
        found += made
    return found


# --- the source
_LOOP = (
    "for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < {n}; "
    "i += (long long)blockDim.x * gridDim.x)"
)


def source(launches):
    """The CUDA source of the launches' kernels, `tg_fused_<k>`: a template over T (unused: the
    types are the regions' own) calling one device function per segment; `half.cuh` first
    where a value is of a half type, then `compare.cuh`."""
    regions = [segment.region() for group in launches for segment in group.segments]
    prelude = (header("half") if loops.uses_halves(regions) else "") + header("compare")
    return prelude + "".join(_launch_source(f"tg_fused_{k}", g) for k, g in enumerate(launches))


def _launch_source(name, group):
    functions, params, branches, start = [], [], [], 0
    for s, segment in enumerate(group.segments):
        region = segment.region()
        functions.append(_segment_function(f"{name}_{s}", region, segment.outputs))
        names = _segment_params(region, segment.outputs, f"s{s}_")
        params += names
        size = int(np.prod(segment.shape))
        call = f"{name}_{s}(i - {start}LL, {', '.join(n.split()[-1] for n in names)});"
        start += size
        branches.append(f"if (i < {start}LL) {call}")
    body = "\n        else ".join(branches)
    kernel = f"""template <typename T>
__global__ void {name}({", ".join(params)}) {{
    {_LOOP.format(n=f"{start}LL")} {{
        {body}
    }}
}}
"""
    return "".join(functions) + kernel


def _segment_params(region, outputs, prefix=""):
    dtypes = loops._dtypes(region)
    inputs = [f"const {loops._ctype(dtype)}* {prefix}x{k}" for k, (dtype, _) in
              enumerate(region.inputs)]  # fmt: skip
    stored = [loops._ctype(dtypes[j]) for j, _ in outputs]
    return inputs + [f"{ctype}* {prefix}y{m}" for m, ctype in enumerate(stored)]


def _segment_function(name, region, outputs):
    """`<name>(i, x..., y...)`: element `i` of the segment, each input read at its broadcast
    offset, each output written at `i`."""
    lengths, masks = loops._merged(region)
    d = len(lengths)
    params = ", ".join(p.replace("* ", "* __restrict__ ") for p in _segment_params(region, outputs))
    lines = [f"static __device__ __forceinline__ void {name}(long long i, {params}) {{"]
    if d > 1:
        lines.append("    long long rest = i;")
        for a in range(d - 1, 0, -1):
            n = f"{lengths[a]}LL"
            lines.append(f"    const long long c{a} = rest % {n}; rest /= {n};")
        lines.append("    const long long c0 = rest;")
    else:
        lines.append("    const long long c0 = i;")
    for k, mask in enumerate(masks):
        terms = []
        for a in range(d):
            if mask[a]:
                later = [lengths[b] for b in range(a + 1, d) if mask[b]]
                terms.append(f"c{a} * {int(np.prod(later))}LL" if later else f"c{a}")
        dtype = region.inputs[k][0]
        value = loops.loaded(f"x{k}[{' + '.join(terms) or '0'}]", dtype)
        lines.append(f"    const {loops._compute(dtype)} a{k} = {value};")
    lines += [f"    {line}" for line in loops._body(region)]
    dtypes = loops._dtypes(region)
    lines += [f"    y{m}[i] = {loops.stored(f't{j}', dtypes[j])};"
              for m, (j, _) in enumerate(outputs)]  # fmt: skip
    lines.append("}")
    return "\n".join(lines) + "\n"
