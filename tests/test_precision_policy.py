"""Mixed precision's policy (float32 master weights, half-precision compute), the reductions in
float32, and loss scaling, checked against float64 and against PyTorch."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim, precision

torch = pytest.importorskip("torch")

BF16 = np.dtype(ml_dtypes.bfloat16)
HALVES = {"float16": np.dtype(np.float16), "bfloat16": BF16}
# The relative error of a small model's float16 or bfloat16 forward and backward.
TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2}


def mlp(seed=0):
    rng = np.random.default_rng(seed)
    return nn.Chain(nn.Dense(4, 16, tg.tanh, rng=rng), nn.Dense(16, 3, rng=rng))


def data(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8)


@pytest.mark.parametrize("compute", ["float16", "bfloat16"])
def test_the_policy_computes_in_half_and_gives_float32_gradients_to_the_masters(compute):
    policy = tg.Policy(compute_dtype=compute)
    model, (x, labels) = mlp(), data()

    seen = []

    def loss(m):
        logits = policy.cast_to_compute(m)(policy.cast_to_compute(x))
        seen.append(logits.dtype)
        return precision.logitcrossentropy(logits, labels)

    value, (grads,) = tg.withgradient(loss, model)
    # NumPy's bfloat16 (ml_dtypes) multiplies matrices into float32, as NumPy promotes it
    assert seen == [HALVES[compute] if compute == "float16" else np.float32]
    assert value.dtype == np.float32
    reference = lambda m: nn.logitcrossentropy(m(x.astype(np.float64)), labels)
    wide = nn.place(model, dtype="float64")
    expected_value, (expected,) = tg.withgradient(reference, wide)
    tol = TOLERANCE[compute]
    assert abs(float(value) - float(expected_value)) <= tol * abs(float(expected_value))
    for got, want in zip(grads.layers, expected.layers):
        for field in ("weight", "bias"):
            g, e = getattr(got, field), getattr(want, field)
            assert g.dtype == np.float32, f"{field} gradient is {g.dtype}"
            assert np.allclose(g, e, rtol=tol, atol=tol * np.abs(e).max()), field


def test_the_policy_on_torch_computes_in_bfloat16():
    policy = tg.Policy(compute_dtype="bfloat16")
    model = nn.place(mlp(), xp="torch")
    x, labels = data()
    x, labels = torch.asarray(x), torch.asarray(labels)
    logits = policy.cast_to_compute(model)(policy.cast_to_compute(x))
    assert logits.dtype == torch.bfloat16
    value, (grads,) = tg.withgradient(
        lambda m: precision.logitcrossentropy(policy(m, x), labels), model
    )
    assert value.dtype == torch.float32 and grads.layers[0].weight.dtype == torch.float32
    wide = nn.place(mlp(), dtype="float64")
    expected_value = nn.logitcrossentropy(wide(x.numpy().astype(np.float64)), labels.numpy())
    assert abs(float(value) - float(expected_value)) <= 0.05 * abs(float(expected_value))


def test_the_policy_output_dtype_and_a_call():
    policy = tg.Policy(compute_dtype="bfloat16", output_dtype="float32")
    model, (x, _) = mlp(), data()
    y = policy(model, x)
    assert y.dtype == np.float32
    expected = model(policy.cast_to_compute(x).astype(np.float64))  # half inputs, wide maths
    assert np.allclose(y, expected, rtol=0.05, atol=0.05 * np.abs(expected).max())
    assert tg.Policy().output_dtype == "float32"
    assert tg.Policy("float32", "float16").cast_to_param(np.ones(2, np.float16)).dtype == "float32"


def test_a_policy_is_refused_where_the_library_lacks_its_dtype():
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        tg.Policy(compute_dtype="half")
    strict = pytest.importorskip("array_api_strict")
    with pytest.raises(TypeError, match="array_api_strict has no bfloat16"):
        tg.Policy(compute_dtype="bfloat16").cast_to_compute(strict.ones(2))


@pytest.mark.parametrize("name", list(precision.IN_FLOAT32))
@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_reductions_accumulate_in_float32(name, half):
    """Against the same function in float64 of the same half-precision values: within
    float32's error, where the half-precision computation is not; the gradient comes back in
    the input's dtype."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((64, 5)) * 4 + 300).astype(HALVES[half])
    labels = rng.integers(0, 5, 64)
    wide, cast_back = precision.IN_FLOAT32[name]
    call = lambda f, x: f(x, labels) if "entropy" in name else f(x)
    if name == "crossentropy":
        x = nn.softmax(rng.standard_normal((64, 5))).astype(HALVES[half])  # no clamped zeros
    got = call(getattr(precision, name), x)
    want = np.asarray(call(wide, x.astype(np.float64)))
    expected_dtype = HALVES[half] if cast_back else np.float32
    assert got.dtype == expected_dtype
    tol = float(ml_dtypes.finfo(expected_dtype).eps) * 4
    assert np.allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * np.abs(want).max())
    (g,) = tg.gradient(lambda x: tg.sum(call(getattr(precision, name), x)), x)
    assert g.dtype == HALVES[half]


