"""Normalisation layers: `LayerNorm`, `GroupNorm`, `BatchNorm` and `InstanceNorm`, and
`normalise`.

Each normalises its input to zero mean and unit variance over some axes with the `normalise`
primitive (one tape node, one fused kernel each way on the GPU), then scales and shifts it per
feature or channel (`affine=True`: `scale` ones, `bias` zeros). Images are NCHW: channels on
axis 1.

`BatchNorm` (and `InstanceNorm` with `track_stats=True`) keeps running estimates of each
channel's mean and variance, updated (in place, as Flux does) when it runs in training mode and
used in test mode. It is in training mode inside `gradient` (when its input or its own scale
is tracked) and in test mode otherwise, unless `active` or `trainmode`/`testmode` say
otherwise. The running statistics are fields of the model (so `save`, `place` and checkpoints
carry them), declared not trainable: they never enter the gradient and `optim.setup` gives
them no state.

A float16 or bfloat16 input is normalised with its mean and variance computed in float32 (as
PyTorch's autocast runs its norms) and the result given back in the input's dtype; the running
statistics are updated from float32 statistics too.

>>> import numpy as np, tracker_gpu as tg
>>> from tracker_gpu import nn
>>> bn = nn.BatchNorm(2, dtype="float64")
>>> x = np.array([[1.0, 10.0], [3.0, 30.0]])
>>> (g,) = tg.gradient(lambda m: tg.sum(m(x)[:, 0] * np.array([1.0, 2.0])), bn)
>>> g.scale.round(4), g.running_mean
(array([1., 0.]), None)
>>> bn.running_mean, bn.running_var
(array([0.2, 2. ]), array([ 1.1, 20.9]))
"""

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import recording
from ..backend import device_of, isdtype, namespace_of
from ..primitive import detached, no_gradient
from ..rules.elementwise import add, astype, divide, multiply, sqrt, subtract
from ..rules.nn import normalise
from ..rules.shape import reshape
from ..tracked import data
from .activations import _activate
from .layers import Layer, _describe, _match_dtype, _shape
from .placement import asarray

__all__ = ["LayerNorm", "GroupNorm", "BatchNorm", "InstanceNorm", "normalise"]

_NOT_TRAINABLE = {"trainable": False}
HALF = ("float16", "bfloat16")  # dtypes whose statistics are computed in float32


def _dtype_name(dtype):
    """The name of a dtype of any library: "float16", "bfloat16", "float32", ..."""
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).rpartition(".")[2]


def _wide(x):
    """`x` cast to float32 (tracked) if it is float16 or bfloat16, else `x`."""
    if _dtype_name(data(x).dtype) not in HALF:
        return x
    return astype(x, namespace_of(data(x)).float32)


def _normalised(x, axes, eps):
    """`normalise(x, axes=axes, eps=eps)`, in float32 for a half-precision `x`, in `x`'s
    dtype where it is floating (integers normalise to floats, as `normalise` gives them: cast
    back, they were rounded to -1, 0 and 1)."""
    y = normalise(_wide(x), axes=axes, eps=eps)
    plain = data(x)
    if y.dtype == plain.dtype or not isdtype(namespace_of(plain), plain.dtype, "real floating"):
        return y
    return astype(y, plain.dtype)


def _affine(size, affine, dtype, device, xp):
    if not affine:
        return None, None
    ones = asarray(np.ones(size), xp=xp, device=device, dtype=dtype)
    return ones, asarray(np.zeros(size), xp=xp, device=device, dtype=dtype)


def _scale_shift(y, scale, bias, shape):
    """`y * scale + bias`, the per-channel arrays reshaped to `shape` to broadcast."""
    if scale is None:
        return y
    return add(multiply(y, reshape(scale, shape)), reshape(bias, shape))


def _channel_shape(x):
    """The shape that lines a per-channel array up with axis 1 of `x`."""
    return (1, -1) + (1,) * (len(_shape(x)) - 2)


