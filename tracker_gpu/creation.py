"""Creation and data-type functions of the standard, bound to one array library.

Created arrays are tracked constants: arrays of the namespace with no place on the tape
(parameters are made with `param`), so `array_namespace(xp.zeros(3)) is xp`, and a tracked
value written into one puts it on the tape. A `device=` argument picks the library that owns
that device, so `zeros(3, device=d)` lands where `d` is; otherwise the library the namespace is
bound to is used (NumPy for the top-level module). The `*_like` functions give constants for
tracked arrays and plain arrays for plain ones.

>>> import numpy as np, tracker_gpu as tg
>>> tg.zeros(2, dtype=tg.float32)
TrackedArray(array([0., 0.], dtype=float32), constant)
"""

import numpy as np

from . import recording
from .backend import (
    DTYPE_NAMES,
    device_of,
    dtype_in,
    dtype_name,
    is_array,
    is_complex_dtype,
    isdtype,
    library_of_device,
    namespace_of,
)
from .primitive import Primitive, no_gradient
from .tracked import TrackedArray, constant, data, holds_tracked

__all__ = ["bound_functions", "tril", "triu"]


def bound_functions(default):
    """The creation and data-type functions of a namespace bound to library `default`."""

    def target(device, dtype):
        xp = library_of_device(device, default)
        return xp, dtype_in(xp, dtype)

    def sized(name):
        def create(shape, *, dtype=None, device=None):
            xp, dt = target(device, dtype)
            return constant(getattr(xp, name)(shape, dtype=dt, device=device), xp)

        create.__name__ = name
        return create

    def full(shape, fill_value, *, dtype=None, device=None):
        xp, dt = target(device, dtype)
        if _differentiable(fill_value, dt, xp):  # NumPy's dtype: the fill's, unless given
            ones = xp.ones(shape, dtype=fill_value.dtype if dt is None else dt, device=device)
            return _filled(fill_value, ones, xp)
        if _traced(fill_value):  # a replay fills with the new value
            fill = lambda lib, v: lib.full(shape, v, dtype=dt, device=device)
            return no_gradient("full", fill)(fill_value)
        return constant(xp.full(shape, data(fill_value), dtype=dt, device=device), xp)

    def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
        xp, dt = target(device, dtype)
        return constant(xp.arange(start, stop, step, dtype=dt, device=device), xp)

    def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
        xp, dt = target(device, dtype)
        return constant(xp.eye(n_rows, n_cols, k=k, dtype=dt, device=device), xp)

    def identity(n, dtype=None, *, device=None):  # NumPy's: the n x n identity matrix
        return eye(n, dtype=dtype, device=device)

    def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
        if _on_tape(start) or _on_tape(stop):
            return _tracked_linspace(start, stop, num, dtype, device, endpoint)
        if any(is_array(data(v)) and data(v).ndim for v in (start, stop)):  # NumPy's array ends
            ends = [data(v) for v in (start, stop)]
            like = next(v for v in ends if is_array(v))
            value = _tracked_linspace(*ends, num, dtype, device, endpoint, like)
            return constant(value, namespace_of(value))
        if dtype is None:  # array ends (tracked constants, plain arrays): their dtype
            arrays = [data(v) for v in (start, stop) if is_array(data(v))]
            dtype = namespace_of(arrays[0]).result_type(*arrays, 1.0) if arrays else None
        xp, dt = target(device, dtype)
        start, stop = _number(start), _number(stop)
        value = xp.linspace(start, stop, num, dtype=dt, device=device, endpoint=endpoint)
        return constant(value, xp)

    def asarray(obj, /, *, dtype=None, device=None, copy=None):
        if isinstance(obj, TrackedArray) and obj._node is not None:
            return _tracked_asarray(obj, dtype, device, copy)
        if isinstance(obj, (list, tuple)) and holds_tracked(obj):
            return _stacked(obj, dtype, device)
        if isinstance(obj, TrackedArray):  # a constant
            same_dtype = dtype is None or dtype_name(dtype) == dtype_name(obj.dtype)
            if copy is not True and same_dtype and (device is None or device == obj.device):
                return obj
            obj = obj.data
        xp, dt = target(device, dtype)  # the bound library (or the device's), as the standard says
        return constant(xp.asarray(obj, dtype=dt, device=device, copy=copy), xp)

    def from_dlpack(x, /, *, device=None, copy=None):
        if isinstance(x, TrackedArray):
            x.__dlpack__()  # an array on the tape refuses, naming what to do
            x = x.data
        return constant(default.from_dlpack(x, device=device, copy=copy), default)

    functions = {name: sized(name) for name in ("zeros", "ones", "empty")}
    functions.update(full=full, arange=arange, eye=eye, identity=identity, linspace=linspace,
                     asarray=asarray)  # fmt: skip
    functions.update(from_dlpack=from_dlpack)
    functions.update({name: _like(name) for name in ("zeros_like", "ones_like", "empty_like")})
    functions["full_like"] = _full_like
    functions.update(_dtype_functions(default))
    for name, function in functions.items():  # as a wrong call names it: `zeros() takes ...`
        function.__name__ = function.__qualname__ = name
    functions.update(
        {name: getattr(default, name) for name in DTYPE_NAMES if hasattr(default, name)}
    )
    return functions


