"""The optimiser state tree: tied parameters stay tied, freeze and thaw, adjust, fields that are
not trainable, and checkpoints that resume a run bit for bit."""

import dataclasses

import numpy as np
import pytest
from helpers import numpy_of

import tracker_gpu as tg
from tracker_gpu import nn, optim


def tied_model(backend, vocab=7, dim=4):
    """An embedding and an output layer sharing one weight (vocab, dim), as language models do."""
    w = backend.asarray(np.random.default_rng(0).standard_normal((vocab, dim)))
    return {"embed": nn.Embedding(weight=w), "out": nn.Dense(weight=w, bias=False)}


def tied_loss(model, tokens, targets):
    return nn.logitcrossentropy(model["out"](model["embed"](tokens)), targets)


def test_tied_weights_stay_tied_and_train_like_torch(backend):
    torch = pytest.importorskip("torch")
    tokens, targets = np.array([0, 3, 5, 3]), np.array([1, 2, 6, 0])
    model = tied_model(backend)
    start = numpy_of(backend, model["embed"].weight)
    state = optim.setup(optim.Adam(0.05), model)
    assert state["embed"].weight is state["out"].weight  # one state
    weight = torch.tensor(start, requires_grad=True)  # PyTorch: one tensor used twice
    adam = torch.optim.Adam([weight], lr=0.05)
    for _ in range(3):
        t, y = backend.asarray(tokens), backend.asarray(targets)
        _, (grads,) = tg.withgradient(lambda m, t=t, y=y: tied_loss(m, t, y), model)
        state, model = optim.update(state, model, grads)
        assert model["embed"].weight is model["out"].weight  # one update, one array
        assert state["embed"].weight is state["out"].weight
        adam.zero_grad()
        logits = weight[torch.tensor(tokens)] @ weight.T
        torch.nn.functional.cross_entropy(logits, torch.tensor(targets)).backward()
        adam.step()
    assert np.allclose(numpy_of(backend, model["out"].weight), weight.detach().numpy(),
                       rtol=1e-10)  # fmt: skip


def test_a_tie_without_a_gradient_at_its_first_place():
    shared = np.array([1.0, 2.0])
    model = {"a": shared, "b": shared}
    state = optim.setup(optim.Descent(0.5), model)
    state, new = optim.update(state, model, {"a": None, "b": np.array([1.0, 1.0])})
    assert new["a"] is new["b"] and np.array_equal(new["a"], [0.5, 1.5])


def test_freeze_and_thaw_parts_of_a_model(backend):
    rng = np.random.default_rng(0)
    place = dict(xp=backend.xp, device=backend.device, dtype="float64")
    model = nn.Chain(nn.Dense(3, 4, nn.tanh, rng=rng, **place), nn.Dense(4, 2, rng=rng, **place))
    x = backend.asarray(rng.standard_normal((5, 3)))
    state = optim.freeze(optim.setup(optim.Momentum(0.1), model), "layers.0")
    assert state.layers[0].weight.frozen and not state.layers[1].weight.frozen
    for _ in range(2):
        _, (g,) = tg.withgradient(lambda m: tg.sum(m(x) ** 2), model)
        state, new = optim.update(state, model, g)
        assert new.layers[0].weight is model.layers[0].weight
        assert new.layers[0].bias is model.layers[0].bias
        assert not np.array_equal(numpy_of(backend, new.layers[1].weight),
                                  numpy_of(backend, model.layers[1].weight))  # fmt: skip
        model = new
    state = optim.thaw(state, "layers.0.weight")
    assert not state.layers[0].weight.frozen and state.layers[0].bias.frozen
    _, (g,) = tg.withgradient(lambda m: tg.sum(m(x) ** 2), model)
    _, new = optim.update(state, model, g)
    assert new.layers[0].weight is not model.layers[0].weight
    assert new.layers[0].bias is model.layers[0].bias
    assert not optim.thaw(state).layers[0].bias.frozen  # every part


def test_freeze_keeps_ties_and_adjust_keeps_frozen():
    shared = np.ones(2)
    state = optim.setup(optim.Adam(), {"a": shared, "b": shared, "c": np.ones(1)})
    frozen = optim.freeze(state, "a")
    assert frozen["a"] is frozen["b"] and frozen["b"].frozen and not frozen["c"].frozen
    adjusted = optim.adjust(frozen, eta=0.5)
    assert adjusted["a"] is adjusted["b"] and adjusted["a"].frozen
    assert adjusted["a"].rule.eta == 0.5 and adjusted["a"].state is state["a"].state


