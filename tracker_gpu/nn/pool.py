"""Pools over 1, 2 or 3 spatial axes: `MaxPool`, `MeanPool`, the adaptive pools (an output
size, PyTorch's bins) and the global pools (Flux's names).

The spatial rank is the length of the window tuple (an int window is 2-D), as for `Conv`. The
windowed pools reduce the rows of `im2col` (padding filled with -inf for the maximum, zeros for
the mean), so their gradients are those of the primitive and the reduction; the adaptive pools
reduce one spatial axis at a time (a box is a product of intervals), the global pools every
spatial axis at once. A maximum's ties share its gradient evenly (as `tg.max`; PyTorch gives it
all to one of them).
"""

import itertools
import math
from dataclasses import dataclass

from ..backend import device_of, isdtype, namespace_of
from ..rules.elementwise import divide
from ..rules.reductions import max as _max
from ..rules.reductions import mean
from ..rules.reductions import sum as _sum
from ..rules.shape import concat, getitem, reshape
from ..tracked import data
from .geometry import axes, ceil_extra, kernel_of, output_size, padding, sides, sizes
from .layers import Layer, _shape
from .primitives import im2col

__all__ = [
    "MaxPool",
    "MeanPool",
    "AdaptiveMaxPool",
    "AdaptiveMeanPool",
    "GlobalMaxPool",
    "GlobalMeanPool",
]


@dataclass(init=False, repr=False)
class _Pool(Layer):
    window: tuple
    stride: tuple
    pad: tuple
    ceil_mode: bool

    def _geometry(self, window, stride, pad, ceil_mode, dilation=1):
        name = type(self).__name__
        self.window = kernel_of(name, window, "window")
        rank = len(self.window)
        self.stride = self.window if stride is None else sizes(name, stride, "stride", rank)
        dilation = sizes(name, dilation, "dilation", rank)
        self.pad = padding(name, pad, self.window, dilation)
        self.ceil_mode = bool(ceil_mode)
        if any(max(pair) >= k for pair, k in zip(sides(self.pad, rank), self.window)):
            raise ValueError(
                f"{name}: padding must be smaller than the window {self.window}, got {self.pad}"
            )
        return dilation

    def _rows(self, x, fill, dilation):
        """`(rows, shape, pairs)`: one row per window, the output's shape, and the padding
        before and after each axis (the overhang of `ceil_mode` included)."""
        rank = len(self.window)
        self._expect(len(_shape(x)) == rank + 2, x, f"(batch, channels, {axes(rank)})")
        n, c, *size = x.shape
        pairs = sides(self.pad, rank)
        geometry = (size, self.window, self.stride, pairs, dilation)
        out = output_size(self, *geometry, ceil_mode=self.ceil_mode)
        grown = ceil_extra(*geometry, out) if self.ceil_mode else pairs
        images = reshape(x, (n * c, 1, *size))
        rows = im2col(
            images, kernel=self.window, stride=self.stride, pad=grown, fill=fill, dilation=dilation
        )
        return rows, (n, c, *out), grown

    def _extra_repr(self):
        extra = "" if self.stride == self.window else f", stride={self.stride}"
        extra += "" if not any(self.pad) else f", pad={self.pad}"
        return extra + (", ceil_mode=True" if self.ceil_mode else "")

    def __repr__(self):
        if not all(isinstance(v, int) for v in self.window):
            return self._fields_repr()
        return f"{type(self).__name__}({self.window}{self._extra_repr()})"


@dataclass(init=False, repr=False)
class MaxPool(_Pool):
    """The maximum of each window of `(batch, channels, *spatial)` input, 1, 2 or 3 spatial axes
    (`window` a tuple, one size per axis, or an int: 2-D).

    `MaxPool(window, stride=window, pad=0, dilation=1, ceil_mode=False)`: Flux's name and
    defaults; padding (as `Conv`'s: ints, `(before, after)` per axis, "same") is ignored, as
    -inf; `dilation` spaces the window's taps; `ceil_mode` keeps a last window that overhangs
    the end (PyTorch's rule: it starts inside the input or its padding before).

    PyTorch: `MaxPool1d`, `MaxPool2d`, `MaxPool3d` (`kernel_size`, `stride`, `padding`,
    `dilation`, `ceil_mode`); the same defaults. Ties share the gradient (PyTorch: one takes it).

    >>> import numpy as np
    >>> MaxPool((2,), ceil_mode=True)(np.arange(5.0).reshape(1, 1, 5))
    array([[[1., 3., 4.]]])
    """

    dilation: tuple

    def __init__(self, window=2, *, stride=None, pad=0, dilation=1, ceil_mode=False):
        self.dilation = self._geometry(window, stride, pad, ceil_mode, dilation)

    def __call__(self, x):
        rows, shape, _ = self._rows(x, _lowest(x), self.dilation)
        return reshape(_max(rows, axis=-1), shape)

    def _extra_repr(self):
        extra = super()._extra_repr()
        return extra + ("" if set(self.dilation) == {1} else f", dilation={self.dilation}")


