"""Writes: `x[key] = v` on a tracked array, and indexed updates in array-api-extra's form,
`tg.at(x)[idx].set(v)`; both differentiable.

`x[key] = v` (see `setitem`) makes `x` stand for the written value: its node sends the
gradient to the unwritten part of the old value and to `v`. What a pullback saved of the old
value is never changed: the write goes to a copy unless the caller knows that no one else sees
the old buffer.

`at(x)[idx].set(v)` (or `at(x, idx).set(v)`), `.add`, `.subtract`, `.multiply`, `.min` and
`.max` return a new array: `x` is never written to. The gradient flows to both `x` and `v`
(a number, or an array that broadcasts to the shape of `x[idx]`). Plain `x` and `v` give a
plain result.

An index is what `x[idx]` takes: integers, slices, `None`, `...`, integer arrays, boolean
masks, and tuples of them. Where integer arrays name one element more than once:

- `add`, `subtract`, `multiply`, `min` and `max` accumulate, in order (as `numpy.add.at`,
  `numpy.multiply.at`, `numpy.minimum.at`...): `at(x)[[0, 0]].add(1.0)` adds 2 to `x[0]`;
- `set` keeps the last value written there, as NumPy's assignment does (on every library, even
  those whose own scatter leaves the choice open); the earlier values get no gradient.

Everything is a composition of differentiable gathers, scatters into zeros and `where`, so the
result is differentiable to any order (`nest=True`). The update runs on the flattened `x`; the
positions the index names are worked out on the host (an index array on an accelerator is read
back), and repeated positions are applied in rounds that each touch a position once.

>>> import numpy as np, tracker_gpu as tg
>>> x = np.zeros(4)
>>> tg.at(x)[np.array([0, 2, 0])].add(1.0)
array([2., 0., 1., 0.])
>>> tg.at(x, np.array([1, 1])).set(np.array([5.0, 7.0]))  # the last value wins
array([0., 7., 0., 0.])
>>> x  # unchanged
array([0., 0., 0., 0.])
>>> tg.gradient(lambda x, v: tg.sum(tg.at(x)[1:3].multiply(v) ** 2), np.ones(4), np.array(3.0))
(array([ 2., 18., 18.,  2.]), array(12.))
"""

import itertools
import sys

import array_api_compat
import numpy as np

from .. import backend, recording
from ..backend import SCALARS, device_of, isdtype, namespace_of
from ..primitive import Primitive
from ..tracked import TrackedArray, constant, data, istracked
from .elementwise import (
    _as_arrays,
    _kind_rank,
    add,
    astype,
    maximum,
    minimum,
    multiply,
    subtract,
    where,
)
from .reductions import sum as _summed
from .shape import (
    _fill,
    _index_adjoint,
    _index_adjoint_traced,
    _normalize_key,
    _traced_parts,
    broadcast_to,
    getitem,
    reshape,
    traced_key,
)

__all__ = ["at", "setitem", "write", "in_place_operator"]


# --- x[key] = v
def setitem(x, key, value, *, in_place=False):
    """The tracked array `x` with `x[key] = value`, as a new tracked array (a constant where
    neither `x` nor `value` is on the tape); `x` itself is left as it was unless `in_place`,
    which writes into its buffer (for a caller that knows no one else sees it).

    A key with integer arrays keeps the last value where it names an element twice (as
    NumPy does), and only that value gets a gradient.

    >>> import numpy as np, tracker_gpu as tg
    >>> def f(x):
    ...     x[0] = x[1] * 3.0
    ...     return tg.sum(x * x)
    >>> tg.gradient(f, np.array([1.0, 2.0]))[0]  # of 9 x1² + x1²
    array([ 0., 40.])
    """
    _check_write(x, value)
    x, value = _joined(x, value)
    xp = x._xp
    value = _in_library(xp, x, value)
    if recording.current() is not None and _traced_parts(key):
        return _traced_write(x, key, value)
    key = _normalize_key(xp, x, key)
    if backend.has_integer_array(key):
        return at(x)[key].set(value)
    if istracked(value) and value.dtype != x.dtype:
        value = astype(value, x.dtype)
    write = _write_in_place if in_place and recording.current() is None else _write
    return write(x, value, key=key)


