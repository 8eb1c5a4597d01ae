"""tg.compile: a replay gives what `withgradient` gives, on every backend; new signatures record
again; what cannot be replayed is refused (or run eagerly); a replay's memory stays flat."""

import dataclasses
import gc
import threading
import tracemalloc
import warnings

import numpy as np
import pytest
from helpers import require

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.compiler import codegen, graphs
from tracker_gpu.cuda import on_host

RNG = np.random.default_rng(0)


def _mlp_loss(w1, b1, w2, x, labels):
    h = tg.tanh(x @ w1 + b1)
    return nn.logitcrossentropy(h @ w2, labels)


def _custom(x):
    @tg.rule
    def cube(x):
        return x**3, lambda g: (g * 3 * x**2,)

    return tg.sum(cube(x) * tg.exp(-x))


FUNCTIONS = {
    "elementwise": (
        lambda x, y: tg.sum(tg.sin(x) * y + tg.exp(-x) / (y * y + 1.0)),
        [(3, 4), (3, 4)],
    ),
    "broadcast and reductions": (
        lambda x, y: tg.sum(tg.mean(x - y[:1], axis=0) ** 2) + tg.max(x) * tg.prod(y[0]),
        [(3, 4), (3, 4)],
    ),
    "softmax and matmul": (
        lambda x, y: tg.sum(tg.softmax(x @ tg.matrix_transpose(y), axis=1) * 2.0),
        [(3, 4), (3, 4)],
    ),
    "linalg": (
        lambda x, y: tg.linalg.det(x @ tg.matrix_transpose(x) + 4.0 * _eye(x)),
        [(3, 4), (2,)],
    ),
    "getitem and concat": (
        lambda x, y: tg.sum(tg.concat([x[1:], x[:1] * y[:4]], axis=0) ** 2),
        [(3, 4), (4,)],
    ),
    "custom rule": (lambda x, y: _custom(x) + tg.sum(y), [(3,), (2,)]),
    "checkpoint": (
        lambda x, y: tg.sum(tg.checkpoint(lambda a, b: tg.tanh(a) * b, x, y)),
        [(4,), (4,)],
    ),
}


def _eye(x):
    return x.__array_namespace__().eye(x.shape[0], dtype=x.dtype, device=x.device)


def _inputs(backend, shapes, seed):
    rng = np.random.default_rng(seed)
    return [backend.asarray(rng.uniform(0.5, 1.5, shape)) for shape in shapes]


def assert_same(backend, got, expected):
    """Bit for bit where both are arrays; None where the other is None."""
    if expected is None or got is None:
        assert got is None and expected is None
        return
    a, b = backend.to_numpy(tg.data(got)), backend.to_numpy(tg.data(expected))
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


def assert_replays_as_eager(backend, step, f, shapes):
    """`step(*args)` is `withgradient(f, *args)` bit for bit for three sets of arguments (one
    recording, two replays with other values); the step's results, in order."""
    results = []
    for seed in range(3):
        args = _inputs(backend, shapes, seed)
        got, expected = step(*args), tg.withgradient(f, *args)
        assert_same(backend, got.val, expected.val)
        for g, e in zip(got.grad, expected.grad):
            assert_same(backend, g, e)
        results.append(got)
    return results


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_replay_gives_what_withgradient_gives(backend, name):
    if name == "linalg":
        require(backend, "linalg.det")
    f, shapes = FUNCTIONS[name]
    step = tg.compile(f)
    for got in assert_replays_as_eager(backend, step, f, shapes):
        assert not tg.istracked(got.val) and not any(tg.istracked(g) for g in got.grad)
    assert step.cache_info().misses == 1 and step.cache_info().hits == 2


@pytest.mark.parametrize("name", FUNCTIONS)
def test_on_cupy_every_replay_is_one_capture_cut_only_at_library_calls(backend, name):
    """On CuPy a replay is CUDA graphs, cut where a library call (cuBLAS, cuSOLVER) runs live
    between two of them (`graphs.py`), never the step-by-step fallback, and it answers as
    `withgradient` does, bit for bit. The other rows have no CUDA graphs to check."""
    if backend.name != "cupy":
        pytest.skip("CUDA graphs are made of CuPy arrays only")
    if name == "linalg":
        require(backend, "linalg.det")
    f, shapes = FUNCTIONS[name]
    step = tg.compile(f)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="tg.compile: no CUDA graph")
        assert_replays_as_eager(backend, step, f, shapes)
    (program,) = step.programs()
    assert program.graph is not None and program.graph.parts


