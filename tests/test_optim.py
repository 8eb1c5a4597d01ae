"""Optimisers against reference updates written here in NumPy from the published formulas, the
state tree over nested structures, and clear errors."""

import collections
import dataclasses
import math

import numpy as np
import pytest
from helpers import numpy_of

import tracker_gpu as tg
from tracker_gpu import nn, optim

STEPS = 6
A = np.diag([1.0, 3.0, 0.5, 2.0]) + 0.1  # a quadratic bowl: loss = x.A.x / 2 - b.x
B = np.array([1.0, -2.0, 0.5, 3.0])
X0 = np.array([0.3, -0.7, 1.2, 0.1])


def gradient_at(x):
    return A @ x - B


# --- reference updates, from the papers' formulas
def descent(eta):
    def run(x):
        for _ in range(STEPS):
            x = x - eta * gradient_at(x)
        return x

    return run


def heavy_ball(eta, rho):  # Polyak momentum, as Optimisers.jl: v = rho v + eta g; x -= v
    def run(x):
        v = np.zeros_like(x)
        for _ in range(STEPS):
            v = rho * v + eta * gradient_at(x)
            x = x - v
        return x

    return run


def nesterov(eta, mu):
    """Sutskever et al. (2013): the gradient is taken at the look-ahead point theta + mu v.
    The optimiser's parameter is that look-ahead point."""

    def run(x):
        theta, v = x.copy(), np.zeros_like(x)
        for _ in range(STEPS):
            v = mu * v - eta * gradient_at(theta + mu * v)
            theta = theta + v
        return theta + mu * v

    return run


def adam(alpha, beta1, beta2, eps, decay=0.0, couple=True):
    """Kingma & Ba (2015), Algorithm 1; with `decay`, AdamW (Loshchilov & Hutter 2019) as
    PyTorch writes it (couple: theta -= alpha * decay * theta first) or uncoupled."""

    def run(x):
        m, v = np.zeros_like(x), np.zeros_like(x)
        for t in range(1, STEPS + 1):
            g = gradient_at(x)
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g**2
            m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
            shrink = alpha * decay * x if couple else decay * x
            x = x - shrink - alpha * m_hat / (np.sqrt(v_hat) + eps)
        return x

    return run


def rmsprop(eta, rho, eps, centred=False):
    """Tieleman & Hinton (2012), lecture 6e; centred: Graves (2013), eq. 38-40."""

    def run(x):
        mean_square, mean = np.zeros_like(x), np.zeros_like(x)
        for _ in range(STEPS):
            g = gradient_at(x)
            mean_square = rho * mean_square + (1 - rho) * g**2
            mean = rho * mean + (1 - rho) * g if centred else mean
            x = x - eta * g / (np.sqrt(mean_square - mean**2) + eps)
        return x

    return run


def adagrad(eta, eps):
    """Duchi et al. (2011): a step scaled by the root of the summed squared gradients (the sum
    starting at eps, as Optimisers.jl)."""

    def run(x):
        total = np.full_like(x, eps)
        for _ in range(STEPS):
            g = gradient_at(x)
            total = total + g**2
            x = x - eta * g / (np.sqrt(total) + eps)
        return x

    return run


def adabelief(alpha, beta1, beta2, eps):
    """Zhuang et al. (2020), Algorithm 2."""

    def run(x):
        m, s = np.zeros_like(x), np.zeros_like(x)
        for t in range(1, STEPS + 1):
            g = gradient_at(x)
            m = beta1 * m + (1 - beta1) * g
            s = beta2 * s + (1 - beta2) * (g - m) ** 2 + eps
            m_hat, s_hat = m / (1 - beta1**t), s / (1 - beta2**t)
            x = x - alpha * m_hat / (np.sqrt(s_hat) + eps)
        return x

    return run


def lion(eta, beta1, beta2):
    """Chen et al. (2023), Algorithm 2 (without weight decay)."""

    def run(x):
        m = np.zeros_like(x)
        for _ in range(STEPS):
            g = gradient_at(x)
            x = x - eta * np.sign(beta1 * m + (1 - beta1) * g)
            m = beta2 * m + (1 - beta2) * g
        return x

    return run


