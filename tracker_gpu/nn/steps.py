"""The steps of a `Recurrence`: the input cut into steps, each cell run over them (forward or
backward in time), the masks of sequences of their own lengths, and the layer's state split
into the cells' states and joined back (PyTorch's `h_n`, `(cells, batch, out)`).

>>> import numpy as np
>>> from tracker_gpu import nn
>>> x = np.zeros((2, 3, 1))                          # 2 sequences of 3 steps
>>> [m.ravel().tolist() for m in step_masks(nn.RNN(1, 2), x, [1, 3], None)]
[[True, True], [False, True], [False, True]]
"""

import numpy as np

from .. import recording
from ..backend import device_of, is_array, isdtype, namespace_of
from ..rules.elementwise import where
from ..rules.shape import getitem, stack
from ..tracked import data
from .layers import _shape, istraced
from .placement import asarray, to_numpy

__all__ = ["at", "run", "split", "join", "step_masks"]


def at(time, t):
    return (slice(None), t, slice(None)) if time == 1 else (t, slice(None), slice(None))


def run(cell, steps, state, masks, reverse):
    """The outputs of `cell` over `steps` (a list), backward in time if `reverse`, and its last
    state; where a step's mask is False the state is kept and the output is zero."""
    order = range(len(steps) - 1, -1, -1) if reverse else range(len(steps))
    if masks is not None and state is None:
        state = cell.initialstates(steps[0].shape[0])
    outputs = [None] * len(steps)
    for t in order:
        x = steps[t]
        if masks is not None:  # zeros past a sequence's end: the padding is never read (a nan
            x = where(masks[t], x, 0.0)  # there made every gradient nan, through 0 * nan)
        y, new = cell(x, state)
        if masks is not None:
            y, new = where(masks[t], y, 0.0), _keep(masks[t], new, state)
        outputs[t], state = y, new
    return outputs, state


def _keep(mask, new, old):
    if isinstance(new, tuple):
        return tuple(where(mask, a, b) for a, b in zip(new, old))
    return where(mask, new, old)


def split(layer, state, batch):
    """The state of each cell from the layer's `state` (None: each cell's zeros)."""
    count = 1 + len(layer.cells)
    if count == 1 or state is None:
        return [state] * count
    parts, n_out = layer.cell.PARTS, layer.cell.size[1]
    pieces = state if parts == 2 and isinstance(state, tuple) else (state,)
    if len(pieces) != parts or any(_shape(p) != (count, batch, n_out) for p in pieces):
        kind = "(h, c), each" if parts == 2 else "h"
        raise ValueError(
            f"{layer!r}: the state must be {kind} of shape ({count}, {batch}, {n_out}) (cells, "
            f"batch, out), got {[_shape(p) for p in pieces]}; pass the state the layer "
            "returned, or none for zeros"
        )
    cells = [tuple(getitem(p, k) for p in pieces) for k in range(count)]
    return [c if parts == 2 else c[0] for c in cells]


def join(layer, finals):
    """The layer's state from each cell's last state: PyTorch's `h_n` (and `c_n`)."""
    if len(finals) == 1:
        return finals[0]
    if layer.cell.PARTS == 2:
        return tuple(stack([f[i] for f in finals], axis=0) for i in range(2))
    return stack(finals, axis=0)


def step_masks(layer, x, lengths, mask):
    """For each step, a `(batch, 1)` boolean array (True: a real step), or None for none."""
    if lengths is None and mask is None:
        return None
    if lengths is not None and mask is not None:
        raise TypeError(f"{layer!r}: give the lengths or a mask, not both")
    time = 1 if layer.batch_first else 0
    batch, steps = x.shape[1 - time], x.shape[time]
    if lengths is not None:
        lengths = _placed(layer, lengths, "lengths")
        _check_lengths(layer, lengths, batch, steps)
        return [(lengths > t)[:, None] for t in range(steps)]
    mask = _placed(layer, mask, "mask")
    plain = data(mask)
    if _shape(mask) != tuple(x.shape[:2]) or not isdtype(namespace_of(plain), plain.dtype, "bool"):
        axes = "(batch, time)" if layer.batch_first else "(time, batch)"
        raise ValueError(
            f"{layer!r}: the mask must be booleans of shape {tuple(x.shape[:2])} {axes}, True "
            f"for a real step; got {plain.dtype} of shape {_shape(mask)}"
        )
    return [getitem(mask, at(time, t)[:2])[:, None] for t in range(steps)]


def _check_lengths(layer, lengths, batch, steps):
    plain = data(lengths)
    xp = namespace_of(plain)
    if _shape(lengths) != (batch,) or not isdtype(xp, plain.dtype, "integral"):
        raise ValueError(
            f"{layer!r}: lengths must be integers, one for each of the {batch} sequences; got "
            f"{plain.dtype} of shape {_shape(lengths)}"
        )
    if not istraced(lengths) and bool(xp.any((plain < 0) | (plain > steps))):
        raise ValueError(
            f"{layer!r}: lengths must lie in [0, {steps}] (the steps of the input), got "
            f"lengths from {int(xp.min(plain))} to {int(xp.max(plain))}"
        )


def _placed(layer, values, name):
    """`values` (a list or an array of any library) in the library and on the device of the
    layer's weights."""
    like = data(layer.cell.Wi)
    xp, device = namespace_of(like), device_of(like)
    plain = data(values)
    if is_array(plain) and namespace_of(plain) is xp:
        return values
    if istraced(values):
        recording.refuse(
            f"{name} of another library than the weights of {layer!r} (a copy between "
            "libraries); pass them in the weights' library"
        )
    host = to_numpy(plain) if is_array(plain) else np.asarray(values)
    return asarray(host, xp=xp, device=device)
