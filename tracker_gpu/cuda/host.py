"""A host build of the CUDA sources: the same text compiled by the C++ compiler, with the CUDA
built-ins it uses defined by a small shim, and every kernel launched over its whole grid.

Threads of a kernel that never synchronises run one after another. Threads of a kernel that
does (`__syncthreads`, for block reductions) run as fibers, one block at a time: each runs until
it reaches the barrier, and the block goes on once all of them have, as on the device. That
makes the build exact for any kernel that is correct on the device (shared memory included),
so the kernels' arithmetic, and the whole fused path around them, are checked without a GPU.

A source written for a storage type is built for every dtype it takes (`Family.dtypes`): the
half types are the 2-byte structs of `kernels/half.cuh`, whose conversions in this build are its
integer code, so NumPy float16 and ml_dtypes bfloat16 arrays run through the same text.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .sources import SCALAR_TYPES, STORAGE_TYPES, c_type, compute_dtype

__all__ = ["HostLibrary", "available", "compile_shared", "SHIM", "UNARY_MATH", "math_prelude"]

# The C library's functions that kernels call, as <cmath> gives them to C++ (the compiler's
# builtins; the float overloads call the float functions), declared here: parsing <cmath> took
# most of a small build's time. A text that includes <cmath> itself (kernels/special.cuh) is
# built after <cmath> and its `std::` names instead (`math_prelude`).
# the one-argument functions (and `pow`) that kernels and generated code call
UNARY_MATH = ("cos", "cosh", "exp", "expm1", "fabs", "log", "log1p", "sin", "sinh", "sqrt", "tan",
              "tanh")  # fmt: skip
LIBM = (
    "namespace tg_math {\n#define TG_MATH(name) \\\n"
    "    static inline double name(double x) { return __builtin_##name(x); } \\\n"
    "    static inline float name(float x) { return __builtin_##name##f(x); }\n"
    + "".join(f"TG_MATH({f})\n" for f in UNARY_MATH)
    + "#undef TG_MATH\n"
    "static inline double pow(double x, double y) { return __builtin_pow(x, y); }\n"
    "static inline float pow(float x, float y) { return __builtin_powf(x, y); }\n}\n"
    + "".join(f"using tg_math::{f};\n" for f in (*UNARY_MATH, "pow"))
)
CMATH = "#include <cmath>\n" + "".join(f"using std::{f};\n" for f in (*UNARY_MATH, "pow"))
# CUDA's reinterpretation of a double's bits, which generated code writes inf and nan with
_BITS = r"""static inline double __longlong_as_double(long long bits) {
    double value;
    __builtin_memcpy(&value, &bits, sizeof value);
    return value;
}
"""


def math_prelude(text):
    """What a host build of `text` starts with: its math functions and `__longlong_as_double`."""
    return (CMATH if "#include <cmath>" in text else LIBM) + _BITS


# CUDA's built-ins on the host (no header: <vector> and <cstring> took a third of a build)
SHIM = r"""
#include <ucontext.h>
struct HostDim { unsigned int x, y, z; };
static thread_local HostDim threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local

namespace host {
struct Fiber { ucontext_t context; char* stack; bool done; };
static const unsigned long STACK = 1 << 16;
static thread_local ucontext_t scheduler;
static thread_local Fiber* running = nullptr;
static thread_local void (*entry_body)(void*) = nullptr;
static thread_local void* entry_data = nullptr;
static thread_local bool stray_barrier = false;  // a barrier outside a scheduled block

static void entry() {
    entry_body(entry_data);
    running->done = true;  // then back to the scheduler through uc_link
}

// Runs one block of `threads` fibers until all are done; a fiber yields at each barrier.
static void run_block(Fiber* fibers, unsigned threads) {
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = fibers[t];
        f.done = false;
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack;
        f.context.uc_stack.ss_size = STACK;
        f.context.uc_link = &scheduler;
        makecontext(&f.context, entry, 0);
    }
    for (bool pending = true; pending;) {  // one round: every live thread up to the next barrier
        pending = false;
        for (unsigned t = 0; t < threads; ++t) {
            if (fibers[t].done) continue;
            threadIdx.x = t;
            running = &fibers[t];
            swapcontext(&scheduler, &fibers[t].context);
            pending = pending || !fibers[t].done;
        }
    }
    running = nullptr;
}

template <typename F>
static void call(void* data) { (*static_cast<F*>(data))(); }

// The fibers of this thread, kept from launch to launch (their stacks are not cleared); more
// are made as a block needs them, those made before kept.
static Fiber* fibers_for(unsigned block) {
    static thread_local Fiber* fibers = nullptr;
    static thread_local unsigned count = 0;
    if (count < block) {
        Fiber* more = new Fiber[block];
        for (unsigned t = 0; t < block; ++t)
            more[t].stack = t < count ? fibers[t].stack : new char[STACK];
        delete[] fibers;
        fibers = more;
        count = block;
    }
    return fibers;
}

