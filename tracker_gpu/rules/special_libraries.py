"""Where the values of `tg.special` come from: each array library's own special functions.

SciPy's `scipy.special` for NumPy (imported on first use: the `special` extra), `torch.special`
for PyTorch, `cupyx.scipy.special` for CuPy, and for Dask the function of its chunks' library
applied chunk by chunk (`dask.array.elemwise`: the functions are elementwise). A library that
lacks a function raises a `NotImplementedError` naming the function and the library; nothing is
computed by hand here, and nothing goes through the host behind an array's back. So the values
are the library's, at the edges too (CuPy's `j0(inf)` is 0, SciPy's nan: the README lists them).

SciPy's own Array API dispatch (`SCIPY_ARRAY_API=1`) reaches the same libraries, but only when
the variable is set before SciPy is first imported (a process-wide switch that changes SciPy for
the user too), and where a library lacks a function it quietly converts the arrays to NumPy
(which fails on a GPU): so the choice is made here, per array.

>>> import numpy as np
>>> library_function("erf", np.array([0.0]))(np.array([0.0]))
array([0.])
"""

import importlib
import sys

import array_api_compat

__all__ = ["library_function", "library_name", "SCIPY_NAMES", "TORCH_NAMES"]

# tg.special's name -> SciPy's (and CuPy's) where it differs; "numpy." for NumPy's own.
SCIPY_NAMES = {"dawson": "dawsn", "sinc": "numpy.sinc"}
# tg.special's name -> torch.special's; the names absent here are missing from PyTorch.
TORCH_NAMES = {
    **{n: n for n in "erf erfc erfinv erfcx gammaln digamma polygamma multigammaln".split()},
    **{n: n for n in "gammainc gammaincc ndtr log_ndtr ndtri logit expit xlogy xlog1py".split()},
    **{n: n for n in "entr i0 i0e i1 i1e sinc zeta".split()},
    **{n: f"bessel_{n}" for n in "j0 j1 y0 y1".split()},
}
# Functions of several values that SciPy returns as a tuple: (SciPy's name, which one).
PICKED = {
    "airyai": ("airy", 0),
    "airyaiprime": ("airy", 1),
    "airybi": ("airy", 2),
    "airybiprime": ("airy", 3),
}

# Functions of an integer order `(n, x)` that get the order as an array: CuPy's `polygamma`
# compares it with 0 elementwise, which a Python int answers with a bool.
ARRAY_ORDERS = {"polygamma"}

_CACHE = {}


def library_name(x):
    """The name of the library of array `x`, as error messages say it."""
    for test, name in _LIBRARIES:
        if test(x):
            return name
    return type(x).__module__.partition(".")[0] or type(x).__name__


def library_function(name, x):
    """`tg.special`'s function `name` from the library of array `x` (cached per library)."""
    key = (type(x), name)
    f = _CACHE.get(key)
    if f is None:
        f = _CACHE[key] = _resolve(name, x)
    return f


def _resolve(name, x):
    if array_api_compat.is_numpy_array(x):
        return _scipy_function(name, "scipy.special", "NumPy (through scipy.special)")
    if array_api_compat.is_torch_array(x):
        return _torch_function(name)
    if array_api_compat.is_cupy_array(x):
        return _scipy_function(name, "cupyx.scipy.special", "CuPy (cupyx.scipy.special)")
    if array_api_compat.is_dask_array(x):
        return _dask_function(name, x)
    traced = _traced_function(name, x)
    if traced is not None:
        return traced
    raise NotImplementedError(
        f"tg.special.{name}: {library_name(x)} has no special functions; convert the array to "
        f"NumPy, PyTorch, CuPy or Dask first"
    )


def _traced_function(name, x):
    """The function of a namespace that provides its own (`tg.broadcast`'s traced values:
    `special_function(name)`), or None."""
    namespace = getattr(x, "__array_namespace__", None)
    provider = getattr(namespace(), "special_function", None) if namespace else None
    return provider(name) if provider is not None else None


def _scipy_function(name, module, library):
    """The function of SciPy (or of CuPy's SciPy) called `name` there."""
    scipy_name, pick = PICKED.get(name, (SCIPY_NAMES.get(name, name), None))
    if scipy_name.startswith("numpy."):
        module, scipy_name = _numpy_of(module), scipy_name.removeprefix("numpy.")
    f = getattr(_import(module, name, library), scipy_name, None)
    if f is None:
        raise NotImplementedError(f"tg.special.{name}: {library} has no {scipy_name}")
    if name in ARRAY_ORDERS:
        return _with_array_order(f)
    return f if pick is None else _picking(f, pick)


def _numpy_of(module):
    return "cupy" if module.startswith("cupyx") else "numpy"


def _import(module, name, library):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        hint = 'pip install "tracker-gpu[special]"' if module == "scipy.special" else ""
        raise NotImplementedError(
            f"tg.special.{name} on {library} needs {module}, which cannot be imported ({e}); {hint}"
        ) from e


def _with_array_order(f):
    """`f(n, x)`, given its order `n` as a 0-d array of `x`'s library on `x`'s device."""

    def with_array_order(n, x):
        xp = array_api_compat.array_namespace(x)
        return f(xp.asarray(n, device=array_api_compat.device(x)), x)

    return with_array_order


def _picking(f, i):
    def picked(*args):
        return f(*args)[i]

    return picked


def _torch_function(name):
    torch_name = TORCH_NAMES.get(name)
    if torch_name is None:
        raise NotImplementedError(
            f"tg.special.{name}: PyTorch (torch.special) has no {name}; compute it on NumPy, "
            f"CuPy or Dask arrays"
        )
    return getattr(sys.modules["torch"].special, torch_name)


def _dask_function(name, x):
    """The function of the library of `x`'s chunks, applied chunk by chunk."""
    chunk = library_function(name, x._meta)
    elemwise = importlib.import_module("dask.array.core").elemwise

    def chunkwise(*args):
        dtype = next(a.dtype for a in args if array_api_compat.is_dask_array(a))
        return elemwise(chunk, *args, dtype=dtype if dtype.kind in "fc" else "float64")

    return chunkwise


_LIBRARIES = (
    (array_api_compat.is_numpy_array, "NumPy"),
    (array_api_compat.is_torch_array, "PyTorch"),
    (array_api_compat.is_cupy_array, "CuPy"),
    (array_api_compat.is_dask_array, "Dask"),
    (lambda x: type(x).__module__.startswith("array_api_strict"), "array-api-strict"),
)