def test_a_float16_sum_overflows_without_the_float32_reduction():
    big = np.full(8, 30000.0, np.float16)
    with np.errstate(over="ignore"):
        assert not np.isfinite(float(tg.sum(big)))
    assert float(precision.sum(big)) == 240000.0


# --- loss scaling
def test_dynamic_scale_grows_after_its_period_and_halves_on_overflow():
    scaler = tg.LossScale(16.0, period=3)
    for _ in range(3):
        scaler = scaler.after(True)
    assert (scaler.scale, scaler.good) == (32.0, 0)
    scaler = scaler.after(True).after(False)
    assert (scaler.scale, scaler.good, scaler.skipped) == (16.0, 0, 1)
    assert tg.LossScale(1.0).after(False).scale == 1.0  # not below the minimum
    static = tg.LossScale(16.0, dynamic=False)
    assert static.after(False).after(True).scale == 16.0
    placed = static.placed(np.ones(1, np.float32)).after(np.asarray(False))
    assert placed.state_dict() == static.after(False).state_dict()


@pytest.mark.parametrize("placed", [False, True], ids=["host", "device"])
def test_loss_scaling_matches_pytorchs_gradscaler(placed):
    """The same scale schedule as torch.amp.GradScaler over finite and overflowing steps, with
    the scaler's numbers on the host and as 0-d arrays (the finite flag then an array too)."""
    steps = [True, True, False, True, True, True, False, False, True]
    scaler = tg.LossScale(2.0**4, period=2)
    if placed:
        scaler = scaler.placed(np.ones(1, np.float32))
    param = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([param], lr=0.0)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=2)
    for finite in steps:
        opt.zero_grad()
        loss = param.sum() * (1.0 if finite else float("inf"))
        theirs.scale(loss).backward()
        theirs.step(opt)
        theirs.update()
        scaler = scaler.after(np.asarray(finite) if placed else finite)
        assert float(scaler.scale) == theirs.get_scale()
    if placed:
        assert scaler.state_dict()["skipped"] == steps.count(False)


@pytest.mark.parametrize("compute", ["float16", "bfloat16"])
def test_an_overflowing_step_is_skipped_and_training_goes_on(compute, tmp_path):
    policy = tg.Policy(compute_dtype=compute)
    model, (x, labels) = mlp(), data()
    state = optim.setup(optim.Adam(0.01), model)
    scaler = tg.LossScale(2.0**8, period=2)

    def loss(m, blow_up):
        value = precision.logitcrossentropy(policy(m, x), labels)
        if blow_up:  # a finite loss whose gradient is nan: sqrt's derivative at 0 times 0
            value = value + tg.sum(tg.sqrt(m.layers[0].weight * 0.0))
        return value

    def train(scaler, state, model, blow_up=False):
        with np.errstate(divide="ignore", invalid="ignore"):
            _, (grads, _) = tg.withgradient(lambda m, b: scaler.scaled(loss(m, b)), model, blow_up)
        return scaler.update(state, model, grads)

    scaler, state, model = train(scaler, state, model)
    before_model, before_state = model, state
    scaler, state, model = train(scaler, state, model, blow_up=True)
    assert scaler.scale == 2.0**7 and scaler.skipped == 1 and scaler.good == 0
    assert model is before_model and state is before_state  # nothing lost, nothing stepped
    first = float(loss(model, False))
    for _ in range(10):
        scaler, state, model = train(scaler, state, model)
    assert float(loss(model, False)) < first and scaler.skipped == 1
    assert scaler.scale > 2.0**7 and model.layers[0].weight.dtype == np.float32

    path = tmp_path / "run.npz"
    optim.save_checkpoint(path, model, state, loss_scale=scaler.state_dict())
    _, _, info = optim.load_checkpoint(path, mlp(seed=5))
    assert tg.LossScale(**info["loss_scale"]) == scaler


