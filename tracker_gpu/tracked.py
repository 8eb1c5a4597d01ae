"""The tracked array: an array of any Array API library with its place in the graph.

A `TrackedArray` holds its data, its `tape.Node` and its library's namespace; its operators and
methods delegate to the rules (`rules/`), which record through `primitive`. A 0-d TrackedArray
plays the role of Tracker's `TrackedReal`. Here too is Tracker's API on tracked values: `param`,
`data`, `grad`, `isleaf`, `zero_grad`, `update`.
"""

import operator
import weakref

import numpy as np

from . import backend, foreign, recording
from .backend import SCALARS, namespace_of
from .recording import ACTIVE
from .tape import leaf_node

__all__ = [
    "TrackedArray",
    "constant",
    "holds_tracked",
    "param",
    "data",
    "user_data",
    "plain_value",
    "grad",
    "istracked",
    "isleaf",
    "zero_grad",
    "update",
]


# What NumPy meets eagerly when it converts a tracked array on the tape (`__array__`) or
# writes a tracked result into its own (`__array_ufunc__` with `out`); tg.compile raises the
# same while recording (`compiler.argument_writes`).
CONVERSION_REFUSED = (
    "converting a TrackedArray on the gradient tape to a NumPy array would drop its gradient; "
    "use tg.data(x) for the plain value, or tg.stop_gradient(x) for a tracked value that "
    "carries no gradient"
)
OUT_REFUSED = (
    "cannot write a tracked result into a NumPy array (an in-place operator such as `a += x`, "
    "or out=): write `a = a + x`, which records it"
)


