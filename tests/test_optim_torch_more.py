"""The optimisers, options and schedules PyTorch users reach for (issue 30), against
`torch.optim` in float64: 20-step trajectories of a small model, each trained by its own
library's gradients and compared at every step; the schedules' rates against
`torch.optim.lr_scheduler`; `ReduceLROnPlateau` fed the same metrics; and `clip_grad_norm`
against `torch.nn.utils.clip_grad_norm_`. Lion, which PyTorch lacks, against the paper."""

import math

import numpy as np
import pytest
from helpers import numpy_of

import tracker_gpu as tg
from tracker_gpu import optim

torch = pytest.importorskip("torch", reason="the reference optimisers are PyTorch's")

STEPS = 20
RTOL = 1e-12


@pytest.fixture(autouse=True)
def torch_in_float64():
    """PyTorch keeps its optimisers' scalars (NAdam's product of momenta) in the default dtype:
    float64 for a float64 comparison."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


# --- a small model: one tanh layer and a linear read-out, fed new data at every step
def start():
    rng = np.random.default_rng(30)
    shapes = {"w": (3, 4), "b": (4,), "v": (4, 2)}
    return {k: rng.standard_normal(shape) * 0.7 for k, shape in shapes.items()}


def data_stream():
    rng = np.random.default_rng(31)
    return [(rng.standard_normal((5, 3)), rng.standard_normal((5, 2))) for _ in range(STEPS)]


def our_loss(m, x, y):
    return tg.sum((tg.tanh(x @ m["w"] + m["b"]) @ m["v"] - y) ** 2)


def torch_loss(m, x, y):
    return torch.sum((torch.tanh(x @ m["w"] + m["b"]) @ m["v"] - y) ** 2)


def torch_rules():
    """(ours, PyTorch's optimiser for a list of tensors)."""
    t, o = torch.optim, optim
    chain = lambda *rules: o.OptimiserChain(*rules)  # noqa: E731
    return {
        "AMSGrad": (o.AMSGrad(0.02, (0.8, 0.99), 1e-6),
                    lambda p: t.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6, amsgrad=True)),
        "AMSGrad maximize": (o.AMSGrad(0.01, maximize=True),
                             lambda p: t.Adam(p, lr=0.01, amsgrad=True, maximize=True)),
        "NAdam": (o.NAdam(0.02), lambda p: t.NAdam(p, lr=0.02)),
        "NAdam momentum_decay": (o.NAdam(0.02, (0.8, 0.9), 1e-6, momentum_decay=0.1),
                                 lambda p: t.NAdam(p, lr=0.02, betas=(0.8, 0.9), eps=1e-6,
                                                   momentum_decay=0.1)),
        "NAdam weight_decay": (chain(o.WeightDecay(0.1), o.NAdam(0.02)),
                               lambda p: t.NAdam(p, lr=0.02, weight_decay=0.1)),
        "RAdam": (o.RAdam(0.02), lambda p: t.RAdam(p, lr=0.02)),
        "RAdam rectified": (o.RAdam(0.02, (0.9, 0.9), 1e-6),  # rho_t > 5 from step 6
                            lambda p: t.RAdam(p, lr=0.02, betas=(0.9, 0.9), eps=1e-6)),
        "RAdam weight_decay": (chain(o.WeightDecay(0.1), o.RAdam(0.01, (0.9, 0.95))),
                               lambda p: t.RAdam(p, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)),
        "RAdam maximize": (o.RAdam(0.002, maximize=True),
                           lambda p: t.RAdam(p, lr=0.002, maximize=True)),
        "AdaMax": (o.AdaMax(0.02), lambda p: t.Adamax(p, lr=0.02)),
        "Adamax maximize": (o.Adamax(0.01, (0.8, 0.9), 1e-4, maximize=True),
                            lambda p: t.Adamax(p, lr=0.01, betas=(0.8, 0.9), eps=1e-4,
                                               maximize=True)),
        "AdaDelta": (o.AdaDelta(0.9, 1e-6, 0.5), lambda p: t.Adadelta(p, lr=0.5, eps=1e-6)),
        "Adadelta maximize": (o.Adadelta(0.8, 1e-4, eta=1.0, maximize=True),
                              lambda p: t.Adadelta(p, rho=0.8, eps=1e-4, maximize=True)),
        "Rprop": (o.Rprop(0.01), lambda p: t.Rprop(p, lr=0.01)),
        "Rprop bounds maximize": (
            o.Rprop(0.02, ell=(0.3, 1.5), gamma=(1e-3, 0.05), maximize=True),
            lambda p: t.Rprop(p, lr=0.02, etas=(0.3, 1.5), step_sizes=(1e-3, 0.05),
                              maximize=True)),
        "SGD": (o.SGD(0.05), lambda p: t.SGD(p, lr=0.05)),
        "SGD dampening": (o.SGD(0.05, rho=0.9, dampening=0.3),
                          lambda p: t.SGD(p, lr=0.05, momentum=0.9, dampening=0.3)),
        "SGD nesterov weight_decay": (
            o.SGD(0.02, rho=0.8, weight_decay=0.01, nesterov=True),
            lambda p: t.SGD(p, lr=0.02, momentum=0.8, weight_decay=0.01, nesterov=True)),
        "SGD maximize weight_decay": (
            o.SGD(0.002, rho=0.5, weight_decay=0.1, maximize=True),
            lambda p: t.SGD(p, lr=0.002, momentum=0.5, weight_decay=0.1, maximize=True)),
        "Descent maximize": (o.Descent(0.01, maximize=True),
                             lambda p: t.SGD(p, lr=0.01, maximize=True)),
        "Momentum maximize": (o.Momentum(0.002, 0.8, maximize=True),
                              lambda p: t.SGD(p, lr=0.002, momentum=0.8, maximize=True)),
        "RMSProp momentum": (o.RMSProp(0.01, 0.9, 1e-6, momentum=0.7),
                             lambda p: t.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-6, momentum=0.7)),
        "RMSProp momentum centred maximize": (
            o.RMSProp(0.005, 0.95, 1e-6, centred=True, momentum=0.5, maximize=True),
            lambda p: t.RMSprop(p, lr=0.005, alpha=0.95, eps=1e-6, centered=True, momentum=0.5,
                                maximize=True)),
        "Adam maximize": (o.Adam(0.01, maximize=True), lambda p: t.Adam(p, lr=0.01, maximize=True)),
        "AdamW maximize": (o.AdamW(0.01, weight_decay=0.1, maximize=True),
                           lambda p: t.AdamW(p, lr=0.01, weight_decay=0.1, maximize=True)),
        "AdaGrad maximize": (o.AdaGrad(0.05, 1e-6, maximize=True),
                             lambda p: t.Adagrad(p, lr=0.05, eps=1e-6,
                                                 initial_accumulator_value=1e-6, maximize=True)),
    }  # fmt: skip


