"""`nn.from_torch`, `nn.to_torch` and `nn.load_state_dict` against PyTorch itself, in float64.

Every module type the converter's tables list (`FROM_TORCH`, `ACTIVATIONS`) has cases here (a
test fails when one is added without a case). For each: PyTorch's module with random weights
(and running statistics from a batch in training mode), converted; outputs (the last state of
the recurrent layers too) and the input's gradient of `sum(outputs * r)` compared with
PyTorch's in evaluation mode to 1e-12, relative to the largest value; converted back, the
`state_dict` and the settings (the repr) are PyTorch's exactly. A PyTorch MLP, a CNN and a
stack of transformer layers train a few steps with our `Descent` and reach `torch.optim.SGD`'s
parameters (and running statistics). Refusals name what is unsupported.
"""

import dataclasses
import re
import sys

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.nn.torch_io import ACTIVATIONS, FROM_TORCH

torch = pytest.importorskip("torch", reason="the reference is PyTorch: pip install torch")
F = torch.nn.functional
T = torch.nn
SPATIAL = {1: (9,), 2: (7, 6), 3: (5, 6, 4)}


def normal(*shape):
    return lambda r: [r.standard_normal(shape)]


def image(channels, rank, batch=2):
    return normal(batch, channels, *SPATIAL[rank])


def tokens(r):
    return [r.integers(0, 10, (3, 5))]


def attention_inputs(kdim, vdim):
    return lambda r: [r.standard_normal((2, 4, 8)), r.standard_normal((2, 5, kdim)),
                      r.standard_normal((2, 5, vdim))]  # fmt: skip


def mha_call(module, q, k, v):
    return module(q, k, v, need_weights=True, average_attn_weights=False)


