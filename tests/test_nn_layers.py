"""Layers, activations, initialisers and saving: parameters created on the backend's device,
forwards against NumPy references, gradients by gradcheck (float64), and clear errors."""

import dataclasses

import numpy as np
import pytest
from helpers import check, check_like, check_nested, numpy_of, uniform

import tracker_gpu as tg
from tracker_gpu import nn


def placed(backend):
    """Keywords that create a layer's parameters on the backend, in float64."""
    return dict(xp=backend.xp, device=backend.device, dtype="float64")


def rng(seed=0):
    return np.random.default_rng(seed)


def same_library_and_device(backend, a):
    assert type(a) is type(backend.asarray(np.zeros(1)))
    assert tg.backend.device_of(a) == backend.device


# --- creation and placement
def test_layers_create_parameters_on_the_chosen_library_device_and_dtype(backend):
    layers = [
        nn.Dense(3, 2, rng=rng(), xp=backend.xp, device=backend.device),
        nn.Conv((3, 3), 2, 4, rng=rng(), xp=backend.xp, device=backend.device),
        nn.Embedding(5, 3, rng=rng(), xp=backend.xp, device=backend.device),
        nn.LayerNorm(3, xp=backend.xp, device=backend.device),
        nn.BatchNorm(3, momentum=None, xp=backend.xp, device=backend.device),  # and its count
        nn.InstanceNorm(3, affine=True, track_stats=True, xp=backend.xp, device=backend.device),
    ]
    arrays = [(k, a) for layer in layers for k, a in nn._parameters(layer).items()]
    assert len(arrays) == 16
    for name, a in arrays:
        same_library_and_device(backend, a)
        assert a.dtype == (backend.xp.int64 if name == "count" else backend.xp.float32)
    dense = nn.Dense(3, 2, rng=rng(), **placed(backend))
    assert dense.weight.dtype == dense.bias.dtype == backend.xp.float64


def test_the_device_alone_picks_the_library(backend):
    if backend.xp is np:
        pytest.skip("NumPy is the default library")
    if backend.name == "dask":
        pytest.skip("the device alone cannot pick Dask: its device is NumPy's 'cpu' too")
    dense = nn.Dense(3, 2, rng=rng(), device=backend.device)
    same_library_and_device(backend, dense.weight)


def test_libraries_by_name():
    dense = nn.Dense(3, 2, rng=rng(), xp="numpy", dtype=np.float64)
    assert isinstance(dense.weight, np.ndarray) and dense.weight.dtype == np.float64
    with pytest.raises(ValueError, match="unknown array library 'jax'"):
        nn.Dense(3, 2, xp="jax")


def test_glorot_uniform_as_in_flux():
    w = nn.glorot_uniform(rng(), (200, 300))
    limit = np.sqrt(6 / 500)
    assert np.abs(w).max() <= limit and np.abs(w).max() > 0.99 * limit
    assert np.isclose(w.var(), limit**2 / 3, rtol=0.05)
    conv = nn.glorot_uniform(rng(), (8, 4, 3, 3))  # fans: 4 * 9 in, 8 * 9 out
    assert np.abs(conv).max() <= np.sqrt(6 / (36 + 72))
    assert np.isclose(nn.kaiming_normal(rng(), (400, 500)).std(), np.sqrt(2 / 500), rtol=0.05)
    assert np.isclose(nn.glorot_normal(rng(), (400, 500)).std(), np.sqrt(2 / 900), rtol=0.05)


def test_the_same_seed_gives_the_same_model_on_every_backend(backend):
    here = nn.Dense(4, 3, rng=rng(7), **placed(backend))
    there = nn.Dense(4, 3, rng=rng(7), dtype="float64")
    assert np.array_equal(numpy_of(backend, here.weight), there.weight)


def test_layers_wrap_given_arrays(backend):
    w, b = backend.asarray(np.ones((2, 3))), backend.asarray(np.zeros(2))
    dense = nn.Dense(weight=w, bias=b, activation=nn.relu)
    assert dense.weight is w and dense.bias is b
    assert nn.Dense(weight=w, bias=False).bias is None
    assert dataclasses.replace(dense, activation=None).weight is w
    assert repr(dense) == "Dense(3 => 2, relu)"


