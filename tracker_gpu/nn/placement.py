"""Placement: which array library, device and dtype arrays are created in or moved to.

`asarray` makes an array of a library (a namespace or a name: "numpy", "torch", "cupy",
"strict") on a device with a dtype; `to_numpy` brings any array back to NumPy; `place` moves
every floating array of a model at once (Flux's `gpu`, `cpu` and `f32` in one).
"""

import importlib

import array_api_compat
import numpy as np

from ..backend import (
    DTYPE_NAMES,
    device_of,
    half_dtype,
    is_array,
    is_cupy,
    is_cupy_device,
    isdtype,
    library_of_device,
    namespace_of,
)
from ..optim.tree import tree_map_with_path
from ..tracked import plain_value

__all__ = ["LIBRARIES", "asarray", "to_numpy", "place"]

LIBRARIES = {
    "numpy": "numpy",
    "torch": "array_api_compat.torch",
    "cupy": "array_api_compat.cupy",
    "strict": "array_api_strict",
    "array_api_strict": "array_api_strict",
}


NO_GPU = (
    "no usable GPU was found: CuPy is installed but cannot use a CUDA GPU here ({reason}); "
    "create the arrays with xp='numpy' (or 'torch'), or run where CuPy finds a GPU"
)


def _require_gpu():
    """Check that CuPy can use a GPU, before it is asked to allocate (without one, CuPy imports
    but fails on its first array with a driver error)."""
    cupy = importlib.import_module("cupy")
    try:
        usable, reason = bool(cupy.is_available()), "no CUDA device, or a driver too old for CuPy"
    except Exception as error:  # CuPy's own checks may raise instead of answering
        usable, reason = False, f"{type(error).__name__}: {error}"
    if not usable:
        raise RuntimeError(NO_GPU.format(reason=reason))


def _namespace(xp):
    """A namespace from a namespace or a library name ("numpy", "torch", "cupy", "strict")."""
    if not isinstance(xp, str):
        name = getattr(xp, "__name__", "")
        if name in ("cupy", "array_api_compat.cupy"):
            _require_gpu()
        return importlib.import_module(LIBRARIES[name]) if name in ("torch", "cupy") else xp
    if xp not in LIBRARIES:
        raise ValueError(f"unknown array library {xp!r}; choose one of {', '.join(LIBRARIES)}")
    try:
        if xp == "cupy":
            _require_gpu()
        return importlib.import_module(LIBRARIES[xp])
    except ImportError as error:
        raise ImportError(f"array library {xp!r} is not installed ({error})") from error


def _library_of_device(device, default):
    if is_cupy_device(device):
        _require_gpu()
    return library_of_device(device, default)


def _dtype_name(dtype):
    try:
        return np.dtype(dtype).name
    except TypeError:
        name = str(dtype).rsplit(".", 1)[-1].strip("'>")
        if name in DTYPE_NAMES or name in HALF_NAMES:
            return name
        raise TypeError(f"unknown dtype {dtype!r}; pass e.g. 'float32' or 'float64'") from None


HALF_NAMES = ("float16", "bfloat16")


def _dtype_in(target, name):
    """The dtype `name` of library `target`; a half-precision dtype the library lacks (bfloat16
    on array-api-strict or Dask) raises, naming the library."""
    if name in HALF_NAMES:
        return half_dtype(name, target)
    return getattr(target, name)


def asarray(values, *, xp=None, device=None, dtype=None):
    """NumPy `values` (or a list) as an array of library `xp` (a namespace or a name; else the
    library that owns `device`) on `device`, with `dtype` (a name or any library's dtype)."""
    values = np.asarray(values)
    target = _namespace(xp) if xp is not None else _library_of_device(device, np)
    name = _dtype_name(dtype if dtype is not None else values.dtype)
    if values.dtype.kind in "fc" and name not in HALF_NAMES and np.dtype(name).kind in "biu":
        raise ValueError(
            f"asarray: floating values cast to {name} would be truncated (a layer's weights to "
            "zeros, which no gradient then trains); parameters are floating: pass dtype="
            "'float32' (or float64, float16, bfloat16)"
        )
    if values.dtype.name == "bfloat16" and target is not np:  # ml_dtypes' is NumPy's alone
        values = values.astype(np.float32)  # exact: bfloat16 is float32 with fewer digits
    elif name == "float16" and values.dtype == np.float64:  # rounded once, here: PyTorch
        values = values.astype(np.float16)  # rounds float64 to float16 through float32, twice
    return target.asarray(values, dtype=_dtype_in(target, name), device=device)


