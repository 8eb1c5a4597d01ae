"""The host target of fusion: each region a C++ loop, built by the system's compiler once.

A region (`fusion.Region`) becomes one function: nested loops over the output's axes (merged
where every input allows: a contiguous chain is one flat loop), each input read through the
strides of its broadcast, the region's operations written with the expression code of the
generated CUDA kernels (`cuda/codegen.py`: its `C` table and its constants), each operation in
the C type of the dtype NumPy computes it in. Only the loop differs from a GPU kernel.

The functions of one program are one source, built by the C++ compiler found on the PATH (`CXX`
names another; a name that finds nothing means no compiler) with IEEE semantics kept
(`-ffp-contract=off`: no fused multiply-add; no fast-math), and cached on disk by the hash of
the source, the compiler and its flags, in the user's cache directory (`TRACKER_GPU_CACHE`
names another): a second process loads the library without building it. A cached file that
does not load, or is not the library of its key, is built anew. Without a compiler, or where a
build fails, `build` returns None (one warning): the program is replayed unfused.
"""

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np

from ..cuda.codegen import C, constant

__all__ = ["build", "cache_dir", "compiler", "FLAGS", "STATS", "source"]

FLAGS = ["-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno"]
_CTYPE = {"float32": "float", "float64": "double", "bool": "bool"}
_PRELUDE = r"""#include <cmath>
#include <cstring>
using std::cos; using std::cosh; using std::exp; using std::expm1; using std::fabs;
using std::log; using std::log1p; using std::pow; using std::sin; using std::sinh;
using std::sqrt; using std::tan; using std::tanh;
static inline double __longlong_as_double(long long bits) {
    double value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}
"""
COMPARISONS = frozenset({"gt", "ge", "lt", "le", "eq", "ne"})
# what `C` does not name, in the same notation: the rules' own forwards, operation for operation
_MORE = {
    "identity": "{0}",
    "astype": "{0}",  # the operand is cast to the result's type
    "relu": "({0} > T(0) ? {0} : T(0))",
}
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


# --- the source
def _ctype(dtype):
    return _CTYPE[str(dtype)]


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


def _types(region):
    """The C type of each op's value."""
    return ["bool" if op in COMPARISONS else _ctype(dtype) for op, dtype, _ in region.ops]


def _body(region):
    """The statements computing each op's value `t<j>` from the inputs' values `a<k>`."""
    types, lines = _types(region), []
    for j, (op, dtype, operands) in enumerate(region.ops):
        compute = _ctype(dtype)
        values = []
        for position, (kind, what) in enumerate(operands):
            if kind == "const":
                values.append(_literal(what, dtype))
                continue
            if kind == "none":
                values.append(None)
                continue
            name, ctype = (f"a{what}", _ctype(region.inputs[what][0])) if kind == "in" else (
                f"t{what}", types[what])  # fmt: skip
            keep = op == "where" and position == 0  # the condition stays a bool
            values.append(name if keep or ctype == compute else f"static_cast<T>({name})")
        statement = _expression(op, values, f"t{j}")
        lines.append(f"{types[j]} t{j}; {{ typedef {compute} T; {statement} }}")
    return lines


def _expression(op, values, t):
    """The statement(s) giving the op's local `t` its value."""
    if op == "sigmoid":  # the rule's forward: exp(-|x|), then a selection of two quotients
        x = values[0]
        return (f"const T e = exp(-fabs({x})); {t} = ({x} >= T(0) ? T(1) / (T(1) + e) "
                f": e / (T(1) + e));")  # fmt: skip
    if op == "clip":
        x, lo, hi = values
        if hi is None:
            return f"{t} = {C['maximum'].format(x, lo)};"
        if lo is None:
            return f"{t} = {C['minimum'].format(x, hi)};"
        return f"T r = {x} < {lo} ? {lo} : {x}; {t} = r > {hi} ? {hi} : r;"
    template = _MORE.get(op) or C[op]
    return f"{t} = {template.format(*values)};"