# --- the gradient has the model's shape
def test_gradient_of_a_model_has_its_structure(backend):
    model = nn.Chain(
        nn.Dense(4, 5, nn.tanh, rng=rng(), **placed(backend)),
        nn.LayerNorm(5, **placed(backend)),
        nn.Dense(5, 2, rng=rng(1), **placed(backend)),
    )
    x = backend.asarray(uniform((3, 4), (-1, 1)))
    val, (g,) = tg.withgradient(lambda m: tg.sum(m(x) ** 2), model)
    assert type(g) is nn.Chain and type(g.layers[1]) is nn.LayerNorm
    assert g.layers[0].activation is None and g.layers[1].eps is None
    for path, param in nn._parameters(model).items():
        check_like(backend, nn._parameters(g)[path], param)


# --- dense, chain and activations
def test_dense_gradcheck(backend):
    w = backend.asarray(uniform((3, 4), (-1, 1)))
    b = backend.asarray(uniform((3,), (-1, 1), 1))
    x = backend.asarray(uniform((2, 4), (-1, 1), 2))
    check(backend, lambda w, b, x: nn.Dense(weight=w, bias=b, activation=nn.tanh)(x), w, b, x)
    x3 = backend.asarray(uniform((2, 2, 4), (-1, 1), 3))  # leading axes beyond the batch
    check(backend, lambda w, b, x: nn.Dense(weight=w, bias=b)(x), w, b, x3)
    x1 = backend.asarray(uniform((4,), (-1, 1), 4))  # a single sample
    check(backend, lambda w, b, x: nn.Dense(weight=w, bias=b)(x), w, b, x1)
    check_nested(backend, lambda w: nn.Dense(weight=w, bias=b, activation=nn.tanh)(x), w)


def test_dense_forward_matches_numpy(backend):
    layer = nn.Dense(4, 3, nn.relu, rng=rng(), **placed(backend))
    x = uniform((5, 4), (-1, 1))
    w, b = numpy_of(backend, layer.weight), numpy_of(backend, layer.bias)
    expected = np.maximum(x @ w.T + b, 0)
    assert np.allclose(numpy_of(backend, layer(backend.asarray(x))), expected)


def test_dense_casts_its_input_to_its_dtype(backend):
    layer = nn.Dense(2, 2, rng=rng(), xp=backend.xp, device=backend.device)  # float32
    y = layer(backend.asarray(np.ones((1, 2))))  # float64 input
    assert y.dtype == backend.xp.float32


def test_chain_applies_layers_and_functions_in_turn(backend):
    model = nn.Chain(nn.Dense(3, 4, rng=rng(), **placed(backend)), nn.relu, nn.flatten)
    assert len(model) == 3 and model[1] is nn.relu and len(model[:2]) == 2
    x = backend.asarray(uniform((2, 3), (-1, 1)))
    assert np.allclose(numpy_of(backend, model(x)), numpy_of(backend, nn.relu(model[0](x))))
    assert repr(model) == "Chain(Dense(3 => 4), relu, flatten)"


ACTIVATIONS = [
    nn.relu,
    nn.sigmoid,
    nn.tanh,
    nn.leakyrelu,
    nn.elu,
    nn.selu,
    nn.celu,
    nn.gelu,
    nn.swish,
    nn.mish,
    nn.softplus,
    nn.logsigmoid,
    nn.softsign,
    nn.hardtanh,
    nn.relu6,
]


@pytest.mark.parametrize("f", ACTIVATIONS, ids=lambda f: f.__name__)
def test_activation_gradcheck(backend, f):
    # away from the kinks at 0, +-1 and 6
    x = uniform((7,), ((-7.5, -1.2), (-0.8, -0.1), (0.1, 0.8), (1.2, 5.5), (6.5, 8.0)))
    check(backend, f, backend.asarray(x))


def test_activation_values():
    x = np.array([-30.0, -1.0, 0.0, 2.0, 40.0])
    sig = 1 / (1 + np.exp(-x))
    assert np.allclose(nn.softplus(x), np.log1p(np.exp(x)))
    assert np.allclose(nn.logsigmoid(x), np.log(sig))
    assert np.allclose(nn.swish(x), x * sig)
    assert np.allclose(nn.elu(x), np.where(x > 0, x, np.expm1(x)))
    assert np.allclose(nn.leakyrelu(x, 0.1), np.where(x > 0, x, 0.1 * x))
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    assert np.allclose(nn.gelu(x), gelu)
    assert np.allclose(nn.relu6(x), np.clip(x, 0, 6))
    assert np.allclose(nn.softsign(x), x / (1 + np.abs(x)))


