"""tg.compile against eager, call by call (issue 28): for each of the library's functions that
computes from a traced array's value, a compiled function gives on every replay what the same
call gives eagerly (values and gradients), or its recording is refused with a RecordingError
naming the call; never a value frozen at the recording."""

import dataclasses

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.nn import layers as nn_layers

RNG = np.random.default_rng(28)
CALLS = 3


def _equal(a, b):
    """Bit for bit, else to 1e-12 relative; nested structures (gradients of a layer)."""
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        x, y = np.asarray(tg.data(x)), np.asarray(tg.data(y))
        assert x.shape == y.shape
        if not np.array_equal(x, y, equal_nan=True):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=0)


def _leaves(tree):
    if tree is None or isinstance(tree, (int, float, bool, str)) or callable(tree):
        if not dataclasses.is_dataclass(tree):
            return []
    if isinstance(tree, (list, tuple)):
        return [leaf for t in tree for leaf in _leaves(t)]
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in _leaves(tree[k])]
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return [leaf for f in dataclasses.fields(tree) for leaf in _leaves(getattr(tree, f.name))]
    if isinstance(tree, (np.ndarray, tg.TrackedArray)):
        return [tree]
    return []


def _differential(f, inputs, name, **compile_kw):
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
        _equal(eager[0], compiled[0])
        _equal(eager[1], compiled[1])
    return "replayed"


def _floats(*shape):
    return RNG.standard_normal(shape)


# --- the table of issue 28: each call inside a compiled function
def _negative_det_matrix():
    a = _floats(3, 3) + 3 * np.eye(3)
    a[0] *= -1 if RNG.random() < 0.5 else 1
    return a


TABLE = {
    "leakyrelu": (lambda x: tg.sum(nn.leakyrelu(x, 0.2) * x), lambda: (_floats(5),)),
    "elu": (lambda x: tg.sum(nn.elu(x) * x), lambda: (_floats(5),)),
    "selu": (lambda x: tg.sum(nn.selu(x) * x), lambda: (_floats(5),)),
    "celu": (lambda x: tg.sum(nn.celu(x, 0.5) * x), lambda: (_floats(5),)),
    "stop_gradient": (
        lambda x: tg.max(tg.stop_gradient(x) * 3.0) * tg.sum(x),
        lambda: (_floats(6),),
    ),
    "notrack": (lambda x: _with_notrack(x), lambda: (_floats(4),)),
    "slogdet": (
        lambda a: tg.linalg.slogdet(a).sign * tg.linalg.slogdet(a).logabsdet,
        lambda: (_negative_det_matrix(),),
    ),
    "logdet": (
        lambda a: tg.sum(tg.where(tg.isnan(tg.logdet(a)), 0.0, tg.logdet(a))) + tg.sum(a),
        lambda: (_negative_det_matrix(),),
    ),
    "matrix_rank": (
        lambda a: tg.sum(a) * tg.astype(tg.linalg.matrix_rank(a), a.dtype),
        lambda: (_floats(3, 3) * (RNG.random(3) < 0.5),),
    ),
    "full": (
        lambda x: tg.sum(tg.full((3,), tg.sum(x), dtype=x.dtype) * x),
        lambda: (_floats(3),),
    ),
    "forward": (lambda x: _with_forward(x), lambda: (_floats(3),)),
}


def _with_notrack(x):
    with tg.notrack():
        c = tg.sum(x * x)
    return tg.sum(x) * c


def _with_forward(x):
    y, _ = tg.forward(lambda v: v * v, x)
    return tg.sum(x * (y * 2.0 + 1.0))


@pytest.mark.parametrize("name", sorted(TABLE))
def test_table_call(name):
    f, make = TABLE[name]
    _differential(f, [make() for _ in range(CALLS)], name)


# --- layers
def test_embedding_indices():
    layer = nn.Embedding(7, 3, rng=np.random.default_rng(1), dtype="float64")
    f = lambda m, i: tg.sum(m(i) ** 2 * tg.arange(3, dtype=tg.float64))
    inputs = [(layer, RNG.integers(0, 7, size=(4,))) for _ in range(CALLS)]
    _differential(f, inputs, "Embedding")


