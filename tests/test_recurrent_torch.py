"""The recurrent layers' options against PyTorch with the same weights, in float64: RNN, LSTM
and GRU, one or two layers, one or two directions, batch-first or time-major, whole sequences
or sequences of their own lengths (PyTorch's packed sequences), with and without a given
state; forward outputs, last states, and the gradients of the input, the initial state and
every parameter. Then masks, dropout between layers, and what every layer must keep doing
(saving, pickling, placing, tg.compile)."""

import copy
import itertools
import pickle
import warnings

import numpy as np
import pytest
from helpers import numpy_of, uniform

import tracker_gpu as tg
from tracker_gpu import nn

torch = pytest.importorskip("torch", reason="the reference is PyTorch: pip install torch")
packing = torch.nn.utils.rnn

KINDS = {
    "RNN": (nn.RNN, torch.nn.RNN),
    "LSTM": (nn.LSTM, torch.nn.LSTM),
    "GRU": (nn.GRU, torch.nn.GRU),
}
FIELDS = {"Wi": "weight_ih", "Wh": "weight_hh", "bias": "bias_ih", "bias_h": "bias_hh"}
BATCH, STEPS, N_IN, N_OUT = 3, 5, 3, 4
LENGTHS = [5, 2, 4]  # one whole sequence, two shorter, not sorted


class Numpy:
    """The NumPy backend, for the tests that enumerate options (the fixture's runs are few)."""

    xp, device = np, "cpu"

    @staticmethod
    def asarray(a):
        return np.asarray(a, dtype=np.float64)

    @staticmethod
    def to_numpy(a):
        return np.asarray(tg.data(a))


def torch_names(layer):
    """Our parameter paths to PyTorch's names: cell `i` of `(layer.cell, *layer.cells)` is
    layer `i // directions`, reversed when `i` is odd in a bidirectional layer."""
    directions = 2 if layer.bidirectional else 1
    paths = ["cell"] + [f"cells.{j}" for j in range(len(layer.cells))]
    names = {}
    for i, path in enumerate(paths):
        suffix = f"_l{i // directions}" + ("_reverse" if i % directions else "")
        names.update({f"{path}.{ours}": theirs + suffix for ours, theirs in FIELDS.items()})
    return names


def build(backend, kind, seed=0, bias_h=True, **options):
    """Our layer (biases drawn, so that they matter) and PyTorch's with the same weights."""
    ours, theirs = KINDS[kind]
    placed = dict(xp=backend.xp, device=backend.device, dtype="float64")
    layer = ours(N_IN, N_OUT, bias_h=bias_h, rng=np.random.default_rng(seed), **placed, **options)
    layer = tg.optim.tree_map_with_path(
        lambda path, x: (
            backend.asarray(uniform(tuple(x.shape), (-1, 1), seed + len(path)))
            if tg.backend.is_array(x) and len(x.shape) == 1
            else x
        ),
        layer,
    )
    torch_options = {"batch_first": True, **options}  # ours is batch-first by default
    torch_options.pop("return_state", None)
    module = theirs(N_IN, N_OUT, **torch_options).double()
    names, params = torch_names(layer), nn._parameters(layer)
    with torch.no_grad():
        for name, tensor in module.named_parameters():
            ours_path = next((p for p, n in names.items() if n == name), None)
            value = params.get(ours_path)
            tensor.copy_(torch.zeros_like(tensor) if value is None else torch.tensor(
                numpy_of(backend, value)))  # fmt: skip
    return layer, module


def torch_run(module, x, h0, lengths, batch_first):
    """PyTorch's outputs and last state, through a packed sequence when lengths are given."""
    if lengths is None:
        return module(x, h0)
    packed = packing.pack_padded_sequence(
        x, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False
    )
    out, last = module(packed, h0)
    out, _ = packing.pad_packed_sequence(out, batch_first=batch_first, total_length=STEPS)
    return out, last