# (PyTorch's class name, the module, its inputs, PyTorch's call or None for module(*inputs))
CASES = [
    ("Linear", lambda: T.Linear(3, 5), normal(4, 3)),
    ("Linear", lambda: T.Linear(3, 5, bias=False), normal(2, 4, 3)),
    ("Conv1d", lambda: T.Conv1d(4, 6, 3, stride=2, padding=1, padding_mode="reflect"),
     image(4, 1)),
    ("Conv2d", lambda: T.Conv2d(4, 6, 3, padding="same", dilation=2, groups=2,
                                padding_mode="circular"), image(4, 2)),
    ("Conv2d", lambda: T.Conv2d(4, 6, (2, 3), stride=(2, 1), bias=False), image(4, 2)),
    ("Conv3d", lambda: T.Conv3d(4, 6, 3, padding=1, padding_mode="replicate"), image(4, 3)),
    ("ConvTranspose1d", lambda: T.ConvTranspose1d(4, 6, 3, stride=2, padding=1,
                                                  output_padding=1), image(4, 1)),
    ("ConvTranspose2d", lambda: T.ConvTranspose2d(4, 6, 3, stride=2, groups=2, dilation=2),
     image(4, 2)),
    ("ConvTranspose3d", lambda: T.ConvTranspose3d(4, 2, 2, stride=2, bias=False), image(4, 3)),
    ("BatchNorm1d", lambda: T.BatchNorm1d(4), normal(8, 4)),
    ("BatchNorm1d", lambda: T.BatchNorm1d(4, momentum=0.3), image(4, 1)),
    ("BatchNorm2d", lambda: T.BatchNorm2d(4, momentum=None), image(4, 2)),
    ("BatchNorm2d", lambda: T.BatchNorm2d(4, track_running_stats=False), image(4, 2)),
    ("BatchNorm3d", lambda: T.BatchNorm3d(4, affine=False), image(4, 3)),
    ("InstanceNorm1d", lambda: T.InstanceNorm1d(4), image(4, 1)),
    ("InstanceNorm2d", lambda: T.InstanceNorm2d(4, affine=True, track_running_stats=True,
                                                momentum=0.3), image(4, 2)),
    ("InstanceNorm3d", lambda: T.InstanceNorm3d(4, track_running_stats=True), image(4, 3)),
    ("LayerNorm", lambda: T.LayerNorm(5), normal(3, 5)),
    ("LayerNorm", lambda: T.LayerNorm((4, 5), elementwise_affine=False), normal(3, 4, 5)),
    ("LayerNorm", lambda: T.LayerNorm(5, bias=False, eps=1e-3), normal(2, 3, 5)),
    ("GroupNorm", lambda: T.GroupNorm(2, 4), image(4, 2)),
    ("GroupNorm", lambda: T.GroupNorm(4, 4, affine=False, eps=1e-3), image(4, 1)),
    ("Embedding", lambda: T.Embedding(10, 4), tokens),
    ("Embedding", lambda: T.Embedding(10, 4, padding_idx=2, max_norm=1.5), tokens),
    ("RNN", lambda: T.RNN(3, 4, nonlinearity="relu"), normal(5, 2, 3)),
    ("RNN", lambda: T.RNN(3, 4, bias=False, batch_first=True, num_layers=2), normal(2, 5, 3)),
    ("LSTM", lambda: T.LSTM(3, 4, num_layers=2, bidirectional=True), normal(5, 2, 3)),
    ("LSTM", lambda: T.LSTM(3, 4, batch_first=True), normal(2, 5, 3)),
    ("GRU", lambda: T.GRU(3, 4, num_layers=2, batch_first=True), normal(2, 5, 3)),
    ("GRU", lambda: T.GRU(3, 4, bidirectional=True, bias=False), normal(5, 2, 3)),
    ("MultiheadAttention", lambda: T.MultiheadAttention(8, 2, batch_first=True),
     attention_inputs(8, 8), mha_call),
    ("MultiheadAttention", lambda: T.MultiheadAttention(8, 2, bias=False, kdim=3, vdim=5,
                                                        batch_first=True),
     attention_inputs(3, 5), mha_call),
    ("TransformerEncoderLayer", lambda: T.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                                  batch_first=True),
     normal(2, 5, 8)),
    ("TransformerEncoderLayer", lambda: T.TransformerEncoderLayer(
        8, 2, 12, activation="gelu", norm_first=True, layer_norm_eps=1e-3, batch_first=True),
     normal(2, 5, 8)),
    ("TransformerEncoderLayer", lambda: T.TransformerEncoderLayer(
        8, 4, 12, dropout=0.2, activation=T.GELU(approximate="tanh"), bias=False,
        batch_first=True), normal(2, 5, 8)),
    ("MaxPool1d", lambda: T.MaxPool1d(3, stride=2, padding=1, ceil_mode=True), image(3, 1)),
    ("MaxPool2d", lambda: T.MaxPool2d(2, dilation=2), image(3, 2)),
    ("MaxPool3d", lambda: T.MaxPool3d(2), image(3, 3)),
    ("AvgPool1d", lambda: T.AvgPool1d(3, stride=2, padding=1, count_include_pad=False),
     image(3, 1)),
    ("AvgPool2d", lambda: T.AvgPool2d(2, ceil_mode=True), image(3, 2)),
    ("AvgPool3d", lambda: T.AvgPool3d((2, 3, 2), stride=1), image(3, 3)),
    ("AdaptiveMaxPool1d", lambda: T.AdaptiveMaxPool1d(4), image(3, 1)),
    ("AdaptiveMaxPool2d", lambda: T.AdaptiveMaxPool2d((3, None)), image(3, 2)),
    ("AdaptiveMaxPool3d", lambda: T.AdaptiveMaxPool3d(2), image(3, 3)),
    ("AdaptiveAvgPool1d", lambda: T.AdaptiveAvgPool1d(4), image(3, 1)),
    ("AdaptiveAvgPool2d", lambda: T.AdaptiveAvgPool2d((3, 4)), image(3, 2)),
    ("AdaptiveAvgPool3d", lambda: T.AdaptiveAvgPool3d(1), image(3, 3)),
    ("Flatten", lambda: T.Flatten(), normal(2, 3, 4)),
    ("Dropout", lambda: T.Dropout(0.3), normal(4, 5)),
    ("Sequential", lambda: T.Sequential(T.Linear(3, 5), T.Tanh(), T.Dropout(0.2),
                                        T.Linear(5, 2), T.Softmax(dim=1)), normal(4, 3)),
    ("Sequential", lambda: T.Sequential(
        T.Conv2d(3, 4, 3), T.ReLU(),
        T.Sequential(T.Conv2d(4, 4, 3, padding=1), T.BatchNorm2d(4), T.LeakyReLU(0.2)),
        T.Flatten(), T.Linear(4 * 5 * 4, 3), T.SiLU()), image(3, 2)),
    ("ReLU", T.ReLU, normal(4, 5)),
    ("Tanh", T.Tanh, normal(4, 5)),
    ("Sigmoid", T.Sigmoid, normal(4, 5)),
    ("GELU", lambda: T.GELU(approximate="tanh"), normal(4, 5)),
    ("GELU", T.GELU, normal(4, 5)),
    ("SiLU", T.SiLU, normal(4, 5)),
    ("LeakyReLU", lambda: T.LeakyReLU(0.2), normal(4, 5)),
    ("ELU", lambda: T.ELU(0.7), normal(4, 5)),
    ("CELU", lambda: T.CELU(1.25), normal(4, 5)),  # its gradient rounds 1 / alpha to float32
    ("SELU", T.SELU, normal(4, 5)),
    ("Softsign", T.Softsign, normal(4, 5)),
    ("LogSigmoid", T.LogSigmoid, normal(4, 5)),
    ("ReLU6", T.ReLU6, lambda r: [4 * r.standard_normal((4, 5))]),
    ("Hardtanh", T.Hardtanh, lambda r: [2 * r.standard_normal((4, 5))]),
    ("Softmax", lambda: T.Softmax(dim=1), normal(4, 5)),
    ("LogSoftmax", lambda: T.LogSoftmax(dim=-1), normal(4, 5)),
    ("Identity", T.Identity, normal(4, 5)),
]  # fmt: skip
# settings written otherwise on the way back: PyTorch's InstanceNorm with momentum=None never
# updates (ours holds momentum=0.0), and padding="same" comes back as its sizes
SETTINGS_DIFFER = ("InstanceNorm3d(4, eps=1e-05, momentum=None", "padding=same")