class TrackedArray:
    """An array of any Array API library whose operations are recorded for differentiation.

    A 0-d TrackedArray plays the role of Tracker's `TrackedReal`; it formats (`f"{x:.3f}"`)
    and rounds (`round(x)`) as its Python number.

    Pickling keeps the value, not the tape (which stays in the process that recorded it): a
    leaf comes back a leaf with its data and the gradient it has accumulated (as PyTorch keeps
    a leaf's `requires_grad`), a tracked constant a constant, and a value inside a graph a leaf
    of its value. The library is found again from the data. `copy.deepcopy` gives the same,
    with new buffers: an independent leaf. `copy.copy` gives a second handle on the same value
    and place on the tape (a leaf's copy is the same parameter). Both are refused while
    `tg.compile` records. NumPy's methods outside the standard (`x.sum()`) raise an
    AttributeError naming the function to call (`tg.sum(x)`).

    >>> import numpy as np, tracker_gpu as tg
    >>> x = tg.param(np.array([1.0, 2.0]))
    >>> y = tg.sum(x * x)
    >>> float(y)
    5.0
    """

    # set where used, read with getattr: `_base`, `(array, key, version)` of a slice
    # `array[key]`, which a write into the slice reaches, and `_version`, the count of the
    # last write into an array (`rules/indexed.py`)
    __slots__ = ("data", "_node", "_xp", "_base", "_version", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, value, xp, node=None):
        self.data = value
        self._xp = xp
        self._node = leaf_node(value.shape, value.dtype) if node is None else node
        if ACTIVE and node is None:
            recorder = recording.current()
            if recorder is not None:
                recorder.leaf(self)

    # --- attributes of the Array API array object
    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: backend.size_of(self.data))
    device = property(lambda self: backend.device_of(self.data))
    T = property(lambda self: _transposed(self))
    mT = property(lambda self: viewed(self, matrix_transpose(self), matrix_transpose))

    def __array_namespace__(self, *, api_version=None):
        return _namespace_for(self._xp)

    def to_device(self, device, /, *, stream=None):
        return to_device(self, device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A constant's data, exported; an array on the tape refuses (what the consumer
        computed would not be recorded, so its gradient would be silently lost), as PyTorch
        refuses a tensor that requires a gradient; while tg.compile records, a traced array
        refuses with a RecordingError (the export would be fixed at its recorded value)."""
        if self._node is not None:
            _refuse_while_recording("__dlpack__ (a DLPack export) of a traced array", goes_on=False)
            raise BufferError(
                "cannot export a TrackedArray on the gradient tape through DLPack: what is "
                "computed from the export would carry no gradient; export tg.data(x) for the "
                "plain value, or tg.stop_gradient(x)"
            )
        given = dict(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
        return _exported(self.data).__dlpack__(**{k: v for k, v in given.items() if v is not None})

    def __dlpack_device__(self):
        return _exported(self.data).__dlpack_device__()

    def __array__(self, dtype=None, copy=None):
        """A constant converts like its data; an array on the tape refuses (its gradient
        would be lost without a word); while tg.compile records, a traced array refuses with a
        RecordingError (the plain copy would be fixed at its recorded value)."""
        if self._node is not None:
            _refuse_while_recording("np.asarray(x) (__array__) of a traced array", goes_on=False)
            raise TypeError(CONVERSION_REFUSED)
        value = np.asarray(self.data, dtype=dtype)
        return value.copy() if copy else value

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """A NumPy array (or scalar) on the left of an operator: `ndarray * tracked` records
        like `tracked * ndarray`; comparisons and bitwise operators give constants; NumPy's
        functions of constants alone give NumPy's answer; any other NumPy function raises an
        error naming the function to call instead."""
        if "out" in kwargs:
            outs = kwargs["out"]
            if any(istracked(a) for a in inputs) or any(type(o) is TrackedArray for o in outs):
                raise TypeError(OUT_REFUSED)
            return getattr(ufunc, method)(*(data(a) for a in inputs), **kwargs)  # constants
        if method == "__call__" and not kwargs:
            if ufunc.__name__ in _OPERATOR_UFUNCS:  # a list operand as the operators take it
                return _OPERATOR_UFUNCS[ufunc.__name__](*(as_operand(self, a) for a in inputs))
            if ufunc.__name__ in _COMPARISONS or ufunc.__name__ in _BITWISE:
                if ACTIVE:  # traced while tg.compile records: every replay compares anew
                    name = _STANDARD_BITWISE.get(ufunc.__name__, ufunc.__name__)
                    return _traced(name, *inputs)
                if not backend.is_numpy_namespace(self._xp):
                    return _numpy_on_the_left(ufunc, inputs, self)
                return constant(ufunc(*(data(a) for a in inputs)), self._xp)
        if not any(istracked(a) for a in inputs):  # constants only: NumPy's own answer
            return getattr(ufunc, method)(*(data(a) for a in inputs), **kwargs)
        raise numpy_function_error(ufunc.__name__ if method == "__call__" else
                                   f"{ufunc.__name__}.{method}")  # fmt: skip

    def __array_function__(self, func, types, args, kwargs):
        if not holds_tracked((args, kwargs)):  # constants only: NumPy's own answer
            return func(*_untracked(args), **_untracked(kwargs))
        raise numpy_function_error(func.__name__)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """PyTorch's functions on tracked arrays, as NumPy's: of constants alone, PyTorch's
        answer; otherwise an error naming the function to call instead. A plain tensor's own
        operator or method with a tracked operand (`t * x`) is left to the tracked array's
        reflected operator."""
        kwargs = kwargs or {}
        if not holds_tracked((args, kwargs)):
            return func(*_untracked(args), **_untracked(kwargs))
        if args and backend.is_array(args[0]) and not isinstance(args[0], TrackedArray):
            return NotImplemented
        xp = _library_of_first_tracked((args, kwargs))
        raise foreign.torch_function_error(func.__name__, _namespace_for(xp))

    # --- arithmetic: recorded (+ - * / ** are declared with the operator table at the end)
    def __matmul__(self, other):
        return matmul(self, as_operand(self, other))

    def __rmatmul__(self, other):
        return matmul(as_operand(self, other), self)

    def __floordiv__(self, other):
        return floor_divide_operator(self, other)

    def __rfloordiv__(self, other):
        return floor_divide_operator(other, self)

    def __mod__(self, other):
        return remainder(self, other)

    def __rmod__(self, other):
        return remainder(other, self)

    def __neg__(self):
        return negative(self)

    def __pos__(self):
        return positive(self)

    def __abs__(self):
        return abs(self)

    def __getitem__(self, key):
        out = getitem(self, key)
        if type(out) is TrackedArray and _basic(key) and _makes_views(self.data, key):
            out._base = (self, key, getattr(self, "_version", 0))  # a write into it reaches self
        return out

    def __setitem__(self, key, value):
        """`x[key] = value`, recorded: `x` then stands for the written value, whose gradient
        flows to the unwritten part of the old value and to `value`.

        The old value is left as it was when it is seen by anything else (a pullback that saved
        it, a view, the caller's array): the write goes to a copy then. A buffer that only `x`
        holds is written in place."""
        write(self, key, value)

    # --- bitwise operators: no gradient, constants (traced ones while tg.compile records);
    # & | ^ << >> are declared with the operator table at the end, with the in-place forms.
    def __invert__(self):
        from .rules.elementwise import PLAIN_FUNCTIONS

        return PLAIN_FUNCTIONS["bitwise_invert"](self)

    # --- comparisons: boolean constants, with no gradient (traced ones while tg.compile records)
    def __lt__(self, other):
        return _comparison("less", self, other) if ACTIVE else _compared(self, other, operator.lt)

    def __le__(self, other):
        return (
            _comparison("less_equal", self, other)
            if ACTIVE
            else _compared(self, other, operator.le)
        )

    def __gt__(self, other):
        return (
            _comparison("greater", self, other) if ACTIVE else _compared(self, other, operator.gt)
        )

    def __ge__(self, other):
        return (
            _comparison("greater_equal", self, other)
            if ACTIVE
            else _compared(self, other, operator.ge)
        )

    def __eq__(self, other):
        return _comparison("equal", self, other) if ACTIVE else _compared(self, other, operator.eq)

    def __ne__(self, other):
        return (
            _comparison("not_equal", self, other) if ACTIVE else _compared(self, other, operator.ne)
        )

    __hash__ = None

    # --- Python conversions (refused while tg.compile records: the value would be fixed)
    def __float__(self):
        _refuse_while_recording("float(x)")
        return float(self.data)

    def __int__(self):
        _refuse_while_recording("int(x)")
        return int(self.data)

    def __bool__(self):
        _refuse_while_recording("bool(x), or a comparison used as a condition (if x > 0:)")
        return bool(self.data)

    def __complex__(self):
        _refuse_while_recording("complex(x)")
        return complex(self.data)

    def __index__(self):
        _refuse_while_recording("x used as an index (__index__)")
        if not backend.isdtype(self._xp, self.dtype, "integral"):
            raise TypeError(
                f"a TrackedArray of dtype {self.dtype} cannot be used as an index; only a 0-d "
                "integer array can (cast with tg.astype(x, tg.int64) if its values are whole)"
            )
        return operator.index(self.data)

    def __format__(self, format_spec):
        """`f"{x:.3f}"`: a 0-d array formats as its Python number; no spec gives `str(x)`."""
        if not format_spec:
            return str(self)
        if self.ndim != 0:
            raise TypeError(
                f"a format spec ({format_spec!r}) applies to a 0-d tracked array, this one has "
                f"shape {tuple(self.shape)}; format its elements, or tg.data(x)"
            )
        _refuse_while_recording("format(x) (an f-string with a format spec)")
        return format(_python_number(self), format_spec)

    def __round__(self, ndigits=None):
        """`round(x)` of a 0-d array: a Python int (a float with `ndigits`), as for NumPy's
        scalars; no gradient (`tg.round(x)` is the array function)."""
        if self.ndim != 0:
            raise TypeError(
                f"round() takes a 0-d tracked array, this one has shape {tuple(self.shape)}; "
                "use tg.round(x) for an array"
            )
        _refuse_while_recording("round(x)")
        return round(_python_number(self), ndigits)

    # --- pickling and copying: the value travels, the tape stays (see _restored)
    def __reduce__(self):
        _refuse_while_recording("pickle or copy.deepcopy of a tracked array")
        node = self._node
        if node is None:
            return _restored, (self.data, "constant", None)
        grad = node.grad if node.rule is None else None
        return _restored, (self.data, "leaf", grad, _place_of(node, self.data))

    def __deepcopy__(self, memo):
        _refuse_while_recording("pickle or copy.deepcopy of a tracked array")
        node = self._node
        key = ("tracked place", id(node), id(self.data))  # `tg.update` rebinds one handle only
        if node is not None and key in memo:  # a second handle on a place copied
            return alias(memo[key])
        restore, (value, kind, g, *_) = self.__reduce__()
        xp = self._xp
        copied = [None if a is None else xp.asarray(a, copy=True) for a in (value, g)]
        out = restore(copied[0], kind, copied[1])
        if node is not None:
            memo[key] = out
        return out

    def __copy__(self):
        """`copy.copy(x)`: a second handle on the same value and place on the tape (as
        `alias`): a leaf's copy is the same parameter; a write rebinds one handle only."""
        return alias(self)

    def __dir__(self):
        return [name for name in super().__dir__() if not foreign.is_hint(TrackedArray, name)]

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tracked array")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        if self._node is None:
            return f"TrackedArray({self.data!r}, constant)"
        rule = self._node.rule
        kind = "leaf" if rule is None else f"rule={getattr(rule, 'name', '?')}"
        if ACTIVE and recording.current() is not None:  # no value: a replay has another
            return f"TrackedArray(traced, shape={tuple(self.shape)}, dtype={self.dtype}, {kind})"
        return f"TrackedArray({self.data!r}, {kind})"


_COMPARISONS = frozenset("less less_equal greater greater_equal equal not_equal".split())
_BITWISE = frozenset("bitwise_and bitwise_or bitwise_xor invert left_shift right_shift".split())
# NumPy's names of the bitwise ufuncs that the standard names otherwise
_STANDARD_BITWISE = {"invert": "bitwise_invert", "left_shift": "bitwise_left_shift",
                     "right_shift": "bitwise_right_shift"}  # fmt: skip


def numpy_function_error(name):
    """The error for a NumPy function called on a tracked array, naming what to call instead."""
    return foreign.numpy_function_error(name, _namespace_for(np))


# The tracked namespace bound to a library (the namespace module registers its `namespace_for`
# when it loads: it is built on the rules, which build on this module).
_namespace_for = None


def serve_namespaces(namespace_for):
    """Have `x.__array_namespace__()` answer with `namespace_for(library of x)`, and the names
    of NumPy's and PyTorch's methods that a tracked array lacks raise errors naming the function
    to call (`foreign.declare_hints`)."""
    global _namespace_for
    _namespace_for = namespace_for
    foreign.declare_hints(TrackedArray, namespace_for(np))


# --- constants, and writes


def constant(value, xp):
    """A tracked constant: `value` as an array of the tracked namespace, with no place on the
    tape (what creation functions, comparisons and integer results give). Operations on
    constants alone give constants; a write of a tracked value into one puts it on the tape.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.istracked(tg.zeros(2)), type(tg.zeros(2)).__name__
    (False, 'TrackedArray')
    """
    out = _new(TrackedArray)
    out.data, out._node, out._xp = value, None, xp
    return out


_new = object.__new__


def constants(result, xp):
    """`result` of a function with no gradient (an array, or a tuple of arrays such as
    `unique_all`'s named tuple) with each array made a tracked constant."""
    if isinstance(result, tuple):
        parts = [constants(r, xp) for r in result]
        return type(result)(*parts) if hasattr(result, "_fields") else tuple(parts)
    if isinstance(result, np.generic):  # NumPy's scalars (argmax of a whole array): 0-d arrays
        result = np.asarray(result)
    return constant(result, xp) if backend.is_array(result) else result


def _exported(value):
    """`value` as an array DLPack can export: NumPy's reductions give scalars, which have no
    `__dlpack__`; their 0-d arrays do."""
    return np.asarray(value) if isinstance(value, np.generic) else value


def alias(x):
    """A second tracked array for `x`'s value and place on the tape: it stays so when `x` is
    written into (`x[key] = v` rebinds `x` alone)."""
    out = _new(TrackedArray)
    out.data, out._node, out._xp = x.data, x._node, x._xp
    return out


def _restored(value, kind, g=None, place=None):
    """A tracked array rebuilt from a pickle: the namespace is found anew from the data; the
    tape is not pickled, so a value on it comes back as a leaf over its value, keeping the
    gradient accumulated in a leaf; a tracked constant comes back a constant. Handles on one
    place (`copy.copy(x)` and `x`) come back as handles on one leaf."""
    if place is not None and place.made is not None:
        return alias(place.made)
    xp = namespace_of(value)
    if kind == "constant":
        return constant(value, xp)
    out = _new(TrackedArray)  # not TrackedArray(...): a recording must not see it as an input
    out.data, out._xp, out._node = value, xp, leaf_node(value.shape, value.dtype)
    out._node.grad = g
    if place is not None:
        place.made = out
    return out


class _Place:
    """A node's place on the tape as a pickle holds it: one object for all the handles on the
    node, which pickle writes once, so that they come back as one leaf."""

    __slots__ = ("made", "__weakref__")

    def __init__(self):
        self.made = None

    def __reduce__(self):
        return _Place, ()


_PLACES = weakref.WeakValueDictionary()  # (id(node), id(value)) -> its place, while pickled


def _place_of(node, value):
    """The place of handles on `node` that hold `value` (after `tg.update(x, dx)`, a handle
    copied before holds the old value: it comes back as a leaf of its own)."""
    key = (id(node), id(value))
    place = _PLACES.get(key)
    if place is None:
        place = _PLACES[key] = _Place()
    return place


def _python_number(x):
    """The Python number of a 0-d tracked array, of the kind its dtype says."""
    xp, value = x._xp, x.data
    if backend.isdtype(xp, x.dtype, "bool"):
        return bool(value)
    if backend.isdtype(xp, x.dtype, "integral"):
        return int(value)
    if backend.isdtype(xp, x.dtype, "complex floating"):
        return complex(value)
    return float(value)


def as_operand(x, other):
    """A list or tuple operand of `x`'s operator as an array of `x`'s library and device, as
    NumPy's operators take it (saved as a list, it failed in the backward pass); any other
    operand as it is."""
    if type(other) is not list and type(other) is not tuple:
        return other
    plain = x.data
    return namespace_of(plain).asarray(other, device=backend.device_of(plain))


def _compared(x, other, compare):
    plain = data(other)
    xp = x._xp
    if type(plain) not in SCALARS and not isinstance(plain, np.generic) and backend.is_array(plain):
        xp = backend.common_library(xp, plain)  # another library's array is refused
    return constant(compare(x.data, plain), xp)


_SWAPPED = {
    "less": operator.gt, "greater": operator.lt, "less_equal": operator.ge,
    "greater_equal": operator.le, "equal": operator.eq, "not_equal": operator.ne,
}  # fmt: skip


def _numpy_on_the_left(ufunc, inputs, x):
    """A NumPy scalar or array, or an array of `x`'s library whose ufuncs defer to `x` (CuPy's
    `mask & x`), on the left of a comparison (or bitwise operator) with `x`. A NumPy scalar
    (NumPy makes it 0-d) compares as a number from the right (`np.float64(0) < x` on PyTorch:
    NumPy's ufunc on the tensor made a uint8 mask, which indexing took for indices); an array of
    another library is refused, but NumPy's beside Dask's."""
    left, right = inputs[0], inputs[-1]
    scalar = isinstance(left, np.generic) or (type(left) is np.ndarray and left.ndim == 0)
    if right is x and scalar and ufunc.__name__ in _SWAPPED:
        return _compared(x, left.item(), _SWAPPED[ufunc.__name__])
    xp = x._xp
    for a in inputs:
        if not isinstance(a, TrackedArray):
            xp = backend.common_library(xp, a if backend.is_array(a) else np.asarray(a))
    return constant(ufunc(*(data(a) for a in inputs)), xp)


def holds_tracked(tree):
    """Whether a tree of lists, tuples and dicts holds an array on the tape."""
    if isinstance(tree, (list, tuple)):
        return any(holds_tracked(t) for t in tree)
    if isinstance(tree, dict):
        return any(holds_tracked(t) for t in tree.values())
    return istracked(tree)


def _library_of_first_tracked(tree):
    """The library of the first array on the tape in a tree of lists, tuples and dicts."""
    leaves = tree.values() if isinstance(tree, dict) else tree
    for leaf in leaves if isinstance(tree, (list, tuple, dict)) else ():
        if istracked(leaf):
            return leaf._xp
        found = _library_of_first_tracked(leaf)
        if found is not None:
            return found
    return None


def _untracked(tree):
    """The same tree with each tracked constant replaced by its data."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(_untracked(t) for t in tree)
    if isinstance(tree, dict):
        return {k: _untracked(t) for k, t in tree.items()}
    return data(tree)


# --- Tracker's API on tracked values


def _comparison(name, x, other):
    """A comparison recorded while tg.compile records, as its operator computes it eagerly."""
    from .rules.elementwise import comparison

    return comparison(name, x, other)


def _traced(name, *args):
    """A comparison or a bitwise operator: constants, or traced arrays (recorded) while
    tg.compile records."""
    from .rules.elementwise import PLAIN_FUNCTIONS

    return PLAIN_FUNCTIONS[name](*args)


def _refuse_while_recording(operation, goes_on=True):
    """Refused while tg.compile records; under fallback=True, the run may go on eagerly from
    here (`goes_on`: the caller then does what it does eagerly)."""
    if ACTIVE and recording.current() is not None:
        recording.refuse(operation, goes_on)


def param(x):
    """A leaf to differentiate with respect to: always a float copy of `x`.

    Integers and booleans become the library's default float dtype; float32 stays float32.
    `param` of a tracked value is an identity op that stays linked to its tape; `param` of a
    tracked constant is a leaf over a copy of its data.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.param(np.array([1, 2]))
    TrackedArray(array([1., 2.]), leaf)
    """
    if isinstance(x, TrackedArray):
        if x._node is not None:
            return identity(x)
        x = x.data
    if type(x) in SCALARS:
        x = np.complex128(x) if type(x) is complex else np.float64(x)
    xp = namespace_of(x)
    device = backend.device_of(x)
    dtype = _float_dtype(xp, x, device)
    return TrackedArray(xp.asarray(x, dtype=dtype, device=device, copy=True), xp)


def _float_dtype(xp, x, device):
    if backend.isdtype(xp, x.dtype, ("real floating", "complex floating")):
        return x.dtype
    if backend.isdtype(xp, x.dtype, ("integral", "bool")):
        return xp.__array_namespace_info__().default_dtypes(device=device)["real floating"]
    raise TypeError(f"cannot make a parameter of dtype {x.dtype}; pass a numeric array")


def leaf(x):
    """A leaf over `x` itself (no copy): how gradient() tracks its inputs."""
    if type(x) in SCALARS:
        return param(x)
    xp = namespace_of(x)
    if not backend.isdtype(xp, x.dtype, ("real floating", "complex floating")):
        return param(x)
    return TrackedArray(x, xp)


def data(x):
    """The plain array inside a tracked value; anything else is returned unchanged (the
    library's own reads, which record what they compute from it; users call `tg.data`)."""
    return x.data if isinstance(x, TrackedArray) else x


def user_data(x):
    """The plain array inside a tracked value (Tracker's `data`); anything else unchanged.
    It is the array itself, not a copy (as Tracker's `data` and PyTorch's `.data`): a write
    into it changes the value, and what a pullback saved of it, so the gradient is taken at
    the written values; copy it first to change it apart. While `tg.compile` records, a
    traced array (on the tape, or data such as labels) refuses with a `tg.RecordingError`:
    what is computed from its plain value would be fixed at the recording
    (`tg.stop_gradient(x)` is the value without gradient that replays recompute)."""
    return plain_value(x, "tg.data(x)")


user_data.__name__ = user_data.__qualname__ = "data"


def plain_value(x, operation):
    """`data(x)` handed to a caller: refused while tg.compile records `x`, naming `operation`."""
    if ACTIVE and type(x) is TrackedArray and x._node is not None:
        _refuse_while_recording(
            f"{operation} of a traced array (its plain value; tg.stop_gradient(x) is the "
            "value without gradient that every replay computes anew)"
        )
    return data(x)


def istracked(x):
    """Whether `x` is on the tape (Tracker's meaning): a tracked constant is not.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.istracked(tg.param(np.ones(2))), tg.istracked(tg.ones(2)), tg.istracked(np.ones(2))
    (True, False, False)
    """
    return isinstance(x, TrackedArray) and x._node is not None


def isleaf(x):
    return istracked(x) and x._node.rule is None


def grad(x):
    """The gradient accumulated in a leaf (zeros before any backward pass).

    >>> import numpy as np, tracker_gpu as tg
    >>> x = tg.param(np.array([3.0]))
    >>> tg.back(tg.sum(x * x))
    >>> tg.grad(x)
    array([6.])
    """
    if not isinstance(x, TrackedArray):
        raise TypeError(f"grad needs a tracked value (tg.param(x)), got {type(x).__name__}")
    node = x._node
    if node is None:
        raise TypeError(
            "grad needs a value on the tape (tg.param(x)); this is a tracked constant (made by "
            "a creation function, a comparison or an integer result), which has no gradient"
        )
    if node.rule is not None:
        raise ValueError(
            "gradients are kept only for leaves (made by tg.param; a write x[key] = v or "
            "x += v makes x a new value, no longer the leaf); use tg.gradient(f, x) or tg.hook "
            "to see the gradient of an intermediate value"
        )
    if node.grad is None:
        return x._xp.zeros_like(x.data)
    return node.grad


def zero_grad(x):
    """Reset the accumulated gradient of a leaf to zero."""
    if not isleaf(x):
        raise TypeError(f"zero_grad needs a leaf made by tg.param, got {type(x).__name__}")
    x._node.grad = None


def update(x, dx):
    """Tracker's `update!`: `x.data += dx` (as a new buffer of x's dtype), then zero the
    gradient. The step may be a number or an array of x's library that broadcasts to x."""
    if not isleaf(x):
        raise TypeError("update needs a leaf made by tg.param")
    xp, dx = x._xp, data(dx)
    if type(dx) in SCALARS or isinstance(dx, (list, tuple)):
        dx = xp.asarray(dx, dtype=x.dtype, device=x.device)
    backend.check_same_library(xp, dx)
    if backend.isdtype(xp, dx.dtype, "complex floating") and not backend.isdtype(
        xp, x.dtype, "complex floating"
    ):
        raise TypeError("update: a complex step for a real parameter; pass a real step")
    shape, step_shape = tuple(x.shape), tuple(dx.shape)
    if step_shape != shape and not _broadcasts(step_shape, shape):
        raise ValueError(f"update of an array of shape {shape} by a step of shape {step_shape}")
    x.data = xp.astype(x.data + dx, x.dtype, copy=False)
    x._node.grad = None
    return x


def _broadcasts(shape, target):
    """Whether `shape` broadcasts to `target` without changing it."""
    lead = len(target) - len(shape)
    return lead >= 0 and all(n in (1, m) for n, m in zip(shape, target[lead:]))


# The rules are defined in terms of TrackedArray; the operators above resolve these names at
# call time, once the rule modules have been imported.
from .rules.elementwise import (  # noqa: E402
    abs,
    add,
    divide,
    floor_divide,
    floor_divide_operator,
    identity,
    multiply,
    negative,
    positive,
    pow,
    remainder,
    subtract,
)
from .rules.indexed import viewed, write  # noqa: E402
from .rules.linalg_base import matmul, matrix_transpose  # noqa: E402
from .rules.shape import getitem, permute_dims, to_device  # noqa: E402

_BASIC = frozenset((int, slice, type(None), type(Ellipsis)))


def _makes_views(value, key):
    """Whether the library of `value` answers basic indexing `key` with a view, whose writes
    reach the array (NumPy, CuPy, PyTorch, array-api-strict; not Dask, whose slices are new
    arrays). One element of a NumPy or array-api-strict array is a copy (NumPy's scalar):
    `acc = x[0]; acc += v` leaves `x` as it was; CuPy's and PyTorch's are 0-d views."""
    if type(value) is np.ndarray or type(getattr(value, "_array", None)) is np.ndarray:
        keys = key if type(key) is tuple else (key,)
        return len(keys) != value.ndim or any(type(k) is not int for k in keys)
    return not backend.is_lazy(value)


def _transposed(x):
    """`x.T`: a view of `x`, as the library's transpose is (`viewed`)."""
    axes = tuple(range(x.ndim - 1, -1, -1))  # its own inverse
    return viewed(x, permute_dims(x, axes), lambda v: permute_dims(v, axes))


def _basic(key):
    """Whether `key` is basic indexing (integers, slices, None, ...), which NumPy answers with a
    view of the array."""
    return all(type(k) in _BASIC for k in key) if type(key) is tuple else type(key) in _BASIC


_OPERATOR_UFUNCS = {
    "add": add, "subtract": subtract, "multiply": multiply, "divide": divide, "power": pow,
    "matmul": matmul, "floor_divide": floor_divide, "remainder": remainder,
}  # fmt: skip