template <typename F>
static void launch(unsigned grid, unsigned block, bool cooperative, F& body) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    threadIdx = blockIdx = {0, 0, 0};
    Fiber* fibers = fibers_for(cooperative ? block : 0);
    entry_body = call<F>;
    entry_data = &body;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        if (cooperative) {
            run_block(fibers, block);
            continue;
        }
        for (unsigned t = 0; t < block; ++t) {
            threadIdx.x = t;
            body();
        }
    }
}
}  // namespace host

static inline void __syncthreads() {
    if (host::running)
        swapcontext(&host::running->context, &host::scheduler);
    else
        host::stray_barrier = true;
}
"""

_CTYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "unsigned int": ctypes.c_uint}
_FLOATS = {"float32": ctypes.c_float, "float64": ctypes.c_double}


def available():
    """Whether a C++ compiler is on the PATH."""
    return shutil.which(os.environ.get("CXX", "g++")) is not None


def _wrapper(kernel, dtype, cooperative):
    params = ", ".join(f"{c_type(t, dtype)} {n}" for t, n in kernel.params)
    names = ", ".join(kernel.param_names())
    ctype = STORAGE_TYPES[dtype]
    return f"""
extern "C" int host_{kernel.name}_{dtype}(unsigned int grid, unsigned int block, {params}) {{
    auto body = [&]() {{ {kernel.name}<{ctype}>({names}); }};
    host::stray_barrier = false;
    host::launch(grid, block, {"true" if cooperative else "false"}, body);
    return host::stray_barrier;
}}
"""


def compile_shared(text, tag, flags=()):
    """Build C++ `text` into a shared library (cached on disk by content and `flags`, more
    flags for the compiler) and load it."""
    digest = hashlib.sha256("\0".join([text, *flags]).encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / "tracker_gpu_host" / f"{tag}-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # the thread's own scratch file: threads building one library at once each write
        # theirs, and each replaces the target with a whole one
        scratch = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.so")
        compiler = os.environ.get("CXX", "g++")
        command = [compiler, "-O1", "-shared", "-fPIC", *flags, "-x", "c++", "-", "-o",
                   str(scratch)]  # fmt: skip
        done = subprocess.run(command, input=text.encode(), capture_output=True)
        if done.returncode:
            raise RuntimeError(f"the host build of {tag} failed:\n{done.stderr.decode()[-3000:]}")
        scratch.replace(target)
    return ctypes.CDLL(str(target))


def host_flags(family):
    """The C++ compiler's flags standing for the family's NVRTC options: `--fmad=false` (no
    contraction) is `-ffp-contract=off`; a standard it names (`-std=c++17`) the same standard."""
    flags = ["-ffp-contract=off"] if "--fmad=false" in family.nvrtc_options() else []
    flags += [option for option in family.options if option.startswith("-std=")]
    return tuple(flags)


class HostLibrary:
    """The host build of one `Family`, loaded with ctypes and cached by the text's digest."""

    _cache = OrderedDict()
    _CACHE_SIZE = 256

    def __init__(self, family):
        self.family = family
        wrappers = "".join(
            _wrapper(k, d, k.cooperative) for k in family.kernels.values() for d in family.dtypes
        )
        text = math_prelude(family.text) + SHIM + family.text + wrappers
        self.library = compile_shared(text, family.name, host_flags(family))

    _lock = threading.Lock()  # threads share the cache: one may evict what another found

    @classmethod
    def get(cls, family):
        with cls._lock:
            library = cls._cache.get(family.digest)
            if library is not None:
                cls._cache.move_to_end(family.digest)
                return library
        library = cls(family)  # built outside the lock: a build takes a tenth of a second
        with cls._lock:
            cls._cache[family.digest] = library
            while len(cls._cache) > cls._CACHE_SIZE:
                cls._cache.popitem(last=False)
        return library

    def launch(self, name, dtype, grid, block, args):
        """Run kernel `name` for `dtype` over `grid` blocks of `block` threads."""
        kernel = self.family.kernels[name]
        if len(args) != len(kernel.params):
            raise TypeError(f"kernel {name} takes {len(kernel.params)} arguments, got {len(args)}")
        if dtype not in self.family.dtypes:
            raise TypeError(f"kernel {name} takes {', '.join(self.family.dtypes)}, not {dtype}")
        function = getattr(self.library, f"host_{name}_{dtype}")
        converted = [ctypes.c_uint(grid), ctypes.c_uint(block)]
        for (ctype, pname), value in zip(kernel.params, args):
            if ctype.endswith("*"):
                if not isinstance(value, np.ndarray):  # layouts are checked by the fused path
                    raise TypeError(f"{name}: argument {pname} must be a NumPy array")
                converted.append(ctypes.c_void_p(value.ctypes.data))
            elif ctype in SCALAR_TYPES:
                converted.append(_FLOATS[compute_dtype(dtype)](float(value)))
            else:
                converted.append(_CTYPES[ctype](int(value)))
        if function(*converted):
            raise RuntimeError(
                f"kernel {name} reached __syncthreads but was run thread after thread: the "
                "source scan (sources._synchronising) missed the function that synchronises"
            )
