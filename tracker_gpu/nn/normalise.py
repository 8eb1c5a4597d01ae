"""Normalisation layers: `LayerNorm`, `GroupNorm` and `BatchNorm`, and `normalise`.

Each normalises its input to zero mean and unit variance over some axes with the `normalise`
primitive (one tape node, one fused kernel each way on the GPU), then scales and shifts it per
feature or channel (`affine=True`: `scale` ones, `bias` zeros). Images are NCHW: channels on
axis 1.

`BatchNorm` keeps running estimates of each channel's mean and variance, updated (in place, as
Flux does) when it runs in training mode and used in test mode. It is in training mode inside
`gradient` (when its input or its own scale is tracked) and in test mode otherwise, unless
`active` or `trainmode`/`testmode` say otherwise. The running statistics are fields of the
model (so `save`, `place` and checkpoints carry them), declared not trainable: they never enter
the gradient and `optim.setup` gives them no state.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import recording
from ..backend import device_of, namespace_of
from ..primitive import detached, no_gradient
from ..rules.elementwise import add, divide, multiply, sqrt, subtract
from ..rules.nn import normalise
from ..rules.shape import reshape
from ..tracked import data
from .activations import _activate
from .layers import Layer, _describe, _match_dtype, _shape
from .placement import asarray

__all__ = ["LayerNorm", "GroupNorm", "BatchNorm", "normalise"]

_NOT_TRAINABLE = {"trainable": False}


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


def _extra(layer):
    extra = "" if layer.activation is None else f", {_describe(layer.activation)}"
    return extra + ("" if layer.scale is not None else ", affine=False")


@dataclass(init=False, repr=False)
class LayerNorm(Layer):
    """Normalise the last `len(size)` axes to zero mean and unit variance, then scale and shift
    (`affine=True`, the default: `scale` ones and `bias` zeros, of shape `size`)."""

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
            scale, bias = _affine(size, affine, dtype, device, xp)
        self.scale, self.bias, self.activation = scale, bias, activation
        self.eps, self.size = eps, size

    def __call__(self, x):
        k, n = len(self.size), len(_shape(x))
        self._expect(_shape(x)[n - k :] == self.size, x, f"trailing axes {self.size}")
        y = normalise(x, axes=tuple(range(n - k, n)), eps=self.eps)
        if self.scale is not None:
            y = add(multiply(y, self.scale), self.bias)
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
        grouped = reshape(x, (n, self.groups, -1))
        y = reshape(normalise(grouped, axes=(2,), eps=self.eps), tuple(x.shape))
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
    (automatic: training inside `gradient`), True or False."""

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
        affine=True,
        track_stats=True,
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
            raise TypeError("BatchNorm needs its number of channels, BatchNorm(channels)")
        given = [a for a in (scale, running_mean) if a is not None]
        if given:  # arrays given (dataclasses.replace): place the others like them
            xp, device, dtype = namespace_of(data(given[0])), _device(given[0]), given[0].dtype
        if scale is None and bias is None:
            scale, bias = _affine((channels,), affine, dtype, device, xp)
        if running_mean is None and running_var is None and track_stats:
            running_mean, running_var = (
                asarray(s, xp=xp, device=device, dtype=dtype)
                for s in (np.zeros(channels), np.ones(channels))
            )
        self.scale, self.bias, self.running_mean, self.running_var = (
            scale,
            bias,
            running_mean,
            running_var,
        )
        self.activation, self.channels = activation, channels
        self.eps, self.momentum, self.active = eps, momentum, active

    def __call__(self, x):
        c = self.channels
        self._expect(len(_shape(x)) >= 2 and _shape(x)[1] == c, x, f"(batch, {c}, ...)")
        like = self.scale if self.scale is not None else self.running_mean
        if like is not None:  # else (affine=False, track_stats=False) the input's own dtype
            x = _match_dtype(x, like)
        axes = (0,) + tuple(range(2, len(x.shape)))
        training = self.active
        if training is None:  # inside gradient: the input or the layer's scale is tracked
            training = recording.tracks(x) or recording.tracks(self.scale)
        if training or self.running_mean is None:
            y = normalise(x, axes=axes, eps=self.eps)
            if training and self.running_mean is not None:
                self._track(detached(x), axes)
        else:
            shape = _channel_shape(x)
            # no gradient, and read anew by every replay of tg.compile
            mean, var = _read(self.running_mean), _read(self.running_var)
            centred = subtract(x, reshape(mean, shape))
            y = divide(centred, reshape(sqrt(add(var, self.eps)), shape))
        return _activate(self.activation, _scale_shift(y, self.scale, self.bias, _channel_shape(x)))

    def _track(self, x, axes):
        """Update the running statistics in place from the batch `x` (no gradient); while
        tg.compile records, the update is part of the program: every replay writes it."""
        count = math.prod(x.shape) // x.shape[1]
        if count < 2:
            raise ValueError(
                f"{self!r} in training mode needs more than one value per channel to estimate a "
                f"variance, got an input of shape {tuple(x.shape)}; use a larger batch, or "
                "testmode(model) to use the running statistics"
            )
        for running, correction in ((self.running_mean, None), (self.running_var, 1)):
            new = _running(_read(running), x, axes=axes, momentum=self.momentum,
                           correction=correction)  # fmt: skip
            recording.write(data(running), new)

    def __repr__(self):
        if not isinstance(self.momentum, float | int):
            return self._fields_repr()
        extra = _extra(self) + ("" if self.active is None else f", active={self.active}")
        return f"BatchNorm({self.channels}{extra})"


def _running_forward(xp, running, x, *, axes, momentum, correction):
    """`running * (1 - momentum) + batch * momentum`, the batch's mean (`correction` None) or
    variance."""
    if correction is None:
        batch = xp.mean(x, axis=axes)
    else:
        batch = xp.var(x, axis=axes, correction=correction)
    return running * (1 - momentum) + batch * momentum


_running = no_gradient("batchnorm_running_statistic", _running_forward)


def _read(buffer):
    """A running statistic as a step reads it: no gradient, and, while tg.compile records, read
    anew by every replay (a buffer the step wrote: its new value)."""
    return data(buffer) if recording.current() is None else recording.read(buffer)


def _device(x):
    return device_of(data(x))