def assert_close(backend, model, tensors, where):
    for k, tensor in tensors.items():
        expected = tensor.detach().numpy()
        got = numpy_of(backend, model[k])
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-14, err_msg=f"{where}: {k}")


def steps_on(backend):
    """Dask recomputes the whole history of a lazy model at each comparison (20 steps took 5 to
    7 s a rule there, 130 s in all): it compares the first steps, the other rows all of them."""
    return 6 if backend.name == "dask" else STEPS


def train_both(backend, rule, make, scheduler=None):
    """Our rule and PyTorch's optimiser on the same model and data; compared at every step."""
    model = {k: backend.asarray(v) for k, v in start().items()}
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in start().items()}
    reference = make(list(tensors.values()))
    after = scheduler(reference) if scheduler else None
    state = optim.setup(rule, model)
    for step, (x, y) in enumerate(data_stream()[: steps_on(backend)]):
        _, (g, _, _) = tg.withgradient(our_loss, model, backend.asarray(x), backend.asarray(y))
        state, model = optim.update(state, model, g)
        reference.zero_grad()
        torch_loss(tensors, torch.tensor(x), torch.tensor(y)).backward()
        reference.step()
        if after is not None:
            after.step()
        assert_close(backend, model, tensors, f"step {step}")
    return state


@pytest.mark.parametrize("name", list(torch_rules()))
def test_rule_matches_torch_optim_at_every_step(backend, name):
    rule, make = torch_rules()[name]
    train_both(backend, rule, make)


def test_sgd_with_a_scheduled_rate_matches_torch():
    """PyTorch keeps the rate out of the momentum buffer: so does SGD, under a schedule too."""
    rule = optim.Scheduled(optim.SGD(rho=0.9, dampening=0.1), optim.Exp(0.05, decay=0.8))
    make = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1)  # noqa: E731
    scheduler = lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.8)  # noqa: E731
    from conftest import BACKENDS

    train_both(BACKENDS["numpy"](), rule, make, scheduler)


