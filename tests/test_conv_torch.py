"""Convolutions and pools over 1, 2 and 3 spatial axes against PyTorch, in float64, with the
same weights: the output, the input's gradient and every parameter's gradient (of
`sum(y * r)`, `r` random), for every option: stride, dilation, groups, symmetric, asymmetric,
"valid" and "same" padding (even kernels too), the padding modes, `ceil_mode`,
`count_include_pad`, max-pool dilation, the adaptive pools (PyTorch's bins) and the global
pools. PyTorch is the reference: its own layers with their own options, and where it has no
such option (asymmetric padding) `F.pad` with the padding written here in its order (the last
axis first) or a crop of its output. Nothing expected is copied from our output.

A few cases run on the backend under test; the new layers also save, load, pickle, move and
replay under `tg.compile` as the others do (`tests/compiling.py` lists every layer).
"""

import dataclasses
import pickle
from functools import partial

import numpy as np
import pytest
from helpers import numpy_of

import tracker_gpu as tg
from tracker_gpu import nn

torch = pytest.importorskip("torch", reason="the reference layers are PyTorch's")
F = torch.nn.functional
# PyTorch warns that it copies the input for an even kernel with padding="same": its business
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")

RNG = np.random.default_rng(30)
F64 = {"dtype": "float64"}
SIZES = {1: (9,), 2: (7, 6), 3: (5, 6, 4)}  # the input's spatial size by rank


def close(ours, theirs):
    np.testing.assert_allclose(np.asarray(ours), theirs.detach().numpy(), rtol=1e-10, atol=1e-12)


def t(a, grad=False):
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


def compare(layer, theirs, x, params=(), backend=None):
    """`layer` (ours, on `backend`'s library and device if given) against `theirs(x, *params)`
    (PyTorch) on NumPy `x`: output and gradients of `sum(y * r)`; `params` the names of our
    layer's parameters, given to PyTorch as leaves."""
    host = (lambda a: np.asarray(tg.data(a))) if backend is None else partial(numpy_of, backend)
    place = (lambda a: a) if backend is None else backend.asarray
    tensors = [t(host(getattr(layer, p)), grad=True) for p in params]
    tx = t(x, grad=True)
    ty = theirs(tx, *tensors)
    r = place(RNG.standard_normal(tuple(ty.shape)))
    (ty * t(host(r))).sum().backward()
    _, (g_layer, g_x) = tg.withgradient(lambda m, x: tg.sum(m(x) * r), layer, place(x))
    close(host(layer(place(x))), ty)
    close(host(g_x), tx.grad)
    for name, tensor in zip(params, tensors):
        close(host(getattr(g_layer, name)), tensor.grad)


def image(rank, channels=4, batch=2):
    return RNG.standard_normal((batch, channels, *SIZES[rank]))


# --- convolutions: ours as keywords, PyTorch's module keywords, and an explicit F.pad (its
# order: the last axis first) for what PyTorch's layers cannot pad themselves
CONVS = [
    (dict(kernel=(3,)), dict(), None),
    (dict(kernel=(4,), stride=2, pad=1, dilation=2), dict(stride=2, padding=1, dilation=2), None),
    (dict(kernel=(4,), pad="same"), dict(padding="same"), None),
    (dict(kernel=(2,), pad="same", dilation=3), dict(padding="same", dilation=3), None),
    (dict(kernel=(3,), pad="valid", groups=2), dict(padding="valid", groups=2), None),
    (dict(kernel=(3,), pad=(2, 1)), dict(), ((2, 1), "constant")),
    *[(dict(kernel=(3,), pad=2, pad_mode=mode), dict(padding=2, padding_mode=mode), None)
      for mode in ("reflect", "replicate", "circular")],
    (dict(kernel=(3, 2), stride=(2, 1), pad=(1, 0), groups=2),
     dict(stride=(2, 1), padding=(1, 0), groups=2), None),
    (dict(kernel=(2, 4), pad="same", dilation=(2, 1)), dict(padding="same", dilation=(2, 1)), None),
    (dict(kernel=(3, 3), stride=2, pad=(1, 0, 2, 1)), dict(stride=2), ((2, 1, 1, 0), "constant")),
    (dict(kernel=(3, 3), pad=(1, 2), pad_mode="reflect"),
     dict(padding=(1, 2), padding_mode="reflect"), None),
    (dict(kernel=(3, 3), pad=1, pad_mode="circular", stride=2),
     dict(padding=1, padding_mode="circular", stride=2), None),
    (dict(kernel=(3, 2), pad=(0, 1, 2, 1), pad_mode="replicate"),
     dict(), ((2, 1, 0, 1), "replicate")),
    (dict(kernel=(2, 2), pad=(1, 0, 0, 1), pad_mode="circular"),
     dict(), ((0, 1, 1, 0), "circular")),
    (dict(kernel=(2, 3, 2), stride=(1, 2, 1), pad=(1, 0, 1)),
     dict(stride=(1, 2, 1), padding=(1, 0, 1)), None),
    (dict(kernel=(3, 3, 3), pad="same", pad_mode="reflect"),
     dict(padding="same", padding_mode="reflect"), None),
    (dict(kernel=(2, 2, 2), groups=2, dilation=2, pad=(1, 0, 0, 1, 1, 1)),
     dict(groups=2, dilation=2), ((1, 1, 0, 1, 1, 0), "constant")),
]  # fmt: skip
TORCH_CONV = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}