def test_elu_derivative_at_zero_is_alpha():
    (g,) = tg.gradient(lambda x: tg.sum(nn.elu(x, 0.5)), np.array([0.0]))
    assert np.allclose(g, [0.5])


# --- convolution and pooling
def conv_reference(x, w, b, stride, pad):
    """Cross-correlation by loops, in NumPy."""
    (sh, sw), (ph, pw) = stride, pad
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = (h - kh) // sh + 1, (wd - kw) // sw + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
            out[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return out + b[None, :, None, None]


CONVS = [
    dict(kernel=(3, 3), stride=1, pad=0),
    dict(kernel=(3, 3), stride=2, pad=1),
    dict(kernel=(2, 3), stride=(1, 2), pad=(1, 0)),
    dict(kernel=(3, 3), stride=1, pad="same"),
]


@pytest.mark.parametrize("config", CONVS, ids=str)
def test_conv_forward_matches_loops(backend, config):
    kernel = config["kernel"]
    layer = nn.Conv(kernel, 2, 3, stride=config["stride"], pad=config["pad"], rng=rng())
    layer = nn.place(layer, **placed(backend))
    layer = dataclasses.replace(layer, bias=backend.asarray(uniform((3,), (-1, 1))))
    x = uniform((2, 2, 5, 6), (-1, 1), 1)
    expected = conv_reference(
        x,
        numpy_of(backend, layer.weight),
        numpy_of(backend, layer.bias),
        layer.stride,
        layer.pad,
    )
    got = numpy_of(backend, layer(backend.asarray(x)))
    assert got.shape == expected.shape and np.allclose(got, expected)


@pytest.mark.parametrize("config", CONVS, ids=str)
def test_conv_gradcheck(backend, config):
    w = backend.asarray(uniform((2, 2, *config["kernel"]), (-1, 1)))
    b = backend.asarray(uniform((2,), (-1, 1), 1))
    x = backend.asarray(uniform((2, 2, 4, 5), (-1, 1), 2))

    def conv(w, b, x):
        return nn.Conv(weight=w, bias=b, stride=config["stride"], pad=config["pad"])(x)

    check(backend, conv, w, b, x)


def test_conv_second_derivative(backend):
    w = backend.asarray(uniform((2, 1, 2, 2), (-1, 1)))
    x = backend.asarray(uniform((1, 1, 3, 3), (-1, 1), 1))
    check_nested(backend, lambda w: nn.Conv(weight=w, bias=False, pad=1, activation=nn.tanh)(x), w)
    check_nested(backend, lambda x: nn.Conv(weight=w, bias=False, stride=2, pad=1)(x), x)
    w1 = backend.asarray(uniform((2, 1, 3), (-1, 1), 2))
    x1 = backend.asarray(uniform((1, 1, 5), (-1, 1), 3))
    reflect = dict(bias=False, pad=(2, 1), pad_mode="reflect", activation=nn.tanh)
    check_nested(backend, lambda x: nn.Conv(weight=w1, **reflect)(x), x1)
    check_nested(backend, lambda x: nn.MeanPool((3,), pad=1, count_include_pad=False)(x * x), x1)


IM2COL = [
    ((2, 3, 5, 4), dict(kernel=(3, 2), stride=(2, 1), pad=(1, 1))),
    ((2, 3, 7), dict(kernel=(3,), stride=(2,), pad=((2, 0),), dilation=(2,))),
    ((1, 2, 4, 5, 3), dict(kernel=(2, 3, 2), stride=(1, 2, 2), pad=((0, 1), 1, (1, 0)))),
]


@pytest.mark.parametrize("shape, kw", IM2COL, ids=str)
def test_im2col_and_col2im_are_adjoint(backend, shape, kw):
    x = uniform(shape, (-1, 1))
    cols = nn.im2col(backend.asarray(x), **kw)
    r = uniform(tuple(cols.shape), (-1, 1), 1)
    back = nn.col2im(backend.asarray(r), shape=x.shape, **kw)
    assert np.isclose(np.sum(numpy_of(backend, cols) * r), np.sum(x * numpy_of(backend, back)))


def pool_reference(x, window, stride, pad, reduce, fill):
    x = np.pad(x, ((0, 0), (0, 0), (pad[0],) * 2, (pad[1],) * 2), constant_values=fill)
    n, c, h, w = x.shape
    oh, ow = (h - window[0]) // stride[0] + 1, (w - window[1]) // stride[1] + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride[0] :, j * stride[1] :][:, :, : window[0], : window[1]]
            out[:, :, i, j] = reduce(patch, axis=(2, 3))
    return out


POOLS = [dict(window=2), dict(window=2, stride=1), dict(window=3, stride=2, pad=1)]


@pytest.mark.parametrize("config", POOLS, ids=str)
@pytest.mark.parametrize("kind", ["max", "mean"])
def test_pools_forward_and_gradcheck(backend, config, kind):
    layer = (nn.MaxPool if kind == "max" else nn.MeanPool)(**config)
    x = uniform((2, 2, 5, 4), (-1, 1))
    reduce, fill = (np.max, -np.inf) if kind == "max" else (np.mean, 0.0)
    expected = pool_reference(x, layer.window, layer.stride, layer.pad, reduce, fill)
    assert np.allclose(numpy_of(backend, layer(backend.asarray(x))), expected)
    check(backend, layer, backend.asarray(x))


def test_flatten(backend):
    x = backend.asarray(uniform((2, 3, 2, 2), (-1, 1)))
    assert tuple(nn.Flatten()(x).shape) == (2, 12)
    check(backend, nn.Flatten(), x)


# --- dropout, embedding, layer norm
def test_dropout_with_an_explicit_generator(backend):
    x = backend.asarray(np.ones((200, 50)))
    layer = nn.Dropout(0.3, rng=rng(), active=True)
    y = numpy_of(backend, layer(x))
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.02 and np.allclose(y[kept], 1 / 0.7)
    same = numpy_of(backend, nn.Dropout(0.3, rng=rng(), active=True)(x))
    assert np.array_equal(y, same)  # the same generator state gives the same mask
    check(backend, lambda x: nn.Dropout(0.5, rng=rng(), active=True)(x), x[:3, :4])


def test_dropout_modes(backend):
    x = backend.asarray(np.ones((4, 5)))
    auto = nn.Dropout(0.5, rng=rng())
    assert auto(x) is x  # a plain input: evaluation, the identity
    (g,) = tg.gradient(lambda x: tg.sum(auto(x)), x)  # a tracked input: training
    assert 0 < np.count_nonzero(numpy_of(backend, g)) < 20
    model = nn.Chain(nn.Dense(5, 5, rng=rng(), **placed(backend)), nn.Dropout(0.5, rng=rng()))
    assert nn.trainmode(model).layers[1].active is True
    assert nn.testmode(model).layers[1].active is False
    assert model.layers[1].active is None  # the model itself is not changed
    (g,) = tg.gradient(lambda x: tg.sum(nn.testmode(model)(x)), x)
    assert np.count_nonzero(numpy_of(backend, g)) == 20
    assert np.all(numpy_of(backend, nn.Dropout(1.0, active=True)(x)) == 0)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        nn.Dropout(1.5)


def test_embedding(backend):
    layer = nn.Embedding(5, 3, rng=rng(), **placed(backend))
    idx = backend.asarray(np.array([[0, 4], [4, 2]]))
    out = layer(idx)
    w = numpy_of(backend, layer.weight)
    assert np.allclose(numpy_of(backend, out), w[np.array([[0, 4], [4, 2]])])
    (g,) = tg.gradient(lambda w: tg.sum(nn.Embedding(weight=w)(idx)), layer.weight)
    assert np.allclose(numpy_of(backend, g)[:, 0], [1, 0, 1, 0, 2])  # repeats accumulate
    check(backend, lambda w: nn.Embedding(weight=w)(idx), layer.weight)
    onehot = backend.asarray(np.eye(5)[[1, 3]])
    assert np.allclose(numpy_of(backend, layer(onehot)), w[[1, 3]])
    check(backend, lambda w: nn.Embedding(weight=w)(onehot), layer.weight)


def test_layernorm(backend):
    x = uniform((3, 2, 4), (-2, 2))
    layer = nn.LayerNorm((2, 4), **placed(backend))
    mu = x.mean(axis=(1, 2), keepdims=True)
    expected = (x - mu) / np.sqrt(x.var(axis=(1, 2), keepdims=True) + 1e-5)
    assert np.allclose(numpy_of(backend, layer(backend.asarray(x))), expected)
    scale = backend.asarray(uniform((4,), (0.5, 1.5)))
    bias = backend.asarray(uniform((4,), (-1, 1), 1))
    check(
        backend,
        lambda x, s, b: nn.LayerNorm(scale=s, bias=b)(x),
        backend.asarray(x),
        scale,
        bias,
    )
    plain = nn.LayerNorm(4, affine=False)
    assert plain.scale is None and repr(plain) == "LayerNorm(4, affine=False)"


@pytest.mark.parametrize("track_stats", [False, True])
def test_batchnorm_without_scale_nor_running_statistics(backend, track_stats):
    """affine=False with track_stats=False has no array to take a dtype from: the input's is
    kept (issue 30: it raised AttributeError)."""
    x = uniform((4, 3, 2), (-2, 2))
    layer = nn.BatchNorm(3, affine=False, track_stats=track_stats, **placed(backend))
    mu, var = x.mean(axis=(0, 2), keepdims=True), x.var(axis=(0, 2), keepdims=True)
    expected = (x - mu) / np.sqrt(var + 1e-5)  # the batch's statistics: training, or none kept
    got = tg.withgradient(lambda x: tg.sum(layer(x)), backend.asarray(x)).val
    assert np.isclose(float(got), expected.sum(), atol=1e-9)
    if not track_stats:
        assert layer.scale is None and layer.running_mean is None
        assert np.allclose(numpy_of(backend, layer(backend.asarray(x))), expected)
        check(backend, layer, backend.asarray(x))


# --- saving and loading
def test_save_and_load_round_trip(backend, tmp_path):
    model = nn.Chain(
        nn.Conv((3, 3), 1, 2, nn.relu, rng=rng(), xp=backend.xp, device=backend.device),
        nn.Flatten(),
        nn.Dense(2, 3, rng=rng(1), xp=backend.xp, device=backend.device),
    )
    path = tmp_path / "model.npz"
    nn.save(path, model)
    saved = nn.load(path)
    assert sorted(saved) == ["layers.0.bias", "layers.0.weight", "layers.2.bias", "layers.2.weight"]
    on_numpy = nn.load(path, model, xp="numpy")
    assert isinstance(on_numpy.layers[0].weight, np.ndarray)
    assert on_numpy.layers[0].weight.dtype == np.float32
    back = nn.load(path, on_numpy, xp=backend.xp, device=backend.device)
    like = nn.load(path, model)  # each array where the model's is
    for loaded in (back, like):
        for key, a in nn._parameters(loaded).items():
            same_library_and_device(backend, a)
            assert np.array_equal(numpy_of(backend, a), saved[key])
    x = backend.asarray(uniform((2, 1, 3, 3), (-1, 1)).astype(np.float32))
    assert np.allclose(numpy_of(backend, back(x)), numpy_of(backend, model(x)))
    assert back.layers[0].activation is nn.relu


def test_torch_tensors_to_npz_to_numpy_and_back(tmp_path):
    torch = pytest.importorskip("torch")
    model = nn.Dense(3, 2, nn.tanh, rng=rng(), xp="torch", device=torch.device("cpu"))
    assert isinstance(model.weight, torch.Tensor)
    nn.save(tmp_path / "m.npz", model)
    on_numpy = nn.load(tmp_path / "m.npz", model, xp="numpy")
    assert isinstance(on_numpy.weight, np.ndarray)
    assert np.array_equal(on_numpy.weight, model.weight.numpy())
    back = nn.load(tmp_path / "m.npz", on_numpy, device=torch.device("cpu"))
    assert isinstance(back.weight, torch.Tensor) and torch.equal(back.weight, model.weight)


def test_place_moves_a_model(backend):
    model = nn.Dense(3, 2, rng=rng(), dtype="float64")
    moved = nn.place(model, xp=backend.xp, device=backend.device, dtype="float32")
    same_library_and_device(backend, moved.weight)
    assert moved.weight.dtype == backend.xp.float32
    assert np.allclose(numpy_of(backend, moved.weight), model.weight)


LIBRARIES = ["numpy", "torch", "strict"]


@pytest.mark.parametrize(
    ("source", "target"), [(a, b) for a in LIBRARIES for b in LIBRARIES if a != b]
)
def test_a_model_placed_in_another_library_shares_no_memory_with_its_source(source, target):
    """A BatchNorm writes its running statistics in place: placed on PyTorch from NumPy, its
    arrays were the NumPy ones (torch.asarray shares host memory), and training either copy
    changed the other's."""
    original = nn.place(nn.BatchNorm(3, dtype="float64"), xp=source)
    moved = nn.place(original, xp=target)
    nn.trainmode(moved)
    x = nn.asarray(np.random.default_rng(0).standard_normal((8, 3)), xp=target)
    tg.withgradient(lambda m: tg.sum(m(x) ** 2), moved)
    assert np.any(nn.to_numpy(moved.running_mean) != 0)
    assert np.array_equal(nn.to_numpy(original.running_mean), np.zeros(3))
    assert np.array_equal(nn.to_numpy(original.running_var), np.ones(3))


def test_load_refuses_a_different_model(tmp_path):
    nn.save(tmp_path / "m.npz", nn.Dense(3, 2, rng=rng()))
    with pytest.raises(ValueError, match=r"weight has shape \(2, 3\).*\(4, 3\) in the model"):
        nn.load(tmp_path / "m.npz", nn.Dense(3, 4, rng=rng()))
    with pytest.raises(ValueError, match=r"missing \['layers.0.bias'"):
        nn.load(tmp_path / "m.npz", nn.Chain(nn.Dense(3, 2)))


# --- bad input
def test_wrong_input_shapes_are_clear_errors(backend):
    x = backend.asarray(np.ones((2, 5)))
    with pytest.raises(ValueError, match=r"Dense\(4 => 3\) expects 4 features .* shape \(2, 5\)"):
        nn.Dense(4, 3)(x)
    conv = nn.Conv((3, 3), 2, 4)
    with pytest.raises(ValueError, match=r"expects \(batch, 2, height, width\).*\(2, 5\)"):
        conv(x)
    with pytest.raises(ValueError, match=r"\(2, 2\) is smaller than the window \(3, 3\)"):
        conv(backend.asarray(np.ones((1, 2, 2, 2), dtype=np.float32)))
    with pytest.raises(ValueError, match=r"MaxPool\(\(2, 2\)\) expects \(batch, channels"):
        nn.MaxPool(2)(x)
    with pytest.raises(ValueError, match=r"LayerNorm\(3\) expects trailing axes \(3,\)"):
        nn.LayerNorm(3)(x)
    embedding = nn.Embedding(4, 2, xp=backend.xp, device=backend.device)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 3\], got .* to 4"):
        embedding(backend.asarray(np.array([0, 4])))
    with pytest.raises(ValueError, match="integer indices or one-hot"):
        embedding(x)


