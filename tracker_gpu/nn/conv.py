"""Convolutions over 1, 2 or 3 spatial axes (any number, in fact): `Conv`, `ConvTranspose`.

The spatial rank is the length of the kernel tuple, as in Flux: `Conv((5,), 2, 4)` takes
`(batch, 2, length)`, `Conv((3, 3), 2, 4)` NCHW images, `Conv((3, 3, 3), 2, 4)`
`(batch, 2, depth, height, width)`; an int kernel is 2-D. `Conv` is `im2col` then a matmul
(through `linear`; one batched matmul over the groups of a grouped convolution), and
`ConvTranspose` a matmul then `col2im` (its adjoint), so their gradients are those of the
primitives. Sizes and padding are read by `geometry`; padding other than zeros by `padding`.
The pools are in `pool`.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..rules.elementwise import add
from ..rules.linalg import matmul, matrix_transpose
from ..rules.shape import permute_dims, reshape
from .activations import _activate
from .geometry import axes, kernel_of, output_size, padding, sides, sizes
from .init import _rng, glorot_uniform
from .layers import Layer, _bias, _describe, _is_layer_field, _match_dtype, _shape
from .padding import check_mode, pad_modes
from .placement import asarray
from .primitives import col2im, im2col, linear

__all__ = ["Conv", "ConvTranspose"]


@dataclass(init=False, repr=False)
class Conv(Layer):
    """Convolution (cross-correlation, as Flux and PyTorch) over 1, 2 or 3 spatial axes, by
    im2col and a matmul: `weight` is `(out_channels, in_channels // groups, *kernel)`
    (PyTorch's layout), the input `(batch, in_channels, *spatial)`.

    `Conv(kernel, in_channels, out_channels, activation, stride=1, pad=0, dilation=1,
    groups=1, pad_mode="zeros")`, Flux's order, or `Conv(weight=W, bias=b, ...)`. `kernel`
    is a tuple, one size per spatial axis (`(5,)`, `(3, 3)`, `(3, 3, 3)`), or an int (2-D).
    `pad` is an int, one int per axis, `(before, after)` for each axis in turn (asymmetric),
    `"valid"` or `"same"` (the size kept at stride 1; with an even kernel the extra row goes
    after, as in PyTorch: Flux puts it before). `pad_mode` is "zeros", "reflect", "replicate"
    or "circular". `dilation` spaces the kernel's taps; `groups` splits the channels into that
    many independent convolutions (`groups=in_channels`: depthwise).

    PyTorch: `Conv1d`, `Conv2d`, `Conv3d` with the same weight; `padding=` is our `pad`,
    `padding_mode=` our `pad_mode`. The default initialisation differs (Glorot uniform, Flux's;
    PyTorch's is Kaiming uniform with a = sqrt(5)): pass `init=` or `weight=` for another.

    >>> import numpy as np
    >>> conv = Conv((3,), 2, 4, pad="same", pad_mode="circular", rng=np.random.default_rng(0))
    >>> conv, conv(np.ones((8, 2, 10), dtype=np.float32)).shape
    (Conv((3,), 2 => 4, pad=(1,), pad_mode='circular'), (8, 4, 10))
    """

    weight: Any
    bias: Any
    activation: Callable | None
    stride: tuple
    pad: tuple
    dilation: tuple
    groups: int
    pad_mode: str

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
        pad_mode="zeros",
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
            kernel = kernel_of("Conv", kernel)
            values = init(_rng(rng), (out_channels, in_channels // groups, *kernel))
            weight = asarray(values, xp=xp, device=device, dtype=dtype)
        _check_weight("Conv", weight, "(out, in // groups, *kernel)")
        _check_groups("Conv", groups, weight.shape[1] * groups, weight.shape[0])
        self.weight = weight
        self.bias = _bias(bias, weight, weight.shape[0])
        self.activation = activation
        _set_geometry(self, "Conv", tuple(weight.shape[2:]), stride, pad, dilation, groups)
        self.pad_mode = check_mode("Conv", pad_mode)

    def __call__(self, x):
        o, cg, *kernel = self.weight.shape
        c, rank = cg * self.groups, len(kernel)
        self._expect(_fits(x, rank, c), x, f"(batch, {c}, {axes(rank)})")
        n, _, *size = x.shape
        pairs = sides(self.pad, rank)
        out = output_size(self, size, kernel, self.stride, pairs, self.dilation)
        x = _match_dtype(x, self.weight)
        if self.pad_mode != "zeros":
            x, pairs = pad_modes(x, pairs, self.pad_mode, self), ((0, 0),) * rank
        cols = im2col(
            x, kernel=tuple(kernel), stride=self.stride, pad=pairs, dilation=self.dilation
        )
        weight = reshape(self.weight, (o, cols.shape[1] // self.groups))
        if self.groups == 1:
            y = linear(cols, weight, self.bias)
        else:
            y = _grouped(cols, matrix_transpose(_split(weight, self.groups)), self.groups)
            y = y if self.bias is None else add(y, self.bias)
        y = permute_dims(reshape(y, (n, *out, o)), (0, rank + 1, *range(1, rank + 1)))
        return _activate(self.activation, y)

    def __repr__(self):
        if not _is_layer_field(self.weight) or not isinstance(self.stride[0], int):
            return self._fields_repr()
        o, cg, *kernel = self.weight.shape
        extra = _geometry_repr(self)
        extra += "" if self.pad_mode == "zeros" else f", pad_mode={self.pad_mode!r}"
        return f"Conv({tuple(kernel)}, {cg * self.groups} => {o}{extra})"


@dataclass(init=False, repr=False)
class ConvTranspose(Layer):
    """Transposed convolution over 1, 2 or 3 spatial axes (the adjoint of `Conv`'s map,
    "deconvolution"): each input pixel adds the kernel, scaled, into a window of the output.
    `weight` is `(in_channels, out_channels // groups, *kernel)` (PyTorch's layout); along each
    axis the output is `(n - 1) * stride - before - after + dilation * (k - 1) + 1 + outpad`
    long, `before` and `after` its padding.

    `ConvTranspose(kernel, in_channels, out_channels, activation, stride=1, pad=0, dilation=1,
    groups=1, outpad=0)`, Flux's order, or `ConvTranspose(weight=W, bias=b, ...)`; `kernel` and
    `pad` as in `Conv` (padding crops the output; zeros only).

    PyTorch: `ConvTranspose1d`, `ConvTranspose2d`, `ConvTranspose3d` with the same weight;
    `padding=` is our `pad` (symmetric there), `output_padding=` our `outpad`. The default
    initialisation differs (Glorot uniform, Flux's).

    >>> import numpy as np
    >>> up = ConvTranspose((2, 2, 2), 4, 2, stride=2, rng=np.random.default_rng(0))
    >>> up(np.ones((1, 4, 3, 3, 3), dtype=np.float32)).shape
    (1, 2, 6, 6, 6)
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
            kernel = kernel_of(name, kernel)
            values = init(_rng(rng), (in_channels, out_channels // groups, *kernel))
            weight = asarray(values, xp=xp, device=device, dtype=dtype)
        _check_weight(name, weight, "(in, out // groups, *kernel)")
        _check_groups(name, groups, weight.shape[0], weight.shape[1] * groups)
        self.weight = weight
        self.bias = _bias(bias, weight, weight.shape[1] * groups)
        self.activation = activation
        _set_geometry(self, name, tuple(weight.shape[2:]), stride, pad, dilation, groups)
        self.outpad = sizes(name, outpad, "outpad", len(weight.shape) - 2, minimum=0)
        if any(p >= s for p, s in zip(self.outpad, self.stride)):
            raise ValueError(
                f"{name}: outpad {self.outpad} must be smaller than the stride {self.stride}; "
                "it only picks one of the output sizes a strided convolution maps to one size "
                "(PyTorch also takes one below the dilation, which is not supported here)"
            )

    def __call__(self, x):
        c, og, *kernel = self.weight.shape
        o, rank = og * self.groups, len(kernel)
        self._expect(_fits(x, rank, c), x, f"(batch, {c}, {axes(rank)})")
        n, _, *spatial = x.shape
        pairs = sides(self.pad, rank)
        size = tuple(
            (m - 1) * s - before - after + d * (k - 1) + 1 + op
            for m, k, s, (before, after), d, op in zip(
                spatial, kernel, self.stride, pairs, self.dilation, self.outpad
            )
        )
        if min(size) < 1:
            self._refuse(x, f"an input large enough for an output of at least 1, not {size}")
        to_rows = (0, *range(2, rank + 2), 1)
        rows = permute_dims(_match_dtype(x, self.weight), to_rows)
        rows = reshape(rows, (n * math.prod(spatial), c))
        weight = reshape(self.weight, (c, og * math.prod(kernel)))
        if self.groups == 1:
            cols = matmul(rows, weight)
        else:
            cols = _grouped(rows, _split(weight, self.groups), self.groups)
        y = col2im(
            cols,
            shape=(n, o, *size),
            kernel=tuple(kernel),
            stride=self.stride,
            pad=pairs,
            dilation=self.dilation,
        )
        if self.bias is not None:
            y = add(y, reshape(self.bias, (1, o) + (1,) * rank))
        return _activate(self.activation, y)

    def __repr__(self):
        if not _is_layer_field(self.weight) or not isinstance(self.stride[0], int):
            return self._fields_repr()
        c, og, *kernel = self.weight.shape
        extra = _geometry_repr(self)
        extra += "" if not any(self.outpad) else f", outpad={self.outpad}"
        return f"ConvTranspose({tuple(kernel)}, {c} => {og * self.groups}{extra})"


def _fits(x, rank, channels):
    shape = _shape(x)
    return len(shape) == rank + 2 and shape[1] == channels


def _check_weight(name, weight, layout):
    if len(weight.shape) < 3:
        raise ValueError(
            f"{name} weight must be {layout}, with at least one spatial axis, got shape "
            f"{weight.shape}"
        )


def _check_groups(name, groups, in_channels, out_channels):
    if not (isinstance(groups, int) and groups >= 1):
        raise ValueError(f"{name}: groups must be an int >= 1, got {groups!r}")
    if in_channels % groups or out_channels % groups:
        raise ValueError(
            f"{name}: groups={groups} must divide the input channels ({in_channels}) and the "
            f"output channels ({out_channels}); choose a common divisor"
        )


def _set_geometry(layer, name, kernel, stride, pad, dilation, groups):
    rank = len(kernel)
    layer.stride = sizes(name, stride, "stride", rank)
    layer.dilation = sizes(name, dilation, "dilation", rank)
    layer.pad = padding(name, pad, kernel, layer.dilation)
    layer.groups = groups


def _geometry_repr(layer):
    extra = "" if layer.activation is None else f", {_describe(layer.activation)}"
    for field, default in (("stride", 1), ("pad", 0), ("dilation", 1)):
        value = getattr(layer, field)
        extra += "" if all(v == default for v in value) else f", {field}={value}"
    extra += "" if layer.groups == 1 else f", groups={layer.groups}"
    return extra + ("" if layer.bias is not None else ", bias=False")


def _split(weight, groups):
    """A 2-D weight split into `groups` blocks of rows: `(groups, rows / groups, cols)`."""
    rows, cols = weight.shape
    return reshape(weight, (groups, rows // groups, cols))


def _grouped(rows, weights, groups):
    """`rows` (m, groups * k) times each group's block of `weights` (groups, k, n) into
    (m, groups * n): one batched matmul."""
    m = rows.shape[0]
    per_group = permute_dims(reshape(rows, (m, groups, rows.shape[1] // groups)), (1, 0, 2))
    out = matmul(per_group, weights)  # (groups, m, n)
    return reshape(permute_dims(out, (1, 0, 2)), (m, groups * out.shape[-1]))