def _check_write(x, value):
    xp = x._xp
    differentiable = ("real floating", "complex floating")
    if istracked(value) and not isdtype(xp, x.dtype, differentiable):
        raise TypeError(
            f"cannot write a differentiable TrackedArray (dtype {value.dtype}) into an array "
            f"of dtype {x.dtype}: its gradient would be lost; write tg.data(value), or write "
            "into a float array"
        )
    is_complex = getattr(value, "dtype", None) is not None and backend.is_complex_dtype(value.dtype)
    if (is_complex or type(value) is complex) and not backend.is_complex_dtype(x.dtype):
        raise TypeError(
            f"cannot write a complex value into an array of dtype {x.dtype}: its imaginary "
            "part would be lost; write tg.real(value), or make the array complex first"
        )


def _joined(x, value):
    """`(x, value)` of one library where a tracked `value` is of another: NumPy's and Dask's
    join Dask's graph, by a tracked addition of Dask's zeros, which keeps the gradient (made
    a plain array of `x`'s library, the value's gradient was lost, silently); other mixes of
    libraries are refused."""
    plain = data(value)
    if not istracked(value) or not backend.is_array(plain) or namespace_of(plain) is x._xp:
        return x, value
    xp = backend.common_library(x._xp, plain)
    if xp is x._xp:  # x Dask's, value NumPy's
        return x, add(value, xp.zeros(tuple(value.shape), dtype=value.dtype))
    return add(x, xp.zeros(tuple(x.shape), dtype=x.dtype)), value


def _in_library(xp, x, value):
    """`value` as something `x[key] = value` takes: a number, or an array of `x`'s library."""
    plain = data(value)
    if backend.is_array(plain) and namespace_of(plain) is not xp:
        if istracked(value) and recording.current() is not None:
            recording.refuse("a write x[k] = v of a traced v of another library than x")
        return xp.asarray(np.asarray(_host(plain)), dtype=x.dtype, device=x.device)
    if isinstance(plain, (list, tuple)):
        return xp.asarray(plain, dtype=x.dtype, device=x.device)
    return value


def _traced_write(x, key, value):
    """A write with a traced key while tg.compile records: `where(mask, value, x)` for one
    boolean mask of `x`'s shape and a value that broadcasts to it; refused otherwise (what it
    writes would depend on the data)."""
    parts = key if isinstance(key, tuple) else (key,)
    mask = parts[0]
    simple = (
        len(parts) == 1
        and isdtype(mask._xp, mask.dtype, "bool")
        and tuple(mask.shape) == tuple(x.shape)
        and tuple(getattr(value, "shape", ())) in ((), (1,))
    )
    if not simple:
        recording.refuse("x[key] = value with a traced index (where it writes depends on the data)")
    return _in_dtype_of(x, where(mask, value, x), "set")  # x's dtype, as the eager write keeps


def _written(xp, out, v, key):
    """`out` with `out[key] = v` written into it (its own buffer)."""
    parts = key if isinstance(key, tuple) else (key,)
    if backend.is_array(v) and v.dtype != out.dtype:
        v = xp.astype(v, out.dtype)
    if any(k is None for k in parts):  # assignment refuses new axes: drop them, and v's
        key = tuple(k for k in parts if k is not None)
        if backend.is_array(v):
            v = xp.reshape(xp.broadcast_to(v, out[parts].shape), out[key].shape)
    if 0 in tuple(out[key].shape):  # an empty selection writes nothing (Dask refuses it)
        return out
    out[key] = v
    return out


def _write_vjp_x(g, ans, x, v, *, key):
    return _write(g, 0.0, key=key)


def _write_vjp_value(g, ans, x, v, *, key):
    gv = getitem(g, key)
    extra = len(v.shape) - len(gv.shape)  # leading axes of one that the write dropped
    return reshape(gv, (1,) * extra + tuple(gv.shape)) if extra > 0 else gv


_write = Primitive(
    "setitem",
    lambda xp, x, v, *, key: _written(xp, xp.asarray(x, copy=True), v, key),
    (_write_vjp_x, _write_vjp_value),
    saves="",
)
_write_in_place = Primitive(
    "setitem_in_place",
    lambda xp, x, v, *, key: _written(xp, x, v, key),
    (_write_vjp_x, _write_vjp_value),
    saves="",
)


# --- the tracked array's writes: x[key] = v, and x += v and the other in-place operators
def _references(x):
    return sys.getrefcount(x.data)


# How many references a buffer held by one tracked array alone has, as _references counts them.
_ALONE = _references(constant(np.zeros(1), np))


