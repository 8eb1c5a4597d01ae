"""Precision: no silent promotion by the optimisers, half-precision parameters stepped without
losing Adam's epsilon, and bfloat16 (ml_dtypes' on NumPy, PyTorch's) accepted everywhere.

Every rule and schedule of `optim` is enumerated from its namespace (the list of
test_optim_more_state), so that one added later is covered."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import tracker_gpu as tg
from tests.test_optim_more_state import _names, make_model, make_rule, train
from tracker_gpu import nn, optim

torch = pytest.importorskip("torch")

BF16 = np.dtype(ml_dtypes.bfloat16)
KINDS = {
    "np.float64": np.float64,
    "np.float32": np.float32,
    "0-d float64 array": lambda v: np.asarray(v, dtype=np.float64),
}


def with_numbers(rule, kind):
    """`rule` rebuilt with each of its float hyperparameters (in nested rules, schedules and
    tuples too) passed through `kind`: as NumPy scalars, 0-d arrays, or Python floats."""
    if isinstance(rule, float):
        return kind(rule)
    if isinstance(rule, tuple):
        return tuple(with_numbers(v, kind) for v in rule)
    if isinstance(rule, optim.OptimiserChain):
        return optim.OptimiserChain(*(with_numbers(r, kind) for r in rule.rules))
    if dataclasses.is_dataclass(rule):
        changes = {
            f.name: with_numbers(getattr(rule, f.name), kind) for f in dataclasses.fields(rule)
        }
        return dataclasses.replace(rule, **changes)
    return rule


def state_arrays(state):
    if isinstance(state, (tuple, list)):
        return [a for part in state for a in state_arrays(part)]
    if state is None or type(state) in (int, float):
        return []
    a = np.asarray(tg.data(state))
    return [a] if a.ndim else []  # 0-d: a step count, float64 by design


def gradients(shape, steps, seed=0):
    """Gradients of mixed sizes: ones whose square underflows float16, zeros, ones near 1."""
    rng = np.random.default_rng(seed)
    scales = np.array([1e-5, 1e-3, 0.0, 1.0, 0.1, 3e-5])[np.arange(np.prod(shape)) % 6]
    return [rng.standard_normal(shape) * scales.reshape(shape) for _ in range(steps)]


def run(rule, param, grads):
    state = optim.setup(rule, {"w": param})
    model = {"w": param}
    for g in grads:
        state, model = optim.update(state, model, {"w": g.astype(param.dtype)})
    return model["w"], state["w"].state


# --- 1. no silent promotion
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", _names())
def test_numpy_hyperparameters_keep_float32(name, kind):
    given = with_numbers(make_rule(name), KINDS[kind])
    reference = with_numbers(make_rule(name), lambda v: float(KINDS[kind](v)))
    param = np.random.default_rng(1).standard_normal((3, 2)).astype(np.float32)
    grads = gradients((3, 2), 4)
    got, got_state = run(given, param, grads)
    expected, expected_state = run(reference, param, grads)
    assert got.dtype == np.float32, f"{name} with {kind}: the parameter became {got.dtype}"
    assert np.array_equal(got, expected), f"{name} with {kind}: not the Python floats' step"
    for a, b in zip(state_arrays(got_state), state_arrays(expected_state), strict=True):
        assert a.dtype == np.float32, f"{name} with {kind}: a state array is {a.dtype}"
        assert np.array_equal(a, b)


@pytest.mark.parametrize("kind", list(KINDS))
def test_adjust_with_a_numpy_rate_keeps_float32(kind):
    model = {"w": np.ones(3, np.float32)}
    state = optim.adjust(optim.setup(optim.AdamW(weight_decay=0.1), model), eta=KINDS[kind](0.5))
    state, model = optim.update(state, model, {"w": np.ones(3, np.float32)})
    assert model["w"].dtype == np.float32 and state["w"].rule.eta == 0.5


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Descent", "RMSProp", "Lion"])
def test_a_0d_float64_array_of_another_library_keeps_float32(name):
    """array-api-strict promotes float32 by a 0-d float64 array (the standard's rule): the
    parameters and state are cast back, to within float32 of the Python number's step."""
    xs = pytest.importorskip("array_api_strict")
    rule = getattr(optim, name)(xs.asarray(0.01, dtype=xs.float64))
    param = np.random.default_rng(1).standard_normal((3, 2)).astype(np.float32)
    model = {"w": xs.asarray(param)}
    state = optim.setup(rule, model)
    for g in gradients((3, 2), 3):
        state, model = optim.update(state, model, {"w": xs.asarray(g.astype(np.float32))})
    assert model["w"].dtype == xs.float32
    assert array_dtypes(state["w"].state) <= {xs.float32}
    expected, _ = run(getattr(optim, name)(0.01), param, gradients((3, 2), 3))
    assert np.allclose(nn.to_numpy(model["w"]), expected, rtol=1e-5, atol=1e-6)


def array_dtypes(state):
    """The dtypes of the arrays of a state (not its 0-d counts), of any library."""
    if isinstance(state, (tuple, list)):
        return set().union(*(array_dtypes(part) for part in state))
    return {state.dtype} if getattr(state, "ndim", 0) else set()


def test_a_numpy_hyperparameter_is_checked_as_a_number():
    with pytest.raises(ValueError, match="eta must be >= 0"):
        optim.Descent(np.float64(-1.0))
    with pytest.raises(ValueError, match="beta must be two numbers"):
        optim.Adam(beta=(np.float32(0.9), np.float64(1.5)))


def test_a_rule_that_promotes_is_cast_back_to_the_parameters_dtype():
    """A rule of one's own computing in float64: the parameter and its state keep float32."""

    @dataclasses.dataclass(frozen=True)
    class Wide(optim.Rule):
        def init(self, x):
            return np.zeros_like(x)

        def apply(self, state, x, dx):
            return state + dx.astype(np.float64), dx.astype(np.float64) * 0.5

    model = {"w": np.ones(2, np.float32)}
    state, model = optim.update(optim.setup(Wide(), model), model, {"w": np.ones(2, np.float32)})
    assert model["w"].dtype == np.float32 and state["w"].state.dtype == np.float32
    assert np.array_equal(model["w"], [0.5, 0.5])


def test_tracked_arithmetic_promotes_as_the_library_does():
    """A tracked value is the plain expression's value: NumPy 2 promotes float32 by a NumPy
    float64 scalar (NEP 50) but not by a Python float, and so do tracked arrays."""
    x = np.ones(3, np.float32)
    for scalar in (np.float64(2.0), 2.0, np.float32(2.0), np.asarray(2.0)):
        plain = x * scalar
        tracked = tg.param(x) * scalar
        assert tracked.dtype == plain.dtype, f"{type(scalar).__name__}"
        _, (g,) = tg.withgradient(lambda x, s=scalar: tg.sum(x * s), x)
        assert g.dtype == np.float32


# --- 2. half-precision parameters step in float32
def ulp(x, dtype):
    """The spacing of `dtype` at the magnitude of each element of `x` (float64)."""
    eps = float(ml_dtypes.finfo(dtype).eps)
    tiny = float(ml_dtypes.finfo(dtype).smallest_normal)
    return eps * 2.0 ** np.floor(np.log2(np.maximum(np.abs(x), tiny)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", _names())
def test_half_precision_parameters_step_as_float64_rounded(name, dtype):
    """Each rule on float16 (bfloat16) parameters, against the same rule in float64 whose
    parameters are rounded to float16 after each step (what a half-precision parameter holds),
    fed the same gradients: equal to within an ulp or two, and finite (Adam's epsilon 1e-8 is 0
    in float16; a zero gradient made 0/0)."""
    half = np.dtype(dtype) if dtype == "float16" else BF16
    steps = 5
    param = (np.random.default_rng(2).uniform(-0.25, 0.25, (3, 4))).astype(half)
    grads = [g.astype(half) for g in gradients((3, 4), steps)]
    got, got_state = run(make_rule(name), param, grads)
    assert got.dtype == half, f"{name}: the parameter became {got.dtype}"
    for a in state_arrays(got_state):
        assert a.dtype == np.float32, f"{name}: a state array of a {dtype} parameter is {a.dtype}"
    rule = make_rule(name)
    state = optim.setup(rule, {"w": param.astype(np.float64)})["w"].state
    reference = param.astype(np.float64)
    for g in grads:
        reference, state = optim.step(rule, reference, g.astype(np.float64), state)
        reference = reference.astype(half).astype(np.float64)
    got = got.astype(np.float64)
    assert np.all(np.isfinite(got)), f"{name}: {got}"
    far = np.abs(got - reference) > 2 * steps * ulp(reference, half)
    assert not far.any(), f"{name}: {got[far]} where float64 gives {reference[far]}"


@pytest.mark.parametrize("name", _names())
def test_a_float16_run_resumes_from_a_checkpoint_bit_for_bit(name, tmp_path):
    """The float32 state of float16 parameters is saved and loaded as it is."""
    rule = make_rule(name)
    model = make_model("float16")
    state = optim.setup(rule, model)
    straight, straight_state = train(model, state, 4, 0)
    half, half_state = train(model, state, 2, 0)
    optim.save_checkpoint(tmp_path / "run.npz", half, half_state)
    loaded, loaded_state, _ = optim.load_checkpoint(tmp_path / "run.npz", make_model("float16"))
    resumed, resumed_state = train(loaded, loaded_state, 2, 2)
    for k in ("w", "b"):
        assert resumed[k].dtype == np.float16 and np.array_equal(straight[k], resumed[k]), k
        for a, b in zip(
            state_arrays(straight_state[k].state), state_arrays(resumed_state[k].state)
        ):
            assert a.dtype == b.dtype == np.float32 and np.array_equal(a, b)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", _names())
def test_a_float32_run_loaded_into_half_parameters_keeps_its_state_in_float32(
    name, dtype, tmp_path
):
    """As `setup` makes the state of half-precision parameters: float32 (the moments were cast
    to float16 on loading, and Adam's second moment underflowed to 0)."""
    rule = make_rule(name)
    model = make_model("float32")
    trained, state = train(model, optim.setup(rule, model), 2, 0)
    optim.save_checkpoint(tmp_path / "run.npz", trained, state)
    half = make_model(BF16 if dtype == "bfloat16" else np.float16)
    _, loaded_state, _ = optim.load_checkpoint(tmp_path / "run.npz", half)
    fresh = optim.setup(rule, half)
    for k in ("w", "b"):
        kept = state_arrays(loaded_state[k].state)
        made = state_arrays(fresh[k].state)
        assert [a.dtype for a in kept] == [a.dtype for a in made], (k, name)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "NAdam", "AMSGrad", "AdaBelief", "AdaMax"])
def test_adam_in_float16_moves_where_float16_arithmetic_would_not(name):
    """The test above can fail: Adam stepped in float16 itself gives nan (epsilon is 0)."""
    got, _ = run(getattr(optim, name)(), np.zeros(4, np.float16), [np.full(4, 1e-5)] * 3)
    assert np.all(np.isfinite(got)) and np.all(got < 0)


# --- 3. bfloat16
def mlp(xp, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return nn.Chain(
        nn.Dense(4, 8, tg.tanh, rng=rng, dtype=dtype, xp=xp),
        nn.Dense(8, 3, rng=rng, dtype=dtype, xp=xp),
    )


def mlp_loss(model, x):
    return tg.mean(model(x) ** 2)


@pytest.mark.parametrize("xp", ["numpy", "torch"])
def test_bfloat16_mlp_gradients_match_float64(xp):
    model = mlp(xp, "bfloat16")
    x = nn.asarray(np.random.default_rng(3).standard_normal((6, 4)), xp=xp, dtype="bfloat16")
    value, (grads, _) = tg.withgradient(mlp_loss, model, x)
    wide = nn.place(model, dtype="float64")
    expected_value, (expected, _) = tg.withgradient(mlp_loss, wide, nn.place(x, dtype="float64"))
    assert abs(float(value) - float(expected_value)) <= 0.03 * abs(float(expected_value))
    for layer, wide_layer in zip(grads.layers, expected.layers):
        for field in ("weight", "bias"):
            g, e = getattr(layer, field), nn.to_numpy(getattr(wide_layer, field))
            assert nn.to_numpy(g).dtype == BF16 if xp == "numpy" else g.dtype == torch.bfloat16
            g = nn.to_numpy(g).astype(np.float64)
            assert np.allclose(g, e, rtol=0.03, atol=0.03 * np.abs(e).max()), field


@pytest.mark.parametrize("xp", ["numpy", "torch"])
def test_bfloat16_trains_with_adam(xp):
    model = mlp(xp, "bfloat16")
    x = nn.asarray(np.random.default_rng(3).standard_normal((6, 4)), xp=xp, dtype="bfloat16")
    state = optim.setup(optim.Adam(0.01), model)
    first = None
    for _ in range(20):
        value, (grads, _) = tg.withgradient(mlp_loss, model, x)
        first = float(value) if first is None else first
        state, model = optim.update(state, model, grads)
    weight, moment = model.layers[0].weight, state.layers[0].weight.state[0]
    assert nn.to_numpy(weight).dtype == BF16 if xp == "numpy" else weight.dtype == torch.bfloat16
    assert "float32" in str(moment.dtype)
    assert float(value) < 0.5 * first


def test_bfloat16_parameters_and_gradients_on_numpy():
    x = np.array([1.0, -2.0, 0.5], BF16)
    g = tg.gradient(lambda x: tg.sum(x * x), x)[0]
    assert g.dtype == BF16 and np.array_equal(g.astype(np.float64), [2.0, -4.0, 1.0])
    assert tg.param(x).dtype == BF16


BF16_AS_NUMPY = {  # functions that once asked NumPy's isdtype of bfloat16, which refuses it
    "vector_norm": (tg.linalg.vector_norm, np.linalg.vector_norm),
    "fft": (tg.fft.fft, np.fft.fft),
    "rfft": (tg.fft.rfft, np.fft.rfft),
    # NumPy's gradient takes bfloat16 for an integer type (float64); bfloat16 minus bfloat16
    # over a Python number's spacing is float32, as bfloat16 times a Python float is
    "numerical_gradient": (tg.numerical_gradient, lambda x: np.gradient(x.astype(np.float32))),
}


@pytest.mark.parametrize("name", list(BF16_AS_NUMPY))
def test_bfloat16_functions_answer_as_numpy_on_bfloat16(name):
    tracked, plain = BF16_AS_NUMPY[name]
    x = np.array([1.0, -2.0, 0.5, 3.0], BF16)
    got, expected = tg.data(tracked(tg.param(x))), plain(x)
    assert got.dtype == expected.dtype and np.allclose(got, expected, rtol=1e-6)


def test_bfloat16_nan_to_num_replaces_with_bfloat16s_ends():
    x = np.array([np.nan, np.inf, -np.inf, 1.5], BF16)  # NumPy's own leaves bfloat16 as it is
    largest = float(ml_dtypes.finfo(BF16).max)
    got = tg.data(tg.nan_to_num(tg.param(x)))
    assert got.dtype == BF16 and got.astype(np.float64).tolist() == [0, largest, -largest, 1.5]


def test_bfloat16_where_the_library_lacks_it_is_refused_naming_it():
    with pytest.raises(TypeError, match="array_api_strict has no bfloat16"):
        nn.Dense(2, 2, dtype="bfloat16", xp="strict")
    with pytest.raises(TypeError, match="array_api_strict has no float16"):
        nn.place({"w": np.ones(2)}, xp="strict", dtype="float16")
