"""What makes two calls of a compiled function the same program: their signature.

The structure of the arguments (container types, dict keys, dataclass fields), each array's
library, shape, dtype and device, which arrays are the same object, and the value of anything
else (numbers inside structures, strings, functions: the recording fixes them). A hashable
object is keyed by itself: by identity, unless its class defines `__hash__`; the attributes
that `f` reads from one keyed by identity are guarded (`guards.py`).

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
    kind = type(x)
    if kind is np.ndarray:  # the common case, without the lookups below
        _, order = seen.setdefault(id(x), (x, len(seen)))
        return ("array", np.ndarray, x.shape, x.dtype, "cpu", order)
    if kind is float:  # by its bits: -0.0 is not 0.0, and a nan is a nan
        return ("value", float, x.hex())
    if kind is complex:
        return ("value", complex, x.real.hex(), x.imag.hex())
    if kind in VALUES:
        return ("value", kind, x)
    describe = _BY_TYPE.get(kind)
    if describe is None:
        describe = _BY_TYPE[kind] = _describer(x)
    return describe(x, seen)


_BY_TYPE = {}  # type -> how its instances are described, found at its first instance


def _describer(x):
    kind = type(x)
    if isinstance(x, TrackedArray):
        return _refuse_tracked
    if backend.is_array(x):
        return _array
    if isinstance(x, dict):
        return lambda x, seen: (kind, tuple([(k, _describe(v, seen)) for k, v in x.items()]))
    if isinstance(x, (tuple, list)):
        return lambda x, seen: (kind, tuple([_describe(v, seen) for v in x]))
    fields = getattr(kind, "__dataclass_fields__", None)
    if fields is not None and not isinstance(x, type):  # a dataclass instance
        names = tuple(fields)
        return lambda x, seen: (
            kind,
            tuple([(name, _describe(getattr(x, name), seen)) for name in names]),
        )
    return _object


def _refuse_tracked(x, seen):
    raise TypeError(
        "tg.compile takes plain arrays: a tracked argument would tie every replay to the graph "
        "it belongs to; pass tg.data(x), or call the compiled function outside another gradient"
    )


def _array(x, seen):
    _, order = seen.setdefault(id(x), (x, len(seen)))  # repeats name their first place
    return ("array", type(x), tuple(x.shape), x.dtype, str(backend.device_of(x)), order)


def _object(x, seen):
    try:
        hash(x)
    except TypeError:
        return ("object", type(x), _Held(x))
    return ("value", type(x), x)


class _Held:
    """An unhashable object in a signature, by identity, and held: while a cached program's
    key holds it, no other object can take its address and replay its recording."""

    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is _Held and other.x is self.x

    def __hash__(self):
        return id(self.x)