def test_bad_layer_settings():
    with pytest.raises(TypeError, match=r"Dense needs its sizes"):
        nn.Dense(3)
    with pytest.raises(ValueError, match="stride must be an int or a tuple of 2 ints"):
        nn.Conv((3, 3), 1, 1, stride=(1, 2, 3))
    with pytest.raises(ValueError, match='pad must be "same", "valid" or sizes'):
        nn.Conv((2, 2), 1, 1, pad="full")
    with pytest.raises(ValueError, match=r"pad must be an int or a tuple of 1 ints"):
        nn.Conv((3,), 1, 1, pad=(1, 2, 3))
    with pytest.raises(ValueError, match=r"kernel must be a tuple with one size per spatial"):
        nn.Conv((), 1, 1)
    with pytest.raises(ValueError, match="pad_mode must be one of zeros, reflect"):
        nn.Conv((3,), 1, 1, pad_mode="mirror")
    with pytest.raises(ValueError, match=r"output sizes must be ints >= 1 or None"):
        nn.AdaptiveMeanPool((0, 2))
    with pytest.raises(ValueError, match="padding must be smaller than the window"):
        nn.MaxPool(2, pad=2)


def test_gelus_half_gradient_past_where_its_square_overflows():
    """x * x overflows float16 from |x| = 256, and the pullback's 0 * inf was nan where the
    slope is 1 or 0 (a --precision 16 run then skipped every step); PyTorch's is the
    reference, computed in float32 and rounded once."""
    torch = pytest.importorskip("torch")
    values = [256.0, 300.0, -300.0, 60000.0, 1.0, -2.0, 0.0]
    _, back = tg.forward(nn.gelu, np.array(values, np.float16))
    (g,) = back(np.ones(len(values), np.float16))
    t = torch.tensor(values, requires_grad=True)
    torch.nn.functional.gelu(t, approximate="tanh").sum().backward()
    assert g.dtype == np.float16
    np.testing.assert_array_equal(g, t.grad.numpy().astype(np.float16))


