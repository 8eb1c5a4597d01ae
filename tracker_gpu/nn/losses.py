"""Losses: Flux's names and defaults, with PyTorch's options as keywords.

Every loss takes `reduction="none" | "mean" | "sum"` (PyTorch's word; Flux's `agg` is kept, and
takes a function of the unreduced loss too). "none" keeps one loss per element, or per sample
for the losses over classes (the class axis summed). The class axis is the *last* one
(`axis=-1`; PyTorch's is axis 1): pass `axis=1` for PyTorch's layout. Class labels are integer
indices (the scores' shape without the class axis) or targets shaped like the scores (one-hot
or probabilities). `LOSSES` names them all; each docstring names the PyTorch function it
matches, and the README's "Coming from PyTorch" lists every difference.

The cross-entropies and `nll` take PyTorch's `weight` (one per class), `ignore_index` (a label
whose samples count for nothing: padding) and, on scores, `label_smoothing`; their mean divides
by the summed weights of the targets that are not ignored, as PyTorch's does, but a batch whose
every target is ignored gives 0 (and a zero gradient) where PyTorch gives nan. A class masked
with a `-inf` logit adds nothing (no `0 * -inf`). Without options, `mse` and
`logitcrossentropy` are one primitive each (fused on the GPU), from `tracker_gpu.rules.losses`.

>>> import numpy as np, tracker_gpu as tg
>>> from tracker_gpu import nn
>>> logits = np.array([[2.0, 0.0, -np.inf], [0.0, 2.0, 1.0], [1.0, 1.0, 1.0]])
>>> labels = np.array([0, 1, -100])                   # the last one is padding
>>> print(f"{float(nn.logitcrossentropy(logits, labels, ignore_index=-100)):.4f}")
0.2673
>>> nn.logitcrossentropy(logits, labels, ignore_index=-100, reduction="none").round(4)
array([0.1269, 0.4076, 0.    ])
"""

import math

import numpy as np

from ..backend import HALF, SCALARS, dtype_name, isdtype, namespace_of
from ..checks import checking
from ..primitive import Primitive
from ..rules import losses as _rules
from ..rules import special
from ..rules.elementwise import abs as _abs
from ..rules.elementwise import (
    add,
    astype,
    exp,
    log,
    logaddexp,
    multiply,
    negative,
    subtract,
    where,
)
from ..rules.nn import logsoftmax
from ..rules.reductions import mean
from ..rules.reductions import sum as _sum
from ..rules.shape import reshape
from ..tracked import data

LOSSES = (
    "mse",
    "mae",
    "huber_loss",
    "smoothl1",
    "logitcrossentropy",
    "crossentropy",
    "nll",
    "kldivergence",
    "binarycrossentropy",
    "logitbinarycrossentropy",
)
__all__ = [*LOSSES, "LOSSES", "REDUCTIONS"]

REDUCTIONS = ("none", "mean", "sum")


# --- options
def _reduction(name, reduction, agg):
    """The reduction asked for: `reduction`, or Flux's `agg` (a name or a function)."""
    if reduction is not None and agg is not None:
        raise ValueError(f"{name}: give reduction= or agg= (Flux's name for it), not both")
    choice = reduction if agg is None else agg
    if choice is None:
        return "mean"
    if callable(choice) or choice in REDUCTIONS:
        return choice
    raise ValueError(
        f'{name}: reduction must be "none", "mean" or "sum" (or agg= a function of the '
        f"unreduced loss), got {choice!r}"
    )


def _reduce(per, reduction, counted=None):
    """`per` reduced; a mean divides by the sum of `counted` when given (by 1 where that is
    0). Half precision is summed in float32 and rounded once, as PyTorch sums it (NumPy's
    bfloat16 sum adds in bfloat16: a mean of 4,096 ones was 0.0625)."""
    if reduction == "none":
        return per
    if not isinstance(reduction, str):
        return reduction(per)
    if dtype_name(per.dtype) in HALF:
        wide = namespace_of(data(per)).float32
        return astype(_reduce(astype(per, wide), reduction, counted), per.dtype)
    if reduction == "sum":
        return _sum(per)
    if counted is None:
        return mean(per)
    if dtype_name(counted.dtype) in HALF:  # (NumPy's bfloat16 mixed with a float is float32)
        counted = astype(counted, namespace_of(data(counted)).float32)
    total = _sum(counted)
    return _sum(per) / where(total == 0, 1.0, total)