def test_batchnorm_eval_reads_running_statistics():
    layer = nn.BatchNorm(3, active=False, dtype="float64")
    f = lambda m, x: tg.sum(m(x) * x)
    step = tg.compile(f)
    for k in range(CALLS):
        layer.running_var[...] = RNG.random(3) + 0.5 + k
        layer.running_mean[...] = RNG.standard_normal(3)
        x = _floats(4, 3)
        eager = tg.withgradient(f, layer, x)
        compiled = step(layer, x)
        _equal(eager[0], compiled[0])
        _equal(eager[1], compiled[1])


def test_attention_causal_with_mask():
    layer = nn.MultiHeadAttention(4, 2, causal=True, rng=np.random.default_rng(2), dtype="float64")
    f = lambda m, x, mask: tg.sum(m(x, mask=mask)[0] ** 2)
    inputs = [(layer, _floats(2, 3, 4), (RNG.random((3, 3)) < 0.7) | np.eye(3, dtype=bool))
              for _ in range(CALLS)]  # fmt: skip
    _differential(f, inputs, "MultiHeadAttention", wrt=(0, 1))


# --- every layer class of nn, train and eval mode: built from a small table of inputs
def _layer_classes():
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
    "Dense": (lambda r: nn.Dense(3, 2, nn.relu, rng=r, **F64), lambda: _floats(4, 3)),
    "Chain": (
        lambda r: nn.Chain(nn.Dense(3, 3, nn.elu, rng=r, **F64), nn.Dense(3, 2, rng=r, **F64)),
        lambda: _floats(4, 3),
    ),
    "Conv": (
        lambda r: nn.Conv((2, 2), 2, 3, nn.leakyrelu, rng=r, **F64),
        lambda: _floats(2, 2, 4, 4),
    ),
    "ConvTranspose": (
        lambda r: nn.ConvTranspose((2, 2), 2, 3, rng=r, **F64),
        lambda: _floats(2, 2, 3, 3),
    ),
    "MaxPool": (lambda r: nn.MaxPool(2), lambda: _floats(2, 2, 4, 4)),
    "MeanPool": (lambda r: nn.MeanPool(2), lambda: _floats(2, 2, 4, 4)),
    "Flatten": (lambda r: nn.Flatten(), lambda: _floats(2, 2, 3)),
    "Dropout": (lambda r: nn.Dropout(0.0), lambda: _floats(4, 3)),
    "Embedding": (lambda r: nn.Embedding(5, 2, rng=r, **F64), lambda: RNG.integers(0, 5, (4,))),
    "LayerNorm": (lambda r: nn.LayerNorm(3, **F64), lambda: _floats(4, 3)),
    "GroupNorm": (lambda r: nn.GroupNorm(4, 2, **F64), lambda: _floats(2, 4, 3)),
    "BatchNorm": (lambda r: nn.BatchNorm(3, **F64), lambda: _floats(4, 3)),
    "RNNCell": (lambda r: nn.RNNCell(3, 2, rng=r, **F64), lambda: _floats(4, 3)),
    "LSTMCell": (lambda r: nn.LSTMCell(3, 2, rng=r, **F64), lambda: _floats(4, 3)),
    "GRUCell": (lambda r: nn.GRUCell(3, 2, rng=r, **F64), lambda: _floats(4, 3)),
    "Recurrence": (
        lambda r: nn.Recurrence(nn.RNNCell(3, 2, rng=r, **F64)),
        lambda: _floats(2, 3, 3),
    ),
    "RNN": (lambda r: nn.RNN(3, 2, rng=r, **F64), lambda: _floats(2, 3, 3)),
    "LSTM": (lambda r: nn.LSTM(3, 2, rng=r, **F64), lambda: _floats(2, 3, 3)),
    "GRU": (lambda r: nn.GRU(3, 2, rng=r, **F64), lambda: _floats(2, 3, 3)),
    "MultiHeadAttention": (
        lambda r: nn.MultiHeadAttention(4, 2, causal=True, rng=r, **F64),
        lambda: _floats(2, 3, 4),
    ),
    "TransformerBlock": (
        lambda r: nn.TransformerBlock(4, 2, hidden=6, causal=True, rng=r, **F64),
        lambda: _floats(2, 3, 4),
    ),
}


