"""The backend: which array library and device an array belongs to.

Namespaces are resolved once per array type and cached. NumPy 2 exposes the standard in its main
namespace, which is faster than a wrapper; other libraries go through array-api-compat. CuPy is
detected through `sys.modules`, so importing tracker_gpu never imports it.
"""

import contextlib
import importlib
import math
import sys

import array_api_compat
import numpy as np

__all__ = [
    "SCALARS",
    "HALF",
    "NUMPY_FLOATS",
    "namespace_of",
    "into",
    "added_into",
    "is_array",
    "is_cupy",
    "is_cupy_device",
    "full_exactly",
    "has_integer_array",
    "is_numpy_namespace",
    "is_lazy",
    "device_of",
    "on_accelerator",
    "on_device_of",
    "size_of",
    "writable",
    "memory_key",
    "owning",
    "shapes_agree",
    "check_same_library",
    "common_library",
    "widened",
    "check_same_device",
    "scatter_add",
    "DTYPE_NAMES",
    "library_of_device",
    "dtype_in",
    "dtype_name",
    "isdtype",
    "half_dtype",
]

# Python numbers, by exact type: NumPy scalars subclass float but are arrays here.
SCALARS = frozenset({int, float, bool, complex})
# NumPy's float32 and float64 in the machine's byte order: what hot paths test a dtype against
NUMPY_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_BY_TYPE = {np.ndarray: np, np.float64: np, np.float32: np}


def namespace_of(x):
    """The Array API namespace of a (plain) array, cached by type.

    >>> import numpy as np
    >>> namespace_of(np.ones(2)) is np
    True
    """
    xp = _BY_TYPE.get(type(x))
    if xp is None:
        xp = _resolve(x)
        _BY_TYPE[type(x)] = xp
    return xp


def into(xp, function, x):
    """`xp.<function>(x)`, written into `x` (an array the caller made and owns) where `xp` is
    NumPy and `x` is floating: a new array as large as a transformer's activations is memory
    to fault in at every step. Other libraries make a new one (CuPy and PyTorch from a pool).

    >>> import numpy as np
    >>> x = np.zeros(2)
    >>> into(np, "exp", x) is x
    True
    """
    if xp is np and type(x) is np.ndarray and x.dtype.kind == "f":
        return getattr(np, function)(x, out=x)
    return getattr(xp, function)(x)


def added_into(xp, y, b):
    """`y + b`, written into `y` (an array the caller made and owns) where `xp` is NumPy and
    the sum has `y`'s dtype and shape, as `into` writes a function's value.

    >>> import numpy as np
    >>> y = np.zeros((2, 2))
    >>> added_into(np, y, np.ones(2)) is y
    True
    """
    if (xp is np and type(y) is np.ndarray and type(b) is np.ndarray and y.dtype.kind == "f"
            and b.dtype == y.dtype and b.ndim <= y.ndim
            and y.shape[y.ndim - b.ndim :] == b.shape):  # fmt: skip
        return np.add(y, b, out=y)
    return y + b


def _resolve(x):
    if isinstance(x, (np.ndarray, np.generic)):
        return np
    try:
        return array_api_compat.array_namespace(x)
    except TypeError:
        raise TypeError(
            f"expected an array of an Array API library (NumPy, CuPy, PyTorch, ...), "
            f"got {type(x).__name__}; convert it with the library's asarray first"
        ) from None


def is_array(x):
    """True for an array of any library array-api-compat recognises (not Python scalars)."""
    t = type(x)
    if t in _BY_TYPE:
        return True
    if t in _NEVER_ARRAYS or isinstance(x, type):
        return False
    return isinstance(x, (np.ndarray, np.generic)) or array_api_compat.is_array_api_obj(x)


_NEVER_ARRAYS = SCALARS | {type(None), slice, type(Ellipsis), str}  # an index's parts too


def is_complex_dtype(dtype):
    """Whether `dtype` (of any library, or tg.broadcast's symbols' string) is complex: NumPy's
    and CuPy's by their kind, the others by their name (cheaper than the namespace's isdtype)."""
    kind = getattr(dtype, "kind", None)
    if kind is not None:
        return kind == "c"
    return "complex" in str(dtype)


def is_floating_dtype(dtype):
    """Whether `dtype` (of any library) is real or complex floating point: NumPy's and CuPy's by
    their kind (ml_dtypes' bfloat16 by its name), the others by their name."""
    kind = getattr(dtype, "kind", None)
    if kind is not None:
        return kind in "fc" or (kind == "V" and dtype.name in _EXTENSION_KINDS)
    name = str(dtype)
    return "float" in name or "complex" in name