def torch_conv(ours, theirs, prepad, in_channels, out_channels):
    rank = len(ours["kernel"])
    module = TORCH_CONV[rank](in_channels, out_channels, ours["kernel"], dtype=torch.float64,
                              **theirs)  # fmt: skip

    def conv(x, weight, bias):
        if prepad is not None:
            x = F.pad(x, prepad[0], mode=prepad[1])
        return torch.func.functional_call(module, {"weight": weight, "bias": bias}, (x,))

    return conv


@pytest.mark.parametrize("ours, theirs, prepad", CONVS, ids=lambda v: str(v))
def test_conv_against_torch(ours, theirs, prepad):
    rank = len(ours["kernel"])
    kw = {k: v for k, v in ours.items() if k != "kernel"}
    layer = _with_bias(nn.Conv(ours["kernel"], 4, 6, dtype="float64", rng=RNG, **kw))
    compare(layer, torch_conv(ours, theirs, prepad, 4, 6), image(rank), ("weight", "bias"))


def _with_bias(layer):
    return dataclasses.replace(layer, bias=RNG.standard_normal(tuple(layer.bias.shape)))


def test_conv_activation_and_no_bias_against_torch():
    layer = nn.Conv((3,), 4, 2, nn.tanh, bias=False, dtype="float64", rng=RNG)
    compare(layer, lambda x, w: torch.tanh(F.conv1d(x, w)), image(1), ("weight",))


# --- transposed convolutions; asymmetric padding: PyTorch's unpadded output, cropped
TRANSPOSED = [
    (dict(kernel=(3,), stride=2, pad=1, outpad=1), dict(stride=2, padding=1, output_padding=1)),
    (dict(kernel=(3, 2), stride=(2, 1), pad=(1, 0), dilation=(1, 2), groups=2),
     dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)),
    (dict(kernel=(2, 2, 2), stride=2), dict(stride=2)),
    (dict(kernel=(3, 3), stride=2, pad="same"), dict(stride=2, padding=1)),
]  # fmt: skip
TORCH_TRANSPOSED = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@pytest.mark.parametrize("ours, theirs", TRANSPOSED, ids=lambda v: str(v))
def test_conv_transpose_against_torch(ours, theirs):
    rank = len(ours["kernel"])
    kw = {k: v for k, v in ours.items() if k != "kernel"}
    layer = _with_bias(nn.ConvTranspose(ours["kernel"], 4, 6, dtype="float64", rng=RNG, **kw))

    def theirs_fn(x, w, b):
        return TORCH_TRANSPOSED[rank](x, w, b, **theirs)

    compare(layer, theirs_fn, image(rank), ("weight", "bias"))


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_conv_transpose_asymmetric_padding_crops_torch_output(rank):
    pad = (1, 0, 0, 2, 2, 1)[: 2 * rank]
    layer = _with_bias(nn.ConvTranspose((3,) * rank, 4, 2, stride=2, pad=pad, dtype="float64",
                                        rng=RNG))  # fmt: skip

    def theirs(x, w, b):
        y = TORCH_TRANSPOSED[rank](x, w, b, stride=2)
        crop = tuple(slice(pad[2 * a], y.shape[2 + a] - pad[2 * a + 1]) for a in range(rank))
        return y[(slice(None), slice(None), *crop)]

    compare(layer, theirs, image(rank), ("weight", "bias"))


