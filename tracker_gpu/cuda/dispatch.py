"""The one place that decides whether the fused path runs, and the registry it chooses from.

`takes(*arrays)` is the decision: CuPy arrays take the fused path; NumPy arrays take it inside
`on_host()` (the host build of the same kernels stands in for a GPU); complex arrays never do,
nor anything inside `generic_only()`. The fused implementations register here by name:
pullbacks and forwards by primitive name, optimiser steps by rule name. The rules never import
them: a `Primitive` looks its name up when it is made, and `optim.step` looks its rule up.

Setting the environment variable TRACKER_GPU_FUSED_ON_HOST=1 puts the whole process in
`on_host()` (the test matrix's `numpy-fused` row).
"""

import contextlib
import os

import numpy as np

from ..backend import is_cupy

__all__ = [
    "takes",
    "on_host",
    "on_host_now",
    "native_allowed",
    "generic_only",
    "recording",
    "note",
    "SKIPPED_TYPES",
    "PULLBACKS",
    "FORWARDS",
    "STEPS",
    "register",
]

_state = {"host": False, "off": False, "log": None}

# Types whose pullbacks skip the fused path without calling it (the cheap first test on the
# hot path of the tape); emptied while `on_host()` is in force.
_NUMPY_TYPES = (np.ndarray, np.float64, np.float32)
SKIPPED_TYPES = set(_NUMPY_TYPES)

# name -> fused implementation
PULLBACKS = {}  # fused(node, args, kw, g, pending) -> gradients (tape.Total or arrays) | None
FORWARDS = {}  # fused(*args, **kw) -> value | None
STEPS = {}  # fused(rule, param, grad, state) -> (new_param, new_state) | None
_TABLES = {"pullback": PULLBACKS, "forward": FORWARDS, "step": STEPS}


def register(kind, *names):
    """Decorator: register a fused implementation of `kind` under each of `names`."""

    def decorate(fn):
        for name in names:
            _TABLES[kind][name] = fn
        return fn

    return decorate


def takes(*arrays):
    """Whether the fused path takes these arrays: CuPy arrays, or NumPy ones inside `on_host()`,
    of real dtypes (the kernels know no complex arithmetic: complex data takes the generic
    path). A NumPy array whose strides are not whole elements (a field of a structured array)
    is not aligned: the kernels count strides in elements, so it takes the generic path."""
    if _state["off"]:
        return False
    if _state["host"]:
        return all(
            type(a) is np.ndarray and a.dtype.kind != "c" and a.flags.aligned for a in arrays
        )
    return all(is_cupy(a) and a.dtype.kind != "c" for a in arrays)


def native_allowed():
    """Whether NumPy arrays may take the native build of the optimiser steps (`cuda.native`):
    not inside `on_host()`, whose emulated build runs them, nor inside `generic_only()`."""
    return not (_state["off"] or _state["host"])


def on_host_now():
    """Whether `on_host()` is in force: NumPy arrays then take the fused path too."""
    return _state["host"]


@contextlib.contextmanager
def _setting(key, value):
    previous = _state[key]
    _state[key] = value
    _skip_numpy(not _state["host"])
    try:
        yield value
    finally:
        _state[key] = previous
        _skip_numpy(not _state["host"])


def _skip_numpy(skip):
    if skip:
        SKIPPED_TYPES.update(_NUMPY_TYPES)
    else:
        SKIPPED_TYPES.difference_update(_NUMPY_TYPES)


def on_host(enabled=True):
    """Run the fused path on NumPy arrays through the host build of the kernels (for tests);
    `on_host(False)` turns that off inside a block."""
    return _setting("host", enabled)


def generic_only():
    """Turn the fused path off: every pullback takes its generic Array API vjps."""
    return _setting("off", True)


def recording():
    """Collect the fused path's events: `("launch", kernel)` for each launch, `("alloc", bytes)`
    for each buffer it makes and `("meta", bytes)` for (cached) kernel metadata."""
    return _setting("log", [])


def note(event):
    if _state["log"] is not None:
        _state["log"].append(event)


if os.environ.get("TRACKER_GPU_FUSED_ON_HOST") == "1":
    _state["host"] = True
    _skip_numpy(False)