def _alone(x):
    """Whether `x`'s buffer is seen by `x` alone: a NumPy or CuPy array that owns its memory
    (no view of another) and that nothing else references (no pullback saved it, no view of
    it, no caller holds it). Writing into it in place then changes nothing anyone can see.
    Other libraries' arrays are never written in place."""
    if type(x.data) is not np.ndarray and not backend.is_cupy(x.data):
        return False  # (no local name for x.data: it would count as one more reference)
    return x.data.base is None and _references(x) <= _ALONE


def write(x, key, value):
    """`x[key] = value` into the tracked array `x`: `x` stands for the written value."""
    recorder = recording.current()
    if recorder is not None:  # into an argument plain eagerly: as NumPy's write (`written`)
        value = recorder.written(x, key, value)
    _rebind(x, setitem(x, key, value, in_place=_alone(x)))
    _write_through(x, key)


def _rebind(x, written):
    """`x` now stands for `written` (its value and its place on the tape); while tg.compile
    records, the recorder is told (a write into an argument is the caller's: `rebound`). A
    slice of another tracked array passes the write on to it (`_write_through`)."""
    recorder = recording.current()
    if recorder is not None:
        recorder.rebound(x, written)
    x.data, x._node, x._xp = written.data, written._node, written._xp  # Dask's, joined
    x._version = next(_WRITES)


_WRITES = itertools.count(1)


def _write_through(part, written=None):
    """A write into `part`, a slice `array[key]` (basic indexing, where NumPy makes a view),
    made in `array` too, as a write into NumPy's view changes its array (scikit-learn adds to
    a covariance's diagonal through `covariances[k, :, :]`). The slice is a copy, which does
    not show what was written into `array` since it was read: so only the elements written
    (at `written`, a key into `part`) are written into `array`, and a write of the whole
    slice computed from it (`part += 1`, `written` None) is refused once `array` has changed."""
    base = getattr(part, "_base", None)
    if base is None:
        return
    array, key, version = base
    fresh = getattr(array, "_version", 0) == version
    if type(key) is Viewed:
        _write_viewed(part, array, key.back, written, fresh)
    elif written is not None:
        write(array, key, where(_written_mask(part, written), part, getitem(array, key)))
    elif fresh:
        write(array, key, part)
    else:
        raise ValueError(STALE_SLICE)
    if fresh:  # it still holds all of `array[key]`
        part._base = (array, key, array._version)


class Viewed:
    """The "key" of a view of a whole array made by moving its elements (a transpose, a reshape,
    a flip), as a slice has its basic index: `back` lays a value of the view's shape out as
    the array's. It is the function's pullback, which for a permutation of the elements (its
    adjoint) is its inverse."""

    __slots__ = ("back",)

    def __init__(self, back):
        self.back = back


def viewed(x, out, back):
    """`out`, made from the tracked array `x` by moving its elements (`back`: `Viewed`), as a
    view of `x`: a write into it reaches `x`, as with the library's view (not Dask's, whose
    results are new arrays; not where the library's result is a copy)."""
    if type(out) is TrackedArray and type(x) is TrackedArray and _library_view(out.data, x.data):
        out._base = (x, Viewed(back), getattr(x, "_version", 0))
    return out


def _library_view(out, x):
    """Whether the library's `out` shares `x`'s memory (NumPy's reshape copies where strides
    cannot express it, PyTorch's flip always copies; Dask's results are new arrays)."""
    if type(getattr(out, "_array", None)) is np.ndarray:  # array-api-strict's
        out, x = out._array, getattr(x, "_array", x)
    if type(out) is np.ndarray:
        return np.may_share_memory(out, x)
    if backend.is_cupy(out):
        return sys.modules["cupy"].may_share_memory(out, x)
    if array_api_compat.is_torch_array(out):
        return out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    return False


def _write_viewed(part, array, back, written, fresh):
    """A write into a view of the whole array, made in the array: the elements written (at
    `written`), or the whole view computed from it while `array` is as it was read."""
    laid_out = back(part)
    if written is not None:
        write(array, ..., where(back(_written_mask(part, written)), laid_out, array))
    elif fresh:
        write(array, ..., laid_out)
    else:
        raise ValueError(STALE_SLICE)


STALE_SLICE = (
    "x op= y into a slice of a tracked array that was written after the slice was read: NumPy's "
    "slice would show that write, but a tracked slice is a copy, and its new value would undo "
    "it. Read the slice again after writing the array, or write into the array itself"
)


