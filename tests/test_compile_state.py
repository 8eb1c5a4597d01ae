"""tg.compile against eager, beyond single calls: layer state, arguments outside `wrt`, what
`f` returns (`gradient=`), `fallback=True` running `f` once, checks that a replay raises as
eagerly, every optimiser and schedule, and bit-for-bit sums."""

import numpy as np
import pytest

import tracker_gpu as tg
from tests.compiling import CALLS, F64, LAYERS, counted, equal, floats, layer_classes, leaves, total
from tracker_gpu import nn, optim


# --- issue 28, state, arguments outside wrt, what f returns, fallback, checks, bits
def _against_eager(make_layer, make_input, mode, calls=CALLS, wrt=None):
    """A layer's loss compiled and eager on two copies of the layer: value, gradients and the
    layer's arrays after each call equal, f run once per call. Whether a call changed them."""
    import copy

    eager_layer = make_layer()
    if mode != "auto":
        eager_layer = nn.trainmode(eager_layer) if mode == "train" else nn.testmode(eager_layer)
    compiled_layer = copy.deepcopy(eager_layer)
    f = lambda m, x: total(m(x))
    run, count = counted(f)
    step = tg.compile(run, wrt=wrt)
    changed = False
    for _ in range(calls):
        x = make_input()
        before = [np.copy(tg.data(a)) for a in leaves(eager_layer)]
        eager = tg.withgradient(f, eager_layer, x, wrt=wrt)
        compiled = step(compiled_layer, x)
        assert count[0] == 1, "f runs once, recorded, then replayed"
        equal(eager.val, compiled.val)
        equal(eager.grad, compiled.grad)
        equal(eager_layer, compiled_layer)  # the layer's state, written back by the replay
        after = leaves(eager_layer)
        changed |= any(not np.array_equal(a, tg.data(b)) for a, b in zip(before, after))
    return changed


STATEFUL = {"BatchNorm", "InstanceNorm"}  # whose arrays a training step writes (statistics)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", layer_classes())
def test_every_layer_state(name, mode):
    make, make_input = LAYERS[name]
    wrt = (0,) if name == "Embedding" else None
    changed = _against_eager(lambda: make(np.random.default_rng(3)), make_input, mode, wrt=wrt)
    assert changed == (name in STATEFUL and mode == "train"), f"nn.{name}: update STATEFUL"


def test_batchnorm_closed_over_reads_and_writes_its_statistics():
    eager_bn, compiled_bn = nn.BatchNorm(3, **F64), nn.BatchNorm(3, **F64)
    make = lambda bn: lambda x: tg.sum(bn(x) ** 2)
    step = tg.compile(make(compiled_bn))
    for _ in range(4):
        x = floats(5, 3) + 1
        equal(tg.withgradient(make(eager_bn), x), step(x))
        equal(eager_bn, compiled_bn)
    assert step.cache_info().misses == 1
    bn = nn.BatchNorm(3, active=False, **F64)
    step = tg.compile(make(bn))
    for k in range(CALLS):
        bn.running_var[...] = 4.0 + k  # in place: the replay reads it anew
        x = floats(5, 3)
        equal(tg.withgradient(make(bn), x), step(x))


def test_batchnorm_twice_in_one_step_reads_its_own_write():
    layers = [nn.BatchNorm(3, active=True, **F64) for _ in range(2)]
    f = lambda m, x: tg.sum(m(m(x) * 2.0))
    step = tg.compile(f)
    for _ in range(CALLS):
        x = floats(4, 3)
        equal(tg.withgradient(f, layers[0], x), step(layers[1], x))
        equal(layers[0], layers[1])


READS = {  # ways a step reads a buffer after its forward wrote it
    "as it is": lambda a: a,
    "in an operation": lambda a: a + 0.0,
    "through where": lambda a: tg.where(tg.isfinite(a), a, a),
}


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_a_buffer_read_after_the_forward_wrote_it_is_the_written_value(name, read):
    """The step's traced argument still stood for the buffer's value before the write: a
    replay returned the statistics of the call before, and a placed LossScale's choice
    (`where`) wrote those back, freezing them from the third step on."""
    make, make_input = LAYERS[name]
    layers = [nn.trainmode(make(np.random.default_rng(3))) for _ in range(2)]

    def step(m, x):
        loss, _ = tg.withgradient(lambda m: total(m(x)), m)
        return loss, [READS[read](getattr(m, k)) for k in ("running_mean", "running_var")]

    compiled = tg.compile(step, gradient=False)
    for _ in range(CALLS):
        x = make_input()
        equal(step(layers[0], x), compiled(layers[1], x))
        equal(layers[0], layers[1])


