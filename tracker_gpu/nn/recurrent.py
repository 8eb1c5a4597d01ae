"""Recurrent layers, Flux's way with the state explicit: the cells `RNNCell`, `LSTMCell` and
`GRUCell`, and `Recurrence` (with `RNN`, `LSTM` and `GRU`), which runs a cell over a sequence.

A cell maps an input `x` (batch, in) and a state to `(output, new state)`; the state is the
hidden state `h` (batch, out), or `(h, c)` for the LSTM, zeros when not given
(`cell.initialstates(batch)`). Weights are Flux's: `Wi` (gates * out, in), `Wh`
(gates * out, out) and one `bias` (gates * out), the gates in PyTorch's order (LSTM: input,
forget, cell, output; GRU: reset, update, candidate), so PyTorch's `weight_ih_l0` and
`weight_hh_l0` are `Wi` and `Wh`, its `bias_ih_l0 + bias_hh_l0` the bias (the GRU's candidate
takes its hidden bias inside the reset gate, so there `bias_hh_l0` must be zero).

Sequences are batch-first, `(batch, time, features)` (PyTorch's `batch_first=True`): a
`Recurrence` returns the outputs of every step, `(batch, time, out)`, and with
`return_state=True` also the last state. The LSTM cell's gates are one primitive
(`lstm_cell`), one fused kernel each way on the GPU.

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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..backend import device_of, namespace_of
from ..rules.elementwise import add, multiply, subtract, tanh
from ..rules.nn import lstm_cell, sigmoid
from ..rules.shape import getitem, stack
from ..tracked import data
from .activations import _activate
from .init import _rng, glorot_uniform
from .layers import Layer, _bias, _describe, _is_layer_field, _match_dtype, _shape
from .placement import asarray
from .primitives import linear

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

    GATES = 1

    def _make(self, n_in, n_out, Wi, Wh, bias, init, rng, dtype, device, xp):
        name = type(self).__name__
        if Wi is None:
            if n_in is None or n_out is None:
                raise TypeError(f"{name} needs its sizes, {name}(n_in, n_out), or Wi= and Wh=")
            Wi, Wh = _weights(self.GATES, n_in, n_out, init, rng, dtype, device, xp)
        self.Wi, self.Wh = Wi, Wh
        self.bias = _bias(bias, Wi, Wi.shape[0])

    @property
    def size(self):
        return self.Wi.shape[1], self.Wi.shape[0] // self.GATES

    def initialstates(self, batch):
        """The zero state for a batch of `batch` inputs (on the weights' library and device)."""
        w = data(self.Wi)
        zeros = namespace_of(w).zeros((batch, self.size[1]), dtype=w.dtype, device=device_of(w))
        return (zeros, zeros) if self.GATES == 4 else zeros

    def _inputs(self, x, state, parts=1):
        n_in, n_out = self.size
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
        return f"{type(self).__name__}({n_in} => {n_out}{extra})"


_CELL_DOC = """

    `{name}(n_in, n_out{act})` draws `Wi` and `Wh` with `init` (Glorot uniform, Flux's default)
    and makes a zero bias (`bias=False` for none); `{name}(Wi=..., Wh=..., bias=...)` wraps
    given arrays.
    """


@dataclass(init=False, repr=False)
class RNNCell(_Cell):
    """`h' = activation(x @ Wi.T + h @ Wh.T + bias)` (Elman); its output is `h'`."""

    Wi: Any
    Wh: Any
    bias: Any
    activation: Callable | None

    def __init__(
        self,
        n_in=None,
        n_out=None,
        activation=tanh,
        *,
        Wi=None,
        Wh=None,
        bias=True,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        self._make(n_in, n_out, Wi, Wh, bias, init, rng, dtype, device, xp)
        self.activation = activation

    def __call__(self, x, state=None):
        x, h = self._inputs(x, state)
        h = _activate(self.activation, add(linear(x, self.Wi, self.bias), linear(h, self.Wh, None)))
        return h, h


@dataclass(init=False, repr=False)
class LSTMCell(_Cell):
    """Long short-term memory (Hochreiter & Schmidhuber 1997): gates `i, f, g, o` from
    `x @ Wi.T + h @ Wh.T + bias`, `c' = sigmoid(f) * c + sigmoid(i) * tanh(g)` and
    `h' = sigmoid(o) * tanh(c')`; the state is `(h, c)`, the output `h'`."""

    GATES = 4
    Wi: Any
    Wh: Any
    bias: Any

    def __init__(
        self,
        n_in=None,
        n_out=None,
        *,
        Wi=None,
        Wh=None,
        bias=True,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        self._make(n_in, n_out, Wi, Wh, bias, init, rng, dtype, device, xp)

    def __call__(self, x, state=None):
        x, (h, c) = self._inputs(x, state, parts=2)
        z = add(linear(x, self.Wi, self.bias), linear(h, self.Wh, None))
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

    def __init__(
        self,
        n_in=None,
        n_out=None,
        *,
        Wi=None,
        Wh=None,
        bias=True,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        self._make(n_in, n_out, Wi, Wh, bias, init, rng, dtype, device, xp)

    def __call__(self, x, state=None):
        x, h = self._inputs(x, state)
        n = self.size[1]
        a, b = linear(x, self.Wi, self.bias), linear(h, self.Wh, None)
        r = sigmoid(add(_slice(a, 0, n), _slice(b, 0, n)))
        z = sigmoid(add(_slice(a, 1, n), _slice(b, 1, n)))
        candidate = tanh(add(_slice(a, 2, n), multiply(r, _slice(b, 2, n))))
        h = add(multiply(subtract(1.0, z), candidate), multiply(z, h))
        return h, h


for _cls, _act in ((RNNCell, ", activation=tanh"), (LSTMCell, ""), (GRUCell, "")):
    _cls.__doc__ += _CELL_DOC.format(name=_cls.__name__, act=_act)


@dataclass(init=False, repr=False)
class Recurrence(Layer):
    """A cell run over a batch-first sequence `(batch, time, features)`: `layer(x, state=None)`
    returns the outputs of every step `(batch, time, out)`, and with `return_state=True`
    `(outputs, last state)`. Flux's `Recurrence`."""

    cell: Any
    return_state: bool

    def __init__(self, cell=None, *, return_state=False):
        if not isinstance(cell, _Cell):
            raise TypeError(
                f"Recurrence runs a recurrent cell (RNNCell, LSTMCell, GRUCell), got {cell!r}"
            )
        self.cell, self.return_state = cell, return_state

    def __call__(self, x, state=None):
        n_in = self.cell.size[0]
        self._expect(len(_shape(x)) == 3 and _shape(x)[2] == n_in, x, f"(batch, time, {n_in})")
        outputs = []
        for t in range(x.shape[1]):
            y, state = self.cell(getitem(x, (slice(None), t, slice(None))), state)
            outputs.append(y)
        y = stack(outputs, axis=1)
        return (y, state) if self.return_state else y

    def __repr__(self):
        if not isinstance(self.cell, _Cell):
            return self._fields_repr()
        inner = repr(self.cell)
        if type(self) is not Recurrence:
            inner = type(self).__name__ + inner[inner.index("(") :]
        extra = ", return_state=True" if self.return_state is True else ""
        return inner if type(self) is not Recurrence else f"Recurrence({inner}{extra})"


def _sequence_layer(name, cell_type):
    def __init__(self, n_in=None, n_out=None, *args, return_state=False, cell=None, **kw):
        cell = cell if cell is not None else cell_type(n_in, n_out, *args, **kw)
        Recurrence.__init__(self, cell, return_state=return_state)

    doc = (
        f"`Recurrence({cell_type.__name__}(...))`: `{name}(n_in, n_out, ...)` takes the "
        f"cell's arguments and `return_state`."
    )
    return type(name, (Recurrence,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


RNN = _sequence_layer("RNN", RNNCell)
LSTM = _sequence_layer("LSTM", LSTMCell)
GRU = _sequence_layer("GRU", GRUCell)
