"""The Array API namespace over tracked arrays (standard version 2024.12, with `linalg` and
`fft`), and `special`: SciPy's, PyTorch's and Julia's special functions.

`x.__array_namespace__()` (and so `array_api_compat.array_namespace(x)`) returns a namespace
bound to the library of `x`'s data: its dtypes are that library's, and its creation functions
create there. This module itself is the namespace bound to NumPy. Every function accepts tracked
and plain arrays alike: it records on the tape when an argument is tracked.

>>> import numpy as np, array_api_compat, tracker_gpu as tg
>>> x = tg.param(np.array([1.0, 2.0]))
>>> xp = array_api_compat.array_namespace(x)
>>> print(f"{float(xp.sum(xp.exp(x) * xp.ones_like(x))):.6f}")
10.107338
"""

import builtins as _builtins
import functools as _functools
import math as _math
import sys as _sys
import types as _types

import array_api_compat as _compat
import numpy as _np

from . import creation as _creation
from . import tracked as _tracked
from .rules import einsum as _einsum
from .rules import elementwise as _elementwise
from .rules import fft as _fft_rules
from .rules import indexed as _indexed
from .rules import linalg as _linalg_rules
from .rules import manipulation as _manipulation
from .rules import nn as _nn
from .rules import numpy_arrays as _numpy_arrays
from .rules import numpy_math as _numpy_math
from .rules import reductions as _reductions
from .rules import shape as _shape
from .rules import special as _special_rules
from .rules import special_julia as _special_julia
from .rules.special_libraries import TORCH_NAMES as _TORCH_NAMES

# Every module-level name that is not an underscore's is the namespace's: imports go under one.

__array_api_version__ = "2024.12"

_SHARED = {name: getattr(_elementwise, name) for name in _elementwise.__all__}
_SHARED.update(_elementwise.PLAIN_FUNCTIONS)
_SHARED.update({name: getattr(_manipulation, name) for name in _manipulation.__all__})
# NumPy's functions beyond the standard that autograd users reach for (np.gradient is
# `numerical_gradient`: `tg.gradient` is Tracker's transform).
_SHARED.update({n: getattr(m, n) for m in (_numpy_arrays, _numpy_math) for n in m.__all__})


def _names(module, names):
    return {name: getattr(module, name) for name in names.split() if hasattr(module, name)}


_SHARED.update(_names(_reductions, "sum prod mean max min var std sumabs2"))
_SHARED.update(_names(_nn, "sigmoid relu softmax logsoftmax logsumexp"))
_SHARED.update(
    _names(
        _shape, "reshape permute_dims expand_dims squeeze flip broadcast_to concat stack to_device"
    )
)


def _viewing(primitive):
    """The namespace's `primitive`, which moves the elements of its argument (a reshape, a
    transpose, a flip): where the library's result is a view, a write into the tracked result
    reaches the tracked argument too (`indexed.viewed`), laid back out by the pullback."""
    back = primitive.vjps[0]

    @_functools.wraps(primitive)
    def function(x, /, *args, **kw):
        out = primitive(x, *args, **kw)
        if kw.get("copy") is True:
            return out
        return _indexed.viewed(x, out, lambda v: back(v, None, x, *args, **kw))

    return function


_SHARED.update(
    {
        name: _viewing(_SHARED[name])
        for name in "reshape permute_dims expand_dims squeeze flip".split()
    }
)
_SHARED["astype"] = _shape.astype_to  # astype(x, dtype, device=d): the gradient back to x's
# The standard's linalg functions that also live at the top, and Tracker's extras.
_SHARED.update(
    _names(_linalg_rules, "matmul matrix_transpose tensordot vecdot kron diagm logdet outer")
)
_SHARED["matrix_transpose"] = _viewing(_SHARED["matrix_transpose"])
_SHARED.update(tril=_creation.tril, triu=_creation.triu, einsum=_einsum.einsum)
_CONSTANTS = dict(e=_math.e, pi=_math.pi, inf=_math.inf, nan=_math.nan, newaxis=None)

linalg = _types.ModuleType("tracker_gpu.linalg", "The standard's linalg extension, differentiable.")
linalg.__dict__.update({name: getattr(_linalg_rules, name) for name in _linalg_rules.__all__})

