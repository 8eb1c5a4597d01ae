"""Every rule and schedule of `optim`, enumerated from its namespace (so that one added later is
covered), with the machinery every optimiser must satisfy: a run saved by `save_checkpoint`
and resumed is bit for bit the run that went straight on, float32 parameters and states stay
float32, and a rule's options (maximize, momentum, ...) keep both true."""

import dataclasses

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.optim import checkpoint, schedules

# The rules that need arguments, and options worth a run of their own.
CONFIGURED = {
    "OptimiserChain": lambda: optim.OptimiserChain(optim.ClipNorm(1.0), optim.NAdam(0.01)),
    "Scheduled": lambda: optim.Scheduled(optim.RAdam(0.01), optim.Exp(0.01, decay=0.9)),
    "Scheduled.Step": lambda: optim.Scheduled(optim.SGD(0.05, rho=0.9), optim.Step(0.05, every=2)),
    "Scheduled.Exp": lambda: optim.Scheduled(optim.AdaMax(), optim.Exp(0.01, decay=0.9)),
    "Scheduled.Cosine": lambda: optim.Scheduled(optim.Rprop(), optim.Cosine(0.01, steps=5)),
    "Scheduled.CosineRestarts": lambda: optim.Scheduled(
        optim.AMSGrad(), optim.CosineRestarts(0.01, period=2, mult=2)),
    "Scheduled.OneCycle": lambda: optim.Scheduled(
        optim.Descent(), optim.OneCycle(0.05, steps=6, three_phase=True, warmup=0.4)),
    "Scheduled.Linear": lambda: optim.Scheduled(optim.AdaDelta(), optim.Linear(1.0, steps=4)),
    "Scheduled.Polynomial": lambda: optim.Scheduled(
        optim.RMSProp(momentum=0.5), optim.Polynomial(0.01, steps=4, power=2.0)),
    "SGD nesterov": lambda: optim.SGD(0.05, rho=0.9, nesterov=True, weight_decay=0.01),
    "SGD dampening maximize": lambda: optim.SGD(0.05, rho=0.9, dampening=0.5, maximize=True),
    "RMSProp momentum centred": lambda: optim.RMSProp(0.01, momentum=0.9, centred=True),
    "RAdam rectified": lambda: optim.RAdam(0.01, (0.9, 0.9)),
    "Lion weight_decay": lambda: optim.Lion(0.01, weight_decay=0.1),
    "Adam maximize": lambda: optim.Adam(0.01, maximize=True),
}  # fmt: skip


def _names():
    found = set(CONFIGURED)
    for name in optim.__all__:
        value = getattr(optim, name)
        if isinstance(value, type) and issubclass(value, optim.Rule) and value is not optim.Rule:
            found.add(value.__name__)  # an alias (Adamax) is its rule
    found.update(f"Scheduled.{n}" for n in schedules.__all__ if n != "Scheduled")
    return sorted(found)


def make_rule(name):
    return CONFIGURED[name]() if name in CONFIGURED else getattr(optim, name)()


def make_model(dtype, seed=0, scalar=False):
    rng = np.random.default_rng(seed)
    model = {"w": rng.standard_normal((3, 2)).astype(dtype), "b": np.zeros(2, dtype), "n": 3}
    if scalar:  # a NumPy scalar (NumPy's float64 is a Python float too)
        model["s"] = np.float64(seed + 1.5)
    return model


def loss(m, x):
    return tg.sum(tg.tanh(x @ m["w"] + m["b"]) ** 2)


def train(model, state, steps, first):
    for k in range(first, first + steps):
        x = np.random.default_rng(100 + k).standard_normal((4, 3)).astype(model["w"].dtype)
        _, (g, _) = tg.withgradient(loss, model, x)
        state, model = optim.update(state, model, g)
    return model, state


def arrays_and_numbers(value):
    """The leaves of a rule's state, arrays as NumPy."""
    if isinstance(value, (tuple, list)):
        return [leaf for part in value for leaf in arrays_and_numbers(part)]
    if value is None:
        return []
    return [np.asarray(tg.data(value))]