def as_tuple(state):
    return state if isinstance(state, tuple) else (state,)


def against_torch(backend, kind, *, lengths=None, with_state=False, bias_h=True, padding=None,
                  **options):  # fmt: skip
    """Forward, last state and every gradient of our layer against PyTorch's; `padding`, a
    value written past each sequence's length (never read by either)."""
    layer, module = build(backend, kind, bias_h=bias_h, return_state=True, **options)
    batch_first = options.get("batch_first", True)
    count = 1 + len(layer.cells)  # cells: PyTorch's layers * directions
    shape = (BATCH, STEPS, N_IN) if batch_first else (STEPS, BATCH, N_IN)
    x = uniform(shape, (-1, 1), 1)
    for i, n in enumerate(lengths if padding is not None else ()):
        x[(i, slice(n, None)) if batch_first else (slice(n, None), i)] = padding
    parts = 2 if kind == "LSTM" else 1
    h0 = [uniform((count, BATCH, N_OUT), (-1, 1), 2 + i) for i in range(parts)]
    ours_h0 = [h[0] if count == 1 else h for h in h0]  # one cell: the cell's state, (batch, out)

    tensors = {n: t for n, t in module.named_parameters()}
    x_t = torch.tensor(x, requires_grad=True)
    h0_t = [torch.tensor(h, requires_grad=True) for h in h0]
    given = (tuple(h0_t) if parts == 2 else h0_t[0]) if with_state else None
    out_t, last_t = torch_run(module, x_t, given, lengths, batch_first)
    last_t = as_tuple(last_t)
    w_out = uniform(tuple(out_t.shape), (0.5, 1.5), 3)
    w_last = [uniform(tuple(s.shape), (0.5, 1.5), 4 + i) for i, s in enumerate(last_t)]
    loss_t = (out_t * torch.tensor(w_out)).sum()
    loss_t = loss_t + sum((s * torch.tensor(w)).sum() for s, w in zip(last_t, w_last))
    loss_t.backward()

    def loss(m, x, *h):
        state = None if not with_state else (h if parts == 2 else h[0])
        y, last = m(x, state, lengths=lengths)
        last = [s if count > 1 else s[None] for s in as_tuple(last)]
        total = tg.sum(y * backend.asarray(w_out))
        for s, w in zip(last, w_last):
            total = total + tg.sum(s * backend.asarray(w))
        return total, (tg.data(y), tuple(tg.data(s) for s in last))

    args = [backend.asarray(a) for a in (x, *ours_h0)]
    (_, (y, last)), grads = tg.withgradient(loss, layer, *args)
    close = lambda a, t: np.testing.assert_allclose(
        numpy_of(backend, a), t.detach().numpy(), rtol=0, atol=1e-11, strict=True
    )
    close(y, out_t)
    for s, t in zip(last, last_t):
        close(s, t)
    close(grads[1], x_t.grad)
    for g, t in zip(grads[2:] if with_state else (), h0_t):
        close(g, t.grad if count > 1 else t.grad[0])
    names, ours = torch_names(layer), nn._parameters(grads[0])
    assert len(ours) == (len(tensors) if bias_h else 3 * len(tensors) // 4)
    for path, g in ours.items():
        close(g, tensors[names[path]].grad)


@pytest.mark.parametrize("padding", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_padding_past_a_length_is_never_read(kind, bidirectional, padding):
    """A nan or inf past a sequence's length left the loss right and made every gradient
    nan (the cell ran on it, and a zero cotangent met it: 0 * nan)."""
    against_torch(Numpy, kind, lengths=LENGTHS, padding=padding, num_layers=2,
                  bidirectional=bidirectional)  # fmt: skip


# --- every option, on NumPy
OPTIONS = list(
    itertools.product(KINDS, [1, 2], [False, True], [True, False], [None, LENGTHS], [False, True])
)


@pytest.mark.parametrize(
    "kind, num_layers, bidirectional, batch_first, lengths, with_state",
    OPTIONS,
    ids=[
        f"{k}-{n}layers-{'bi' if b else 'uni'}-{'bf' if f else 'tm'}-"
        f"{'lengths' if ls else 'whole'}-{'state' if s else 'zeros'}"
        for k, n, b, f, ls, s in OPTIONS
    ],
)
def test_against_torch(kind, num_layers, bidirectional, batch_first, lengths, with_state):
    against_torch(
        Numpy,
        kind,
        lengths=lengths,
        with_state=with_state,
        num_layers=num_layers,
        bidirectional=bidirectional,
        batch_first=batch_first,
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_without_the_hidden_bias_is_torchs_with_a_zero_one(kind):
    against_torch(Numpy, kind, bias_h=False, lengths=LENGTHS, bidirectional=True)


def test_the_default_gru_without_b_hn_differs_from_torchs_with_it():
    """The test can fail: our GRU without `bias_h` is not PyTorch's when `b_hn` is not zero."""
    layer, module = build(Numpy, "GRU", bias_h=False)
    with torch.no_grad():
        module.bias_hh_l0.uniform_(-1, 1)
    x = uniform((BATCH, STEPS, N_IN), (-1, 1), 1)
    assert not np.allclose(np.asarray(layer(x)), module(torch.tensor(x))[0].detach().numpy())


# --- on the backend of the run: the options together (RNN's differ only in the cell)
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_on_the_backend(backend, kind):
    against_torch(
        backend,
        kind,
        lengths=LENGTHS,
        with_state=True,
        num_layers=2,
        bidirectional=True,
        batch_first=False,
    )


def test_placed_on_the_backend_with_lengths_from_numpy(backend):
    layer = options_layer("LSTM", return_state=True, batch_first=False)
    x = uniform((STEPS, BATCH, N_IN), (-1, 1), 1)
    here = layer(x, lengths=np.array(LENGTHS))
    there = nn.place(layer, xp=backend.xp, device=backend.device)(
        backend.asarray(x), lengths=np.array(LENGTHS)
    )
    for a, b in zip([here[0], *here[1]], [there[0], *there[1]]):
        assert np.allclose(np.asarray(a), numpy_of(backend, b), rtol=0, atol=1e-13)


# --- masks: a prefix mask is the lengths; a mask with holes skips the steps it masks
def test_a_prefix_mask_is_the_lengths():
    layer, _ = build(Numpy, "LSTM", num_layers=2, bidirectional=True, return_state=True)
    x = uniform((BATCH, STEPS, N_IN), (-1, 1), 1)
    mask = np.arange(STEPS)[None, :] < np.array(LENGTHS)[:, None]
    by_lengths, by_mask = layer(x, lengths=LENGTHS), layer(x, mask=mask)
    for a, b in zip([by_lengths[0], *by_lengths[1]], [by_mask[0], *by_mask[1]]):
        assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("batch_first", [True, False])
def test_a_mask_with_holes_runs_the_steps_it_keeps(batch_first):
    layer, module = build(Numpy, "GRU", bidirectional=True, batch_first=batch_first,
                          return_state=True)  # fmt: skip
    x = uniform((BATCH, STEPS, N_IN), (-1, 1), 1)
    mask = np.array([[1, 0, 1, 1, 0], [0, 1, 1, 0, 1], [1, 1, 1, 1, 1]], dtype=bool)
    swap = (lambda a: a) if batch_first else (lambda a: np.swapaxes(a, 0, 1))
    y, h = layer(swap(x), mask=swap(mask))
    y = swap(np.asarray(y))
    for b in range(BATCH):
        kept = torch.tensor(x[b][mask[b]][None] if batch_first else x[b][mask[b]][:, None])
        out, last = module(kept)
        out = out[0] if batch_first else out[:, 0]
        assert np.allclose(y[b][mask[b]], out.detach().numpy(), atol=1e-12)
        assert np.array_equal(y[b][~mask[b]], np.zeros_like(y[b][~mask[b]]))
        assert np.allclose(np.asarray(h)[:, b], last[:, 0].detach().numpy(), atol=1e-12)


def test_a_sequence_of_length_zero_keeps_its_state_and_outputs_zeros():
    layer = nn.LSTM(2, 3, rng=np.random.default_rng(0), return_state=True, dtype="float64")
    x, h0 = (
        uniform((2, 4, 2), (-1, 1), 1),
        (uniform((2, 3), (-1, 1), 2), uniform((2, 3), (-1, 1), 3)),
    )
    y, (h, c) = layer(x, h0, lengths=np.array([0, 4]))
    assert np.array_equal(np.asarray(y)[0], np.zeros((4, 3)))
    assert np.array_equal(np.asarray(h)[0], h0[0][0]) and np.array_equal(np.asarray(c)[0], h0[1][0])
    whole = layer(x[1:], (h0[0][1:], h0[1][1:]))
    assert np.allclose(np.asarray(y)[1], np.asarray(whole[0])[0], atol=1e-15)


# --- dropout between layers: in training only
def test_dropout_of_one_in_training_is_torchs_in_training():
    """In training (inside a gradient: the automatic mode), as PyTorch's `train()`."""
    layer, module = build(Numpy, "LSTM", num_layers=2, dropout=1.0)
    x = uniform((BATCH, STEPS, N_IN), (-1, 1), 1)
    x_t = torch.tensor(x, requires_grad=True)
    out = module.train()(x_t)[0]
    out.sum().backward()
    value, (g_layer, g_x) = tg.withgradient(lambda m, x: tg.sum(m(x)), layer, x)
    assert np.isclose(float(value), out.sum().item(), rtol=0, atol=1e-11)
    assert np.allclose(np.asarray(g_x), x_t.grad.numpy(), rtol=0, atol=1e-11)
    names, tensors = torch_names(layer), dict(module.named_parameters())
    for path, g in nn._parameters(g_layer).items():
        assert np.allclose(g, tensors[names[path]].grad.numpy(), rtol=0, atol=1e-11), path
    evaluated = module.eval()(x_t)[0].detach().numpy()
    assert not np.allclose(out.detach().numpy(), evaluated)  # the dropout mattered


@pytest.mark.parametrize("bidirectional", [False, True])
def test_dropout_draws_from_the_layers_generator_between_layers(bidirectional):
    """Our masks predicted from a copy of the generator, applied by hand between PyTorch's
    single layers: the dropout sits between layers, scaled by 1 / (1 - p), never after the
    last."""
    p, directions = 0.4, 2 if bidirectional else 1
    layer, module = build(Numpy, "GRU", num_layers=3, bidirectional=bidirectional, dropout=p)
    draws = copy.deepcopy(layer.dropout.rng)
    x = uniform((BATCH, STEPS, N_IN), (-1, 1), 1)
    w = uniform((BATCH, STEPS, directions * N_OUT), (0.5, 1.5), 2)
    weighted = lambda y: (tg.sum(y * w), tg.data(y))  # one call of the layer: one set of draws
    (_, y), (g_x,) = tg.withgradient(lambda x: weighted(layer(x)), x)
    masks = [
        np.stack([draws.random((BATCH, directions * N_OUT)) >= p for _ in range(STEPS)], 1)
        for _ in range(2)
    ]  # fmt: skip (a mask for each step, between layers 0-1 and 1-2)
    x_t = torch.tensor(x, requires_grad=True)
    expected, state = x_t, module.state_dict()
    for k in range(3):
        single = torch.nn.GRU(N_IN if k == 0 else directions * N_OUT, N_OUT,
                              bidirectional=bidirectional, batch_first=True).double()  # fmt: skip
        single.load_state_dict({n.replace(f"_l{k}", "_l0"): t for n, t in state.items()
                                if f"_l{k}" in n})  # fmt: skip
        if k:
            expected = expected * torch.tensor(masks[k - 1]) / (1 - p)
        expected = single(expected)[0]
    (expected * torch.tensor(w)).sum().backward()
    assert np.allclose(np.asarray(y), expected.detach().numpy(), rtol=0, atol=1e-11)
    assert np.allclose(np.asarray(g_x), x_t.grad.numpy(), rtol=0, atol=1e-11)


def test_no_dropout_in_evaluation():
    layer, module = build(Numpy, "LSTM", num_layers=2, dropout=0.5, bidirectional=True)
    x = uniform((BATCH, STEPS, N_IN), (-1, 1), 1)
    expected = module.eval()(torch.tensor(x))[0].detach().numpy()
    assert np.allclose(np.asarray(layer(x)), expected, atol=1e-12)  # plain arrays: evaluation
    (g,) = tg.gradient(lambda x: tg.sum(nn.testmode(layer)(x)), x)
    x_t = torch.tensor(x, requires_grad=True)
    module(x_t)[0].sum().backward()
    assert np.allclose(np.asarray(g), x_t.grad.numpy(), atol=1e-12)


def test_dropout_with_one_layer_warns_as_torch():
    with pytest.warns(UserWarning, match="one layer: it does nothing"):
        layer = nn.LSTM(2, 3, dropout=0.5)
    assert layer.dropout is None


# --- what every layer keeps doing, with the options
def options_layer(kind="GRU", **extra):
    return KINDS[kind][0](N_IN, N_OUT, num_layers=2, bidirectional=True, bias_h=True,
                          rng=np.random.default_rng(0), dtype="float64", **extra)  # fmt: skip


def test_the_default_layers_keep_their_parameters_and_repr():
    for kind in KINDS:
        layer = KINDS[kind][0](N_IN, N_OUT)
        assert sorted(nn._parameters(layer)) == ["cell.Wh", "cell.Wi", "cell.bias"]
        assert repr(layer) == f"{kind}({N_IN} => {N_OUT})"
    assert repr(options_layer(dropout=0.1, batch_first=False)) == (
        "GRU(3 => 4, bias_h=True, num_layers=2, bidirectional=True, dropout=0.1, batch_first=False)"
    )


def test_a_layer_pickled_before_the_options_still_runs():
    layer = nn.LSTM(2, 3, rng=np.random.default_rng(0), dtype="float64")
    x = uniform((2, 4, 2), (-1, 1), 1)
    old = copy.deepcopy(layer)
    for name in ("cells", "bidirectional", "dropout", "batch_first"):
        del old.__dict__[name]
    del old.cell.__dict__["bias_h"]
    assert np.array_equal(np.asarray(pickle.loads(pickle.dumps(old))(x)), np.asarray(layer(x)))


def test_save_load_pickle_and_place(tmp_path):
    layer = options_layer("LSTM", return_state=True)
    layer = tg.optim.tree_map_with_path(
        lambda path, a: a + 0.5 if tg.backend.is_array(a) else a, layer
    )
    x = uniform((BATCH, STEPS, N_IN), (-1, 1), 1)
    y, (h, c) = layer(x, lengths=LENGTHS)
    nn.save(tmp_path / "lstm.npz", layer)
    loaded = nn.load(tmp_path / "lstm.npz", options_layer("LSTM", return_state=True))
    for copied in (loaded, pickle.loads(pickle.dumps(layer)), copy.deepcopy(layer)):
        y2, (h2, c2) = copied(x, lengths=LENGTHS)
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                   [(y, y2), (h, h2), (c, c2)])  # fmt: skip
    with pytest.raises(nn.BadFileError, match="cells.3.Wi"):
        nn.load(
            tmp_path / "lstm.npz",
            KINDS["LSTM"][0](N_IN, N_OUT, num_layers=3, bidirectional=True, bias_h=True),
        )
    small = nn.place(layer, dtype="float32")
    assert small(x.astype(np.float32), lengths=LENGTHS)[0].dtype == np.float32


@pytest.mark.parametrize("by", ["lengths", "mask"])
def test_a_compiled_training_step_is_the_eager_one_bit_for_bit(by):
    """Dropout between layers (drawn anew at each replay), lengths or a mask as an argument, a
    given state: the compiled step and the eager one on two copies of the model and generator."""
    layer = options_layer("LSTM", dropout=0.3, return_state=True, batch_first=False)
    eager_layer, compiled_layer = nn.trainmode(layer), nn.trainmode(copy.deepcopy(layer))
    rng = np.random.default_rng(5)

    def loss(m, x, h, c, steps):
        y, (h, c) = m(x, (h, c), **{by: steps})
        return tg.sum(y * y) + tg.sum(h * c)

    step = tg.compile(loss)
    for _ in range(3):
        x, h, c = (rng.standard_normal(s) for s in [(STEPS, BATCH, N_IN)] + [(4, BATCH, N_OUT)] * 2)
        lengths = rng.integers(0, STEPS + 1, BATCH)
        steps = lengths if by == "lengths" else rng.random((STEPS, BATCH)) < 0.7
        eager = tg.withgradient(loss, eager_layer, x, h, c, steps)
        compiled = step(compiled_layer, x, h, c, steps)
        assert float(eager[0]) == float(compiled[0])
        ours, theirs = nn._parameters(eager[1][0]), nn._parameters(compiled[1][0])
        assert sorted(ours) == sorted(theirs) and len(ours) == 16
        assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
        for a, b in zip(eager[1][1:4], compiled[1][1:4]):
            assert np.array_equal(np.asarray(a), np.asarray(b))


# --- refusals
def test_bad_lengths_masks_states_and_stacks_are_refused():
    layer = options_layer("LSTM")
    x = np.zeros((BATCH, STEPS, N_IN))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 5\].*from 2 to 6"):
        layer(x, lengths=[2, 6, 3])
    with pytest.raises(ValueError, match="lengths must be integers, one for each of the 3"):
        layer(x, lengths=[2.0, 3.0, 1.0])
    with pytest.raises(ValueError, match=r"the mask must be booleans of shape \(3, 5\)"):
        layer(x, mask=np.ones((STEPS, BATCH), dtype=bool))
    with pytest.raises(TypeError, match="give the lengths or a mask, not both"):
        layer(x, lengths=[1, 2, 3], mask=np.ones((BATCH, STEPS), dtype=bool))
    with pytest.raises(ValueError, match=r"\(h, c\), each of shape \(4, 3, 4\) \(cells, batch"):
        layer(x, (np.zeros((BATCH, N_OUT)),) * 2)
    with pytest.raises(ValueError, match="expects \\(time, batch, 3\\)"):
        options_layer(batch_first=False)(np.zeros((STEPS, BATCH, 2)))
    with pytest.raises(ValueError, match="num_layers must be a whole number >= 1, got 0"):
        nn.GRU(2, 3, num_layers=0)
    with pytest.raises(ValueError, match="a layer above the first must take 6 inputs"):
        nn.Recurrence(*[nn.GRUCell(2, 3)] * 2, *[nn.GRUCell(3, 3)] * 2, bidirectional=True)
    with pytest.raises(ValueError, match="3 cells do not make layers of two"):
        nn.Recurrence(nn.GRUCell(2, 3), nn.GRUCell(2, 3), nn.GRUCell(6, 3), bidirectional=True)
    with pytest.raises(ValueError, match="differ in kind"):
        nn.Recurrence(nn.GRUCell(2, 3), nn.LSTMCell(3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.Recurrence(nn.GRUCell(2, 3), nn.GRUCell(3, 3), dropout=0.2)  # two layers: no warning
