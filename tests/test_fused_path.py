"""The whole fused path, from the rule's dispatch down to the kernel launch, run on the CPU
through the host build of the kernels (`on_host`), against the generic path: gradients, the
number of launches, and the allocations each fused pullback makes."""

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu.cuda import host
from tracker_gpu.cuda.launch import on_host, recording

pytestmark = pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")


def fused_and_generic(f, *xs):
    """Gradients through the fused path (with its launch/alloc log) and through the generic one."""
    generic = tg.gradient(f, *xs)
    with on_host(), recording() as log:
        fused = tg.gradient(f, *xs)
    for a, b in zip(fused, generic):
        assert a.dtype == b.dtype and a.shape == b.shape
        scale = float(np.max(np.abs(b), initial=1.0))
        if a.dtype == np.float32:  # both paths round; compare at the gradient's magnitude
            assert np.allclose(a, b, rtol=1e-5, atol=1e-6 * scale)
        else:
            assert np.allclose(a, b, rtol=1e-12, atol=1e-14 * scale)
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
    expected = (
        ["mul_bwd_acc"] + ["add_bwd_acc"] * 4 + ["tanh_bwd_acc", "sin_bwd_acc", "exp_bwd_acc"]
    )
    assert sorted(launches(log)) == sorted(expected)
    # x receives three contributions: one buffer, and the later two are added into it in place
    assert len(allocations(log)) == len(launches(log)) - 2


@pytest.mark.parametrize(
    "shapes", [((5, 3), (3,)), ((4, 1, 3), (1, 6, 1)), ((2, 3), ()), ((7,), (7,))], ids=str
)
@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "pow"])
def test_broadcast_arithmetic_reduces_inside_the_kernel(shapes, op):
    rng = np.random.default_rng(5)
    x, y = (rng.uniform(0.5, 1.5, s) for s in shapes)
    w = rng.standard_normal(np.broadcast_shapes(*shapes))
    log = fused_and_generic(lambda x, y: tg.sum(getattr(tg, op)(x, y) * w), x, y)
    kernel = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "pow": "pow"}[op]
    outer = 1 if op == "multiply" else 0  # the product with w fuses too
    assert launches(log).count(f"{kernel}_bwd_acc") == 2 + outer
    # the gradients of the product (out's shape) and of the two operands, nothing else
    assert sorted(allocations(log)) == sorted([w.nbytes, x.nbytes, y.nbytes])


def test_scalar_operands_and_the_same_operand_twice():
    x = np.random.default_rng(6).standard_normal((6, 4))
    w = np.random.default_rng(7).standard_normal((6, 4))
    fused_and_generic(lambda x: tg.sum((2.0 * x - x / 3.0 + x**3.0) * w), x)
    log = fused_and_generic(lambda x: tg.sum((x * x) * w), x)
    assert launches(log).count("mul_bwd_acc") == 3  # (x * x) * w: one, then x * x: both sides
    assert allocations(log) == [x.nbytes, x.nbytes]  # x's second side adds in place


@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rowwise_forward_and_pullback(name, dtype):
    x = (np.random.default_rng(8).standard_normal((33, 10)) * 10).astype(dtype)
    w = np.random.default_rng(9).standard_normal((33, 10)).astype(dtype)
    log = fused_and_generic(lambda x: tg.sum(getattr(tg, name)(x, axis=-1) * w), x)
    assert f"{name}_fwd" in launches(log) and f"{name}_bwd_acc" in launches(log)


def test_a_loss_summed_directly_fuses_with_the_broadcast_gradient():
    x = np.random.default_rng(11).standard_normal(300)
    log = fused_and_generic(lambda x: tg.sum(tg.tanh(x)), x)
    assert launches(log) == ["tanh_bwd_acc"]


def test_generic_only_turns_the_fused_path_off():
    from tracker_gpu.cuda.launch import generic_only

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
    assert launches(log) == ["logitcrossentropy_fwd", "logitcrossentropy_bwd_acc"]
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