def test_integer_arguments_are_traced_and_replayed(backend):
    w1, b1, w2 = (backend.asarray(RNG.standard_normal(s)) for s in [(4, 8), (8,), (8, 3)])
    step = tg.compile(_mlp_loss)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        x = backend.asarray(rng.standard_normal((5, 4)))
        labels = backend.asarray(rng.integers(0, 3, 5))
        got, expected = (
            step(w1, b1, w2, x, labels),
            tg.withgradient(_mlp_loss, w1, b1, w2, x, labels),
        )
        assert_same(backend, got.val, expected.val)
        for g, e in zip(got.grad, expected.grad):
            assert_same(backend, g, e)
    assert step.cache_info().hits == 2


def test_a_new_signature_records_again():
    step = tg.compile(lambda x: tg.sum(x * x))
    step(np.ones(3))
    step(np.ones(3) * 2)
    step(np.ones(4))  # another shape
    step(np.ones(3, dtype=np.float32))  # another dtype
    step({"a": np.ones(3)}["a"])  # the same signature as the first
    info = step.cache_info()
    assert (info.misses, info.hits, info.currsize) == (3, 2, 3)


def test_the_cache_is_bounded():
    step = tg.compile(lambda x: tg.sum(x), maxsize=2)
    with pytest.warns(RuntimeWarning, match="drops the oldest"):
        for n in (1, 2, 3, 1):
            step(np.ones(n))
    assert step.cache_info().currsize == 2 and step.cache_info().misses == 4


def test_a_signature_that_changes_every_call_is_reported():
    step = tg.compile(lambda x, state: tg.sum(x * state["scale"]), maxsize=2)
    with pytest.warns(RuntimeWarning, match="signature changes from call to call"):
        for k in range(3):
            step(np.ones(2), {"scale": 1.0 + k})
    assert step.cache_info().misses == 3


RULES = [
    optim.Descent(0.1),
    optim.Momentum(0.05),
    optim.Adam(0.01),
    optim.AdamW(0.01, weight_decay=0.1),
    optim.AdaBelief(0.01),
]


def _train_step(model, state, x, y):
    loss, (g,) = tg.withgradient(lambda m: nn.logitcrossentropy(m(x), y), model)
    state, model = optim.update(state, model, g)
    return loss, state, model


def _compiled_beside_eager(rule, steps):
    """A small model trained by `rule` for `steps` steps, compiled and eager side by side:
    the compiled step, and for each step both losses and both first-layer weights."""
    model = nn.Chain(nn.Dense(4, 6, nn.tanh, rng=np.random.default_rng(1)), nn.Dense(6, 3))
    step = tg.compile(_train_step, gradient=False)
    compiled = (model, optim.setup(rule, model))
    eager = (model, optim.setup(rule, model))
    seen = []
    for seed in range(steps):
        rng = np.random.default_rng(seed)
        x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8)
        loss_c, *compiled_ = step(*compiled, x, y)
        loss_e, *eager_ = _train_step(*eager, x, y)
        compiled, eager = tuple(reversed(compiled_)), tuple(reversed(eager_))
        weights = compiled[0].layers[0].weight, eager[0].layers[0].weight
        seen.append((float(loss_c), float(loss_e), *weights))
    return step, seen


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: type(rule).__name__)
def test_a_training_step_is_one_program(rule):
    """`f` takes its own gradient and updates the model: the step returns `f`'s output, and
    replays give the eager step's losses and parameters."""
    step, seen = _compiled_beside_eager(rule, 4)
    for loss_c, loss_e, weight_c, weight_e in seen:
        assert loss_c == loss_e
        np.testing.assert_array_equal(weight_c, weight_e)
    assert step.cache_info().hits == 3


