"""The host target of fusion: each region a C++ loop, built by the system's compiler once.

A region (`fusion.Region`) becomes one function: nested loops over the output's axes (merged
where every input allows: a contiguous chain is one flat loop), each input read through the
strides of its broadcast, the region's operations written with the expression code of the
generated CUDA kernels (`cuda/codegen.py`: its `C` table and its constants), each operation in
the C type of the dtype NumPy computes it in; `exp`, `sin`, `tanh`... of float32 and float64
by NumPy's own inner loops, called on blocks of the innermost axis (`numpy_loops.py`). Only the
loop differs from a GPU kernel. What
depends on inputs broadcast along every axis only (Adam's bias corrections, from 0-d step
counts) is computed once, before the loops, as NumPy computes it once on 0-d arrays. float16
and bfloat16 are stored as the half types of `kernels/half.cuh` and each operation on them is
computed in float and rounded to the half type, as NumPy and ml_dtypes compute it (F16C's
conversions where the CPU has them).

The functions of one program are one source, built by the C++ compiler found on the PATH (`CXX`
names another; a name that finds nothing means no compiler) with IEEE semantics kept
(`-ffp-contract=off`: no fused multiply-add; no fast-math), at `-O3` for the machine's own
instruction set (`-march=native`, its expansion part of the key: AVX2 or AVX-512 where NumPy's
loops dispatch to them; a vector lane rounds each correctly rounded operation as scalar code
does), and cached on disk by the hash of the source, the compiler and its flags, in the user's
cache directory (`TRACKER_GPU_CACHE` names another): a second process loads the library without
building it. A cached file that does not load, or is not the library of its key, is built
anew. Without a compiler, or where a build fails, `build` returns None (one warning): the
program is replayed unfused.

A call hands the arrays over as NumPy's objects (the function reads their data pointer where
NumPy's C API does), about 1 us where their addresses through ctypes cost 1.3 us each; it
releases the GIL from `RELEASE_FROM` elements, and from `THREADS[0]` elements (`threads`) cuts
the output's outer axis between threads of a pool (an element's value does not depend on it).
"""

import concurrent.futures
import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np

from ..cuda import fp_status, host
from ..cuda.codegen import POW_OF_NUMBER, POWERS, C, constant
from ..cuda.sources import header
from . import numpy_loops

__all__ = [
    "any_lengths",
    "build",
    "cache_dir",
    "compiler",
    "default_fuse",
    "flags",
    "library_of",
    "object_macros",
    "threads",
    "FLAGS",
    "STATS",
    "source",
]

FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno"]
VECTORISE = True  # the machine's instruction set (-march=native); False: scalar loops
THREADS = [1 << 20, 0]  # from how many elements a region runs on threads, and on how many
RELEASE_FROM = 1 << 15  # from how many elements a call releases the GIL
_HALF = {"float16": "tg_half", "bfloat16": "tg_bfloat16"}  # stored so, computed in float
# stored so; a bool as a byte, read as `x != 0`: GCC 12 vectorises no loop that loads a `bool`
_CTYPE = {"float32": "float", "float64": "double", "bool": "unsigned char", **_HALF}
# the C library's functions without <cmath>, whose parsing took most of a region's build
_PRELUDE = host.math_prelude("")
HALF_PRELUDE = "#define __device__\n#define __forceinline__ inline\n"  # half.cuh on the host
COMPARISONS = frozenset({"gt", "ge", "lt", "le", "eq", "ne"})
# what `C` does not name, in the same notation: the rules' own forwards, operation for operation
_MORE = {
    "identity": "{0}",
    "astype": "{0}",  # the operand is cast to the result's type
    "relu": "(TG_DAZ({0}) < T(0) ? T(0) : {0})",
}
_PROBE = r"""extern "C" long long tg_data_of(void* t) { return (long long)TG_DATA(TG_ITEM(t, 0)); }
"""
_warned = set()
_lock = threading.Lock()
_loaded = {}  # key -> the loaded library (this process)
STATS = {"built": 0, "loaded": 0}  # libraries built, and loaded from the cache, by this process


