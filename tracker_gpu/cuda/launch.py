"""Launching fused kernels: on CuPy arrays through modules compiled once (NVRTC, via CuPy), or,
inside `on_host()`, on NumPy arrays through the host build of the same sources. Either way the
fused pullbacks above this module run unchanged, which is how they are tested without a GPU.
"""

import contextlib
import sys

import numpy as np

from ..backend import is_cupy
from .sources import C_TYPES, kernels, source

__all__ = [
    "active",
    "launch",
    "empty_like",
    "device_int64",
    "on_host",
    "on_host_now",
    "generic_only",
    "recording",
]

BLOCK = 256
MAX_GRID = 4096  # grid-stride loops cover the rest
_state = {"host": False, "log": None, "off": False}
_modules = {}
_metadata = {}
_KERNELS = None


def active(*arrays):
    """Whether the fused path takes these arrays: CuPy arrays, or NumPy ones inside `on_host()`."""
    if _state["off"]:
        return False
    if _state["host"]:
        return all(type(a) is np.ndarray for a in arrays)
    return all(is_cupy(a) for a in arrays)


def on_host_now():
    """Whether `on_host()` is in force: NumPy arrays then take the fused path too."""
    return _state["host"]


@contextlib.contextmanager
def _setting(key, value):
    previous = _state[key]
    _state[key] = value
    try:
        yield value
    finally:
        _state[key] = previous


def on_host():
    """Run the fused path on NumPy arrays through the host build of the kernels (for tests)."""
    return _setting("host", True)


def generic_only():
    """Turn the fused path off: every pullback takes its generic Array API vjps."""
    return _setting("off", True)


def recording():
    """Collect the fused path's events: `("launch", kernel)`, `("alloc", nbytes)` for a gradient
    buffer and `("meta", nbytes)` for (cached) kernel metadata."""
    return _setting("log", [])


def _note(event):
    if _state["log"] is not None:
        _state["log"].append(event)


def empty_like(x):
    """A new buffer shaped like `x` on its device (recorded, so tests can count allocations)."""
    _note(("alloc", x.nbytes))
    return _library(x).empty_like(x)


def empty(shape, like):
    """A new buffer of `shape` with the dtype and device of `like` (recorded)."""
    xp = _library(like)
    _note(("alloc", int(np.prod(shape)) * like.itemsize))
    return xp.empty(shape, dtype=like.dtype)


def device_int64(values, like):
    """A small int64 array of kernel metadata on the device of `like`, made once per content."""
    xp = _library(like)
    key = (xp.__name__, 0 if xp is np else xp.cuda.Device().id, tuple(values))
    array = _metadata.get(key)
    if array is None:
        _note(("meta", 8 * len(values)))
        array = _metadata[key] = xp.asarray(np.asarray(values, dtype=np.int64))
    return array


def _library(x):
    return np if type(x) is np.ndarray else sys.modules["cupy"]


def launch(name, dtype, n, *args):
    """Launch kernel `name` for `dtype` (float32/float64) with enough threads for `n` items."""
    kernel = _kernel(name)
    grid = max(1, min(-(-n // BLOCK), MAX_GRID))
    _note(("launch", name))
    dtype = str(dtype).rsplit(".", 1)[-1]
    if _state["host"]:
        from .host import HostLibrary

        HostLibrary.get(kernel.family).launch(name, dtype, grid, BLOCK, args)
        return
    converted = [_device_argument(ctype, a, dtype) for (ctype, _), a in zip(kernel.params, args)]
    _function(kernel, dtype)((grid,), (BLOCK,), tuple(converted))


def _kernel(name):
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = kernels()
    return _KERNELS[name]


def _device_argument(ctype, value, dtype):
    if ctype.endswith("*"):
        return value
    if ctype == "T":
        return np.dtype(dtype).type(value)
    return np.int64(value) if ctype == "long long" else np.int32(value)


def _function(kernel, dtype):
    cupy = sys.modules["cupy"]
    key = (kernel.family, cupy.cuda.Device().id)
    module = _modules.get(key)
    if module is None:
        names = [
            f"{k.name}<{c}>"
            for k in kernels().values()
            if k.family == kernel.family
            for c in C_TYPES.values()
        ]
        module = cupy.RawModule(
            code=source(kernel.family), options=("-std=c++14",), name_expressions=names
        )
        _modules[key] = module
    return module.get_function(f"{kernel.name}<{C_TYPES[dtype]}>")
