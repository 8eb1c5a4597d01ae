"""Shape, indexing and device rules, and `unbroadcast`: the one place broadcasting is undone.

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(lambda x: tg.sum(x[np.array([0, 2, 2])]), np.array([1.0, 2.0, 3.0]))[0]
array([1., 0., 2.])
"""

import builtins

import numpy as np
from array_api_compat import is_dask_namespace

from .. import backend, recording
from ..backend import device_of, isdtype, namespace_of
from ..primitive import NOT_TRACKING, ByPosition, Primitive, fit_gradients_with, record
from ..recording import ACTIVE
from ..tracked import TrackedArray, data
from .elementwise import astype, real
from .rows import is_numpy_float, leading_sum


# The forwards carry the standard's signatures (the namespace shows them).
def _reshape_forward(xp, x, /, shape, *, copy=None):
    return xp.reshape(x, shape) if copy is None else xp.reshape(x, shape, copy=copy)


def _permute_dims_forward(xp, x, /, axes):
    return xp.permute_dims(x, axes)


def _expand_dims_forward(xp, x, /, axis):
    return xp.expand_dims(x, axis=axis)


def _squeeze_forward(xp, x, /, axis=None):
    if axis is None:  # the standard's squeeze has no default axis (NumPy's squeezes them all)
        raise TypeError(
            "squeeze needs the axis (or tuple of axes) to remove, as the Array API's squeeze "
            f"does: tg.squeeze(x, axis={_unit_axes(x.shape)})"
        )
    return xp.squeeze(x, axis=axis)


def _unit_axes(shape):
    """The axes of size 1 in `shape`, written as squeeze's axis would take them."""
    axes = tuple(i for i, n in enumerate(shape) if n == 1)
    return axes[0] if len(axes) == 1 else axes


def _squeeze_signature(x, /, axis):
    """The standard's signature of squeeze: the axis is required."""


def _flip_forward(xp, x, /, *, axis=None):
    return xp.flip(x, axis=axis)


def _broadcast_to_forward(xp, x, /, shape):
    if type(x) is np.ndarray and x.ndim == 0 and type(shape) is tuple and x.dtype.kind in "fc":
        # a sum's gradient spread back over its input: NumPy's broadcast_to is Python around an
        # nditer (about four times as long); the same read-only view, made directly
        view = np.ndarray(shape, x.dtype, x, 0, (0,) * len(shape))
        view.flags.writeable = False
        return view
    return xp.broadcast_to(x, shape)


# Shapes, joins and indexing read only the shapes of their arguments: their nodes save nothing.
reshape = Primitive(
    "reshape",
    _reshape_forward,
    (lambda g, ans, x, shape, **kw: reshape(g, x.shape), None),
    saves="",
)
permute_dims = Primitive(
    "permute_dims",
    _permute_dims_forward,
    (lambda g, ans, x, axes: permute_dims(g, _inverse(axes, len(x.shape))), None),
    saves="",
)


def _inverse(axes, ndim):
    """The permutation that undoes `axes` (which may count from the end, as NumPy allows)."""
    return tuple(np.argsort([a % ndim for a in axes]).tolist())


expand_dims = Primitive(
    "expand_dims",
    _expand_dims_forward,
    (lambda g, ans, x, *axis, **kw: reshape(g, x.shape), None),
    saves="",
)
squeeze = Primitive(
    "squeeze",
    _squeeze_forward,
    (lambda g, ans, x, *axis, **kw: reshape(g, x.shape), None),
    saves="",
    signature=_squeeze_signature,
)
flip = Primitive("flip", _flip_forward, (lambda g, ans, x, **kw: flip(g, **kw),), saves="")
# The gradient of broadcast_to is summed back to the argument's shape by the fitting step.
broadcast_to = Primitive(
    "broadcast_to", _broadcast_to_forward, (lambda g, ans, x, shape: g, None), saves=""
)


def fit(ga, a, name):
    """Sum a gradient down to the shape of its argument (a node), and cast it to its dtype."""
    shape = a.shape
    if ga.shape != shape and not backend.shapes_agree(ga.shape, shape):
        ga = unbroadcast(ga, shape, name)
    if ga.dtype != a.dtype:
        if backend.is_complex_dtype(ga.dtype) and not backend.is_complex_dtype(a.dtype):
            ga = real(ga)  # a real argument of a complex function: its part of the gradient
        ga = astype(ga, a.dtype)
    return ga


def unbroadcast(g, shape, name="?"):
    """Sum `g` over the axes along which an argument of `shape` was broadcast."""
    if len(shape) == 0:  # a gradient summed to a scalar: kept an array (NumPy's full sum is not)
        from .reductions import sum

        return reshape(sum(g, keepdims=True), ())
    gshape = tuple(g.shape)
    lead = len(gshape) - len(shape)
    if lead < 0 or any(n not in (1, m) for n, m in zip(shape, gshape[lead:])):
        raise ValueError(
            f"the pullback of {name!r} returned a gradient of shape {gshape} for an argument "
            f"of shape {tuple(shape)}; a gradient must have its argument's shape (or the shape "
            "the argument was broadcast to, which is summed back to it)"
        )
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and gshape[lead + i] != 1
    )
    if axes == tuple(range(lead)) and is_numpy_float(g):
        return leading_sum(g, lead)
    if axes:
        from .reductions import sum

        g = sum(g, axis=axes, keepdims=True)
    return reshape(g, tuple(shape)) if lead else g