def case_id(case):
    return case[0]


def built(case, seed=0):
    """PyTorch's module of `case` in float64, its weights drawn, its running statistics from
    batches in training mode, then in evaluation mode; and its inputs."""
    name, build, inputs = case[:3]
    torch.manual_seed(seed)
    module = build().double()
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.8, 0.8)
    r = np.random.default_rng(seed)
    module.train()
    for _ in range(2):
        xs = inputs(r)
        if name not in ("MultiheadAttention", "Embedding"):
            module(*[3 * torch.tensor(x) + 1 for x in xs])
    return module.eval(), inputs(r)


def leaves(out):
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in leaves(o)]
    return [out]


def close(ours, theirs):
    theirs = theirs.detach().numpy()
    ours = np.reshape(np.asarray(tg.data(ours)), theirs.shape)  # ours: no (1, batch, h) axis
    scale = max(np.abs(theirs).max(), 1e-300)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12 * scale)


def test_every_supported_module_has_a_case():
    supported = set(FROM_TORCH) | {row[0] for row in ACTIVATIONS}
    assert supported == {case[0] for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_outputs_and_input_gradient_are_pytorchs(case):
    module, xs = built(case)
    call = case[3] if len(case) > 3 else (lambda m, *ts: m(*ts))
    model = nn.testmode(nn.from_torch(module))
    floating = [np.issubdtype(x.dtype, np.floating) for x in xs]
    ts = [torch.tensor(x, requires_grad=f) for x, f in zip(xs, floating)]
    expected = leaves(call(module, *ts))
    r = np.random.default_rng(7)
    weights = [r.uniform(0.5, 1.5, tuple(e.shape)) for e in expected]
    sum((e * torch.tensor(w)).sum() for e, w in zip(expected, weights)).backward()

    def loss(*args):
        outputs = leaves(model(*args))
        assert len(outputs) == len(weights)
        total = sum(tg.sum(o * np.reshape(w, o.shape)) for o, w in zip(outputs, weights))
        return total, [tg.data(o) for o in outputs]

    wrt = tuple(i for i, f in enumerate(floating) if f)
    (_, ours), grads = tg.withgradient(loss, *xs, wrt=wrt) if wrt else ((loss(*xs)), ())
    for o, e in zip(ours, expected):
        close(o, e)
    for g, i in zip(grads, wrt):
        close(g, ts[i].grad)


def same_sizes(text):
    """A repr with the sizes `(2, 2)` and `(2,)` written `2`, as PyTorch takes them."""
    return re.sub(r"\((\d+)(?:, \1)*,?\)", r"\1", text)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_round_trip_gives_pytorchs_module_back(case):
    module, _ = built(case)
    name = case[0]
    rank = int(name[-2]) if name[-2:-1].isdigit() else 1
    back = nn.to_torch(nn.from_torch(module), rank=rank)
    assert type(back) is type(module)
    if not any(s in repr(module) for s in SETTINGS_DIFFER):
        assert same_sizes(repr(back)) == same_sizes(repr(module))
    theirs, ours = module.state_dict(), back.state_dict()
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        owner = module.get_submodule(key.rpartition(".")[0])
        if key.endswith("num_batches_tracked") and owner.momentum is not None:
            continue  # read by PyTorch with momentum=None only, where ours keeps it
        assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_bfloat16_module_converts_both_ways(case):
    """PyTorch's bfloat16 tensors have no NumPy view, and ml_dtypes' arrays no tensor: both
    conversions raised the libraries' TypeErrors. Through float32, exactly."""
    module, _ = built(case)
    module = module.to(torch.bfloat16)
    name = case[0]
    rank = int(name[-2]) if name[-2:-1].isdigit() else 1
    back = nn.to_torch(nn.from_torch(module), rank=rank)
    for key, value in module.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue  # an integer count, as in test_round_trip_gives_pytorchs_module_back
        assert back.state_dict()[key].dtype == value.dtype and torch.equal(
            back.state_dict()[key], value
        ), key


NESTED = {
    "conv in a chain, then a norm": lambda: T.Sequential(
        T.Sequential(T.Conv2d(3, 4, 3)), T.BatchNorm2d(4)
    ),
    "flattened in a chain, then a norm": lambda: T.Sequential(
        T.Conv2d(3, 4, 3), T.Sequential(T.Flatten(), T.Linear(64, 5)), T.BatchNorm1d(5)
    ),
}


@pytest.mark.parametrize("name", NESTED)
def test_a_norm_after_a_nested_chain_takes_the_rank_of_its_last_layer(name):
    """The rank going into the inner chain was taken for the rank coming out: a BatchNorm1d
    came back for a BatchNorm2d, which raised only when the module ran."""
    module = NESTED[name]().double()
    back = nn.to_torch(nn.from_torch(module))
    assert [type(m) for m in back.modules()] == [type(m) for m in module.modules()]
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    module.eval()
    back.eval()
    assert torch.allclose(back(x), module(x), rtol=1e-12)


def test_the_converted_arrays_are_placed_as_asked():
    module = T.Sequential(T.Linear(3, 4), T.BatchNorm1d(4, momentum=None)).double()
    model = nn.from_torch(module, dtype="float32", xp="torch")
    for name, array in nn._parameters(model).items():  # the count of batches an integer
        expected = torch.int64 if name.endswith("count") else torch.float32
        assert isinstance(array, torch.Tensor) and array.dtype == expected, name
    assert nn.to_torch(model)[0].weight.dtype == torch.float32
    batchnorm = nn.from_torch(module)[1]
    assert batchnorm.count.dtype == np.int64 and int(batchnorm.count) == 0
    copied = nn.from_torch(module)  # a copy: PyTorch's training leaves it as it was
    before = np.array(copied[0].weight)
    with torch.no_grad():
        module[0].weight += 1
    np.testing.assert_array_equal(copied[0].weight, before)


# --- training: the same steps as torch.optim.SGD
def mlp():
    return T.Sequential(T.Linear(4, 16), T.Tanh(), T.Linear(16, 16), T.GELU(), T.Linear(16, 3))


def cnn():
    return T.Sequential(
        T.Conv2d(2, 4, 3, padding=1), T.BatchNorm2d(4), T.ReLU(), T.MaxPool2d(2),
        T.Conv2d(4, 4, 3, padding="same", padding_mode="reflect"), T.ReLU(),
        T.AdaptiveAvgPool2d(2), T.Flatten(), T.Linear(16, 3),
    )  # fmt: skip


def transformer():
    return T.Sequential(
        T.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True),
        T.TransformerEncoderLayer(8, 2, 16, dropout=0.0, norm_first=True, batch_first=True),
    )