def _lowest(x):
    """What no element of `x` is below, padding for a maximum: -inf, or the least value of an
    integer dtype (-inf cast to int8 was 0, above every negative element), or False."""
    plain = data(x)
    xp = namespace_of(plain)
    if isdtype(xp, plain.dtype, "bool"):
        return False
    if isdtype(xp, plain.dtype, "integral"):
        return int(xp.iinfo(plain.dtype).min)
    return -math.inf


@dataclass(init=False, repr=False)
class MeanPool(_Pool):
    """The mean of each window of `(batch, channels, *spatial)` input, 1, 2 or 3 spatial axes
    (`window` a tuple, one size per axis, or an int: 2-D).

    `MeanPool(window, stride=window, pad=0, ceil_mode=False, count_include_pad=True)`: Flux's
    name and defaults; padding (as `Conv`'s) counts as zeros in the mean unless
    `count_include_pad=False` (then each window divides by the inputs it covers); `ceil_mode`
    as `MaxPool`'s, the overhang never counted.

    PyTorch: `AvgPool1d`, `AvgPool2d`, `AvgPool3d` (`kernel_size`, `stride`, `padding`,
    `ceil_mode`, `count_include_pad`); the same defaults; no `divisor_override`.

    >>> import numpy as np
    >>> MeanPool((2,), pad=1, count_include_pad=False)(np.arange(4.0).reshape(1, 1, 4))
    array([[[0. , 1.5, 3. ]]])
    """

    count_include_pad: bool

    def __init__(self, window=2, *, stride=None, pad=0, ceil_mode=False, count_include_pad=True):
        self._geometry(window, stride, pad, ceil_mode)
        self.count_include_pad = bool(count_include_pad)

    def __call__(self, x):
        ones = (1,) * len(self.window)
        rows, shape, grown = self._rows(x, 0.0, ones)
        pairs = sides(self.pad, len(self.window))
        if grown == pairs and (self.count_include_pad or not any(self.pad)):
            return reshape(mean(rows, axis=-1), shape)  # every window counts all its cells
        counts = self._counts(x, shape[2:])
        return divide(reshape(_sum(rows, axis=-1), shape), counts)

    def _counts(self, x, out):
        """How many cells each window divides by, PyTorch's: those inside the input and, with
        `count_include_pad`, its padding; a constant of `out`'s shape placed like `x`."""
        per_axis = []
        for a, (o, k, s, (before, after)) in enumerate(
            zip(out, self.window, self.stride, sides(self.pad, len(out)))
        ):
            n = x.shape[2 + a]
            low, high = (-before, n + after) if self.count_include_pad else (0, n)
            starts = [i * s - before for i in range(o)]
            per_axis.append([min(t + k, high) - max(t, low) for t in starts])
        values = [math.prod(c) for c in itertools.product(*per_axis)]
        plain = data(x)
        xp = namespace_of(plain)
        floating = isdtype(xp, plain.dtype, "real floating")  # else integers: a true division
        dtype = plain.dtype if floating else None  # (a bool's counts were all True, 1)
        counts = xp.asarray(values, dtype=dtype, device=device_of(plain))
        return xp.reshape(counts, (1, 1, *out))

    def _extra_repr(self):
        extra = super()._extra_repr()
        return extra + ("" if self.count_include_pad else ", count_include_pad=False")


def _output_sizes(name, out):
    """The output size of an adaptive pool: ints >= 1 or None (the input's size), one per axis;
    an int is 2-D."""
    if isinstance(out, int) and not isinstance(out, bool):
        out = (out, out)
    if not isinstance(out, (tuple, list)) or not out:
        raise ValueError(f"{name}: the output size must be a tuple of sizes, got {out!r}")
    if not all(v is None or (isinstance(v, int) and v >= 1) for v in out):
        raise ValueError(f"{name}: the output sizes must be ints >= 1 or None, got {out!r}")
    return tuple(out)