def _written_mask(part, key):
    """A boolean array of `part`'s shape, true at `key`."""
    xp = namespace_of(part.data)
    mask = xp.zeros(tuple(part.shape), dtype=xp.bool, device=device_of(part.data))
    mask[tuple(data(k) for k in key) if type(key) is tuple else data(key)] = True
    return mask


def in_place_operator(name, function):
    """`x op= y`: `x` stands for `x op y` from then on (the old buffer is left as it was), as
    long as that keeps its shape and its kind of dtype."""

    def operator(self, other):
        recorder = recording.current()
        if recorder is not None:  # into an argument plain eagerly: as NumPy's operator
            recorder.in_place(self, other)
        result = function(self, other)
        if not isinstance(result, TrackedArray):
            result = constant(result, self._xp)
        if not backend.shapes_agree(result.shape, self.shape):
            raise ValueError(
                f"x {name}= y would change the shape of x from {tuple(self.shape)} to "
                f"{tuple(result.shape)}; write x = x {name} y for a new array"
            )
        if result.dtype != self.dtype:
            result = _cast_back(result, self, name)
        _rebind(self, result)
        _write_through(self)
        return self

    return operator


def _cast_back(result, x, name):
    """The result of an in-place operator in `x`'s dtype, where NumPy's `same_kind` rule
    allows it (float64 into float32, real into complex); a TypeError otherwise."""
    if _higher_kind(result, x):
        raise TypeError(
            f"x {name}= y cannot store a result of dtype {result.dtype} in x of dtype "
            f"{x.dtype}; write x = x {name} y for a new array, or cast y first"
        )
    return astype(result, x.dtype)


def _higher_kind(result, x):
    """Whether `result` is of a higher kind than `x` (bool, integral, real, complex): what
    NumPy's `same_kind` casting refuses to store back in `x`."""
    xp = namespace_of(data(x))
    if isdtype(xp, x.dtype, "unsigned integer") and isdtype(xp, result.dtype, "signed integer"):
        return True  # NumPy's kinds order unsigned before signed: -2 would wrap to 254
    return _kind_rank(xp, result.dtype) > _kind_rank(xp, x.dtype)


# --- at(x)[idx]


def at(x, idx=None, /):
    """Indexed updates of `x` that return a new array: `at(x)[idx].set(v)`, `.add(v)`,
    `.subtract(v)`, `.multiply(v)`, `.min(v)`, `.max(v)`; also `at(x, idx).set(v)`.

    Repeated integer indices accumulate (`add`, `multiply`, `min`, `max`), or keep the last
    value (`set`). See the module's documentation.

    >>> import numpy as np, tracker_gpu as tg
    >>> x = np.array([1.0, 2.0, 3.0])
    >>> tg.at(x)[x > 1.5].max(2.5)
    array([1. , 2.5, 3. ])
    >>> tg.gradient(lambda x: tg.sum(tg.at(x)[0].set(10.0) * x), x)[0]  # d/dx of 10x0 + x1² + x2²
    array([10.,  4.,  6.])
    """
    return _At(x, idx)


class _At:
    __slots__ = ("_x", "_idx")

    def __init__(self, x, idx):
        if not backend.is_array(x) and not isinstance(x, TrackedArray):
            raise TypeError(f"at: expected an array, got {type(x).__name__}")
        self._x, self._idx = x, idx

    def __getitem__(self, idx):
        if self._idx is not None:
            raise ValueError("at: the index is given twice (at(x, idx)[idx2])")
        return _At(self._x, idx)

    def set(self, v, /):
        """`x` with `x[idx] = v` (the last value where an element is named twice)."""
        return _update(self._x, self._idx, v, "set")

    def add(self, v, /):
        """`x` with `v` added at `idx` (repeated indices accumulate)."""
        return _update(self._x, self._idx, v, "add")

    def subtract(self, v, /):
        """`x` with `v` subtracted at `idx` (repeated indices accumulate)."""
        return _update(self._x, self._idx, v, "subtract")

    def multiply(self, v, /):
        """`x` multiplied by `v` at `idx` (repeated indices accumulate)."""
        return _update(self._x, self._idx, v, "multiply")

    def min(self, v, /):
        """`x` with `minimum(x[idx], v)` at `idx` (repeated indices accumulate)."""
        return _update(self._x, self._idx, v, "min")

    def max(self, v, /):
        """`x` with `maximum(x[idx], v)` at `idx` (repeated indices accumulate)."""
        return _update(self._x, self._idx, v, "max")

    def __repr__(self):
        return f"<at: index {self._idx!r} of an array of shape {tuple(self._x.shape)}>"