def shapes_agree(shape, other):
    """Whether two shapes are equal where both sizes are known (Dask's shapes hold NaN for a
    size it does not know yet, after a boolean mask)."""
    return len(shape) == len(other) and all(
        m == n or m != m or n != n for m, n in zip(shape, other)
    )


def is_cupy(x):
    """True for a CuPy array; never imports CuPy."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def is_lazy(x):
    """True for a dask array: its values are computed on request, so reading one back (a check)
    would compute everything it depends on. Never imports Dask."""
    dask_array = sys.modules.get("dask.array")
    return dask_array is not None and isinstance(x, dask_array.Array)


def device_of(x):
    if type(x) is np.ndarray:  # the common case, without array-api-compat's tests
        return "cpu"
    return array_api_compat.device(x)


def on_device_of(x):
    """A context in which the library of `x` allocates and launches on `x`'s device: CuPy's
    current device (which its new arrays and kernels use) made `x`'s; nothing for libraries
    that place results by their inputs."""
    if type(x) is not np.ndarray and is_cupy(x):
        return x.device
    return _NOWHERE


_NOWHERE = contextlib.nullcontext()  # reusable: it holds nothing


def full_exactly(xp, shape, value, dtype=None, device=None):
    """`xp.full(shape, value, ...)`, a negative zero kept: CuPy writes a fill of any zero with a
    memset, which makes -0.0 +0.0 (and then `minimum(x, -0.0)` of a zero x differs from the
    plain expression's).

    >>> import numpy as np
    >>> float(full_exactly(np, (), -0.0))
    -0.0
    """
    where = {} if device is None else {"device": device}  # CuPy's own functions take none
    if type(value) is float and value == 0 and math.copysign(1.0, value) < 0:
        return -xp.zeros(shape, dtype=dtype, **where)
    return xp.full(shape, value, dtype=dtype, **where)


def has_integer_array(key):
    """Whether an indexing key holds an array that is not boolean (integer indices, which may
    name an element twice)."""
    parts = key if isinstance(key, tuple) else (key,)
    return any(is_array(k) and not namespace_of(k).isdtype(k.dtype, "bool") for k in parts)


def is_cupy_device(device):
    """True for a CuPy device (a CUDA device); never imports CuPy."""
    return type(device).__module__.split(".")[0] == "cupy"


def on_accelerator(x):
    """True for data in an accelerator's memory (a CuPy array, a PyTorch CUDA tensor), where
    reading a value on the host waits for the device."""
    if type(x) in _BY_TYPE and _BY_TYPE[type(x)] is np:
        return False
    if is_cupy(x):
        return True
    device = getattr(x, "device", None)
    return getattr(device, "type", "cpu") not in ("cpu", "meta")


def size_of(x):
    """The number of elements (a method, not an attribute, on PyTorch tensors)."""
    return array_api_compat.size(x)


def writable(x):
    """`x`, or a copy where `x` is a broadcast view (zero strides: read-only on NumPy, refused as
    a target of in-place writes by PyTorch). Gradients handed to the user own their memory."""
    if type(x) is np.ndarray:  # the common case, without lookups
        return x if 0 not in x.strides else np.asarray(x, copy=True)
    strides = getattr(getattr(x, "_array", x), "strides", None)  # array-api-strict wraps NumPy
    if strides is None and hasattr(x, "stride") and callable(x.stride):
        strides = x.stride()  # PyTorch
    if strides is None or 0 not in strides:
        return x
    xp = namespace_of(x)
    return xp.asarray(x, copy=True)


def owning(x):
    """`x`, or a copy of it where it is a view of another NumPy, CuPy or array-api-strict
    array's memory (other libraries' views are left as they are)."""
    inner = getattr(x, "_array", x)  # array-api-strict wraps a NumPy array
    if getattr(inner, "base", None) is None or not (
        isinstance(inner, np.ndarray) or is_cupy(inner)
    ):
        return x
    return namespace_of(x).asarray(x, copy=True)


def memory_key(x):
    """A key shared by arrays that may view the same memory: the buffer that owns it (NumPy,
    CuPy and array-api-strict), the storage's address (PyTorch), else the array itself."""
    if type(x) is not np.ndarray:
        inner = getattr(x, "_array", None)  # array-api-strict wraps a NumPy array
        if inner is not None:
            x = inner
        if hasattr(x, "untyped_storage"):
            return ("torch", x.untyped_storage().data_ptr())
    while getattr(x, "base", None) is not None:
        x = x.base
    return id(x)