def test_a_placed_loss_scale_keeps_a_batchnorms_statistics_moving_under_compile():
    x, labels = floats(8, 4), np.arange(8) % 3

    def step(scaler, state, model):
        loss = lambda m: scaler.scaled(nn.logitcrossentropy(m(x), labels))  # noqa: E731
        value, (g,) = tg.withgradient(loss, model)
        scaler, state, model = scaler.update(state, model, g)
        return value, scaler, state, model

    def fresh():
        rng = np.random.default_rng(0)
        model = nn.Chain(nn.Dense(4, 6, tg.tanh, rng=rng, **F64), nn.BatchNorm(6, **F64),
                         nn.Dense(6, 3, rng=rng, **F64))  # fmt: skip
        return tg.LossScale(1.0).placed(x), optim.setup(optim.Adam(0.01), model), model

    compiled, a, b = tg.compile(step, gradient=False), fresh(), fresh()
    for _ in range(4):
        _, *a = compiled(*a)
        _, *b = step(*b)
        equal(a[2], b[2])


# --- arguments outside wrt: as eagerly
@pytest.mark.parametrize("wrt", [(), (0,)])
def test_modes_outside_wrt_as_eagerly(wrt):
    def model(r):
        return nn.Chain(
            nn.Dense(3, 3, rng=r, **F64), nn.Dropout(0.5, rng=r), nn.BatchNorm(3, **F64)
        )

    changed = _against_eager(lambda: model(np.random.default_rng(5)), lambda: floats(4, 3),
                             "auto", wrt=wrt)  # fmt: skip
    assert changed == (wrt == (0,))


def test_python_float_outside_wrt_keeps_weak_typing():
    f = lambda x, s: tg.sum(x * s)
    step = tg.compile(f, wrt=0)
    x = np.ones(3, dtype=np.float32)
    for s in (0.3, 0.3, 0.7):
        got, expected = step(x, s), tg.withgradient(f, x, s, wrt=0)
        assert got.val.dtype == expected.val.dtype == np.float32
        assert got.val == expected.val


@pytest.mark.parametrize(
    "f",
    [
        lambda w, labels: tg.sum(w * np.eye(3)[labels]),
        lambda w, labels: tg.sum(w * labels.astype(np.float64)[:, None]),
        lambda w, labels: tg.sum(w) * np.mean(labels),
    ],
)
def test_numpy_on_data_refused_then_eager(f):
    args = (np.ones((2, 3)), np.array([0, 2]))
    with pytest.raises(tg.RecordingError, match="fallback=True"):
        tg.compile(f, wrt=0)(*args)
    step = tg.compile(f, wrt=0, fallback=True)
    for _ in range(CALLS):
        equal(step(*args), tg.withgradient(f, *args, wrt=0))


# --- what f returns: said by gradient=
def _fgsm(w, x):
    (gx,) = tg.gradient(lambda x: tg.sum(tg.tanh(w * x)), x)
    return tg.sum((w * (x + 0.1 * tg.sign(gx))) ** 2)


def _training_step(w, x):
    loss, (g, _) = tg.withgradient(lambda w, x: tg.sum((w * x) ** 2), w, x)
    return loss, w - 0.1 * g


def test_gradient_true_with_an_inner_pass():
    step = tg.compile(_fgsm, gradient=True)
    for _ in range(CALLS):
        args = (floats(3), floats(3))
        equal(step(*args), tg.withgradient(_fgsm, *args))


def test_gradient_false_returns_f_output():
    step = tg.compile(_training_step, gradient=False)
    for _ in range(CALLS):
        args = (floats(3), floats(3))
        equal(step(*args), _training_step(*args))


def test_guessed_own_gradient_is_deprecated():
    with pytest.warns(DeprecationWarning, match="gradient=False"):
        got = tg.compile(_training_step)(np.ones(3), np.ones(3))
    equal(got, _training_step(np.ones(3), np.ones(3)))


@pytest.mark.parametrize("inner", ["gradient", "forward"])
def test_an_inner_transform_without_gradient_said_is_refused(inner):
    f = _fgsm if inner == "gradient" else _with_forward
    args = (np.ones(3), np.ones(3)) if inner == "gradient" else (np.ones(3),)
    with pytest.raises(tg.RecordingError, match="gradient=True"):
        tg.compile(f)(*args)
    step = tg.compile(f, fallback=True)
    equal(step(*args), tg.withgradient(f, *args))


def _with_forward(x):
    y, _ = tg.forward(lambda v: v * v, x)
    return tg.sum(x * (y * 2.0 + 1.0))


# --- fallback=True: f runs once per call
def test_fallback_runs_f_once_with_eager_draws():
    def make(drop):
        def f(x):
            y = drop(x)
            return tg.sum(y * x) * (1.0 if float(tg.sum(y)) > 0 else 2.0)

        return counted(f)

    (fe, eager_calls), (fc, compiled_calls) = (make(nn.Dropout(0.5, rng=np.random.default_rng(0)))
                                               for _ in range(2))  # fmt: skip
    step = tg.compile(fc, fallback=True)
    for k in range(CALLS):
        x = floats(8)
        equal(tg.withgradient(fe, x), step(x))
        assert eager_calls[0] == compiled_calls[0] == k + 1
    assert step.cache_info().eager == 1


