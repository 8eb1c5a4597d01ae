"""What the differential tests of tg.compile share: run compiled and eager, compare."""

import dataclasses

import numpy as np

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.nn import layers as nn_layers

RNG = np.random.default_rng(28)
CALLS = 3


def equal(a, b):
    """Bit for bit, else to 1e-12 relative; nested structures (gradients of a layer)."""
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        x, y = np.asarray(tg.data(x)), np.asarray(tg.data(y))
        assert x.shape == y.shape
        if not np.array_equal(x, y, equal_nan=True):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=0)


def leaves(tree):
    if tree is None or isinstance(tree, (int, float, bool, str)) or callable(tree):
        if not dataclasses.is_dataclass(tree):
            return []
    if isinstance(tree, (list, tuple)):
        return [leaf for t in tree for leaf in leaves(t)]
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in leaves(tree[k])]
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return [leaf for f in dataclasses.fields(tree) for leaf in leaves(getattr(tree, f.name))]
    if isinstance(tree, (np.ndarray, tg.TrackedArray)):
        return [tree]
    return []


def differential(f, inputs, name, **compile_kw):
    """`f` compiled and eager on `CALLS` sets of inputs: equal, or refused naming `name`."""
    step = tg.compile(f, **compile_kw)
    wrt = compile_kw.get("wrt")
    for args in inputs:
        eager = tg.withgradient(f, *args) if wrt is None else tg.withgradient(f, *args, wrt=wrt)
        try:
            compiled = step(*args)
        except tg.RecordingError as e:
            assert name in str(e), f"refused without naming {name}: {e}"
            return "refused"
        equal(eager[0], compiled[0])
        equal(eager[1], compiled[1])
    return "replayed"


def floats(*shape):
    return RNG.standard_normal(shape)


class _Calls:
    """A count of calls, `calls[0]`: an object whose value tg.compile's guards do not read
    (a list would be guarded by its items, and f changing it while recording is warned of)."""

    __slots__ = ("n",)

    def __init__(self):
        self.n = 0

    def __getitem__(self, i):
        return (self.n,)[i]


def counted(f):
    """`f` counting its calls in `calls[0]`."""
    calls = _Calls()

    def counted(*args):
        calls.n += 1
        return f(*args)

    return counted, calls


# --- every layer class of nn: built from a small table of inputs
def layer_classes():
    found = []
    for name in nn.__all__:
        value = getattr(nn, name)
        if isinstance(value, type) and issubclass(value, nn_layers.Layer):
            found.append(name)
    return sorted(found)


def _dense_chain():
    return nn.Chain(nn.Dense(3, 3, tg.tanh, dtype="float64"), nn.Dense(3, 2, dtype="float64"))


def _seeded(make):
    return lambda: make(np.random.default_rng(3))


F64 = {"dtype": "float64"}
LAYERS = {  # name -> (make the layer from a generator, make an input)
    "Dense": (lambda r: nn.Dense(3, 2, nn.relu, rng=r, **F64), lambda: floats(4, 3)),
    "Chain": (
        lambda r: nn.Chain(nn.Dense(3, 3, nn.elu, rng=r, **F64), nn.Dense(3, 2, rng=r, **F64)),
        lambda: floats(4, 3),
    ),
    "Conv": (
        lambda r: nn.Conv((2, 2), 2, 3, nn.leakyrelu, rng=r, **F64),
        lambda: floats(2, 2, 4, 4),
    ),
    "ConvTranspose": (
        lambda r: nn.ConvTranspose((2, 2), 2, 3, rng=r, **F64),
        lambda: floats(2, 2, 3, 3),
    ),
    "MaxPool": (lambda r: nn.MaxPool(2), lambda: floats(2, 2, 4, 4)),
    "MeanPool": (lambda r: nn.MeanPool(2), lambda: floats(2, 2, 4, 4)),
    "AdaptiveMaxPool": (lambda r: nn.AdaptiveMaxPool((2, 3)), lambda: floats(2, 2, 5, 4)),
    "AdaptiveMeanPool": (lambda r: nn.AdaptiveMeanPool((3,)), lambda: floats(2, 2, 7)),
    "GlobalMaxPool": (lambda r: nn.GlobalMaxPool(), lambda: floats(2, 2, 3, 2, 2)),
    "GlobalMeanPool": (lambda r: nn.GlobalMeanPool(), lambda: floats(2, 2, 5)),
    "Flatten": (lambda r: nn.Flatten(), lambda: floats(2, 2, 3)),
    "Dropout": (lambda r: nn.Dropout(0.0), lambda: floats(4, 3)),
    "Embedding": (lambda r: nn.Embedding(5, 2, rng=r, **F64), lambda: RNG.integers(0, 5, (4,))),
    "LayerNorm": (lambda r: nn.LayerNorm(3, **F64), lambda: floats(4, 3)),
    "GroupNorm": (lambda r: nn.GroupNorm(4, 2, **F64), lambda: floats(2, 4, 3)),
    "BatchNorm": (lambda r: nn.BatchNorm(3, **F64), lambda: floats(4, 3)),
    "InstanceNorm": (
        lambda r: nn.InstanceNorm(3, affine=True, track_stats=True, **F64),
        lambda: floats(2, 3, 4),
    ),
    "RNNCell": (lambda r: nn.RNNCell(3, 2, rng=r, **F64), lambda: floats(4, 3)),
    "LSTMCell": (lambda r: nn.LSTMCell(3, 2, rng=r, **F64), lambda: floats(4, 3)),
    "GRUCell": (lambda r: nn.GRUCell(3, 2, rng=r, **F64), lambda: floats(4, 3)),
    "Recurrence": (  # the options: two layers, both directions, time-major, PyTorch's biases
        lambda r: nn.Recurrence(
            *[nn.GRUCell(n, 2, bias_h=True, rng=r, **F64) for n in (3, 3, 4, 4)],
            bidirectional=True,
            batch_first=False,
        ),
        lambda: floats(3, 2, 3),
    ),
    "RNN": (lambda r: nn.RNN(3, 2, rng=r, **F64), lambda: floats(2, 3, 3)),
    "LSTM": (lambda r: nn.LSTM(3, 2, rng=r, **F64), lambda: floats(2, 3, 3)),
    "GRU": (lambda r: nn.GRU(3, 2, rng=r, **F64), lambda: floats(2, 3, 3)),
    "MultiHeadAttention": (
        lambda r: nn.MultiHeadAttention(4, 2, causal=True, rng=r, **F64),
        lambda: floats(2, 3, 4),
    ),
    "TransformerBlock": (
        lambda r: nn.TransformerBlock(4, 2, hidden=6, causal=True, rng=r, **F64),
        lambda: floats(2, 3, 4),
    ),
}


def total(y):
    return sum(tg.sum(leaf * leaf) for leaf in leaves(y))