def check_same_library(xp, x):
    """Refuse a plain array of another library than `xp` in one operation."""
    other = namespace_of(x)
    if other is not xp and not (is_numpy_namespace(other) and is_numpy_namespace(xp)):
        raise TypeError(
            f"cannot mix arrays of {_library(xp)} and {_library(other)} in one operation; "
            f"convert one of them, e.g. with {_library(xp)}'s asarray"
        )


def common_library(xp, x):
    """The namespace of an operation on arrays of `xp` and the array `x`: `xp`, or Dask's where
    one side is Dask and the other NumPy; other mixes of libraries raise."""
    other = namespace_of(x)
    if other is xp or (is_numpy_namespace(other) and is_numpy_namespace(xp)):
        return xp
    if _is_dask(other) and is_numpy_namespace(xp):
        return other
    if _is_dask(xp) and is_numpy_namespace(other):
        return xp
    check_same_library(xp, x)


def widened(xp, arrays):
    """`xp` (NumPy's), or Dask's where one of `arrays` is a dask array: the namespace that a
    plain operation whose first array is a NumPy array runs with."""
    if "dask.array" in sys.modules:
        for a in arrays:
            if is_lazy(a):
                return namespace_of(a)
    return xp


def check_same_device(arrays):
    """Refuse arrays on different devices in one operation, naming both devices."""
    first = device_of(arrays[0])
    for a in arrays[1:]:
        other = device_of(a)
        if other != first:
            raise ValueError(
                f"arrays on different devices in one operation: {first} and {other}; "
                f"move one with to_device(x, device) (a tracked op) first"
            )


def is_numpy_namespace(xp):
    """Whether `xp` is NumPy's namespace (NumPy itself, or array-api-compat's wrapper)."""
    return xp is np or getattr(xp, "__name__", "") == "array_api_compat.numpy"


def _is_dask(xp):
    return getattr(xp, "__name__", "") == "array_api_compat.dask.array"


def _library(xp):
    return getattr(xp, "__name__", repr(xp)).replace("array_api_compat.", "")


def own_scatter(xp, z):
    """Whether `scatter_add` adds into `z` with its library's own scatter (NumPy, CuPy,
    PyTorch), not with a one-hot product over all of `z`'s elements."""
    return xp is np or is_cupy(z) or array_api_compat.is_torch_array(z)


def scatter_add(xp, z, key, values):
    """`z[key] += values` with repeated indices accumulating; returns the result.

    NumPy, CuPy and PyTorch use their own scatter (`own_scatter`); other libraries a one-hot
    product, which the standard can express (it has no scatter).
    """
    if xp is np:
        if not _add_at_flat(z, key, values):
            np.add.at(z, key, values)
        return z
    if is_cupy(z):
        import cupyx

        wide = _CUPY_SCATTER_WIDER.get(z.dtype.name)
        if wide is None:
            _by_real_parts(cupyx.scatter_add, z, key, values)
        else:
            _scatter_widened(cupyx.scatter_add, z, key, values, wide)
        return z
    shape = z.shape
    positions = xp.reshape(xp.arange(size_of(z), device=device_of(z)), shape)[key]
    positions = xp.reshape(positions, (-1,))
    values = xp.reshape(values, (-1,))
    if array_api_compat.is_torch_array(z):
        return xp.reshape(z, (-1,)).index_add(0, positions, values).reshape(shape)
    onehot = positions[:, None] == xp.arange(size_of(z), device=device_of(z))[None, :]
    return z + xp.reshape(one_hot_sum(xp, onehot, values), shape)


