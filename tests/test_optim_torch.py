"""Optimisers and schedules against `torch.optim` over several steps, where PyTorch has the same
rule: the same parameters and gradients, float64, on every backend."""

import numpy as np
import pytest
from helpers import numpy_of

from tracker_gpu import optim

torch = pytest.importorskip("torch")

STEPS = 8


def torch_rules():
    """(ours, make PyTorch's optimiser for a list of tensors)."""
    t = torch.optim
    return {
        "Descent": (optim.Descent(0.1), lambda p: t.SGD(p, lr=0.1)),
        "Momentum": (optim.Momentum(0.05, 0.8), lambda p: t.SGD(p, lr=0.05, momentum=0.8)),
        "Adam": (
            optim.Adam(0.02, (0.8, 0.99), 1e-6),
            lambda p: t.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6),
        ),
        "AdamW": (
            optim.AdamW(0.02, weight_decay=0.1),
            lambda p: t.AdamW(p, lr=0.02, weight_decay=0.1),
        ),
        "RMSProp": (
            optim.RMSProp(0.01, 0.9, 1e-6),
            lambda p: t.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-6),
        ),
        "RMSProp centred": (
            optim.RMSProp(0.01, 0.9, 1e-6, centred=True),
            lambda p: t.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-6, centered=True),
        ),
        "AdaGrad": (
            optim.AdaGrad(0.1, 1e-6),
            lambda p: t.Adagrad(p, lr=0.1, eps=1e-6, initial_accumulator_value=1e-6),
        ),
        "WeightDecay": (
            optim.OptimiserChain(optim.WeightDecay(0.01), optim.Descent(0.1)),
            lambda p: t.SGD(p, lr=0.1, weight_decay=0.01),
        ),
    }


@pytest.mark.parametrize("name", list(torch_rules()))
def test_rule_matches_torch_optim(backend, name):
    rule, make = torch_rules()[name]
    rng = np.random.default_rng(0)
    start = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    model = {k: backend.asarray(v) for k, v in start.items()}
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in start.items()}
    reference = make(list(tensors.values()))
    state = optim.setup(rule, model)
    for _ in range(STEPS):
        grads = {k: rng.standard_normal(v.shape) for k, v in start.items()}
        state, model = optim.update(state, model, {k: backend.asarray(g) for k, g in grads.items()})
        for k, tensor in tensors.items():
            tensor.grad = torch.tensor(grads[k])
        reference.step()
    for k, tensor in tensors.items():
        expected = tensor.detach().numpy()
        assert np.allclose(numpy_of(backend, model[k]), expected, rtol=1e-12, atol=1e-14), k


def torch_schedules():
    """(ours, make PyTorch's scheduler for an optimiser with lr 0.1)."""
    s = torch.optim.lr_scheduler
    return {
        "Step": (optim.Step(0.1, decay=0.5, every=3), lambda o: s.StepLR(o, 3, gamma=0.5)),
        "Exp": (optim.Exp(0.1, decay=0.9), lambda o: s.ExponentialLR(o, gamma=0.9)),
        "Cosine": (
            optim.Cosine(0.1, steps=10, eta_min=0.01),
            lambda o: s.CosineAnnealingLR(o, T_max=10, eta_min=0.01),
        ),
        "Cosine with warm-up": (
            optim.Cosine(0.1, steps=12, warmup=3, eta_min=0.0),
            lambda o: s.SequentialLR(
                o,
                [s.LinearLR(o, 1 / 3, 1.0, total_iters=2), s.CosineAnnealingLR(o, T_max=9)],
                milestones=[3],
            ),
        ),
    }


@pytest.mark.parametrize("name", list(torch_schedules()))
def test_schedule_matches_torch_lr_scheduler(name):
    schedule, make = torch_schedules()[name]
    sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = make(sgd)
    rates, n = [], min(12, getattr(schedule, "steps", 11) + 1)  # PyTorch's cosine turns back up
    for _ in range(n):
        rates.append(sgd.param_groups[0]["lr"])
        sgd.step()
        scheduler.step()
    assert np.allclose([schedule(t) for t in range(n)], rates, rtol=1e-12, atol=1e-15)


def test_a_scheduled_rule_follows_the_schedule_like_torch(backend):
    """Adam whose rate follows a cosine, step by step, as PyTorch's Adam with its scheduler."""
    rng = np.random.default_rng(1)
    start = rng.standard_normal(5)
    model = {"w": backend.asarray(start)}
    rule = optim.Scheduled(optim.Adam(), optim.Cosine(0.05, steps=6, eta_min=0.005))
    state = optim.setup(rule, model)
    tensor = torch.tensor(start, requires_grad=True)
    adam = torch.optim.Adam([tensor], lr=0.05)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(adam, T_max=6, eta_min=0.005)
    for _ in range(6):
        g = rng.standard_normal(5)
        state, model = optim.update(state, model, {"w": backend.asarray(g)})
        tensor.grad = torch.tensor(g)
        adam.step()
        cosine.step()
    assert np.allclose(numpy_of(backend, model["w"]), tensor.detach().numpy(), rtol=1e-12)
    assert state["w"].state[0] == 6
