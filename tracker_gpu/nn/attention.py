"""Attention: `MultiHeadAttention` (Vaswani et al. 2017, Flux's layer) and a small
`TransformerBlock`, pre-norm by default (post-norm with `norm_first=False`).

Sequences are batch-first, `(batch, length, dim)`. `mha(q, k=q, v=k, mask=None)` returns the
attended values `(batch, length_q, dim)` and the attention scores `(batch, heads, length_q,
length_k)`, as Flux's does (`average_attn_weights=True`: averaged over the heads, `(batch,
length_q, length_k)`, PyTorch's default); `mask` is boolean, True where a query may attend to a
key, of a shape that broadcasts to the scores, and `causal=True` lets query `i` attend to keys
`j <= i` only. A row with no key to attend to has nan scores.

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

from ..backend import device_of, is_array, isdtype, namespace_of
from ..rules.elementwise import add, multiply, where
from ..rules.linalg import matmul, matrix_transpose
from ..rules.nn import softmax
from ..rules.reductions import mean
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
    values projected by `q_proj`, `k_proj`, `v_proj` (Dense `dim => dim`, `kdim => dim` and
    `vdim => dim`, split into heads of `dim // nheads`), `softmax(q @ k.T / sqrt(dim //
    nheads))` per head, the heads' values joined and projected by `out_proj`. `bias=False`
    (Flux's default) makes the projections without biases. `dropout_prob=p` (Flux's name; 0 by
    default) drops out attention weights in training mode, drawing from `rng`, and the scores
    returned are the dropped ones, as Flux and PyTorch return them; the field `attn_drop`
    holds its `Dropout` (None without one), which `trainmode`/`testmode` switch.

    PyTorch's `MultiheadAttention(dim, nheads, dropout, bias, kdim=kdim, vdim=vdim,
    batch_first=True)` with its `in_proj_weight` split in three; PyTorch's defaults differ:
    `bias=True`, and scores averaged over the heads (`average_attn_weights=True` when calling
    ours gives them).

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> mha = nn.MultiHeadAttention(4, nheads=2, kdim=3, vdim=5, dropout_prob=0.1)
    >>> mha
    MultiHeadAttention(4, nheads=2, kdim=3, vdim=5, dropout_prob=0.1)
    >>> q, k, v = np.ones((2, 6, 4)), np.ones((2, 7, 3)), np.ones((2, 7, 5))
    >>> y, scores = mha(q, k, v, average_attn_weights=True)
    >>> y.shape, scores.shape
    ((2, 6, 4), (2, 6, 7))
    """

    q_proj: Any
    k_proj: Any
    v_proj: Any
    out_proj: Any
    nheads: int
    causal: bool
    attn_drop: Any = None

    def __init__(
        self,
        dim=None,
        nheads=8,
        *,
        bias=False,
        causal=False,
        kdim=None,
        vdim=None,
        dropout_prob=0.0,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
        q_proj=None,
        k_proj=None,
        v_proj=None,
        out_proj=None,
        attn_drop=None,
    ):
        rng = _rng(rng) if q_proj is None or dropout_prob else rng
        if q_proj is None:
            if dim is None:
                raise TypeError("MultiHeadAttention needs its dimension, MultiHeadAttention(dim)")
            if not (isinstance(nheads, int) and nheads >= 1) or dim % nheads:
                raise ValueError(
                    f"MultiHeadAttention: nheads={nheads!r} must divide the dimension {dim}; "
                    "choose a divisor of dim"
                )
            make = lambda n_in: Dense(
                n_in, dim, bias=bias, init=init, rng=rng, dtype=dtype, device=device, xp=xp
            )
            kdim, vdim = kdim or dim, vdim or dim
            q_proj, k_proj, v_proj, out_proj = make(dim), make(kdim), make(vdim), make(dim)
        if dropout_prob:
            attn_drop = Dropout(dropout_prob, rng=rng)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = q_proj, k_proj, v_proj, out_proj
        self.nheads, self.causal, self.attn_drop = nheads, causal, attn_drop

    @property
    def dim(self):
        return self.q_proj.weight.shape[0]

    def __call__(self, q, k=None, v=None, *, mask=None, average_attn_weights=False):
        k = q if k is None else k
        v = k if v is None else v
        pairs = ((self.q_proj, q), (self.k_proj, k), (self.v_proj, v))
        for projection, x in pairs:
            size = projection.weight.shape[1]
            self._expect(
                len(_shape(x)) == 3 and _shape(x)[2] == size, x, f"(batch, length, {size})"
            )
        query, key, value = (self._heads(p, x) for p, x in pairs)
        scale = 1.0 / math.sqrt(self.dim // self.nheads)
        scores = multiply(matmul(query, matrix_transpose(key)), scale)  # (b, h, lq, lk)
        allowed = self._allowed(mask, q.shape[1], k.shape[1], data(scores))
        if allowed is not None:
            scores = where(allowed, scores, -math.inf)
        scores = softmax(scores, axis=-1)
        if self.attn_drop is not None:
            scores = self.attn_drop(scores)
        joined = permute_dims(matmul(scores, value), (0, 2, 1, 3))  # (b, lq, h, d)
        y = self.out_proj(reshape(joined, (q.shape[0], q.shape[1], self.dim)))
        return y, mean(scores, axis=1) if average_attn_weights else scores

    def _heads(self, projection, x):
        b, length, _ = x.shape
        split = reshape(projection(x), (b, length, self.nheads, self.dim // self.nheads))
        return permute_dims(split, (0, 2, 1, 3))  # (b, h, length, d)

    def _allowed(self, mask, lq, lk, like):
        if mask is not None:
            self._check_mask(mask, like)
        if self.causal:
            xp, device = namespace_of(like), device_of(like)
            causal = xp.arange(lq, device=device)[:, None] >= xp.arange(lk, device=device)[None, :]
            mask = causal if mask is None else (mask & causal)  # a traced mask stays traced
        return mask

    def _check_mask(self, mask, scores):
        """A mask is booleans that broadcast to the scores `(batch, heads, lq, lk)`. PyTorch's
        float masks are additive (0 attends, -inf blocks): read as truth values they would
        block what they allow, without an error."""
        plain = data(mask)
        if not (is_array(plain) and isdtype(namespace_of(plain), plain.dtype, "bool")):
            kind = getattr(plain, "dtype", type(plain).__name__)
            raise TypeError(
                f"{self!r}: the mask must be booleans, True where a query may attend to a key; "
                f"got {kind}. For PyTorch's additive float mask (0 attends, -inf blocks) pass "
                "mask=(attn_mask == 0); for its boolean attn_mask (True blocks) mask=~attn_mask"
            )
        shape = tuple(mask.shape)
        if len(shape) > 4 or any(
            n not in (1, m) for n, m in zip(reversed(shape), reversed(scores.shape))
        ):
            raise ValueError(
                f"{self!r}: a mask of shape {shape} does not broadcast to the scores' "
                f"{tuple(scores.shape)} (batch, heads, queries, keys); a padding mask of keys "
                "per sequence is mask[:, None, None, :]"
            )

    def __repr__(self):
        if not _is_layer_field(self.q_proj.weight):
            return self._fields_repr()
        extra = "" if self.q_proj.bias is None else ", bias=True"
        extra += ", causal=True" if self.causal is True else ""
        for name, projection in (("kdim", self.k_proj), ("vdim", self.v_proj)):
            size = projection.weight.shape[1]
            extra += "" if size == self.dim else f", {name}={size}"
        if isinstance(self.attn_drop, Dropout) and isinstance(self.attn_drop.p, (int, float)):
            extra += f", dropout_prob={self.attn_drop.p}"
        return f"MultiHeadAttention({self.dim}, nheads={self.nheads}{extra})"


@dataclass(init=False, repr=False)
class TransformerBlock(Layer):
    """A transformer block, pre-norm by default: `x + attention(norm1(x))`, then `x +
    mlp(norm2(x))`; post-norm with `norm_first=False` (the original transformer's):
    `norm1(x + attention(x))`, then `norm2(x + mlp(x))`. The MLP is `dim => hidden => dim`
    with `activation` in between (GELU, tanh form). `TransformerBlock(dim, nheads, hidden=4 *
    dim, causal=False)`; the projections have biases. `dropout=p` (0 by default: none) drops
    out the output of each branch before it is added (GPT-2's residual dropout), drawing from
    `rng`; the field `dropout` holds the `Dropout` layer (None without one), so
    `trainmode`/`testmode` switch it.

    PyTorch's `TransformerEncoderLayer(dim, nheads, hidden, activation, norm_first=True,
    batch_first=True)` with no dropout. PyTorch's defaults differ: post-norm
    (`norm_first=False` gives it), ReLU, `dim_feedforward=2048`, and `dropout=0.1` on the
    attention weights, the MLP's hidden layer and both branches (the branches' is ours;
    `dataclasses.replace(block, attention=MultiHeadAttention(dim, nheads, bias=True,
    dropout_prob=p), mlp=Chain(Dense(dim, hidden, activation), Dropout(p), Dense(hidden, dim)))`
    adds the others).

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> nn.TransformerBlock(8, 2, causal=True, dropout=0.1, rng=np.random.default_rng(0))
    TransformerBlock(8, nheads=2, hidden=32, gelu, causal=True, dropout=0.1)
    >>> nn.TransformerBlock(8, 2, norm_first=False)
    TransformerBlock(8, nheads=2, hidden=32, gelu, norm_first=False)
    """

    norm1: Any
    attention: Any
    norm2: Any
    mlp: Any
    dropout: Any
    norm_first: bool = True

    def __init__(
        self,
        dim=None,
        nheads=8,
        hidden=None,
        activation: Callable = gelu,
        *,
        causal=False,
        norm_first=True,
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
        self.dropout, self.norm_first = dropout, norm_first

    def __call__(self, x, *, mask=None):
        attend = lambda x: self._dropped(self.attention(x, mask=mask)[0])
        feed = lambda x: self._dropped(self.mlp(x))
        if not self.norm_first:
            x = self.norm1(add(x, attend(x)))
            return self.norm2(add(x, feed(x)))
        x = add(x, attend(self.norm1(x)))
        return add(x, feed(self.norm2(x)))

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
        causal += ", norm_first=False" if self.norm_first is False else ""
        return (
            f"TransformerBlock({self.attention.dim}, nheads={self.attention.nheads}, "
            f"hidden={hidden}, {act}{causal})"
        )
