"""Loss functions, as in Flux: mse, logitcrossentropy, crossentropy, binarycrossentropy and
logitbinarycrossentropy, each reduced by `agg` ("mean", the default, or "sum").

`mse` and `logitcrossentropy` are single primitives (one node on the tape) with an explicit
forward and vjps written with this package's functions, so they are differentiable again; on the
GPU their pullbacks (and the cross-entropy's forward) are fused kernels, registered by name in
`cuda.dispatch`. The others are composites of rules.

Labels for the cross-entropies are integer class indices (one fewer axis than the scores) or
targets shaped like the scores (one-hot or probabilities).

>>> import numpy as np, tracker_gpu as tg
>>> from tracker_gpu.rules.losses import logitcrossentropy
>>> logits = np.array([[2.0, 0.0], [0.0, 2.0]])
>>> print(f"{float(logitcrossentropy(logits, np.array([0, 1]))):.4f}")
0.1269
>>> tg.gradient(lambda z: logitcrossentropy(z, np.array([0, 1])), logits)[0].round(3)
array([[-0.06,  0.06],
       [ 0.06, -0.06]])
"""

import math

import numpy as np

from .. import recording
from ..backend import HALF, SCALARS, device_of, dtype_name, finfo, isdtype, namespace_of
from ..checks import checking
from ..primitive import Primitive
from ..tracked import TrackedArray, data
from .elementwise import (
    PLAIN_FUNCTIONS,
    add,
    astype,
    log,
    logaddexp,
    multiply,
    negative,
    subtract,
    where,
)
from .native_hook import native
from .nn import logsoftmax, logsoftmax_parts, real_only, softmax
from .reductions import _over_count, mean
from .reductions import sum as _sum
from .rows import row_max, row_sum

__all__ = [
    "mse",
    "logitcrossentropy",
    "crossentropy",
    "binarycrossentropy",
    "logitbinarycrossentropy",
]

AGGREGATES = ("mean", "sum")


# --- shared checks
def _check_agg(name, agg, composite=False):
    if agg in AGGREGATES or (composite and callable(agg)):
        return
    choices = '"mean" or "sum"' + (" (or a function of the unreduced loss)" if composite else "")
    raise ValueError(f"{name}: agg must be {choices}, got {agg!r}")


def _aggregate(agg, per_sample):
    if agg == "mean":
        return mean(per_sample)
    if agg == "sum":
        return _sum(per_sample)
    return agg(per_sample)


def _shape(x):
    return tuple(getattr(x, "shape", ()))


def _size(shape):
    return math.prod(shape)


def _check_same_shape(name, yhat, y):
    if type(y) in SCALARS or _shape(yhat) == _shape(y):
        return
    raise ValueError(
        f"{name}: the prediction has shape {_shape(yhat)} but the target has shape {_shape(y)}; "
        "they must match (reshape one, e.g. a column of predictions to a vector)"
    )


def _axis(name, axis, ndim):
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: axis {axis} is out of range for scores of {ndim} dimensions")
    return axis % ndim


def _is_integral(xp, dtype):
    kind = getattr(dtype, "kind", None)  # NumPy and CuPy dtypes: no call into the library
    return kind in ("i", "u") if isinstance(kind, str) else xp.isdtype(dtype, "integral")


def _is_index_labels(labels, scores_shape, axis, name):
    """True for integer class indices, False for targets shaped like the scores; else raise."""
    plain = data(labels)
    if type(plain) in SCALARS or isinstance(plain, (list, tuple)):
        raise TypeError(
            f"{name}: labels must be an array, got {type(plain).__name__}; convert them with "
            "the scores' library's asarray"
        )
    shape = _shape(plain)
    indices_shape = scores_shape[:axis] + scores_shape[axis + 1 :]
    if shape == indices_shape and _is_integral(namespace_of(plain), plain.dtype):
        return True
    if shape == scores_shape:
        return False
    raise ValueError(
        f"{name}: labels of shape {shape} and dtype {plain.dtype} do not fit scores of shape "
        f"{scores_shape}: pass integer class indices of shape {indices_shape} or one-hot "
        f"(or probability) targets of shape {scores_shape}"
    )


