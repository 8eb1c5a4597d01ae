"""Launching kernels and making the buffers they write: on CuPy arrays through modules compiled
once per source text and device (NVRTC, via CuPy), or, inside `on_host()`, on NumPy arrays
through the host build of the same text. Either way the fused pullbacks above this module run
unchanged, which is how they are tested without a GPU.

Everything happens on the device that holds the arrays, not on CuPy's current device: modules
are cached per device, and launches and allocations run under the arrays' device.
"""

import math
import sys
from collections import OrderedDict

import numpy as np

from ..backend import full_exactly, on_device_of
from .dispatch import note
from .sources import SCALAR_TYPES, STORAGE_TYPES, Family, compute_dtype, family, kernels

__all__ = [
    "BLOCK",
    "PER_THREAD",
    "grid_for",
    "launch",
    "empty_like",
    "empty",
    "library",
    "scalar",
    "device_int64",
    "on_device",
]

BLOCK = 256
PER_THREAD = 4  # TG_PER_THREAD of kernels/half.cuh: elements a thread of its loops takes a pass
MAX_GRID = 65535  # grid-stride loops cover the rest
_MODULE_CACHE_SIZE = 128
_modules = OrderedDict()
_metadata = {}
_kernel_table = None


def grid_for(items, block=BLOCK):
    """Blocks enough for one thread per item (at least one, at most MAX_GRID)."""
    return max(1, min(-(-items // block), MAX_GRID))


def launch(name, dtype, grid, *args, block=BLOCK, source=None):
    """Launch kernel `name` (of the shipped sources, or of the `Family` `source`) for `dtype`
    (one of the source's `dtypes`: float32, float64 and, for a source written for a storage
    type, float16 and bfloat16) on `grid` blocks of `block` threads, with exactly its
    parameters."""
    text = source if source is not None else family(_kernel(name).family)
    kernel = text.kernels[name]
    if len(args) != len(kernel.params):
        raise TypeError(
            f"kernel {name} takes {len(kernel.params)} arguments "
            f"({', '.join(kernel.param_names())}), got {len(args)}"
        )
    dtype = str(dtype).rsplit(".", 1)[-1]
    if dtype not in text.dtypes:
        raise TypeError(f"kernel {name} takes {', '.join(text.dtypes)}, not {dtype}")
    note(("launch", name))
    buffers = [a for a in args if type(a) is np.ndarray or type(a) is _cupy_type()]
    if type(buffers[0]) is np.ndarray:  # only inside on_host(): the fused path took NumPy arrays
        from .host import HostLibrary

        HostLibrary.get(text).launch(name, dtype, grid, block, args)
        return
    device = buffers[0].device.id
    converted = [_device_argument(ctype, a, dtype) for (ctype, _), a in zip(kernel.params, args)]
    with on_device(device):
        _function(text, name, dtype, device)((grid,), (block,), tuple(converted))


def _kernel(name):
    global _kernel_table
    if _kernel_table is None:
        _kernel_table = kernels()
    return _kernel_table[name]


def _cupy_type():
    cupy = sys.modules.get("cupy")
    return None if cupy is None else cupy.ndarray


def _device_argument(ctype, value, dtype):
    if ctype.endswith("*"):
        return value
    if ctype in SCALAR_TYPES:
        return np.dtype(compute_dtype(dtype)).type(value)
    return np.int64(value) if ctype == "long long" else np.int32(value)


def _function(text: Family, name, dtype, device):
    cupy = sys.modules["cupy"]
    key = (text.digest, device)
    module = _modules.get(key)
    if module is None:
        module = cupy.RawModule(
            code=text.text, options=text.nvrtc_options(), name_expressions=text.name_expressions()
        )
        _modules[key] = module
        while len(_modules) > _MODULE_CACHE_SIZE:
            _modules.popitem(last=False)
    _modules.move_to_end(key)
    return module.get_function(f"{name}<{STORAGE_TYPES[dtype]}>")


# --- buffers: every one the fused path makes is recorded, on the device of the array it is like
def on_device(where):
    """A context in which CuPy allocates and launches on `where` (a device id, or an array);
    nothing for NumPy arrays."""
    if isinstance(where, int):
        return sys.modules["cupy"].cuda.Device(where)
    return on_device_of(where)


def library(x):
    """NumPy or CuPy: the library of a buffer the fused path works on."""
    return np if type(x) is np.ndarray else sys.modules["cupy"]


def empty_like(x):
    """A new buffer shaped like `x` on its device (recorded, so tests can count allocations)."""
    note(("alloc", x.nbytes))
    note(("buffer", x.nbytes))  # made without a launch (a launch count leaves it out)
    if type(x) is np.ndarray:
        return np.empty_like(x)
    with on_device(x):
        return library(x).empty_like(x)


def empty(shape, like, dtype=None):
    """A new buffer of `shape` on the device of `like`, of its dtype or `dtype` (recorded)."""
    dtype = like.dtype if dtype is None else np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize  # math's: np.prod would make an array
    note(("alloc", nbytes))
    note(("buffer", nbytes))
    with on_device(like):
        return library(like).empty(shape, dtype=dtype)


def scalar(value, like):
    """A 0-d array holding `value` with the dtype and device of `like` (recorded)."""
    note(("alloc", like.itemsize))
    with on_device(like):
        return full_exactly(library(like), (), value, dtype=like.dtype)


def device_int64(values, like):
    """A small int64 array of kernel metadata on the device of `like`, made once per content."""
    xp = library(like)
    key = (xp.__name__, 0 if xp is np else like.device.id, tuple(values))
    array = _metadata.get(key)
    if array is None:
        note(("meta", 8 * len(values)))
        with on_device(like):
            array = xp.asarray(np.asarray(values, dtype=np.int64))
        if len(_metadata) > 4096:
            _metadata.clear()
        _metadata[key] = array
    return array