def compiler():
    """The C++ compiler's path, or None: `CXX` if set (a name that finds nothing: None), else
    the first of c++, g++, clang++ on the PATH."""
    named = os.environ.get("CXX")
    if named is not None:
        return shutil.which(named)
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def cache_dir():
    """Where built libraries are kept: `TRACKER_GPU_CACHE`, else the platform's user cache
    directory (XDG_CACHE_HOME or ~/.cache; ~/Library/Caches; LOCALAPPDATA), in tracker_gpu/."""
    named = os.environ.get("TRACKER_GPU_CACHE")
    if named:
        return Path(named) / "fused"
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home()))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tracker_gpu" / "fused"


# The machines where `tg.compile` fuses by default (`fuse="exact"`): vector instructions that are
# IEEE arithmetic (no flush of subnormals to zero), so that a vectorised loop computes each
# correctly rounded operation as scalar code does, and on which the differential fuzzer has run.
# AArch64's are IEEE too, but untested: there fusion is asked for with `fuse="exact"`.
EXACT_MACHINES = frozenset({"x86_64", "amd64"})


def default_fuse():
    """What `tg.compile`'s `fuse=None` means on this machine: "exact" or False."""
    return "exact" if platform.machine().lower() in EXACT_MACHINES else False


# --- the source
def _ctype(dtype):
    """The C type an array of `dtype` is stored as."""
    return _CTYPE[str(dtype)]


def _compute(dtype):
    """The C type a value of `dtype` is computed in: float for the half types (`half.cuh`)."""
    name = str(dtype)
    return "float" if name in _HALF else "bool" if name == "bool" else _CTYPE[name]


def loaded(expression, dtype):
    """An element of an array of `dtype`, widened to its compute type (exact)."""
    name = str(dtype)
    if name in _HALF:
        return f"load({expression})"
    return f"({expression} != 0)" if name == "bool" else expression


def stored(expression, dtype):
    """A computed value as an element of an array of `dtype` (rounded once for a half type)."""
    return f"store<{_HALF[str(dtype)]}>({expression})" if str(dtype) in _HALF else expression


def uses_halves(regions):
    """Whether any value of `regions` is of a half type (their source needs `half.cuh`)."""
    dtypes = {str(d) for r in regions for d, _ in r.inputs} | {
        str(d) for r in regions for _, d, _ in r.ops}  # fmt: skip
    return bool(dtypes & set(_HALF))


def _merged(region):
    """`(lengths, masks)`: the output's axes of length > 1, neighbours merged where every input
    is broadcast along both or along neither; `masks[k][a]` whether input k runs along axis a
    (else it is broadcast: stride 0)."""
    shape = region.shape
    axes = []
    for a, n in enumerate(shape):
        if n == 1:
            continue
        mask = []
        for _, ishape in region.inputs:
            lead = len(shape) - len(ishape)
            mask.append(a >= lead and ishape[a - lead] == n)
        if axes and axes[-1][1] == mask:
            axes[-1][0] *= n
        else:
            axes.append([n, mask])
    if not axes:
        axes = [[1, [False] * len(region.inputs)]]
    return [n for n, _ in axes], [[axis[1][k] for axis in axes] for k in range(len(region.inputs))]


def _literal(value, dtype):
    """A weakly typed Python number as NumPy converts it to `dtype`, exactly, as a C value."""
    with np.errstate(all="ignore"):
        converted = float(np.asarray(value, dtype=dtype))
    if math.isnan(converted) or math.isinf(converted):
        return constant(converted)
    return f"T({converted.hex()})"


def _dtypes(region):
    """The dtype of each op's value (bool for a comparison)."""
    return [np.dtype(bool) if op in COMPARISONS else dtype for op, dtype, _ in region.ops]


def _types(region):
    """The C type of each op's value, as computed (float for a half type)."""
    return [_compute(dtype) for dtype in _dtypes(region)]