def _range_error(name, xp, labels, classes):
    low, high = int(xp.min(labels)), int(xp.max(labels))
    return ValueError(
        f"{name}: class labels must lie in [0, {classes - 1}] for {classes} classes, "
        f"got labels from {low} to {high}"
    )


def _device(x):
    return "cpu" if type(x) is np.ndarray else device_of(x)


def _onehot(name, xp, labels, scores, axis):
    """One-hot targets shaped like `scores`, from integer class `labels` (plain; traced while
    tg.compile records, so that a replay makes them from its own labels). A label out of range
    would leave its row all zeros: it raises where that check costs no synchronisation with the
    device (`tg.sync_checks`), else its row is made nan, so the loss is nan."""
    like = dict(classes=scores.shape[axis], ndim=scores.ndim, dtype=scores.dtype)
    return _onehot_primitive(labels, name=name, axis=axis, device=_device(scores),
                             check=checking(scores), **like)  # fmt: skip


def _onehot_forward(xp, labels, *, name, classes, axis, ndim, dtype, device, check):
    positions = xp.arange(classes, device=device)
    if labels.dtype != positions.dtype:
        labels = xp.astype(labels, positions.dtype)
    if axis == ndim - 1:
        hits = labels[..., None] == positions
    else:
        shape = tuple(classes if d == axis else 1 for d in range(ndim))
        hits = xp.expand_dims(labels, axis=axis) == xp.reshape(positions, shape)
    if check:  # a label in range hits one class, one out of range none: one count, one sync
        if int(xp.count_nonzero(hits)) != math.prod(labels.shape):
            raise _range_error(name, xp, labels, classes)
        return xp.astype(hits, dtype)
    valid = xp.any(hits, axis=axis, keepdims=True)
    nan = xp.asarray(math.nan, dtype=dtype, device=device)
    return xp.where(valid, xp.astype(hits, dtype), nan)


_onehot_primitive = Primitive("onehot", _onehot_forward, (None,), saves="", differentiable=False)


def _targets(name, scores, labels, axis):
    """`(targets, normalized)`: targets shaped like `scores`, one-hot (plain) for class indices
    (then `normalized`: each sums to one), else `labels` made floating like the scores."""
    plain = data(scores)
    xp = namespace_of(plain)
    if _is_index_labels(labels, tuple(plain.shape), axis, name):
        return _onehot(name, xp, _in_library(xp, labels, plain), plain, axis), True
    if not isdtype(xp, data(labels).dtype, "real floating"):
        return astype(_in_library(xp, labels, plain), plain.dtype), False
    return labels, False


def _in_library(xp, labels, like):
    """NumPy labels for scores of another library are moved there; others are left as given."""
    if namespace_of(labels) is not xp and isinstance(labels, (np.ndarray, np.generic)):
        return xp.asarray(labels, device=device_of(like))
    return labels


# --- mse: one primitive
def _mse_forward(xp, yhat, y, *, agg="mean"):
    d = yhat - y
    if dtype_name(d.dtype) in HALF:  # summed in float32, as PyTorch's (NumPy's bfloat16 sum
        total = xp.sum(d * d, dtype=xp.float32)  # adds in bfloat16: it stops at 256)
        n = _size(_shape(d))
        return xp.astype(total / n if agg == "mean" else total, d.dtype)
    return xp.mean(d * d) if agg == "mean" else xp.sum(d * d)


def _mse_scale(g, yhat, y, agg):
    """`2 g / n` (or `2 g`): the factor of `yhat - y` in the gradient."""
    n = _size(_shape(yhat)) if agg == "mean" else 1
    return g * (2.0 / n) if n else g


mse_primitive = Primitive(
    "mse",
    _mse_forward,
    (
        lambda g, ans, yhat, y, agg="mean": multiply(
            subtract(yhat, y), _mse_scale(g, yhat, y, agg)
        ),
        lambda g, ans, yhat, y, agg="mean": multiply(
            subtract(y, yhat), _mse_scale(g, yhat, y, agg)
        ),
    ),
    doc="The mean (or sum) of squared errors, one primitive.",
    saves="yhat y",
)


