"""The optimiser steps' kernels as loops on the host: an eager step of NumPy parameters takes the
fused path too, natively.

The kernels of `kernels/optim.cu` are grid-stride loops, one thread per element, each the
generic rule's formula operation for operation (see `steps`). Built here with a grid of one
thread whose dimensions are constants, a kernel is one loop of unit stride over the whole
array, which the C++ compiler vectorises. The build is `tg.compile`'s for its host loops
(`compiler.loops`: IEEE arithmetic, no contraction, the machine's instruction set, cached on
disk), so that a step is the generic rule's bit for bit, as on the GPU. One call reads the
parameter, its gradient and its state once and writes the new ones once, where the generic rule
makes about twelve passes of NumPy.

Only where `tg.compile` fuses exactly by default (x86-64, `loops.default_fuse`); elsewhere, where
no compiler is found or the build fails, the generic rule steps, without a warning (the same
answer, slower). Inside `on_host()` the emulated build (`cuda.host`) runs instead, as for every
other kernel.
"""

import ctypes
import threading

import numpy as np

from ..backend import NUMPY_FLOATS
from . import dispatch, fp_status
from .sources import C_TYPES, SCALAR_TYPES, c_type, family

__all__ = ["KERNELS", "available", "launch", "takes"]

FAMILY = "optim"
KERNELS = ("descent_step", "momentum_step", "nesterov_step", "adam_step")
DTYPES = tuple(C_TYPES)  # a half-precision parameter steps in float32 (`optim.state.step_dtype`)

# The CUDA built-ins the kernels use, for a grid of one block of one thread: constants, so that
# `blockIdx.x * blockDim.x + threadIdx.x` is 0 and the grid's stride is 1.
_SHIM = r"""#include <cmath>
using std::sqrt;
struct TgDim { unsigned int x, y, z; };
static constexpr TgDim threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0};
static constexpr TgDim blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__ static inline
#define __device__
#define __forceinline__ inline
#define __shared__ static
static inline void __syncthreads() {}
"""
_RELEASE_FROM = 1 << 15  # from how many elements a call releases the GIL (as `loops`'s do)
_ARGUMENT_TYPES = {"long long": ctypes.c_longlong, "int": ctypes.c_int}
_state = {"library": None, "tried": False}
_functions = {}  # (kernel, dtype, released) -> (its entry point, declared; how many arrays)
_lock = threading.Lock()


def takes(*arrays):
    """Whether the native build steps these arrays: NumPy arrays of one dtype of `DTYPES`,
    C-contiguous, outside `on_host()` and `generic_only()`, where the build is available."""
    first = arrays[0]
    if type(first) is not np.ndarray or not dispatch.native_allowed():
        return False
    dtype = first.dtype
    if dtype not in NUMPY_FLOATS:  # in the machine's byte order: a dtype's name says nothing
        return False
    for a in arrays:  # a loop, not a generator: this runs at every parameter's step
        if type(a) is not np.ndarray or a.dtype != dtype or not a.flags.c_contiguous:
            return False
    return available()


def available():
    """Whether the kernels are built (once per process, from the disk cache where it can)."""
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                _state["library"] = _built()
                _state["tried"] = True
    return _state["library"] is not None


def launch(name, dtype, grid, *args):
    """Run kernel `name` for `dtype` over its arrays, with exactly its parameters: `launch.launch`
    on the host (the grid is the loop's own). Raises `fp_status.Flagged` where it raised a
    floating-point exception that NumPy's settings report: the generic rule then steps (its
    NumPy operations warn or raise as they do)."""
    dispatch.note(("launch", name))
    released = args[0].size >= _RELEASE_FROM
    function, count = _functions.get((name, dtype, released)) or _function(name, dtype, released)
    status = function(args[:count], *args[count:])  # the arrays come first
    if status and fp_status.reported(status):
        raise fp_status.Flagged


def source(object_macros):
    """The C++ text: the shim, the `object_macros` (`loops.object_macros`), the kernels, and one
    entry point per kernel and dtype taking the arrays as one tuple and the scalars by value."""
    text = family(FAMILY).text
    entries = "".join(_entry(name, dtype) for name in KERNELS for dtype in DTYPES)
    return _SHIM + object_macros + text + entries


def _entry(name, dtype):
    kernel = family(FAMILY).kernels[name]
    declared, passed, k = ["void* t"], [], 0
    for ctype, pname in kernel.params:
        if ctype.endswith("*"):
            passed.append(f"({c_type(ctype, dtype)})TG_DATA(TG_ITEM(t, {k}))")
            k += 1
        elif ctype in SCALAR_TYPES:  # by value as a double, rounded once to the compute type
            declared.append(f"double {pname}")
            passed.append(f"({c_type('T', dtype)}){pname}")
        else:
            declared.append(f"{ctype} {pname}")
            passed.append(pname)
    return f"""extern "C" int tg_native_{name}_{dtype}({", ".join(declared)}) {{
    feclearexcept(TG_FP_ALL);
    {name}<{C_TYPES[dtype]}>({", ".join(passed)});
    return tg_fp_status();
}}
"""


def _built():
    # imported here: the compiler package imports the rules, which import this package
    from ..compiler import loops

    found = loops.compiler()
    if loops.default_fuse() != "exact" or found is None:
        return None
    try:
        library = loops.library_of(fp_status.STATUS + source(loops.object_macros()), found)
    except (OSError, RuntimeError):
        return None
    return library if library.objects else None


def _function(name, dtype, released):
    """`(function, arrays)`: the entry point of kernel `name` for `dtype` (NumPy's), its
    arguments declared, and how many arrays it takes before its scalars."""
    if not available():
        raise RuntimeError("the native build of the optimiser steps is not available")
    library = _state["library"]
    entry = f"tg_native_{name}_{np.dtype(dtype).name}"
    function = getattr(library.released if released else library.held, entry)
    params = family(FAMILY).kernels[name].params
    scalars = [ctype for ctype, _ in params if not ctype.endswith("*")]
    function.argtypes = [ctypes.py_object] + [
        ctypes.c_double if ctype in SCALAR_TYPES else _ARGUMENT_TYPES[ctype] for ctype in scalars
    ]
    function.restype = ctypes.c_int
    found = _functions[(name, dtype, released)] = (function, len(params) - len(scalars))
    return found
