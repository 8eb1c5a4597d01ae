"""Norms, embeddings and attention against PyTorch with the same weights, in float64 (issue 30):
InstanceNorm (1-d to 3-d, affine or not, running statistics or not, both modes), BatchNorm's
cumulative average (`momentum=None`), LayerNorm without bias, Embedding's `padding_idx` and
`max_norm`, attention with other key and value sizes, head-averaged weights and dropout on the
weights, and the post-norm TransformerBlock: forward, input gradients and every parameter
gradient, on every backend. Then, on NumPy, what every layer must keep doing: `tg.compile` of
a training step bit for bit eager (running statistics and count written back), save and load,
pickling and placement."""

import copy
import dataclasses
import math
import pickle

import numpy as np
import pytest
from helpers import numpy_of, uniform

import tracker_gpu as tg
from tests.compiling import equal, leaves
from tracker_gpu import nn

torch = pytest.importorskip("torch", reason="PyTorch is the reference: pip install torch")
F = torch.nn.functional
F64 = {"dtype": "float64"}
CALLS = 3


def placed(backend):
    return dict(xp=backend.xp, device=backend.device, dtype="float64")


def rng(seed=0):
    return np.random.default_rng(seed)


def randomised(backend, layer, seed=5):
    """`layer` with every trainable array drawn at random (LayerNorm's ones, zero biases)."""

    def draw(path, x):
        if tg.backend.is_array(x) and not _statistic(path):
            return backend.asarray(uniform(tuple(x.shape), (-1, 1), seed + len(path)))
        return x

    return tg.optim.tree_map_with_path(draw, layer)


def _statistic(path):
    return "running" in path or path.endswith("count")


def against_torch(backend, model, inputs, reference, *, call=None, names=None, atol=1e-10):
    """`call(model, *inputs)` (a tuple of arrays; `model(*inputs)` by default) and the gradient
    of a weighted sum of it, with respect to every trainable array of `model` and every
    floating input, against `reference(params, *tensors)`, PyTorch on the same values; `names`
    maps our paths to the names `reference` reads. Returns our outputs, in NumPy."""
    call = call or (lambda m, *xs: (m(*xs),))
    params = {p: a for p, a in nn._parameters(model).items() if not _statistic(p)}
    tensors = {p: torch.tensor(numpy_of(backend, a), requires_grad=True) for p, a in params.items()}
    floating = [np.issubdtype(x.dtype, np.floating) for x in inputs]
    xs = [torch.tensor(x, requires_grad=f) for x, f in zip(inputs, floating)]
    expected = reference({(names or {}).get(p, p): t for p, t in tensors.items()}, *xs)
    weights = [uniform(tuple(e.shape), (0.5, 1.5), seed=9 + i) for i, e in enumerate(expected)]
    sum((e * torch.tensor(w)).sum() for e, w in zip(expected, weights)).backward()
    ws = [backend.asarray(w) for w in weights]

    def loss(m, *xs):
        ys = call(m, *xs)
        return sum(tg.sum(y * w) for y, w in zip(ys, ws)), [tg.data(y) for y in ys]

    wrt = (0,) + tuple(i + 1 for i, f in enumerate(floating) if f)
    args = [backend.asarray(x) for x in inputs]
    (_, ys), (g_model, *g_xs) = tg.withgradient(loss, model, *args, wrt=wrt)
    ours = [numpy_of(backend, y) for y in ys]
    for y, e in zip(ours, expected):
        np.testing.assert_allclose(y, e.detach().numpy(), atol=atol, rtol=0, err_msg="forward")
    for g, x in zip(g_xs, [x for x, f in zip(xs, floating) if f]):
        np.testing.assert_allclose(numpy_of(backend, g), x.grad.numpy(), atol=atol, rtol=0)
    grads = nn._parameters(g_model)
    assert set(grads) == {p for p, t in tensors.items() if t.grad is not None}
    for path, g in grads.items():
        np.testing.assert_allclose(
            numpy_of(backend, g), tensors[path].grad.numpy(), atol=atol, rtol=0, err_msg=path
        )
    return ours