def _check_smoothing(name, smoothing):
    number = isinstance(smoothing, int | float) and not isinstance(smoothing, bool)
    if not (number and 0.0 <= smoothing <= 1.0):
        raise ValueError(f"{name}: label_smoothing must be a number in [0, 1], got {smoothing!r}")


def _check_broadcasts(name, what, value, shape):
    """`value` (None, a number or an array) broadcasts to `shape` without growing it."""
    if value is None or type(value) in SCALARS:
        return
    mine = tuple(data(value).shape)
    try:
        fits = np.broadcast_shapes(mine, shape) == shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{name}: {what} of shape {mine} does not broadcast to the input's shape {shape}; "
            f"give one value per element of the last axis, shape ({shape[-1] if shape else 1},)"
        )


def _class_weight(name, weight, classes, axis, ndim, like):
    """`weight` (one per class) shaped to broadcast along the class axis, or None."""
    if weight is None:
        return None
    shape = tuple(getattr(data(weight), "shape", ()))
    if shape != (classes,):
        raise ValueError(
            f"{name}: weight must hold one value per class, shape ({classes},), got shape {shape}"
        )
    weight = _rules._in_library(namespace_of(data(like)), weight, data(like))
    if data(weight).dtype != data(like).dtype:  # float32 scores stay float32
        weight = astype(weight, data(like).dtype)
    return reshape(weight, tuple(classes if d == axis else 1 for d in range(ndim)))


# --- class targets: one-hot rows, ignored ones all zeros
def _kept_onehot_forward(xp, labels, *, ignore_index, axis, ndim, dtype, **onehot):
    ignored = labels == ignore_index
    safe = xp.where(ignored, xp.zeros_like(labels), labels)
    hits = _rules._onehot_forward(xp, safe, axis=axis, ndim=ndim, dtype=dtype, **onehot)
    return hits * xp.expand_dims(xp.astype(xp.logical_not(ignored), dtype), axis=axis)


_kept_onehot = Primitive(
    "onehot_ignoring", _kept_onehot_forward, (None,), saves="", differentiable=False
)


def _class_targets(name, scores, labels, axis, ignore_index):
    """`(targets, onehot)`: targets shaped like `scores`; `onehot` the same for class indices
    (ignored rows zero, to count the mean's weights), None for targets given shaped like them."""
    plain = data(scores)
    xp = namespace_of(plain)
    if not _rules._is_index_labels(labels, tuple(plain.shape), axis, name):
        if ignore_index is not None:
            raise ValueError(
                f"{name}: ignore_index applies to class indices, but the labels are targets "
                "shaped like the scores; give the ignored samples all-zero targets instead"
            )
        return _rules._targets(name, scores, labels, axis)[0], None
    labels = _rules._in_library(xp, labels, plain)
    like = dict(classes=plain.shape[axis], ndim=plain.ndim, dtype=plain.dtype, axis=axis)
    if ignore_index is None:
        onehot = _rules._onehot(name, xp, labels, plain, axis)
    else:
        place = dict(device=_rules._device(plain), check=checking(plain))
        onehot = _kept_onehot(labels, name=name, ignore_index=ignore_index, **place, **like)
    return onehot, onehot


def _counts(logp, targets):
    """Where `targets * logp` is taken: not where a class masked by a -inf log-probability has
    a zero target (0 * -inf is nan; it adds 0, as PyTorch's nll_loss)."""
    return (logp > -math.inf) | (targets != 0)


def _class_loss(name, logp, labels, axis, reduction, weight, ignore_index, smoothing=0.0):
    """`-sum(weight * targets * logp, axis)` per sample, reduced as PyTorch's nll_loss and
    cross_entropy: the mean of class indices divides by the weights of the kept targets."""
    targets, onehot = _class_targets(name, logp, labels, axis, ignore_index)
    classes, ndim = logp.shape[axis], len(logp.shape)
    w = _class_weight(name, weight, classes, axis, ndim, logp)
    if smoothing:
        kept = 1.0 if onehot is None else _sum(onehot, axis=axis, keepdims=True)
        targets = add(multiply(targets, 1.0 - smoothing), multiply(kept, smoothing / classes))
    terms = multiply(targets, where(_counts(logp, targets), negative(logp), 0.0))
    per = _sum(terms if w is None else multiply(terms, w), axis=axis)
    counted = None
    if onehot is not None and reduction == "mean":
        counted = onehot if w is None else multiply(onehot, w)
    return _reduce(per, reduction, counted)


