"""Recurrent layers, Flux's way with the state explicit: the cells `RNNCell`, `LSTMCell` and
`GRUCell`, and `Recurrence` (with `RNN`, `LSTM` and `GRU`), which runs cells over a sequence.

A cell maps an input `x` (batch, in) and a state to `(output, new state)`; the state is the
hidden state `h` (batch, out), or `(h, c)` for the LSTM, zeros when not given
(`cell.initialstates(batch)`). Weights are Flux's: `Wi` (gates * out, in), `Wh`
(gates * out, out) and one `bias` (gates * out), the gates in PyTorch's order (LSTM: input,
forget, cell, output; GRU: reset, update, candidate), so PyTorch's `weight_ih_l0` and
`weight_hh_l0` are `Wi` and `Wh`; `bias_h=True` adds PyTorch's second bias `bias_hh_l0` (none
by default, as Flux: then `bias_ih_l0 + bias_hh_l0` is the bias, except in the GRU, whose
candidate takes its hidden bias inside the reset gate, so that PyTorch's GRU needs `bias_h`).

Sequences are batch-first, `(batch, time, features)` (PyTorch's `batch_first=True`;
`batch_first=False` for time-major): a `Recurrence` returns the outputs of every step,
`(batch, time, out)`, and with `return_state=True` also the last state. PyTorch's options
`num_layers`, `bidirectional` and `dropout` stack cells, and `lengths=` (or `mask=`) runs
sequences of their own lengths. The LSTM cell's gates are one primitive (`lstm_cell`), one
fused kernel each way on the GPU.

>>> import numpy as np
>>> from tracker_gpu import nn
>>> lstm = nn.LSTM(3, 5, rng=np.random.default_rng(0))
>>> lstm
LSTM(3 => 5)
>>> x = np.ones((2, 4, 3), dtype=np.float32)         # 2 sequences of 4 steps
>>> y, (h, c) = nn.LSTM(3, 5, return_state=True)(x)
>>> y.shape, h.shape, bool((y[:, -1] == h).all())
((2, 4, 5), (2, 5), True)
"""

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..backend import device_of, namespace_of
from ..rules.elementwise import add, multiply, subtract, tanh
from ..rules.nn import lstm_cell, sigmoid
from ..rules.shape import concat, getitem, stack
from ..tracked import data
from .activations import _activate
from .init import _rng, glorot_uniform
from .layers import (
    Dropout,
    Layer,
    _bias,
    _describe,
    _is_layer_field,
    _match_dtype,
    _shape,
)
from .placement import asarray
from .primitives import linear
from .steps import at, join, run, split, step_masks

__all__ = ["RNNCell", "LSTMCell", "GRUCell", "Recurrence", "RNN", "LSTM", "GRU"]


def _weights(gates, n_in, n_out, init, rng, dtype, device, xp):
    rng = _rng(rng)
    place = dict(xp=xp, device=device, dtype=dtype)
    return (
        asarray(init(rng, (gates * n_out, n_in)), **place),
        asarray(init(rng, (gates * n_out, n_out)), **place),
    )


def _slice(z, k, n):
    return getitem(z, (..., slice(k * n, (k + 1) * n)))


