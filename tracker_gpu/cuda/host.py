"""A host build of the CUDA sources: the same text compiled by the C++ compiler, with the CUDA
built-ins it uses defined by a small shim, and every kernel launched over its whole grid, one
thread after another. Kernels here never synchronise within a block, so this is exact.

It lets the kernels' arithmetic, and the whole fused path around them, be checked on machines
without a GPU.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from .sources import C_TYPES, kernels, source

__all__ = ["HostLibrary", "available", "compile_shared", "SHIM"]

SHIM = """
#include <cmath>
using std::cos; using std::exp; using std::log; using std::pow; using std::sin; using std::sqrt;
using std::tanh;
struct HostDim { unsigned int x, y, z; };
static HostDim threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
"""

_CTYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "unsigned int": ctypes.c_uint}
_FLOATS = {"float32": ctypes.c_float, "float64": ctypes.c_double}


def available():
    """Whether a C++ compiler is on the PATH."""
    return shutil.which(os.environ.get("CXX", "g++")) is not None


def _wrapper(kernel, ctype):
    params = ", ".join(f"{t.replace('T', ctype)} {n}" for t, n in kernel.params)
    names = ", ".join(kernel.param_names())
    return f"""
extern "C" void host_{kernel.name}_{ctype}(unsigned int grid, unsigned int block, {params}) {{
    gridDim.x = grid; blockDim.x = block;
    for (unsigned int host_block = 0; host_block < grid; ++host_block)
        for (unsigned int host_thread = 0; host_thread < block; ++host_thread) {{
            blockIdx.x = host_block; threadIdx.x = host_thread;
            {kernel.name}<{ctype}>({names});
        }}
}}
"""


def compile_shared(text, tag):
    """Build C++ `text` into a shared library (cached on disk by content) and load it."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / "tracker_gpu_host" / f"{tag}-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_suffix(f".{os.getpid()}.so")
        compiler = os.environ.get("CXX", "g++")
        command = [compiler, "-O1", "-shared", "-fPIC", "-x", "c++", "-", "-o", str(scratch)]
        subprocess.run(command, input=text.encode(), check=True, capture_output=True)
        scratch.replace(target)
    return ctypes.CDLL(str(target))


class HostLibrary:
    """The host build of one kernel family, loaded with ctypes and cached on disk by content."""

    _cache = {}

    def __init__(self, family):
        self.family = family
        self.kernels = {k.name: k for k in kernels().values() if k.family == family}
        text = (
            SHIM
            + source(family)
            + "".join(_wrapper(k, c) for k in self.kernels.values() for c in C_TYPES.values())
        )
        self.library = compile_shared(text, family)

    @classmethod
    def get(cls, family):
        if family not in cls._cache:
            cls._cache[family] = cls(family)
        return cls._cache[family]

    def launch(self, name, dtype, grid, block, args):
        """Run kernel `name` for `dtype` over `grid` blocks of `block` threads."""
        kernel = self.kernels[name]
        function = getattr(self.library, f"host_{name}_{C_TYPES[dtype]}")
        converted = [ctypes.c_uint(grid), ctypes.c_uint(block)]
        for (ctype, pname), value in zip(kernel.params, args):
            if ctype.endswith("*"):
                if not isinstance(value, np.ndarray):  # layouts are checked by the fused path
                    raise TypeError(f"{name}: argument {pname} must be a NumPy array")
                converted.append(ctypes.c_void_p(value.ctypes.data))
            elif ctype == "T":
                converted.append(_FLOATS[dtype](float(value)))
            else:
                converted.append(_CTYPES[ctype](int(value)))
        function(*converted)