def test_an_argument_left_out_replays(backend):
    """A rule's argument given as None (clip's lower bound, a Dense layer's bias) is a constant
    of the program like any other."""
    f = tg.compile(lambda x: tg.sum(tg.clip(x, None, 0.5) * x))
    for seed in range(2):
        (x,) = _inputs(backend, [(5,)], seed)
        val, (g,) = f(x)
        plain = backend.to_numpy(x)
        assert float(val) == pytest.approx(float(np.sum(np.minimum(plain, 0.5) * plain)))
        expected = np.where(plain <= 0.5, 2 * plain, 0.5)
        np.testing.assert_allclose(backend.to_numpy(g), expected, rtol=1e-12)


def test_a_float_batch_that_reaches_no_input_is_not_differentiated():
    """A function that takes its own gradient reads a float batch `x` through a rule of its
    own: the replay never runs that rule's pullback (eager, `x` is plain and gets none), and
    the gradient is the eager one."""
    pulled = []

    @tg.rule
    def features(x):
        def pullback(g):
            pulled.append(1)
            return (g * 2.0,)

        return x * 2.0, pullback

    def step(w, x):
        return tg.withgradient(lambda w: tg.sum(tg.tanh(features(x) * w)), w)

    compiled = tg.compile(step, gradient=False)
    w = np.array([0.5, -1.0])
    for seed in range(3):
        x = np.full(2, 0.3 + 0.1 * seed)
        (val, (g,)), expected = compiled(w, x), step(w, x)
        np.testing.assert_allclose(g, expected.grad[0], rtol=1e-12)
        assert float(val) == pytest.approx(float(expected.val))
    (program,) = compiled.programs()
    if program.interpreted:
        pytest.skip(
            "the interpreted replay (a GPU, or the host build of the kernels) runs each node's "
            "whole pullback: the README's limitations say so"
        )
    recorded = len(pulled)  # the recording runs the real pass once, as it is
    compiled(w, np.full(2, 0.7))
    assert len(pulled) == recorded and compiled.cache_info().hits >= 2


SCHEDULED = [
    optim.Scheduled(optim.Adam(0.01), optim.Cosine(0.01, steps=5, warmup=2, eta_min=0.001)),
    optim.Scheduled(optim.AdamW(0.01), optim.Exp(0.01, decay=0.9)),
    optim.Scheduled(optim.Momentum(0.05), optim.Step(0.05, decay=0.5, every=2)),
]


@pytest.mark.parametrize("rule", SCHEDULED, ids=lambda rule: type(rule.schedule).__name__)
def test_a_scheduled_training_step_is_recorded_once(rule):
    """The step count reaches the recording as an array, so every step replays one program,
    past the warm-up and the end of the schedule; the rates agree with the eager ones to the
    rounding of the library's pow and cos."""
    step, seen = _compiled_beside_eager(rule, 7)
    for loss_c, loss_e, weight_c, weight_e in seen:
        assert loss_c == pytest.approx(loss_e, rel=1e-6)
        np.testing.assert_allclose(weight_c, weight_e, rtol=1e-6, atol=1e-7)
    assert (step.cache_info().misses, step.cache_info().hits) == (1, 6)


def test_a_hessian_vector_product_replays(backend):
    f = lambda x: tg.sum(tg.sin(x) ** 2 * x)  # noqa: E731
    hvp = tg.compile(lambda x, v: tg.sum(tg.gradient(f, x, nest=True)[0] * v))
    for seed in range(3):
        x, v = _inputs(backend, [(4,), (4,)], seed)
        np.testing.assert_allclose(
            backend.to_numpy(hvp(x, v).grad[0]), backend.to_numpy(tg.hvp(f, x, v)), rtol=1e-12
        )
    assert hvp.cache_info().hits == 2


def test_dropout_draws_anew_on_every_replay():
    rng = np.random.default_rng(5)
    drop = nn.Dropout(0.5, rng=rng)
    step = tg.compile(lambda x: tg.sum(drop(x) * x))
    x = np.linspace(1.0, 2.0, 64)
    masks = []
    for _ in range(3):
        twin = np.random.default_rng()
        twin.bit_generator.state = rng.bit_generator.state
        keep = twin.random(64) >= 0.5  # the mask this call must draw
        val, (g,) = step(x)
        np.testing.assert_allclose(g, keep * 2 * 2 * x)
        masks.append(keep)
    assert not np.array_equal(masks[0], masks[1])