def test_the_device_scalers_check_is_one_launch_on_the_fused_path():
    """A placed scaler on the fused path (`on_host()`, CuPy's stand-in) checks the four
    gradients in one launch and one reduction, and skips and steps as the generic path does."""
    from tracker_gpu.cuda import generic_only, on_host, recording

    model, (x, labels) = mlp(), data()
    results = []
    for fused in (True, False):
        scaler = tg.LossScale(2.0**8, period=2).placed(x)
        state, current, checks = optim.setup(optim.Adam(0.01), model), model, []
        for factor in (1.0, np.nan, 1.0):  # nan: every gradient nan, the step skipped
            loss = lambda m, s=scaler, k=factor: s.scaled(nn.logitcrossentropy(m(x), labels) * k)
            with np.errstate(all="ignore"), tg.sync_checks(False):
                with on_host() if fused else generic_only(), recording() as log:
                    _, (grads,) = tg.withgradient(loss, current)
                    scaler, state, current = scaler.update(state, current, grads)
            checks.append([name for kind, name in log if kind == "launch"].count("finite_partials"))
        results.append((scaler.state_dict(), current, checks))
    (fused_scaler, fused_model, fused_checks), (scaler, model_after, generic_checks) = results
    assert fused_checks == [1, 1, 1] and generic_checks == [0, 0, 0]
    assert fused_scaler == scaler and fused_scaler["skipped"] == 1
    for a, b in zip(fused_model.layers, model_after.layers):
        assert np.allclose(a.weight, b.weight, rtol=1e-6) and np.allclose(a.bias, b.bias, rtol=1e-6)


CLIPPING = {
    "ClipNorm in the chain": (optim.OptimiserChain(optim.ClipNorm(1.0), optim.Adam(0.1)), None),
    "ClipGrad in the chain": (optim.OptimiserChain(optim.ClipGrad(1.0), optim.Adam(0.1)), None),
    "clip_grad_norm(throw=True) before the step": (
        optim.Adam(0.1),
        lambda g: optim.clip_grad_norm(g, 1.0, throw=True)[0],
    ),
}


@pytest.mark.parametrize("clipping", CLIPPING)
def test_a_placed_scaler_skips_a_non_finite_step_where_clipping_would_refuse_it(clipping):
    """The host scaler skips an overflowed step before the optimiser runs; the placed one runs
    it anyway (no value read back) and must not let a clipping rule that refuses a non-finite
    norm raise: it skips, as the host one, and the next finite step is the host one's."""
    rule, before = CLIPPING[clipping]
    finals = []
    for placed in (False, True):
        model = {"w": np.ones(3, np.float32)}
        state, scaler = optim.setup(rule, model), tg.LossScale(2.0**8)
        scaler = scaler.placed(model["w"]) if placed else scaler
        for g in ([1.0, np.inf, 2.0], [1.0, np.nan, 2.0], [256.0, -512.0, 128.0]):
            grads = {"w": np.array(g, np.float32)}
            with np.errstate(invalid="ignore"):
                scaler, state, model = scaler.update(state, model, grads, before_step=before)
        finals.append((scaler.state_dict(), np.asarray(model["w"])))
    (host_scaler, host_w), (placed_scaler, placed_w) = finals
    assert host_scaler == placed_scaler and host_scaler["skipped"] == 2
    np.testing.assert_array_equal(placed_w, host_w)
    assert not np.array_equal(host_w, np.ones(3, np.float32))  # the last step was taken


def test_a_float16_scale_too_large_overflows_the_gradients_and_halves_until_it_fits():
    policy = tg.Policy(compute_dtype="float16")
    model, (x, labels) = mlp(), data()
    state = optim.setup(optim.Adam(0.01), model)
    scaler = tg.LossScale(2.0**30, period=1000)
    loss = lambda m: precision.logitcrossentropy(policy(m, x), labels)
    first = float(loss(model))
    for _ in range(25):
        with np.errstate(over="ignore", invalid="ignore"):
            _, (grads,) = tg.withgradient(lambda m, s=scaler: s.scaled(loss(m)), model)
        scaler, state, model = scaler.update(state, model, grads)
    assert scaler.skipped >= 5 and scaler.scale == 2.0 ** (30 - scaler.skipped)
    assert scaler.good == 25 - scaler.skipped  # each skip came before every finite step
    assert all(np.isfinite(layer.weight).all() for layer in model.layers)
    assert float(loss(model)) < first


