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

import numpy as np

from .. import backend
from ..tracked import TrackedArray

__all__ = ["signature", "arrays_of", "signature_and_arrays"]

VALUES = frozenset((int, float, bool, str, type(None), complex))  # described by their value


def signature(args):
    """A hashable description of `args` (see the module's docstring)."""
    return _describe(args, {})


def arrays_of(args):
    """The distinct arrays of `args`, in the order `signature` meets them: a program's inputs."""
    return signature_and_arrays(args)[1]


def signature_and_arrays(args):
    """`(signature(args), arrays_of(args))` in one walk over `args`."""
    found = {}
    key = _describe(args, found)
    return key, [x for x, _ in found.values()]


def _describe(x, seen):
    if type(x) is np.ndarray:  # the common case, without the generic lookups below
        _, order = seen.setdefault(id(x), (x, len(seen)))
        return ("array", np.ndarray, x.shape, x.dtype, "cpu", order)
    if type(x) in VALUES:
        return ("value", type(x), x)
    if isinstance(x, TrackedArray):
        raise TypeError(
            "tg.compile takes plain arrays: a tracked argument would tie every replay to the "
            "graph it belongs to; pass tg.data(x), or call the compiled function outside "
            "another gradient"
        )
    if backend.is_array(x):
        _, order = seen.setdefault(id(x), (x, len(seen)))  # repeats name their first place
        device = str(backend.device_of(x))
        return ("array", type(x), tuple(x.shape), x.dtype, device, order)
    if isinstance(x, dict):
        return (type(x), tuple((k, _describe(v, seen)) for k, v in x.items()))
    if isinstance(x, (tuple, list)):
        return (type(x), tuple(_describe(v, seen) for v in x))
    fields = getattr(type(x), "__dataclass_fields__", None)
    if fields is not None and not isinstance(x, type):  # a dataclass instance
        return (type(x), tuple((name, _describe(getattr(x, name), seen)) for name in fields))
    try:
        hash(x)
    except TypeError:
        return ("object", type(x), id(x))
    return ("value", type(x), x)