def _dtype_of(type_or_array):
    """The dtype of an array (tracked or not), or the dtype itself."""
    value = data(type_or_array)
    return value.dtype if is_array(value) else value


def _tracked_asarray(x, dtype, device, copy):
    """`x` on the tape, cast and moved as asked; a new array (a recorded copy) where `copy`
    is True, itself where nothing changes and `copy` is None."""
    from .rules.elementwise import astype, identity
    from .rules.shape import to_device

    if copy is False and (
        (dtype is not None and dtype_name(dtype) != dtype_name(x.dtype))
        or (device is not None and device != x.device)
    ):
        raise ValueError("asarray(x, copy=False) cannot change the dtype or device without a copy")
    changed = x
    if dtype is not None and dtype_name(dtype) != dtype_name(x.dtype):
        changed = astype(changed, dtype_in(x._xp, dtype))
    if device is not None and device != x.device:
        changed = to_device(changed, device)
    return identity(changed) if copy and changed is x else changed


def _first_tracked(obj):
    if isinstance(obj, (list, tuple)):
        return next(t for t in map(_first_tracked, obj) if t is not None) if obj else None
    return obj if isinstance(obj, TrackedArray) else None


def _stacked(obj, dtype, device):
    """A nested sequence holding tracked arrays, stacked: differentiable in each of them.
    Python numbers take the dtype of the first tracked array (or `dtype`)."""
    from .rules.shape import stack

    like = _first_tracked(obj)
    dtype = like.dtype if dtype is None else dtype_in(like._xp, dtype)
    device = like.device if device is None else device

    def build(o):
        if isinstance(o, (list, tuple)):
            return stack([build(e) for e in o])
        if isinstance(o, TrackedArray) and o._node is not None:
            return _tracked_asarray(o, dtype, device, None)
        return like._xp.asarray(data(o), dtype=dtype, device=device)

    return build(obj)


def _number(v):
    """A 0-d array end of linspace as a Python number (what the standard's linspace takes)."""
    v = data(v)
    if not is_array(v):
        return v
    return complex(v) if is_complex_dtype(v.dtype) else float(v)


def _on_tape(x):
    return isinstance(x, TrackedArray) and x._node is not None


def _tracked_linspace(start, stop, num, dtype, device, endpoint, like=None):
    """`num` evenly spaced values from `start` to `stop` (numbers or arrays, spaced along a new
    first axis), differentiable in the tracked ones: NumPy's arithmetic, `k * step + start`
    with `step = (stop - start) / div` over `div` intervals, the last value `stop` itself
    where `endpoint` holds, and the result cast to `dtype` at the end."""
    from .rules.elementwise import add, astype, divide, multiply, subtract
    from .rules.shape import broadcast_to, concat, getitem, reshape

    num = int(num)
    if num < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    like = like if like is not None else start if _on_tape(start) else stop
    start, stop = (_linspace_end(v, like, device) for v in (start, stop))
    delta = subtract(stop, start)
    shape = tuple(delta.shape)
    xp = namespace_of(data(delta))
    k = xp.arange(num, dtype=delta.dtype, device=device_of(data(delta)))
    k = xp.reshape(k, (num,) + (1,) * len(shape))
    div = num - 1 if endpoint else num
    out = add(multiply(k, divide(delta, div) if div > 0 else delta), start)
    if endpoint and num > 1:
        last = reshape(broadcast_to(stop, shape), (1,) + shape)
        out = concat([getitem(out, slice(0, num - 1)), last], axis=0)
    return out if dtype is None else astype(out, dtype_in(namespace_of(data(like)), dtype))