# the sizes of a small layer, by their arguments' names
SIZES = {"n_in": 3, "n_out": 2, "kernel": (3,), "in_channels": 2, "out_channels": 2, "vocab": 5,
         "dim": 4, "size": 4, "channels": 4, "nheads": 2, "groups": 2, "affine": True}  # fmt: skip


def _layers_with_a_dtype():
    import inspect

    found = []
    for name in nn.__all__:
        cls = getattr(nn, name)
        if isinstance(cls, type) and "dtype" in inspect.signature(cls.__init__).parameters:
            params = inspect.signature(cls.__init__).parameters
            found.append(
                pytest.param(cls, {k: v for k, v in SIZES.items() if k in params}, id=name)
            )
    return found


@pytest.mark.parametrize("cls, sizes", _layers_with_a_dtype())
@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "uint8"])
def test_a_layer_made_or_placed_in_a_dtype_that_is_not_floating_is_refused(cls, sizes, dtype):
    """Glorot weights cast to int32 were zeros and -1s, which no gradient trains (integer
    arrays are data); `nn.load` already refused such a cast."""
    made = cls(**sizes, dtype="float32")
    assert nn._parameters(made)  # every such layer has floating arrays
    with pytest.raises(ValueError, match=r"would be truncated|not a real floating dtype"):
        cls(**sizes, dtype=dtype)
    with pytest.raises(ValueError, match=r"place casts the model's real floating arrays"):
        nn.place(made, dtype=dtype)


