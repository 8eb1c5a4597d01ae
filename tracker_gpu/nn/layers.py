"""Layers: the `Layer` base, `Dense`, `Chain`, `Flatten`, `Dropout`, `Embedding`.

A layer is a dataclass whose fields are arrays, sublayers or settings, called on a batch whose
first axis is the batch; `Layer` gives them a short repr and a clear error for an input of the
wrong shape. `trainmode` and `testmode` switch the layers with a training mode (an `active`
field: Dropout, BatchNorm) on and off; the other layers, built on the same base, are in `conv`,
`normalise`, `recurrent` and `attention`.
"""

import copy
import dataclasses
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import draws, recording
from ..backend import common_library, device_of, is_array, isdtype, namespace_of
from ..checks import checking
from ..optim.tree import tree_map_with_path
from ..primitive import Primitive, no_gradient
from ..rules.elementwise import astype, mask, multiply
from ..rules.linalg import matmul
from ..rules.manipulation import take
from ..rules.shape import reshape
from ..tracked import data, istracked
from .activations import _activate, flatten
from .init import _rng, glorot_uniform, randn
from .placement import _dtype_name, asarray, to_numpy
from .primitives import linear

__all__ = [
    "Layer",
    "Chain",
    "Dense",
    "Flatten",
    "Dropout",
    "Embedding",
    "trainmode",
    "testmode",
]


def _zeros_like(like, n):
    xp = namespace_of(like)
    return xp.zeros((n,), dtype=like.dtype, device=device_of(like))


def _bias(bias, like, n):
    """A bias from `bias=True` (zeros placed like `like`), False/None (no bias) or an array."""
    if bias is True:
        return _zeros_like(like, n)
    if bias is False or bias is None:
        return None
    if not is_array(data(bias)) or tuple(bias.shape) != (n,):
        got = f"shape {tuple(bias.shape)}" if is_array(data(bias)) else f"a {type(bias).__name__}"
        raise ValueError(
            f"a bias of {n} outputs has shape ({n},), got {got}: a bias is added to every "
            "sample alike (pass True for zeros, or an array of the library's)"
        )
    return bias


def _is_layer_field(value):
    return is_array(data(value))


class Layer:
    """What the layers share: a short repr, and the check of an input's shape."""

    def __repr__(self):
        return self._fields_repr()

    def _fields_repr(self):
        """`Name(field=value, ...)`, arrays summarised: for gradients and optimiser states,
        which have a layer's structure but not its arrays."""
        fields = ", ".join(
            f"{f.name}={_describe(getattr(self, f.name))}" for f in dataclasses.fields(self)
        )
        return f"{type(self).__name__}({fields})"

    def _expect(self, condition, x, expected):
        if not condition:
            self._refuse(x, expected)

    def _refuse(self, x, expected):
        if not is_array(data(x)):
            raise TypeError(
                f"{self!r} expects an array of {expected}, got a {type(x).__name__}; convert it "
                "with the library's asarray (np.asarray(x))"
            )
        raise ValueError(f"{self!r} expects {expected}, got an input of shape {_shape(x)}")


def istraced(x):
    """Whether `x` is a traced array while tg.compile records: what the layer computes from it
    must go through the namespace's functions (recorded), never through its plain value."""
    return istracked(x) and recording.current() is not None


def _describe(value):
    if _is_layer_field(value):
        v = data(value)
        return f"{_dtype_name(v.dtype)}{list(v.shape)}"
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    return repr(value)


def _shape(x):
    return tuple(getattr(x, "shape", ()))


def _match_dtype(x, like):
    """Cast a (plain or tracked) input to the dtype of the layer's weight, as Flux does."""
    if type(data(x)) is not type(data(like)):  # mixed libraries raise, naming them
        common_library(namespace_of(data(like)), data(x))
    if data(x).dtype == like.dtype:
        return x
    return astype(x, data(like).dtype)