def _body(region, calls=()):
    """The statements computing each op's value `t<j>` from the inputs' values `a<k>` (each
    in its compute type). An op of a half type is computed in float and rounded to the half
    type, as NumPy (and ml_dtypes) compute each operation: the next one reads it rounded. An op
    of `calls` (NumPy's loop computes it: `numpy_loops`) gives `t<j>` its operand."""
    types, lines = _types(region), []
    for j, (op, dtype, operands) in enumerate(region.ops):
        compute = _compute(dtype)
        values = []
        for position, (kind, what) in enumerate(operands):
            if kind == "const":
                values.append(_literal(what, dtype))
                continue
            if kind == "none":
                values.append(None)
                continue
            name, ctype = (f"a{what}", _compute(region.inputs[what][0])) if kind == "in" else (
                f"t{what}", types[what])  # fmt: skip
            keep = op == "where" and position == 0  # the condition stays a bool
            values.append(name if keep or ctype == compute else f"static_cast<T>({name})")
        power = _power(region, operands) if op == "pow" else None
        statement = _expression(
            "identity" if j in calls else op, values, f"t{j}", str(dtype), power
        )
        if types[j] != "bool" and str(dtype) in _HALF:
            statement += f" t{j} = load({stored(f't{j}', dtype)});"
        lines.append(f"{types[j]} t{j}; {{ typedef {compute} T; {statement} }}")
    return lines


# NumPy's float16 maximum and minimum keep the first operand on a tie (+0 and -0), where its
# float32 and float64 loops (and ml_dtypes' bfloat16) keep the second; on the device (the CUDA
# target's kernels) every dtype takes CuPy's rule (kernels/compare.cuh)
_FLOAT16 = {"maximum": "TG_MAXIMUM_FIRST({0}, {1})", "minimum": "TG_MINIMUM_FIRST({0}, {1})"}


def _power(region, operands):
    """The template of a `pow` whose exponent is a number (`POWERS`: NumPy's functions for
    some, as for a weak constant or a 0-d input), else None."""
    if len(operands) != 2 or operands[0][0] == "const":  # `number ** array`: NumPy's pow
        return None
    kind, what = operands[1]
    if kind == "const":
        return POWERS.get(float(what))
    return POW_OF_NUMBER if kind == "in" and region.inputs[what][1] == () else None


def _expression(op, values, t, dtype=None, power=None):
    """The statement(s) giving the op's local `t` (of `dtype`) its value (`power`: the template
    of a `pow` of a number, `_power`)."""
    if op == "pow" and power is not None:
        return f"{t} = {power.format(*values)};"
    if op == "sigmoid":  # the rule's forward: exp(-|x|), then a selection of two quotients
        x = values[0]
        return (f"const T e = exp(-fabs({x})); {t} = (TG_DAZ({x}) >= T(0) ? T(1) / (T(1) + e) "
                f": e / (T(1) + e));")  # fmt: skip
    if op == "clip":
        return _clip(t, *values, first=dtype == "float16")
    template = (dtype == "float16" and _FLOAT16.get(op)) or _MORE.get(op) or C[op]
    return f"{t} = {template.format(*values)};"


def _clip(t, x, lo, hi, first):
    """clip(x, lo, hi), a bound None where not given: by both bounds x is kept on a tie (NumPy's
    clip and the Array API's); by one bound, NumPy's maximum (minimum) on the host, the Array
    API's clip on the device (kernels/compare.cuh)."""
    if lo is None or hi is None:
        macro = ("TG_CLIP_LO" if hi is None else "TG_CLIP_HI") + ("_FIRST" if first else "")
        return f"{t} = {macro}({x}, {lo if hi is None else hi});"
    return (f"T r = TG_DAZ({x}) < TG_DAZ({lo}) ? {lo} : {x}; "
            f"{t} = TG_DAZ(r) > TG_DAZ({hi}) ? {hi} : r;")  # fmt: skip


def _hoisted(region, invariant, calls=()):
    """The ops whose value is the same for every element (their array operands broadcast along
    every axis): computed once, before the loops, as NumPy computes them once on 0-d arrays
    (NumPy's loops, `calls`, in the loops)."""
    found = set()
    for j, (_, _, operands) in enumerate(region.ops):
        if j not in calls and all(kind in ("const", "none") or (kind == "in" and invariant[what])
               or (kind == "op" and what in found) for kind, what in operands):  # fmt: skip
            found.add(j)
    return found