def _class_options(name, axis, ndim, ignore_index, smoothing):
    _check_smoothing(name, smoothing)
    if ignore_index is not None and not isinstance(ignore_index, int | np.integer):
        raise TypeError(f"{name}: ignore_index must be an integer label, got {ignore_index!r}")
    return _rules._axis(name, axis, ndim)


# --- over classes
def _plain(reduction, weight, ignore_index, smoothing):
    """No option beyond Flux's: the rules' loss (one primitive, fused on the GPU) serves."""
    return (
        reduction in ("mean", "sum") and weight is None and ignore_index is None and not smoothing
    )


def logitcrossentropy(
    logits,
    labels,
    /,
    *,
    axis=-1,
    reduction=None,
    agg=None,
    weight=None,
    ignore_index=None,
    label_smoothing=0.0,
):
    """Cross-entropy of `softmax(logits)` against `labels`, stably from the logits: PyTorch's
    `cross_entropy` with the classes on `axis` (the last by default; PyTorch's: 1).

    `weight` (one per class), `ignore_index` and `label_smoothing` are PyTorch's; the mean
    divides by the summed weights of the kept targets (0 when none is kept, PyTorch: nan).

    >>> import numpy as np
    >>> z = np.array([[2.0, 0.0], [0.0, 2.0]])
    >>> print(f"{float(logitcrossentropy(z, np.array([0, 1]), label_smoothing=0.1)):.4f}")
    0.2269
    """
    reduction = _reduction("logitcrossentropy", reduction, agg)
    ndim = len(_rules._shape(logits))
    axis = _class_options("logitcrossentropy", axis, ndim, ignore_index, label_smoothing)
    if _plain(reduction, weight, ignore_index, label_smoothing):
        return _rules.logitcrossentropy(logits, labels, axis=axis, agg=reduction)
    logp = logsoftmax(logits, axis=axis)
    return _class_loss("logitcrossentropy", logp, labels, axis, reduction, weight,
                       ignore_index, label_smoothing)  # fmt: skip


def crossentropy(
    yhat,
    labels,
    /,
    *,
    axis=-1,
    reduction=None,
    agg=None,
    eps=None,
    weight=None,
    ignore_index=None,
    label_smoothing=0.0,
):
    """Cross-entropy of probabilities `yhat` against `labels`, `-sum(t * log(yhat + eps))`
    (Flux's; `eps` the dtype's machine epsilon by default): PyTorch's
    `nll_loss(log(yhat))`, or `cross_entropy(log(yhat))` with `label_smoothing`. Options as
    `logitcrossentropy`; prefer that on logits, it is stabler.

    >>> import numpy as np
    >>> p = np.array([[0.5, 0.5], [0.25, 0.75]])
    >>> crossentropy(p, np.array([0, 1]), eps=0.0, reduction="none").round(4)
    array([0.6931, 0.2877])
    """
    reduction = _reduction("crossentropy", reduction, agg)
    ndim = len(_rules._shape(yhat))
    axis = _class_options("crossentropy", axis, ndim, ignore_index, label_smoothing)
    if _plain(reduction, weight, ignore_index, label_smoothing):
        return _rules.crossentropy(yhat, labels, axis=axis, agg=reduction, eps=eps)
    _rules._check_probabilities("crossentropy", yhat, "logitcrossentropy")
    logp = _rules._log_probability(add(yhat, _rules._eps("crossentropy", yhat, eps)))
    return _class_loss("crossentropy", logp, labels, axis, reduction, weight, ignore_index,
                       label_smoothing)  # fmt: skip


def nll(logp, labels, /, *, axis=-1, reduction=None, agg=None, weight=None, ignore_index=None):
    """Negative log-likelihood of log-probabilities `logp` (e.g. `logsoftmax(z)`):
    `-sum(t * logp, axis)`, PyTorch's `nll_loss` with the classes on `axis`. Labels as class
    indices or targets shaped like `logp` (PyTorch: indices only); options as
    `logitcrossentropy`.

    >>> import numpy as np
    >>> logp = np.log(np.array([[0.5, 0.5], [0.25, 0.75]]))
    >>> bool(np.isclose(nll(logp, np.array([1, 0]), reduction="sum"), -np.log(0.5 * 0.25)))
    True
    """
    reduction = _reduction("nll", reduction, agg)
    axis = _class_options("nll", axis, len(_rules._shape(logp)), ignore_index, 0.0)
    return _class_loss("nll", logp, labels, axis, reduction, weight, ignore_index)