class _Cell(Layer):
    """What the cells share: their sizes, zero states and the checks of an input and a state."""

    GATES = 1  # blocks of `n_out` rows in `Wi` and `Wh`
    PARTS = 1  # arrays in the state: h, or (h, c)
    bias_h = None  # the hidden bias, absent by default (and in cells pickled before it was)

    def _make(self, n_in, n_out, Wi, Wh, bias, bias_h, init, rng, dtype, device, xp):
        name = type(self).__name__
        if Wi is None:
            if n_in is None or n_out is None:
                raise TypeError(f"{name} needs its sizes, {name}(n_in, n_out), or Wi= and Wh=")
            Wi, Wh = _weights(self.GATES, n_in, n_out, init, rng, dtype, device, xp)
        self.Wi, self.Wh = Wi, Wh
        self.bias = _bias(bias, Wi, Wi.shape[0])
        self.bias_h = _bias(bias_h, Wi, Wi.shape[0])

    def _gates(self, x, h):
        """`x @ Wi.T + bias` and `h @ Wh.T + bias_h`, the gates' two halves."""
        return linear(x, self.Wi, self.bias), linear(h, self.Wh, self.bias_h)

    @property
    def size(self):
        return self.Wi.shape[1], self.Wi.shape[0] // self.GATES

    def initialstates(self, batch):
        """The zero state for a batch of `batch` inputs (on the weights' library and device)."""
        w = data(self.Wi)
        zeros = namespace_of(w).zeros((batch, self.size[1]), dtype=w.dtype, device=device_of(w))
        return (zeros, zeros) if self.PARTS == 2 else zeros

    def _inputs(self, x, state):
        n_in, n_out, parts = *self.size, self.PARTS
        self._expect(len(_shape(x)) == 2 and _shape(x)[1] == n_in, x, f"(batch, {n_in})")
        if state is None:
            return _match_dtype(x, self.Wi), self.initialstates(x.shape[0])
        pieces = state if parts > 1 else (state,)
        if (
            not (isinstance(state, tuple) or parts == 1)
            or len(pieces) != parts
            or any(_shape(p) != (x.shape[0], n_out) for p in pieces)
        ):
            kind = "(h, c), each" if parts > 1 else "h"
            got = [_shape(p) for p in pieces] if isinstance(state, tuple) else _shape(state)
            raise ValueError(
                f"{self!r}: the state must be {kind} of shape ({x.shape[0]}, {n_out}) for this "
                f"batch, got {got}; pass the state the cell returned, or none for zeros"
            )
        return _match_dtype(x, self.Wi), state

    def __repr__(self):
        if not _is_layer_field(self.Wi):
            return self._fields_repr()
        n_in, n_out = self.size
        extra = (
            ""
            if getattr(self, "activation", None) in (None, tanh)
            else (f", {_describe(self.activation)}")
        )
        extra += "" if self.bias_h is None else ", bias_h=True"
        return f"{type(self).__name__}({n_in} => {n_out}{extra})"


_CELL_DOC = """

    `{name}(n_in, n_out{act})` draws `Wi` and `Wh` with `init` (Glorot uniform, Flux's default)
    and makes a zero bias (`bias=False` for none); `{name}(Wi=..., Wh=..., bias=...)` wraps
    given arrays. `bias_h=True` (or an array) adds a second bias to `h @ Wh.T`, PyTorch's
    `bias_hh` (none by default, as Flux).

    PyTorch's `torch.nn.{torch}`: its `weight_ih`, `weight_hh`, `bias_ih` and `bias_hh` are
    `Wi`, `Wh`, `bias` and `bias_h`{differs}.

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> y, state = nn.{name}(3, 4)(np.ones((2, 3), dtype=np.float32))
    >>> y.shape
    (2, 4)
    """


