"""The CUDA kernels, checked without a GPU: every source compiles with NVRTC for the
architectures we target, and every kernel, built for the host from the same source text, agrees
with the generic pullback on random inputs (float32 and float64, sizes that are not a multiple
of the block, broadcasting, empty)."""

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu.cuda import host
from tracker_gpu.cuda.fused import BINARY, UNARY, _meta
from tracker_gpu.cuda.sources import families, kernels, source

pytestmark = pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")

SIZES = [1, 7, 256, 1000]
DTYPES = ["float32", "float64"]
TOLERANCE = {"float32": dict(rtol=2e-5, atol=2e-5), "float64": dict(rtol=1e-12, atol=1e-14)}


def run(name, dtype, n, *args, block=64):
    """Launch a kernel through the host build on a grid that does not divide n evenly."""
    family = kernels()[name].family
    grid = max(1, min(-(-n // block), 3))  # few blocks: the grid-stride loop does the rest
    host.HostLibrary.get(family).launch(name, dtype, grid, block, args)


@pytest.mark.parametrize("family", families())
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_source_compiles_with_nvrtc(family, arch):
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="pip install cuda-python")
    names = [k.name for k in kernels().values() if k.family == family]
    err, program = nvrtc.nvrtcCreateProgram(
        source(family).encode(), f"{family}.cu".encode(), 0, [], []
    )
    for name in names:
        for ctype in ("float", "double"):
            nvrtc.nvrtcAddNameExpression(program, f"{name}<{ctype}>".encode())
    (result,) = nvrtc.nvrtcCompileProgram(
        program, 2, [f"--gpu-architecture={arch}".encode(), b"-std=c++14"]
    )
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        pytest.fail(f"{family}.cu does not compile for {arch}:\n{log.decode(errors='replace')}")
    err, size = nvrtc.nvrtcGetCUBINSize(program)
    assert size > 0


def generic_vjp(primitive, g, ans, *args, **kw):
    """The rule's own (generic, Array API) vjp for argument 0, on NumPy."""
    return primitive.vjps[0](g, ans, *args, **kw)


DOMAINS = {"log": (0.5, 2.0), "sqrt": (0.5, 2.0)}


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_unary_kernels_match_the_generic_pullback(name, dtype, n):
    rng = np.random.default_rng(n)
    lo, hi = DOMAINS.get(name, (-2.0, 2.0))
    x = rng.uniform(lo, hi, n).astype(dtype)
    primitive = getattr(tg, name)
    y = np.asarray(primitive(x), dtype=dtype)
    g = rng.standard_normal(n).astype(dtype)
    prev = rng.standard_normal(n).astype(dtype)
    expected = prev + np.asarray(generic_vjp(primitive, g, y, x), dtype=dtype)
    acc = prev.copy()
    run(f"{name}_bwd_acc", dtype, n, x, y, g, 1, acc, acc, n, 1)  # in place: prev is acc
    assert np.allclose(acc, expected, **TOLERANCE[dtype])
    fresh = np.full(n, np.nan, dtype=dtype)
    run(f"{name}_bwd_acc", dtype, n, x, y, g, 1, fresh, fresh, n, 0)  # first contribution
    assert np.allclose(fresh, expected - prev, **TOLERANCE[dtype])


def test_a_broadcast_scalar_gradient_is_read_with_step_zero():
    x = np.linspace(-1.0, 1.0, 300)
    y = np.tanh(x)
    g = np.broadcast_to(np.asarray(0.5), x.shape)  # what sum's pullback passes on
    acc = np.full(300, np.nan)
    run("tanh_bwd_acc", "float64", 300, x, y, g, 0, acc, acc, 300, 0)
    assert np.allclose(acc, 0.5 * (1 - y**2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_sum_of_squares_kernel(dtype, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(dtype)
    g = np.asarray(rng.standard_normal(), dtype=dtype)
    acc = np.full(n, np.nan, dtype=dtype)
    run("sumsq_bwd_acc", dtype, n, x, g, acc, acc, n, 0)
    assert np.allclose(acc, 2 * x * g, **TOLERANCE[dtype])


SHAPES = [
    ((5, 3), (5, 3)),
    ((5, 3), (3,)),
    ((4, 1, 3), (1, 6, 1)),
    ((2, 3, 4), ()),
    ((), (7,)),
    ((0, 3), (3,)),
]


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_kernels_sum_over_broadcast_axes(op, shapes, dtype):
    rng = np.random.default_rng(0)
    x = np.asarray(rng.uniform(0.5, 1.5, shapes[0]), dtype=dtype)
    y = np.asarray(rng.uniform(0.5, 1.5, shapes[1]), dtype=dtype)
    primitive = getattr(tg, op)
    out = np.asarray(primitive(x, y), dtype=dtype)
    g = np.asarray(rng.standard_normal(out.shape), dtype=dtype)
    for side, target in enumerate((x, y)):
        generic = primitive.vjps[side](g, out, x, y)
        expected = np.asarray(tg.rules.shape.unbroadcast(generic, target.shape), dtype=dtype)
        meta = np.asarray(_meta(out.shape, x.shape, y.shape, target.shape), dtype=np.int64)
        acc = np.full(target.shape, np.nan, dtype=dtype)
        n = target.size
        run(
            f"{BINARY[op]}_bwd_acc",
            dtype,
            max(n, 1),
            g,
            1,
            x,
            y,
            out,
            meta,
            acc,
            acc,
            out.ndim,
            side,
            n,
            0,
        )
        assert np.allclose(acc, expected, **TOLERANCE[dtype]), (op, side)


@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 10), (300, 7)])
def test_rowwise_kernels(name, dtype, shape):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 30).astype(dtype)  # large values: stability matters
    primitive = getattr(tg, name)
    rows, cols = shape
    y = np.empty_like(x)
    run(f"{name}_fwd", dtype, rows, x, y, rows, cols)
    assert np.allclose(y, primitive(x.astype(np.float64), axis=-1), **TOLERANCE[dtype])
    g = rng.standard_normal(shape).astype(dtype)
    acc = np.full(shape, np.nan, dtype=dtype)
    run(f"{name}_bwd_acc", dtype, rows, y, g, acc, acc, rows, cols, 0)
    assert np.allclose(acc, generic_vjp(primitive, g, y, x, axis=-1), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (5, 10), (513, 3)])