REFUSED = {
    "float(x)": lambda x: tg.sum(x) * float(tg.sum(x)),
    "a comparison as a condition": lambda x: tg.sum(x) if tg.sum(x) > 0 else -tg.sum(x),
    "int(x)": lambda x: tg.sum(x) * int(tg.max(x)),
    "x as an index": lambda x: tg.sum(x) * [1.0, 2.0][tg.astype(x[0], tg.int64)],
    "a boolean mask": lambda x: tg.sum(x[x > 1.0]),
    "a shape from the data": lambda x: tg.sum(x) * tg.nonzero(x > 1.0)[0].shape[0],
}
MESSAGES = {
    "float(x)": r"float\(x\)",
    "a comparison as a condition": r"bool\(x\), or a comparison used as a condition",
    "int(x)": r"int\(x\)",
    "x as an index": r"x used as an index",
    "a boolean mask": r"x\[mask\] with a traced boolean mask",
    "a shape from the data": r"nonzero\(x\) of a traced array",
}


@pytest.mark.parametrize("case", REFUSED)
def test_value_dependent_python_is_refused(case):
    with pytest.raises(tg.RecordingError, match=MESSAGES[case]):
        tg.compile(REFUSED[case])(np.array([0.5, 2.0]))


def test_a_tracked_array_from_outside_is_refused():
    w = tg.param(np.ones(2))
    with pytest.raises(tg.RecordingError, match="did not receive as an argument"):
        tg.compile(lambda x: tg.sum(x * w))(np.ones(2))


@pytest.mark.parametrize("case", ["float(x)", "a comparison as a condition"])
def test_fallback_runs_eagerly(case):
    f = REFUSED[case]
    step = tg.compile(f, fallback=True)
    for x in (np.array([0.5, 2.0]), np.array([-3.0, 1.0])):
        got, expected = step(x), tg.withgradient(f, x)
        assert float(got.val) == float(expected.val)
        np.testing.assert_array_equal(got.grad[0], expected.grad[0])
    assert step.cache_info().eager == 1


def test_memory_of_replays_stays_flat():
    step = tg.compile(lambda x, y: tg.sum(tg.tanh(x @ y) ** 2))
    x, y = RNG.standard_normal((16, 16)), RNG.standard_normal((16, 16))
    for _ in range(10):
        step(x, y)
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(1000):
            step(x, y)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes more after 1,000 replays"