def clipped(transform, eta):
    def run(x):
        for _ in range(STEPS):
            x = x - eta * transform(gradient_at(x), x)
        return x

    return run


def clip_norm(omega):
    def transform(g, x):
        norm = np.linalg.norm(g)
        return g * (omega / norm) if norm > omega else g

    return transform


CASES = {
    "Descent": (optim.Descent(0.1), descent(0.1)),
    "Momentum": (optim.Momentum(0.05, 0.8), heavy_ball(0.05, 0.8)),
    "Nesterov": (optim.Nesterov(0.05, 0.9), nesterov(0.05, 0.9)),
    "Adam": (optim.Adam(0.1, (0.8, 0.99), 1e-3), adam(0.1, 0.8, 0.99, 1e-3)),
    "AdamW": (optim.AdamW(0.1, weight_decay=0.2), adam(0.1, 0.9, 0.999, 1e-8, 0.2)),
    "AdamW uncoupled": (
        optim.AdamW(0.1, weight_decay=0.05, couple=False),
        adam(0.1, 0.9, 0.999, 1e-8, 0.05, couple=False),
    ),
    "ClipGrad": (
        optim.OptimiserChain(optim.ClipGrad(0.5), optim.Descent(0.1)),
        clipped(lambda g, x: np.clip(g, -0.5, 0.5), 0.1),
    ),
    "ClipNorm": (
        optim.OptimiserChain(optim.ClipNorm(1.0), optim.Descent(0.1)),
        clipped(clip_norm(1.0), 0.1),
    ),
    "ClipNorm no throw": (
        optim.OptimiserChain(optim.ClipNorm(1.0, throw=False), optim.Descent(0.1)),
        clipped(clip_norm(1.0), 0.1),
    ),
    "WeightDecay": (
        optim.OptimiserChain(optim.WeightDecay(0.3), optim.Descent(0.1)),
        clipped(lambda g, x: g + 0.3 * x, 0.1),
    ),
    "SignDecay": (
        optim.OptimiserChain(optim.SignDecay(0.3), optim.Descent(0.1)),
        clipped(lambda g, x: g + 0.3 * np.sign(x), 0.1),
    ),
    "RMSProp": (optim.RMSProp(0.01, 0.8, 1e-3), rmsprop(0.01, 0.8, 1e-3)),
    "RMSProp centred": (
        optim.RMSProp(0.01, 0.8, 1e-3, centred=True),
        rmsprop(0.01, 0.8, 1e-3, centred=True),
    ),
    "AdaGrad": (optim.AdaGrad(0.2, 1e-3), adagrad(0.2, 1e-3)),
    "AdaBelief": (optim.AdaBelief(0.1, (0.8, 0.99), 1e-4), adabelief(0.1, 0.8, 0.99, 1e-4)),
    "Lion": (optim.Lion(0.05, (0.8, 0.95)), lion(0.05, 0.8, 0.95)),
    "Scheduled": (
        optim.Scheduled(optim.Descent(), optim.Step(0.2, decay=0.5, every=2)),
        lambda x: descent_with_rates(x, [0.2, 0.2, 0.1, 0.1, 0.05, 0.05]),
    ),
}


def descent_with_rates(x, rates):
    for eta in rates:
        x = x - eta * gradient_at(x)
    return x


@pytest.mark.parametrize("name", list(CASES))
def test_rule_matches_its_reference(backend, name):
    rule, reference = CASES[name]
    model = {"w": backend.asarray(X0), "note": "not a parameter"}
    state = optim.setup(rule, model)
    for _ in range(STEPS):
        g = backend.asarray(gradient_at(numpy_of(backend, model["w"])))
        state, model = optim.update(state, model, {"w": g, "note": None})
    assert model["note"] == "not a parameter"
    got = numpy_of(backend, model["w"])
    assert np.allclose(got, reference(X0.copy()), rtol=1e-10, atol=1e-12)
    assert type(model["w"]) is type(backend.asarray(X0))
    assert tg.backend.device_of(model["w"]) == backend.device


