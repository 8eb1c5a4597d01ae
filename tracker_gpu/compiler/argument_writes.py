"""What `Recorder` needs to replay `f`'s writes into its argument arrays as the eager call
makes them (`Recorder.written`, `rebound`, `argument_writes`): the errors NumPy raises eagerly,
and which arrays share memory, so that a write whose old value is read after it is found; and
the containers of the arguments, whose changes by `f` a recording cannot make as eagerly."""

import dataclasses
import sys

import numpy as np

from ..backend import is_cupy
from ..tracked import CONVERSION_REFUSED, OUT_REFUSED


class AsEagerly(TypeError):
    """The TypeError that NumPy raises eagerly, raised while recording (not taken for a
    refusal: `compiler._called` lets it through as it is)."""


PLAIN_WRITE = CONVERSION_REFUSED  # NumPy's write of a tracked value into a plain array
PLAIN_OPERATOR = OUT_REFUSED  # NumPy's in-place operator with a tracked operand
READ_AFTER_WRITE = (
    "tg.compile cannot replay f's write into its argument {} (a plain array eagerly: outside "
    "wrt, or gradient=False): f reads the argument's old value after writing into it (a view "
    "made before the write, a value a gradient pass saved, or the array read again), which "
    "eagerly sees the written value, and a replay writes the caller's array once, at its end. "
    "Return the new value instead of writing into the argument (c = c + 1.0; return ..., c), "
    "or use tg.compile(f, fallback=True) to run f eagerly every time"
)


def described(array):
    return f"of shape {tuple(array.shape)} and dtype {array.dtype}"


def shares(value, array):
    """Whether `value` may hold memory of `array` (a view of it, or itself)."""
    if value is array:
        return True
    if type(array) is np.ndarray:
        return type(value) is np.ndarray and np.may_share_memory(value, array)
    if is_cupy(array):
        return is_cupy(value) and sys.modules["cupy"].may_share_memory(value, array)
    storage = getattr(array, "untyped_storage", None)  # PyTorch
    if storage is not None and type(value) is type(array):
        return value.untyped_storage().data_ptr() == storage().data_ptr()
    return False


def view(value):
    """Whether the array `value` is a view of another's memory."""
    if type(value) is np.ndarray or is_cupy(value):
        return value.base is not None
    return getattr(value, "_base", None) is not None  # PyTorch


def view_key(step, values):
    """Whether the getitem `step` reads a view of its array eagerly: anything but one element
    (`x[0]` of a vector is a NumPy scalar; `x[0, ...]` a 0-d view)."""
    if step.node.shape != () or len(step.inputs) < 2:
        return True
    key = values[step.inputs[1]]
    parts = key if type(key) is tuple else (key,)
    return any(k is Ellipsis or k is None for k in parts)


CONTAINER_CHANGED = (
    "tg.compile cannot replay f's change to its argument {}: eagerly f changes the caller's "
    "{}, but while recording f is given a copy that holds its arrays traced, and a replay runs "
    "none of f's Python code. Return what f changes instead, or use tg.compile(f, "
    "fallback=True) to run f eagerly every time"
)


def containers(tree, where):
    """`[(where, container, its items)]` for the lists, dicts and dataclass instances in `tree`
    (its copies while recording), to find those that `f` changes (`changed`)."""
    found, stack = [], [(where, tree)]
    while stack:
        label, x = stack.pop()
        items = _items(x)
        if items is not None:
            found.append((label, x, items))
            stack.extend((f"{label}[{k!r}]", v) for k, v in items)
    return found


def changed(found):
    """The first of `containers`' finds whose items are no longer the same objects, or None."""
    for label, x, items in found:
        now = _items(x)
        if len(now) != len(items) or any(
            k != j or v is not w for (k, v), (j, w) in zip(now, items, strict=True)
        ):
            return label, type(x).__name__
    return None


def _items(x):
    if isinstance(x, dict):
        return tuple(x.items())
    if isinstance(x, list):
        return tuple(enumerate(x))
    if dataclasses.is_dataclass(x) and not isinstance(x, type) and hasattr(x, "__dict__"):
        return tuple(vars(x).items())
    return None
