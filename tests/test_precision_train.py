"""The main job in mixed precision (`--precision 32|16|bf16`): every model of both jobs trains a
few steps with float32 master weights, float32 gradients and optimiser state and half-precision
compute, eager and compiled, its gradients near float32's; float16's loss scale survives a
checkpoint; the command lines refuse what cannot run."""

import ml_dtypes
import numpy as np
import pytest
from conftest import BACKENDS

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.optim.tree import tree_map_with_path
from tracker_gpu.pytree import tree_leaves

pytest.importorskip("sklearn")
train = pytest.importorskip("tracker_gpu.train")
from tracker_gpu.train import loop, mixed, text_loop  # noqa: E402
from tracker_gpu.train.transformer import CharTransformer, text_loss  # noqa: E402

HALF = {"16": "float16", "bf16": "bfloat16"}
# The norm of the half-precision gradients' difference from float32's, relative to float32's
# norm (all the arrays together: an attention's key bias has a gradient of zero, which
# rounding makes a small one): float16 keeps 11 bits, bfloat16 8, and a ReLU or a max pool
# may pick another input.
TOLERANCE = {"32": 0.0, "16": 3e-2, "bf16": 1.5e-1}
STEPS = 3


def dtype_name(dtype):
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).rpartition(".")[2]


def floating(tree):
    return [x for x in tree_leaves(tree) if hasattr(x, "dtype") and "float" in dtype_name(x.dtype)]


def lacks(backend, precision):
    """Whether the backend's library has no dtype for `precision` (array-api-strict, Dask)."""
    return precision != "32" and not hasattr(backend.xp, HALF[precision]) and backend.xp is not np


# --- the models, tiny, with a batch and their loss under a precision
def digits_case(name, backend):
    rng = np.random.default_rng(0)
    model = train.RECIPES[name].build(rng=rng, xp=backend.xp, device=backend.device)
    x = backend.asarray(rng.random((16, 1, 8, 8)).astype(np.float32))
    y = backend.asarray(rng.integers(0, 10, 16))
    return model, x, y, lambda m, x, y, how: loop.loss_function(m, x, y, how)[0]


def text_case(backend):
    rng = np.random.default_rng(0)
    model = CharTransformer(12, 8, 16, 2, 1, dropout=0.0, rng=rng, xp=backend.xp,
                            device=backend.device)  # fmt: skip
    x = backend.asarray(rng.integers(0, 12, (4, 8)))
    y = backend.asarray(rng.integers(0, 12, (4, 8)))
    return model, x, y, text_loss


CASES = {
    "mlp": lambda b: digits_case("mlp", b),
    "cnn": lambda b: digits_case("cnn", b),
    "lstm": lambda b: digits_case("lstm", b),
    "text": text_case,
}


def make_step(case, precision, compiled):
    if case == "text":
        return text_loop.mixed_text_step(precision, compiled=compiled)
    return loop.mixed_step(precision, compiled=compiled)


def run_steps(case, step, model, state, x, y):
    for _ in range(STEPS):
        if case == "text":
            _, model, state = step(model, state, x, y)
        else:
            _, _, model, state = step(model, state, x, y)
    return model, state


def expected_compute(backend, precision):
    """The dtype of the model's output in the compute dtype: the half dtype, except NumPy's
    bfloat16 (ml_dtypes), whose matrix products NumPy gives in float32."""
    if precision == "bf16" and backend.xp is np:
        return "float32"
    return HALF.get(precision, "float32")


