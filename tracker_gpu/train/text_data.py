"""The data of the text job: CPython's documentation text (`pydoc_data.topics`, shipped with
every CPython: no download), as characters, split 90/10 into training and validation text; the
random windows of a training batch; and the unigram and bigram baselines, counted exactly on
the same split.

>>> text = Text.of("abracadabra", fraction=0.25)
>>> text.vocab, text.decode(text.train[:4]), len(text.train), len(text.valid)
('abcdr', 'abra', 8, 3)
>>> round(baselines(text.train, text.valid, len(text.vocab))["unigram"], 4)
1.5664
"""

import hashlib
from dataclasses import dataclass

import numpy as np

from tracker_gpu import nn

__all__ = ["Text", "corpus", "windows", "batch", "baselines", "VALID_FRACTION"]

VALID_FRACTION = 0.1  # the end of the text, held out for validation


def corpus():
    """The documentation text of CPython's help() (about 465,000 characters, 103 distinct): the
    topics of `pydoc_data.topics`, by name, one after another."""
    from pydoc_data.topics import topics

    return "\n".join(topics[name] for name in sorted(topics))


@dataclass
class Text:
    """A text as integer codes of its characters (`vocab`, sorted): `train` and `valid`, the
    first 90% and the last 10%, NumPy arrays of int64."""

    vocab: str
    train: object
    valid: object

    @classmethod
    def of(cls, text, fraction=VALID_FRACTION):
        vocab = "".join(sorted(set(text)))
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        lookup = {ord(c): i for i, c in enumerate(vocab)}
        ids = np.array([lookup[c] for c in codes.tolist()], dtype=np.int64)
        cut = len(text) - int(round(fraction * len(text)))
        return cls(vocab, ids[:cut], ids[cut:])

    def encode(self, string):
        """The codes of `string`; a character outside the vocabulary is a ValueError."""
        unknown = sorted(set(string) - set(self.vocab))
        if unknown:
            raise ValueError(f"characters not in the text: {''.join(unknown)!r}")
        return [self.vocab.index(c) for c in string]

    def decode(self, codes):
        return "".join(self.vocab[int(i)] for i in codes)

    def fingerprint(self):
        """What a checkpoint records of the text it trained on: its length, its characters'
        count and a digest of both parts (CPython's documentation differs between versions).

        >>> Text.of("abracadabra").fingerprint()["characters"]
        11
        """
        digest = hashlib.sha256(self.vocab.encode("utf-8"))
        for part in (self.train, self.valid):
            digest.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
        return dict(characters=len(self.train) + len(self.valid), distinct=len(self.vocab),
                    digest=digest.hexdigest()[:16])  # fmt: skip


def batch(ids, size, context, rng, *, xp=None, device=None):
    """`size` windows of `context` characters at random places of `ids` (the starts drawn from
    `rng`), and the characters that follow each: `(x, y)`, `(size, context)` int64 arrays of
    library `xp` on `device`."""
    starts = rng.integers(0, len(ids) - context, size=size)
    return _windows_at(ids, starts, context, xp, device)


def windows(ids, context, size, *, limit=None, xp=None, device=None):
    """Batches `(x, y, new)` of consecutive windows of `context` characters covering `ids`,
    `size` windows a batch, where each window's last `new` targets are predicted there for the
    first time: every character but the first is predicted once (the text's tail by one last
    window that ends at its end). With `limit`, that many batches at most, spread evenly over
    the text (and the tail only if they are all of them)."""
    count = (len(ids) - 1) // context
    starts = np.arange(count) * context
    chunks = [starts[i : i + size] for i in range(0, count, size)]
    whole = limit is None or limit >= len(chunks)
    if not whole:
        chunks = [chunks[i] for i in np.linspace(0, len(chunks) - 1, limit).astype(int)]
    for chunk in chunks:
        yield *_windows_at(ids, chunk, context, xp, device), context
    tail = (len(ids) - 1) % context
    if tail and whole:
        yield *_windows_at(ids, np.array([len(ids) - 1 - context]), context, xp, device), tail


def _windows_at(ids, starts, context, xp, device):
    places = starts[:, None] + np.arange(context)
    return _put(ids[places], xp, device), _put(ids[places + 1], xp, device)


def _put(values, xp, device):
    return nn.asarray(values, xp=xp, device=device, dtype="int64")


def baselines(train, valid, vocab):
    """The validation loss, in nats per character, of the unigram and the bigram model counted
    on the training codes, add-one smoothed over the `vocab` characters (so that a character or
    pair the training text lacks costs a finite loss): `{"unigram": ..., "bigram": ...}`. The
    unigram predicts every validation character, the bigram every one after the first."""
    train, valid = np.asarray(train), np.asarray(valid)
    counts = np.bincount(train, minlength=vocab) + 1.0
    unigram = -np.mean(np.log(counts[valid] / counts.sum()))
    pairs = np.zeros((vocab, vocab))
    np.add.at(pairs, (train[:-1], train[1:]), 1.0)
    pairs += 1.0
    given = pairs / pairs.sum(axis=1, keepdims=True)
    bigram = -np.mean(np.log(given[valid[:-1], valid[1:]]))
    return {"unigram": float(unigram), "bigram": float(bigram)}
