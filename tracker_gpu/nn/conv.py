"""Convolution and pooling over NCHW images: `Conv`, `MaxPool` and `MeanPool`.

Each is `im2col` then a matmul (`Conv`, through `linear`) or a reduction over each window (the
pools), so their gradients are those of the primitives. Sizes (`kernel`, `stride`, `pad`,
`window`) are ints or pairs of ints; an input smaller than the window is a clear error.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..rules.reductions import max as _max
from ..rules.reductions import mean
from ..rules.shape import permute_dims, reshape
from .activations import _activate
from .init import _rng, glorot_uniform
from .layers import Layer, _bias, _describe, _is_layer_field, _match_dtype, _shape
from .placement import asarray
from .primitives import _output_size, im2col, linear

__all__ = ["Conv", "MaxPool", "MeanPool"]


def _pair(name, value, what):
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 0 for v in pair):
        raise ValueError(f"{name}: {what} must be an int or a pair of ints >= 0, got {value!r}")
    return pair


@dataclass(init=False, repr=False)
class Conv(Layer):
    """2-D convolution (cross-correlation, as Flux and PyTorch) of NCHW input, by im2col and a
    matmul: `weight` is `(out_channels, in_channels, kh, kw)`, `stride` and `pad` pairs of ints.

    `Conv(kernel, in_channels, out_channels, activation, stride=1, pad=0)`, Flux's order
    (`pad="same"` keeps the size of an odd kernel at stride 1), or `Conv(weight=W, bias=b, ...)`.
    """

    weight: Any
    bias: Any
    activation: Callable | None
    stride: tuple
    pad: tuple

    def __init__(
        self,
        kernel=None,
        in_channels=None,
        out_channels=None,
        activation=None,
        *,
        stride=1,
        pad=0,
        weight=None,
        bias=True,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if weight is None:
            if kernel is None or in_channels is None or out_channels is None:
                raise TypeError("Conv needs Conv(kernel, in_channels, out_channels) or weight=")
            kernel = _pair("Conv", kernel, "kernel")
            values = init(_rng(rng), (out_channels, in_channels, *kernel))
            weight = asarray(values, xp=xp, device=device, dtype=dtype)
        if len(weight.shape) != 4:
            raise ValueError(f"Conv weight must be (out, in, kh, kw), got shape {weight.shape}")
        self.weight = weight
        self.bias = _bias(bias, weight, weight.shape[0])
        self.activation = activation
        self.stride = _pair("Conv", stride, "stride")
        self.pad = (
            _same_pad(tuple(weight.shape[2:])) if pad == "same" else _pair("Conv", pad, "pad")
        )
        if 0 in self.stride:
            raise ValueError(f"Conv: stride must be positive, got {stride!r}")

    def __call__(self, x):
        o, c, kh, kw = self.weight.shape
        self._expect(len(_shape(x)) == 4 and _shape(x)[1] == c, x, f"(batch, {c}, height, width)")
        n, _, h, w = x.shape
        oh, ow = _spatial(self, (h, w), (kh, kw), self.stride, self.pad)
        cols = im2col(
            _match_dtype(x, self.weight), kernel=(kh, kw), stride=self.stride, pad=self.pad
        )
        y = linear(cols, reshape(self.weight, (o, c * kh * kw)), self.bias)
        y = permute_dims(reshape(y, (n, oh, ow, o)), (0, 3, 1, 2))
        return _activate(self.activation, y)

    def __repr__(self):
        if not _is_layer_field(self.weight) or not isinstance(self.stride[0], int):
            return self._fields_repr()
        o, c, kh, kw = self.weight.shape
        extra = "" if self.activation is None else f", {_describe(self.activation)}"
        extra += "" if self.stride == (1, 1) else f", stride={self.stride}"
        extra += "" if self.pad == (0, 0) else f", pad={self.pad}"
        extra += "" if self.bias is not None else ", bias=False"
        return f"Conv(({kh}, {kw}), {c} => {o}{extra})"


def _same_pad(kernel):
    if any(k % 2 == 0 for k in kernel):
        raise ValueError(f'pad="same" needs an odd kernel, got {kernel}')
    return tuple(k // 2 for k in kernel)


def _spatial(layer, size, kernel, stride, pad):
    """The output height and width, or a clear error when the input is too small."""
    out = tuple(_output_size(n, k, s, p) for n, k, s, p in zip(size, kernel, stride, pad))
    if min(out) < 1:
        raise ValueError(
            f"{layer!r}: an input of height and width {size} is smaller than the window "
            f"{kernel} (padding {pad})"
        )
    return out


@dataclass(init=False, repr=False)
class _Pool(Layer):
    window: tuple
    stride: tuple
    pad: tuple

    def __init__(self, window=2, *, stride=None, pad=0):
        self.window = _pair(type(self).__name__, window, "window")
        self.stride = (
            self.window if stride is None else _pair(type(self).__name__, stride, "stride")
        )
        self.pad = _pair(type(self).__name__, pad, "pad")
        if 0 in self.window or 0 in self.stride:
            raise ValueError(f"{type(self).__name__}: window and stride must be positive")
        if any(p >= k for p, k in zip(self.pad, self.window)):
            raise ValueError(f"{type(self).__name__}: padding must be smaller than the window")

    def _windows(self, x, fill):
        """`(rows, shape)`: one row per window, and the NCHW shape of the output."""
        self._expect(len(_shape(x)) == 4, x, "(batch, channels, height, width)")
        n, c, h, w = x.shape
        oh, ow = _spatial(self, (h, w), self.window, self.stride, self.pad)
        images = reshape(x, (n * c, 1, h, w))
        rows = im2col(images, kernel=self.window, stride=self.stride, pad=self.pad, fill=fill)
        return rows, (n, c, oh, ow)

    def __repr__(self):
        if not all(isinstance(v, int) for v in self.window):
            return self._fields_repr()
        extra = "" if self.stride == self.window else f", stride={self.stride}"
        extra += "" if self.pad == (0, 0) else f", pad={self.pad}"
        return f"{type(self).__name__}({self.window}{extra})"


class MaxPool(_Pool):
    """The maximum of each window of NCHW input (`stride` defaults to the window; padding is
    ignored, as -inf). Ties send the gradient to the first maximum."""

    def __call__(self, x):
        rows, shape = self._windows(x, -math.inf)
        return reshape(_max(rows, axis=-1), shape)


class MeanPool(_Pool):
    """The mean of each window of NCHW input (`stride` defaults to the window; padding counts as
    zeros, as in Flux)."""

    def __call__(self, x):
        rows, shape = self._windows(x, 0.0)
        return reshape(mean(rows, axis=-1), shape)