def test_a_layers_rng_may_be_a_seed():
    a, b = nn.Dense(3, 2, rng=7), nn.Dense(3, 2, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a.weight, b.weight)
    drop = nn.trainmode(nn.Dropout(0.5, rng=3))
    np.testing.assert_array_equal(
        drop(np.ones(64)), nn.trainmode(nn.Dropout(0.5, rng=3))(np.ones(64))
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda b: nn.Dense(weight=np.ones((2, 3)), bias=b),
        lambda b: nn.Conv(weight=np.ones((2, 3, 3)), bias=b),
        lambda b: nn.RNNCell(Wi=np.ones((2, 3)), Wh=np.ones((2, 2)), bias=b),
    ],
    ids=["Dense", "Conv", "RNNCell"],
)
@pytest.mark.parametrize("bias", [np.ones((4, 1)), np.ones(3), np.ones((1, 2)), [0.0, 0.0]])
def test_a_bias_given_of_another_shape_is_refused_when_the_layer_is_made(make, bias):
    """A (4, 1) bias of a 2-output layer was added per sample when the batch was 4, silently."""
    with pytest.raises(ValueError, match=r"a bias of 2 outputs has shape \(2,\), got"):
        make(bias)


@pytest.mark.parametrize("weight", [np.ones(3), np.ones(()), np.ones((2, 3, 1)), [[1.0, 2.0]]])
def test_a_dense_weight_that_is_not_a_matrix_is_refused(weight):
    with pytest.raises(ValueError, match=r"Dense\(weight=W\) takes a matrix"):
        nn.Dense(weight=weight)