def _function(name, region):
    lengths, masks = _merged(region)
    d = len(lengths)
    params = [f"const {_ctype(dtype)}* __restrict x{k}" for k, (dtype, _) in
              enumerate(region.inputs)]  # fmt: skip
    out_type = _types(region)[-1]
    params.append(f"{out_type}* __restrict y")
    params += [f"long long n{a}" for a in range(d)]
    lines = [f'extern "C" void {name}({", ".join(params)}) {{']
    for k, mask in enumerate(masks):  # strides of the outer axes, in elements
        for a in range(d - 1):
            if mask[a]:
                later = [f"n{b}" for b in range(a + 1, d) if mask[b]] or ["1LL"]
                lines.append(f"    const long long s{k}_{a} = {' * '.join(later)};")
    for a in range(d - 1):
        lines.append(f"    for (long long i{a} = 0; i{a} < n{a}; ++i{a}) {{")
    outer = " + ".join(f"i{a} * {' * '.join(f'n{b}' for b in range(a + 1, d))}"
                       for a in range(d - 1)) or "0"  # fmt: skip
    lines.append(f"    const long long oy = {outer};")
    for k, mask in enumerate(masks):
        base = " + ".join(f"i{a} * s{k}_{a}" for a in range(d - 1) if mask[a]) or "0"
        lines.append(f"    const long long o{k} = {base};")
    last = d - 1
    lines.append(f"    for (long long i = 0; i < n{last}; ++i) {{")
    for k, mask in enumerate(masks):
        index = f"o{k} + i" if mask[last] else f"o{k}"
        lines.append(f"        const {_ctype(region.inputs[k][0])} a{k} = x{k}[{index}];")
    lines += [f"        {line}" for line in _body(region)]
    lines.append(f"        y[oy + i] = t{len(region.ops) - 1};")
    lines.append("    }")
    lines += ["    }"] * (d - 1)
    lines.append("}")
    return "\n".join(lines) + "\n"


def source(regions):
    """The C++ source of the regions' functions, `tg_region_<k>`."""
    return _PRELUDE + "".join(_function(f"tg_region_{k}", r) for k, r in enumerate(regions))


# --- building and loading
def build(regions):
    """One kernel per region (`kernel(*input arrays) -> output array`), or None where no
    library can be had (no compiler, or a failed build: a warning, once per process)."""
    text = source(regions)
    found = compiler()
    if found is None:
        _warn_once("compiler", "tg.compile(fuse=True): no C++ compiler found (set CXX, or "
                   "install one); the elementwise regions are replayed unfused")  # fmt: skip
        return None
    key = hashlib.sha256("\0".join([text, found, *FLAGS]).encode()).hexdigest()[:24]
    try:
        library = _library(key, text, found)
    except (OSError, RuntimeError) as error:
        _warn_once("build", f"tg.compile(fuse=True): the fused kernels could not be built "
                   f"({error}); the elementwise regions are replayed unfused")  # fmt: skip
        return None
    return [_kernel(getattr(library, f"tg_region_{k}"), r) for k, r in enumerate(regions)]


def _warn_once(what, message):
    if what not in _warned:
        _warned.add(what)
        warnings.warn(message, RuntimeWarning, stacklevel=6)


def _library(key, text, found):
    with _lock:
        library = _loaded.get(key)
        if library is None:
            library = _loaded[key] = _cached(key, text, found)
        return library


def _marker(key):
    return f'extern "C" const char* tg_fused_key(void) {{ return "{key}"; }}\n'


def _open(path, key):
    """The library at `path` if it loads and is the one of `key`, else None."""
    try:
        library = ctypes.CDLL(str(path))
        marker = library.tg_fused_key
    except (OSError, AttributeError):
        return None
    marker.restype = ctypes.c_char_p
    return library if marker() == key.encode() else None


def _cached(key, text, found):
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
    command = [found, *FLAGS, "-x", "c++", "-", "-o", str(scratch)]
    done = subprocess.run(command, input=(text + _marker(key)).encode(), capture_output=True)
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


def _kernel(function, region):
    """`kernel(*arrays)`: the output, a new C-contiguous array, from C-contiguous inputs of the
    region's dtypes and shapes (`fusion._guarded` makes them so)."""
    lengths, _ = _merged(region)
    out = np.dtype(bool) if region.ops[-1][0] in COMPARISONS else np.dtype(region.ops[-1][1])
    shape = region.shape
    function.argtypes = [ctypes.c_void_p] * (len(region.inputs) + 1) + [ctypes.c_longlong] * len(
        lengths
    )
    function.restype = None
    empty = np.empty

    def kernel(*arrays):
        y = empty(shape, out)
        function(*[a.ctypes.data for a in arrays], y.ctypes.data, *lengths)
        return y

    return kernel