special = _types.ModuleType(
    "tracker_gpu.special",
    "Special functions, differentiable: SciPy's and torch.special's names, and Julia's "
    "(DiffRules') others; values from the array's own library.",
)
special.__dict__.update(
    {n: getattr(m, n) for m in (_special_rules, _special_julia) for n in m.__all__}
)
special.__all__ = sorted(_special_rules.__all__ + _special_julia.__all__)


def _special_for(xp):
    """`special` as library `xp` has it: the functions its library lacks are left out, so that
    a client that looks for `xp.special.<name>` (SciPy) takes its own generic way instead."""
    if not (_compat.is_torch_namespace(xp) or _without_special_functions(xp)):
        return special
    has = _TORCH_NAMES if _compat.is_torch_namespace(xp) else ()
    lacking = set(_special_rules.__all__) - set(has)
    module = _types.ModuleType(special.__name__, special.__doc__)
    module.__all__ = [name for name in special.__all__ if name not in lacking]
    module.__dict__.update({name: getattr(special, name) for name in module.__all__})
    module.__getattr__ = __getattr__
    return module


def _without_special_functions(xp):
    """Whether `xp` is a library with no special functions of its own (array-api-strict)."""
    known = (_compat.is_numpy_namespace, _compat.is_cupy_namespace,
             _compat.is_dask_namespace, _compat.is_torch_namespace)  # fmt: skip
    return not _builtins.any(is_it(xp) for is_it in known)  # `any` here is the namespace's


_FFT_TRANSFORMS = {
    name: getattr(_fft_rules, name) for name in _fft_rules.__all__ if not name.endswith("freq")
}
_FFT = {}


def _fft_for(xp):
    """The standard's fft extension, its frequencies created by library `xp` (cached)."""
    module = _FFT.get(xp)
    if module is None:
        module = _types.ModuleType(
            "tracker_gpu.fft", "The standard's fft extension, differentiable."
        )
        module.__dict__.update(_FFT_TRANSFORMS, **_fft_rules.bound_functions(xp))
        module.__getattr__ = __getattr__
        _FFT[xp] = module
    return module


def _missing(name):
    raise AttributeError(
        f"tracker_gpu has no differentiable {name!r}; for its value without a gradient, call the "
        f"array library's own function on tg.data(x)"
    )


def __getattr__(name):  # PEP 562: a clear error for what the namespace does not differentiate
    _missing(name)


# The rules whose forward is the library's operator: where its operators do not promote as the
# standard's functions do (a 0-d tensor's dtype gives way in PyTorch's), the namespace's
# functions promote first.
_OPERATOR_RULES = "add subtract multiply divide pow remainder".split()


def _contents(xp):
    contents = dict(_SHARED, **_CONSTANTS, linalg=linalg, fft=_fft_for(xp))
    contents.update(special=_special_for(xp))
    if _compat.is_torch_namespace(xp):
        promoted = _elementwise.standard_promotion
        contents.update({name: promoted(_SHARED[name]) for name in _OPERATOR_RULES})
    contents.update(__getattr__=__getattr__)
    contents.update(_creation.bound_functions(xp))
    contents.update(__array_api_version__=__array_api_version__)
    contents.update(__array_namespace_info__=xp.__array_namespace_info__)
    return contents


_BOUND = {_np: _sys.modules[__name__]}


def namespace_for(xp):
    """The tracked namespace bound to array library `xp` (cached)."""
    ns = _BOUND.get(xp)
    if ns is None:
        name = getattr(xp, "__name__", "array library").replace("array_api_compat.", "")
        ns = _types.ModuleType(f"tracker_gpu.namespace[{name}]", __doc__)
        ns.__dict__.update(_contents(xp))
        _BOUND[xp] = ns
    return ns


globals().update(_contents(_np))
_tracked.serve_namespaces(namespace_for)  # after the contents: their names are hinted
__all__ = sorted(name for name in _contents(_np) if not name.startswith("_")) + ["namespace_for"]
linalg.__getattr__ = special.__getattr__ = __getattr__