@pytest.mark.parametrize("given", [[[1.0, 2.0, 3.0]], None, "x", 3.0])
def test_a_layer_given_what_is_not_an_array_says_so(given):
    """It said "got an input of shape ()" of a list."""
    with pytest.raises(TypeError, match=r"expects an array of 3 features .* got a \w+; convert"):
        nn.Dense(3, 2)(given)


def test_a_layer_given_an_array_of_another_library_says_which():
    """A torch tensor for a NumPy model failed in torch's `to()`; the other way round NumPy
    could not interpret torch.float32."""
    torch = pytest.importorskip("torch")
    model = nn.Dense(3, 2)
    with pytest.raises(TypeError, match=r"cannot mix arrays of numpy and torch"):
        model(torch.ones(4, 3))
    with pytest.raises(TypeError, match=r"cannot mix arrays of torch and numpy"):
        nn.place(model, xp="torch")(np.ones((4, 3), np.float32))


@pytest.mark.parametrize("cls", [nn.BatchNorm, nn.InstanceNorm])
@pytest.mark.parametrize(
    "given, problem",
    [
        ({"momentum": float("nan")}, "momentum must be a number in"),
        ({"momentum": -0.5}, "momentum must be a number in"),
        ({"momentum": 2}, "momentum must be a number in"),
        ({"eps": -1e-5}, "eps must be a finite number >= 0"),
        ({"eps": float("inf")}, "eps must be a finite number >= 0"),
        ({"running_mean": np.zeros(2, np.float32)}, "give running_mean and running_var together"),
    ],
)
def test_a_norms_running_settings_are_checked_when_it_is_made(cls, given, problem):
    """A nan momentum made every running statistic nan at the first step, silently."""
    with pytest.raises(ValueError, match=rf"{cls.__name__}: {problem}"):
        cls(2, track_stats=True, **given) if cls is nn.InstanceNorm else cls(2, **given)