@pytest.mark.parametrize("soft", [False, True], ids=["onehot", "probabilities"])
def test_logitcrossentropy_kernels(dtype, shape, soft):
    rng = np.random.default_rng(2)
    rows, cols = shape
    x = (rng.standard_normal(shape) * 20).astype(dtype)
    if soft:
        targets = rng.uniform(0.0, 1.0, shape) * 2.0  # mass 0..2 per row: sum(t) matters
    else:
        targets = np.eye(cols)[rng.integers(0, cols, rows)]
    targets = targets.astype(dtype)
    x64, t64 = x.astype(np.float64), targets.astype(np.float64)
    logsoftmax = (
        x64 - (np.log(np.sum(np.exp(x64 - x64.max(1, keepdims=True)), 1)) + x64.max(1))[:, None]
    )
    loss = np.empty(rows, dtype=dtype)
    run("logitcrossentropy_fwd", dtype, rows, x, targets, loss, rows, cols)
    assert np.allclose(loss, -np.sum(t64 * logsoftmax, 1), **TOLERANCE[dtype])
    g = np.asarray(0.7, dtype=dtype)
    acc = np.full(shape, np.nan, dtype=dtype)
    normalized = 0 if soft else 1
    run(
        "logitcrossentropy_bwd_acc",
        dtype,
        rows,
        x,
        targets,
        g,
        rows,
        normalized,
        acc,
        acc,
        rows,
        cols,
        0,
    )
    mass = t64.sum(1, keepdims=True)
    expected = 0.7 / rows * (np.exp(logsoftmax) * mass - t64)
    assert np.allclose(acc, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("count", [300, 1])
def test_mse_kernel(dtype, sign, count):
    rng = np.random.default_rng(3)
    yhat, y = (rng.standard_normal(300).astype(dtype) for _ in range(2))
    g = np.asarray(1.5, dtype=dtype)
    acc = np.full(300, np.nan, dtype=dtype)
    run("mse_bwd_acc", dtype, 300, yhat, y, g, count, sign, acc, acc, 300, 0)
    assert np.allclose(acc, sign * 2 * (yhat - y) * 1.5 / count, **TOLERANCE[dtype])


def optimiser_cases():
    from tracker_gpu import optim

    return [
        ("descent_step", optim.Descent(0.1)),
        ("momentum_step", optim.Momentum(0.05, 0.9)),
        ("nesterov_step", optim.Nesterov(0.05, 0.8)),
        ("adam_step", optim.Adam(0.01)),
        ("adam_step", optim.AdamW(0.01, weight_decay=0.1)),
        ("adam_step", optim.AdamW(0.01, weight_decay=0.1, couple=False)),
    ]


@pytest.mark.parametrize("case", range(6))
@pytest.mark.parametrize("dtype", DTYPES)
def test_optimiser_kernels_match_the_generic_rule(case, dtype):
    from tracker_gpu.cuda import fused
    from tracker_gpu.cuda.launch import on_host

    kernel, rule = optimiser_cases()[case]
    rng = np.random.default_rng(case)
    x = rng.standard_normal(1000).astype(dtype)
    state = rule.init(x)
    for _ in range(3):  # a few steps: the bias corrections and moments evolve
        dx = rng.standard_normal(1000).astype(dtype)
        expected_state, delta = rule.apply(state, x, dx)
        with on_host():
            x_fused, state_fused = getattr(fused, kernel)(rule, x, dx, state)
        assert np.allclose(x_fused, x - delta, **TOLERANCE[dtype])
        for a, b in zip(_arrays(state_fused), _arrays(expected_state)):
            assert np.allclose(a, b, **TOLERANCE[dtype])
        x, state = x_fused, state_fused


def _arrays(state):
    if state is None:  # Descent keeps no state
        return []
    if isinstance(state, tuple):
        return [a for part in state for a in _arrays(part)]
    return [np.asarray(state)]


CHECKED = (
    {f"{n}_bwd_acc" for n in UNARY}
    | {f"{n}_bwd_acc" for n in BINARY.values()}
    | {"sumsq_bwd_acc", "mse_bwd_acc", "logitcrossentropy_fwd", "logitcrossentropy_bwd_acc"}
    | {"descent_step", "momentum_step", "nesterov_step", "adam_step"}
    | {"softmax_fwd", "softmax_bwd_acc", "logsoftmax_fwd", "logsoftmax_bwd_acc"}
)


def test_every_kernel_is_checked():
    assert set(kernels()) == CHECKED


def test_a_broken_kernel_fails_its_check(tmp_path, monkeypatch):
    """The checks see the arithmetic: flip one sign in a copy of a source and its check fails."""
    broken = source("unary").replace("T(1) - yi * yi", "T(1) + yi * yi")
    monkeypatch.setattr(
        host, "source", lambda family: broken if family == "unary" else source(family)
    )
    monkeypatch.setattr(host.HostLibrary, "_cache", {})
    with pytest.raises(AssertionError):
        test_unary_kernels_match_the_generic_pullback("tanh", "float64", 7)