# --- pools: ours, and PyTorch's function of the same rank with its keywords
MAXPOOLS = [
    (dict(window=(3,), stride=2, pad=1, ceil_mode=True), dict(kernel_size=3, stride=2, padding=1,
                                                               ceil_mode=True)),
    (dict(window=(2,), dilation=2, ceil_mode=True),
     dict(kernel_size=2, dilation=2, ceil_mode=True)),
    (dict(window=(3, 2), stride=(2, 1), pad=(1, 0), dilation=(1, 2)),
     dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))),
    (dict(window=(3, 3), stride=2, pad=1, ceil_mode=True),
     dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (dict(window=(2, 2), stride=2, ceil_mode=True), dict(kernel_size=2, ceil_mode=True)),
    (dict(window=(2, 2, 2)), dict(kernel_size=2)),
    (dict(window=(3, 2, 2), stride=2, ceil_mode=True, dilation=(1, 2, 1)),
     dict(kernel_size=(3, 2, 2), stride=2, ceil_mode=True, dilation=(1, 2, 1))),
]  # fmt: skip
MEANPOOLS = [
    (dict(window=(3,), stride=2, pad=1, count_include_pad=False, ceil_mode=True),
     dict(kernel_size=3, stride=2, padding=1, count_include_pad=False, ceil_mode=True)),
    (dict(window=(4,), stride=3, pad=2, ceil_mode=True),
     dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)),
    (dict(window=(3, 3), stride=2, pad=1, ceil_mode=True),
     dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (dict(window=(2, 3), stride=(2, 1), pad=(1, 1), count_include_pad=False),
     dict(kernel_size=(2, 3), stride=(2, 1), padding=(1, 1), count_include_pad=False)),
    (dict(window=(2, 2)), dict(kernel_size=2)),
    (dict(window=(2, 2, 2), stride=2, pad=1, count_include_pad=False, ceil_mode=True),
     dict(kernel_size=2, stride=2, padding=1, count_include_pad=False, ceil_mode=True)),
    (dict(window=(3, 3, 3), stride=2, ceil_mode=True),
     dict(kernel_size=3, stride=2, ceil_mode=True)),
]  # fmt: skip
TORCH_POOL = {
    ("max", 1): F.max_pool1d, ("max", 2): F.max_pool2d, ("max", 3): F.max_pool3d,
    ("mean", 1): F.avg_pool1d, ("mean", 2): F.avg_pool2d, ("mean", 3): F.avg_pool3d,
}  # fmt: skip
POOL_CASES = [("max", *c) for c in MAXPOOLS] + [("mean", *c) for c in MEANPOOLS]


@pytest.mark.parametrize("kind, ours, theirs", POOL_CASES, ids=lambda v: str(v))
def test_pool_against_torch(kind, ours, theirs):
    rank = len(ours["window"])
    layer = (nn.MaxPool if kind == "max" else nn.MeanPool)(**ours)
    compare(layer, lambda x: TORCH_POOL[kind, rank](x, **theirs), image(rank))


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("kind", ["max", "mean"])
def test_pool_asymmetric_padding_against_padded_torch(kind, rank):
    pad = (1, 0, 0, 1, 1, 1)[: 2 * rank]
    layer = (nn.MaxPool if kind == "max" else nn.MeanPool)((2,) * rank, stride=2, pad=pad)
    torch_order = tuple(v for a in reversed(range(rank)) for v in pad[2 * a : 2 * a + 2])
    fill = -np.inf if kind == "max" else 0.0  # ours: padding ignored, or counted as zeros

    def theirs(x):
        return TORCH_POOL[kind, rank](F.pad(x, torch_order, value=fill), kernel_size=2)

    compare(layer, theirs, image(rank))


# --- adaptive and global pools
ADAPTIVE = [
    ((3,), (7,)), ((4,), (8,)), ((5,), (3,)),
    ((3, 2), (7, 6)), ((3, None), (5, 7)), ((4, 4), (4, 4)),
    ((2, 3, 1), (4, 5, 3)), ((3, 2, 2), (5, 6, 4)),
]  # fmt: skip
TORCH_ADAPTIVE = {
    ("max", 1): F.adaptive_max_pool1d, ("max", 2): F.adaptive_max_pool2d,
    ("max", 3): F.adaptive_max_pool3d, ("mean", 1): F.adaptive_avg_pool1d,
    ("mean", 2): F.adaptive_avg_pool2d, ("mean", 3): F.adaptive_avg_pool3d,
}  # fmt: skip


@pytest.mark.parametrize("out, size", ADAPTIVE, ids=str)
@pytest.mark.parametrize("kind", ["max", "mean"])
def test_adaptive_pool_against_torch(kind, out, size):
    layer = (nn.AdaptiveMaxPool if kind == "max" else nn.AdaptiveMeanPool)(out)
    x = RNG.standard_normal((2, 3, *size))
    compare(layer, lambda x: TORCH_ADAPTIVE[kind, len(out)](x, out), x)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("kind", ["max", "mean"])
def test_global_pool_against_torch(kind, rank):
    layer = nn.GlobalMaxPool() if kind == "max" else nn.GlobalMeanPool()
    compare(layer, lambda x: TORCH_ADAPTIVE[kind, rank](x, (1,) * rank), image(rank))