# --- joining and splitting
def _concat_forward(xp, *arrays, axis=0):
    return xp.concat(arrays, axis=axis)


def _concat_vjp(i, g, ans, *arrays, axis=0):
    if axis is None:
        start = builtins.sum(_size(a) for a in arrays[:i])
        return reshape(g[start : start + _size(arrays[i])], arrays[i].shape)
    axis = axis % ans.ndim
    start = builtins.sum(a.shape[axis] for a in arrays[:i])
    key = (slice(None),) * axis + (slice(start, start + arrays[i].shape[axis]), Ellipsis)
    return g[key]


_concat = Primitive("concat", _concat_forward, ByPosition(_concat_vjp), saves="")


def concat(arrays, /, *, axis=0):
    """Join arrays along an existing axis (tracked and plain arrays may be mixed)."""
    return _concat(*arrays, axis=axis)


def _stack_forward(xp, *arrays, axis=0):
    return xp.stack(arrays, axis=axis)


def _stack_vjp(i, g, ans, *arrays, axis=0):
    axis = axis % ans.ndim
    return g[(slice(None),) * axis + (i, Ellipsis)]


_stack = Primitive("stack", _stack_forward, ByPosition(_stack_vjp), saves="")


def stack(arrays, /, *, axis=0):
    """Join arrays along a new axis (tracked and plain arrays may be mixed)."""
    return _stack(*arrays, axis=axis)


def _size(x):
    n = 1
    for d in x.shape:
        n *= d
    return n


# --- indexing
def _getitem_forward(xp, x, key):
    # A copy, not a view: a pullback that saves the part read must not keep the whole array
    # alive, nor make a later write into the array copy it (a loop that writes row i from row
    # i - 1 would keep a copy of the array per row).
    part = x[key]
    if type(part) is np.ndarray:  # the common case, without lookups
        return part if part.base is None else part.copy()
    return backend.owning(part)


def _index_adjoint_forward(xp, g, shape, key):
    """Zeros of `shape` with `g` added at `key` (repeated integer indices accumulate)."""
    z = xp.zeros(shape, dtype=g.dtype, device=device_of(g))
    if 0 in tuple(g.shape):  # an empty selection adds nothing (Dask refuses to assign it)
        return z
    if not backend.has_integer_array(key):
        key, g = _without_new_axes(xp, key, g, z)
        z[key] = g
        return z
    return backend.scatter_add(xp, z, key, g)


def _without_new_axes(xp, key, g, z):
    """Drop the `None`s of a key (assignment refuses them) and the axes of `g` they made."""
    parts = key if isinstance(key, tuple) else (key,)
    if all(k is not None for k in parts):
        return key, g
    key = tuple(k for k in parts if k is not None)
    return key, xp.reshape(g, z[key].shape)


_getitem = Primitive(
    "getitem",
    _getitem_forward,
    (lambda g, ans, x, key: _index_adjoint(g, x.shape, key), None),
    saves="",
)
_index_adjoint = Primitive(
    "index_adjoint",
    _index_adjoint_forward,
    (lambda g, ans, gx, shape, key: _getitem(g, key), None, None),
    saves="",
)


def getitem(x, key):
    """`x[key]`, with integers, slices, None, ..., integer arrays and boolean masks."""
    if type(x) is TrackedArray and x._node is not None and not (ACTIVE or NOT_TRACKING):
        parts = key if type(key) is tuple else (key,)
        if all(type(k) in _BASIC for k in parts):  # x[1:], x[:, 0]: nothing to normalise
            if Ellipsis not in parts and len(parts) - parts.count(None) < len(x.shape):
                parts += (Ellipsis,)  # `_with_trailing_ellipsis` of basic parts
            value = _getitem_forward(x._xp, x.data, parts)
            return record(value, x._xp, _getitem, (x._node, parts), _NO_KEYWORDS)
    xp = x._xp if isinstance(x, TrackedArray) else namespace_of(x)
    if recording.current() is not None and _traced_parts(key):
        return _traced_getitem(x, key)
    return _getitem(x, _normalize_key(xp, x, key))


_BASIC = frozenset((int, slice, type(None), type(Ellipsis)))  # basic indexing: no array
_NO_KEYWORDS = {}


# --- integer arrays traced by tg.compile in a key: arguments of the node, read at each replay
def _traced_parts(key):
    return [k for k in (key if isinstance(key, tuple) else (key,)) if isinstance(k, TrackedArray)]


def _traced_getitem(x, key):
    traced = _traced_parts(key)
    if any(isdtype(namespace_of(k.data), k.dtype, "bool") for k in traced):
        recording.refuse("x[mask] with a traced boolean mask (its shape depends on the data)")
    return _getitem_traced(x, *traced, **traced_key(x, key))


