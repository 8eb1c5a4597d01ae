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

import builtins
import math
import sys
import types

import array_api_compat
import numpy as np

from . import creation, tracked
from .rules import (
    einsum,
    elementwise,
    manipulation,
    nn,
    numpy_arrays,
    numpy_math,
    reductions,
    shape,
    special_julia,
)
from .rules import fft as fft_rules
from .rules import linalg as linalg_rules
from .rules import special as special_rules
from .rules.special_libraries import TORCH_NAMES

__array_api_version__ = "2024.12"

_SHARED = {name: getattr(elementwise, name) for name in elementwise.__all__}
_SHARED.update(elementwise.PLAIN_FUNCTIONS)
_SHARED.update({name: getattr(manipulation, name) for name in manipulation.__all__})
# NumPy's functions beyond the standard that autograd users reach for (np.gradient is
# `numerical_gradient`: `tg.gradient` is Tracker's transform).
_SHARED.update({n: getattr(m, n) for m in (numpy_arrays, numpy_math) for n in m.__all__})


def _names(module, names):
    return {name: getattr(module, name) for name in names.split() if hasattr(module, name)}


_SHARED.update(_names(reductions, "sum prod mean max min var std sumabs2"))
_SHARED.update(_names(nn, "sigmoid relu softmax logsoftmax logsumexp"))
_SHARED.update(
    _names(
        shape, "reshape permute_dims expand_dims squeeze flip broadcast_to concat stack to_device"
    )
)
_SHARED["astype"] = shape.astype_to  # astype(x, dtype, device=d): the gradient back to x's
# The standard's linalg functions that also live at the top, and Tracker's extras.
_SHARED.update(
    _names(linalg_rules, "matmul matrix_transpose tensordot vecdot kron diagm logdet outer trace")
)
_SHARED.update(tril=creation.tril, triu=creation.triu, einsum=einsum.einsum)
_CONSTANTS = dict(e=math.e, pi=math.pi, inf=math.inf, nan=math.nan, newaxis=None)

linalg = types.ModuleType("tracker_gpu.linalg", "The standard's linalg extension, differentiable.")
linalg.__dict__.update({name: getattr(linalg_rules, name) for name in linalg_rules.__all__})

special = types.ModuleType(
    "tracker_gpu.special",
    "Special functions, differentiable: SciPy's and torch.special's names, and Julia's "
    "(DiffRules') others; values from the array's own library.",
)
special.__dict__.update(
    {n: getattr(m, n) for m in (special_rules, special_julia) for n in m.__all__}
)
special.__all__ = sorted(special_rules.__all__ + special_julia.__all__)


def _special_for(xp):
    """`special` as library `xp` has it: the functions its library lacks are left out, so that
    a client that looks for `xp.special.<name>` (SciPy) takes its own generic way instead."""
    if not (array_api_compat.is_torch_namespace(xp) or _without_special_functions(xp)):
        return special
    has = TORCH_NAMES if array_api_compat.is_torch_namespace(xp) else ()
    lacking = set(special_rules.__all__) - set(has)
    module = types.ModuleType(special.__name__, special.__doc__)
    module.__all__ = [name for name in special.__all__ if name not in lacking]
    module.__dict__.update({name: getattr(special, name) for name in module.__all__})
    module.__getattr__ = __getattr__
    return module


def _without_special_functions(xp):
    """Whether `xp` is a library with no special functions of its own (array-api-strict)."""
    known = (array_api_compat.is_numpy_namespace, array_api_compat.is_cupy_namespace,
             array_api_compat.is_dask_namespace, array_api_compat.is_torch_namespace)  # fmt: skip
    return not builtins.any(is_it(xp) for is_it in known)  # `any` here is the namespace's


_FFT_TRANSFORMS = {
    name: getattr(fft_rules, name) for name in fft_rules.__all__ if not name.endswith("freq")
}
_FFT = {}


def _fft_for(xp):
    """The standard's fft extension, its frequencies created by library `xp` (cached)."""
    module = _FFT.get(xp)
    if module is None:
        module = types.ModuleType(
            "tracker_gpu.fft", "The standard's fft extension, differentiable."
        )
        module.__dict__.update(_FFT_TRANSFORMS, **fft_rules.bound_functions(xp))
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
    if array_api_compat.is_torch_namespace(xp):
        promoted = elementwise.standard_promotion
        contents.update({name: promoted(_SHARED[name]) for name in _OPERATOR_RULES})
    contents.update(__getattr__=__getattr__)
    contents.update(creation.bound_functions(xp))
    contents.update(__array_api_version__=__array_api_version__)
    contents.update(__array_namespace_info__=xp.__array_namespace_info__)
    return contents


_BOUND = {np: sys.modules[__name__]}


def namespace_for(xp):
    """The tracked namespace bound to array library `xp` (cached)."""
    ns = _BOUND.get(xp)
    if ns is None:
        name = getattr(xp, "__name__", "array library").replace("array_api_compat.", "")
        ns = types.ModuleType(f"tracker_gpu.namespace[{name}]", __doc__)
        ns.__dict__.update(_contents(xp))
        _BOUND[xp] = ns
    return ns


tracked.serve_namespaces(namespace_for)
globals().update(_contents(np))
__all__ = sorted(name for name in _contents(np) if not name.startswith("_")) + ["namespace_for"]
linalg.__getattr__ = special.__getattr__ = __getattr__