def kldivergence(
    yhat,
    y,
    /,
    *,
    axis=-1,
    reduction=None,
    agg=None,
    eps=None,
    log_input=False,
    log_target=False,
):
    """Kullback-Leibler divergence of the predicted distribution `yhat` from the target `y`,
    `sum(y * (log(y) - log(yhat + eps)), axis)` per sample (Flux's: probabilities, mean over
    samples). PyTorch's `kl_div(input, target)` takes log-probabilities as `input`: pass
    `log_input=True` for that, and `log_target=True` for a target given as log-probabilities
    too. Ours reduces the class axis first: "mean" is PyTorch's `reduction="batchmean"` (on
    2-d inputs), "none" is PyTorch's "none" summed over `axis`, "sum" is the same.

    >>> import numpy as np
    >>> q, p = np.array([[0.5, 0.5]]), np.array([[1.0, 0.0]])
    >>> bool(np.isclose(kldivergence(q, p, eps=0.0), np.log(2.0)))
    True
    """
    reduction, y = _elementwise("kldivergence", yhat, y, reduction, agg)
    axis = _rules._axis("kldivergence", axis, len(_rules._shape(yhat)))
    if log_input:
        logq = yhat
    else:
        logq = log(add(yhat, _rules._eps("kldivergence", yhat, eps)))
    if log_target:
        pointwise = multiply(exp(y), subtract(y, logq))
    else:  # 0 where y is 0, even against log(0) = -inf
        pointwise = subtract(special.xlogy(y, y), multiply(y, where(_counts(logq, y), logq, 0.0)))
    return _reduce(_sum(pointwise, axis=axis), reduction)


# --- elementwise
def _elementwise(name, yhat, y, reduction, agg):
    """`(reduction, y)`, checked; `y` in `yhat`'s dtype where it holds integers or booleans."""
    reduction = _reduction(name, reduction, agg)
    _rules._check_same_shape(name, yhat, y)
    return reduction, _as_targets(yhat, y)


def _as_targets(yhat, y):
    """Targets of integers or booleans (0/1 labels, counts) in the floating dtype of the
    predictions, as Flux's promotion has it, the same on every library: NumPy's own would
    make a float32 model's loss float64, PyTorch's and array-api-strict's refuse booleans."""
    predicted, target = data(yhat), data(y)
    if type(target) in SCALARS or type(predicted) in SCALARS:
        return y
    if not isdtype(namespace_of(predicted), predicted.dtype, "real floating"):
        return y
    if isdtype(namespace_of(target), target.dtype, ("real floating", "complex floating")):
        return y
    return astype(y, predicted.dtype)


def mse(yhat, y, /, *, reduction=None, agg=None):
    """Mean squared error, `(yhat - y)**2` reduced: PyTorch's `mse_loss`.

    >>> import numpy as np
    >>> mse(np.array([1.0, 2.0]), np.array([1.0, 4.0]), reduction="none")
    array([0., 4.])
    """
    reduction, y = _elementwise("mse", yhat, y, reduction, agg)
    if reduction in ("mean", "sum"):
        return _rules.mse(yhat, y, agg=reduction)
    d = subtract(yhat, y)
    return _reduce(multiply(d, d), reduction)


def mae(yhat, y, /, *, reduction=None, agg=None):
    """Mean absolute error, `|yhat - y|` reduced (Flux's name): PyTorch's `l1_loss`.

    >>> import numpy as np
    >>> float(mae(np.array([1.0, 2.0]), np.array([1.0, 4.0])))
    1.0
    """
    reduction, y = _elementwise("mae", yhat, y, reduction, agg)
    return _reduce(_abs(subtract(yhat, y)), reduction)


def _huber(d, delta):
    """`d**2 / 2` where `|d| < delta`, `delta * (|d| - delta / 2)` elsewhere."""
    a = _abs(d)
    return where(
        a < delta, multiply(multiply(d, d), 0.5), multiply(subtract(a, 0.5 * delta), delta)
    )


