"""What makes two calls of a compiled function the same program: their signature.

The structure of the arguments (container types, dict keys, dataclass fields), each array's
library, shape, dtype and device, which arrays are the same object, and the value of anything
else (numbers inside structures, strings, functions: the recording fixes them). A hashable
object is keyed by itself: by identity, unless its class defines `__hash__`; the attributes
that `f` reads from one keyed by identity are guarded (`guards.py`). A dataclass's attributes
that are not fields (set by `__post_init__` or later) are constants of the recording, keyed by
`constant_key`: numbers and strings by value, arrays by identity, shape and dtype.

>>> import numpy as np
>>> signature((np.ones(2), {"n": 3})) == signature((np.zeros(2), {"n": 3}))
True
>>> signature((np.ones(2),)) == signature((np.ones(3),))
False
"""

import numpy as np

from .. import backend
from ..pytree import TypeTable
from ..tracked import TrackedArray

__all__ = [
    "signature",
    "arrays_of",
    "signature_and_arrays",
    "non_fields",
    "immutable",
    "TrackedArgument",
]

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


_BY_TYPE = TypeTable()  # type -> how its instances are described, found at its first instance


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
            non_fields(x),
        )
    return _object


def non_fields(x):
    """The key of a dataclass instance's attributes that are not its fields (`self.scale = 3.0`
    in `__post_init__`): the recording reads them as constants, so each is keyed by
    `constant_key`; `()` for none (a library's layers, a slotted dataclass)."""
    found = getattr(x, "__dict__", None)
    if not found:
        return ()
    fields = type(x).__dataclass_fields__
    return tuple(sorted([(k, constant_key(v)) for k, v in found.items() if k not in fields]))


def immutable(x):
    """Whether `x` is a frozen dataclass of numbers, strings and tuples of them, compared by
    value (`eq`), with no attribute but its fields: nothing in it can change, and one such
    object is as good as another equal to it (the same signature, the same answers)."""
    kind = type(x)
    if kind in VALUES:
        return True
    if kind is tuple:
        return all(immutable(v) for v in x)
    params = getattr(kind, "__dataclass_params__", None)
    if params is None or not (params.frozen and params.eq) or isinstance(x, type):
        return False
    if non_fields(x):
        return False
    return all(immutable(getattr(x, name)) for name in kind.__dataclass_fields__)


_CONSTANT_DEPTH = 4  # containers inside a constant keyed item by item, deeper ones by identity


def constant_key(x, depth=0):
    """What decides a constant of a recording that a signature holds: numbers and strings by
    value, arrays by identity (held), shape and dtype (a write in place is read by the
    replay, another array is another program), short containers and dataclasses item by item,
    anything else by its hash (identity, by default) or, unhashable, its identity."""
    kind = type(x)
    if kind in VALUES:
        return _describe(x, {})
    if isinstance(x, TrackedArray):
        return _refuse_tracked(x, None)
    if backend.is_array(x):
        return ("constant array", _Held(x), tuple(x.shape), x.dtype)
    if depth < _CONSTANT_DEPTH:
        if isinstance(x, dict):
            return (kind, tuple([(k, constant_key(v, depth + 1)) for k, v in x.items()]))
        if isinstance(x, (tuple, list)):
            return (kind, tuple([constant_key(v, depth + 1) for v in x]))
        if getattr(kind, "__dataclass_fields__", None) is not None and hasattr(x, "__dict__"):
            return (kind, tuple([(k, constant_key(v, depth + 1)) for k, v in vars(x).items()]))
    return _object(x, None)


class TrackedArgument(TypeError):
    """A call of a compiled function with a tracked array among its arguments (inside a
    gradient, or while another compiled function records): no signature describes it, and
    the call runs `f` as eagerly (`Compiled.__call__`)."""


def _refuse_tracked(x, seen):
    raise TrackedArgument(
        "a tracked argument has no signature: it would tie every replay to the graph it belongs to"
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