def one_hot_sum(xp, hits, values):
    """`hits^T @ values`, summed over the first axis (`hits` boolean, (m, n); `values` (m,
    ...)): the sums of `values` by the position each hits, as a product with the one-hot
    matrix, which the standard can express. A product would spread an inf or nan to every
    position (0 * inf is nan): the finite values are summed so, and the non-finite ones are
    counted by position and put where they go (inf and -inf together are nan, as in a sum)."""
    if is_complex_dtype(values.dtype):
        parts = (one_hot_sum(xp, hits, xp.real(values)), one_hot_sum(xp, hits, xp.imag(values)))
        real_part, imag_part = (xp.astype(p, values.dtype) for p in parts)
        return real_part + imag_part * xp.asarray(1j, dtype=values.dtype, device=device_of(hits))
    ones = xp.astype(hits, values.dtype)
    zero = xp.zeros((), dtype=values.dtype, device=device_of(values))

    def summed(v):
        return xp.tensordot(ones, v, axes=([0], [0]))

    def reached(found):
        return summed(xp.astype(found, values.dtype)) > 0

    if xp.isdtype(values.dtype, "bool"):  # NumPy's add of booleans: True where any is
        return summed(xp.astype(values, xp.int64)) > 0
    if not xp.isdtype(values.dtype, "real floating"):  # integers: every value is finite
        return summed(values)
    total = summed(xp.where(xp.isfinite(values), values, zero))
    up, down = reached(values == float("inf")), reached(values == -float("inf"))
    nan = reached(xp.isnan(values)) | (up & down)
    total = xp.where(up, float("inf"), xp.where(down, -float("inf"), total))
    return xp.where(nan, float("nan"), total)


# elements of the flat indices `_add_at_flat` makes at a time (8 bytes each)
INDICES_AT_ONCE = 1 << 20