def traced_key(x, key):
    """`{key, where}` of a key with traced parts, for `_getitem_traced` and its adjoint: the
    key with None at the traced parts' places (`where`), filled in by each replay."""
    parts = key if isinstance(key, tuple) else (key,)
    where = tuple(i for i, k in enumerate(parts) if isinstance(k, TrackedArray))
    template = tuple(None if i in where else k for i, k in enumerate(parts))
    # an array in the key leaves it as it is (`_with_trailing_ellipsis`), as eager keys it
    return {"key": template if where else _with_trailing_ellipsis(template, len(x.shape)),
            "where": where}  # fmt: skip


def _fill(xp, key, where, indices):
    """`key` with the traced parts' values at `where`, integer arrays as eager keys take them
    (`index_dtype`: PyTorch reads a uint8 array as a mask)."""
    parts = list(key)
    for i, k in zip(where, indices):
        parts[i] = index_dtype(xp, k)
    return tuple(parts)


_getitem_traced = Primitive(
    "getitem",
    lambda xp, x, *indices, key, where: x[_fill(xp, key, where, indices)],
    ByPosition(
        lambda i, g, ans, x, *indices, key, where: (
            _index_adjoint_traced(g, *indices, shape=x.shape, key=key, where=where)
            if i == 0
            else None
        )
    ),
    saves="indices",
)
# its adjoint, the indices arguments too: traced in a recorded nested pass, read at each replay
_index_adjoint_traced = Primitive(
    "index_adjoint_traced",
    lambda xp, g, *indices, shape, key, where: _index_adjoint.forward(
        xp, g, shape, _fill(xp, key, where, [data(k) for k in indices])
    ),
    ByPosition(
        lambda i, gg, ans, g, *indices, shape, key, where: (
            _getitem_traced(gg, *indices, key=key, where=where) if i == 0 else None
        )
    ),
    saves="indices",
)


def _normalize_key(xp, x, key):
    if isinstance(key, tuple):
        key = tuple(_normalize_index(xp, x, k) for k in key)
    else:
        key = _normalize_index(xp, x, key)
    return _with_trailing_ellipsis(key, len(x.shape))


def _with_trailing_ellipsis(key, ndim):
    """Make NumPy's implicit trailing slices explicit (`x[i]` of a matrix), as the standard asks."""
    parts = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis or (type(k) not in _BASIC and backend.is_array(k)) for k in parts):
        return key
    if builtins.sum(k is not None for k in parts) >= ndim:
        return key
    return parts + (Ellipsis,)


def _normalize_index(xp, x, k):
    if isinstance(k, (int, slice)) or k is None or k is Ellipsis:
        return k
    if isinstance(k, TrackedArray):
        if not isdtype(k._xp, k.dtype, ("integral", "bool")):
            raise TypeError(
                "an index must be a plain integer or boolean array, not a tracked one of dtype "
                f"{k.dtype}: pass tg.data(k) (an index passes no gradient on)"
            )
        k = k.data  # integers and booleans carry no gradient
    array = backend.is_array(k)
    if isinstance(k, list) or (array and namespace_of(k) is not xp):
        if is_dask_namespace(xp) and not backend.is_lazy(k):  # NumPy's, as Dask takes it: a
            k, array = np.asarray(k), True  # one-element dask index (`x[:, [0]]`) is misshapen
        else:
            device = x.device if isinstance(x, TrackedArray) else device_of(x)
            k, array = xp.asarray(np.asarray(k), device=device), True
    return index_dtype(xp, k) if array else k


def index_dtype(xp, k):
    """An integer index array as int32 or int64, any other as it is: PyTorch's indexing and
    `take` refuse the narrower integers (and read uint8 as a mask), where NumPy and the
    standard take any integer dtype."""
    if k.dtype in (xp.int32, xp.int64) or not isdtype(xp, k.dtype, "integral"):
        return k
    return xp.astype(k, xp.int64)


# --- devices: the source device is an argument, so the pullback needs no value to send g back
def _to_device_forward(xp, x, device, source):
    import array_api_compat

    return array_api_compat.to_device(x, device)


_to_device = Primitive(
    "to_device",
    _to_device_forward,
    (lambda g, ans, x, device, source: to_device(g, source), None, None),
    saves="",
)


def to_device(x, device, /, *, stream=None):
    """`x` on `device`, a tracked op: the gradient flows back to `x`'s device."""
    return _to_device(x, device, _device(x))


def _device(x):
    return x.device if isinstance(x, TrackedArray) else device_of(x)


def astype_to(x, dtype, /, *, copy=True, device=None):
    """The standard's `astype`: a cast, then a move to `device` (a tracked `to_device`, so
    the gradient goes back to `x`'s device)."""
    y = astype(x, dtype, copy=copy)
    return y if device is None else to_device(y, device)


astype_to.__qualname__ = "astype"  # the namespace's astype, as a wrong call names it


fit_gradients_with(fit)
