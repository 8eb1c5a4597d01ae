"""What makes two calls of a compiled function the same program: their signature.

The structure of the arguments (container types, dict keys, dataclass fields), each array's
library, shape, dtype and device, which arrays are the same object, and the value of anything
else (numbers inside structures, strings, functions: the recording fixes them).

>>> import numpy as np
>>> signature((np.ones(2), {"n": 3})) == signature((np.zeros(2), {"n": 3}))
True
>>> signature((np.ones(2),)) == signature((np.ones(3),))
False
"""

from .. import backend
from ..pytree import is_container
from ..tracked import TrackedArray

__all__ = ["signature", "arrays_of"]


def signature(args):
    """A hashable description of `args` (see the module's docstring)."""
    seen = {}
    return _describe(args, seen)


def arrays_of(args):
    """The distinct arrays of `args`, in the order `signature` meets them: a program's inputs."""
    found = {}
    _describe(args, found)
    return [x for x, _ in found.values()]


def _describe(x, seen):
    if isinstance(x, TrackedArray):
        raise TypeError(
            "tg.compile takes plain arrays: a tracked argument would tie every replay to the "
            "graph it belongs to; pass tg.data(x), or call the compiled function outside "
            "another gradient"
        )
    if backend.is_array(x):
        _, order = seen.setdefault(id(x), (x, len(seen)))  # repeats name their first place
        device = str(backend.device_of(x))
        return ("array", type(x), tuple(x.shape), str(x.dtype), device, order)
    if isinstance(x, dict):
        return (type(x), tuple((k, _describe(v, seen)) for k, v in x.items()))
    if isinstance(x, (tuple, list)):
        return (type(x), tuple(_describe(v, seen) for v in x))
    if is_container(x):  # a dataclass
        fields = type(x).__dataclass_fields__
        return (type(x), tuple((name, _describe(getattr(x, name), seen)) for name in fields))
    try:
        hash(x)
    except TypeError:
        return ("object", type(x), id(x))
    return ("value", type(x), x)