TRAINING = {
    "mlp": (mlp, (16, 4), "mse"),
    "cnn": (cnn, (6, 2, 8, 8), "crossentropy"),
    "transformer": (transformer, (3, 5, 8), "weighted"),
}


@pytest.mark.parametrize("name", TRAINING)
def test_training_steps_are_torch_optims(name):
    build, shape, kind = TRAINING[name]
    torch.manual_seed(1)
    module = build().double().train()
    r = np.random.default_rng(2)
    x = r.standard_normal(shape)
    target = r.integers(0, 3, shape[0]) if kind == "crossentropy" else r.standard_normal((16, 3))
    w = r.uniform(0.5, 1.5, shape)
    losses = {
        "mse": (lambda y: nn.mse(y, target), lambda y: F.mse_loss(y, torch.tensor(target))),
        "crossentropy": (
            lambda y: nn.logitcrossentropy(y, target),
            lambda y: F.cross_entropy(y, torch.tensor(target)),
        ),
        "weighted": (lambda y: tg.sum(y * w), lambda y: (y * torch.tensor(w)).sum()),
    }
    ours_loss, torch_loss = losses[kind]
    model = nn.from_torch(module)
    sgd = torch.optim.SGD(module.parameters(), lr=0.1)
    state = optim.setup(optim.Descent(0.1), model)
    for _ in range(3):
        sgd.zero_grad()
        torch_loss(module(torch.tensor(x))).backward()
        sgd.step()
        (g,) = tg.gradient(lambda m: ours_loss(m(x)), model)
        state, model = optim.update(state, model, g)
    ours = nn.to_torch(model).state_dict()
    for key, value in module.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            close(ours[key], value)


