"""The layers of bigger models against PyTorch with the same weights, forward and gradients in
float64, on every backend: strided, dilated and grouped convolutions, transposed convolutions,
BatchNorm (both modes and its running statistics), GroupNorm, LayerNorm, the recurrent layers,
MultiHeadAttention and TransformerBlock; and their primitives by finite differences."""

import dataclasses

import numpy as np
import pytest
from helpers import check, check_nested, numpy_of, uniform

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.rules.nn import lstm_cell

torch = pytest.importorskip("torch")
F = torch.nn.functional


def placed(backend):
    return dict(xp=backend.xp, device=backend.device, dtype="float64")


def rng(seed=0):
    return np.random.default_rng(seed)


def with_random_biases(backend, model, seed=5):
    """`model` with every zero-initialised vector (biases) drawn at random, so they matter."""

    def draw(path, x):
        if tg.backend.is_array(x) and len(x.shape) == 1 and "running" not in path:
            return backend.asarray(uniform(tuple(x.shape), (-1, 1), seed + len(path)))
        return x

    return tg.optim.tree_map_with_path(draw, model)


def against_torch(backend, model, x, reference, *, names=None, atol=1e-10):
    """Our `model(x)` and its gradients (of a weighted sum, with respect to every parameter and
    `x`) against `reference(tensors, x)`, PyTorch on the same values. `names` maps our
    parameter paths to the names `reference` reads (identity by default)."""
    params = nn._parameters(model)
    tensors = {
        path: torch.tensor(numpy_of(backend, a), requires_grad=True) for path, a in params.items()
    }
    x_t = torch.tensor(x, requires_grad=True)
    named = {(names or {}).get(p, p): t for p, t in tensors.items()}
    expected = reference(named, x_t)
    weights = uniform(tuple(expected.shape), (0.5, 1.5), seed=9)
    (expected * torch.tensor(weights)).sum().backward()
    w = backend.asarray(weights)
    value, (g_model, g_x) = tg.withgradient(
        lambda m, x: (tg.sum(m(x) * w), tg.data(m(x))), model, backend.asarray(x)
    )
    y = value[1]
    assert np.allclose(numpy_of(backend, y), expected.detach().numpy(), atol=atol), "forward"
    assert np.allclose(numpy_of(backend, g_x), x_t.grad.numpy(), atol=atol), "gradient of x"
    grads = nn._parameters(g_model)
    for path, tensor in tensors.items():
        if tensor.grad is not None:
            assert np.allclose(numpy_of(backend, grads[path]), tensor.grad.numpy(), atol=atol), path


# --- convolutions
CONVS = [
    dict(stride=2, pad=1, dilation=1, groups=1),
    dict(stride=1, pad=2, dilation=2, groups=2),
    dict(stride=(2, 1), pad=(0, 1), dilation=(1, 2), groups=4),  # depthwise
]


@pytest.mark.parametrize("config", CONVS, ids=str)
def test_conv_with_stride_padding_dilation_and_groups(backend, config):
    layer = nn.Conv((3, 2), 4, 8, nn.tanh, rng=rng(), **config, **placed(backend))
    layer = with_random_biases(backend, layer)
    x = uniform((2, 4, 7, 6), (-1, 1), 1)
    reference = lambda p, x: torch.tanh(
        F.conv2d(x, p["weight"], p["bias"], **_torch_geometry(config))
    )
    against_torch(backend, layer, x, reference)


def _torch_geometry(config):
    return dict(
        stride=config["stride"],
        padding=config["pad"],
        dilation=config["dilation"],
        groups=config["groups"],
    )


@pytest.mark.parametrize("config", CONVS, ids=str)
def test_conv_transpose(backend, config):
    outpad = tuple(int(s) - 1 for s in np.broadcast_to(config["stride"], 2))
    layer = nn.ConvTranspose((3, 2), 4, 8, rng=rng(), outpad=outpad, **config, **placed(backend))
    layer = with_random_biases(backend, layer)
    x = uniform((2, 4, 4, 3), (-1, 1), 1)
    reference = lambda p, x: F.conv_transpose2d(
        x, p["weight"], p["bias"], output_padding=outpad, **_torch_geometry(config)
    )
    against_torch(backend, layer, x, reference)
    assert (
        repr(nn.ConvTranspose((3, 3), 2, 4, stride=2))
        == "ConvTranspose((3, 3), 2 => 4, stride=(2, 2))"
    )