def test_lion_with_decoupled_weight_decay_matches_the_paper():
    """Chen et al. (2023), Algorithm 2, with weight decay (PyTorch has no Lion)."""
    eta, (beta1, beta2), decay = 0.01, (0.8, 0.95), 0.3
    model, reference = start(), start()
    momentum = {k: np.zeros_like(v) for k, v in reference.items()}
    state = optim.setup(optim.Lion(eta, (beta1, beta2), weight_decay=decay), model)
    for x, y in data_stream():
        _, (g, _, _) = tg.withgradient(our_loss, model, x, y)
        state, model = optim.update(state, model, g)
        _, (h, _, _) = tg.withgradient(our_loss, reference, x, y)
        for k, theta in reference.items():
            c = beta1 * momentum[k] + (1 - beta1) * h[k]
            reference[k] = theta - eta * (np.sign(c) + decay * theta)
            momentum[k] = beta2 * momentum[k] + (1 - beta2) * h[k]
        for k in model:
            np.testing.assert_allclose(model[k], reference[k], rtol=RTOL, atol=1e-15)


# --- schedules
def torch_schedules():
    """(ours, PyTorch's scheduler for an SGD of lr 0.1, steps compared)."""
    s, o = torch.optim.lr_scheduler, optim
    return {
        "CosineRestarts": (o.CosineRestarts(0.1, period=4, eta_min=0.01),
                           lambda p: s.CosineAnnealingWarmRestarts(p, T_0=4, eta_min=0.01), 30),
        "CosineRestarts mult 2": (o.CosineRestarts(0.1, period=2, mult=2),
                                  lambda p: s.CosineAnnealingWarmRestarts(p, T_0=2, T_mult=2), 40),
        "CosineRestarts mult 3": (
            o.CosineRestarts(0.1, period=3, mult=3, eta_min=0.001),
            lambda p: s.CosineAnnealingWarmRestarts(p, T_0=3, T_mult=3, eta_min=0.001), 45),
        "OneCycle": (o.OneCycle(0.1, steps=30),
                     lambda p: s.OneCycleLR(p, max_lr=0.1, total_steps=30, cycle_momentum=False),
                     30),
        "OneCycle linear three-phase": (
            o.OneCycle(0.1, steps=25, warmup=0.25, div_factor=10.0, final_div_factor=100.0,
                       anneal="linear", three_phase=True),
            lambda p: s.OneCycleLR(p, max_lr=0.1, total_steps=25, pct_start=0.25, div_factor=10,
                                   final_div_factor=100, anneal_strategy="linear",
                                   three_phase=True, cycle_momentum=False), 25),
        "Linear": (o.Linear(0.1, steps=10, eta_end=0.02),
                   lambda p: s.LinearLR(p, start_factor=1.0, end_factor=0.2, total_iters=10), 20),
        "Linear to zero": (o.Linear(0.1, steps=7),
                           lambda p: s.LinearLR(p, start_factor=1.0, end_factor=0.0,
                                                total_iters=7), 12),
        "Polynomial": (o.Polynomial(0.1, steps=10, power=2.0),
                       lambda p: s.PolynomialLR(p, total_iters=10, power=2.0), 20),
        "Polynomial linear": (o.Polynomial(0.1, steps=6),
                              lambda p: s.PolynomialLR(p, total_iters=6), 10),
    }  # fmt: skip


def torch_rates(make, steps):
    sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler, rates = make(sgd), []
    for _ in range(steps):
        rates.append(sgd.param_groups[0]["lr"])
        sgd.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("name", list(torch_schedules()))
def test_schedule_matches_torch_lr_scheduler(name):
    schedule, make, steps = torch_schedules()[name]
    ours = [schedule(t) for t in range(steps)]
    np.testing.assert_allclose(ours, torch_rates(make, steps), rtol=RTOL, atol=1e-16)
    # the same rates from a count held in a 0-d array (as tg.compile reads it), bit for bit
    traced = [float(tg.data(schedule(np.asarray(float(t))))) for t in range(steps)]
    assert traced == ours


def test_a_linear_warm_up_matches_torch():
    ours = [optim.Linear(0.1 / 3, steps=5, eta_end=0.1)(t) for t in range(8)]
    make = lambda p: torch.optim.lr_scheduler.LinearLR(p, start_factor=1 / 3)  # noqa: E731
    np.testing.assert_allclose(ours, torch_rates(make, 8), rtol=RTOL)