def test_every_rule_is_enumerated():
    names = set(_names())
    assert {"AMSGrad", "NAdam", "RAdam", "AdaMax", "AdaDelta", "Rprop", "SGD"} <= names
    assert {"Scheduled.OneCycle", "Scheduled.CosineRestarts", "Scheduled.Linear"} <= names


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", _names())
def test_a_resumed_run_is_the_run_straight_through(name, dtype, tmp_path):
    rule = make_rule(name)
    model = make_model(dtype, scalar=True)
    state = optim.setup(rule, model)
    straight, straight_state = train(model, state, 5, 0)
    half, half_state = train(model, state, 3, 0)
    path = tmp_path / "run.npz"
    optim.save_checkpoint(path, half, half_state, step=3)
    loaded, loaded_state, info = optim.load_checkpoint(path, make_model(dtype, 9, scalar=True))
    assert info == {"step": 3} and loaded_state["w"].rule == rule
    assert loaded["s"] == half["s"] == 1.5 and loaded["s"].dtype == np.float64
    resumed, resumed_state = train(loaded, loaded_state, 2, 3)
    for k in ("w", "b"):
        assert resumed[k].dtype == np.dtype(dtype), f"{name}: {k} is {resumed[k].dtype}"
        assert np.array_equal(straight[k], resumed[k]), f"{name}: {k} not bit for bit"
        expected = arrays_and_numbers(straight_state[k].state)
        got = arrays_and_numbers(resumed_state[k].state)
        assert len(expected) == len(got)
        for u, v in zip(expected, got):
            assert np.array_equal(u, v), f"{name}: the state of {k} differs"
            if u.ndim:  # the state's arrays keep the parameters' dtype
                assert v.dtype == np.dtype(dtype), f"{name}: a state array of {k} is {v.dtype}"


@pytest.mark.parametrize("name", _names())
def test_a_checkpoint_loaded_into_a_model_of_another_dtype_keeps_the_state_in_it(name, tmp_path):
    """The model says each array's dtype on load: a float64 run loaded into a float32 model
    has float32 parameters, and its state is what the rule keeps for them, float32 too (a
    fresh state's dtypes), so the next steps are a float32 run's."""
    model, state = train(make_model("float64"), optim.setup(make_rule(name), make_model("float64")),
                         2, 0)  # fmt: skip
    optim.save_checkpoint(tmp_path / "run.npz", model, state)
    loaded, loaded_state, _ = optim.load_checkpoint(tmp_path / "run.npz", make_model("float32"))
    for k in ("w", "b"):
        fresh = arrays_and_numbers(make_rule(name).init(loaded[k]))
        got = arrays_and_numbers(loaded_state[k].state)
        assert [v.dtype for v in got] == [u.dtype for u in fresh], f"{name}: the state of {k}"
        expected = arrays_and_numbers(state[k].state)
        for u, v in zip(expected, got):  # the saved values, rounded to the new dtype
            assert np.array_equal(u.astype(v.dtype), v), f"{name}: the state of {k}"
    resumed, _ = train(loaded, loaded_state, 2, 2)
    assert resumed["w"].dtype == resumed["b"].dtype == np.float32


def test_a_resumed_run_draws_what_the_run_straight_through_drew(tmp_path):
    """The model's generators (its Dropout layers', one shared by two) are saved with it."""

    def build(seed):
        rng = np.random.default_rng(seed)
        dense = lambda i, o, *f: nn.Dense(i, o, *f, rng=rng, dtype="float64")  # noqa: E731
        return nn.Chain(dense(3, 8, nn.relu), nn.Dropout(0.5, rng=rng), dense(8, 2),
                        nn.Dropout(0.3, rng=rng))  # fmt: skip

    def steps(model, state, first, last):
        for k in range(first, last):
            x = np.random.default_rng(100 + k).standard_normal((4, 3))
            _, (g, _) = tg.withgradient(lambda m, x: tg.sum(m(x) ** 2), model, x)
            state, model = optim.update(state, model, g)
        return model, state

    model = build(0)
    state = optim.setup(optim.Adam(0.01), model)
    straight, _ = steps(model, state, 0, 5)
    model = build(0)
    half, half_state = steps(model, optim.setup(optim.Adam(0.01), model), 0, 3)
    optim.save_checkpoint(tmp_path / "run.npz", half, half_state)
    loaded, loaded_state, _ = optim.load_checkpoint(tmp_path / "run.npz", build(9))
    assert loaded.layers[1].rng is loaded.layers[3].rng  # the shared generator stays one
    resumed, _ = steps(loaded, loaded_state, 3, 5)
    for k in (0, 2):
        assert np.array_equal(straight.layers[k].weight, resumed.layers[k].weight)