_COMBINE = {
    "add": add,
    "subtract": subtract,
    "multiply": multiply,
    "min": minimum,
    "max": maximum,
}


def _update(x, idx, v, how):
    if idx is None:
        raise ValueError("at: no index; write at(x)[idx].set(v) or at(x, idx).set(v)")
    if recording.current() is not None and _traced_parts(idx):
        return _traced_update(x, idx, v, how)
    plain = x.data if isinstance(x, TrackedArray) else x
    xp = namespace_of(plain)
    device = device_of(plain)
    shape = tuple(x.shape)
    key = _normalize_key(xp, x, idx)
    positions = _positions(shape, key)  # the flat position of each element of x[idx]
    n = int(np.prod(shape, dtype=np.int64))
    values = _values(v, plain, xp, device, positions.shape)
    flat_x = reshape(x, (n,))
    if not positions.size:
        return _nothing_selected(x, flat_x, values, how, xp, device)
    flat_v = reshape(values, (positions.size,))
    flat_p = positions.reshape(-1)
    if how == "add":  # one scatter: repeated positions add up
        out = add(flat_x, _scatter(flat_v, n, flat_p, xp, device))
        return _in_dtype_of(x, reshape(out, shape), how)
    out = flat_x
    for elements in _rounds(flat_p, last_only=how == "set"):
        where_ = flat_p[elements]
        mask = np.zeros(n, dtype=bool)
        mask[where_] = True
        mask = xp.asarray(mask, device=device)
        picked = getitem(flat_v, _on(xp, elements, device))
        if how != "set":
            picked = _COMBINE[how](getitem(out, _on(xp, where_, device)), picked)
        out = where(mask, _placed(picked, n, where_, xp, device), out)
    return _in_dtype_of(x, reshape(out, shape), how)


def _nothing_selected(x, flat_x, values, how, xp, device):
    """`x` (a copy, in its dtype) where `idx` selects nothing. The update is made on the
    zero elements selected, so that it is refused where a selection would be (a result that
    x's dtype cannot hold, a promotion the library refuses), and `v` is joined to the result
    by a zero term: its gradient is zeros of its shape, as where elements are selected."""
    selected = reshape(getitem(flat_x, slice(0, 0)), tuple(values.shape))
    if how == "set":
        nowhere = xp.zeros(tuple(values.shape), dtype=xp.bool, device=device)
        updated = where(nowhere, values, selected)
    else:
        updated = _COMBINE[how](selected, values)
    _in_dtype_of(x, updated, how)  # raises for a result of a higher kind than x
    out = astype(x, x.dtype)
    if isdtype(xp, x.dtype, ("real floating", "complex floating")):
        out = subtract(out, astype(_summed(updated), x.dtype))  # x - 0 is x, -0 and nan too
    return out


def _in_dtype_of(x, out, how):
    """`at(x)[idx].how(v)` in x's dtype, as NumPy's `x[idx] = v` and `x[idx] += v` leave it:
    a value set is cast (float into integers truncates), a result of a higher kind than x
    (integers plus 0.5) is refused, as NumPy and array-api-extra refuse it."""
    if out.dtype == x.dtype:
        return out
    if how != "set" and _higher_kind(out, x):
        raise TypeError(
            f"at(x)[idx].{how}(v) gives values of dtype {out.dtype}, which x of dtype "
            f"{x.dtype} cannot hold; cast x first (x = astype(x, {out.dtype}))"
        )
    return astype(out, x.dtype)


def _traced_update(x, idx, v, how):
    """`at(x)[idx]` with a traced index while tg.compile records, as every replay computes it
    from its own index: one boolean mask of `x`'s shape with one value is a `where`; `add` and
    `subtract` at integer indices add the accumulating adjoint of the traced getitem. Other
    updates are refused (which of repeated indices wins, or how many are set, is the data's)."""
    parts = idx if isinstance(idx, tuple) else (idx,)
    traced = _traced_parts(idx)
    if any(isdtype(namespace_of(k.data), k.dtype, "bool") for k in traced):
        mask = parts[0]
        one_value = tuple(getattr(v, "shape", ())) in ((), (1,))
        if len(parts) != 1 or tuple(mask.shape) != tuple(x.shape) or not one_value:
            recording.refuse(
                f"tg.at(x)[mask].{how}(v) with a traced mask other than one of x's shape with "
                "one value (where it writes depends on the data)"
            )
        return _in_dtype_of(x, where(mask, v if how == "set" else _COMBINE[how](x, v), x), how)
    if how not in ("add", "subtract"):
        recording.refuse(
            f"tg.at(x)[idx].{how}(v) with a traced integer index (which of repeated indices "
            "wins depends on the data)"
        )
    spec = traced_key(x, idx)
    plain = data(x)
    xp, device = namespace_of(plain), device_of(plain)
    picked = plain[_fill(xp, spec["key"], spec["where"], [k.data for k in traced])]
    values = _values(v, plain, xp, device, tuple(picked.shape))
    out = _COMBINE[how](x, _index_adjoint_traced(values, *traced, shape=tuple(x.shape), **spec))
    return _in_dtype_of(x, out, how)