def test_fallback_running_f_again_draws_what_eager_draws():
    """A refusal f cannot go on from (NumPy's own `astype` of traced labels) runs f again
    eagerly: the generator is first put back where the recording found it (the recording's
    draws shifted every later mask)."""

    def run(compiled):
        drop = nn.Dropout(0.5, rng=np.random.default_rng(0))
        h = lambda x, labels: tg.sum(drop(x)) * labels.astype(np.float64).sum()  # noqa: E731
        if compiled:
            step = tg.compile(h, fallback=True, wrt=(0,))
        else:
            step = lambda *a: tg.withgradient(h, *a, wrt=(0,))  # noqa: E731
        return [step(np.ones(6), np.array([1, 2])).grad[0] for _ in range(3)]

    for eager, compiled in zip(run(False), run(True)):
        np.testing.assert_array_equal(compiled, eager)


# --- checks: a replay raises what eager raises
def test_nonfinite_loss_raises_in_replay():
    f = lambda x: tg.sum(tg.log(x))
    step = tg.compile(f)
    step(np.ones(2))
    with tg.sync_checks(True), np.errstate(divide="ignore"):
        for call in (lambda x: tg.withgradient(f, x), step):
            with pytest.raises(tg.BackError, match="not finite"):
                call(np.array([0.0, 1.0]))
    assert step.cache_info().misses == 1


def test_clipnorm_replays_and_raises():
    model = nn.Dense(3, 2, rng=np.random.default_rng(0), **F64)
    state = optim.setup(optim.ClipNorm(1.0), model)
    step, count = counted(_optimiser_step)
    compiled = tg.compile(step, gradient=False)
    for _ in range(CALLS):
        x = floats(4, 3) * 10
        equal(_optimiser_step(model, state, x), compiled(model, state, x))
    assert compiled.cache_info().misses == 1
    x[0, 0] = np.nan
    with tg.sync_checks(False):  # the loss's own check off: ClipNorm's raises
        for call in (_optimiser_step, compiled):
            with pytest.raises(FloatingPointError, match="ClipNorm"):
                call(model, state, x)


def test_second_back_raises_in_replay():
    def f(x):
        y = tg.sum(x * x)
        tg.back(y)
        tg.back(y)
        return y

    with pytest.raises(tg.BackError):
        tg.compile(f, gradient=False)(np.ones(2))


# --- every optimiser and schedule: three steps, compiled and eager
def _optimiser_step(model, state, x):
    loss, (g,) = tg.withgradient(lambda m: tg.sum(tg.tanh(m(x)) ** 2), model)
    state, model = optim.update(state, model, g)
    return loss, state, model


def _rules():
    from tracker_gpu.optim import schedules

    found = {}
    for name in optim.__all__:
        value = getattr(optim, name)
        if isinstance(value, type) and issubclass(value, optim.Rule) and value is not optim.Rule:
            found[name] = value
    found.update({f"Scheduled.{n}": getattr(schedules, n) for n in schedules.__all__
                  if n != "Scheduled"})  # fmt: skip
    return sorted(found)