def _function(name, region, table=None):
    """`<name>_loops(x..., y, n..., lo, hi)`: the region over the outer axis' range [lo, hi)
    (the elements' where the loop is flat), and `<name>(arrays..., y, n...)`: the same over the
    same, its arrays NumPy's objects (their data pointer read where `PyArray_DATA` reads it).
    `table`: `{(op, dtype): index}` of NumPy's loops the source calls (`numpy_loops`)."""
    lengths, masks = _merged(region)
    d = len(lengths)
    invariant = [not any(mask) for mask in masks]
    calls = numpy_loops.calls(region, table or {})
    hoisted = _hoisted(region, invariant, calls)
    written = region.written()
    out_dtypes = [_dtypes(region)[j] for j in written]
    out_types = [_ctype(dtype) for dtype in out_dtypes]
    inputs = [_ctype(dtype) for dtype, _ in region.inputs]
    params = [f"const {t}* __restrict x{k}" for k, t in enumerate(inputs)]
    params += [f"{t}* __restrict y{m}" for m, t in enumerate(out_types)]
    params += [f"long long n{a}" for a in range(d)] + ["long long lo", "long long hi"]
    lines = ["extern \"C\" __attribute__((noinline)) int "
             f"{name}_loops({', '.join(params)}) {{",
             "    feclearexcept(TG_FP_ALL);"]  # fmt: skip
    for k, mask in enumerate(masks):  # strides of the outer axes, in elements
        for a in range(d - 1):
            if mask[a]:
                later = [f"n{b}" for b in range(a + 1, d) if mask[b]] or ["1LL"]
                lines.append(f"    const long long s{k}_{a} = {' * '.join(later)};")
    body = _body(region, calls)
    for k, (dtype, _) in enumerate(region.inputs):
        if invariant[k]:
            lines.append(f"    const {_compute(dtype)} a{k} = {loaded(f'x{k}[0]', dtype)};")
    lines += [f"    {body[j]}" for j in sorted(hoisted)]
    loads = []
    for k, mask in enumerate(masks):
        index = f"o{k} + i" if mask[d - 1] else f"o{k}"
        dtype = region.inputs[k][0]
        read = f"const {_compute(dtype)} a{k} = {loaded(f'x{k}[{index}]', dtype)};"
        loads.append(None if invariant[k] else read)
    stores = {}
    for m, j in enumerate(written):
        stores.setdefault(j, []).append(f"y{m}[oy + i] = {stored(f't{j}', out_dtypes[m])};")
    span = ("lo", "hi") if d == 1 else ("0", f"n{d - 1}")
    if calls:
        declared, inner = numpy_loops.staged(region.ops, calls, hoisted, _types(region), body,
                                             loads, stores, span)  # fmt: skip
        lines += [f"    {line}" for line in declared]
    else:
        inner = [f"for (long long i = {span[0]}; i < {span[1]}; ++i) {{"]
        inner += [f"    {line}" for line in loads if line]
        inner += [f"    {line}" for j, line in enumerate(body) if j not in hoisted]
        inner += [f"    {line}" for j in written for line in stores.pop(j, ())]
        inner.append("}")
    for a in range(d - 1):
        first, last = ("lo", "hi") if a == 0 else ("0", f"n{a}")
        lines.append(f"    for (long long i{a} = {first}; i{a} < {last}; ++i{a}) {{")
    outer = " + ".join(f"i{a} * {' * '.join(f'n{b}' for b in range(a + 1, d))}"
                       for a in range(d - 1)) or "0"  # fmt: skip
    lines.append(f"    const long long oy = {outer};")
    for k, mask in enumerate(masks):
        base = " + ".join(f"i{a} * s{k}_{a}" for a in range(d - 1) if mask[a]) or "0"
        lines.append(f"    const long long o{k} = {base};")
    lines += [f"    {line}" for line in inner]
    lines += ["    }"] * (d - 1)
    lines += ["    return tg_fp_status();", "}"]
    return "\n".join(lines) + "\n" + _entry(name, out_types, inputs, d)


def _entry(name, out_types, inputs, d):
    """The entry point taking a tuple of NumPy's array objects (the inputs, then the outputs:
    one argument, however many arrays), over the outer range [lo, hi)."""
    sizes = [f"long long n{a}" for a in range(d)] + ["long long lo", "long long hi"]
    arrays = [f"(const {t}*)TG_DATA(TG_ITEM(t, {k}))" for k, t in enumerate(inputs)]
    arrays += [f"({t}*)TG_DATA(TG_ITEM(t, {len(inputs) + m}))" for m, t in enumerate(out_types)]
    call = ", ".join([*arrays, *(f"n{a}" for a in range(d))])
    return f"""extern "C" int {name}({", ".join(["void* t", *sizes])}) {{
    return {name}_loops({call}, lo, hi);
}}
"""