def test_a_compiled_function_runs_in_several_threads():
    step = tg.compile(lambda x: tg.sum(tg.sin(x) * x))
    step(np.ones(8))
    inputs = [RNG.standard_normal(8) for _ in range(4)]
    results = {}

    def work(i):
        for _ in range(50):
            results[i] = step(inputs[i]).grad[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(inputs):
        np.testing.assert_allclose(results[i], np.sin(x) + x * np.cos(x))


def test_gradients_of_an_array_passed_twice_are_two_buffers():
    step = tg.compile(lambda a, b: tg.sum(a * b))
    x = np.array([1.0, 2.0])
    step(x, x)
    ga, gb = step(x, x).grad
    ga *= 0
    np.testing.assert_array_equal(gb, 2 * x)


def test_the_generated_code_is_straight_line():
    step = tg.compile(lambda x: tg.sum(tg.sin(x * 2.0)))
    with on_host(False):  # the host's arrays, and no fused path: one generated function
        step(np.ones(3))
    (program,) = step.programs()
    assert "XP" in program.source and "for " not in program.source and "FIT" not in program.source


# --- CUDA graphs: the plan is checked here; the capture itself runs on a GPU (ci/gpu)
def test_the_capture_plan(monkeypatch):
    monkeypatch.setattr(graphs, "is_cupy", lambda a: isinstance(a, np.ndarray))
    f, shapes = FUNCTIONS["elementwise"]
    step = tg.compile(f)
    x, y = _inputs_numpy(shapes)
    step(x, y)
    (program,) = step.programs()
    plan = graphs.plan(program, [x, y])
    assert plan.capturable and plan.inputs == [((3, 4), np.float64)] * 2
    assert plan.outputs == program.outputs and len(plan.outputs) == 3  # the loss, two gradients
    buffers = [np.empty(s, d) for s, d in plan.inputs]
    graphs.copy_into(buffers, [x, y], np)  # a launch reads its inputs from static buffers
    env = program.interpret(buffers)
    out = graphs.copy_out(env, plan.outputs, np)
    expected = tg.withgradient(f, x, y)
    np.testing.assert_array_equal(out[plan.outputs[0]], expected.val)
    assert all(out[s] is not env[s] for s in plan.outputs)  # copied: the next launch overwrites


def test_a_program_that_draws_on_the_host_is_not_captured(monkeypatch):
    monkeypatch.setattr(graphs, "is_cupy", lambda a: isinstance(a, np.ndarray))
    drop = nn.Dropout(0.5, rng=np.random.default_rng(0))
    step = tg.compile(lambda x: tg.sum(drop(x)))
    step(np.ones(4))
    (program,) = step.programs()
    assert "random numbers on the host" in graphs.plan(program, [np.ones(4)]).reasons[0]
    assert "not a CuPy array" in graphs.plan(program, [np.float64(1.0)]).reasons[-1]


def _inputs_numpy(shapes):
    rng = np.random.default_rng(3)
    return [rng.uniform(0.5, 1.5, s) for s in shapes]


def test_wrt_leaves_a_float_batch_to_be_read_anew():
    step = tg.compile(lambda w, x: tg.sum(tg.tanh(w * x)), wrt=0)
    w = np.array([0.5, -1.0])
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(2)
        val, (gw, gx) = step(w, x)
        eager_val, (ew, _) = tg.withgradient(lambda w, x: tg.sum(tg.tanh(w * x)), w, x, wrt=0)
        assert gx is None and float(val) == float(eager_val)
        np.testing.assert_array_equal(gw, ew)
    assert step.cache_info().hits == 2


def test_a_buffer_written_in_place_is_no_view_of_a_live_value(backend):
    """A replay on NumPy writes arithmetic into an operand's buffer at its last use; a reshape
    of that operand, read afterwards, must keep its values."""

    def f(x):
        a = x * 2.0
        view = tg.reshape(a, (-1,))
        b = a * 3.0  # the last use of `a`
        return tg.sum(b) + tg.sum(view * view)

    step = tg.compile(f)
    for k in range(3):
        (x,) = _inputs(backend, [(64, 80)], k)  # large enough to be written in place
        val, (g,) = step(x)
        expected, (eg,) = tg.withgradient(f, x)
        assert float(val) == float(expected)
        np.testing.assert_array_equal(backend.to_numpy(g), backend.to_numpy(eg))
    assert codegen.REUSE_FROM <= 64 * 80


# --- what a replay hands out, and what makes two calls the same program
def test_a_replay_hands_out_arrays_no_later_call_writes():
    """The gradient of a 0-d parameter added to the loss is the seed itself, a constant of the
    program: each call must hand out its own copy, so that `g += 1` changes nothing later."""
    step = tg.compile(lambda x, s: (tg.sum(x * x) + s, x))
    x = np.ones(2)
    for _ in range(3):
        (val, same), (gx, gs) = step(x, np.asarray(0.5))
        assert float(gs) == 1.0 and same is not x and np.array_equal(same, x)
        gs += 1.0
        same += 1.0
    assert np.array_equal(x, np.ones(2))


def test_signed_zero_and_nan_inside_the_arguments_are_keys():
    import math

    step = tg.compile(lambda x, c: tg.sum(x) * math.copysign(1.0, c["c"]))
    x = np.ones(2)
    for c in (0.0, -0.0, 0.0, -0.0):
        val, _ = step(x, {"c": c})
        assert float(val) == math.copysign(2.0, c)
    step(x, {"c": math.nan})
    step(x, {"c": math.nan})
    assert step.cache_info().misses == 3 and step.cache_info().hits == 3


class _Settings:
    """Unhashable (it defines __eq__), not a dataclass: keyed by identity."""

    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return self is other


def test_an_unhashable_argument_is_held_while_its_program_is_cached():
    from tracker_gpu.compiler.signature import signature

    first = _Settings(1.0)
    key = signature((first,))
    address = id(first)
    del first
    gc.collect()
    for _ in range(100):  # whatever takes the freed address must not match the old key
        other = _Settings(2.0)
        assert signature((other,)) != key or id(other) != address
        del other
    step = tg.compile(lambda x, s: tg.sum(x) * s.scale)
    results = []
    for scale in (3.0, 6.0, 9.0):  # each object dies after its call
        results.append(float(step(np.ones(1), _Settings(scale))[0]))
    assert results == [3.0, 6.0, 9.0]


def _random_program(seed):
    """A loss over 12 random operations, each reading two earlier values: values with several
    gradient contributions, reached in varied orders."""
    rng = np.random.default_rng(seed)
    plan = [tuple(int(v) for v in rng.integers(0, 10**6, size=3)) for _ in range(12)]

    def f(x):
        values = [x]
        for op, i, j in plan:
            a, b = values[i % len(values)], values[j % len(values)]
            ops = (a * b * 0.5, tg.sin(a) + b, a - tg.tanh(b), tg.exp(a * 0.1) * b)
            values.append(ops[op % 4])
        return tg.sum(values[-1] + values[-2] * 0.3 + values[-4])

    return f


@pytest.mark.parametrize("seed", range(20))
def test_a_replay_sums_gradient_contributions_in_the_tapes_order(seed):
    f = _random_program(seed)
    step = tg.compile(f)
    rng = np.random.default_rng(seed)
    step(rng.standard_normal(64) * 0.5)  # records
    x = rng.standard_normal(64) * 0.5
    (eager,) = tg.gradient(f, x)
    _, (replayed,) = step(x)
    assert np.array_equal(eager, replayed)  # bit for bit


def _counting_into(v, log):
    log.append(len(log))
    return tg.sum(v) * len(log)


def _counting_by_key(v, log):
    log["calls"] = log.get("calls", 0) + 1
    return tg.sum(v) * log["calls"]


@pytest.mark.parametrize("f, make", [(_counting_into, list), (_counting_by_key, dict)])
def test_a_container_argument_that_f_changes_changes_as_eagerly(f, make):
    """An argument outside wrt without arrays was given to f as a copy while recording: the
    caller's list stayed empty and every replay returned the first call's value."""
    x = np.array([1.0, 2.0])
    eager_log, compiled_log = make(), make()
    step = tg.compile(f, wrt=(0,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its signature changes every call, as it says
        for _ in range(4):
            expected = tg.withgradient(f, x, eager_log, wrt=(0,))
            got = step(x, compiled_log)
            assert float(got.val) == float(expected.val)
    assert compiled_log == eager_log


def _noting(v, notes):
    notes["doubled"] = notes["w"] * 2.0
    return tg.sum(v * notes["w"])


def test_a_change_to_an_argument_given_as_a_copy_is_refused_or_run_eagerly():
    """An argument with arrays is given to f as a copy while recording: f's change to it
    would be lost, and a replay would not make it."""
    x = np.array([1.0, 2.0])
    with pytest.raises(tg.RecordingError, match="change to its argument at position 1"):
        tg.compile(_noting, wrt=(0,))(x, {"w": np.ones(2)})
    step, notes = tg.compile(_noting, wrt=(0,), fallback=True), {"w": np.ones(2)}
    for _ in range(2):
        step(x, notes)
        np.testing.assert_array_equal(notes.pop("doubled"), np.full(2, 2.0))


def _keeping_average(state, x):
    state["ema"] = 0.9 * state["ema"] + 0.1 * x
    return tg.sum(state["ema"])


@dataclasses.dataclass
class _Decaying:
    w: np.ndarray

    def __call__(self, h):
        self.w = self.w * 0.9  # rebinds a field of the caller's model
        return tg.sum(h * self.w)


def _decaying(model, x):
    return model(x)


@pytest.mark.parametrize("f, make", [(_keeping_average, lambda: {"ema": np.zeros(2)}),
                                     (_decaying, lambda: _Decaying(np.ones(2)))])  # fmt: skip
def test_without_a_gradient_a_change_to_any_argument_is_refused_or_run_eagerly(f, make):
    """With gradient=False f gets the caller's arguments eagerly, those it would differentiate
    too: a running average kept in a dict (or a model's field rebound) stayed the first call's
    in every replay, silently."""
    x = np.ones(2)
    with pytest.raises(tg.RecordingError, match="change to its argument at position 0"):
        tg.compile(f, gradient=False)(make(), x)
    step, eager_state, compiled_state = tg.compile(f, gradient=False, fallback=True), make(), make()
    for _ in range(3):
        assert float(step(compiled_state, x)) == float(f(eager_state, x))
    assert repr(compiled_state) == repr(eager_state)


def test_with_a_gradient_a_change_to_a_differentiated_argument_is_to_a_copy_as_eagerly():
    """`withgradient` gives f a copy of the structure it differentiates, eagerly too: the
    caller's dict is unchanged either way, and the recording stands."""
    x, eager_state, compiled_state = np.ones(2), {"ema": np.zeros(2)}, {"ema": np.zeros(2)}
    step = tg.compile(_keeping_average, gradient=True)
    for _ in range(3):
        got, expected = step(compiled_state, x), tg.withgradient(_keeping_average, eager_state, x)
        assert float(got.val) == float(expected.val)
    assert step.cache_info().hits == 2
    np.testing.assert_array_equal(compiled_state["ema"], eager_state["ema"])


@tg.compile
def _decorated_step(x):
    return tg.sum(tg.sin(x) * x)


def _undecorated_step(x):
    return tg.sum(tg.sin(x) * x)


def test_a_decorated_compiled_function_pickles_by_its_name():
    """`@tg.compile def step` raised a PicklingError (its module's `step` is the compiled
    object, so `f` could not be found by that name): multiprocessing and joblib could not send
    it. By name it comes back as itself; a compiled function made otherwise, by value."""
    import pickle

    x = np.array([0.5, 1.0])
    expected = tg.withgradient(_undecorated_step, x)
    assert pickle.loads(pickle.dumps(_decorated_step)) is _decorated_step
    np.testing.assert_array_equal(_decorated_step(x).grad[0], expected.grad[0])
    by_value = tg.compile(_undecorated_step)
    copied = pickle.loads(pickle.dumps(by_value))
    assert copied is not by_value
    np.testing.assert_array_equal(copied(x).grad[0], expected.grad[0])


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
def test_a_narrow_integer_index_replays_as_eagerly(backend, dtype):
    """Traced, a uint8 index went to PyTorch as it was, which reads it as a mask (wrong values
    and gradients in every replay, silently); int8 and int16 raised. Eagerly it is indices."""
    x = backend.asarray(np.arange(4.0) + 1.0)
    weights = backend.asarray(np.array([1.0, 10.0, 100.0]))
    f = lambda x, i: tg.sum(x[i] * weights)  # noqa: E731
    g = lambda i: tg.at(x * 1.0)[i].add(1.0)  # noqa: E731
    step, adds = tg.compile(f, wrt=0), tg.compile(g, gradient=False)
    for rows in ([2, 2, 0], [0, 1, 1], [1, 0, 2]):
        i = backend.asarray(np.array(rows, dtype=dtype))
        eager = tg.withgradient(f, x, i, wrt=0)
        got = step(x, i)
        assert float(got.val) == float(eager.val)
        np.testing.assert_array_equal(
            backend.to_numpy(got.grad[0]), backend.to_numpy(eager.grad[0])
        )
        np.testing.assert_array_equal(backend.to_numpy(adds(i)), backend.to_numpy(g(i)))


@tg.rule
def _power(x, *, p):
    return x**p, lambda g: (g * p * x ** (p - 1),)


@tg.rule
def _power_positional(x, p):
    return x**p, lambda g: (g * p * x ** (p - 1), None)


def test_a_custom_rules_keyword_computed_from_the_arguments_is_refused_naming_the_fix():
    """A keyword is a constant of the rule: a data argument given by keyword was refused as a
    "tracked keyword" to pass positionally; it now names the recording's reason and the fix,
    and the positional form replays each call's value, as fallback=True runs eagerly."""
    f = lambda a, p: tg.sum(_power(a, p=p))  # noqa: E731
    x = np.array([0.5, 1.5, 2.0])
    with pytest.raises(tg.RecordingError, match=r"keyword argument p=.*positionally"):
        tg.compile(f, wrt=0)(x, np.array(3.0))
    eager = tg.compile(f, wrt=0, fallback=True)
    positional = tg.compile(lambda a, p: tg.sum(_power_positional(a, p)), wrt=0)
    for p in (3.0, 2.0):
        expected = tg.withgradient(f, x, np.array(p), wrt=0)
        for got in (eager(x, np.array(p)), positional(x, np.array(p))):
            assert float(got.val) == float(expected.val)
            np.testing.assert_array_equal(got.grad[0], expected.grad[0])
