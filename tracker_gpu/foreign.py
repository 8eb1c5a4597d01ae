"""What users of NumPy and PyTorch reach for on a tracked array, and what to write instead: the
messages of the errors for NumPy's functions (`np.exp(x)`) and for methods and attributes
outside the Array API standard (`x.sum()`, `x.numpy()`).

>>> import tracker_gpu as tg
>>> "write tg.sum(x) instead" in str(missing_attribute_error("sum", tg.namespace))
True
"""

import sys

__all__ = [
    "numpy_function_error",
    "torch_function_error",
    "standard_equivalent",
    "missing_attribute_error",
    "declare_hints",
    "is_hint",
]

# NumPy's names of the standard's functions, where they differ.
_STANDARD_NAMES = {
    "absolute": "abs", "power": "pow", "true_divide": "divide", "conjugate": "conj",
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arctan2": "atan2",
    "arcsinh": "asinh", "arccosh": "acosh", "arctanh": "atanh", "concatenate": "concat",
    "transpose": "permute_dims", "amax": "max", "amin": "min", "cumsum": "cumulative_sum",
    "cumprod": "cumulative_prod", "invert": "bitwise_invert", "left_shift":
    "bitwise_left_shift", "right_shift": "bitwise_right_shift", "gradient": "numerical_gradient",
}  # fmt: skip


# NumPy's names of the standard's linear algebra functions, where they differ.
_LINALG_NAMES = {"norm": "vector_norm"}


def numpy_function_error(name, namespace):
    """The error for NumPy's function `name` called on a tracked array, naming what to call
    instead (where the tracked `namespace` has it, or its `linalg`: `np.linalg.det`)."""
    return _function_error("NumPy", name, standard_equivalent(name, namespace))


# PyTorch's own names of the standard's functions, where they differ from the standard's and
# NumPy's (`_STANDARD_NAMES` maps the names PyTorch shares with NumPy: `cumsum`, `amax`...);
# its `torch.linalg.det` is named `linalg_det`.
_TORCH_NAMES = {"cat": "concat", "clamp": "clip", "mm": "matmul", "bmm": "matmul"}


def torch_function_error(name, namespace):
    """The error for PyTorch's function `name` (`torch.sin`, `torch.nn.functional.relu`)
    called on a tracked array, naming what to call instead."""
    if name.startswith("linalg_"):
        found = standard_equivalent(name.removeprefix("linalg_"), namespace)
    else:
        found = standard_equivalent(_TORCH_NAMES.get(name, name), namespace)
    if found is None:  # the layers' functions and losses (no import: nn builds on this)
        nn = sys.modules.get(f"{__package__}.nn")
        in_nn = _TORCH_NN_NAMES.get(name, name)
        found = f"nn.{in_nn}" if callable(getattr(nn, in_nn, None)) else None
    return _function_error("PyTorch", name, found)


# PyTorch's names of `tracker_gpu.nn`'s functions, where they differ (README's table)
_TORCH_NN_NAMES = {"cross_entropy": "logitcrossentropy", "nll_loss": "nll", "mse_loss": "mse",
                   "l1_loss": "mae", "smooth_l1_loss": "smoothl1",
                   "binary_cross_entropy": "binarycrossentropy",
                   "binary_cross_entropy_with_logits": "logitbinarycrossentropy",
                   "kl_div": "kldivergence", "leaky_relu": "leakyrelu", "silu": "swish",
                   "log_softmax": "logsoftmax"}  # fmt: skip


# NumPy's norm is a vector's or a matrix's by its arguments; the standard has one of each.
_NORM_HINT = (
    "call tg.linalg.vector_norm(x, ord=...) for a vector's norm (NumPy's norm of a matrix "
    "without ord is the vector norm of its elements, Frobenius'), or tg.linalg.matrix_norm(x, "
    "ord=...) for a matrix's (NumPy's norm of a matrix with ord 2, 1, inf, 'nuc'...): both record "
    "it"
)


def _function_error(library, name, found):
    if found == "linalg.vector_norm" and name == "norm":
        hint = _NORM_HINT
    elif found is not None and found.startswith("nn."):
        hint = f"call tg.{found}(...) instead (`tracker_gpu.nn`): it records"
    elif found is not None:
        hint = (
            f"call tg.{found}(x) instead, or xp.{found}(x) with "
            "xp = array_api_compat.array_namespace(x): both record it"
        )
    else:
        hint = (
            f"tracker_gpu has no differentiable {_STANDARD_NAMES.get(name, name)}: write it "
            f"with the Array API's functions (tg.*), or call {library} on tg.data(x) for a "
            "plain value without gradient"
        )
    return TypeError(f"{library}'s {name} cannot record a gradient on a TrackedArray; {hint}")


