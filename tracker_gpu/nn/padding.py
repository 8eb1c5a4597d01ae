"""Padding an image by a rule other than zeros: PyTorch's `padding_mode`s of a convolution.

`pad_modes(x, pairs, mode)` pads the spatial axes of `(n, c, *spatial)` input, one
`(before, after)` pair per axis, with slices, flips and a concatenation (so its gradient, of
any order, is theirs): `"reflect"` mirrors about the edge (the edge not repeated), `"replicate"`
repeats the edge, `"circular"` wraps around. Zeros are padded inside `im2col`.

>>> import numpy as np
>>> x = np.arange(4.0).reshape(1, 1, 4)
>>> for mode in MODES[1:]:
...     print(mode, pad_modes(x, ((2, 1),), mode)[0, 0])
reflect [2. 1. 0. 1. 2. 3. 2.]
replicate [0. 0. 0. 1. 2. 3. 3.]
circular [2. 3. 0. 1. 2. 3. 0.]
"""

from ..rules.shape import broadcast_to, concat, flip, getitem

__all__ = ["MODES", "check_mode", "pad_modes"]

MODES = ("zeros", "reflect", "replicate", "circular")


def check_mode(name, mode):
    if mode not in MODES:
        raise ValueError(f"{name}: pad_mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def _part(x, axis, start, stop):
    return getitem(x, (slice(None),) * axis + (slice(start, stop),))


def _reflect(x, axis, n, count, after):
    part = _part(x, axis, n - 1 - count, n - 1) if after else _part(x, axis, 1, count + 1)
    return flip(part, axis=axis)


def _replicate(x, axis, n, count, after):
    edge = _part(x, axis, n - 1, n) if after else _part(x, axis, 0, 1)
    return broadcast_to(edge, tuple(count if a == axis else m for a, m in enumerate(edge.shape)))


def _circular(x, axis, n, count, after):
    return _part(x, axis, 0, count) if after else _part(x, axis, n - count, n)


# the part padded on one side of an axis: f(x, axis, size, count, after)
SIDES = {"reflect": _reflect, "replicate": _replicate, "circular": _circular}
# the most each side may pad, by the axis's size n (PyTorch's limits)
LIMITS = {"reflect": lambda n: n - 1, "replicate": lambda n: None, "circular": lambda n: n}


def pad_modes(x, pairs, mode, layer=None):
    """`x` padded on its spatial axes by `mode` ("reflect", "replicate", "circular")."""
    for i, (before, after) in enumerate(pairs):
        axis, n = 2 + i, x.shape[2 + i]
        limit = LIMITS[mode](n)
        if limit is not None and max(before, after) > limit:
            raise ValueError(
                f"{layer!r}: {mode} padding of ({before}, {after}) needs an input of size more "
                f"than {max(before, after) - (mode == 'circular')} along spatial axis {i}, got "
                f"{n}; pad less or use pad_mode='replicate' or 'zeros'"
            )
        if before or after:
            side = SIDES[mode]
            parts = [side(x, axis, n, before, False)] if before else []
            parts += [x] + ([side(x, axis, n, after, True)] if after else [])
            x = concat(parts, axis=axis)
    return x