def mse(yhat, y, /, *, agg="mean"):
    """Mean squared error, `agg((yhat - y)**2)`; `yhat` and `y` must have the same shape.

    >>> import numpy as np
    >>> float(mse(np.array([1.0, 2.0]), np.array([1.0, 4.0])))
    2.0
    """
    _check_agg("mse", agg)
    _check_same_shape("mse", yhat, y)
    return mse_primitive(yhat, y, agg=agg)


# --- logitcrossentropy: one primitive
def _logsoftmax_plain(xp, x, axis):
    shifted, lse = logsoftmax_parts(xp, x, axis)
    return shifted - lse


def _lce_forward(xp, logits, targets, *, axis=-1, agg="mean", normalized=False):
    real_only("logitcrossentropy", logits)
    done = native("crossentropy", logits, targets, axis=axis, agg=agg, normalized=normalized)
    if done is not None:
        return done
    logp = _logsoftmax_plain(xp, logits, axis)
    # the target's log-probability only: a class masked with a -inf logit and a zero target
    # adds 0, not 0 * -inf = nan (PyTorch's cross_entropy)
    logp = xp.where(targets != 0, logp, xp.zeros_like(logp))
    wide = dtype_name(logits.dtype) in HALF  # summed and divided in float32, as PyTorch's
    total = -xp.sum(targets * logp, dtype=xp.float32 if wide else None)
    if agg == "mean":
        total = total / _samples(logits, axis)
    return xp.astype(total, logits.dtype) if wide else total


def _samples(logits, axis):
    shape = _shape(logits)
    return _size(shape) // shape[axis] if shape[axis] else 1


def _lce_scale(g, logits, axis, agg):
    # through float32 for half dtypes: 70,000 samples are inf in float16, and g / inf is 0
    return _over_count(g, _samples(logits, axis)) if agg == "mean" else g


def _lce_vjp_logits(g, ans, logits, targets, *, axis=-1, agg="mean", normalized=False):
    # d/dz -sum(t * logsoftmax(z)) = softmax(z) * sum(t) - t  (= softmax(z) - t for one-hot t)
    if normalized and not _tracked(g, logits):  # first order: the same maths, in place
        return _lce_vjp_plain(g, logits, targets, axis, agg)
    p = softmax(logits, axis=axis)
    if not normalized:
        p = multiply(p, _sum(targets, axis=axis, keepdims=True))
    return multiply(subtract(p, targets), _lce_scale(g, logits, axis, agg))


def _tracked(*values):
    return any(type(v) is TrackedArray for v in values)


def _lce_vjp_plain(g, logits, targets, axis, agg):
    xp = namespace_of(logits)
    p = logits - row_max(xp, logits, axis)
    p = xp.exp(p)
    p /= row_sum(xp, p, axis)
    p -= targets
    p *= _lce_scale(g, logits, axis, agg)
    return p


def _lce_vjp_targets(g, ans, logits, targets, *, axis=-1, agg="mean", normalized=False):
    return multiply(logsoftmax(logits, axis=axis), negative(_lce_scale(g, logits, axis, agg)))


logitcrossentropy_primitive = Primitive(
    "logitcrossentropy",
    _lce_forward,
    (_lce_vjp_logits, _lce_vjp_targets),
    saves=("logits targets", "logits"),
    doc="""Softmax cross-entropy of logits against targets shaped like them, one primitive.

    Keywords: `axis` (the classes), `agg` ("mean" over samples, or "sum"), `normalized` (the
    targets are one-hot: each sums to one, which the gradient then need not compute).
    """,
)


def logitcrossentropy(logits, labels, /, *, axis=-1, agg="mean"):
    """Cross-entropy of `softmax(logits)` against `labels`, computed stably from the logits:
    `agg(-sum(targets * logsoftmax(logits), axis))`.

    `labels` are integer class indices (the shape of `logits` without `axis`) or targets shaped
    like `logits` (one-hot or probabilities). Labels outside `[0, classes)` raise ValueError.
    """
    _check_agg("logitcrossentropy", agg)
    axis = _axis("logitcrossentropy", axis, len(_shape(logits)))
    targets, normalized = _targets("logitcrossentropy", logits, labels, axis)
    return logitcrossentropy_primitive(logits, targets, axis=axis, agg=agg, normalized=normalized)