@pytest.mark.filterwarnings("error:tg.compile. no CUDA graph")  # on CuPy: never step by step
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("precision", ["32", "16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_array_has_its_dtype(backend, case, precision, compiled):
    if backend.name == "dask":
        pytest.skip("the jobs train on the eager backends (Dask: test_distributed.py)")
    model, x, y, loss = CASES[case](backend)
    if lacks(backend, precision):  # no such dtype: refused at the policy, naming the library
        with pytest.raises(TypeError, match="has no"):
            mixed.policy_of(precision).cast_to_compute(model)
        return
    how = mixed.Mixed(precision)
    # the compute arrays: the parameters as the model runs with them, and its output
    if how.policy is not None:
        for p in floating(how.policy.cast_to_compute(model)):
            assert dtype_name(p.dtype) == HALF[precision]
        out = how.policy.cast_to_compute(model)(x)
        assert dtype_name(out.dtype) == expected_compute(backend, precision)
        assert dtype_name(how.forward(model, x).dtype) == "float32"  # the policy's output
    # the gradients: float32, near float32's own
    (grads,) = tg.gradient(lambda m: loss(m, x, y, how), model)
    (reference,) = tg.gradient(lambda m: loss(m, x, y, None), model)
    pairs = list(zip(floating(grads), floating(reference)))
    assert pairs and len(floating(grads)) == len(floating(model))
    difference = norm = 0.0
    for g, r in pairs:
        g, r = backend.to_numpy(g), backend.to_numpy(r)
        assert g.dtype == np.float32
        difference += float(np.sum((g - r).astype(np.float64) ** 2))
        norm += float(np.sum(r.astype(np.float64) ** 2))
    assert difference**0.5 <= TOLERANCE[precision] * norm**0.5
    # a few steps: float32 master weights and optimiser state
    state = optim.setup(optim.Adam(1e-3), model)
    trained, state = run_steps(case, make_step(case, precision, compiled), model, state, x, y)
    # the moments (Adam's powers of beta are numbers: Python floats eager, 0-d float64 arrays
    # in a compiled step's replay, as a Python float is)
    params, moments = floating(trained), [a for a in floating(state) if a.ndim]
    assert params and moments
    for a in params + moments:
        assert dtype_name(a.dtype) == "float32"
        assert np.isfinite(backend.to_numpy(a)).all()
    changed = [not np.array_equal(backend.to_numpy(a), backend.to_numpy(b))
               for a, b in zip(params, floating(model))]  # fmt: skip
    assert any(changed)
    if compiled:  # the replayed step is the eager one, bit for bit
        eager, _ = run_steps(case, make_step(case, precision, False), model,
                             optim.setup(optim.Adam(1e-3), model), x, y)  # fmt: skip
        for a, b in zip(params, floating(eager)):
            assert np.array_equal(backend.to_numpy(a), backend.to_numpy(b))


# --- loss scaling in the job
@pytest.fixture(scope="module")
def digits():
    return train.digits()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_an_overflowing_scale_skips_steps_and_a_resumed_run_keeps_its_scale(
    digits, tmp_path, compiled
):
    """A scale of 2^40 overflows float16's gradients: the steps are skipped and the scale
    halves until they are finite; the checkpoint holds the scaler, and a resumed run goes on
    from it (not from a fresh scaler), ending bit for bit where the run that was not stopped
    ends. Compiled, the scaler and the optimiser's counts live on the device, and the
    checkpoint takes them so."""
    where = dict(data=digits, batch_size=64)
    make = lambda: loop.mixed_step("16", compiled=compiled)  # noqa: E731
    straight = make()
    straight.mixed.scaler = tg.LossScale(2.0**40)
    whole = train.train("mlp", epochs=2, step=straight, **where)
    scaler = straight.mixed.scaler.state_dict()
    assert scaler["skipped"] >= 20  # 2^40 down to 2^19 at least, one skip a halving
    assert scaler["scale"] < 2.0**20
    assert all(np.isfinite(a).all() for a in floating(whole.model))
    assert whole.test_accuracy > 0.8  # training went on after the skips

    first = make()
    first.mixed.scaler = tg.LossScale(2.0**40)
    path = str(tmp_path / "mlp.npz")
    train.train("mlp", epochs=1, step=first, save=path, **where)
    saved = optim.read_checkpoint_info(path)["loss_scale"]
    assert saved == first.mixed.scaler.state_dict() != tg.LossScale().state_dict()
    resumed_step = make()
    resumed = train.train("mlp", epochs=2, step=resumed_step, resume=path, **where)
    assert resumed_step.mixed.scaler.state_dict() == scaler
    assert resumed.history == whole.history
    for a, b in zip(floating(resumed.model), floating(whole.model)):
        assert np.array_equal(a, b)


@pytest.mark.filterwarnings("error:tg.compile. no CUDA graph")  # on CuPy: never step by step
@pytest.mark.parametrize("case", ["mlp", "text"])
def test_a_compiled_float16_step_skips_and_scales_on_the_device_as_the_eager_one(backend, case):
    """A scale of 2^20 overflows the first steps: the compiled step (its scaler on the device,
    nothing read back: a host read of a traced value would refuse the recording) skips the same
    steps, halves to the same scale and ends with the same weights as the eager one."""
    if backend.name == "dask" or lacks(backend, "16"):
        pytest.skip("float16 training on the eager backends that have float16")
    model, x, y, _ = CASES[case](backend)
    ends = {}
    for compiled in (False, True):
        step = make_step(case, "16", compiled)
        step.mixed.scaler = tg.LossScale(2.0**20, period=3)
        trained, state = model, optim.setup(optim.Adam(1e-3), model)
        for _ in range(3):
            trained, state = run_steps(case, step, trained, state, x, y)
        moments = [a for a in floating(state) if a.ndim]  # the counts: floats eagerly
        ends[compiled] = step.mixed.scaler.state_dict(), floating(trained), moments
    (eager_scaler, eager, eager_state), (scaler, weights, moments) = ends[False], ends[True]
    assert scaler == eager_scaler and scaler["skipped"] >= 1 and scaler["scale"] < 2.0**20
    for a, b in zip(weights + moments, eager + eager_state):
        assert np.array_equal(backend.to_numpy(a), backend.to_numpy(b))
    before = [backend.to_numpy(a) for a in floating(model)]
    assert any(not np.array_equal(backend.to_numpy(a), b) for a, b in zip(eager, before))


# --- the command lines
def refused(capsys, main, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_the_command_lines_refuse_what_cannot_run(capsys):
    from tracker_gpu.train import text_cli

    err = refused(capsys, train.main, ["--precision", "8", "--plot", ""])
    assert "invalid choice: '8'" in err
    err = refused(capsys, text_cli.main, ["--precision", "8", "--plot", ""])
    assert "invalid choice: '8'" in err
    pytest.importorskip("distributed")
    err = refused(capsys, train.main, ["--precision", "bf16", "--workers", "2", "--plot", ""])
    assert "leave --precision out" in err


def test_the_digits_job_trains_in_bfloat16_compiled(capsys):
    argv = ["--backend", "numpy", "--models", "mlp", "--epochs", "2", "--plot", "",
            "--no-progress", "--precision", "bf16", "--compile"]  # fmt: skip
    (result,) = train.run(argv)
    assert result.test_accuracy > 0.85
    assert all(a.dtype == np.float32 for a in floating(result.model))


def test_the_norms_compute_their_statistics_in_float32():
    """float16 squares overflow past 256 and bfloat16 keeps 8 bits: values near 3000 with a
    spread of 100 have an infinite float16 variance and no bfloat16 one; in float32 they are
    normalised, near float64's result, and given back in the input's dtype."""
    rng = np.random.default_rng(0)
    wide = rng.standard_normal((4, 3, 6)) * 300 + 3000
    layers = {
        "layer": (lambda d: nn.LayerNorm(6, dtype=d), (2,)),
        "group": (lambda d: nn.GroupNorm(3, 1, dtype=d), (1, 2)),
        "batch": (lambda d: nn.BatchNorm(3, dtype=d, active=True), (0, 2)),
        "instance": (lambda d: nn.InstanceNorm(3, dtype=d), (2,)),
    }
    for half, tolerance in (("float16", 3e-2), ("bfloat16", 1.5e-1)):
        x = wide.astype(ml_dtypes.bfloat16 if half == "bfloat16" else np.float16)
        exact = x.astype(np.float64)
        for name, (make, axes) in layers.items():
            y = make(half)(x)
            assert dtype_name(y.dtype) == half, name
            mean = exact.mean(axis=axes, keepdims=True)
            expected = (exact - mean) / np.sqrt(exact.var(axis=axes, keepdims=True) + 1e-5)
            error = np.abs(np.asarray(y, np.float64) - expected).max()
            assert error <= tolerance, (half, name, error)
        g, expected = layer_norm_gradients(x, half)
        assert dtype_name(g.dtype) == half
        error = np.abs(g.astype(np.float64) - expected).max()
        assert error <= tolerance * np.abs(expected).max(), (half, error)


def layer_norm_gradients(x, half):
    """The gradient of a weighted sum of `LayerNorm(6)(x)` in `half`, and in float64."""
    weights = np.random.default_rng(2).standard_normal(x.shape)

    def gradient(values, dtype):
        norm = nn.LayerNorm(6, dtype=dtype)
        (g,) = tg.gradient(lambda v: tg.sum(norm(v) * weights.astype(values.dtype)), values)
        return g

    return gradient(x, half), gradient(x.astype(np.float64), "float64")


def test_a_half_batchnorm_updates_its_running_statistics_from_float32_ones():
    """The squares of 32 deviations of 100 sum past float16's 65504: the batch's variance is
    taken in float32, the running statistics kept in the layer's float16."""
    x = (np.random.default_rng(1).standard_normal((8, 2, 4)) * 300 + 3000).astype(np.float16)
    bn = nn.BatchNorm(2, dtype="float16", active=True)
    bn(x)
    exact = x.astype(np.float64)
    assert bn.running_mean.dtype == np.float16 == bn.running_var.dtype
    for got, want in ((bn.running_mean, 0.1 * exact.mean(axis=(0, 2))),
                      (bn.running_var, 0.9 + 0.1 * exact.var(axis=(0, 2), ddof=1))):  # fmt: skip
        assert np.allclose(got.astype(np.float64), want, rtol=2e-3)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_a_batchnorm_under_a_policy_updates_its_float32_running_statistics(half):
    """The policy casts the weights, not the running statistics, which the layer updates in
    place: the model's own float32 ones move, by the batch's statistics."""
    x = np.random.default_rng(2).standard_normal((16, 3)).astype(np.float32) * 4 + 1
    bn = nn.BatchNorm(3)
    (g,) = tg.gradient(lambda m: tg.precision.sum(tg.Policy(compute_dtype=half)(m, x) ** 3), bn)
    assert dtype_name(g.scale.dtype) == "float32"
    assert bn.running_mean.dtype == np.float32 == bn.running_var.dtype
    exact = x.astype(np.float64)
    assert np.allclose(bn.running_mean, 0.1 * exact.mean(axis=0), rtol=1e-2, atol=1e-3)
    assert np.allclose(bn.running_var, 0.9 + 0.1 * exact.var(axis=0, ddof=1), rtol=1e-2)


def test_a_resumed_digits_run_keeps_the_checkpoints_precision_and_scale(tmp_path, capsys):
    args = ["--backend", "numpy", "--models", "mlp", "--plot", "", "--no-progress",
            "--batch-size", "256", "--save", str(tmp_path)]  # fmt: skip
    train.run([*args, "--epochs", "1", "--precision", "16"])
    saved = optim.read_checkpoint_info(str(tmp_path / "mlp.npz"))
    assert saved["settings"]["precision"] == "16" and saved["loss_scale"]["good"] == 6
    capsys.readouterr()
    train.run([*args, "--epochs", "2", "--resume", str(tmp_path)])
    assert "computing in float16 (float32 weights)" in capsys.readouterr().out
    again = optim.read_checkpoint_info(str(tmp_path / "mlp.npz"))
    assert again["settings"]["precision"] == "16"
    assert again["loss_scale"]["good"] == 12  # 6 steps an epoch, counted on from the saved 6


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", ["mlp", "text"])
def test_a_float16_step_whose_loss_overflows_is_skipped(case, compiled):
    """A forward pass that overflows float16 (inputs 1e5 times too large; an embedding 1e7
    times) makes a loss that is not finite: the step is skipped and the scale halved, as PyTorch's
    GradScaler does; the eager step raised BackError instead."""
    model, x, y, _ = CASES[case](BACKENDS["numpy"]())
    if case == "text":  # logits past float16's range, through the tied output layer
        model = tree_map_with_path(lambda p, a: a * 1e7 if p == "embed.weight" else a, model)
    else:
        x = x * 1e5
    step = make_step(case, "16", compiled)
    state = optim.setup(optim.Adam(1e-3), model)
    before = [np.array(a) for a in floating(model)]
    outputs = step(model, state, x, y)
    trained = outputs[1] if case == "text" else outputs[2]
    scaler = step.mixed.scaler.state_dict()
    assert not np.isfinite(float(outputs[0]))
    assert scaler["skipped"] == 1 and scaler["scale"] == 2.0**15 / 2
    assert all(np.array_equal(a, b) for a, b in zip(floating(trained), before))