RULES = {  # the rules that need arguments
    "OptimiserChain": lambda: optim.OptimiserChain(optim.ClipNorm(1.0), optim.Adam(0.01)),
    "Scheduled": lambda: optim.Scheduled(optim.Adam(0.01), optim.Exp(0.01, decay=0.9)),
    "Scheduled.Step": lambda: optim.Scheduled(optim.Descent(0.05), optim.Step(0.05, every=2)),
    "Scheduled.Exp": lambda: optim.Scheduled(optim.AdamW(0.01), optim.Exp(0.01, decay=0.9)),
    "Scheduled.Cosine": lambda: optim.Scheduled(
        optim.Adam(0.01), optim.Cosine(0.01, steps=5, warmup=2, eta_min=0.001)
    ),
    "Scheduled.CosineRestarts": lambda: optim.Scheduled(
        optim.SGD(0.01, rho=0.9), optim.CosineRestarts(0.01, period=1, mult=2, eta_min=0.001)
    ),
    "Scheduled.OneCycle": lambda: optim.Scheduled(
        optim.NAdam(), optim.OneCycle(0.01, steps=4, warmup=0.5, three_phase=True)
    ),
    "Scheduled.Linear": lambda: optim.Scheduled(optim.RAdam(), optim.Linear(0.01, steps=2)),
    "Scheduled.Polynomial": lambda: optim.Scheduled(
        optim.AdaMax(), optim.Polynomial(0.01, steps=2, power=2.0)
    ),
    "SGD": lambda: optim.SGD(0.05, rho=0.9, dampening=0.3, weight_decay=0.01, maximize=True),
    "Lion": lambda: optim.Lion(weight_decay=0.1),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", _rules())
def test_every_optimiser(name, dtype):
    rule = RULES[name]() if name in RULES else getattr(optim, name)()
    model = nn.Dense(3, 2, rng=np.random.default_rng(0), dtype=dtype)
    eager = compiled = (model, optim.setup(rule, model))
    step, count = counted(_optimiser_step)
    replay = tg.compile(step, gradient=False)
    for k in range(CALLS):
        x = floats(4, 3).astype(dtype)
        e_loss, e_state, e_model = _optimiser_step(*eager, x)
        c_loss, c_state, c_model = replay(*compiled, x)
        assert count[0] == replay.cache_info().misses  # recorded once per signature
        for a, b in zip(leaves((e_loss, e_model, e_state)), leaves((c_loss, c_model, c_state))):
            a, b = np.asarray(tg.data(a)), np.asarray(tg.data(b))
            assert np.array_equal(a, b), f"{name}: not bit for bit at step {k}"
        eager, compiled = (e_model, e_state), (c_model, c_state)
    assert replay.cache_info().misses == 1  # the step counts are read anew, not signatures


# --- bit for bit: sums of gradient contributions in the tape's order
def test_several_contributions_bit_for_bit():
    f = lambda x: tg.sum(tg.sin(x) * x + tg.exp(x) * tg.cos(x) + x * x * 0.3 + tg.tanh(x))
    step = tg.compile(f)
    for _ in range(20):
        x = floats(50)
        assert np.array_equal(step(x).grad[0], tg.withgradient(f, x).grad[0])


def test_gradient_penalty_bit_for_bit():
    inner = lambda w, x: tg.sum(tg.tanh(x @ w) * tg.sin(x @ w))
    f = lambda w, x: inner(w, x) + tg.sum(tg.gradient(inner, w, x, nest=True)[0] ** 2)
    step = tg.compile(f)
    for _ in range(20):
        args = (floats(3, 2), floats(4, 3))
        got, expected = step(*args), tg.withgradient(f, *args)
        assert got.val == expected.val
        for a, b in zip(got.grad, expected.grad):
            assert np.array_equal(a, b)


# --- transforms inside a compiled f: replayed as eagerly (nested), or refused
def _inner_transforms():
    def f(x):
        return tg.sin(tg.linalg.outer(x, x)) + tg.cos(tg.vecdot(x, x))

    scalar = lambda x: tg.sum(f(x))  # noqa: E731
    return {
        "jacobian": lambda x: tg.sum(tg.sin(tg.jacobian(f, x))),
        "jacfwd": lambda x: tg.sum(tg.sin(tg.jacfwd(f, x))),
        "hessian": lambda x: tg.sum(tg.hessian(scalar, x) ** 2),
        "hvp": lambda x: tg.sum(tg.hvp(scalar, x, x * 2.0)),
        "jvp": lambda x: tg.sum(tg.jvp(f, (x,), (x,))[1] ** 2),
        "forward": lambda x: tg.sum(tg.forward(f, x)[1](np.ones((2, 2)))[0] * x),
        "gradient": lambda x: tg.sum(x * tg.gradient(lambda y: tg.sum(tg.sin(x * y)), x)[0]),
        "checkpoint": lambda x: tg.sum(tg.checkpoint(f, x) ** 2),
    }


@pytest.mark.parametrize("name", sorted(_inner_transforms()))
def test_an_inner_transform_replays_as_eagerly(name):
    f = _inner_transforms()[name]
    step = tg.compile(f, gradient=True)
    for _ in range(CALLS):
        x = floats(2)
        equal(step(x), tg.withgradient(f, x))
    assert step.cache_info().misses == 1


@pytest.mark.parametrize("name", sorted(_inner_transforms()))
def test_an_inner_transform_replays_as_eagerly_without_a_gradient(name):
    """With gradient=False nothing nests the transform: its results were made plain while
    recording, and every replay gave the recording call's numbers (jvp, jacfwd)."""
    f = _inner_transforms()[name]
    step = tg.compile(f, gradient=False)
    for _ in range(CALLS):
        x = floats(2)
        assert np.array_equal(step(x), f(x))
    assert step.cache_info().misses == 1


def test_a_checkpoint_closing_over_a_tracked_value_is_refused():
    def f(x):
        h = tg.tanh(x)
        return tg.sum(tg.checkpoint(lambda z: tg.sin(z * h), x))

    with pytest.raises(tg.RecordingError, match="checkpoint"):
        tg.compile(f)(np.ones(3))
    step = tg.compile(f, fallback=True)
    for _ in range(CALLS):
        x = floats(3)
        equal(step(x), tg.withgradient(f, x))