def source(regions, head=16, items=24):
    """The C++ source of the regions' functions, `tg_region_<k>`; `head`: the size of a Python
    object's header, where an ndarray's data pointer follows (NumPy's `PyArrayObject_fields`);
    `items`: where a tuple's items begin (CPython's `PyTupleObject`)."""
    halves = HALF_PRELUDE + header("half") if uses_halves(regions) else ""
    prelude = fp_status.STATUS + _PRELUDE + halves + header("compare") + object_macros(head, items)
    table = numpy_loops.table(regions)
    if table:
        prelude += numpy_loops.prelude(len(table))
    functions = (_function(f"tg_region_{k}", r, table) for k, r in enumerate(regions))
    return prelude + "".join(functions)


def object_macros(head=object.__basicsize__, items=tuple.__basicsize__):
    """`TG_DATA(p)` (an ndarray object's data pointer) and `TG_ITEM(t, k)` (a tuple's item `k`),
    and the probe that checks them when the library is loaded (`objects`)."""
    return (f"#define TG_DATA(p) (*(char**)((char*)(p) + {head}))\n"
            f"#define TG_ITEM(t, k) (*(void**)((char*)(t) + {items} + 8 * (k)))\n"
            + _PROBE)  # fmt: skip


# --- building and loading
def flags(found):
    """The compiler's flags: `FLAGS`, with `VECTORISE` the machine's own instruction set
    (`-march=native`, where the compiler takes it), else no vectorisation at all."""
    chosen = list(FLAGS)
    if not VECTORISE:
        chosen.append("-fno-tree-vectorize")
    elif _native(found):
        chosen.append("-march=native")
    return chosen


_natives = {}


def _native(found):
    """What `-march=native` means to this compiler on this machine (its expansion: the CPU and
    its features, part of the cache key, so that a cache shared by machines keeps a library per
    instruction set), or "" where the compiler does not take it."""
    if found not in _natives:
        command = [found, "-march=native", "-###", "-x", "c++", "-", "-o", os.devnull]
        try:
            done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=60, check=False)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            done = None
        if done is None or done.returncode:
            _natives[found] = ""
        else:
            words = done.stderr.decode(errors="replace").replace('"', " ").split()
            _natives[found] = " ".join(w for w in words if "/" not in w and "\\" not in w)
    return _natives[found]


def build(regions):
    """One kernel per region (`kernel(*input arrays) -> output array`), or None where no
    library can be had (no compiler, or a failed build: a warning, once per process)."""
    found = compiler()
    if found is None:
        _warn_once("compiler", "tg.compile: no C++ compiler found for fusion (set CXX, "
                   "install one, or pass fuse=False); the program is replayed unfused")  # fmt: skip
        return None
    try:
        library = library_of(source(regions, object.__basicsize__, tuple.__basicsize__), found)
    except (OSError, RuntimeError) as error:
        _warn_once("build", f"tg.compile: the fused kernels could not be built "
                   f"({error}); the elementwise regions are replayed unfused")  # fmt: skip
        return None
    table = numpy_loops.table(regions)
    if table:  # the addresses of NumPy's loops in this process
        library.held.tg_set_numpy_loops(numpy_loops.pointers(list(table)))
    return [_kernel(library, f"tg_region_{k}", r) for k, r in enumerate(regions)]


def library_of(text, found):
    """The library of the C++ `text` built by the compiler `found` with `flags`: loaded once per
    process, and cached on disk by the text, the compiler and its flags. Raises OSError or
    RuntimeError where the build fails."""
    chosen = flags(found)
    what = [text, found, *chosen, _native(found) if "-march=native" in chosen else ""]
    key = hashlib.sha256("\0".join(what).encode()).hexdigest()[:24]
    return _library(key, text, found, chosen)


