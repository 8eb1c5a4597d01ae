"""Convolution and pooling over NCHW images: `Conv`, `ConvTranspose`, `MaxPool`, `MeanPool`.

Each is `im2col` then a matmul (`Conv`, through `linear`; one batched matmul over the groups
of a grouped convolution), a matmul then `col2im` (`ConvTranspose`, its adjoint), or a
reduction over each window (the pools), so their gradients are those of the primitives. Sizes
(`kernel`, `stride`, `pad`, `dilation`, `window`) are ints or pairs of ints; an input smaller
than the window is a clear error.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..rules.elementwise import add
from ..rules.linalg import matmul, matrix_transpose
from ..rules.reductions import max as _max
from ..rules.reductions import mean
from ..rules.shape import permute_dims, reshape
from .activations import _activate
from .init import _rng, glorot_uniform
from .layers import Layer, _bias, _describe, _is_layer_field, _match_dtype, _shape
from .placement import asarray
from .primitives import _output_size, col2im, im2col, linear

__all__ = ["Conv", "ConvTranspose", "MaxPool", "MeanPool"]


def _pair(name, value, what):
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 0 for v in pair):
        raise ValueError(f"{name}: {what} must be an int or a pair of ints >= 0, got {value!r}")
    return pair


@dataclass(init=False, repr=False)
class Conv(Layer):
    """2-D convolution (cross-correlation, as Flux and PyTorch) of NCHW input, by im2col and a
    matmul: `weight` is `(out_channels, in_channels // groups, kh, kw)` (PyTorch's layout).

    `Conv(kernel, in_channels, out_channels, activation, stride=1, pad=0, dilation=1,
    groups=1)`, Flux's order (`pad="same"` keeps the size at stride 1), or
    `Conv(weight=W, bias=b, ...)`. `dilation` spaces the kernel's taps; `groups` splits the
    channels into that many independent convolutions (`groups=in_channels`: depthwise).
    """

    weight: Any
    bias: Any
    activation: Callable | None
    stride: tuple
    pad: tuple
    dilation: tuple
    groups: int

    def __init__(
        self,
        kernel=None,
        in_channels=None,
        out_channels=None,
        activation=None,
        *,
        stride=1,
        pad=0,
        dilation=1,
        groups=1,
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
            _check_groups("Conv", groups, in_channels, out_channels)
            kernel = _pair("Conv", kernel, "kernel")
            values = init(_rng(rng), (out_channels, in_channels // groups, *kernel))
            weight = asarray(values, xp=xp, device=device, dtype=dtype)
        if len(weight.shape) != 4:
            raise ValueError(f"Conv weight must be (out, in, kh, kw), got shape {weight.shape}")
        _check_groups("Conv", groups, weight.shape[1] * groups, weight.shape[0])
        self.weight = weight
        self.bias = _bias(bias, weight, weight.shape[0])
        self.activation = activation
        _set_geometry(self, "Conv", tuple(weight.shape[2:]), stride, pad, dilation, groups)

    def __call__(self, x):
        o, cg, kh, kw = self.weight.shape
        c = cg * self.groups
        self._expect(len(_shape(x)) == 4 and _shape(x)[1] == c, x, f"(batch, {c}, height, width)")
        n, _, h, w = x.shape
        oh, ow = _spatial(self, (h, w), (kh, kw), self.stride, self.pad, self.dilation)
        cols = im2col(
            _match_dtype(x, self.weight),
            kernel=(kh, kw),
            stride=self.stride,
            pad=self.pad,
            dilation=self.dilation,
        )
        weight = reshape(self.weight, (o, cg * kh * kw))
        if self.groups == 1:
            y = linear(cols, weight, self.bias)
        else:
            y = _grouped(cols, matrix_transpose(_split(weight, self.groups, 0)), self.groups)
            y = y if self.bias is None else add(y, self.bias)
        y = permute_dims(reshape(y, (n, oh, ow, o)), (0, 3, 1, 2))
        return _activate(self.activation, y)

    def __repr__(self):
        if not _is_layer_field(self.weight) or not isinstance(self.stride[0], int):
            return self._fields_repr()
        o, cg, kh, kw = self.weight.shape
        return f"Conv(({kh}, {kw}), {cg * self.groups} => {o}{_geometry_repr(self)})"


@dataclass(init=False, repr=False)
class ConvTranspose(Layer):
    """2-D transposed convolution of NCHW input (the adjoint of `Conv`'s map, "deconvolution"):
    each input pixel adds the kernel, scaled, into a window of the output. `weight` is
    `(in_channels, out_channels // groups, kh, kw)` (PyTorch's layout); the output is
    `(h - 1) * stride - 2 * pad + dilation * (k - 1) + 1 + outpad` high (and wide).

    `ConvTranspose(kernel, in_channels, out_channels, activation, stride=1, pad=0, dilation=1,
    groups=1, outpad=0)`, Flux's order, or `ConvTranspose(weight=W, bias=b, ...)`.
    """

    weight: Any
    bias: Any
    activation: Callable | None
    stride: tuple
    pad: tuple
    dilation: tuple
    groups: int
    outpad: tuple

    def __init__(
        self,
        kernel=None,
        in_channels=None,
        out_channels=None,
        activation=None,
        *,
        stride=1,
        pad=0,
        dilation=1,
        groups=1,
        outpad=0,
        weight=None,
        bias=True,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        name = "ConvTranspose"
        if weight is None:
            if kernel is None or in_channels is None or out_channels is None:
                raise TypeError(
                    f"{name} needs {name}(kernel, in_channels, out_channels) or weight="
                )
            _check_groups(name, groups, in_channels, out_channels)
            kernel = _pair(name, kernel, "kernel")
            values = init(_rng(rng), (in_channels, out_channels // groups, *kernel))
            weight = asarray(values, xp=xp, device=device, dtype=dtype)
        if len(weight.shape) != 4:
            raise ValueError(f"{name} weight must be (in, out, kh, kw), got shape {weight.shape}")
        _check_groups(name, groups, weight.shape[0], weight.shape[1] * groups)
        self.weight = weight
        self.bias = _bias(bias, weight, weight.shape[1] * groups)
        self.activation = activation
        _set_geometry(self, name, tuple(weight.shape[2:]), stride, pad, dilation, groups)
        self.outpad = _pair(name, outpad, "outpad")
        if any(p >= s for p, s in zip(self.outpad, self.stride)):
            raise ValueError(
                f"{name}: outpad {self.outpad} must be smaller than the stride {self.stride}; "
                "it only picks one of the output sizes a strided convolution maps to one size"
            )

    def __call__(self, x):
        c, og, kh, kw = self.weight.shape
        o = og * self.groups
        self._expect(len(_shape(x)) == 4 and _shape(x)[1] == c, x, f"(batch, {c}, height, width)")
        n, _, h, w = x.shape
        size = tuple(
            (n_in - 1) * s - 2 * p + d * (k - 1) + 1 + op
            for n_in, k, s, p, d, op in zip(
                (h, w), (kh, kw), self.stride, self.pad, self.dilation, self.outpad
            )
        )
        if min(size) < 1:
            self._refuse(x, f"an input large enough for an output of at least 1x1, not {size}")
        rows = reshape(permute_dims(_match_dtype(x, self.weight), (0, 2, 3, 1)), (n * h * w, c))
        weight = reshape(self.weight, (c, og * kh * kw))
        if self.groups == 1:
            cols = matmul(rows, weight)
        else:
            cols = _grouped(rows, _split(weight, self.groups, 0), self.groups)
        y = col2im(
            cols,
            shape=(n, o, *size),
            kernel=(kh, kw),
            stride=self.stride,
            pad=self.pad,
            dilation=self.dilation,
        )
        if self.bias is not None:
            y = add(y, reshape(self.bias, (1, o, 1, 1)))
        return _activate(self.activation, y)

    def __repr__(self):
        if not _is_layer_field(self.weight) or not isinstance(self.stride[0], int):
            return self._fields_repr()
        c, og, kh, kw = self.weight.shape
        extra = _geometry_repr(self)
        extra += "" if self.outpad == (0, 0) else f", outpad={self.outpad}"
        return f"ConvTranspose(({kh}, {kw}), {c} => {og * self.groups}{extra})"


def _check_groups(name, groups, in_channels, out_channels):
    if not (isinstance(groups, int) and groups >= 1):
        raise ValueError(f"{name}: groups must be an int >= 1, got {groups!r}")
    if in_channels % groups or out_channels % groups:
        raise ValueError(
            f"{name}: groups={groups} must divide the input channels ({in_channels}) and the "
            f"output channels ({out_channels}); choose a common divisor"
        )


def _set_geometry(layer, name, kernel, stride, pad, dilation, groups):
    layer.stride = _pair(name, stride, "stride")
    layer.dilation = _pair(name, dilation, "dilation")
    if 0 in layer.stride or 0 in layer.dilation:
        raise ValueError(
            f"{name}: stride and dilation must be positive, got {stride!r}, {dilation!r}"
        )
    layer.pad = _same_pad(kernel, layer.dilation) if pad == "same" else _pair(name, pad, "pad")
    layer.groups = groups


def _geometry_repr(layer):
    extra = "" if layer.activation is None else f", {_describe(layer.activation)}"
    for field, default in (("stride", (1, 1)), ("pad", (0, 0)), ("dilation", (1, 1))):
        value = getattr(layer, field)
        extra += "" if value == default else f", {field}={value}"
    extra += "" if layer.groups == 1 else f", groups={layer.groups}"
    return extra + ("" if layer.bias is not None else ", bias=False")


def _split(weight, groups, axis):
    """A 2-D weight split into `groups` blocks along `axis` 0: `(groups, rows / groups, cols)`."""
    rows, cols = weight.shape
    return reshape(weight, (groups, rows // groups, cols))


def _grouped(rows, weights, groups):
    """`rows` (m, groups * k) times each group's block of `weights` (groups, k, n) into
    (m, groups * n): one batched matmul."""
    m = rows.shape[0]
    per_group = permute_dims(reshape(rows, (m, groups, rows.shape[1] // groups)), (1, 0, 2))
    out = matmul(per_group, weights)  # (groups, m, n)
    return reshape(permute_dims(out, (1, 0, 2)), (m, groups * out.shape[-1]))


def _same_pad(kernel, dilation=(1, 1)):
    span = [d * (k - 1) for k, d in zip(kernel, dilation)]
    if any(s % 2 for s in span):
        raise ValueError(f'pad="same" needs an odd kernel (or an even dilation), got {kernel}')
    return tuple(s // 2 for s in span)


def _spatial(layer, size, kernel, stride, pad, dilation=(1, 1)):
    """The output height and width, or a clear error when the input is too small."""
    out = tuple(
        _output_size(n, k, s, p, d) for n, k, s, p, d in zip(size, kernel, stride, pad, dilation)
    )
    if min(out) < 1:
        raise ValueError(
            f"{layer!r}: an input of height and width {size} is smaller than the window "
            f"{kernel} (padding {pad}, dilation {dilation})"
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
    ignored, as -inf). Ties in a window share its gradient evenly (as `tg.max` does; PyTorch's
    max_pool2d gives it all to one of them)."""

    def __call__(self, x):
        rows, shape = self._windows(x, -math.inf)
        return reshape(_max(rows, axis=-1), shape)


class MeanPool(_Pool):
    """The mean of each window of NCHW input (`stride` defaults to the window; padding counts as
    zeros, as in Flux)."""

    def __call__(self, x):
        rows, shape = self._windows(x, 0.0)
        return reshape(mean(rows, axis=-1), shape)