def test_a_scheduled_rule_with_one_cycle_trains_like_torch():
    rule = optim.Scheduled(optim.NAdam(), optim.OneCycle(0.05, steps=STEPS))
    make = lambda p: torch.optim.NAdam(p, lr=0.05)  # noqa: E731
    cycle = lambda o: torch.optim.lr_scheduler.OneCycleLR(  # noqa: E731
        o, max_lr=0.05, total_steps=STEPS, cycle_momentum=False
    )
    from conftest import BACKENDS

    train_both(BACKENDS["numpy"](), rule, make, cycle)


# --- ReduceLROnPlateau: the same metrics, the same rates
METRICS = [1.0, 0.9, 0.95, 0.95, 0.94, 0.96, 0.8, 0.8, 0.81, 0.8, 0.82, 0.7, 0.7, 0.7, 0.7,
           0.71, 0.72, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.85, 0.9, 0.95]  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"factor": 0.5, "patience": 1},
        {"factor": 0.5, "patience": 0, "cooldown": 2, "eta_min": 0.02},
        {"mode": "max", "patience": 1, "threshold": 0.05, "threshold_mode": "abs"},
        {"mode": "max", "patience": 2, "factor": 0.3},
        {"patience": 1, "threshold": 0.01, "threshold_mode": "abs", "eps": 0.05},
    ],
)
def test_reduce_on_plateau_matches_torch(options):
    torch_options = {("min_lr" if k == "eta_min" else k): v for k, v in options.items()}
    sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(sgd, **torch_options)
    plateau = optim.ReduceLROnPlateau(0.1, **options)
    watch, ours, theirs = plateau.init(), [], []
    for metric in METRICS:
        watch = plateau.step(watch, np.asarray(metric))
        scheduler.step(metric)
        ours.append(watch.eta)
        theirs.append(sgd.param_groups[0]["lr"])
    assert np.allclose(ours, theirs, rtol=RTOL, atol=0)
    assert len(set(theirs)) > 1 or options.get("mode") == "max"  # the case reduces the rate


def test_reduce_on_plateau_drives_the_optimiser():
    """`adjust(state, eta=watch.eta)` after each evaluation: Adam's trajectory as PyTorch's."""
    model = start()
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in model.items()}
    adam = torch.optim.Adam(list(tensors.values()), lr=0.05)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(adam, factor=0.5, patience=0)
    plateau = optim.ReduceLROnPlateau(0.05, factor=0.5, patience=0)
    state, watch = optim.setup(optim.Adam(0.05), model), plateau.init()
    for step, (x, y) in enumerate(data_stream()):
        loss, (g, _, _) = tg.withgradient(our_loss, model, x, y)
        state, model = optim.update(state, model, g)
        adam.zero_grad()
        torch_loss(tensors, torch.tensor(x), torch.tensor(y)).backward()
        adam.step()
        metric = METRICS[step]
        watch = plateau.step(watch, metric)
        state = optim.adjust(state, eta=watch.eta)
        scheduler.step(metric)
        for k, tensor in tensors.items():
            np.testing.assert_allclose(model[k], tensor.detach().numpy(), rtol=RTOL, atol=1e-14)
    assert state["w"].rule.eta == adam.param_groups[0]["lr"] < 0.05


def test_reduce_on_plateau_refuses_bad_input():
    with pytest.raises(ValueError, match="mode must be 'min' or 'max', got 'down'"):
        optim.ReduceLROnPlateau(0.1, mode="down")
    with pytest.raises(ValueError, match=r"factor must be in \[0, 1\)"):
        optim.ReduceLROnPlateau(0.1, factor=1.5)
    plateau = optim.ReduceLROnPlateau(0.1)
    with pytest.raises(TypeError, match="the metric must be a number"):
        plateau.step(plateau.init(), "low")
    with pytest.raises(TypeError, match="takes the watch from init"):
        plateau.step(0.1, 1.0)
    watch = plateau.step(plateau.init(), 1.0)
    assert optim.Plateau(**watch._asdict()) == watch  # kept in a checkpoint's info