def _set_statistics(backend, layer, module, seed):
    """Random running statistics, the same in `layer` (returned) and PyTorch's `module`."""
    mean, var = (
        uniform((layer.channels,), (-1, 1), seed),
        uniform((layer.channels,), (0.5, 2), seed + 1),
    )
    module.running_mean.copy_(torch.tensor(mean))
    module.running_var.copy_(torch.tensor(var))
    return dataclasses.replace(
        layer, running_mean=backend.asarray(mean), running_var=backend.asarray(var)
    )


def _statistics_agree(backend, layer, module):
    for ours, theirs in (
        (layer.running_mean, module.running_mean),
        (layer.running_var, module.running_var),
    ):
        np.testing.assert_allclose(numpy_of(backend, ours), theirs.numpy(), atol=1e-12, rtol=0)


NORM_NAMES = {"scale": "weight", "bias": "bias"}


def _module_reference(module):
    return lambda p, x: (torch.func.functional_call(module, p, (x,)),)


# --- InstanceNorm
INSTANCE = [(affine, track) for affine in (False, True) for track in (False, True)]


@pytest.mark.parametrize("affine, track_stats", INSTANCE, ids=lambda v: str(v))
@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_instancenorm(backend, spatial, affine, track_stats):
    kind = getattr(torch.nn, f"InstanceNorm{spatial}d")
    module = kind(3, affine=affine, track_running_stats=track_stats, momentum=0.2).double()
    layer = nn.InstanceNorm(
        3, affine=affine, track_stats=track_stats, momentum=0.2, **placed(backend)
    )
    layer = randomised(backend, layer)
    shape = (2, 3) + (5, 4, 3)[:spatial]
    for call in range(2):  # training (inside gradient): the sample's statistics, updated
        x = uniform(shape, (-2, 2), call)
        against_torch(backend, layer, [x], _module_reference(module), names=NORM_NAMES)
        if track_stats:
            _statistics_agree(backend, layer, module)
    module.eval()
    if track_stats:
        layer = _set_statistics(backend, layer, module, 3)
    against_torch(backend, nn.testmode(layer), [uniform(shape, (-2, 2), 7)],
                  _module_reference(module), names=NORM_NAMES)  # fmt: skip


def test_instancenorm_repr_and_refusals():
    assert repr(nn.InstanceNorm(4)) == "InstanceNorm(4)"
    assert repr(nn.InstanceNorm(4, nn.relu, affine=True, track_stats=True)) == (
        "InstanceNorm(4, relu, affine=True, track_stats=True)"
    )
    with pytest.raises(ValueError, match="momentum=None .* BatchNorm's only"):
        nn.InstanceNorm(3, momentum=None)
    with pytest.raises(ValueError, match=r"expects \(batch, 3, positions...\)"):
        nn.InstanceNorm(3)(np.ones((4, 3)))
    with pytest.raises(ValueError, match="more than one position per channel"):
        nn.trainmode(nn.InstanceNorm(3, track_stats=True))(np.ones((4, 3, 1)))


