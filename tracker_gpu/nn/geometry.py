"""The sizes of convolutions and pools over any number of spatial axes, checked once.

A layer's spatial rank is the length of its kernel (or window) tuple; an int kernel is a square
2-D one. `stride`, `dilation` and the like are an int (every axis) or one int per axis. `pad`
is an int, one int per axis (both sides), `2 * rank` ints (`before, after` for each axis in
turn, Flux's order), `"valid"` (none) or `"same"` (the size kept at stride 1; an odd total goes
after, as PyTorch places it). A layer keeps `pad` as `rank` ints where each axis is padded alike
on both sides, else as the `2 * rank` ints.

>>> padding("Conv", "same", kernel=(4, 3), dilation=(1, 1))
(1, 2, 1, 1)
>>> sides((1, 2, 1, 1), 2), sides((1, 0), 2)
(((1, 2), (1, 1)), ((1, 1), (0, 0)))
>>> output_size(None, (7,), (2,), (2,), ((0, 0),), (1,), ceil_mode=True)
(4,)
"""

import math

__all__ = ["AXES", "axes", "sizes", "kernel_of", "padding", "sides", "output_size", "ceil_extra"]

AXES = {1: "length", 2: "height, width", 3: "depth, height, width"}


def axes(rank):
    """The names of `rank` spatial axes, for messages: `"height, width"`."""
    return AXES.get(rank, f"{rank} spatial axes")


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def sizes(name, value, what, rank, minimum=1):
    """`value` (an int, or one int per spatial axis) as a tuple of `rank` ints >= `minimum`."""
    t = (value,) * rank if _is_int(value) else tuple(value) if _iterable(value) else (value,)
    if len(t) != rank or not all(_is_int(v) and v >= minimum for v in t):
        raise ValueError(
            f"{name}: {what} must be an int or a tuple of {rank} ints >= {minimum} (one per "
            f"spatial axis), got {value!r}"
        )
    return t


def _iterable(value):
    return isinstance(value, (tuple, list))


def kernel_of(name, kernel, what="kernel"):
    """The kernel (or window) as a tuple, its length the spatial rank; an int is 2-D."""
    if _is_int(kernel):
        return sizes(name, kernel, what, 2)
    if not _iterable(kernel) or len(kernel) < 1:
        raise ValueError(
            f"{name}: {what} must be a tuple with one size per spatial axis ((5,) for 1-D, "
            f"(3, 3) for 2-D, (3, 3, 3) for 3-D) or an int (2-D), got {kernel!r}"
        )
    return sizes(name, kernel, what, len(kernel))


def padding(name, pad, kernel, dilation):
    """`pad` as the layer keeps it: `rank` ints (symmetric) or `2 * rank` (before, after)."""
    rank = len(kernel)
    if isinstance(pad, str):
        if pad == "valid":
            return (0,) * rank
        if pad == "same":
            spans = [d * (k - 1) for k, d in zip(kernel, dilation)]
            return _compact(tuple((s // 2, s - s // 2) for s in spans))
        raise ValueError(f'{name}: pad must be "same", "valid" or sizes, got {pad!r}')
    if _is_int(pad) or (_iterable(pad) and len(pad) != 2 * rank):
        return sizes(name, pad, "pad", rank, minimum=0)
    flat = sizes(name, pad, "pad (before and after each axis)", 2 * rank, minimum=0)
    return _compact(tuple(zip(flat[::2], flat[1::2])))


def _compact(pairs):
    if all(before == after for before, after in pairs):
        return tuple(before for before, _ in pairs)
    return tuple(v for pair in pairs for v in pair)


def sides(pad, rank):
    """A layer's `pad` as one `(before, after)` pair per spatial axis."""
    if len(pad) == rank:
        return tuple((p, p) for p in pad)
    return tuple(zip(pad[::2], pad[1::2]))


def output_size(layer, size, kernel, stride, pairs, dilation, ceil_mode=False):
    """The output's spatial size, or a clear error when the input is smaller than the window.

    `ceil_mode` counts a last window that overhangs the input's end (PyTorch's rule: it must
    start inside the input or its padding before)."""
    out = []
    for n, k, s, (before, after), d in zip(size, kernel, stride, pairs, dilation):
        span = n + before + after - d * (k - 1) - 1
        o = (math.ceil(span / s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= n + before:
            o -= 1
        out.append(o)
    if min(out) < 1:
        raise ValueError(
            f"{layer!r}: an input of spatial size {tuple(size)} is smaller than the window "
            f"{tuple(kernel)} (padding {tuple(pairs)}, dilation {tuple(dilation)})"
        )
    return tuple(out)


def ceil_extra(size, kernel, stride, pairs, dilation, out):
    """`pairs` with the padding after each axis grown to hold every window of `out` (the
    overhang of `ceil_mode`)."""
    grown = []
    for n, k, s, (before, after), d, o in zip(size, kernel, stride, pairs, dilation, out):
        need = (o - 1) * s + d * (k - 1) + 1 - (n + before + after)
        grown.append((before, after + max(need, 0)))
    return tuple(grown)