def standard_equivalent(name, namespace):
    """The name, in the tracked `namespace` (`sum`, `linalg.det`), of NumPy's function `name`;
    None where it has none."""
    standard = _STANDARD_NAMES.get(name, name)
    if hasattr(namespace, standard):
        return standard
    in_linalg = _LINALG_NAMES.get(name, name)
    if hasattr(getattr(namespace, "linalg", None), in_linalg):
        return f"linalg.{in_linalg}"
    return None


# NumPy's and PyTorch's methods and attributes outside the standard, with what to write instead
# (a NumPy function name in _STANDARD_NAMES, or one of the standard's functions, gets tg.<name>).
_METHOD_HINTS = {
    "reshape": "tg.reshape(x, shape)", "astype": "tg.astype(x, dtype)",
    "flatten": "tg.reshape(x, (-1,))", "ravel": "tg.reshape(x, (-1,))",
    "view": "tg.reshape(x, shape)", "copy": "tg.asarray(x, copy=True)",
    "clone": "tg.asarray(x, copy=True)", "transpose": "tg.permute_dims(x, axes) or x.T",
    "swapaxes": "tg.permute_dims(x, axes)", "item": "float(x) (or int(x))",
    "numpy": "tg.data(x) for the plain array (no gradient)",
    "tolist": "tg.data(x) for the plain array (no gradient), then its tolist()",
    "backward": "tg.back(x)", "grad": "tg.grad(x)", "detach": "tg.stop_gradient(x)",
    "requires_grad": "tg.istracked(x)", "cpu": "tg.to_device(x, device)",
    "to": "tg.to_device(x, device) or tg.astype(x, dtype)", "dim": "x.ndim", "numel": "x.size",
    "fill": "tg.full_like(x, value)", "trace": "tg.linalg.trace(x)",
    "diagonal": "tg.linalg.diagonal(x)", "dot": "tg.matmul(x, y) or x @ y",
    "nonzero": "tg.nonzero(x)", "sort": "tg.sort(x)", "argsort": "tg.argsort(x)",
    "clip": "tg.clip(x, min, max)", "round": "tg.round(x)", "repeat": "tg.repeat(x, repeats)",
    "take": "tg.take(x, indices, axis=...)", "squeeze": "tg.squeeze(x, axis=...)",
    "nbytes": "tg.data(x).nbytes", "itemsize": "tg.data(x).itemsize",
    "strides": "tg.data(x).strides", "flat": "tg.reshape(x, (-1,))",
}  # fmt: skip


def missing_attribute_error(name, namespace):
    """The AttributeError for `x.name`, naming the function to use where `name` is a method
    or attribute of NumPy's or PyTorch's arrays outside the standard (or a function of the
    tracked `namespace`, None while it loads)."""
    plain = f"'TrackedArray' object has no attribute '{name}'"
    if name.startswith("_"):  # protocols probed with hasattr (__array_interface__...): fast
        return AttributeError(plain, name=name)
    hint = _METHOD_HINTS.get(name)
    if hint is None:
        standard = _STANDARD_NAMES.get(name, name)
        if namespace is None or not hasattr(namespace, standard):
            return AttributeError(plain, name=name)
        hint = f"tg.{standard}(x)"
    return AttributeError(
        f"{plain}: a TrackedArray has the Array API's attributes and operators only (as the "
        f"standard's arrays); write {hint} instead, or use xp = "
        "array_api_compat.array_namespace(x) and the function of xp",
        name=name,
    )


def declare_hints(cls, namespace):
    """Declare on `cls` (the tracked array) each name whose `missing_attribute_error` names a
    function to call and that `cls` lacks: NumPy's and PyTorch's methods above, NumPy's names of
    the standard's functions, and the tracked `namespace`'s."""
    names = {*_METHOD_HINTS, *_STANDARD_NAMES, *dir(namespace)}
    for name in names:
        if not name.startswith("_") and _declared(cls, name) is None:
            setattr(cls, name, _Hint(name, namespace))


def is_hint(cls, name):
    """Whether `name` of `cls` is one of the hints `declare_hints` declared."""
    return type(_declared(cls, name)) is _Hint


class _Hint:
    """A method or attribute of NumPy's or PyTorch's arrays outside the standard (`x.sum`):
    reading it raises the AttributeError that names the function to call. It is declared on
    the class rather than answered by a `__getattr__`, which would make Python read every
    attribute of every tracked array (`x.data`) the slow way."""

    __slots__ = ("name", "namespace")

    def __init__(self, name, namespace):
        self.name, self.namespace = name, namespace

    def __get__(self, instance, owner=None):
        raise missing_attribute_error(self.name, self.namespace)


def _declared(cls, name):
    """What `cls` (or a class it derives from) declares under `name`, None if nothing."""
    for base in cls.__mro__:
        if name in base.__dict__:
            return base.__dict__[name]
    return None