@dataclass(init=False, repr=False)
class RNNCell(_Cell):
    """`h' = activation(x @ Wi.T + h @ Wh.T + bias)` (Elman); its output is `h'`."""

    Wi: Any
    Wh: Any
    bias: Any
    activation: Callable | None
    bias_h: Any = None

    def __init__(
        self,
        n_in=None,
        n_out=None,
        activation=tanh,
        *,
        Wi=None,
        Wh=None,
        bias=True,
        bias_h=False,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        self._make(n_in, n_out, Wi, Wh, bias, bias_h, init, rng, dtype, device, xp)
        self.activation = activation

    def __call__(self, x, state=None):
        x, h = self._inputs(x, state)
        h = _activate(self.activation, add(*self._gates(x, h)))
        return h, h


@dataclass(init=False, repr=False)
class LSTMCell(_Cell):
    """Long short-term memory (Hochreiter & Schmidhuber 1997): gates `i, f, g, o` from
    `x @ Wi.T + h @ Wh.T + bias`, `c' = sigmoid(f) * c + sigmoid(i) * tanh(g)` and
    `h' = sigmoid(o) * tanh(c')`; the state is `(h, c)`, the output `h'`."""

    GATES = 4
    PARTS = 2
    Wi: Any
    Wh: Any
    bias: Any
    bias_h: Any = None

    def __init__(
        self,
        n_in=None,
        n_out=None,
        *,
        Wi=None,
        Wh=None,
        bias=True,
        bias_h=False,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        self._make(n_in, n_out, Wi, Wh, bias, bias_h, init, rng, dtype, device, xp)

    def __call__(self, x, state=None):
        x, (h, c) = self._inputs(x, state)
        z = add(*self._gates(x, h))
        hc = lstm_cell(z, c)
        n = self.size[1]
        h = _slice(hc, 0, n)
        return h, (h, _slice(hc, 1, n))


@dataclass(init=False, repr=False)
class GRUCell(_Cell):
    """Gated recurrent unit (Cho et al. 2014), as Flux and PyTorch: with `a = x @ Wi.T + bias`
    and `b = h @ Wh.T` split into reset, update and candidate parts, `r = sigmoid(a_r + b_r)`,
    `z = sigmoid(a_z + b_z)`, `n = tanh(a_n + r * b_n)` and `h' = (1 - z) * n + z * h`."""

    GATES = 3
    Wi: Any
    Wh: Any
    bias: Any
    bias_h: Any = None

    def __init__(
        self,
        n_in=None,
        n_out=None,
        *,
        Wi=None,
        Wh=None,
        bias=True,
        bias_h=False,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        self._make(n_in, n_out, Wi, Wh, bias, bias_h, init, rng, dtype, device, xp)

    def __call__(self, x, state=None):
        x, h = self._inputs(x, state)
        n = self.size[1]
        a, b = self._gates(x, h)
        r = sigmoid(add(_slice(a, 0, n), _slice(b, 0, n)))
        z = sigmoid(add(_slice(a, 1, n), _slice(b, 1, n)))
        candidate = tanh(add(_slice(a, 2, n), multiply(r, _slice(b, 2, n))))
        h = add(multiply(subtract(1.0, z), candidate), multiply(z, h))
        return h, h


_DIFFERS = {
    RNNCell: '; its `nonlinearity="relu"` is `activation=relu`',
    LSTMCell: " (with `bias_h=False`, pass `bias_ih + bias_hh` as the bias)",
    GRUCell: " (`bias_h` holds the candidate's hidden bias `b_hn` inside the reset gate: "
    "PyTorch's GRU weights load exactly with `bias_h=True`)",
}
for _cls, _act, _torch in (
    (RNNCell, ", activation=tanh", "RNNCell"),
    (LSTMCell, "", "LSTMCell"),
    (GRUCell, "", "GRUCell"),
):
    _cls.__doc__ += _CELL_DOC.format(
        name=_cls.__name__, act=_act, torch=_torch, differs=_DIFFERS[_cls]
    )


@dataclass(init=False, repr=False)
class Recurrence(Layer):
    """Cells run over a sequence: `layer(x, state=None, *, lengths=None, mask=None)` returns the
    outputs of every step, `(batch, time, out)`, and with `return_state=True`
    `(outputs, last state)`. Flux's `Recurrence`, with PyTorch's options.

    `Recurrence(cell)` runs one cell; `Recurrence(*cells, bidirectional=True)` and more cells
    stack layers, the cells in PyTorch's order (layer 0, layer 0 reversed, layer 1, ...):
    - `bidirectional=True`: each layer runs one cell forward and one backward in time, and
      their outputs are joined on the last axis (forward first), `(batch, time, 2 * out)`;
    - several layers: each reads the outputs of the one below; `dropout=p` drops them out
      between layers (not after the last), in training only, drawing from `rng` as `Dropout`;
    - `batch_first=False`: sequences are time-major, `(time, batch, features)`, and so are the
      outputs (the states are not);
    - `lengths` (integers, one a sequence) or `mask` (booleans shaped as `x` without its last
      axis, True for a real step): a sequence's state stops at its own length and its outputs
      past it are zero, as PyTorch's packed sequences (the backward cell starts at each
      sequence's last real step); a mask with holes skips the steps it masks.
    With one cell the state is the cell's (`h`, or `(h, c)` for the LSTM), each `(batch, out)`;
    with several it is PyTorch's `h_n`, `(cells, batch, out)` (and `c_n` for the LSTM).
    PyTorch's counterparts are `torch.nn.RNN`, `LSTM` and `GRU`: here `RNN`, `LSTM` and `GRU`.

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> gru = nn.GRU(3, 4, num_layers=2, bidirectional=True, return_state=True)
    >>> y, h = gru(np.ones((2, 5, 3), dtype=np.float32), lengths=[5, 3])
    >>> y.shape, h.shape, bool((y[1, 3:] == 0).all())
    ((2, 5, 8), (4, 2, 4), True)
    """

    cell: Any
    return_state: bool
    cells: tuple = ()  # the cells after the first (none by default, and in older pickles)
    bidirectional: bool = False
    dropout: Any = None  # a Dropout between layers, or None
    batch_first: bool = True

    def __init__(
        self,
        cell=None,
        *cells,
        return_state=False,
        bidirectional=False,
        dropout=0.0,
        batch_first=True,
        rng=None,
    ):
        for c in (cell, *cells):
            if not isinstance(c, _Cell):
                raise TypeError(
                    f"Recurrence runs recurrent cells (RNNCell, LSTMCell, GRUCell), got {c!r}"
                )
        self.cell, self.cells, self.return_state = cell, tuple(cells), return_state
        self.bidirectional, self.batch_first = bool(bidirectional), bool(batch_first)
        _check_stack(self)
        self.dropout = _between(dropout, self.num_layers, rng)

    @property
    def num_layers(self):
        return (1 + len(self.cells)) // (2 if self.bidirectional else 1)

    def __call__(self, x, state=None, *, lengths=None, mask=None):
        time = 1 if self.batch_first else 0
        n_in = self.cell.size[0]
        axes = "batch, time" if self.batch_first else "time, batch"
        self._expect(len(_shape(x)) == 3 and _shape(x)[2] == n_in, x, f"({axes}, {n_in})")
        if x.shape[time] == 0:
            raise ValueError(f"{self!r}: a sequence of no steps (input of shape {_shape(x)}); "
                             "give at least one step, as PyTorch asks")  # fmt: skip
        steps = [getitem(x, at(time, t)) for t in range(x.shape[time])]
        masks = step_masks(self, x, lengths, mask)
        states, finals = split(self, state, x.shape[1 - time]), []
        cells, directions = (self.cell, *self.cells), 2 if self.bidirectional else 1
        for k in range(0, len(cells), directions):
            if k and self.dropout is not None:
                steps = [self.dropout(s) for s in steps]
            outputs = []
            for d in range(directions):
                ys, last = run(cells[k + d], steps, states[k + d], masks, reverse=d == 1)
                outputs.append(ys)
                finals.append(last)
            steps = outputs[0] if directions == 1 else [concat(s, axis=-1) for s in zip(*outputs)]
        y = stack(steps, axis=time)
        return (y, join(self, finals)) if self.return_state else y

    def __repr__(self):
        if not isinstance(self.cell, _Cell):
            return self._fields_repr()
        options = _options(self) if isinstance(self.batch_first, bool) else ""  # a gradient
        if type(self) is Recurrence:
            inner = ", ".join(repr(c) for c in (self.cell, *self.cells))
            extra = ", return_state=True" if self.return_state is True else ""
            return f"Recurrence({inner}{options}{extra})"
        inner = repr(self.cell)
        return f"{type(self).__name__}{inner[inner.index('(') : -1]}{options})"


def _options(layer):
    """The options of `layer` that are not the defaults, as `, name=value`."""
    dropout = getattr(layer.dropout, "p", 0)
    named = (
        ("num_layers", layer.num_layers, 1, type(layer) is not Recurrence),
        ("bidirectional", layer.bidirectional, False, True),
        ("dropout", dropout, 0, True),
        ("batch_first", layer.batch_first, True, True),
    )
    return "".join(f", {n}={v}" for n, v, default, shown in named if shown and v != default)


def _check_stack(layer):
    """Refuse cells that do not stack: a count that is not one or two per layer, a kind or a
    size that changes, or an input size other than the outputs of the layer below."""
    cells, directions = (layer.cell, *layer.cells), 2 if layer.bidirectional else 1
    n_out = layer.cell.size[1]
    problem = None
    if len(cells) % directions:
        problem = f"{len(cells)} cells do not make layers of two (forward and backward)"
    elif any(type(c) is not type(layer.cell) or c.size[1] != n_out for c in cells):
        problem = "the cells differ in kind or in output size"
    elif any(c.size[0] != directions * n_out for c in cells[directions:]):
        problem = f"a layer above the first must take {directions * n_out} inputs"
    elif any(c.size[0] != layer.cell.size[0] for c in cells[:directions]):
        problem = "the first layer's cells take different input sizes"
    if problem is not None:
        raise ValueError(
            f"Recurrence: {problem}; give the cells in PyTorch's order (layer 0, layer 0 "
            "reversed if bidirectional, layer 1, ...), or build it as LSTM(n_in, n_out, "
            "num_layers=..., bidirectional=...)"
        )


def _between(p, num_layers, rng):
    """The Dropout between layers (None when there is nothing to drop out)."""
    if p != 0 and num_layers == 1:
        warnings.warn(
            f"dropout={p} applies between the layers of a recurrent layer, and this one has one "
            "layer: it does nothing (as PyTorch's); put nn.Dropout after it instead",
            stacklevel=4,
        )
    return Dropout(p, rng=rng) if p != 0 and num_layers > 1 else None


def _sequence_layer(name, cell_type, example):
    def __init__(
        self,
        n_in=None,
        n_out=None,
        *args,
        num_layers=1,
        bidirectional=False,
        dropout=0.0,
        batch_first=True,
        return_state=False,
        cell=None,
        rng=None,
        **kw,
    ):
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"{name}: num_layers must be a whole number >= 1, got {num_layers}")
        rng, directions = _rng(rng), 2 if bidirectional else 1
        cells = (cell,) if cell is not None else ()
        if cell is not None and num_layers * directions > 1:
            raise TypeError(f"{name}: cell= builds one layer; use Recurrence(*cells, ...)")
        if cell is None:
            sizes = [n_in] + [directions * n_out] * (num_layers - 1)
            cells = [
                cell_type(n, n_out, *args, rng=rng, **kw) for n in sizes for _ in "fb"[:directions]
            ]
        Recurrence.__init__(
            self,
            *cells,
            return_state=return_state,
            bidirectional=bidirectional,
            dropout=dropout,
            batch_first=batch_first,
            rng=rng,
        )

    doc = _LAYER_DOC.format(name=name, cell=cell_type.__name__, example=example)
    return type(name, (Recurrence,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


_LAYER_DOC = """`Recurrence` of `{cell}`s: `{name}(n_in, n_out, ...)` takes the cell's arguments
    (`bias_h=True` for PyTorch's second bias) and `Recurrence`'s options, `num_layers`,
    `bidirectional`, `dropout`, `batch_first` and `return_state`; `layer(x, state, lengths=...)`.

    PyTorch's `torch.nn.{name}`: the same options (`dropout` drops out in training, here when
    the input is tracked, or as `trainmode` says). Ours is batch-first by default
    (`batch_first=False` for PyTorch's default), has no second bias by default (`bias_h=True`
    to load PyTorch's weights exactly: cell `k` of `layer.cell, *layer.cells` holds
    `weight_ih_l*` as `Wi`, `weight_hh_l*` as `Wh`, `bias_ih_l*` as `bias`, `bias_hh_l*` as
    `bias_h`), takes `lengths=` for a packed sequence and returns zeros past each length (as
    `pad_packed_sequence`), returns the last state only with `return_state=True`, and draws
    the weights with Glorot (Flux's; PyTorch's are uniform in `±k`, `k = 1 / sqrt(n_out)`:
    `init=lambda rng, shape: rng.uniform(-k, k, shape)`, and set the biases likewise).

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> layer = {example}
    >>> layer(np.ones((2, 5, 3), dtype=np.float32)).shape
    (2, 5, 4)
    """

RNN = _sequence_layer("RNN", RNNCell, "nn.RNN(3, 4, nn.relu)")
LSTM = _sequence_layer("LSTM", LSTMCell, "nn.LSTM(3, 2, bidirectional=True)")
GRU = _sequence_layer("GRU", GRUCell, "nn.GRU(3, 4, num_layers=2, dropout=0.1, bias_h=True)")