# --- normalisation
@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 2, 3)], ids=["dense", "images"])
def test_batchnorm_training_and_running_statistics(backend, shape):
    layer = with_random_biases(backend, nn.BatchNorm(3, nn.relu, momentum=0.2, **placed(backend)))
    x = uniform(shape, (-2, 2), 1)
    running = [torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)]
    reference = lambda p, x: torch.relu(
        F.batch_norm(x, *running, p["scale"], p["bias"], training=True, momentum=0.2, eps=1e-5)
    )
    against_torch(backend, layer, x, reference)  # trains: inside gradient, twice
    torch_twice = [r.clone() for r in running]
    F.batch_norm(torch.tensor(x), *torch_twice, training=True, momentum=0.2)
    assert np.allclose(numpy_of(backend, layer.running_mean), torch_twice[0].numpy())
    assert np.allclose(numpy_of(backend, layer.running_var), torch_twice[1].numpy())


def test_batchnorm_test_mode_uses_the_running_statistics(backend):
    layer = nn.BatchNorm(3, **placed(backend))
    stats = [
        backend.asarray(uniform((3,), (-1, 1), 2)),
        backend.asarray(uniform((3,), (0.5, 2), 3)),
    ]
    layer = dataclasses.replace(layer, running_mean=stats[0], running_var=stats[1])
    layer = with_random_biases(backend, nn.testmode(layer))
    x = uniform((4, 3, 2, 2), (-2, 2), 1)
    mean, var = (torch.tensor(numpy_of(backend, s)) for s in stats)
    reference = lambda p, x: F.batch_norm(x, mean, var, p["scale"], p["bias"], training=False)
    against_torch(backend, layer, x, reference)
    assert np.array_equal(numpy_of(backend, layer.running_mean), mean.numpy())  # not updated
    plain = layer(backend.asarray(x))  # automatic mode on plain input: test mode too
    trained = nn.trainmode(layer)(backend.asarray(x))
    assert not np.allclose(numpy_of(backend, plain), numpy_of(backend, trained))


def test_batchnorm_statistics_stay_out_of_the_gradient_and_the_optimiser(backend):
    model = nn.Chain(
        nn.Dense(3, 4, rng=rng(), **placed(backend)), nn.BatchNorm(4, **placed(backend))
    )
    x = backend.asarray(uniform((6, 3), (-1, 1)))
    _, (g,) = tg.withgradient(lambda m: tg.sum(m(x) ** 3), model)
    assert g.layers[1].running_mean is None and g.layers[1].running_var is None
    state = tg.optim.setup(tg.optim.Adam(), model)
    assert state.layers[1].running_mean is None and state.layers[1].scale is not None
    before = numpy_of(backend, model.layers[1].running_mean)
    _, new = tg.optim.update(state, model, g)
    assert np.array_equal(numpy_of(backend, new.layers[1].running_mean), before)


def test_groupnorm(backend):
    layer = with_random_biases(backend, nn.GroupNorm(6, 3, **placed(backend)))
    x = uniform((2, 6, 3, 2), (-2, 2), 1)
    reference = lambda p, x: F.group_norm(x, 3, p["scale"], p["bias"], eps=1e-5)
    against_torch(backend, layer, x, reference)
    assert repr(layer) == "GroupNorm(6, 3)"


def test_layernorm(backend):
    layer = with_random_biases(backend, nn.LayerNorm((3, 4), **placed(backend)))
    x = uniform((2, 3, 4), (-2, 2), 1)
    reference = lambda p, x: F.layer_norm(x, (3, 4), p["scale"], p["bias"], eps=1e-5)
    against_torch(backend, layer, x, reference)