def _bins(n, o):
    """PyTorch's bins of an adaptive pool: `floor(i n / o)` to `ceil((i + 1) n / o)`."""
    return [(i * n // o, -(-(i + 1) * n // o)) for i in range(o)]


def _adapt_axis(x, axis, o, reduce):
    """`x` reduced along `axis` into `o` bins."""
    n = x.shape[axis]
    if o is None or o == n:
        return x
    if n % o == 0:  # equal bins: one reduction
        shape = (*x.shape[:axis], o, n // o, *x.shape[axis + 1 :])
        return reduce(reshape(x, shape), axis=axis + 1)
    before = (slice(None),) * axis
    parts = [reduce(getitem(x, (*before, slice(a, b))), axis=axis, keepdims=True)
             for a, b in _bins(n, o)]  # fmt: skip
    return concat(parts, axis=axis)


@dataclass(init=False, repr=False)
class _AdaptivePool(Layer):
    out: tuple

    def __init__(self, out):
        self.out = _output_sizes(type(self).__name__, out)

    def __call__(self, x):
        rank = len(self.out)
        self._expect(len(_shape(x)) == rank + 2, x, f"(batch, channels, {axes(rank)})")
        for a, o in enumerate(self.out):
            x = _adapt_axis(x, 2 + a, o, self.reduce)
        return x

    def __repr__(self):
        return f"{type(self).__name__}({self.out})"


class AdaptiveMaxPool(_AdaptivePool):
    """The maximum over each of `out` bins of `(batch, channels, *spatial)` input: the output's
    spatial size is `out` (a tuple, one size per axis, None to keep that axis; an int: 2-D)
    whatever the input's. Bin `i` of an axis of size `n` spans `floor(i n / out)` to
    `ceil((i + 1) n / out)`, PyTorch's.

    PyTorch: `AdaptiveMaxPool1d`, `AdaptiveMaxPool2d`, `AdaptiveMaxPool3d`; no
    `return_indices`. Ties share the gradient (PyTorch: one takes it).

    >>> import numpy as np
    >>> AdaptiveMaxPool((2,))(np.array([[[1.0, 5.0, 2.0, 0.0, 3.0]]]))
    array([[[5., 3.]]])
    """

    reduce = staticmethod(_max)


class AdaptiveMeanPool(_AdaptivePool):
    """The mean over each of `out` bins of `(batch, channels, *spatial)` input, the bins as
    `AdaptiveMaxPool`'s (PyTorch's).

    PyTorch: `AdaptiveAvgPool1d`, `AdaptiveAvgPool2d`, `AdaptiveAvgPool3d`.

    >>> import numpy as np
    >>> AdaptiveMeanPool((2,))(np.array([[[1.0, 5.0, 2.0, 0.0, 3.0]]]))
    array([[[2.66666667, 1.66666667]]])
    """

    reduce = staticmethod(mean)


class _GlobalPool(Layer):
    def __call__(self, x):
        self._expect(len(_shape(x)) >= 3, x, "(batch, channels, *spatial)")
        return self.reduce(x, axis=tuple(range(2, len(x.shape))), keepdims=True)

    def __repr__(self):
        return f"{type(self).__name__}()"


class GlobalMaxPool(_GlobalPool):
    """The maximum over every spatial axis of `(batch, channels, *spatial)` input, kept as axes
    of size 1 (Flux's): `(batch, channels, 1, ...)`.

    PyTorch: `AdaptiveMaxPool2d(1)` (and its 1-D and 3-D forms), or `amax` over the spatial
    axes with `keepdim=True`. Ties share the gradient (PyTorch: one takes it).

    >>> import numpy as np
    >>> GlobalMaxPool()(np.arange(8.0).reshape(1, 2, 2, 2))
    array([[[[3.]],
    <BLANKLINE>
            [[7.]]]])
    """

    reduce = staticmethod(_max)


class GlobalMeanPool(_GlobalPool):
    """The mean over every spatial axis of `(batch, channels, *spatial)` input, kept as axes of
    size 1 (Flux's): `(batch, channels, 1, ...)`.

    PyTorch: `AdaptiveAvgPool2d(1)` (and its 1-D and 3-D forms), or `mean` over the spatial
    axes with `keepdim=True`.

    >>> import numpy as np
    >>> GlobalMeanPool()(np.arange(6.0).reshape(1, 2, 3))
    array([[[1.],
            [4.]]])
    """

    reduce = staticmethod(mean)
