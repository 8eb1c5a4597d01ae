"""The whole fused path, from the rule's dispatch down to the kernel launch, run on the CPU
through the host build of the kernels (`on_host`), against the generic path: gradients, the
number of launches, and the allocations each fused pullback makes."""

import numpy as np
import pytest
from domain import assert_agree, domain

import tracker_gpu as tg
from tracker_gpu.cuda import elementwise, host, on_host, recording

pytestmark = pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")


def fused_and_generic(f, *xs, ulps=4, scale=None):
    """Gradients through the fused path (with its launch/alloc log) and through the generic one:
    the same nan and infinity pattern, values within a few ulp (of `scale` where sums cancel)."""
    with np.errstate(all="ignore"), tg.sync_checks(False):  # the loss may be nan
        generic = tg.gradient(f, *xs)
        with on_host(), recording() as log:
            fused = tg.gradient(f, *xs)
    for i, (a, b) in enumerate(zip(fused, generic)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert_agree(a, b, ulps=ulps, scale=scale, what=f"gradient {i}")
    return log


def launches(log):
    return [name for kind, name in log if kind == "launch"]


def allocations(log):
    return [size for kind, size in log if kind == "alloc"]


@pytest.mark.parametrize(
    "f",
    [
        lambda x: tg.sum(x**2),
        lambda x: tg.sum(tg.square(x)),
        lambda x: tg.sum(x * x),
        lambda x: tg.vecdot(x, x),
        tg.sumabs2,
    ],
    ids=["x**2", "square", "x*x", "vecdot", "sumabs2"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sum_of_squares_is_one_launch_and_no_temporary(f, dtype):
    x = np.random.default_rng(0).standard_normal(1001).astype(dtype)
    log = fused_and_generic(f, x)
    assert launches(log) == ["sumsq_bwd_acc"]
    assert allocations(log) == [x.nbytes]  # the gradient buffer itself, nothing else


@pytest.mark.parametrize(
    "name", ["tanh", "sigmoid", "relu", "exp", "log", "sqrt", "sin", "cos", "abs"]
)
def test_unary_pullbacks_are_one_launch_each(name):
    x = np.random.default_rng(1).uniform(0.2, 2.0, (17, 9))
    w = np.random.default_rng(2).standard_normal((17, 9))
    log = fused_and_generic(lambda x: tg.sum(getattr(tg, name)(x) * w), x)
    assert launches(log).count(f"{name}_bwd_acc") == 1


def test_contributions_accumulate_in_place():
    x = np.random.default_rng(3).standard_normal(500)
    w = np.random.default_rng(4).standard_normal(500)
    log = fused_and_generic(lambda x: tg.sum((tg.tanh(x) + tg.sin(x) + tg.exp(x)) * w), x)
    # same-shape additions pass g on (no kernel); x's three contributions share one buffer
    assert sorted(launches(log)) == sorted(["mul_bwd_acc", "tanh_bwd_acc", "sin_bwd_acc",
                                            "exp_bwd_acc"])  # fmt: skip
    assert allocations(log) == [w.nbytes, x.nbytes]


KERNEL = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "pow": "pow"}
SHAPES = [((5, 3), (3,)), ((4, 1, 3), (1, 6, 1)), ((2, 3), ()), ((7,), (7,)), ((3, 1), (1, 70))]


def operands(shapes, seed, special=0.0):
    """Two operands over the whole domain but huge values: a broadcast sum of finite huge terms
    may overflow in one order and not in another, and both would be right."""
    pair = [domain(s, np.float64, seed=seed + i, special=special) for i, s in enumerate(shapes)]
    return [np.where(np.abs(v) > 1e100, 1.0, v) for v in pair]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("op", list(KERNEL))
def test_broadcast_arithmetic_reduces_in_parallel(shapes, op):
    x, y = operands(shapes, seed=5)
    w = np.random.default_rng(5).standard_normal(np.broadcast_shapes(*shapes))
    log = fused_and_generic(lambda x, y: tg.sum(getattr(tg, op)(x, y) * w), x, y,
                            scale=_sum_scale(op, x, y, w))  # fmt: skip
    out_shape = np.broadcast_shapes(*shapes)
    expected = ["mul_bwd_acc"]  # the product with w
    for side, shape in enumerate(shapes):
        if tuple(shape) != out_shape:
            expected.append(f"{KERNEL[op]}_bwd_reduce")  # summed over its broadcast axes
        elif not (op == "add" or (op == "subtract" and side == 0)):
            expected.append(f"{KERNEL[op]}_bwd_acc")  # else g itself: no kernel
    assert sorted(launches(log)) == sorted(expected)
    assert "reduce_finish" not in launches(log)  # small shapes: one slice per output


def _sum_scale(op, x, y, w):
    """The magnitude the broadcast sums add up: the generic partials, in absolute value,
    summed like the gradients are."""
    with np.errstate(all="ignore"):
        primitive = getattr(tg, op)
        out = primitive(x, y)
        g = np.abs(w)
        parts = [np.abs(primitive.vjps[side](g, out, x, y)) for side in (0, 1)]
    return max(float(np.nanmax(np.where(np.isfinite(p), p, 0), initial=0)) for p in parts) * 70


@pytest.mark.parametrize("op", list(KERNEL))
def test_a_reduction_split_into_slices_adds_them_up(monkeypatch, op):
    monkeypatch.setattr(elementwise, "MIN_PER_THREAD", 1)
    x, y = operands(((700, 3), (3,)), seed=6)  # a bias: a column sum
    w = np.random.default_rng(6).standard_normal((700, 3))
    log = fused_and_generic(lambda x, y: tg.sum(getattr(tg, op)(x, y) * w), x, y,
                            scale=_sum_scale(op, x, y, w))  # fmt: skip
    assert "reduce_finish" in launches(log)
    x, y = operands(((2100,), ()), seed=7)  # a scalar parameter: every thread on its sum
    w = np.random.default_rng(7).standard_normal(2100)
    log = fused_and_generic(lambda x, y: tg.sum(getattr(tg, op)(x, y) * w), x, y,
                            scale=_sum_scale(op, x, y, w))  # fmt: skip
    assert "reduce_finish" in launches(log)


def test_pow_at_zero_agrees_with_the_generic_rule():
    """The fused pullback gave nan and -inf at x == 0, where the generic rule gives 0."""
    x, y = np.array([0.0, 1.0, 2.0]), np.array([0.0, 2.0, 0.5])
    log = fused_and_generic(lambda x, y: tg.sum(x**y), x, y)
    assert launches(log) == ["pow_bwd_acc", "pow_bwd_acc"]
    with on_host():
        gx, gy = tg.gradient(lambda x, y: tg.sum(x**y), x, y)
    assert np.array_equal(gx, [0.0, 2.0, 0.5 * 2**-0.5]) and gy[0] == 0.0


@pytest.mark.parametrize("op", list(KERNEL))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_broadcast_arithmetic_agrees_everywhere(op, dtype):
    x = domain((16, 9), dtype, seed=1, special=0.5)
    y = domain((16, 9), dtype, seed=2, special=0.5)
    fused_and_generic(lambda x, y: tg.sum(getattr(tg, op)(x, y)), x, y)


def test_scalar_operands_and_the_same_operand_twice():
    x = np.random.default_rng(6).standard_normal((6, 4))
    w = np.random.default_rng(7).standard_normal((6, 4))
    log = fused_and_generic(lambda x: tg.sum((2.0 * x - x / 3.0 + x**3.0) * w), x)
    scalars = [size for size in allocations(log) if size == x.itemsize]
    assert len(scalars) == 3  # each scalar operand, as a 0-d array on the device, is recorded
    log = fused_and_generic(lambda x: tg.sum((x * x) * w), x)
    assert launches(log).count("mul_bwd_acc") == 3  # (x * x) * w: one, then x * x: both sides
    assert allocations(log) == [x.nbytes, x.nbytes]  # x's second side adds in place
    log = fused_and_generic(lambda x: tg.sum((x - x) * w), x)
    assert launches(log).count("sub_bwd_acc") == 2  # one node on both sides: no pass-through


def test_same_shape_addition_launches_nothing():
    x, y = np.ones(10), np.full(10, 2.0)
    log = fused_and_generic(lambda x, y: tg.sum(tg.tanh(x + y - 1.0)), x, y)
    assert launches(log) == ["tanh_bwd_acc"]  # g passes through - 1.0 and + as it is


@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rowwise_forward_and_pullback(name, dtype):
    x = (np.random.default_rng(8).standard_normal((33, 10)) * 10).astype(dtype)
    w = np.random.default_rng(9).standard_normal((33, 10)).astype(dtype)
    # the row sums add up in another order: compare at the magnitude of the incoming gradient
    log = fused_and_generic(lambda x: tg.sum(getattr(tg, name)(x, axis=-1) * w), x, ulps=40,
                            scale=float(np.abs(w).max()))  # fmt: skip
    assert f"{name}_fwd" in launches(log) and f"{name}_bwd_acc" in launches(log)


def test_a_loss_summed_directly_fuses_with_the_broadcast_gradient():
    x = np.random.default_rng(11).standard_normal(300)
    log = fused_and_generic(lambda x: tg.sum(tg.tanh(x)), x)
    assert launches(log) == ["tanh_bwd_acc"]


def test_generic_only_turns_the_fused_path_off():
    from tracker_gpu.cuda import generic_only

    x = np.random.default_rng(12).standard_normal(300)
    with on_host(), generic_only(), recording() as log:
        tg.gradient(lambda x: tg.sum(tg.tanh(x) * x), x)
    assert log == []


def test_other_axes_and_nested_passes_take_the_generic_path():
    x = np.random.default_rng(10).standard_normal((4, 5))
    log = fused_and_generic(lambda x: tg.sum(tg.softmax(x, axis=0) * x), x)
    assert "softmax_fwd" not in launches(log)
    with on_host(), recording() as log:
        (g,) = tg.gradient(lambda x: tg.sum(tg.tanh(x) ** 2), x, nest=True)
    assert tg.istracked(g) and launches(log) == []
    with on_host():
        H = tg.hessian(lambda x: tg.sum(tg.sin(x) * x), x[0])
    assert np.allclose(H, tg.hessian(lambda x: tg.sum(tg.sin(x) * x), x[0]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logitcrossentropy_is_one_launch_each_way(dtype):
    rng = np.random.default_rng(13)
    logits = rng.standard_normal((40, 10)).astype(dtype)
    labels = rng.integers(0, 10, 40)
    log = fused_and_generic(lambda z: tg.nn.logitcrossentropy(z, labels), logits)
    # and one for the one-hot targets of the class labels (their range unchecked: no sync)
    assert launches(log) == ["onehot_fwd", "logitcrossentropy_fwd", "logitcrossentropy_bwd_acc"]
    with on_host():
        fused_value = float(tg.nn.logitcrossentropy(logits, labels))
    assert np.isclose(fused_value, float(tg.nn.logitcrossentropy(logits, labels)), rtol=1e-5)


def test_mse_pullback_is_one_launch_per_side():
    rng = np.random.default_rng(14)
    yhat, y = rng.standard_normal((8, 3)), rng.standard_normal((8, 3))
    log = fused_and_generic(lambda a, b: tg.nn.mse(a, b), yhat, y)
    assert launches(log) == ["mse_bwd_acc", "mse_bwd_acc"]
    log = fused_and_generic(lambda a: tg.nn.mse(a, y, agg="sum"), yhat)
    assert launches(log) == ["mse_bwd_acc"]


@pytest.mark.parametrize("rule", ["Descent", "Momentum", "Nesterov", "Adam", "AdamW"], ids=str)
def test_each_parameter_update_is_one_launch(rule):
    from tracker_gpu import optim

    rng = np.random.default_rng(15)
    model = {"w": rng.standard_normal((5, 4)), "b": rng.standard_normal(4), "name": "dense"}
    grads = {"w": rng.standard_normal((5, 4)), "b": rng.standard_normal(4), "name": None}
    opt = getattr(optim, rule)()
    state = optim.setup(opt, model)
    expected_state, expected = optim.update(state, model, grads)
    expected_state, expected = optim.update(expected_state, expected, grads)
    with on_host(), recording() as log:
        state, fused = optim.update(state, model, grads)
        state, fused = optim.update(state, fused, grads)
    assert len(launches(log)) == 4  # two parameters, two steps
    for key in ("w", "b"):
        assert np.allclose(fused[key], expected[key], rtol=1e-12)


# --- layers: the normalisation statistics and the LSTM cell, one launch each way
NORMS = {
    "LayerNorm": lambda: tg.nn.LayerNorm((3, 4), dtype="float64"),
    "GroupNorm": lambda: tg.nn.GroupNorm(6, 3, dtype="float64"),
    "BatchNorm": lambda: tg.nn.BatchNorm(6, active=True, dtype="float64"),
}


@pytest.mark.parametrize("name", list(NORMS))
def test_each_normalisation_layer_is_one_launch_each_way(name):
    layer = NORMS[name]()
    shape = (5, 3, 4) if name == "LayerNorm" else (4, 6, 3, 2)
    x = np.random.default_rng(16).standard_normal(shape) * 3 + 1
    w = np.random.default_rng(17).standard_normal(shape)
    log = fused_and_generic(lambda x: tg.sum(layer(x) * w), x, ulps=8 * x.size)
    assert launches(log).count("normalise_fwd") == 1
    assert launches(log).count("normalise_bwd_acc") == 1


def test_a_normalisation_whose_kept_axes_are_apart_takes_the_generic_path():
    x = np.random.default_rng(18).standard_normal((3, 4, 5))
    log = fused_and_generic(lambda x: tg.sum(tg.nn.normalise(x, axes=(1,)) * x), x, ulps=64)
    assert not {"normalise_fwd", "normalise_bwd_acc"} & set(launches(log))


def test_an_lstm_step_is_one_launch_each_way():
    lstm = tg.nn.LSTM(3, 4, rng=np.random.default_rng(19), dtype="float64")
    x = np.random.default_rng(20).standard_normal((2, 5, 3))
    log = fused_and_generic(lambda x: tg.sum(lstm(x) ** 2), x, ulps=64)
    assert launches(log).count("lstm_bwd_acc") == 5  # one per step
    with on_host(), recording() as log:
        _, (g,) = tg.withgradient(lambda m: tg.sum(m(x) ** 2), lstm)
    assert launches(log).count("lstm_fwd") == 5
    assert g.cell.Wi.shape == (16, 3)


KEYS = {
    "repeated": (np.array([3, 0, 3, 3, -1, 0]),),
    "rows of a batch": (np.array([[1, 4, 1], [4, 4, 0]]),),
    "arrays and a slice": (np.array([0, -1, 0, 4]), slice(1, 4), np.array([[2], [2], [6], [-7]])),
    "a new axis": (None, np.array([2, 2, 1])),
}


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("name", sorted(KEYS))
def test_indexing_by_integer_arrays_pulls_back_in_numpys_order(name, dtype):
    """The pullback of indexing by integer arrays (an embedding's) adds each position's
    elements in order, one rounding each, in one launch without atomics: bit for bit NumPy's
    add.at, and the same from run to run (CuPy's scatter-add is neither)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 6, 7)).astype(dtype)
    key = KEYS[name]
    w = rng.standard_normal(x[key].shape).astype(dtype)  # the gradient that is scattered

    def f(x):
        return tg.sum(x[key] * w)

    (generic,) = tg.gradient(f, x)
    with on_host(), recording() as log:
        (fused,) = tg.gradient(f, x)
    assert "scatter_add_ordered" in launches(log)
    assert fused.dtype == generic.dtype and np.array_equal(fused, generic)


def test_a_compiled_replay_pulls_back_an_embedding_in_numpys_order():
    """Indices given to a compiled function are read anew by each replay (a node of their
    own): its pullback is the same ordered launch, bit for bit the eager gradient."""
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((12, 16)).astype(np.float32)
    w = rng.standard_normal((4, 8, 16)).astype(np.float32)

    def loss(weight, ids):
        return tg.sum(tg.take(weight, tg.reshape(ids, (-1,)), axis=0) * w.reshape(32, 16))

    compiled = tg.compile(loss, gradient=True, wrt=0)
    for seed in range(3):  # the recording, then replays with other indices
        ids = np.random.default_rng(seed).integers(0, 12, (4, 8))
        (expected, _) = tg.gradient(loss, weight, ids)
        with on_host(), recording() as log:
            (fused, _) = compiled(weight, ids).grad
        assert "scatter_add_ordered" in launches(log)
        assert np.array_equal(fused, expected)