def _linspace_end(v, like, device):
    """An end of a tracked linspace: itself where it is on the tape (moved to `device`), else
    an array of `like`'s library, dtype and device (or `device`)."""
    from .rules.shape import to_device

    if _on_tape(v):
        return v if device is None or device == v.device else to_device(v, device)
    value, like = data(v), data(like)
    dtype = value.dtype if is_array(value) else like.dtype
    device = device_of(like) if device is None else device
    return namespace_of(like).asarray(value, dtype=dtype, device=device)


def _like(name):
    def create(x, /, *, dtype=None, device=None):
        value = data(x)
        xp = namespace_of(value)
        made = getattr(xp, name)(value, dtype=dtype_in(xp, dtype), device=device)
        return constant(made, x._xp) if isinstance(x, TrackedArray) else made

    create.__name__ = name
    return create


def _traced(value):
    """Whether `value` is traced while tg.compile records (so a replay must compute from it)."""
    return type(value) is TrackedArray and value._node is not None and recording.current()


def _full_like(x, /, fill_value, *, dtype=None, device=None):
    value = data(x)
    xp = namespace_of(value)
    dt = dtype_in(xp, dtype)
    if _differentiable(fill_value, value.dtype if dt is None else dt, xp):
        return _filled(fill_value, xp.ones_like(value, dtype=dt, device=device), xp)
    if _traced(fill_value):  # a replay fills with the new value
        fill = lambda lib, v: lib.full_like(value, v, dtype=dtype_in(lib, dtype), device=device)
        return no_gradient("full_like", fill)(fill_value)
    made = xp.full_like(value, data(fill_value), dtype=dt, device=device)
    return constant(made, x._xp) if isinstance(x, TrackedArray) else made


def _differentiable(fill_value, dtype, xp):
    """Whether an array of `dtype` filled with `fill_value` is a function of it: the fill on
    the tape (or traced), the dtype floating (or None: the fill's own)."""
    if not _on_tape(fill_value):
        return False
    dtype = fill_value.dtype if dtype is None else dtype
    return isdtype(xp, dtype, ("real floating", "complex floating"))


def _filled(fill_value, ones, xp):
    """The array of `ones`' shape and dtype filled with the tracked `fill_value`: ones times
    the fill in that dtype (NumPy's values, -0.0 and nan included), so that the fill's
    gradient is the sum of the array's, and a replay fills with the new value."""
    from .rules.elementwise import astype, multiply

    return multiply(constant(ones, xp), astype(fill_value, ones.dtype))


def _dtype_functions(default):
    """isdtype, result_type, can_cast, finfo, iinfo: asked of the library that owns the value."""

    def owner(*values):
        return next((namespace_of(v) for v in values if is_array(v)), default)

    def isdtype(dtype, kind):
        try:
            return default.isdtype(dtype, kind)
        except (TypeError, ValueError):
            return np.isdtype(dtype, kind)

    def result_type(*arrays_and_dtypes):
        values = [data(a) for a in arrays_and_dtypes]
        return owner(*values).result_type(*values)

    def can_cast(from_, to, /):
        return owner(data(from_)).can_cast(data(from_), to)

    def finfo(type, /):
        return owner(data(type)).finfo(_dtype_of(type))

    def iinfo(type, /):
        return owner(data(type)).iinfo(_dtype_of(type))

    def broadcast_shapes(*shapes):
        return tuple(np.broadcast_shapes(*shapes))

    return dict(
        isdtype=isdtype,
        result_type=result_type,
        can_cast=can_cast,
        finfo=finfo,
        iinfo=iinfo,
        broadcast_shapes=broadcast_shapes,
    )


# --- triangles: differentiable masks
def _triangle(name):
    def forward(xp, x, /, *, k=0):
        return getattr(xp, name)(x, k=k)

    return Primitive(name, forward, (lambda g, ans, x, k=0: _TRIANGLES[name](g, k=k),), saves="")


_TRIANGLES = {name: _triangle(name) for name in ("tril", "triu")}
tril, triu = _TRIANGLES["tril"], _TRIANGLES["triu"]