def test_a_float16_loss_is_scaled_in_float32_and_an_overflow_skips_the_step():
    """A float16 loss of 2 times 2^15 was inf in float16, and the scale 2^16 is float16's inf:
    the backward pass refused the loss before the scaler saw a gradient. Scaled in float32 (as
    PyTorch's scaler does), a float16 gradient that overflows skips the step and halves."""
    w = np.array([2.0, 1.0], np.float32)
    state, scaler = optim.setup(optim.Descent(0.01), w), tg.LossScale(2.0**15, period=1)
    loss = lambda w: tg.sum(tg.astype(w, np.float16) ** 2)  # noqa: E731, a float16 loss of 5
    skipped, overflows = [], []
    for _ in range(6):
        expected = float(loss(w)) * scaler.scale
        overflows.append(2 * float(np.float16(w.max())) * scaler.scale > 65504)  # float16's max
        with np.errstate(over="ignore", invalid="ignore"):
            value, (grads,) = tg.withgradient(lambda w, s=scaler: s.scaled(loss(w)), w)
        assert value.dtype == np.float32 and value == np.float32(expected)
        before = w
        scaler, state, w = scaler.update(state, w, grads)
        skipped.append(w is before)
    assert skipped == overflows and True in skipped and False in skipped
    assert all(np.isfinite(w)) and w.dtype == np.float32 and float(w[0]) < 2.0


def test_the_unscaled_gradients_are_the_gradients():
    """Scaling the loss and unscaling the gradients gives the float64 gradients of the loss
    (float16 compute), where without scaling the small gradients underflow."""
    policy = tg.Policy(compute_dtype="float16")
    model, (x, labels) = mlp(), data()
    small = lambda m: precision.logitcrossentropy(policy(m, x), labels) * 1e-6
    scaler = tg.LossScale(2.0**16)
    (scaled,) = tg.gradient(lambda m: scaler.scaled(small(m)), model)
    (unscaled,) = tg.gradient(small, model)
    wide = lambda m: nn.logitcrossentropy(m(x.astype(np.float64)), labels) * 1e-6
    (want,) = tg.gradient(wide, nn.place(model, dtype="float64"))
    want = want.layers[0].weight
    got = scaler.unscaled(scaled).layers[0].weight
    assert got.dtype == np.float32
    assert np.allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    lost = unscaled.layers[0].weight
    assert not np.allclose(lost, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize("placed", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("scale", [2.0**15, 2.0**25])
def test_half_gradients_are_unscaled_through_float32(scale, placed):
    """The inverse of a scale over 2^24 is 0 in float16: the gradients came out 0, and the
    step counted as good. Through float32, each is the float32 quotient rounded once."""
    g = np.array([2.0**-5, -(2.0**-3), 1.0], np.float16) * np.float16(2.0**10)
    scaler = tg.LossScale(scale).placed(g) if placed else tg.LossScale(scale)
    got = scaler.unscaled({"w": g})["w"]
    want = (g.astype(np.float32) / np.float32(scale)).astype(np.float16)
    assert got.dtype == np.float16 and np.array_equal(got, want) and np.all(want != 0)


@pytest.mark.parametrize("placed", [False, True], ids=["host", "device"])
def test_the_scale_never_grows_to_infinity(placed):
    """PyTorch's GradScaler grows only to a finite scale: an infinite one skipped every
    step from then on, and its state could not be loaded again."""
    top = 2.0**127 if placed else 2.0**1023  # float32's, float64's largest power of two
    scaler = tg.LossScale(top / 2, period=1)
    scaler = scaler.placed(np.zeros(1, np.float32)) if placed else scaler
    for _ in range(3):
        scaler = scaler.after(np.asarray(True) if placed else True)
    assert float(tg.data(scaler.scale)) == top
    assert tg.LossScale(**scaler.state_dict()).scale == top  # loads again


def test_bad_loss_scales_are_refused():
    with pytest.raises(ValueError, match="factor must be > 1"):
        tg.LossScale(factor=1.0)
    with pytest.raises(TypeError, match="scale must be a Python number"):
        tg.LossScale(np.ones(2))
    with pytest.raises(ValueError, match="period must be at least 1"):
        tg.LossScale(period=0)
    assert dataclasses.asdict(tg.LossScale()) == tg.LossScale().state_dict()
