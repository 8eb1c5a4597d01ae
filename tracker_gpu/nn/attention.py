"""Attention: `MultiHeadAttention` (Vaswani et al. 2017, Flux's layer) and a small pre-norm
`TransformerBlock`.

Sequences are batch-first, `(batch, length, dim)`. `mha(q, k=q, v=k, mask=None)` returns the
attended values `(batch, length_q, dim)` and the attention scores `(batch, heads, length_q,
length_k)`, as Flux's does; `mask` is boolean, True where a query may attend to a key, of a
shape that broadcasts to the scores, and `causal=True` lets query `i` attend to keys `j <= i`
only. A row with no key to attend to has nan scores.

>>> import numpy as np
>>> from tracker_gpu import nn
>>> mha = nn.MultiHeadAttention(8, nheads=2, causal=True, rng=np.random.default_rng(0))
>>> mha
MultiHeadAttention(8, nheads=2, causal=True)
>>> y, scores = mha(np.ones((3, 5, 8), dtype=np.float32))
>>> y.shape, scores.shape, float(scores[0, 0, 0, 1])
((3, 5, 8), (3, 2, 5, 5), 0.0)
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..backend import device_of, namespace_of
from ..rules.elementwise import add, multiply, where
from ..rules.linalg import matmul, matrix_transpose
from ..rules.nn import softmax
from ..rules.shape import permute_dims, reshape
from ..tracked import data
from .activations import gelu
from .init import _rng, glorot_uniform
from .layers import Chain, Dense, Dropout, Layer, _describe, _is_layer_field, _shape
from .normalise import LayerNorm

__all__ = ["MultiHeadAttention", "TransformerBlock"]


@dataclass(init=False, repr=False)
class MultiHeadAttention(Layer):
    """`nheads` heads of scaled dot-product attention over `dim` features: queries, keys and
    values projected by `q_proj`, `k_proj`, `v_proj` (Dense `dim => dim`, split into heads of
    `dim // nheads`), `softmax(q @ k.T / sqrt(dim // nheads))` per head, the heads' values
    joined and projected by `out_proj`. `bias=False` (Flux's default) makes the projections
    without biases."""

    q_proj: Any
    k_proj: Any
    v_proj: Any
    out_proj: Any
    nheads: int
    causal: bool

    def __init__(
        self,
        dim=None,
        nheads=8,
        *,
        bias=False,
        causal=False,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
        q_proj=None,
        k_proj=None,
        v_proj=None,
        out_proj=None,
    ):
        if q_proj is None:
            if dim is None:
                raise TypeError("MultiHeadAttention needs its dimension, MultiHeadAttention(dim)")
            if not (isinstance(nheads, int) and nheads >= 1) or dim % nheads:
                raise ValueError(
                    f"MultiHeadAttention: nheads={nheads!r} must divide the dimension {dim}; "
                    "choose a divisor of dim"
                )
            rng = _rng(rng)
            make = lambda: Dense(
                dim, dim, bias=bias, init=init, rng=rng, dtype=dtype, device=device, xp=xp
            )
            q_proj, k_proj, v_proj, out_proj = make(), make(), make(), make()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = q_proj, k_proj, v_proj, out_proj
        self.nheads, self.causal = nheads, causal

    @property
    def dim(self):
        return self.q_proj.weight.shape[0]

    def __call__(self, q, k=None, v=None, *, mask=None):
        k = q if k is None else k
        v = k if v is None else v
        for x in (q, k, v):
            self._expect(
                len(_shape(x)) == 3 and _shape(x)[2] == self.dim, x, f"(batch, length, {self.dim})"
            )
        heads = [
            self._heads(p, x) for p, x in ((self.q_proj, q), (self.k_proj, k), (self.v_proj, v))
        ]
        query, key, value = heads
        scale = 1.0 / math.sqrt(self.dim // self.nheads)
        scores = multiply(matmul(query, matrix_transpose(key)), scale)  # (b, h, lq, lk)
        allowed = self._allowed(mask, q.shape[1], k.shape[1], data(scores))
        if allowed is not None:
            scores = where(allowed, scores, -math.inf)
        scores = softmax(scores, axis=-1)
        joined = permute_dims(matmul(scores, value), (0, 2, 1, 3))  # (b, lq, h, d)
        return self.out_proj(reshape(joined, (q.shape[0], q.shape[1], self.dim))), scores

    def _heads(self, projection, x):
        b, length, _ = x.shape
        split = reshape(projection(x), (b, length, self.nheads, self.dim // self.nheads))
        return permute_dims(split, (0, 2, 1, 3))  # (b, h, length, d)

    def _allowed(self, mask, lq, lk, like):
        if self.causal:
            xp, device = namespace_of(like), device_of(like)
            causal = xp.arange(lq, device=device)[:, None] >= xp.arange(lk, device=device)[None, :]
            mask = causal if mask is None else (mask & causal)  # a traced mask stays traced
        return mask

    def __repr__(self):
        if not _is_layer_field(self.q_proj.weight):
            return self._fields_repr()
        extra = "" if self.q_proj.bias is None else ", bias=True"
        extra += ", causal=True" if self.causal is True else ""
        return f"MultiHeadAttention({self.dim}, nheads={self.nheads}{extra})"


@dataclass(init=False, repr=False)
class TransformerBlock(Layer):
    """A pre-norm transformer block: `x + attention(norm1(x))`, then `x + mlp(norm2(x))`, the
    MLP `dim => hidden => dim` with `activation` in between (GELU, tanh form). PyTorch's
    `TransformerEncoderLayer` with `norm_first=True`, `batch_first=True` and no dropout.
    `TransformerBlock(dim, nheads, hidden=4 * dim, causal=False)`; the projections have biases.
    `dropout=p` (0 by default: none) drops out the output of each branch before it is added
    (GPT-2's residual dropout), drawing from `rng`; the field `dropout` holds the `Dropout` layer
    (None without one), so `trainmode`/`testmode` switch it.

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> nn.TransformerBlock(8, 2, causal=True, dropout=0.1, rng=np.random.default_rng(0))
    TransformerBlock(8, nheads=2, hidden=32, gelu, causal=True, dropout=0.1)
    """

    norm1: Any
    attention: Any
    norm2: Any
    mlp: Any
    dropout: Any

    def __init__(
        self,
        dim=None,
        nheads=8,
        hidden=None,
        activation: Callable = gelu,
        *,
        causal=False,
        eps=1e-5,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
        norm1=None,
        attention=None,
        norm2=None,
        mlp=None,
        dropout=None,
    ):
        rng = _rng(rng) if norm1 is None or isinstance(dropout, (int, float)) else rng
        if norm1 is None:
            if dim is None:
                raise TypeError("TransformerBlock needs its dimension, TransformerBlock(dim)")
            hidden = 4 * dim if hidden is None else hidden
            place = dict(dtype=dtype, device=device, xp=xp)
            norm1, norm2 = LayerNorm(dim, eps=eps, **place), LayerNorm(dim, eps=eps, **place)
            attention = MultiHeadAttention(
                dim, nheads, bias=True, causal=causal, init=init, rng=rng, **place
            )
            mlp = Chain(
                Dense(dim, hidden, activation, init=init, rng=rng, **place),
                Dense(hidden, dim, init=init, rng=rng, **place),
            )
        if isinstance(dropout, (int, float)):
            dropout = Dropout(dropout, rng=rng) if dropout else None
        self.norm1, self.attention, self.norm2, self.mlp = norm1, attention, norm2, mlp
        self.dropout = dropout

    def __call__(self, x, *, mask=None):
        x = add(x, self._dropped(self.attention(self.norm1(x), mask=mask)[0]))
        return add(x, self._dropped(self.mlp(self.norm2(x))))

    def _dropped(self, x):
        return x if self.dropout is None else self.dropout(x)

    def __repr__(self):
        if not isinstance(self.attention, MultiHeadAttention):
            return self._fields_repr()
        hidden = self.mlp.layers[0].weight.shape[0]
        act = _describe(self.mlp.layers[0].activation)
        causal = ", causal=True" if self.attention.causal is True else ""
        if isinstance(self.dropout, Dropout) and isinstance(self.dropout.p, (int, float)):
            causal += f", dropout={self.dropout.p}"
        return (
            f"TransformerBlock({self.attention.dim}, nheads={self.attention.nheads}, "
            f"hidden={hidden}, {act}{causal})"
        )