def test_updating_a_model_trains_it(backend):
    """A few Adam steps on a real model lower its loss, with float32 kept and the device too."""
    rng = np.random.default_rng(0)
    model = nn.Chain(
        nn.Dense(3, 8, nn.tanh, rng=rng, xp=backend.xp, device=backend.device),
        nn.Dense(8, 1, rng=rng, xp=backend.xp, device=backend.device),
    )
    x = backend.asarray(rng.standard_normal((16, 3)).astype(np.float32))
    y = backend.asarray(rng.standard_normal((16, 1)).astype(np.float32))
    state = optim.setup(optim.Adam(0.05), model)
    losses = []
    for _ in range(20):
        loss, (g,) = tg.withgradient(lambda m: nn.mse(m(x), y), model)
        state, model = optim.update(state, model, g)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    assert model.layers[0].weight.dtype == backend.xp.float32
    assert tg.backend.device_of(model.layers[1].bias) == backend.device


# --- the state tree
@dataclasses.dataclass
class Pair:
    left: object
    right: object


Point = collections.namedtuple("Point", "x y")


def test_nested_structures_and_none_gradients():
    model = {
        "list": [np.ones(2), 3],
        "tuple": (np.ones(1), "name"),
        "point": Point(np.ones(3), np.arange(3)),  # an integer array: not a parameter
        "pair": Pair(np.ones(2), None),
    }
    state = optim.setup(optim.Descent(0.5), model)
    assert isinstance(state["list"][0], optim.Leaf) and state["list"][1] is None
    assert state["point"].y is None and isinstance(state["pair"], Pair)
    grads = {
        "list": [np.ones(2), None],
        "tuple": (None, None),  # no gradient: the parameter stays
        "point": Point(np.full(3, 2.0), None),
        "pair": None,  # a whole subtree without gradient
    }
    new_state, new = optim.update(state, model, grads)
    assert np.allclose(new["list"][0], 0.5) and new["list"][1] == 3
    assert new["tuple"][0] is model["tuple"][0] and new["tuple"][1] == "name"
    assert isinstance(new["point"], Point) and np.allclose(new["point"].x, 0.0)
    assert new["pair"] is model["pair"]
    assert np.allclose(model["list"][0], 1.0)  # nothing was mutated


def test_update_is_functional_and_the_old_state_stays_valid():
    model = {"w": np.array([1.0, 2.0])}
    state = optim.setup(optim.Adam(0.1), model)
    g = {"w": np.array([1.0, -1.0])}
    s1, m1 = optim.update(state, model, g)
    s1_again, m1_again = optim.update(state, model, g)
    assert np.array_equal(m1["w"], m1_again["w"])
    assert np.array_equal(state["w"].state[0], [0.0, 0.0])


def test_adjust_changes_the_learning_rate_and_keeps_the_moments():
    model = {"w": np.array([1.0])}
    state = optim.setup(optim.OptimiserChain(optim.ClipGrad(1.0), optim.Momentum(0.1, 0.5)), model)
    state, model = optim.update(state, model, {"w": np.array([1.0])})
    adjusted = optim.adjust(state, eta=0.2)
    chain = adjusted["w"].rule
    assert chain.rules[1] == optim.Momentum(0.2, 0.5) and chain.rules[0] == optim.ClipGrad(1.0)
    _, model = optim.update(adjusted, model, {"w": np.array([1.0])})
    assert np.allclose(model["w"], 1.0 - 0.1 - (0.5 * 0.1 + 0.2))


def test_fused_steps_launch_only_for_arrays_they_take():
    """NumPy arrays step by a kernel (the native build, or the emulated one inside `on_host()`);
    arrays of other libraries step by the generic rule, with the same answer."""
    import array_api_strict as xs

    from tracker_gpu.cuda import native, on_host, recording

    def launched(w):
        with recording() as log:
            _, model = optim.update(optim.setup(optim.Descent(0.1), {"w": w}), {"w": w},
                                    {"w": w})  # fmt: skip
        assert np.allclose(np.asarray(model["w"]), 0.9)
        return [name for kind, name in log if kind == "launch"]

    assert launched(xs.ones(2, dtype=xs.float64)) == []
    with on_host(False):
        assert launched(np.ones(2)) == (["descent_step"] if native.available() else [])
    with on_host():  # NumPy standing in for device arrays
        assert launched(np.ones(2)) == ["descent_step"]