# --- load_state_dict
def test_load_state_dict_loads_pytorchs_weights_into_our_model():
    torch.manual_seed(3)
    module = T.Sequential(T.Linear(3, 5), T.ReLU(), T.LSTM(5, 4, batch_first=True)).double()
    ours = nn.Chain(nn.Dense(3, 5, nn.relu), nn.LSTM(5, 4, bias_h=True, return_state=True))
    loaded = nn.load_state_dict(ours, module.state_dict())
    assert loaded.layers[0].weight.dtype == np.float32  # placed like the model's arrays
    assert loaded.layers[1].return_state is True  # the model's settings kept
    x = np.random.default_rng(4).standard_normal((2, 6, 3))
    y, _ = module[2](module[1](module[0](torch.tensor(x, dtype=torch.float32).double())))
    np.testing.assert_allclose(loaded(x.astype(np.float32))[0], y.detach().numpy(), atol=1e-5)
    np.testing.assert_array_equal(
        loaded.layers[1].cell.Wh, module[2].weight_hh_l0.detach().numpy().astype(np.float32)
    )


def test_load_state_dict_refuses_what_does_not_fit():
    module = T.Sequential(T.Linear(3, 5), T.ReLU(), T.Linear(5, 2))
    state = module.state_dict()
    model = nn.Chain(nn.Dense(3, 5, nn.relu), nn.Dense(5, 2))
    with pytest.raises(ValueError, match="Missing key.*2.bias"):
        nn.load_state_dict(model, {k: v for k, v in state.items() if k != "2.bias"})
    with pytest.raises(ValueError, match="Unexpected key.*extra"):
        nn.load_state_dict(model, {**state, "extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="size mismatch for 2.weight"):
        nn.load_state_dict(nn.Chain(nn.Dense(3, 5, nn.relu), nn.Dense(5, 3)), state)
    lstm = T.LSTM(3, 4, batch_first=True)
    with pytest.raises(ValueError, match="bias_h=True"):
        nn.load_state_dict(nn.LSTM(3, 4), lstm.state_dict())


ACTIVATED = {
    "Dense": (lambda: nn.Dense(3, 2, nn.relu, dtype="float64"), (4, 3)),
    "Conv": (lambda: nn.Conv((3,), 2, 3, nn.tanh, dtype="float64"), (2, 2, 7)),
    "Chain": (
        lambda: nn.Chain(nn.Dense(3, 4, nn.relu, dtype="float64"), nn.Dense(4, 2, dtype="float64")),
        (4, 3),
    ),
}


@pytest.mark.parametrize("name", ACTIVATED)
def test_load_state_dict_takes_the_names_to_torch_gives(name):
    """A layer with an activation is a Sequential of the layer and the activation in PyTorch
    ("0.weight"): its state_dict was refused as naming arrays the model lacks."""
    build, shape = ACTIVATED[name]
    model = build()
    module = nn.to_torch(model)
    state = {k: v + 0.5 for k, v in module.state_dict().items()}
    loaded = nn.load_state_dict(model, state)
    module.load_state_dict(state)
    x = np.random.default_rng(5).standard_normal(shape)
    np.testing.assert_allclose(loaded(x), module(torch.tensor(x)).detach().numpy(), rtol=1e-12)


def test_load_state_dict_refuses_a_value_the_model_cannot_hold():
    """As nn.load refuses it: PyTorch's copy wrote inf into float16, and dropped imaginary
    parts with a warning."""
    half = nn.Dense(2, 1, dtype="float16", bias=False)
    with pytest.raises(ValueError, match="weight does not fit .*would become inf"):
        nn.load_state_dict(half, {"weight": torch.tensor([[1e5, 0.5]])})
    real = nn.Dense(2, 1, dtype="float64", bias=False)
    with pytest.raises(ValueError, match="imaginary parts"):
        nn.load_state_dict(real, {"weight": torch.tensor([[1 + 2j, 3j]])})


# --- refusals
class Custom(T.Module):
    def __init__(self):
        super().__init__()
        self.linear = T.Linear(2, 2)

    def forward(self, x):
        return self.linear(x) * 2


class MyLinear(T.Linear):
    pass


FROM_REFUSED = [
    (lambda: T.LSTM(3, 4, proj_size=2), "proj_size=2"),
    (Custom, r"Custom is not one of them: convert its children"),
    (lambda: MyLinear(2, 2), "MyLinear is not one of them"),
    (lambda: T.PReLU(), "PReLU is not one of them"),
    (lambda: T.MultiheadAttention(8, 2), "batch_first=False.*build it with batch_first=True"),
    (lambda: T.TransformerEncoderLayer(8, 2), "batch_first=False"),
    (lambda: T.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True), "add_bias_kv"),
    (lambda: T.MultiheadAttention(8, 2, add_zero_attn=True, batch_first=True), "add_zero_attn"),
    (lambda: T.TransformerEncoderLayer(8, 2, activation=torch.sin, batch_first=True),
     "activation"),
    (lambda: T.Embedding(5, 2, sparse=True), "sparse=True"),
    (lambda: T.BatchNorm2d(4, bias=False), "affine=True and bias=False"),
    (lambda: T.GroupNorm(2, 4, bias=False), "affine=True and bias=False"),
    (lambda: T.Embedding(5, 2, scale_grad_by_freq=True), "scale_grad_by_freq"),
    (lambda: T.Flatten(0), "start_dim=0"),
    (lambda: T.Softmax(), "give dim"),
    (lambda: T.Hardtanh(-2.0, 2.0), r"supported: Hardtanh\(min_val=-1.0, max_val=1.0\)"),
    (lambda: T.MaxPool2d(2, return_indices=True), "return_indices"),
    (lambda: T.AvgPool2d(2, divisor_override=3), "divisor_override"),
    (lambda: T.Sequential(T.Linear(2, 2), Custom()), "Custom is not one of them"),
]  # fmt: skip


@pytest.mark.parametrize("build, message", FROM_REFUSED)
def test_from_torch_refuses_what_has_no_counterpart(build, message):
    with pytest.raises(ValueError, match=message):
        nn.from_torch(build())


TO_REFUSED = [
    (lambda: nn.Conv((3,), 2, 2, pad=(1, 0)), "asymmetric padding"),
    (lambda: nn.MeanPool((2,), pad=(1, 0)), "asymmetric padding"),
    (lambda: nn.MultiHeadAttention(8, 2, causal=True), "causal mask at each call"),
    (lambda: nn.Chain(nn.Dense(2, 2), lambda x: x * 2), "has no PyTorch module"),
    (lambda: nn.Dense(2, 2, nn.mish), "'mish' has no PyTorch module"),
    (lambda: nn.RNN(2, 3, nn.sigmoid), "tanh and relu only"),
    (lambda: nn.TransformerBlock(8, 2, dropout=0.1), "one dropout rate"),
    (lambda: nn.GlobalMeanPool(), "to_torch converts Dense"),
    # these two were converted with the activation dropped: another function, silently
    (lambda: _block_with(mlp=lambda b: nn.Chain(b.mlp.layers[0], _activated(b.mlp.layers[1]))),
     r"the MLP Chain\(Dense\(activation\), Dropout, Dense\)"),
    (lambda: _block_with(norm2=lambda b: _activated(b.norm2)), "no activation after its layer"),
]  # fmt: skip


def _activated(layer):
    return dataclasses.replace(layer, activation=nn.tanh)


def _block_with(**changes):
    block = nn.TransformerBlock(4, 2, hidden=8, rng=np.random.default_rng(0))
    return dataclasses.replace(block, **{k: change(block) for k, change in changes.items()})


@pytest.mark.parametrize("build, message", TO_REFUSED)
def test_to_torch_refuses_what_pytorch_lacks(build, message):
    with pytest.raises(ValueError, match=message):
        nn.to_torch(build())


def test_without_torch_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r'pip install "tracker-gpu\[torch\]"'):
        nn.from_torch(object())
    with pytest.raises(ImportError, match=r'pip install "tracker-gpu\[torch\]"'):
        nn.to_torch(nn.Dense(2, 2))