# --- on the backend under test: one case of each kind, the layer placed there
def test_layers_on_the_backend_against_torch(backend):
    cases = [
        (nn.Conv((3,), 4, 2, pad=(2, 1), pad_mode="reflect", rng=RNG),
         lambda x, w, b: F.conv1d(F.pad(x, (2, 1), mode="reflect"), w, b), ("weight", "bias")),
        (nn.ConvTranspose((2, 2, 2), 4, 2, stride=2, rng=RNG),
         lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2), ("weight", "bias")),
        (nn.MeanPool((3, 3), stride=2, pad=1, ceil_mode=True, count_include_pad=False),
         lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), ()),
        (nn.MaxPool((2, 2, 2), dilation=2, ceil_mode=True),
         lambda x: F.max_pool3d(x, 2, dilation=2, ceil_mode=True), ()),
        (nn.AdaptiveMeanPool((3, 2)), lambda x: F.adaptive_avg_pool2d(x, (3, 2)), ()),
        (nn.GlobalMaxPool(), lambda x: x.amax(dim=(2,), keepdim=True), ()),
    ]  # fmt: skip
    sizes = [(9,), (3, 3, 2), (7, 6), (5, 6, 4), (7, 6), (9,)]
    for (layer, theirs, params), size in zip(cases, sizes):
        layer = nn.place(layer, xp=backend.xp, device=backend.device, dtype="float64")
        compare(layer, theirs, RNG.standard_normal((2, 4, *size)), params, backend)


# --- what every layer does: save and load, pickle, place, compile (bit for bit)
def _model(rng):
    return nn.Chain(
        nn.Conv((3,), 2, 4, nn.leakyrelu, pad="same", pad_mode="circular", rng=rng, **F64),
        nn.MaxPool((2,), ceil_mode=True),
        nn.Conv((2,), 4, 4, pad=(1, 0), dilation=2, rng=rng, **F64),
        nn.MeanPool((3,), stride=2, pad=1, count_include_pad=False, ceil_mode=True),
        nn.AdaptiveMaxPool((3,)),
        nn.GlobalMeanPool(),
        nn.Flatten(),
    )


def test_a_model_saves_loads_pickles_and_moves(tmp_path):
    model = _model(np.random.default_rng(1))
    x = RNG.standard_normal((3, 2, 11))
    nn.save(tmp_path / "m.npz", model)
    loaded = nn.load(tmp_path / "m.npz", _model(np.random.default_rng(2)))
    copied = pickle.loads(pickle.dumps(model))
    moved = nn.place(model, xp="torch", device=torch.device("cpu"))
    assert isinstance(moved.layers[0].weight, torch.Tensor)
    for other in (loaded, copied):
        assert repr(other) == repr(model)
        assert np.array_equal(tg.data(other(x)), tg.data(model(x)))
    close(tg.data(model(x)), moved(torch.as_tensor(x)))


def test_a_model_compiles_bit_for_bit():
    from compiling import differential

    model = _model(np.random.default_rng(1))
    f = lambda m, x: tg.sum(m(x) ** 2)
    inputs = [(model, RNG.standard_normal((3, 2, 11))) for _ in range(3)]
    assert differential(f, inputs, "Conv") == "replayed"


def test_reprs():
    assert repr(nn.Conv((3,), 2, 4, pad=(1, 0))) == "Conv((3,), 2 => 4, pad=(1, 0))"
    assert repr(nn.Conv((2, 2), 2, 4, pad="same")) == "Conv((2, 2), 2 => 4, pad=(0, 1, 0, 1))"
    assert repr(nn.MaxPool((2, 2, 2), dilation=2)) == "MaxPool((2, 2, 2), dilation=(2, 2, 2))"
    assert repr(nn.MeanPool((3,), count_include_pad=False)) == (
        "MeanPool((3,), count_include_pad=False)"
    )
    assert repr(nn.AdaptiveMeanPool((3, None))) == "AdaptiveMeanPool((3, None))"
    assert repr(nn.GlobalMaxPool()) == "GlobalMaxPool()"


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"expects \(batch, 4, length\)"):
        nn.Conv((3,), 4, 2)(np.ones((2, 4, 5, 5)))
    with pytest.raises(ValueError, match=r"reflect padding of \(3, 3\) needs an input of size"):
        nn.Conv((3,), 1, 1, pad=3, pad_mode="reflect")(np.ones((1, 1, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"expects \(batch, channels, depth, height, width\)"):
        nn.MaxPool((2, 2, 2))(np.ones((1, 1, 4, 4)))
    with pytest.raises(ValueError, match=r"expects \(batch, channels, length\)"):
        nn.AdaptiveMaxPool((2,))(np.ones((1, 4)))
    with pytest.raises(ValueError, match=r"expects \(batch, channels, \*spatial\)"):
        nn.GlobalMeanPool()(np.ones((1, 4)))
    with pytest.raises(ValueError, match=r"smaller than the window \(3,\)"):
        nn.MaxPool((3,))(np.ones((1, 1, 2)))