# --- BatchNorm's cumulative average
@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 2, 3)], ids=["dense", "images"])
def test_batchnorm_cumulative_average(backend, shape):
    module = torch.nn.BatchNorm2d(3, momentum=None).double() if len(shape) == 4 else None
    module = module or torch.nn.BatchNorm1d(3, momentum=None).double()
    layer = randomised(backend, nn.BatchNorm(3, nn.relu, momentum=None, **placed(backend)))
    reference = lambda p, x: (torch.relu(torch.func.functional_call(module, p, (x,))),)
    for call in range(4):
        x = uniform(shape, (-2, 2), call) + call  # batches of other means: the average matters
        against_torch(backend, layer, [x], reference, names=NORM_NAMES)
        _statistics_agree(backend, layer, module)
        assert numpy_of(backend, layer.count) == module.num_batches_tracked.item() == call + 1
    module.eval()
    reference_eval = lambda p, x: (torch.relu(torch.func.functional_call(module, p, (x,))),)
    against_torch(backend, nn.testmode(layer), [uniform(shape, (-2, 2), 9)], reference_eval,
                  names=NORM_NAMES)  # fmt: skip
    assert repr(layer) == "BatchNorm(3, relu, momentum=None)"
    assert (
        nn.BatchNorm(3).count is None
        and nn.BatchNorm(3, momentum=None, track_stats=False).count is None
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_batchnorm_counts_on_past_what_a_half_dtype_holds(dtype):
    """The count is an integer: in float16 (or bfloat16) 3000 + 1 would round back to 3000,
    and the running statistics would stop following the batches. PyTorch's reference: the
    same update with its int64 count."""
    layer = nn.trainmode(nn.BatchNorm(1, momentum=None, dtype=dtype))
    layer = dataclasses.replace(layer, count=np.full_like(layer.count, 3000))  # as it made it
    x = np.array([[999.0], [1001.0]])
    layer(x.astype(layer.scale.dtype))
    module = torch.nn.BatchNorm1d(1, momentum=None).double().train()
    module.num_batches_tracked.fill_(3000)
    module(torch.from_numpy(x))
    assert layer.count.dtype == np.int64 and int(layer.count) == 3001
    expected = module.running_mean.numpy().astype(layer.running_mean.dtype)
    assert np.array_equal(layer.running_mean, expected) and float(expected[0]) > 0


# --- LayerNorm without bias
def test_layernorm_without_bias(backend):
    layer = randomised(backend, nn.LayerNorm((3, 4), bias=False, **placed(backend)))
    assert layer.bias is None and repr(layer) == "LayerNorm((3, 4), bias=False)"
    module = torch.nn.LayerNorm((3, 4), bias=False).double()
    against_torch(backend, layer, [uniform((2, 3, 4), (-2, 2), 1)], _module_reference(module),
                  names={"scale": "weight"})  # fmt: skip
    assert dataclasses.replace(layer, eps=1e-3).bias is None  # as the constructor rebuilds it


# --- Embedding: padding_idx, max_norm
EMBEDDING = [
    dict(padding_idx=2),
    dict(padding_idx=-1),
    dict(max_norm=1.5),
    dict(max_norm=2.0, norm_type=1.0),
    dict(padding_idx=0, max_norm=1.0, norm_type=3.0),
]


@pytest.mark.parametrize("options", EMBEDDING, ids=str)
def test_embedding_options(backend, options):
    weight = uniform((6, 4), (-1.5, 1.5), 1)
    layer = nn.Embedding(weight=backend.asarray(weight), **options)
    indices = np.array([[0, 2, 5, 2], [5, 1, 0, 3]])  # repeated rows, the padding row too
    theirs = torch.tensor(weight, requires_grad=True)
    reference = lambda p, i: (F.embedding(i, p["weight"], **options),)
    ours = against_torch(backend, layer, [indices], reference)
    F.embedding(torch.tensor(indices), theirs, **options)  # PyTorch renormalises in place...
    if "max_norm" in options:
        assert not np.allclose(theirs.detach().numpy(), weight)  # (some rows were too long)
    assert np.array_equal(numpy_of(backend, layer.weight), weight)  # ... ours never writes
    onehot = np.eye(6)[indices]  # one-hot rows: every row of the table looked up
    table = lambda w: F.embedding(torch.arange(6), w, **options)
    against_torch(backend, layer, [onehot], lambda p, o: (o @ table(p["weight"]),))
    np.testing.assert_allclose(
        ours[0], numpy_of(backend, layer(backend.asarray(onehot))), atol=1e-12, rtol=0
    )


def test_embedding_padding_row_drawn_as_zeros_and_refusals():
    for padding_idx in (1, -2):
        drawn = nn.Embedding(4, 3, padding_idx=padding_idx, rng=rng())
        module = torch.nn.Embedding(4, 3, padding_idx=padding_idx)
        assert drawn.padding_idx == module.padding_idx  # PyTorch's row, a negative one too
        assert not drawn.weight[drawn.padding_idx].any()
        assert not module.weight[module.padding_idx].detach().numpy().any()
        assert np.count_nonzero(drawn.weight) == np.count_nonzero(module.weight.detach()) == 9
    given = np.ones((4, 3))
    assert nn.Embedding(weight=given, padding_idx=1).weight is given  # a given table: as it is
    assert repr(nn.Embedding(4, 3, max_norm=1.0, norm_type=1.0)) == (
        "Embedding(4 => 3, max_norm=1.0, norm_type=1.0)"
    )
    with pytest.raises(ValueError, match=r"padding_idx must be an int in \[-4, 3\]"):
        nn.Embedding(4, 3, padding_idx=4)
    with pytest.raises(ValueError, match="max_norm must be a positive number"):
        nn.Embedding(4, 3, max_norm=0.0)


# --- attention
def _torch_mha(dim, nheads, bias, kdim, vdim, dropout=0.0):
    module = torch.nn.MultiheadAttention(
        dim, nheads, dropout=dropout, bias=bias, kdim=kdim, vdim=vdim, batch_first=True
    ).double()

    def params(p):
        out = {"out_proj.weight": p["out_proj.weight"]}
        if kdim == vdim == dim:
            out["in_proj_weight"] = torch.cat([p[f"{n}_proj.weight"] for n in "qkv"])
        else:
            out.update({f"{n}_proj_weight": p[f"{n}_proj.weight"] for n in "qkv"})
        if bias:
            out["in_proj_bias"] = torch.cat([p[f"{n}_proj.bias"] for n in "qkv"])
            out["out_proj.bias"] = p["out_proj.bias"]
        return out

    return module, params


ATTENTION = [
    dict(kdim=8, vdim=8, bias=False, average=False, masked=False),
    dict(kdim=3, vdim=5, bias=True, average=False, masked=True),
    dict(kdim=3, vdim=3, bias=False, average=True, masked=False),
    dict(kdim=8, vdim=5, bias=True, average=True, masked=True),
]


@pytest.mark.parametrize("config", ATTENTION, ids=str)
def test_attention_key_value_sizes_and_averaged_weights(backend, config):
    kdim, vdim, bias, average = config["kdim"], config["vdim"], config["bias"], config["average"]
    layer = nn.MultiHeadAttention(
        8, 2, bias=bias, kdim=kdim, vdim=vdim, rng=rng(), **placed(backend)
    )
    layer = randomised(backend, layer)
    inputs = [uniform((2, 4, 8), (-1, 1), 1), uniform((2, 5, kdim), (-1, 1), 2),
              uniform((2, 5, vdim), (-1, 1), 3)]  # fmt: skip
    allowed = (rng(4).random((4, 5)) < 0.7) | np.eye(4, 5, dtype=bool) if config["masked"] else None
    module, params = _torch_mha(8, 2, bias, kdim, vdim)
    torch_mask = None if allowed is None else torch.tensor(~allowed)  # PyTorch's True: masked

    def reference(p, q, k, v):
        kw = dict(attn_mask=torch_mask, average_attn_weights=average)
        return torch.func.functional_call(module, params(p), (q, k, v), kw)

    mask = None if allowed is None else backend.asarray(allowed)
    call = lambda m, q, k, v: m(q, k, v, mask=mask, average_attn_weights=average)
    y, scores = against_torch(backend, layer, inputs, reference, call=call)
    assert scores.shape == ((2, 4, 5) if average else (2, 2, 4, 5))


def _attention_by_hand(p, q, k, v, nheads, keep, drop):
    """PyTorch's attention written out, its weights multiplied by `keep / (1 - drop)`."""
    project = lambda x, n: x @ p[f"{n}_proj.weight"].T + p[f"{n}_proj.bias"]
    b, lq, dim = q.shape
    heads = lambda t: t.reshape(b, t.shape[1], nheads, dim // nheads).transpose(1, 2)
    query, key, value = heads(project(q, "q")), heads(project(k, "k")), heads(project(v, "v"))
    weights = torch.softmax(query @ key.transpose(-1, -2) / math.sqrt(dim // nheads), dim=-1)
    weights = weights * torch.tensor(keep) / (1 - drop)
    joined = (weights @ value).transpose(1, 2).reshape(b, lq, dim)
    return project(joined, "out"), weights


def test_attention_dropout_draws_from_the_layers_generator(backend):
    layer = nn.MultiHeadAttention(
        8, 2, bias=True, kdim=3, dropout_prob=0.3, rng=rng(), **placed(backend)
    )
    layer = randomised(backend, layer)
    inputs = [
        uniform((2, 4, 8), (-1, 1), 1),
        uniform((2, 5, 3), (-1, 1), 2),
        uniform((2, 5, 8), (-1, 1), 3),
    ]
    module, params = _torch_mha(8, 2, True, 3, 8)
    no_drop = np.ones((2, 2, 4, 5))  # the hand-written reference is PyTorch's own without dropout
    p, tensors = _torch_params(backend, layer), tuple(map(torch.tensor, inputs))
    by_hand = _attention_by_hand(p, *tensors, 2, no_drop, 0.0)
    kw = dict(average_attn_weights=False)
    by_module = torch.func.functional_call(module, params(p), tensors, kw)
    for got, expected in zip(by_hand, by_module):
        np.testing.assert_allclose(got.detach().numpy(), expected.detach().numpy(), atol=1e-12)
    keep = copy.deepcopy(layer.attn_drop.rng).random((2, 2, 4, 5)) >= 0.3  # the draw to come
    assert 0 < keep.sum() < keep.size
    reference = lambda p, q, k, v: _attention_by_hand(p, q, k, v, 2, keep, 0.3)
    against_torch(backend, layer, inputs, reference, call=lambda m, q, k, v: m(q, k, v))
    module.eval()  # test mode: no dropout, PyTorch's module in eval mode
    reference = lambda p, q, k, v: torch.func.functional_call(
        module, params(p), (q, k, v), dict(average_attn_weights=False)
    )
    against_torch(
        backend, nn.testmode(layer), inputs, reference, call=lambda m, q, k, v: m(q, k, v)
    )


def _torch_params(backend, layer):
    return {p: torch.tensor(numpy_of(backend, a)) for p, a in nn._parameters(layer).items()}


def test_attention_dropout_statistics():
    layer = nn.MultiHeadAttention(8, 2, dropout_prob=0.4, rng=rng(), **F64)
    x = uniform((8, 16, 8), (-1, 1), 1)
    _, plain = layer(x)  # plain input: no dropout
    _, dropped = nn.trainmode(layer)(x)
    zero = dropped == 0
    assert abs(zero.mean() - 0.4) < 0.03  # 4096 draws: 4 standard deviations
    np.testing.assert_allclose(dropped[~zero], plain[~zero] / 0.6, rtol=1e-12)
    np.testing.assert_allclose(plain.sum(axis=-1), 1.0, rtol=1e-12)
    assert repr(layer) == "MultiHeadAttention(8, nheads=2, dropout_prob=0.4)"
    with pytest.raises(ValueError, match=r"expects \(batch, length, 3\)"):
        nn.MultiHeadAttention(8, 2, kdim=3)(x)  # keys of the wrong size


# --- the post-norm transformer block
BLOCK_NAMES = {
    "norm1.scale": "norm1.weight",
    "norm2.scale": "norm2.weight",
    "mlp.layers.0.weight": "linear1.weight",
    "mlp.layers.0.bias": "linear1.bias",
    "mlp.layers.1.weight": "linear2.weight",
    "mlp.layers.1.bias": "linear2.bias",
}


@pytest.mark.parametrize("causal", [False, True])
def test_post_norm_transformer_block(backend, causal):
    block = nn.TransformerBlock(
        8, 2, hidden=12, causal=causal, norm_first=False, rng=rng(), **placed(backend)
    )
    block = randomised(backend, block)
    gelu = lambda x: F.gelu(x, approximate="tanh")
    module = torch.nn.TransformerEncoderLayer(
        8, 2, 12, dropout=0.0, activation=gelu, batch_first=True, norm_first=False
    ).double()
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    _, attention_params = _torch_mha(8, 2, True, 8, 8)

    def reference(p, x):
        params = {k: v for k, v in p.items() if not k.startswith("attention.")}
        inner = {
            k.removeprefix("attention."): v for k, v in p.items() if k.startswith("attention.")
        }
        params.update({f"self_attn.{k}": v for k, v in attention_params(inner).items()})
        kw = dict(src_mask=mask, is_causal=True) if causal else {}
        return (torch.func.functional_call(module, params, (x,), kw),)

    against_torch(backend, block, [uniform((2, 5, 8), (-1, 1), 1)], reference, names=BLOCK_NAMES)


# --- what every layer keeps doing: compile, save and load, pickling, placement (NumPy)
def _floats(*shape):
    return lambda r: (r.standard_normal(shape),)


def _attention_inputs(r):
    return r.standard_normal((2, 3, 4)), r.standard_normal((2, 5, 3)), r.standard_normal((2, 5, 2))


NEW = {  # name -> (make the layer, make its inputs from a generator, wrt)
    "BatchNorm(momentum=None)": (
        lambda: nn.BatchNorm(3, momentum=None, **F64),
        _floats(4, 3, 2),
        None,
    ),
    "InstanceNorm": (
        lambda: nn.InstanceNorm(3, affine=True, track_stats=True, **F64),
        _floats(2, 3, 5),
        None,
    ),
    "LayerNorm(bias=False)": (lambda: nn.LayerNorm(3, bias=False, **F64), _floats(4, 3), None),
    "Embedding(padding_idx, max_norm)": (
        lambda: nn.Embedding(6, 3, padding_idx=2, max_norm=1.0, rng=rng(1), **F64),
        lambda r: (r.integers(0, 6, (7,)),),
        (0,),
    ),
    "MultiHeadAttention(kdim, vdim, dropout)": (
        lambda: nn.MultiHeadAttention(4, 2, kdim=3, vdim=2, dropout_prob=0.3, rng=rng(2), **F64),
        _attention_inputs,
        None,
    ),
    "TransformerBlock(norm_first=False)": (
        lambda: nn.TransformerBlock(
            4, 2, hidden=6, norm_first=False, dropout=0.2, rng=rng(3), **F64
        ),
        _floats(2, 3, 4),
        None,
    ),
}


def _total(m, *xs):
    y = m(*xs)
    return sum(tg.sum(leaf * leaf) for leaf in leaves(y))


@pytest.mark.parametrize("mode", ["train", "auto"])
@pytest.mark.parametrize("name", list(NEW))
def test_compiled_training_step_is_eager_bit_for_bit(name, mode):
    make, make_inputs, wrt = NEW[name]
    eager = nn.trainmode(make()) if mode == "train" else make()
    compiled = copy.deepcopy(eager)
    step = tg.compile(_total, wrt=wrt)
    draws = rng(11)
    for _ in range(CALLS):
        inputs = make_inputs(draws)
        expected = tg.withgradient(_total, eager, *inputs, wrt=wrt)
        got = step(compiled, *inputs)
        for a, b in zip(leaves(expected), leaves(got)):
            assert np.array_equal(np.asarray(tg.data(a)), np.asarray(tg.data(b)))
        equal(eager, compiled)  # the running statistics and count written back by the replay
    if name.startswith("BatchNorm"):
        assert eager.count == compiled.count == CALLS


def _trained(name):
    make, make_inputs, wrt = NEW[name]
    layer = make()
    tg.withgradient(_total, layer, *make_inputs(rng(12)), wrt=wrt)  # running statistics move
    return layer


def _outputs(model, draws_seed=13, like=None):
    out = {}
    for name, layer in model.items():
        inputs = NEW[name][1](rng(draws_seed))
        if like is not None:
            inputs = tuple(like(x) for x in inputs)
        out[name] = [
            np.asarray(nn.to_numpy(tg.data(y))) for y in leaves(nn.testmode(layer)(*inputs))
        ]
    return out


def _same_outputs(a, b, atol=0):
    for name in a:
        for x, y in zip(a[name], b[name]):
            np.testing.assert_allclose(x, y, atol=atol, rtol=0, err_msg=name)


def test_save_load_pickle_and_place(tmp_path):
    model = {name: _trained(name) for name in NEW}
    assert model["BatchNorm(momentum=None)"].count == 1
    path = tmp_path / "model.npz"
    nn.save(path, model)
    fresh = {name: NEW[name][0]() for name in NEW}
    loaded = nn.load(path, fresh)
    assert loaded["BatchNorm(momentum=None)"].count == 1
    expected = _outputs(model)
    _same_outputs(expected, _outputs(loaded))
    _same_outputs(expected, _outputs(pickle.loads(pickle.dumps(model))))
    single = nn.place(model, dtype="float32")
    for name, a in nn._parameters(single).items():  # the count of batches stays an integer
        assert a.dtype == (np.int64 if name.endswith("count") else np.float32), name
    moved = nn.place(model, xp="torch")
    assert all(isinstance(a, torch.Tensor) for a in nn._parameters(moved).values())
    _same_outputs(expected, _outputs(moved, like=torch.tensor), atol=1e-12)


def test_transformer_block_with_pytorchs_dropouts():
    """As the docstring says: PyTorch's dropout on the attention weights and the MLP's hidden
    layer, by replacing the block's attention and MLP."""
    r = rng(4)
    block = nn.TransformerBlock(8, 2, hidden=12, norm_first=False, dropout=0.5, rng=r, **F64)
    attention = nn.MultiHeadAttention(8, 2, bias=True, dropout_prob=0.5, rng=r, **F64)
    mlp = nn.Chain(nn.Dense(8, 12, nn.gelu, rng=r, **F64), nn.Dropout(0.5, rng=r),
                   nn.Dense(12, 8, rng=r, **F64))  # fmt: skip
    full = dataclasses.replace(block, attention=attention, mlp=mlp)
    assert full.attention is attention and full.mlp is mlp and full.norm_first is False
    x = uniform((2, 5, 8), (-1, 1), 1)
    np.testing.assert_array_equal(nn.testmode(full)(x), full(x))  # test mode: no dropout
    _, dropped = nn.trainmode(full).attention(x)
    assert (dropped == 0).any()


def test_embedding_options_in_a_nested_pass():
    """The rows' pullback is differentiable again (nest=True): the same first gradient, and a
    second one that is PyTorch's double backward of `sum(embedding(i) ** 3)`."""
    weight, indices = uniform((5, 3), (-1.5, 1.5), 2), np.array([0, 1, 1, 4])
    options = dict(padding_idx=1, max_norm=1.2)
    f = lambda w: tg.sum(nn.Embedding(weight=w, **options)(indices) ** 3)
    v = uniform((5, 3), (0.5, 1.5), 3)
    (first,) = tg.gradient(f, weight)
    (second,) = tg.gradient(lambda w: tg.sum(tg.gradient(f, w, nest=True)[0] * v), weight)
    w = torch.tensor(weight, requires_grad=True)
    (g,) = torch.autograd.grad((F.embedding(torch.tensor(indices), w, **options) ** 3).sum(), w,
                               create_graph=True)  # fmt: skip
    (gg,) = torch.autograd.grad((g * torch.tensor(v)).sum(), w)
    np.testing.assert_allclose(first, g.detach().numpy(), atol=1e-12, rtol=0)
    np.testing.assert_allclose(second, gg.numpy(), atol=1e-12, rtol=0)
