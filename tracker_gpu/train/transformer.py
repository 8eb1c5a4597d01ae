"""The model of the text job: a decoder-only transformer over characters (GPT-2's layout, small).

Token and position embeddings, dropout, `layers` pre-norm causal `nn.TransformerBlock`s, a final
`LayerNorm`, and the output layer tied to the token embedding (the logits are
`h @ embed.weight.T`). `generate` samples from it with the forward only, on plain arrays.

>>> import numpy as np
>>> model = CharTransformer(vocab=10, context=8, width=16, heads=2, layers=1,
...                         rng=np.random.default_rng(0))
>>> model
CharTransformer(vocab=10, context=8, width=16, heads=2, layers=1, dropout=0.1)
>>> model(np.zeros((3, 8), dtype=np.int64)).shape
(3, 8, 10)
"""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracker_gpu import nn
from tracker_gpu.backend import namespace_of
from tracker_gpu.rules.elementwise import add
from tracker_gpu.rules.linalg import matmul, matrix_transpose
from tracker_gpu.rules.shape import getitem, reshape
from tracker_gpu.tracked import data

__all__ = ["CharTransformer", "text_loss", "generate"]

INIT_STD = 0.02  # GPT-2's: small embeddings, so the tied output starts near uniform


def small_normal(rng, shape):
    """Normal draws of standard deviation 0.02 (GPT-2's initialisation of the embeddings)."""
    return INIT_STD * rng.standard_normal(shape)


@dataclass(init=False, repr=False)
class CharTransformer(nn.Layer):
    """`CharTransformer(vocab, context, width, heads, layers, dropout=0.1)`: integer tokens
    `(batch, length)`, `length <= context`, to logits `(batch, length, vocab)` for the next
    token at each place (a causal mask: place `i` sees tokens `0..i` only)."""

    embed: Any
    position: Any
    dropout: Any
    blocks: tuple
    norm: Any

    def __init__(self, vocab, context, width, heads, layers, *, dropout=0.1, rng=None,
                 dtype="float32", device=None, xp=None):  # fmt: skip
        place = dict(dtype=dtype, device=device, xp=xp)
        rng = np.random.default_rng() if rng is None else rng
        self.embed = nn.Embedding(vocab, width, init=small_normal, rng=rng, **place)
        self.position = nn.asarray(small_normal(rng, (context, width)), **place)
        self.dropout = nn.Dropout(dropout, rng=rng)
        self.blocks = tuple(
            nn.TransformerBlock(width, heads, causal=True, dropout=dropout, rng=rng, **place)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width, **place)

    def __call__(self, tokens):
        length = tokens.shape[1]
        self._expect(length <= self.position.shape[0], tokens, f"at most {self.context} tokens")
        x = add(self.embed(tokens), getitem(self.position, slice(0, length)))
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x)
        return matmul(self.norm(x), matrix_transpose(self.embed.weight))  # the tied output

    @property
    def context(self):
        return self.position.shape[0]

    def __repr__(self):
        vocab, width = self.embed.weight.shape
        heads = self.blocks[0].attention.nheads if self.blocks else None
        return (
            f"CharTransformer(vocab={vocab}, context={self.context}, width={width}, "
            f"heads={heads}, layers={len(self.blocks)}, dropout={self.dropout.p})"
        )


def text_loss(model, x, y, mixed=None, last=None):
    """The mean cross-entropy (nats per character) of `model`'s predictions of `y` (the
    characters that follow each of `x`), both `(batch, length)`, or of the last `last`
    positions of each row only; with `mixed` (a `mixed.Mixed`), the model runs under its
    policy and the loss is taken in float32."""
    logits = model(x) if mixed is None else mixed.forward(model, x)
    if last is not None:
        logits, y = logits[:, -last:], y[:, -last:]
    flat = reshape(logits, (-1, logits.shape[-1]))
    return nn.logitcrossentropy(flat, reshape(y, (-1,)))


def generate(model, prompt, length, *, temperature=1.0, rng):
    """`length` tokens sampled after `prompt` (a list of ints), one at a time, each from the
    model's prediction over the last `context` tokens, its logits divided by `temperature`;
    the forward only, on plain arrays (no tape). Returns the list of new tokens."""
    xp = namespace_of(data(model.embed.weight))
    device = data(model.embed.weight).device
    tokens = list(prompt)
    for _ in range(length):
        window = xp.asarray([tokens[-model.context :]], device=device)
        logits = nn.to_numpy(model(window)[0, -1]).astype(np.float64)
        with np.errstate(over="ignore"):  # a tiny temperature: -inf, exp 0 (greedy), no warning
            p = np.exp((logits - logits.max()) / temperature)  # shifted first: no inf - inf
        tokens.append(int(rng.choice(p.size, p=p / p.sum())))
    return tokens[len(prompt) :]


def parameter_count(model):
    """How many numbers the model trains."""
    return sum(math.prod(v.shape) for v in nn.io._parameters(model).values())