def test_normalise_gradcheck(backend):
    x = backend.asarray(uniform((3, 2, 4), (-2, 2)))
    for axes in [(2,), (0, 2), (1, 2), (0, 1, 2)]:
        check(backend, lambda x, axes=axes: nn.normalise(x, axes=axes), x)
    check_nested(backend, lambda x: nn.normalise(x, axes=(0, 2)), x)


# --- recurrent layers
RECURRENT = {
    "RNN": (nn.RNN, torch.nn.RNN),
    "LSTM": (nn.LSTM, torch.nn.LSTM),
    "GRU": (nn.GRU, torch.nn.GRU),
}


@pytest.mark.parametrize("kind", list(RECURRENT))
def test_recurrent_layers(backend, kind):
    ours, theirs = RECURRENT[kind]
    layer = with_random_biases(backend, ours(3, 4, rng=rng(), **placed(backend)))
    gates = layer.cell.Wi.shape[0]
    module = theirs(3, 4, batch_first=True).double()
    names = {"cell.Wi": "weight_ih_l0", "cell.Wh": "weight_hh_l0", "cell.bias": "bias_ih_l0"}
    zero = torch.zeros(gates, dtype=torch.float64)
    reference = lambda p, x: torch.func.functional_call(module, {**p, "bias_hh_l0": zero}, (x,))[0]
    x = uniform((2, 5, 3), (-1, 1), 1)
    against_torch(backend, layer, x, reference, names=names)


def test_an_explicit_state_and_the_last_state(backend):
    layer = nn.LSTM(2, 3, rng=rng(), return_state=True, **placed(backend))
    x = backend.asarray(uniform((4, 6, 2), (-1, 1)))
    y, state = layer(x)
    first, middle = layer(x[:, :2, :]), None
    _, middle = first
    rest, last = layer(x[:, 2:, :], middle)  # the state carried on by hand
    assert np.allclose(numpy_of(backend, rest), numpy_of(backend, y[:, 2:, :]))
    for a, b in zip(last, state):
        assert np.allclose(numpy_of(backend, a), numpy_of(backend, b))
    cell = layer.cell
    h, (h2, c2) = cell(x[:, 0, :])
    assert h is h2 and tuple(c2.shape) == (4, 3)
    assert tuple(nn.GRU(2, 3, **placed(backend))(x).shape) == (4, 6, 3)


def test_lstm_cell_gradcheck(backend):
    z = backend.asarray(uniform((3, 8), (-2, 2)))
    c = backend.asarray(uniform((3, 2), (-2, 2), 1))
    check(backend, lstm_cell, z, c)
    check_nested(backend, lambda z: lstm_cell(z, c), z)


# --- attention
def _torch_attention(bias, causal, length):
    module = torch.nn.MultiheadAttention(8, 2, bias=bias, batch_first=True).double()
    mask = torch.ones(length, length, dtype=torch.bool).triu(1) if causal else None

    def reference(p, x):
        params = {
            "in_proj_weight": torch.cat([p[f"{n}_proj.weight"] for n in "qkv"]),
            "out_proj.weight": p["out_proj.weight"],
        }
        if bias:
            params["in_proj_bias"] = torch.cat([p[f"{n}_proj.bias"] for n in "qkv"])
            params["out_proj.bias"] = p["out_proj.bias"]
        y, scores = torch.func.functional_call(
            module, params, (x, x, x), dict(attn_mask=mask, average_attn_weights=False)
        )
        return y, scores

    return reference


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention(backend, bias, causal):
    layer = nn.MultiHeadAttention(
        8, nheads=2, bias=bias, causal=causal, rng=rng(), **placed(backend)
    )
    layer = with_random_biases(backend, layer)
    x = uniform((2, 4, 8), (-1, 1), 1)
    attend = _torch_attention(bias, causal, 4)
    against_torch(
        backend,
        _Values(layer),
        x,
        lambda p, x: attend(p, x)[0],
        names={k: k.removeprefix("layer.") for k in nn._parameters(_Values(layer))},
    )
    _, scores = layer(backend.asarray(x))
    expected = attend(
        {k: torch.tensor(numpy_of(backend, v)) for k, v in nn._parameters(layer).items()},
        torch.tensor(x),
    )[1]
    assert np.allclose(numpy_of(backend, scores), expected.detach().numpy())