def _placed(values, n, flat_positions, xp, device):
    """A length-`n` array with `values` at the distinct `flat_positions` (anything elsewhere,
    for a `where` to mask): a gather, which keeps each value's bits; a scatter into zeros
    made -0.0 written 0.0 (0.0 + -0.0)."""
    source = np.zeros(n, dtype=np.int64)
    source[flat_positions] = np.arange(len(flat_positions))
    return getitem(values, _on(xp, source, device))


def _scatter(values, n, flat_positions, xp, device):
    """Zeros of length `n` with `values` added at `flat_positions` (differentiable)."""
    return _index_adjoint(values, (n,), _on(xp, flat_positions, device))


def _on(xp, indices, device):
    return xp.asarray(np.asarray(indices, dtype=np.int64), device=device)


def _positions(shape, key):
    """The flat positions of the elements of `x[key]`, in its shape (a NumPy array)."""
    grid = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    parts = key if isinstance(key, tuple) else (key,)
    host = tuple(_host(k) for k in parts)
    return np.asarray(grid[host if isinstance(key, tuple) else host[0]])


def _host(k):
    if not backend.is_array(k):
        return k
    if isinstance(k, np.ndarray):
        return k
    if hasattr(k, "cpu") and hasattr(k, "numpy"):  # PyTorch
        return k.detach().cpu().numpy()
    if backend.is_cupy(k):
        return k.get()
    if backend.is_lazy(k):
        return _host(k.compute())
    xp = namespace_of(k)
    return np.asarray(k.to_device(xp.__array_namespace_info__().default_device()))


def _values(v, x, xp, device, shape):
    """`v` broadcast to `shape` (the shape of x[idx]), as an array of x's library; a number in
    x's dtype where its kind fits (0.5 beside integers is not truncated to 0: `_in_dtype_of`
    refuses what it gives)."""
    if type(v) in SCALARS:  # as the elementwise functions take it, then an array
        v = _as_arrays(xp, x, v)[1]
        v = xp.asarray(v, device=device) if type(v) in SCALARS else v
    elif not isinstance(v, TrackedArray):
        if not backend.is_array(v):
            v = xp.asarray(v, dtype=x.dtype, device=device)
        elif namespace_of(v) is not xp:
            v = xp.asarray(np.asarray(_host(v)), dtype=x.dtype, device=device)
    extra = len(v.shape) - len(shape)
    if extra > 0 and all(n == 1 for n in tuple(v.shape)[:extra]):
        v = reshape(v, tuple(v.shape)[extra:])  # leading axes of one, dropped as NumPy does
    if tuple(v.shape) != tuple(shape):
        try:
            np.broadcast_shapes(tuple(v.shape), tuple(shape))
        except ValueError:
            raise ValueError(
                f"at: the value of shape {tuple(v.shape)} does not broadcast to the shape "
                f"{tuple(shape)} of x[idx]"
            ) from None
        v = broadcast_to(v, tuple(shape))
    return v


def _rounds(flat_positions, last_only):
    """Lists of element numbers, each naming every position at most once: the k-th
    occurrences of each position in round k (or only the last occurrences, for `set`)."""
    order = np.arange(flat_positions.size)
    if last_only:
        reversed_positions = flat_positions[::-1]
        _, first = np.unique(reversed_positions, return_index=True)
        yield np.sort(flat_positions.size - 1 - first)
        return
    # occurrence number of each element among those with the same position
    sorter = np.argsort(flat_positions, kind="stable")
    sorted_positions = flat_positions[sorter]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_positions)) + 1]
    run = np.repeat(starts, np.diff(np.r_[starts, sorted_positions.size]))
    occurrence = np.empty_like(order)
    occurrence[sorter] = np.arange(sorted_positions.size) - run
    for k in range(int(occurrence.max()) + 1):
        yield order[occurrence == k]