def test_a_checkpoint_written_before_a_field_existed_loads_with_its_default():
    """Rules gained `maximize` (issue 30): a checkpoint that lacks it gets False."""
    old = {"type": "Adam", "fields": {"eta": 0.1, "beta": {"tuple": [0.9, 0.999]},
                                      "epsilon": 1e-8}}  # fmt: skip
    assert checkpoint._decode(old, {}, None) == optim.Adam(0.1)
    with pytest.raises(ValueError, match="Adam has the fields"):
        checkpoint._decode({"type": "Adam", "fields": {"lr": 0.1}}, {}, None)


@pytest.mark.parametrize("name", ["SGD nesterov", "RMSProp momentum centred", "RAdam rectified",
                                  "Scheduled.OneCycle", "Scheduled.CosineRestarts"])  # fmt: skip
def test_options_replay_bit_for_bit_over_more_steps(name):
    """Eight compiled steps (RAdam's rectification switches on at the sixth) equal eager."""
    model = make_model("float64")
    step = lambda m, s, x: optim.update(s, m, tg.withgradient(loss, m, x)[1][0])  # noqa: E731
    compiled = tg.compile(step, gradient=False)
    eager = replay = (model, optim.setup(make_rule(name), model))
    for k in range(8):
        x = np.random.default_rng(k).standard_normal((4, 3))
        e_state, e_model = step(*eager, x)
        c_state, c_model = compiled(*replay, x)
        for key in ("w", "b"):
            assert np.array_equal(e_model[key], np.asarray(tg.data(c_model[key]))), (name, k)
        eager, replay = (e_model, e_state), (c_model, c_state)
    assert compiled.cache_info().misses == 1


def test_bad_hyperparameters_are_named():
    with pytest.raises(ValueError, match=r"Rprop: ell must be .*0 < shrink < 1 < grow.*0\.9\)"):
        optim.Rprop(ell=(0.5, 0.9))
    with pytest.raises(ValueError, match=r"Rprop: gamma must be .*min <= max"):
        optim.Rprop(gamma=(1.0, 0.1))
    with pytest.raises(ValueError, match="SGD: nesterov=True needs a momentum rho > 0"):
        optim.SGD(nesterov=True)
    with pytest.raises(ValueError, match=r"SGD: dampening must be in \[0, 1\]"):
        optim.SGD(rho=0.9, dampening=1.5)
    with pytest.raises(ValueError, match="OneCycle: anneal must be 'cos' or 'linear'"):
        optim.OneCycle(0.1, steps=10, anneal="cosine")
    with pytest.raises(ValueError, match="OneCycle: 2 steps with warmup 0.3 leave no warm-up"):
        optim.OneCycle(0.1, steps=2)
    with pytest.raises(ValueError, match="CosineRestarts: period must be at least 1 step"):
        optim.CosineRestarts(0.1, period=0)
    with pytest.raises(TypeError, match="RMSProp: maximize must be True or False"):
        optim.RMSProp(maximize=1)


def test_flux_defaults_and_pytorch_spellings():
    """Optimisers.jl's argument order and defaults where it has the rule."""
    assert optim.AdaMax() == optim.AdaMax(0.001, (0.9, 0.999), 1e-8)
    assert optim.Adamax is optim.AdaMax
    assert optim.AdaDelta() == optim.AdaDelta(0.9, 1e-8) and optim.Adadelta is optim.AdaDelta
    assert optim.Rprop() == optim.Rprop(1e-3, (0.5, 1.2), (1e-6, 50.0))
    assert optim.NAdam() == optim.NAdam(0.001, (0.9, 0.999), 1e-8)
    assert optim.RAdam() == optim.RAdam(0.001, (0.9, 0.999), 1e-8)
    assert optim.AMSGrad() == optim.AMSGrad(0.001, (0.9, 0.999), 1e-8)
    fields = {f.name for f in dataclasses.fields(optim.Descent)}
    assert fields == {"eta", "maximize"} and optim.Descent().eta == 0.1