@dataclasses.dataclass
class _Values:
    """The attended values alone, as a layer."""

    layer: object

    def __call__(self, x):
        return self.layer(x)[0]


def test_attention_with_a_mask_and_other_keys(backend):
    layer = nn.MultiHeadAttention(4, nheads=1, rng=rng(), **placed(backend))
    q = backend.asarray(uniform((1, 2, 4), (-1, 1)))
    k = backend.asarray(uniform((1, 3, 4), (-1, 1), 1))
    mask = backend.asarray(np.array([[True, False, True], [False, True, True]]))
    _, scores = layer(q, k, mask=mask)
    s = numpy_of(backend, scores)
    assert s.shape == (1, 1, 2, 3) and s[0, 0, 0, 1] == 0 and s[0, 0, 1, 0] == 0
    assert np.allclose(s.sum(axis=-1), 1.0)


def test_attention_refuses_a_mask_that_is_not_booleans_of_the_scores_shape(backend):
    """PyTorch's float masks are additive (0 attends, -inf blocks): read as truth values they
    would block what they allow. A mask must be booleans that broadcast to the scores."""
    layer = nn.MultiHeadAttention(4, nheads=2, rng=rng(), **placed(backend))
    x = backend.asarray(uniform((2, 3, 4), (-1, 1)))
    additive = np.triu(np.full((3, 3), -np.inf), k=1)
    for mask in (additive, (additive == 0).astype(np.int64)):
        with pytest.raises(TypeError, match=r"must be booleans.*mask=\(attn_mask == 0\)"):
            layer(x, mask=backend.asarray(mask))
    with pytest.raises(ValueError, match=r"shape \(3, 2\) does not broadcast to the scores"):
        layer(x, mask=backend.asarray(np.ones((3, 2), dtype=bool)))
    block = nn.TransformerBlock(4, 2, hidden=8, rng=rng(), **placed(backend))
    with pytest.raises(TypeError, match="must be booleans"):
        block(x, mask=backend.asarray(additive))
    _, scores = layer(x, mask=backend.asarray(additive == 0))  # the same mask, as booleans
    s = numpy_of(backend, scores)
    assert np.all(s[..., 0, 1:] == 0) and np.allclose(s.sum(axis=-1), 1.0)


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_block(backend, causal):
    block = nn.TransformerBlock(8, 2, hidden=12, causal=causal, rng=rng(), **placed(backend))
    block = with_random_biases(backend, block)
    gelu = lambda x: F.gelu(x, approximate="tanh")
    module = torch.nn.TransformerEncoderLayer(
        8, 2, 12, dropout=0.0, activation=gelu, batch_first=True, norm_first=True
    ).double()
    names = {
        "norm1.scale": "norm1.weight",
        "norm1.bias": "norm1.bias",
        "norm2.scale": "norm2.weight",
        "norm2.bias": "norm2.bias",
        "mlp.layers.0.weight": "linear1.weight",
        "mlp.layers.0.bias": "linear1.bias",
        "mlp.layers.1.weight": "linear2.weight",
        "mlp.layers.1.bias": "linear2.bias",
    }
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)

    def reference(p, x):
        params = {k: v for k, v in p.items() if not k.startswith("attention.")}
        params["self_attn.in_proj_weight"] = torch.cat(
            [p[f"attention.{n}_proj.weight"] for n in "qkv"]
        )
        params["self_attn.in_proj_bias"] = torch.cat([p[f"attention.{n}_proj.bias"] for n in "qkv"])
        params["self_attn.out_proj.weight"] = p["attention.out_proj.weight"]
        params["self_attn.out_proj.bias"] = p["attention.out_proj.bias"]
        kw = dict(src_mask=mask, is_causal=True) if causal else {}
        return torch.func.functional_call(module, params, (x,), kw)

    against_torch(backend, block, uniform((2, 5, 8), (-1, 1), 1), reference, names=names)