INTEGER_INPUTS = ["int8", "int16", "int64", "uint8", "bool"]
NORMS = {
    "LayerNorm": lambda: nn.LayerNorm(4, dtype="float64"),
    "LayerNorm without affine": lambda: nn.LayerNorm(4, affine=False),
    "GroupNorm": lambda: nn.GroupNorm(2, 1, affine=False),
    "InstanceNorm": lambda: nn.InstanceNorm(2),
    "BatchNorm without statistics": lambda: nn.BatchNorm(2, affine=False, track_stats=False),
}


@pytest.mark.parametrize("dtype", INTEGER_INPUTS)
@pytest.mark.parametrize("name", NORMS)
def test_a_norm_of_integers_is_the_norm_of_their_values(name, dtype):
    """Integers normalise to floats: cast back to the input's dtype, they were rounded to -1, 0
    and 1 (and a LayerNorm's scale got the gradient of the rounded values)."""
    x = np.array([[[1, 2, 3, 4], [0, 5, 1, 1]], [[2, 2, 0, 7], [3, 1, 4, 1]]]).astype(dtype)
    if name.startswith("LayerNorm"):
        x = x.reshape(-1, 4)
    got = NORMS[name]()(x)
    expected = NORMS[name]()(x.astype(np.float64))
    assert np.asarray(got).dtype.kind == "f"
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-12, atol=1e-12)


POOLS = {
    "MaxPool padded": lambda: nn.MaxPool((3,), pad=1),
    "MaxPool ceil_mode": lambda: nn.MaxPool((2,), ceil_mode=True),
    "MeanPool ceil_mode": lambda: nn.MeanPool((2,), ceil_mode=True),
    "MeanPool padding not counted": lambda: nn.MeanPool((3,), pad=1, count_include_pad=False),
}


@pytest.mark.parametrize("dtype", INTEGER_INPUTS)
@pytest.mark.parametrize("name", POOLS)
def test_a_pool_of_integers_is_the_pool_of_their_values(name, dtype):
    """A maximum's padding of int8 or int16 was -inf cast to 0, above every negative element;
    a mean's counts of a bool input were all True (window sums, not means)."""
    x = np.array([[[-5, -3, 7, -2, -9]], [[4, 0, 1, 1, 2]]]).astype(dtype)
    got, expected = POOLS[name]()(x), POOLS[name]()(x.astype(np.float64))
    if name.startswith("MaxPool"):
        assert got.dtype == x.dtype
        expected = expected.astype(x.dtype)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