@dataclass(init=False, repr=False)
class Dense(Layer):
    """`activation(x @ weight.T + bias)`: `weight` is `(n_out, n_in)`, `x` is `(..., n_in)`.

    `Dense(n_in, n_out, activation)` draws `weight` with `init` (Glorot uniform) and makes a zero
    bias (`bias=False` for none); `Dense(weight=W, bias=b, activation=f)` wraps given arrays.
    """

    weight: Any
    bias: Any
    activation: Callable | None

    def __init__(
        self,
        n_in=None,
        n_out=None,
        activation=None,
        *,
        weight=None,
        bias=True,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if weight is None:
            if n_in is None or n_out is None:
                raise TypeError("Dense needs its sizes, Dense(n_in, n_out), or weight=")
            if not all(isinstance(n, numbers.Integral) for n in (n_in, n_out)):
                raise TypeError(
                    f"Dense(n_in, n_out) takes two sizes, got a {type(n_in).__name__} and a "
                    f"{type(n_out).__name__}; wrap given arrays as Dense(weight=W, bias=b)"
                )
            values = init(_rng(rng), (n_out, n_in))
            weight = asarray(values, xp=xp, device=device, dtype=dtype)
        elif not is_array(data(weight)) or len(weight.shape) != 2:
            given = is_array(data(weight))
            got = f"shape {tuple(weight.shape)}" if given else f"a {type(weight).__name__}"
            raise ValueError(
                f"Dense(weight=W) takes a matrix of shape (n_out, n_in), got {got}; convert "
                "it with the library's asarray"
            )
        self.weight = weight
        self.bias = _bias(bias, weight, weight.shape[0])
        self.activation = activation

    def __call__(self, x):
        n_in = self.weight.shape[1]
        if _shape(x)[-1:] != (n_in,):
            self._refuse(x, f"{n_in} features on the last axis")
        y = linear(_match_dtype(x, self.weight), self.weight, self.bias)
        return _activate(self.activation, y)

    def __repr__(self):
        if not _is_layer_field(self.weight):
            return self._fields_repr()
        n_out, n_in = self.weight.shape
        extra = "" if self.activation is None else f", {_describe(self.activation)}"
        extra += "" if self.bias is not None else ", bias=False"
        return f"Dense({n_in} => {n_out}{extra})"


@dataclass(repr=False)
class Flatten(Layer):
    """Every axis but the first (the batch) made one: `(n, c, h, w)` to `(n, c * h * w)`."""

    def __call__(self, x):
        self._expect(len(_shape(x)) >= 1, x, "a batch axis")
        return flatten(x)

    def __repr__(self):
        return "Flatten()"


@dataclass(init=False, repr=False)
class Dropout(Layer):
    """Zero each element with probability `p` and scale the rest by `1 / (1 - p)`, in training.

    The mask is drawn from the explicit generator `rng` (a NumPy Generator, or one of the data's
    library with a `.random(shape)` method, e.g. CuPy's). `active=None` (automatic) drops out
    when the input is tracked, that is inside `gradient`/`withgradient`, and is the identity on
    plain arrays (evaluation); `trainmode`/`testmode` (or `active=True/False`) force it, which
    dropout on the raw input of a model needs.
    """

    p: float
    rng: Any
    active: bool | None

    def __init__(self, p=0.5, *, rng=None, active=None):
        if not 0 <= p <= 1:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p, self.rng, self.active = p, _rng(rng), active

    def __call__(self, x):
        active = recording.tracks(x) if self.active is None else self.active  # as eagerly
        if not active or self.p == 0:
            return x
        plain = data(x)
        xp = namespace_of(plain)
        if self.p == 1:
            return multiply(x, xp.zeros_like(plain))
        u = draws.uniform(self.rng, tuple(plain.shape), like=plain)
        keep = astype(u >= self.p, plain.dtype)  # traced while tg.compile records: redrawn
        return multiply(x, keep * (1.0 / (1.0 - self.p)))

    def __repr__(self):
        if not isinstance(self.p, (int, float)):
            return self._fields_repr()
        extra = "" if self.active is None else f", active={self.active}"
        return f"Dropout({self.p}{extra})"


@dataclass(init=False, repr=False)
class Embedding(Layer):
    """A lookup table: integer indices of any shape to vectors, `weight[indices]`, of shape
    `indices.shape + (dim,)`; one-hot inputs (`(..., vocab)`, floating or boolean) give
    `onehot @ weight`. `weight` is `(vocab, dim)`, drawn from the standard normal by default.

    PyTorch's `Embedding(vocab, dim, padding_idx, max_norm, norm_type)`. `padding_idx` names a
    row that gets no gradient (a padding token's; drawn as zeros, as PyTorch does, unless
    `weight` is given). `max_norm` renormalises each row looked up whose `norm_type`-norm
    exceeds it to norm `max_norm` (scaled by `max_norm / (norm + 1e-7)`, PyTorch's arithmetic),
    and the gradient of each row is PyTorch's (the scaling is not differentiated). PyTorch also
    writes the renormalised rows into its weight; here a call never writes the model's arrays:
    the lookup uses the renormalised rows, the weight keeps its values, so an optimiser steps
    from the stored row, not from the renormalised one (the same step where no looked-up row's
    norm exceeds `max_norm`). One-hot inputs look every row up: every row is renormalised.

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> emb = nn.Embedding(weight=np.array([[3.0, 4.0], [0.3, 0.4]]), padding_idx=1, max_norm=1.0)
    >>> emb
    Embedding(2 => 2, padding_idx=1, max_norm=1.0)
    >>> emb(np.array([0, 1])).round(6)
    array([[0.6, 0.8],
           [0.3, 0.4]])
    """

    weight: Any
    padding_idx: int | None
    max_norm: float | None
    norm_type: float

    def __init__(
        self,
        vocab=None,
        dim=None,
        *,
        weight=None,
        padding_idx=None,
        max_norm=None,
        norm_type=2.0,
        init=randn,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if weight is None:
            if vocab is None or dim is None:
                raise TypeError("Embedding needs Embedding(vocab, dim) or weight=")
            values = init(_rng(rng), (vocab, dim))
            if padding_idx is not None:
                values[_padding_row(padding_idx, vocab)] = 0
            weight = asarray(values, xp=xp, device=device, dtype=dtype)
        padding_idx = _padding_row(padding_idx, weight.shape[0])
        if max_norm is not None and not max_norm > 0:
            raise ValueError(
                f"Embedding: max_norm must be a positive number or None, got {max_norm!r}"
            )
        self.weight, self.padding_idx = weight, padding_idx
        self.max_norm, self.norm_type = max_norm, norm_type

    def __call__(self, indices):
        vocab, dim = self.weight.shape
        plain = data(indices)
        xp = namespace_of(data(self.weight))
        if not is_array(plain) or not isdtype(namespace_of(plain), plain.dtype, "integral"):
            self._expect(_shape(indices)[-1:] == (vocab,), indices, "integer indices or one-hot")
            weight = self._options(
                self.weight, xp.arange(vocab, device=device_of(data(self.weight)))
            )
            return matmul(_match_dtype(indices, self.weight), weight)
        traced = istraced(indices)  # while tg.compile records: the replay reads new indices
        if namespace_of(plain) is not xp:
            if traced:
                recording.refuse(
                    "nn.Embedding with indices of another library than its weight (a copy "
                    "between libraries); pass the indices in the weight's library"
                )
            plain = indices = xp.asarray(to_numpy(plain), device=device_of(data(self.weight)))
        _check_range(xp, plain, vocab, repr(self))
        if traced:  # and checked again by every replay (where that costs no sync)
            indices = _checked_indices(indices, vocab=vocab, layer=repr(self))
        flat = reshape(indices if traced else plain, (-1,))
        rows = self._options(take(self.weight, flat, axis=0), flat)
        return reshape(rows, tuple(plain.shape) + (dim,))

    def _options(self, rows, indices):
        """`rows` (of the weight, at `indices`) renormalised (`max_norm`), the padding row's
        gradient dropped (`padding_idx`); unchanged without either option."""
        if self.padding_idx is None and self.max_norm is None:
            return rows
        options = dict(padding_idx=self.padding_idx, max_norm=self.max_norm,
                       norm_type=self.norm_type)  # fmt: skip
        return _embedding_rows(rows, indices, **options)

    def __repr__(self):
        if not _is_layer_field(self.weight):
            return self._fields_repr()
        vocab, dim = self.weight.shape
        extra = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            extra += f", max_norm={self.max_norm}"
            extra += "" if self.norm_type == 2.0 else f", norm_type={self.norm_type}"
        return f"Embedding({vocab} => {dim}{extra})"


def _padding_row(padding_idx, vocab):
    """`padding_idx` as a row of the table (PyTorch's: negative counts from the end), or None."""
    if padding_idx is None:
        return None
    if not isinstance(padding_idx, int) or not -vocab <= padding_idx < vocab:
        raise ValueError(
            f"Embedding: padding_idx must be an int in [{-vocab}, {vocab - 1}] (a row of the "
            f"table) or None, got {padding_idx!r}"
        )
    return padding_idx % vocab


def _rows_forward(xp, rows, indices, *, padding_idx, max_norm, norm_type):
    """Each row whose norm exceeds `max_norm` scaled by `max_norm / (norm + 1e-7)` (PyTorch's
    `embedding_renorm_`); a new array, the rows as they are without `max_norm`."""
    if max_norm is None:
        return rows * 1
    norm = xp.linalg.vector_norm(rows, axis=-1, keepdims=True, ord=norm_type)
    scale = xp.where(norm > max_norm, max_norm / (norm + 1e-7), xp.ones_like(norm))
    return rows * scale


def _rows_vjp(g, ans, rows, indices, *, padding_idx, max_norm, norm_type):
    """`g` as it is (the renormalisation is not differentiated, as in PyTorch), but none for the
    rows looked up at `padding_idx`."""
    if padding_idx is None:
        return g
    return mask(reshape(indices != padding_idx, (-1, 1)), g)


_embedding_rows = Primitive("embedding_rows", _rows_forward, (_rows_vjp, None), saves="indices")


@dataclass(init=False, repr=False)
class Chain(Layer):
    """Layers (or functions) applied in turn: `Chain(Dense(2, 3, relu), Dense(3, 1))(x)`."""

    layers: tuple

    def __init__(self, *layers, **fields):
        self.layers = tuple(fields.pop("layers", layers))
        if fields:
            raise TypeError(f"Chain got unexpected keyword arguments {sorted(fields)}")

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i):
        return Chain(*self.layers[i]) if isinstance(i, slice) else self.layers[i]

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __repr__(self):
        inner = (repr(x) if isinstance(x, Layer) else _describe(x) for x in self.layers)
        return f"Chain({', '.join(inner)})"


def _has_modes(x):
    return isinstance(x, Layer) and hasattr(x, "active")


def _set_active(model, active):
    def set_active(path, x):
        if not _has_modes(x):
            return x
        out = copy.copy(x)
        out.active = active
        return out

    return tree_map_with_path(set_active, model, is_leaf=_has_modes)


def _check_range(xp, indices, vocab, layer):
    if bool(xp.any((indices < 0) | (indices >= vocab))):
        raise ValueError(
            f"{layer}: indices must lie in [0, {vocab - 1}], got indices from "
            f"{int(xp.min(indices))} to {int(xp.max(indices))}"
        )


def _indices_checked(xp, indices, *, vocab, layer):
    if checking(indices):
        _check_range(xp, indices, vocab, layer)
    return indices


_checked_indices = no_gradient("embedding_indices", _indices_checked)


def trainmode(model, active=True):
    """A copy of `model` whose Dropout and BatchNorm layers are in training mode (Flux's
    `trainmode!`); `active=None` gives them back their automatic mode. The copy shares the
    model's arrays: the running statistics a BatchNorm updates in training are the model's
    own buffers, updated in place as PyTorch's are (a snapshot of them is `copy.deepcopy`)."""
    return _set_active(model, active)


def testmode(model):
    """A copy of `model` whose Dropout layers are the identity and whose BatchNorm layers use
    their running statistics (Flux's `testmode!`)."""
    return _set_active(model, False)