def _descent_setup():
    model = {"w": np.ones(2)}
    return optim.setup(optim.Descent(0.1), model), model


def test_gradients_of_another_dtype_are_cast():
    model = {"w": np.ones(2, dtype=np.float32)}
    state = optim.setup(optim.Adam(), model)
    _, model = optim.update(state, model, {"w": np.ones(2)})
    assert model["w"].dtype == np.float32


# --- bad input
def test_mismatched_model_and_gradient_structures():
    state, model = _descent_setup()
    with pytest.raises(
        ValueError, match=r"at the top level: the model has a dict with keys \['w'\]"
    ):
        optim.update(state, model, {"v": np.ones(2)})
    with pytest.raises(ValueError, match=r"the gradient of w has shape \(3,\), the parameter"):
        optim.update(state, model, {"w": np.ones(3)})
    nested = {"layers": [np.ones(2), np.ones(2)]}
    nested_state = optim.setup(optim.Descent(), nested)
    with pytest.raises(ValueError, match=r"at layers: the model has a list of 2, the gradient"):
        optim.update(nested_state, nested, {"layers": [np.ones(2)]})


def test_a_gradient_tuple_instead_of_the_gradient():
    rng = np.random.default_rng(0)
    model = nn.Dense(2, 2, rng=rng)
    state = optim.setup(optim.Descent(), model)
    grads = tg.gradient(lambda m: tg.sum(m(np.ones((1, 2), np.float32))), model)
    with pytest.raises(ValueError, match=r"pass grads\[0\]"):
        optim.update(state, model, grads)
    with pytest.raises(ValueError, match="the model has a Dense, the gradient has a tuple of 3"):
        optim.update(state, model, (1, 2, 3))


def test_a_state_made_for_another_model():
    state, model = _descent_setup()
    model2 = {"w": [np.ones(2)]}
    with pytest.raises(ValueError, match="at w: the model has a list of 1, the optimiser state"):
        optim.update({"w": [None, None]}, model2, {"w": [np.ones(2)]})
    with pytest.raises(ValueError, match="the optimiser state at w is a str, not a Leaf"):
        optim.update({"w": "adam"}, model, {"w": np.ones(2)})
    with pytest.raises(ValueError, match="no optimiser state for w"):
        optim.update({"w": None}, model, {"w": np.ones(2)})


def test_optimisers_jl_defaults():
    """Optimisers.jl's argument order and defaults."""
    assert optim.RMSProp() == optim.RMSProp(0.001, 0.9, 1e-8, centred=False)
    assert optim.AdaGrad() == optim.AdaGrad(0.1, 1e-8) and optim.Adagrad is optim.AdaGrad
    assert optim.AdaBelief() == optim.AdaBelief(0.001, (0.9, 0.999), 1e-16)
    assert optim.Lion() == optim.Lion(0.001, (0.9, 0.999))
    assert optim.SignDecay() == optim.SignDecay(1e-3)


def test_bad_hyperparameters():
    with pytest.raises(ValueError, match="eta must be >= 0"):
        optim.Adam(-1.0)
    with pytest.raises(ValueError, match=r"beta must be two numbers in \[0, 1\)"):
        optim.Adam(beta=(0.9, 1.0))
    with pytest.raises(TypeError, match="OptimiserChain takes rules"):
        optim.OptimiserChain(optim.Descent(), 0.1)
    with pytest.raises(TypeError, match="setup needs an optimisation rule"):
        optim.setup(0.1, {"w": np.ones(1)})


def test_clipnorm_refuses_a_nan_gradient(backend):
    model = {"w": backend.asarray(np.ones(2))}
    state = optim.setup(optim.OptimiserChain(optim.ClipNorm(1.0), optim.Descent()), model)
    with pytest.raises(FloatingPointError, match="2.0-norm nan"):
        optim.update(state, model, {"w": backend.asarray(np.array([math.nan, 1.0]))})