# --- clipping by the global norm
def gradient_tree(dtype=np.float64, scale=1.0):
    rng = np.random.default_rng(5)
    return {
        "w": (rng.standard_normal((3, 4)) * scale).astype(dtype),
        "layers": [(rng.standard_normal(4) * scale).astype(dtype), None],
        "name": "not a gradient",
    }


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(backend, p, max_norm):
    grads = gradient_tree()
    tensors = [torch.tensor(grads["w"]), torch.tensor(grads["layers"][0])]
    params = [torch.zeros_like(t, requires_grad=True) for t in tensors]
    for param, tensor in zip(params, tensors):
        param.grad = tensor.clone()
    expected = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=p)
    ours = {"w": backend.asarray(grads["w"]), "layers": [backend.asarray(grads["layers"][0]),
            None], "name": "not a gradient"}  # fmt: skip
    clipped, norm = optim.clip_grad_norm(ours, max_norm, p=p)
    np.testing.assert_allclose(numpy_of(backend, norm), expected.numpy(), rtol=RTOL)
    np.testing.assert_allclose(numpy_of(backend, clipped["w"]), params[0].grad.numpy(), rtol=RTOL)
    np.testing.assert_allclose(numpy_of(backend, clipped["layers"][0]), params[1].grad.numpy(),
                               rtol=RTOL)  # fmt: skip
    assert clipped["layers"][1] is None and clipped["name"] == "not a gradient"
    if max_norm > float(expected):  # no clipping: the gradients unchanged
        assert np.array_equal(numpy_of(backend, clipped["w"]), grads["w"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("size", [4, 100_000])  # a norm of 2 and of 316 (float16's squares: 256)
@pytest.mark.parametrize("p", [2.0, 3.0, math.inf])
def test_clip_grad_norm_of_every_float_dtype(backend, dtype, size, p):
    """Each array keeps its dtype; the norm is accumulated in float32 for the half dtypes (as
    PyTorch's), which overflowed in float16 and set every gradient to 0. The reference is the
    same norm and scaling in float64."""
    half, full = np.full(size, 1.0), np.linspace(-1.0, 1.0, 7)
    ours = [_in_dtype(backend, half, dtype), backend.asarray(full)]
    clipped, norm = optim.clip_grad_norm(ours, 1.0, p=p)
    expected = np.linalg.norm(np.concatenate([half, full]), ord=p)
    scale = min(1.0, 1.0 / (expected + 1e-6))
    assert [tg.backend.dtype_name(c.dtype) for c in clipped] == [dtype, "float64"]
    np.testing.assert_allclose(numpy_of(backend, norm), expected, rtol=1e-6)
    np.testing.assert_allclose(_as_float64(clipped[0]), half * scale, rtol=1e-2)
    np.testing.assert_allclose(numpy_of(backend, clipped[1]), full * scale, rtol=1e-6)


def _in_dtype(backend, values, dtype):
    if dtype != "float32" and backend.name.startswith("strict"):
        pytest.skip("array_api_strict has no half dtype")
    if dtype != "float32" and backend.name == "dask":
        pytest.skip("the tracked Dask namespace has no half dtype")
    if dtype == "bfloat16" and backend.name == "cupy":
        with pytest.raises(TypeError, match="cupy has no bfloat16"):
            tg.nn.asarray(values, xp=backend.xp, device=backend.device, dtype=dtype)
        pytest.skip("tracker_gpu refuses bfloat16 on CuPy (checked above)")
    return tg.nn.asarray(values, xp=backend.xp, device=backend.device, dtype=dtype)


def _as_float64(x):
    return tg.nn.to_numpy(x).astype(np.float64)


def test_clip_grad_norm_counts_a_tied_array_once_given_the_model():
    """An embedding tied to the output layer: PyTorch's `parameters()` lists the tensor once, so
    its gradient counts once in the norm; withgradient puts the whole gradient in both places."""
    from tracker_gpu import nn

    emb = nn.Embedding(5, 4, rng=np.random.default_rng(0), dtype="float64")
    model = nn.Chain(emb, nn.Dense(4, 5, weight=emb.weight, bias=False))
    x, y = np.array([[0, 1, 2]]), np.array([[1, 2, 3]])
    _, (g,) = tg.withgradient(lambda m: nn.logitcrossentropy(m(x), y), model)
    clipped, norm = optim.clip_grad_norm(g, 0.5, model=model)

    weight = torch.tensor(emb.weight, requires_grad=True)
    logits = torch.nn.functional.embedding(torch.tensor(x), weight) @ weight.T
    torch.nn.functional.cross_entropy(logits.reshape(-1, 5), torch.tensor(y).reshape(-1)).backward()
    expected = torch.nn.utils.clip_grad_norm_([weight], 0.5)
    np.testing.assert_allclose(float(norm), float(expected), rtol=RTOL)
    for place in (clipped.layers[0].weight, clipped.layers[1].weight):
        np.testing.assert_allclose(place, weight.grad.numpy(), rtol=RTOL)
    untied = float(optim.clip_grad_norm(g, 0.5)[1])  # each place counted: sqrt(2) times
    np.testing.assert_allclose(untied, math.sqrt(2) * float(expected), rtol=RTOL)
    with pytest.raises(ValueError, match="mismatched structures"):
        optim.clip_grad_norm(g, 0.5, model={"w": emb.weight})


def test_clip_grad_norm_is_global_and_clip_norm_is_per_array():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([0.0, 4.0])}
    clipped, norm = optim.clip_grad_norm(grads, 1.0)
    assert float(norm) == 5.0  # sqrt(3**2 + 4**2): the arrays together
    rule = optim.ClipNorm(1.0)
    per_array = {k: rule.apply(None, g, g)[1] for k, g in grads.items()}
    np.testing.assert_allclose(per_array["a"] @ per_array["a"], 1.0)  # each array alone
    np.testing.assert_allclose(clipped["a"] @ clipped["a"] + clipped["b"] @ clipped["b"],
                               (1.0 / (5.0 + 1e-6)) ** 2 * 25.0)  # fmt: skip


def test_clip_grad_norm_keeps_float32_and_raises_on_nan_when_asked():
    clipped, norm = optim.clip_grad_norm(gradient_tree(np.float32), 0.1)
    assert clipped["w"].dtype == np.float32 and norm.dtype == np.float32
    bad = gradient_tree()
    bad["w"][0, 0] = np.nan
    _, norm = optim.clip_grad_norm(bad, 1.0)  # PyTorch's default: no check
    assert np.isnan(norm)
    with pytest.raises(FloatingPointError, match="clip_grad_norm: the gradients' 2.0-norm is nan"):
        optim.clip_grad_norm(bad, 1.0, throw=True)
    with pytest.raises(ValueError, match=r"clip_grad_norm: max_norm must be >= 0, got -1"):
        optim.clip_grad_norm(gradient_tree(), -1)
    with pytest.raises(ValueError, match="no gradient array in grads"):
        optim.clip_grad_norm({"w": None}, 1.0)


@pytest.mark.parametrize("throw", [False, True])
def test_clip_grad_norm_replays_bit_for_bit(throw):
    """A compiled training step with global clipping is the eager step, and a compiled step
    with throw=True raises on a NaN as the eager step does."""
    model = start()

    def step(model, state, x, y):
        loss, (g, _, _) = tg.withgradient(our_loss, model, x, y)
        g, norm = optim.clip_grad_norm(g, 0.5, throw=throw)
        state, model = optim.update(state, model, g)
        return loss, norm, state, model

    compiled = tg.compile(step, gradient=False)
    eager = replay = (model, optim.setup(optim.Adam(0.01), model))
    for x, y in data_stream()[:4]:
        e_loss, e_norm, *eager_out = step(*eager, x, y)
        c_loss, c_norm, *compiled_out = compiled(*replay, x, y)
        assert np.array_equal(np.asarray(tg.data(e_norm)), np.asarray(tg.data(c_norm)))
        for k in model:
            assert np.array_equal(eager_out[1][k], np.asarray(tg.data(compiled_out[1][k])))
        eager, replay = (eager_out[1], eager_out[0]), (compiled_out[1], compiled_out[0])
    assert compiled.cache_info().misses == 1
    if throw:
        x, y = data_stream()[0]
        x = x.copy()
        x[0, 0] = np.nan
        with tg.sync_checks(False), pytest.raises(FloatingPointError, match="clip_grad_norm"):
            compiled(*replay, x, y)


@pytest.mark.parametrize("name", list(torch_rules()))
def test_every_rule_under_a_schedule_matches_torch_with_its_scheduler(name):
    """The schedule sets the rate from the first step on, state included (Rprop's step sizes
    start at it): the rule's own rate, here another, is never used. Momentum keeps the rate in
    its velocity, as its docstring says, where PyTorch keeps it out (SGD is PyTorch's form)."""
    from conftest import BACKENDS

    if name.startswith("Momentum"):
        pytest.skip("Momentum's velocity holds the rate, by design (SGD matches PyTorch)")

    rule, make = torch_rules()[name]
    lr = make([torch.zeros(1, requires_grad=True)]).param_groups[0]["lr"]
    scheduled = optim.Scheduled(rule.adjust(eta=7 * lr), optim.Exp(lr, decay=0.8))
    scheduler = lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.8)  # noqa: E731
    train_both(BACKENDS["numpy"](), scheduled, make, scheduler)