def _warn_once(what, message):
    if what not in _warned:
        _warned.add(what)
        warnings.warn(message, RuntimeWarning, stacklevel=6)


def _library(key, text, found, chosen):
    with _lock:
        library = _loaded.get(key)
        if library is None:
            library = _loaded[key] = _cached(key, text, found, chosen)
        return library


def _marker(key):
    return f'extern "C" const char* tg_fused_key(void) {{ return "{key}"; }}\n'


class _Library:
    """A built library, opened twice: `held` keeps the GIL during a call (cheaper, for small
    regions), `released` lets other threads run (large regions); `objects` whether its entry
    points can read a tuple of NumPy's array objects (the items where CPython keeps them, the
    data pointer where NumPy keeps it)."""

    def __init__(self, path):
        self.released, self.held = ctypes.CDLL(str(path)), ctypes.PyDLL(str(path))
        probe = np.zeros(3)
        function = self.held.tg_data_of
        function.argtypes, function.restype = [ctypes.py_object], ctypes.c_longlong
        wide = ctypes.sizeof(ctypes.c_void_p) == 8  # a tuple's items, 8 bytes apart
        self.objects = wide and function((probe,)) == probe.ctypes.data


def _open(path, key):
    """The library at `path` if it loads and is the one of `key`, else None."""
    try:
        library = _Library(path)
        marker = library.held.tg_fused_key
    except (OSError, AttributeError):
        return None
    marker.restype = ctypes.c_char_p
    return library if marker() == key.encode() else None


def _cached(key, text, found, chosen):
    """The library of `key`: loaded from the cache, or built (into a file of this process's
    own, loaded from there, then moved into place) when missing or unusable."""
    folder = cache_dir()
    target = folder / f"fused-{key}.so"
    if target.exists():
        library = _open(target, key)
        if library is not None:
            STATS["loaded"] += 1
            return library
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / f"fused-{key}.{os.getpid()}.{threading.get_ident()}.so"
    data = (text + _marker(key)).encode()
    done = _compile(found, chosen, data, scratch)
    if done.returncode:
        scratch.unlink(missing_ok=True)
        raise RuntimeError(done.stderr.decode(errors="replace")[-2000:])
    library = _open(scratch, key)
    if library is None:
        scratch.unlink(missing_ok=True)
        raise RuntimeError("the library built does not load")
    os.replace(scratch, target)
    STATS["built"] += 1
    return library


def _compile(found, chosen, data, path):
    command = [found, *chosen, "-x", "c++", "-", "-o", str(path)]
    return subprocess.run(command, input=data, capture_output=True, check=False)


# --- threads
def threads(from_elements=None, count=None):
    """Set (and return) `(from_elements, count)`: a region whose output has `from_elements`
    elements or more runs on `count` threads (0: the CPUs this process may use), each
    computing its own part of the output (the outer axis split): an element's value is the same
    whatever the number of threads."""
    if from_elements is not None:
        THREADS[0] = int(from_elements)
    if count is not None:
        THREADS[1] = int(count)
    return tuple(THREADS)


def _thread_count():
    if THREADS[1] > 0:
        return THREADS[1]
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


_pool = []  # (the process's id, workers, the executor): a forked child makes its own