def _add_at_flat(z, key, values):
    """`np.add.at(z, key, values)` for a key of integer arrays on `z`'s leading axes (an
    embedding's gradient, `take`'s), as `add.at` over the single elements of flattened `z` and
    `values`: each element receives its contributions in the same order (the broadcast indices'
    C order), so the result is the same bit for bit, six or more times sooner (NumPy's `add.at`
    pays per index, and more for several index arrays). False, with nothing done, for any other
    key, an index out of bounds (`add.at` raises), or complex values (the nan `add.at` makes of
    an infinite sum is of another sign element by element)."""
    keys = key if type(key) is tuple else (key,)
    if not (keys and len(keys) <= z.ndim and type(values) is np.ndarray
            and values.dtype == z.dtype and z.dtype.kind == "f" and z.flags.c_contiguous
            and z.flags.writeable and z.size
            and all(type(k) is np.ndarray and k.dtype.kind in "iu" for k in keys)):  # fmt: skip
        return False
    try:
        shape = np.broadcast_shapes(*(k.shape for k in keys))
    except ValueError:
        return False
    lead, trail = z.shape[: len(keys)], z.shape[len(keys) :]
    if values.shape != shape + trail or not math.prod(shape):
        return False
    flat = np.zeros(shape, np.intp)
    for k, n in zip(keys, lead):
        if k.min() < -n or k.max() >= n:
            return False
        flat *= n
        flat += k.astype(np.intp, copy=False) % n  # a negative index counted from the end
    width = math.prod(trail)
    flat, into, columns = flat.reshape(-1), z.reshape(-1), np.arange(width, dtype=np.intp)
    values = values.reshape(len(flat), width)
    step = max(1, INDICES_AT_ONCE // width)
    for start in range(0, len(flat), step):  # in order: each element's sum in add.at's order
        part = slice(start, start + step)
        np.add.at(into, (flat[part, None] * width + columns).reshape(-1), values[part].reshape(-1))
    return True


# CuPy's atomic add takes none of these: each scatters in the wider type, whose sums wrap to
# the same values modulo the narrow type's range (its width divides the wider one's)
_CUPY_SCATTER_WIDER = {
    "bool": "int32", "int8": "int32", "int16": "int32", "uint8": "uint32", "uint16": "uint32",
}  # fmt: skip


def _scatter_widened(scatter, z, key, values, wide):
    """`scatter(z, key, values)` (in place) done in dtype `wide`: a bool `z` ends as NumPy's
    `add.at` leaves it (an element is True where it was or where a True was added), an integer
    `z` as its sums wrapped into its own type."""
    total = z.astype(wide)
    scatter(total, key, values.astype(wide))
    z[...] = total != 0 if z.dtype == bool else total.astype(z.dtype)


def _by_real_parts(scatter, z, key, values):
    """`scatter(z, key, values)` (in place), a complex `z` as two scatters into the views of its
    real and imaginary parts: CuPy's atomic add refuses complex dtypes. Complex addition is
    addition of the parts, so each element's sum is the same."""
    if not is_complex_dtype(z.dtype):
        scatter(z, key, values)
        return
    scatter(z.real, key, values.real)
    scatter(z.imag, key, values.imag)


# --- dtypes and devices across libraries
DTYPE_NAMES = (
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float32 float64 complex64 complex128"
).split()


def library_of_device(device, default):
    """The namespace of the library that owns `device` (`default` for None or "cpu")."""
    if device is None or isinstance(device, str) and device == "cpu":
        return default
    if is_cupy_device(device):
        return importlib.import_module("array_api_compat.cupy")
    module = type(device).__module__.split(".")[0]
    if module == "array_api_strict":
        return sys.modules["array_api_strict"]
    if module == "torch":
        return array_api_compat.array_namespace(sys.modules["torch"].empty(0))
    return default


def dtype_in(xp, dtype):
    """`dtype` as the dtype object of library `xp` (dtypes of other libraries are translated)."""
    if dtype is None:
        return None
    name = dtype_name(dtype)
    return getattr(xp, name) if name and hasattr(xp, name) else dtype


def dtype_name(dtype):
    """The standard's name of a dtype of any library ("float32"), or None."""
    # NumPy's `dtype.name` is Python, about 1.8 us, and the rules ask it at every operation:
    # NumPy's dtypes are looked up in a table (theirs alone: other libraries' dtypes compare
    # with them, and array-api-strict's warn that they do)
    if not isinstance(dtype, np.dtype):
        return _dtype_name(dtype)
    name = _NAMES.get(dtype)
    if name is None:
        if len(_NAMES) >= 256:  # dtypes made at run time (structured ones) are not kept forever
            _NAMES.clear()
        name = _NAMES[dtype] = dtype.name
    return name


_NAMES = {}  # NumPy dtype -> its name; equal dtypes have one name


def _dtype_name(dtype):
    try:
        return np.dtype(dtype).name
    except TypeError:
        text = str(dtype).rsplit(".", 1)[-1].strip("'>")
        return text if text in DTYPE_NAMES or text in HALF else None


# The floating dtypes that NumPy knows only through the ml_dtypes package (as JAX and CuPy use
# them): NumPy's isdtype refuses them (a TypeError), so they are told by name.
_EXTENSION_KINDS = {"bfloat16": "real floating"}


def isdtype(xp, dtype, kind):
    """`xp.isdtype(dtype, kind)`, also for NumPy's bfloat16 from ml_dtypes (real floating),
    which NumPy's own isdtype refuses.

    >>> import numpy as np
    >>> isdtype(np, np.dtype("float32"), ("real floating", "complex floating"))
    True
    """
    if xp is np:  # NumPy's isdtype is Python, ~2.5 us a call: every operation asks it
        try:
            return _NUMPY_KINDS[dtype, kind]
        except KeyError:
            found = _NUMPY_KINDS[dtype, kind] = _isdtype(xp, dtype, kind)
            return found
        except TypeError:  # a kind given as a list: not a key
            pass
    return _isdtype(xp, dtype, kind)


_NUMPY_KINDS = {}  # (dtype, kind) -> NumPy's answer


def _isdtype(xp, dtype, kind):
    try:
        return xp.isdtype(dtype, kind)
    except TypeError:
        found = _EXTENSION_KINDS.get(getattr(dtype, "name", None))
        if found is None:
            raise
        kinds = (kind,) if isinstance(kind, str) else tuple(kind)
        return found in kinds or (found != "bool" and "numeric" in kinds)


HALF = ("float16", "bfloat16")  # the half-precision floating dtypes, by name


def finfo(xp, dtype):
    """`xp.finfo(dtype)`, also for NumPy's bfloat16 from ml_dtypes, which NumPy's own finfo
    refuses.

    >>> float(finfo(np, np.dtype("float16")).eps)
    0.0009765625
    """
    if xp is np and dtype_name(dtype) == "bfloat16":
        import ml_dtypes  # present: NumPy has a bfloat16 only through it

        return ml_dtypes.finfo(dtype)
    return xp.finfo(dtype)


def half_dtype(name, xp):
    """The dtype `name` ("float16" or "bfloat16") of library `xp`: its attribute, or NumPy's
    bfloat16 from ml_dtypes; a library without it raises, naming the library.

    >>> half_dtype("float16", np)
    <class 'numpy.float16'>
    """
    found = getattr(xp, name, None)
    if found is not None:
        return found
    if name == "bfloat16" and is_numpy_namespace(xp):
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(
                "bfloat16 on NumPy needs the ml_dtypes package (pip install ml_dtypes), which "
                "NumPy uses for it"
            ) from None
        return ml_dtypes.bfloat16
    raise TypeError(
        f"{_library(xp)} has no {name} dtype; use float32 there, or a library that has it "
        "(NumPy with ml_dtypes or PyTorch for bfloat16, NumPy, CuPy or PyTorch for float16)"
    )