def lossy_cast(values, dtype):
    """Why NumPy `values` loaded as `dtype` (a name or any library's dtype) would not be the
    values saved, beyond rounding (float64 into float32 rounds, as documented): complex into
    real drops the imaginary parts, a finite value too large becomes inf, an integer changes.
    None where the cast keeps them."""
    values, name = np.asarray(values), _dtype_name(dtype)
    into = np.dtype(half_dtype("bfloat16", np) if name == "bfloat16" else name)
    if values.dtype == into or values.size == 0:
        return None
    if values.dtype.kind == "c" and into.kind != "c":
        return f"complex values into {name} would lose their imaginary parts"
    with np.errstate(all="ignore"):
        cast = values.astype(into)
        if into.kind in "biu":
            changed = not np.array_equal(cast.astype(values.dtype), values)
            return f"values changed by the cast to {name}" if changed else None
        became_infinite = np.isinf(cast) & np.isfinite(values)
    if np.any(became_infinite):
        return f"values beyond the range of {name} would become inf"
    return None


def to_numpy(x):
    """The NumPy copy of an array of any library and device (a tracked one's value; refused
    while tg.compile records it, as `tg.data`)."""
    x = plain_value(x, "nn.to_numpy(x)")
    if isinstance(x, (np.ndarray, np.generic)):
        return np.asarray(x)
    if is_cupy(x):
        return x.get()
    if array_api_compat.is_torch_array(x):
        x = x.detach().cpu()
        if str(x.dtype) != "torch.bfloat16":
            return x.numpy()
        return x.float().numpy().astype(half_dtype("bfloat16", np))  # NumPy's from ml_dtypes
    cpu = namespace_of(x).__array_namespace_info__().default_device()
    return np.asarray(array_api_compat.to_device(x, cpu))


def place(model, *, xp=None, device=None, dtype=None):
    """`model` (or an array) with every array moved to library `xp` and `device`, and each
    real floating one cast to `dtype` (Flux's `gpu`, `cpu` and `f32` in one; a count of batches
    stays an integer). Unset arguments are kept as they are. An array found in several places
    (tied weights) is moved once: the places stay tied. An array moved to another library is a
    copy, sharing no memory with its source.
    """
    if dtype is not None and (name := _dtype_name(dtype)) not in HALF_NAMES:
        if np.dtype(name).kind != "f":
            raise ValueError(
                f"place casts the model's real floating arrays to dtype, and {name} is not a "
                "real floating dtype: pass float32, float64, float16 or bfloat16"
            )
    moved = {}

    def move(x):
        if not is_array(x):
            return x
        if id(x) not in moved:
            cast = dtype if isdtype(namespace_of(x), x.dtype, "real floating") else None
            moved[id(x)] = (x, _place_array(x, xp, device, cast))
        return moved[id(x)][1]

    return tree_map_with_path(lambda path, x: move(x), model)


def _place_array(x, xp, device, dtype):
    source = namespace_of(x)
    if xp is not None:
        target = _namespace(xp)
    else:
        target = _library_of_device(device, source) if device is not None else source
    name = _dtype_name(dtype if dtype is not None else x.dtype)
    _dtype_in(target, name)  # a dtype the target lacks raises before anything moves
    if target is not source:  # a copy: the libraries share host memory (from_numpy, views),
        # and a layer writes its running statistics in place
        return asarray(np.array(to_numpy(x), copy=True), xp=target, device=device, dtype=name)
    if device is not None and device_of(x) != device:
        x = array_api_compat.to_device(x, device)
    return x if name == _dtype_name(x.dtype) else source.astype(x, _dtype_in(source, name))