def huber_loss(yhat, y, /, *, delta=1.0, reduction=None, agg=None):
    """Huber loss of `d = yhat - y`: `d**2 / 2` where `|d| < delta`, else
    `delta * (|d| - delta / 2)` (Flux's): PyTorch's `huber_loss`.

    >>> import numpy as np
    >>> huber_loss(np.array([0.5, 3.0]), np.zeros(2), reduction="none")
    array([0.125, 2.5  ])
    """
    reduction, y = _elementwise("huber_loss", yhat, y, reduction, agg)
    if not (isinstance(delta, int | float) and delta > 0):
        raise ValueError(f"huber_loss: delta must be a positive number, got {delta!r}")
    return _reduce(_huber(subtract(yhat, y), delta), reduction)


def smoothl1(yhat, y, /, *, beta=1.0, reduction=None, agg=None):
    """Smooth L1 loss, `huber_loss(delta=beta) / beta` (`|yhat - y|` for `beta=0`): PyTorch's
    `smooth_l1_loss`.

    >>> import numpy as np
    >>> smoothl1(np.array([0.5, 3.0]), np.zeros(2), beta=2.0, reduction="none")
    array([0.0625, 2.    ])
    """
    reduction, y = _elementwise("smoothl1", yhat, y, reduction, agg)
    if not (isinstance(beta, int | float) and beta >= 0):
        raise ValueError(f"smoothl1: beta must be a number >= 0, got {beta!r}")
    d = subtract(yhat, y)
    per = _abs(d) if beta == 0 else multiply(_huber(d, beta), 1.0 / beta)
    return _reduce(per, reduction)


def binarycrossentropy(yhat, y, /, *, reduction=None, agg=None, eps=None, weight=None):
    """Binary cross-entropy of probabilities `yhat` against `y`:
    `-weight * (y * log(yhat + eps) + (1 - y) * log(1 - yhat + eps))` (Flux's `eps`, the
    dtype's machine epsilon by default): PyTorch's `binary_cross_entropy`, which has no `eps`
    but clamps each log at -100. Prefer `logitbinarycrossentropy` on logits.

    >>> import numpy as np
    >>> binarycrossentropy(np.array([0.5, 0.75]), np.array([1.0, 0.0]), eps=0.0,
    ...                    reduction="none").round(4)
    array([0.6931, 1.3863])
    """
    reduction, y = _elementwise("binarycrossentropy", yhat, y, reduction, agg)
    _check_broadcasts("binarycrossentropy", "weight", weight, _rules._shape(yhat))
    _rules._check_probabilities("binarycrossentropy", yhat, "logitbinarycrossentropy")
    eps = _rules._eps("binarycrossentropy", yhat, eps)
    positive = _rules._times_log(y, add(yhat, eps))  # 0 where y rules it out, not 0 * -inf
    negative_part = _rules._times_log(subtract(1.0, y), subtract(1.0 + eps, yhat))
    per = negative(add(positive, negative_part))
    return _reduce(per if weight is None else multiply(per, weight), reduction)


def logitbinarycrossentropy(logits, y, /, *, reduction=None, agg=None, weight=None,
                            pos_weight=None):  # fmt: skip
    """Binary cross-entropy of `sigmoid(logits)` against `y`, stably from the logits:
    `weight * ((1 - y) * logits + (1 + (pos_weight - 1) * y) * softplus(-logits))`, PyTorch's
    `binary_cross_entropy_with_logits` (`pos_weight` weighs the positives, broadcast along
    the last axis as PyTorch's).

    >>> import numpy as np
    >>> x, y = np.array([0.0, 0.0]), np.array([1.0, 0.0])
    >>> logitbinarycrossentropy(x, y, pos_weight=np.array([3.0, 3.0]), reduction="none").round(4)
    array([2.0794, 0.6931])
    """
    name = "logitbinarycrossentropy"
    reduction, y = _elementwise(name, logits, y, reduction, agg)
    for what, value in (("weight", weight), ("pos_weight", pos_weight)):
        _check_broadcasts(name, what, value, _rules._shape(logits))
    softplus_of_negative = logaddexp(negative(logits), 0.0)  # -logsigmoid(logits)
    if pos_weight is not None:
        scale = add(multiply(subtract(pos_weight, 1.0), y), 1.0)
        softplus_of_negative = multiply(softplus_of_negative, scale)
    per = add(multiply(logits, subtract(1.0, y)), softplus_of_negative)
    return _reduce(per if weight is None else multiply(per, weight), reduction)