def _split(function, arrays, lengths, count):
    """`function` (releasing the GIL) of `arrays` (the inputs, then the outputs) over the outer
    range cut into `count` parts: the first on this thread, the others on a pool's; the
    floating-point status of all (each thread has its own)."""
    with _lock:
        if not _pool or _pool[0][1] < count - 1 or _pool[0][0] != os.getpid():
            if _pool:
                old = _pool.pop()
                if old[0] == os.getpid():
                    old[2].shutdown(wait=False)  # what it was given still runs
            executor = concurrent.futures.ThreadPoolExecutor(count - 1, "tracker_gpu-fused")
            _pool.append((os.getpid(), count - 1, executor))
        executor = _pool[0][2]
        n = lengths[0]
        cuts = [n * part // count for part in range(count + 1)]
        # submitted under the lock: another thread growing the pool shuts this one down
        futures = [executor.submit(function, *arrays, *lengths, cuts[p], cuts[p + 1])
                   for p in range(1, count)]  # fmt: skip
    status = function(*arrays, *lengths, cuts[0], cuts[1])
    for future in futures:
        status |= future.result()
    return status


# --- calling
def _kernel(library, name, region):
    """`kernel(*arrays)`: the outputs, new C-contiguous arrays (the one array of a region of one
    output, else a tuple), from C-contiguous inputs of the region's dtypes and shapes
    (`fusion._guarded` makes them so). The arrays are handed over as one tuple of objects
    (ctypes converts one argument, about 0.2 us, where their addresses through `ndarray.ctypes`
    cost 1.3 us each), on a library that can read it, else as addresses; the GIL is released
    from `RELEASE_FROM` elements, and the output is cut between threads from `THREADS[0]`.
    Several small outputs of one dtype are rows of one new array (`BLOCK_BELOW`)."""
    lengths, _ = _merged(region)
    outs = [_dtype(region, j) for j in region.written()]
    shape, size, objects = region.shape, math.prod(region.shape), library.objects
    entry = name if objects else f"{name}_loops"
    kinds = [ctypes.py_object] if objects else [ctypes.c_void_p] * (len(region.inputs) + len(outs))
    held, released = _entry_points(library, entry, kinds, len(lengths))
    call = _caller(released if size >= RELEASE_FROM else held, released, lengths, size, objects)
    empty = np.empty
    if len(outs) == 1:
        (out,) = outs
        return lambda *arrays: call(arrays, (empty(shape, out),))[0]
    if shape and size < BLOCK_BELOW and len(set(outs)) == 1:  # rows: arrays (0-d: scalars)
        block = (len(outs), *shape)
        return lambda *arrays: call(arrays, tuple(empty(block, outs[0])))
    return lambda *arrays: call(arrays, tuple(empty(shape, dtype) for dtype in outs))


def any_lengths(library, name, region):
    """`kernel(row, shape, *arrays)`: region `name` of `library`, built for `region`'s shape,
    over arrays of any shape of the same structure (`source` depends on the output's merged
    axes and on which of them each input runs along, not on their lengths), writing one new
    C-contiguous output of `shape`. A structure of one axis is the flat array; of two, rows of
    `row` elements. The library must read NumPy's objects; a region of one output only."""
    (written,) = region.written()
    out, d = _dtype(region, written), len(_merged(region)[0])
    held, released = _entry_points(library, name, [ctypes.py_object], d)

    def kernel(row, shape, *arrays):
        size = math.prod(shape)
        lengths = (size,) if d == 1 else (size // row, row)
        function = released if size >= RELEASE_FROM else held
        call = _caller(function, released, lengths, size, True)
        return call(arrays, (np.empty(shape, out),))[0]

    return kernel


def _entry_points(library, entry, kinds, axes):
    """`(held, released)`: the function `entry` of `library`, holding and releasing the GIL,
    declared to take arguments of ctypes `kinds`, then `axes` lengths and the outer range."""
    functions = []
    for handle in (library.held, library.released):
        function = getattr(handle, entry)
        function.argtypes = [*kinds] + [ctypes.c_longlong] * (axes + 2)
        function.restype = ctypes.c_int
        functions.append(function)
    return functions


# Outputs of fewer elements than this (not 0-d) are rows of one array: one allocation (an
# array's costs about 0.2 us), where a row keeps the others' memory while it lives
BLOCK_BELOW = 1 << 12


def _dtype(region, j):
    """The dtype of op `j`'s value."""
    return np.dtype(bool) if region.ops[j][0] in COMPARISONS else np.dtype(region.ops[j][1])


def _caller(function, released, lengths, size, objects):
    """`call(inputs, outputs) -> outputs`: the loops over them (their objects in one tuple, or
    by address where the library cannot read objects), on threads from `THREADS[0]` elements."""
    whole = (*lengths, 0, lengths[0])

    def call(arrays, ys):
        handed = ((*arrays, *ys),) if objects else [a.ctypes.data for a in (*arrays, *ys)]
        threaded = _thread_count() if size >= THREADS[0] and lengths[0] > 1 else 1
        if threaded > 1:
            status = _split(released, handed, lengths, threaded)
        else:
            status = function(*handed, *whole)
        if status and fp_status.reported(status):
            raise fp_status.Flagged
        return ys

    return call