def _total(y):
    return sum(tg.sum(leaf * leaf) for leaf in _leaves(y))


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", _layer_classes())
def test_every_layer(name, mode):
    assert name in LAYERS, f"nn.{name} has no entry in LAYERS: add how to build it and its input"
    make, make_input = LAYERS[name]
    layer = make(np.random.default_rng(3))
    layer = nn.trainmode(layer) if mode == "train" else nn.testmode(layer)
    f = lambda m, x: _total(m(x))
    inputs = []
    for _ in range(CALLS):
        for field in ("running_mean", "running_var"):  # eval mode reads them: change them
            if getattr(layer, field, None) is not None:
                layer = dataclasses.replace(layer, **{field: RNG.random(3) + 0.5})
        inputs.append((layer, make_input()))
    _differential(f, inputs, name, wrt=(0,) if name == "Embedding" else None)


# --- second-order passes recorded (nest=True): the pullbacks' masks are traced, not frozen
NESTED = {
    "relu": lambda x: tg.sum(nn.relu(x) * x),
    "maximum": lambda x: tg.sum(tg.maximum(x, 0.1) * x),
    "minimum": lambda x: tg.sum(tg.minimum(x, -0.1) * x),
    "abs": lambda x: tg.sum(tg.abs(x) * x),
    "clip": lambda x: tg.sum(tg.clip(x, -0.5, 0.5) * x),
    "pow": lambda x: tg.sum(tg.abs(x) ** x),
    "max": lambda x: tg.sum(tg.max(x * x, axis=0)) * tg.sum(x),
    "vector_norm": lambda x: tg.linalg.vector_norm(x * (x > 0), ord=3) * tg.sum(x),
}


@pytest.mark.parametrize("name", sorted(NESTED))
def test_nested_pullback(name):
    inner = NESTED[name]
    f = lambda x: tg.sum(tg.gradient(inner, x, nest=True)[0] ** 2)
    _differential(f, [(_floats(4, 3),) for _ in range(CALLS)], name)


# --- conversions of a traced array while recording: refused, naming the call
@pytest.mark.parametrize(
    "convert, name",
    [
        (lambda x: np.asarray(x), "__array__"),
        (lambda x: np.from_dlpack(x), "__dlpack__"),
    ],
)
def test_conversion_refused(convert, name):
    f = lambda x: tg.sum(x) * float(np.sum(convert(x)))
    with pytest.raises(tg.RecordingError, match=name):
        tg.compile(f)(_floats(3))


def test_full_like_traced_fill():
    f = lambda x: tg.sum(tg.full_like(x, tg.max(x)) * x)
    _differential(f, [(_floats(3),) for _ in range(CALLS)], "full_like")


def test_pinv_traced_rtol_refused():
    f = lambda a, r: tg.sum(tg.linalg.pinv(a, rtol=r))
    with pytest.raises(tg.RecordingError, match="pinv"):
        tg.compile(f, wrt=(0,))(_floats(3, 3), np.asarray(0.1))


@pytest.mark.parametrize(
    "name, inner",
    [
        ("getitem", lambda x, i: tg.sum(x[i] ** 3)),
        ("take", lambda x, i: tg.sum(tg.take(x, i) ** 3)),
    ],
)
def test_nested_pullback_traced_indices(name, inner):
    f = lambda x, i: tg.sum(tg.gradient(lambda v: inner(v, i), x, nest=True)[0] ** 2)
    inputs = [(_floats(6), RNG.integers(0, 3, 4)) for _ in range(CALLS)]
    _differential(f, inputs, name, wrt=(0,))
