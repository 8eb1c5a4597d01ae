"""Clipping by the global norm: all the gradient arrays of a model scaled by one factor, so
that their norm taken together is at most `max_norm` (PyTorch's `clip_grad_norm_`).

This is not a rule of `OptimiserChain`, which sees one array at a time: call it between
`withgradient` and `update`. `ClipNorm` is the per-array rule (Optimisers.jl's): each array
scaled down to norm `omega` on its own, which changes the gradient's direction.

>>> import numpy as np
>>> grads = {"a": np.array([3.0]), "b": np.array([4.0]), "name": None}
>>> clipped, norm = clip_grad_norm(grads, 1.0)
>>> float(norm), clipped["a"].round(6), clipped["b"].round(6)
(5.0, array([0.6]), array([0.8]))
"""

import math

from ..backend import HALF, dtype_name, is_array, namespace_of
from ..primitive import no_gradient
from ..tracked import data
from .rules import check_flags, check_number
from .tree import tree_map_with_path

__all__ = ["clip_grad_norm"]


class _Settings:  # the hyperparameters, named in check_number's messages
    def __init__(self, **values):
        self.__dict__.update(values)


_Settings.__name__ = "clip_grad_norm"


def clip_grad_norm(grads, max_norm, p=2.0, throw=False, *, model=None):
    """`(clipped, norm)`: `norm` the `p`-norm of all the arrays of `grads` (a nested structure
    as `withgradient` returns it; None and non-arrays are left as they are) taken together, a
    0-d array, and `clipped` the arrays times `min(1, max_norm / (norm + 1e-6))`. PyTorch's
    `torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=p,
    error_if_nonfinite=throw)`, which scales the `.grad`s in place and returns the norm. With
    `throw=True` a norm that is NaN or infinite raises FloatingPointError (the norm is then
    read back: one synchronisation). The norm stays on the device and tg.compile replays it.
    `ClipNorm` instead clips each array alone. The norms of float16 and bfloat16 arrays are
    taken in float32 (the norm is then float32); each array keeps its dtype.

    `withgradient` puts a tied array's whole gradient in each of its places, so a model with
    tied weights must be given as `model`: the gradient of an array found in several of its
    places is then counted once, as PyTorch's `model.parameters()` lists a tied tensor once.

    >>> import numpy as np, tracker_gpu as tg
    >>> w = np.array([3.0])
    >>> model = {"embed": w, "out": w}  # one array in two places
    >>> grads = tg.gradient(lambda m: tg.sum(m["embed"] * m["out"]), model)[0]
    >>> float(clip_grad_norm(grads, 1.0)[1]), float(clip_grad_norm(grads, 1.0, model=model)[1])
    (8.48528137423857, 6.0)
    """
    _check(max_norm, p, throw)
    arrays = _distinct_gradients(grads, model)
    if not arrays:
        raise ValueError(
            "clip_grad_norm: no gradient array in grads; pass the gradient that withgradient "
            "returned for the model"
        )
    xp = namespace_of(arrays[0])
    norms = xp.stack([xp.linalg.vector_norm(_widened(xp, g), ord=p) for g in arrays])
    norm = xp.linalg.vector_norm(norms, ord=p)
    if throw:
        scale = _checked_scale(norm, max_norm=max_norm, p=p)
    else:
        scale = xp.clip(max_norm / (norm + 1e-6), max=1.0)

    def scaled(path, g):  # each array keeps its dtype
        return g * xp.astype(scale, data(g).dtype) if _is_gradient(g) else g

    return tree_map_with_path(scaled, grads), norm


def _widened(xp, g):
    """`g` in float32 if it is float16 or bfloat16, whose sums of squares overflow at 256
    and round to 8 bits (PyTorch's norms accumulate in float32 too)."""
    return xp.astype(g, xp.float32) if dtype_name(data(g).dtype) in HALF else g


def _is_gradient(g):
    return is_array(data(g))


def _distinct_gradients(grads, model):
    """The gradient arrays of `grads`, one for each array of `model` (all when it is None)."""
    arrays, seen = [], set()

    def visit(path, g, param=None):
        if _is_gradient(g) and (param is None or id(param) not in seen):
            arrays.append(g)
            if param is not None:
                seen.add(id(param))

    if model is None:
        tree_map_with_path(visit, grads)
    else:
        tree_map_with_path(visit, grads, model, names=("gradient", "model"))
    return arrays


def _check(max_norm, p, throw):
    settings = _Settings(max_norm=max_norm, p=p, throw=throw)
    check_number(settings, "max_norm", max_norm, ">= 0", lambda v: v >= 0)
    check_number(settings, "p", p, "> 0 (inf for the largest element)", lambda v: v > 0)
    check_flags(settings, throw=throw)


def _checked_scale_forward(xp, norm, *, max_norm, p):
    value = float(norm)
    if not math.isfinite(value):
        raise FloatingPointError(
            f"clip_grad_norm: the gradients' {p}-norm is {value}; look for a NaN or infinite "
            "loss (throw=False scales by it anyway, as PyTorch's default)"
        )
    return xp.clip(max_norm / (norm + 1e-6), max=1.0)


_checked_scale = no_gradient("clip_grad_norm", _checked_scale_forward)