def _given_bias(bias):
    """A bias as given: an array, or None for `bias=False` (no shift)."""
    return None if bias is False else bias


def _extra(layer):
    extra = "" if layer.activation is None else f", {_describe(layer.activation)}"
    if layer.scale is None:
        return extra + ", affine=False"
    return extra + ("" if layer.bias is not None else ", bias=False")


@dataclass(init=False, repr=False)
class LayerNorm(Layer):
    """Normalise the last `len(size)` axes to zero mean and unit variance, then scale and shift
    (`affine=True`, the default: `scale` ones and `bias` zeros, of shape `size`; `bias=False`
    scales without a shift). PyTorch's `LayerNorm(size, eps, elementwise_affine=affine,
    bias=bias)`, the same defaults.

    >>> from tracker_gpu import nn
    >>> nn.LayerNorm(4, bias=False)
    LayerNorm(4, bias=False)
    """

    scale: Any
    bias: Any
    activation: Callable | None
    eps: float
    size: tuple

    def __init__(
        self,
        size=None,
        activation=None,
        *,
        affine=True,
        eps=1e-5,
        scale=None,
        bias=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if scale is not None:
            size = tuple(scale.shape)
        if size is None:
            raise TypeError("LayerNorm needs its size (an int or a tuple) or scale=")
        size = (size,) if isinstance(size, int) else tuple(size)
        if scale is None:
            scale, made = _affine(size, affine, dtype, device, xp)
            bias = made if bias is None or bias is True else bias
        elif bias is True:
            bias = namespace_of(data(scale)).zeros_like(data(scale))
        self.scale, self.bias, self.activation = scale, _given_bias(bias), activation
        self.eps, self.size = eps, size

    def __call__(self, x):
        k, n = len(self.size), len(_shape(x))
        self._expect(_shape(x)[n - k :] == self.size, x, f"trailing axes {self.size}")
        y = _normalised(x, tuple(range(n - k, n)), self.eps)
        if self.scale is not None:
            y = multiply(y, self.scale)
        if self.bias is not None:
            y = add(y, self.bias)
        return _activate(self.activation, y)

    def __repr__(self):
        if not all(isinstance(v, int) for v in self.size):
            return self._fields_repr()
        size = self.size[0] if len(self.size) == 1 else self.size
        return f"LayerNorm({size}{_extra(self)})"


@dataclass(init=False, repr=False)
class GroupNorm(Layer):
    """Split the channels (axis 1) into `groups` groups and normalise each group of each sample
    over its channels and positions (Wu & He 2018), then scale and shift each channel.
    `GroupNorm(channels, groups, activation)`, Flux's order (PyTorch's `GroupNorm` takes the
    groups first)."""

    scale: Any
    bias: Any
    activation: Callable | None
    channels: int
    groups: int
    eps: float

    def __init__(
        self,
        channels=None,
        groups=None,
        activation=None,
        *,
        affine=True,
        eps=1e-5,
        scale=None,
        bias=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if channels is None or groups is None:
            raise TypeError("GroupNorm needs GroupNorm(channels, groups)")
        if not (isinstance(groups, int) and groups >= 1) or channels % groups:
            raise ValueError(
                f"GroupNorm: groups={groups!r} must divide the {channels} channels; choose a "
                "divisor of the channels"
            )
        if scale is None:
            scale, bias = _affine((channels,), affine, dtype, device, xp)
        self.scale, self.bias, self.activation = scale, bias, activation
        self.channels, self.groups, self.eps = channels, groups, eps

    def __call__(self, x):
        c = self.channels
        self._expect(len(_shape(x)) >= 2 and _shape(x)[1] == c, x, f"(batch, {c}, ...)")
        n = x.shape[0]
        per_group = math.prod(x.shape[1:]) // self.groups  # not -1: an empty batch has no size
        grouped = reshape(x, (n, self.groups, per_group))
        y = reshape(_normalised(grouped, (2,), self.eps), tuple(x.shape))
        return _activate(self.activation, _scale_shift(y, self.scale, self.bias, _channel_shape(x)))

    def __repr__(self):
        if not isinstance(self.groups, int):
            return self._fields_repr()
        return f"GroupNorm({self.channels}, {self.groups}{_extra(self)})"


@dataclass(init=False, repr=False)
class BatchNorm(Layer):
    """Normalise each channel (axis 1) over the batch and every other axis (Ioffe & Szegedy
    2015), then scale and shift it. In training mode the batch's statistics are used and the
    running ones updated, `running = (1 - momentum) * running + momentum * batch` (the variance
    unbiased, as Flux and PyTorch); in test mode the running ones are used. `active` None
    (automatic: training inside `gradient`), True or False.

    PyTorch's `BatchNorm1d/2d/3d(channels, eps, momentum, affine, track_running_stats=
    track_stats)`, the same defaults; its training mode is `module.train()`, ours automatic.
    `momentum=None` is PyTorch's cumulative average: the running statistics are the mean of
    every batch's so far, `momentum = 1 / count`, `count` (PyTorch's `num_batches_tracked`) a
    0-d int64 array of the layer (an integer, so that it counts on in float16 and bfloat16).

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> bn = nn.trainmode(nn.BatchNorm(1, momentum=None, dtype="float64"))
    >>> for batch in ([[1.0], [3.0]], [[5.0], [7.0]]):
    ...     _ = bn(np.array(batch))
    >>> bn.running_mean, bn.count
    (array([4.]), array(2))
    """

    scale: Any
    bias: Any
    running_mean: Any = dataclasses.field(metadata=_NOT_TRAINABLE)
    running_var: Any = dataclasses.field(metadata=_NOT_TRAINABLE)
    activation: Callable | None = None
    channels: int = 0
    eps: float = 1e-5
    momentum: float | None = 0.1
    active: bool | None = None
    count: Any = dataclasses.field(default=None, metadata=_NOT_TRAINABLE)

    def __init__(
        self,
        channels=None,
        activation=None,
        *,
        affine=True,
        track_stats=True,
        eps=1e-5,
        momentum=0.1,
        active=None,
        scale=None,
        bias=None,
        running_mean=None,
        running_var=None,
        count=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if channels is None:
            raise TypeError("BatchNorm needs its number of channels, BatchNorm(channels)")
        _init_running(self, locals(), cumulative=momentum is None)

    def __call__(self, x):
        c = self.channels
        self._expect(len(_shape(x)) >= 2 and _shape(x)[1] == c, x, f"(batch, {c}, ...)")
        axes = (0,) + tuple(range(2, len(_shape(x))))
        return _run(self, x, axes, per_sample=False)

    def __repr__(self):
        if not isinstance(self.channels, int):
            return self._fields_repr()
        return f"BatchNorm({self.channels}{_running_extra(self, True)})"


@dataclass(init=False, repr=False)
class InstanceNorm(Layer):
    """Normalise each channel of each sample over its positions (Ulyanov et al. 2016): the
    input is `(batch, channels, positions...)`, one or more position axes. `affine=False` and
    `track_stats=False` by default (Flux's and PyTorch's): no scale nor shift, and the sample's
    own statistics in every mode. With `track_stats=True` it keeps running statistics as
    `BatchNorm` does, the mean over the batch of each sample's mean and unbiased variance,
    updated in training mode and used in test mode.

    PyTorch's `InstanceNorm1d/2d/3d(channels, eps, momentum, affine, track_running_stats=
    track_stats)` on batched input, the same defaults (PyTorch's `momentum=None` never updates
    the running statistics: `momentum=0.0` here).

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> norm = nn.InstanceNorm(2, dtype="float64")
    >>> norm
    InstanceNorm(2)
    >>> y = norm(np.arange(12.0).reshape(1, 2, 6))
    >>> y.mean(axis=2).round(12), y.var(axis=2).round(4)
    (array([[0., 0.]]), array([[1., 1.]]))
    """

    scale: Any
    bias: Any
    running_mean: Any = dataclasses.field(metadata=_NOT_TRAINABLE)
    running_var: Any = dataclasses.field(metadata=_NOT_TRAINABLE)
    activation: Callable | None = None
    channels: int = 0
    eps: float = 1e-5
    momentum: float = 0.1
    active: bool | None = None

    def __init__(
        self,
        channels=None,
        activation=None,
        *,
        affine=False,
        track_stats=False,
        eps=1e-5,
        momentum=0.1,
        active=None,
        scale=None,
        bias=None,
        running_mean=None,
        running_var=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if channels is None:
            raise TypeError("InstanceNorm needs its number of channels, InstanceNorm(channels)")
        if momentum is None:
            raise ValueError(
                "InstanceNorm: momentum=None (a cumulative average) is BatchNorm's only; "
                "PyTorch's InstanceNorm with momentum=None never updates its running "
                "statistics, which momentum=0.0 does here"
            )
        _init_running(self, locals(), cumulative=False)

    def __call__(self, x):
        c = self.channels
        expected = f"(batch, {c}, positions...) with at least one position axis"
        self._expect(len(_shape(x)) >= 3 and _shape(x)[1] == c, x, expected)
        return _run(self, x, tuple(range(2, len(_shape(x)))), per_sample=True)

    def __repr__(self):
        if not isinstance(self.channels, int):
            return self._fields_repr()
        return f"InstanceNorm({self.channels}{_running_extra(self, False)})"


def _init_running(layer, given, cumulative):
    """Set the fields of a BatchNorm or an InstanceNorm from its constructor's arguments
    `given`: the arrays given (by dataclasses.replace, say), the others made like them."""
    scale, bias, mean, var = (given[k] for k in ("scale", "bias", "running_mean", "running_var"))
    xp, device, dtype, channels = given["xp"], given["device"], given["dtype"], given["channels"]
    _check_running_settings(type(layer).__name__, given["eps"], given["momentum"], mean, var)
    placed = [a for a in (scale, mean) if a is not None]
    if placed:  # place the others like them
        xp, device, dtype = namespace_of(data(placed[0])), _device(placed[0]), placed[0].dtype
    if scale is None and bias is None:
        scale, bias = _affine((channels,), given["affine"], dtype, device, xp)
    if mean is None and var is None and given["track_stats"]:
        mean, var = (asarray(s, xp=xp, device=device, dtype=dtype)
                     for s in (np.zeros(channels), np.ones(channels)))  # fmt: skip
    count = given.get("count")
    if count is None and cumulative and mean is not None:
        count = asarray(np.zeros((), dtype=np.int64), xp=xp, device=device)
    layer.scale, layer.bias, layer.running_mean, layer.running_var = scale, bias, mean, var
    layer.activation, layer.channels, layer.eps = given["activation"], channels, given["eps"]
    layer.momentum, layer.active = given["momentum"], given["active"]
    if "count" in given:
        layer.count = count


def _check_running_settings(name, eps, momentum, mean, var):
    """`eps` a number >= 0, `momentum` one in [0, 1] (or None): a nan made every running
    statistic nan, silently; the running mean and variance given together."""
    if not (isinstance(eps, numbers.Real) and 0 <= eps < math.inf):
        raise ValueError(f"{name}: eps must be a finite number >= 0, got {eps!r}")
    if momentum is not None and not (isinstance(momentum, numbers.Real) and 0 <= momentum <= 1):
        raise ValueError(f"{name}: momentum must be a number in [0, 1] (or None), got {momentum!r}")
    if (mean is None) != (var is None):
        raise ValueError(f"{name}: give running_mean and running_var together, or neither")


def _run(layer, x, axes, per_sample):
    """A BatchNorm's or InstanceNorm's forward: `x` normalised over `axes` by its own
    statistics (in training mode, or without running ones; then the running ones updated) or
    by the running ones, then scaled, shifted and activated."""
    like = layer.scale if layer.scale is not None else layer.running_mean
    if like is not None:  # else (affine=False, track_stats=False) the input's own dtype
        x = _match_dtype(x, like)
    training = layer.active
    if training is None:  # inside gradient: the input or the layer's scale is tracked
        training = recording.tracks(x) or recording.tracks(layer.scale)
    if training or layer.running_mean is None:
        y = _normalised(x, axes, layer.eps)
        if training and layer.running_mean is not None:
            _track(layer, detached(_wide(x)), axes, per_sample)
    else:
        shape = _channel_shape(x)
        # no gradient, and read anew by every replay of tg.compile
        mean, var = (_wide(_read(s)) for s in (layer.running_mean, layer.running_var))
        centred = subtract(_wide(x), reshape(mean, shape))
        y = divide(centred, reshape(sqrt(add(var, layer.eps)), shape))
        y = y if y.dtype == data(x).dtype else astype(y, data(x).dtype)
    y = _scale_shift(y, layer.scale, layer.bias, _channel_shape(x))
    return _activate(layer.activation, y)


def _track(layer, x, axes, per_sample):
    """Update the running statistics in place from the batch `x` (no gradient); while
    tg.compile records, the update is part of the program: every replay writes it."""
    if math.prod(x.shape[a] for a in axes) < 2:
        per, fix = ("position", "more positions") if per_sample else ("value", "a larger batch")
        raise ValueError(
            f"{layer!r} in training mode needs more than one {per} per channel to estimate a "
            f"variance, got an input of shape {tuple(x.shape)}; use {fix}, or "
            "testmode(model) to use the running statistics"
        )
    counts = ()
    if layer.momentum is None:  # the cumulative average: momentum 1 / count
        counts = (_counted(_read(layer.count)),)
    for running, correction in ((layer.running_mean, None), (layer.running_var, 1)):
        new = _running(_read(running), x, *counts, axes=axes, momentum=layer.momentum,
                       correction=correction, per_sample=per_sample)  # fmt: skip
        recording.write(data(running), new)
    if counts:
        recording.write(data(layer.count), counts[0])


def _running_extra(layer, default):
    """The repr's options of a BatchNorm (`default` True: affine, with running statistics) or
    an InstanceNorm (`default` False)."""
    extra = "" if layer.activation is None else f", {_describe(layer.activation)}"
    for name, value in (("affine", layer.scale), ("track_stats", layer.running_mean)):
        if (value is not None) != default:
            extra += f", {name}={not default}"
    extra += ", momentum=None" if layer.momentum is None else ""
    return extra + ("" if layer.active is None else f", active={layer.active}")


def _running_forward(xp, running, x, *count, axes, momentum, correction, per_sample=False):
    """`running * (1 - momentum) + batch * momentum`, the batch's mean (`correction` None) or
    variance over `axes` (of each sample, then averaged over the batch, `per_sample`);
    `momentum` None: `1 / count`, the batches counted so far, this one included."""
    if correction is None:
        batch = xp.mean(x, axis=axes)
    else:
        batch = xp.var(x, axis=axes, correction=correction)
    if per_sample:
        batch = xp.mean(batch, axis=0)
    if momentum is None:  # 1 / count in float64, as PyTorch computes it
        momentum = 1 / xp.astype(count[0], xp.float64)
    new = running * (1 - momentum) + batch * momentum
    return new if new.dtype == running.dtype else xp.astype(new, running.dtype)


_running = no_gradient("batchnorm_running_statistic", _running_forward)
_counted = no_gradient("batchnorm_count", lambda xp, count: count + 1)


def _read(buffer):
    """A running statistic as a step reads it: no gradient, and, while tg.compile records, read
    anew by every replay (a buffer the step wrote: its new value)."""
    return data(buffer) if recording.current() is None else recording.read(buffer)


def _device(x):
    return device_of(data(x))