# --- composites
def _check_probabilities(name, yhat, instead):
    """Probabilities outside [0, 1] (logits passed by mistake: a negative loss, or nan) raise,
    where that check costs no synchronisation with the device (`tg.sync_checks`), as labels."""
    plain = data(yhat)
    if type(plain) in SCALARS or recording.current() is not None or not checking(plain):
        return
    xp = namespace_of(plain)
    if not bool(xp.all((plain >= 0) & (plain <= 1))):  # nan fails too
        low, high = float(xp.min(plain)), float(xp.max(plain))
        raise ValueError(
            f"{name}: yhat must hold probabilities in [0, 1], got values from {low} to {high}; "
            f"for logits (unnormalised scores) use {instead}, which is also stabler"
        )


def _eps(name, x, eps):
    if eps is not None:
        return eps
    plain = data(x)
    return float(finfo(namespace_of(plain), plain.dtype).eps)


def crossentropy(yhat, labels, /, *, axis=-1, agg="mean", eps=None):
    """Cross-entropy of probabilities `yhat` against `labels`: `agg(-sum(t * log(yhat + eps),
    axis))`. Prefer `logitcrossentropy` on logits: it is stabler. `eps` defaults to the dtype's
    machine epsilon, as in Flux. `yhat` outside [0, 1] (logits by mistake) raises ValueError
    where checking costs no synchronisation with the device (`tg.sync_checks`)."""
    _check_agg("crossentropy", agg, composite=True)
    _check_probabilities("crossentropy", yhat, "logitcrossentropy")
    axis = _axis("crossentropy", axis, len(_shape(yhat)))
    targets, _ = _targets("crossentropy", yhat, labels, axis)
    terms = _times_log(targets, yhat + _eps("crossentropy", yhat, eps))
    return _aggregate(agg, negative(_sum(terms, axis=axis)))


def _log_probability(p):
    """`log(p)`, -inf where `p` is 0 with the gradient 0 there (not 0 / 0 = nan): for a loss
    that masks the classes its targets rule out (`nn.crossentropy`'s options)."""
    positive = PLAIN_FUNCTIONS["greater"](p, 0)
    return where(positive, log(where(positive, p, 1.0)), -math.inf)


def _times_log(t, p):
    """`t * log(p)`, and 0 where both are 0 (the term is 0 whatever `p`: a class or an outcome
    the target rules out, of probability 0, whose log is -inf, gave 0 * -inf = nan). The
    gradient for `t` is `log(p)` wherever `p` is positive, a target of 0 or 1 included."""
    kept = PLAIN_FUNCTIONS["logical_or"](
        PLAIN_FUNCTIONS["greater"](p, 0), PLAIN_FUNCTIONS["not_equal"](t, 0)
    )
    return multiply(t, where(kept, log(where(kept, p, 1.0)), 0.0))


def binarycrossentropy(yhat, y, /, *, agg="mean", eps=None):
    """Binary cross-entropy of probabilities `yhat` against targets `y` of the same shape:
    `agg(-y * log(yhat + eps) - (1 - y) * log(1 - yhat + eps))`. `yhat` outside [0, 1] raises
    ValueError where checking costs no synchronisation with the device (`tg.sync_checks`)."""
    _check_agg("binarycrossentropy", agg, composite=True)
    _check_same_shape("binarycrossentropy", yhat, y)
    _check_probabilities("binarycrossentropy", yhat, "logitbinarycrossentropy")
    eps = _eps("binarycrossentropy", yhat, eps)
    positive = _times_log(y, yhat + eps)
    negative_part = _times_log(subtract(1.0, y), 1.0 + eps - yhat)
    return _aggregate(agg, negative(add(positive, negative_part)))


def logitbinarycrossentropy(logits, y, /, *, agg="mean"):
    """Binary cross-entropy of `sigmoid(logits)` against `y`, computed stably from the logits:
    `agg((1 - y) * logits - logsigmoid(logits))`."""
    _check_agg("logitbinarycrossentropy", agg, composite=True)
    _check_same_shape("logitbinarycrossentropy", logits, y)
    softplus_of_negative = logaddexp(negative(logits), 0.0)  # -logsigmoid(logits)
    return _aggregate(agg, add(multiply(logits, subtract(1.0, y)), softplus_of_negative))