def test_fields_that_are_not_trainable_get_no_state():
    @dataclasses.dataclass
    class Scaled:
        weight: object
        statistics: object = dataclasses.field(metadata={"trainable": False})

    model = Scaled(np.ones(2), np.zeros(2))
    state = optim.setup(optim.Adam(), model)
    assert isinstance(state.weight, optim.Leaf) and state.statistics is None
    state, new = optim.update(state, model, Scaled(np.ones(2), np.ones(2)))
    assert new.statistics is model.statistics and not np.array_equal(new.weight, model.weight)


# --- checkpoints
def run_model(backend, seed=0):
    """A small model with a tie, a frozen part and a scheduled, chained rule."""
    rng = np.random.default_rng(seed)
    place = dict(xp=backend.xp, device=backend.device, dtype="float64")
    first = nn.Dense(3, 5, nn.tanh, rng=rng, **place)
    model = {"layers": [first, nn.Dense(5, 2, rng=rng, **place)], "again": first.weight, "n": 3}
    rule = optim.OptimiserChain(
        optim.ClipNorm(5.0),
        optim.Scheduled(optim.AdamW(weight_decay=0.01), optim.Cosine(0.05, steps=8, warmup=2)),
    )
    state = optim.freeze(optim.setup(rule, model), "layers.1.bias")
    return model, state


def run_loss(m, x):
    return tg.sum(m["layers"][1](m["layers"][0](x)) ** 2) + tg.sum(m["again"])


def train_steps(backend, model, state, steps, start):
    rng = np.random.default_rng(100 + start)
    for _ in range(steps):
        x = backend.asarray(rng.standard_normal((4, 3)))
        _, (g, _) = tg.withgradient(run_loss, model, x)
        state, model = optim.update(state, model, g)
    return model, state


def all_arrays(backend, tree):
    found = []
    optim.tree_map_with_path(
        lambda path, x: found.append((path, numpy_of(backend, x))) if tg.backend.is_array(x)
        else None, tree, is_leaf=lambda x: isinstance(x, optim.Leaf))  # fmt: skip
    return found


def leaf_arrays(backend, state):
    out = []
    optim.tree_map_with_path(
        lambda path, leaf: out.append((path, leaf.state)) if isinstance(leaf, optim.Leaf) else None,
        state, is_leaf=lambda x: isinstance(x, optim.Leaf))  # fmt: skip
    return out


def flatten_state(backend, value):
    if isinstance(value, tuple):
        return [v for part in value for v in flatten_state(backend, part)]
    return [numpy_of(backend, value) if tg.backend.is_array(value) else value]


def test_a_resumed_run_is_bit_for_bit_the_run_straight_through(backend, tmp_path):
    model, state = run_model(backend)
    straight, straight_state = train_steps(backend, model, state, 6, 0)
    halfway, halfway_state = train_steps(backend, model, state, 3, 0)
    path = tmp_path / "run.npz"
    optim.save_checkpoint(path, halfway, halfway_state, step=3)
    template, _ = run_model(backend, seed=9)  # other values, the same structure and placement
    loaded, loaded_state, info = optim.load_checkpoint(path, template)
    assert info == {"step": 3}
    assert loaded["again"] is loaded["layers"][0].weight  # the tie, restored
    assert loaded_state["again"] is loaded_state["layers"][0].weight
    assert loaded_state["layers"][1].bias.frozen
    assert tg.backend.device_of(loaded["again"]) == backend.device
    # the second half continues with the same data stream as the straight run's
    rng = np.random.default_rng(100)
    resumed, resumed_state = loaded, loaded_state
    for step in range(6):
        x = backend.asarray(rng.standard_normal((4, 3)))
        if step < 3:
            continue
        _, (g, _) = tg.withgradient(run_loss, resumed, x)
        resumed_state, resumed = optim.update(resumed_state, resumed, g)
    for (p, a), (q, b) in zip(all_arrays(backend, straight), all_arrays(backend, resumed)):
        assert p == q and np.array_equal(a, b), p  # bit for bit
    for (p, a), (_, b) in zip(leaf_arrays(backend, straight_state),
                              leaf_arrays(backend, resumed_state)):  # fmt: skip
        for u, v in zip(flatten_state(backend, a), flatten_state(backend, b)):
            assert np.array_equal(u, v), p
    assert resumed_state["layers"][0].weight.state[1][0] == 6  # the schedule's step


def test_place_and_load_keep_ties(backend, tmp_path):
    model = tied_model(backend)
    placed = nn.place(model, dtype="float32")
    assert placed["embed"].weight is placed["out"].weight
    assert placed["out"].weight.dtype == backend.xp.float32
    nn.save(tmp_path / "tied.npz", model)
    loaded = nn.load(tmp_path / "tied.npz", tied_model(backend))
    assert loaded["embed"].weight is loaded["out"].weight
