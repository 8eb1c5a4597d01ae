"""Tied weights (one array in two places) through `nn.from_torch`, `nn.to_torch` and
`nn.load_state_dict`: the places stay one array (one tensor in PyTorch), `optim.setup` gives
it one state, and our `Descent` steps are `torch.optim.SGD`'s on PyTorch's tied module, in
float64. A `state_dict` that gives two tied places different values is refused."""

import dataclasses

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim

torch = pytest.importorskip("torch", reason="the reference is PyTorch: pip install torch")
T = torch.nn
VOCAB, DIM = 7, 4
TOKENS, TARGETS = np.array([0, 3, 5, 3, 6]), np.array([1, 2, 6, 0, 3])


def tied_module(seed=0):
    """PyTorch's language-model tie: the output layer's weight is the embedding's."""
    torch.manual_seed(seed)
    module = T.Sequential(T.Embedding(VOCAB, DIM), T.Linear(DIM, VOCAB, bias=False)).double()
    module[1].weight = module[0].weight
    return module


def tied_model(seed=0):
    """The same model built here: one array as the embedding's and the output layer's weight."""
    w = np.random.default_rng(seed).standard_normal((VOCAB, DIM))
    return nn.Chain(nn.Embedding(weight=w), nn.Dense(weight=w, bias=False))


def assert_tied(model):
    assert model.layers[0].weight is model.layers[1].weight


def assert_trains_like(model, module, steps=3):
    """One optimiser state for the tie, and our steps PyTorch's on its tied module."""
    state = optim.setup(optim.Descent(0.1), model)
    assert state.layers[0].weight is state.layers[1].weight
    sgd = torch.optim.SGD(module.parameters(), lr=0.1)
    loss = T.CrossEntropyLoss()
    for _ in range(steps):
        (g,) = tg.gradient(lambda m: nn.logitcrossentropy(m(TOKENS), TARGETS), model)
        state, model = optim.update(state, model, g)
        sgd.zero_grad()
        loss(module(torch.tensor(TOKENS)), torch.tensor(TARGETS)).backward()
        sgd.step()
    assert_tied(model)
    expected = module[0].weight.detach().numpy()
    np.testing.assert_allclose(model.layers[1].weight, expected, rtol=1e-12, atol=1e-12)


def test_from_torch_keeps_a_tie():
    module = tied_module()
    model = nn.from_torch(module)
    assert_tied(model)
    assert_trains_like(model, module)


def test_to_torch_keeps_a_tie():
    model = tied_model()
    module = nn.to_torch(model)
    assert module[0].weight is module[1].weight
    assert len(list(module.parameters())) == 1
    np.testing.assert_array_equal(module[1].weight.detach().numpy(), model.layers[1].weight)
    assert_trains_like(model, module)


def test_load_state_dict_keeps_a_tie():
    module = tied_module(seed=1)
    model = nn.load_state_dict(tied_model(seed=2), module.state_dict())
    assert_tied(model)
    np.testing.assert_array_equal(model.layers[0].weight, module[0].weight.detach().numpy())
    assert_trains_like(model, module)
    untied = {k: v.clone() for k, v in tied_module(seed=3).state_dict().items()}
    assert_tied(nn.load_state_dict(tied_model(), untied))  # equal values: tied again
    own = nn.Chain(nn.Embedding(VOCAB, DIM), nn.Dense(DIM, VOCAB, bias=False))
    loaded = nn.load_state_dict(own, module.state_dict())  # a model without the tie keeps none
    assert loaded.layers[0].weight is not loaded.layers[1].weight


def test_load_state_dict_refuses_values_that_break_a_tie():
    state = {"0.weight": torch.zeros(VOCAB, DIM), "1.weight": torch.ones(VOCAB, DIM)}
    with pytest.raises(ValueError, match=r"tied.*'0\.weight' and '1\.weight'.*different"):
        nn.load_state_dict(tied_model(), state)
    mha = nn.MultiHeadAttention(DIM, nheads=2, dtype="float64")  # q and k: one weight, which
    k_proj = dataclasses.replace(mha.k_proj, weight=mha.q_proj.weight)  # PyTorch concatenates
    mha = dataclasses.replace(mha, k_proj=k_proj)
    state = nn.to_torch(mha).state_dict()
    loaded = nn.load_state_dict(mha, state)
    assert loaded.q_proj.weight is loaded.k_proj.weight
    state["in_proj_weight"][DIM] += 1.0  # k's first row
    with pytest.raises(ValueError, match="tied.*q_proj.weight and k_proj.weight.*different"):
        nn.load_state_dict(mha, state)
