"""The CUDA kernels, checked without a GPU: every source compiles with NVRTC for the
architectures we target, and every kernel, built for the host from the same source text, agrees
with the generic rule on the whole domain (zeros of both signs, subnormal and huge magnitudes,
infinities, nan), in float32 and float64, on sizes that are not a multiple of the block.

Broadcast arithmetic is checked through its fused pullback in test_fused_path.py."""

import numpy as np
import pytest
from domain import assert_agree, domain, special_values

import tracker_gpu as tg
from tracker_gpu.cuda import host, launch, sources
from tracker_gpu.cuda.elementwise import BINARY, UNARY
from tracker_gpu.cuda.sources import Family, families, family, kernels, source

pytestmark = pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")

# The architectures compiled for: the kernels' own sources (which carry the half-precision
# conversions, inline PTX) for both; the generated ones for the newest alone, as their only
# code that depends on the architecture is that same header, written out.
ARCHS = ["sm_80", "sm_90"]
GENERATED_ARCH = "sm_90"

SIZES = [1, 7, 256, 1000]
DTYPES = ["float32", "float64"]


def run(name, dtype, items, *args, block=64, text=None):
    """Launch a kernel through the host build on a grid that does not cover the items, so the
    grid-stride loops do the rest."""
    text = text or family(kernels()[name].family)
    grid = max(1, min(-(-items // block), 3))
    host.HostLibrary.get(text).launch(name, dtype, grid, block, args)


def compile_with_nvrtc(text, name, arch):
    """Compile `text` (every kernel, float and double) with NVRTC; fail with its log."""
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="pip install cuda-python")
    err, program = nvrtc.nvrtcCreateProgram(text.text.encode(), f"{name}.cu".encode(), 0, [], [])
    for expression in text.name_expressions():
        nvrtc.nvrtcAddNameExpression(program, expression.encode())
    (result,) = nvrtc.nvrtcCompileProgram(
        program, 2, [f"--gpu-architecture={arch}".encode(), b"-std=c++14"]
    )
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        pytest.fail(f"{name} does not compile for {arch}:\n{log.decode(errors='replace')}")
    err, size = nvrtc.nvrtcGetCUBINSize(program)
    assert size > 0


@pytest.mark.parametrize("name", families())
@pytest.mark.parametrize("arch", ARCHS)
def test_every_source_compiles_with_nvrtc(name, arch):
    compile_with_nvrtc(family(name), name, arch)


@pytest.mark.parametrize("name", families())
def test_every_source_rounds_each_operation_on_both_targets(name):
    """No contraction of a * b + c into one rounding (NVRTC contracts unless told not to), on
    the device as here: a fused Adam step has the generic rule's bits, so an eager step and its
    compiled replay agree on a GPU too (they differed by an ulp before)."""
    assert "--fmad=false" in family(name).nvrtc_options()
    assert "-ffp-contract=off" in host.host_flags(family(name))


def test_the_launchers_and_the_kernels_agree_on_the_elements_per_thread():
    """A loop of TG_PER_THREAD elements a pass launched with a grid for one element per thread
    would still be right, only slower; the two numbers are one."""
    header = (sources._directory() / "half.cuh").read_text()
    assert f"#define TG_PER_THREAD {launch.PER_THREAD}\n" in header


def generic_unary(name, g, y, x):
    """The rule's own (generic, Array API) vjp, on NumPy."""
    with np.errstate(all="ignore"):
        return np.asarray(getattr(tg, name).vjps[0](g, y, x), dtype=x.dtype)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_unary_kernels_agree_with_the_generic_rule_everywhere(name, dtype, n):
    x = domain(n, dtype, seed=n)
    with np.errstate(all="ignore"):
        y = np.asarray(getattr(tg, name)(x), dtype=dtype)
    g = domain(n, dtype, seed=n + 1)
    prev = domain(n, dtype, seed=n + 2)
    contribution = generic_unary(name, g, y, x)
    acc = prev.copy()
    run(f"{name}_bwd_acc", dtype, n, x, y, g, 1, acc, acc, n, 1)  # in place: prev is acc
    with np.errstate(all="ignore"):
        scale = np.abs(prev) + np.abs(contribution)  # the sum may cancel
        assert_agree(acc, prev + contribution, scale=scale, what=f"{name} added to prev")
    fresh = np.full(n, 7.0, dtype=dtype)
    run(f"{name}_bwd_acc", dtype, n, x, y, g, 1, fresh, fresh, n, 0)  # a first contribution
    assert_agree(fresh, contribution, signed_zeros=True, what=name)  # -0 stays -0


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
    x = domain(n, dtype, seed=n)
    for g in domain(4, dtype, seed=n + 1, special=0.5):
        g = np.asarray(g, dtype=dtype)
        acc = np.full(n, 7.0, dtype=dtype)
        run("sumsq_bwd_acc", dtype, n, x, g, acc, acc, n, 0)
        with np.errstate(all="ignore"):
            expected = tg.sumabs2.vjps[0](g, None, x)
        assert_agree(acc, expected, what=f"sumsq with g={g}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("agg", ["mean", "sum"])
def test_squared_error_kernel(dtype, agg):
    from tracker_gpu.rules.losses import mse_primitive

    yhat, y = domain(300, dtype, seed=3), domain(300, dtype, seed=4)
    g = np.asarray(1.5, dtype=dtype)
    factor = 2.0 / 300 if agg == "mean" else 2.0
    for side in (0, 1):
        acc = np.full(300, 7.0, dtype=dtype)
        run("mse_bwd_acc", dtype, 300, yhat, y, g, factor, side, acc, acc, 300, 0)
        with np.errstate(all="ignore"):
            expected = mse_primitive.vjps[side](g, None, yhat, y, agg=agg)
        assert_agree(acc, expected, what=f"mse side {side}")


ROW_SHAPES = [(1, 1), (3, 10), (37, 7), (2, 300)]


def rows_domain(shape, dtype, seed):
    """Logits over the whole domain but huge values (a row's sum may overflow in any order)."""
    x = domain(shape, dtype, seed=seed)
    return np.where(np.abs(x) > 1e4, np.copysign(np.inf, x), x).astype(dtype)


@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
def test_rowwise_kernels(name, dtype, shape):
    rows, cols = shape
    x = rows_domain(shape, dtype, seed=rows)
    primitive = getattr(tg, name)
    with np.errstate(all="ignore"):  # the domain's infinities: inf - inf, inf * 0
        expected = primitive(x, axis=-1)
        shift = np.abs(x - np.max(x, axis=-1, keepdims=True)) + np.log(cols)  # (x - m) - log s
        scale = shift * (name == "logsoftmax")
    y = np.full_like(x, 7.0)
    run(f"{name}_fwd", dtype, rows, x, y, rows, cols, block=32)
    assert_agree(y, expected, ulps=2 * cols, scale=scale, what=f"{name} forward")
    g = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    acc = np.full(shape, 7.0, dtype=dtype)
    run(f"{name}_bwd_acc", dtype, rows, y, g, acc, acc, rows, cols, 0, block=32)
    with np.errstate(all="ignore"):
        generic = primitive.vjps[0](g, y, x, axis=-1)
        scale = np.abs(y) * np.sum(np.abs(g) * np.abs(np.exp(y) if name == "logsoftmax" else y),
                                   axis=-1, keepdims=True)  # fmt: skip
    assert_agree(acc, generic, ulps=4 * cols, scale=scale, what=f"{name} pullback")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (5, 10), (70, 3)], ids=str)
@pytest.mark.parametrize("soft", [False, True], ids=["onehot", "probabilities"])
def test_logitcrossentropy_kernels(dtype, shape, soft):
    from tracker_gpu.rules.losses import _lce_vjp_logits

    rng = np.random.default_rng(2)
    rows, cols = shape
    x = (rng.standard_normal(shape) * 20).astype(dtype)
    specials = np.array([np.inf, -np.inf, 0.0, -0.0, np.nan], dtype=dtype)
    x.flat[::7] = np.resize(specials, x.flat[::7].shape)
    if soft:
        targets = rng.uniform(0.0, 1.0, shape) * 2.0  # mass 0..2 per row: sum(t) matters
    else:
        targets = np.eye(cols)[rng.integers(0, cols, rows)]
    targets = targets.astype(dtype)
    rowsum = np.full(rows, 7.0, dtype=dtype)
    run("logitcrossentropy_fwd", dtype, rows, x, targets, rowsum, rows, cols, block=32)
    with np.errstate(all="ignore"):
        logsoftmax = tg.logsoftmax(x, axis=-1)
        terms = targets * np.where(targets != 0, logsoftmax, 0)  # a zero target adds 0
        assert_agree(rowsum, np.sum(terms, axis=1), ulps=4 * cols,
                     scale=np.sum(np.abs(terms), axis=1), what="rows")  # fmt: skip
    g = np.asarray(0.7, dtype=dtype)
    acc = np.full(shape, 7.0, dtype=dtype)
    normalized = 0 if soft else 1
    run("logitcrossentropy_bwd_acc", dtype, rows, x, targets, g, rows, normalized, acc, acc,
        rows, cols, 0, block=32)  # fmt: skip
    with np.errstate(all="ignore"):
        expected = _lce_vjp_logits(g, None, x, targets, axis=-1, agg="mean",
                                   normalized=not soft)  # fmt: skip
    assert_agree(acc, expected, ulps=4 * cols, scale=np.abs(g / rows), what="pullback")


# one-hot targets: labels in range, out of it on both sides, at int64's ends
LABELS = np.array([0, 3, 9, -1, 10, 2**62, -(2**63), 2**63 - 1, 5], dtype=np.int64)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "labels",
    [LABELS, LABELS.astype(np.int32), np.arange(12, dtype=np.uint8) % 11,
     np.resize(LABELS, (3, 40))[:, ::2], np.zeros(0, dtype=np.int64)],
    ids=["int64", "int32", "uint8", "2-d strided", "empty"],
)  # fmt: skip
def test_onehot_forward_agrees_with_the_generic_rule_everywhere(dtype, labels):
    """The fused one-hot (one launch) equals the generic rule's unchecked form bit for bit: 0
    and 1 in range, a row of nan out of it."""
    from tracker_gpu.cuda.dispatch import FORWARDS, on_host, recording
    from tracker_gpu.rules.losses import _onehot_forward

    dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else dtype)
    like = dict(name="loss", classes=10, axis=labels.ndim, ndim=labels.ndim + 1, dtype=dtype,
                device="cpu", check=False)  # fmt: skip
    with on_host(), recording() as log:
        fused = FORWARDS["onehot"](labels, **like)
    assert ("launch", "onehot_fwd") in log
    expected = _onehot_forward(np, labels, **like)
    assert fused.dtype == expected.dtype and fused.shape == expected.shape
    assert np.array_equal(fused.astype(np.float64), expected.astype(np.float64), equal_nan=True)
    with on_host():  # labels on another device than the scores': the generic rule's to refuse
        assert FORWARDS["onehot"](labels, **{**like, "device": "gpu:1"}) is None


def test_the_loss_of_class_labels_is_the_generic_one_through_the_fused_one_hot():
    from tracker_gpu.cuda.dispatch import generic_only, on_host, recording

    logits = np.random.default_rng(3).standard_normal((len(LABELS), 10))
    in_range = LABELS % 10
    with tg.sync_checks(False):
        for labels in (in_range, LABELS):  # out of range: nan on both paths
            loss = lambda z, labels=labels: tg.nn.logitcrossentropy(z, labels)
            with on_host(), recording() as log:
                fused = tg.withgradient(loss, logits)
            with generic_only():
                expected = tg.withgradient(loss, logits)
            assert ("launch", "onehot_fwd") in log
            assert np.array_equal(fused[0], expected[0], equal_nan=True)
            assert np.allclose(fused[1][0], expected[1][0], rtol=1e-12, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_the_ordered_scatter_add_is_numpys_add_at_everywhere(dtype):
    """The pullback of indexing by integer arrays (`scatter_add_ordered`): every special value
    of the dtype added at positions named up to 9 times, in order, bit for bit `np.add.at`."""
    from tracker_gpu.cuda.dispatch import FORWARDS, on_host, recording

    half = pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else None
    values = special_values(np.dtype(half or dtype).name if half is None else "float32")
    values = np.resize(values, 300).astype(half or dtype)
    rows = np.random.default_rng(7).integers(-6, 6, 100)
    key = (rows, slice(None))
    g = values.reshape(100, 3)
    with on_host(), recording() as log:
        fused = FORWARDS["index_adjoint"](g, (6, 3), key)
    assert ("launch", "scatter_add_ordered") in log
    expected = np.zeros((6, 3), g.dtype)
    with np.errstate(all="ignore"):
        np.add.at(expected, key, g)
    fused, expected = fused.astype(np.float64), expected.astype(np.float64)  # exact: widening
    np.testing.assert_array_equal(fused, expected)  # nan where nan
    assert np.array_equal(np.signbit(fused), np.signbit(expected))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("count", [1, 8, 11])
def test_the_finite_check_agrees_with_the_generic_rule_everywhere(dtype, count):
    """The loss scaler's check on the fused path (`finite_partials`, one launch per eight
    arrays) against the generic `all(isfinite(x))` of each array, combined: every special
    value of the dtype, alone in any one of `count` arrays of sizes that are not a multiple of
    the block (an empty one among them), and none."""
    from tracker_gpu.cuda.dispatch import FORWARDS, on_host, recording
    from tracker_gpu.precision import _all_finite_forward

    half = pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else None
    dtype = np.dtype(half or dtype)
    specials = special_values(np.float32 if half else dtype).astype(dtype)
    sizes = [(300, 0, 1, 5, 513, 2, 64, 3, 7, 1000, 9)[k] for k in range(count)]
    rng = np.random.default_rng(count)
    arrays = [(rng.standard_normal(n) * 100).astype(dtype) for n in sizes]
    placed = [(v, k) for v in specials for k in range(count) if sizes[k]]
    cases = [(None, None, None)] + [(v, k, int(rng.integers(sizes[k]))) for v, k in placed]
    for value, k, at in cases:
        given = [a.copy() for a in arrays]
        if value is not None:
            given[k][at] = value
        with on_host(), recording() as log:
            fused = FORWARDS["all_finite"](*given)
        expected = _all_finite_forward(np, *given)
        assert bool(fused) == bool(expected), (value, k, at)
        assert [n for kind, n in log if kind == "launch"] == ["finite_partials"] * -(-count // 8)


# (shape, axes): LayerNorm (outer 1), BatchNorm of images and of features, GroupNorm, all axes
NORMALISE_CASES = [((3, 10), (1,)), ((4, 3, 2, 5), (0, 2, 3)), ((37, 3), (0,)),
                   ((2, 3, 300), (2,)), ((5, 7), (0, 1))]  # fmt: skip


@pytest.mark.parametrize("special", [0.0, 0.3])  # a group with a special value is all nan
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", NORMALISE_CASES, ids=str)
def test_normalise_kernels_agree_with_the_generic_rule_everywhere(dtype, case, special):
    from tracker_gpu.cuda.layers import layout
    from tracker_gpu.rules.nn import normalise

    shape, axes = case
    outer, groups, inner = layout(shape, axes)
    x = domain(shape, dtype, seed=len(shape), special=special)
    x = np.where(np.abs(x) > 1e4, np.copysign(np.inf, x), x).astype(dtype)  # sums that overflow
    with np.errstate(all="ignore"):
        expected = normalise(x, axes=axes)
        count = outer * inner
        mean_abs = np.mean(np.abs(x.astype(np.float64)), axis=axes, keepdims=True)
        spread = np.std(x.astype(np.float64), axis=axes, keepdims=True) + 1e-3
    y = np.full_like(x, 7.0)
    run("normalise_fwd", dtype, groups, x, y, outer, groups, inner, 1e-5, block=32)
    # the sums of the mean and the variance run in another order: the centred values move by
    # the mean's rounding, count ulp of the values' magnitude, over the spread
    scale = (np.abs(expected) + mean_abs / spread) * count
    assert_agree(y, expected, ulps=4, scale=scale, what="normalise forward")
    g = domain(shape, dtype, seed=3, special=0.0)
    acc = np.full_like(x, 7.0)
    run("normalise_bwd_acc", dtype, groups, x, expected, g, acc, acc, outer, groups, inner,
        1e-5, 0, block=32)  # fmt: skip
    with np.errstate(all="ignore"):
        generic = normalise.vjps[0](g, expected, x, axes=axes)
        g_mag = np.mean(np.abs(g.astype(np.float64)), axis=axes, keepdims=True)
    grad_scale = (np.abs(g) + g_mag * (1 + np.abs(expected))) / spread * (1 + mean_abs / spread)
    assert_agree(acc, generic, ulps=4 * count, scale=grad_scale, what="normalise pullback")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (300, 2)], ids=str)
def test_lstm_kernels_agree_with_the_generic_rule_everywhere(dtype, shape):
    from tracker_gpu.rules.nn import lstm_cell

    rows, hidden = shape
    z = domain((rows, 4 * hidden), dtype, seed=rows)
    c = domain((rows, hidden), dtype, seed=rows + 1)
    with np.errstate(all="ignore"):
        expected = lstm_cell(z, c)
    out = np.full((rows, 2 * hidden), 7.0, dtype=dtype)
    run("lstm_fwd", dtype, rows * hidden, z, c, out, rows, hidden, hidden)
    state = np.abs(np.concatenate([c, c], axis=-1)) + 1  # f * c + i * u, then through tanh
    assert_agree(out, expected, ulps=16, scale=state, what="lstm forward")
    g = domain((rows, 2 * hidden), dtype, seed=rows + 2)
    prev_z, prev_c = domain(z.shape, dtype, seed=5), domain(c.shape, dtype, seed=6)
    acc_z, acc_c = prev_z.copy(), prev_c.copy()
    run("lstm_bwd_acc", dtype, rows * hidden, z, c, expected, g, acc_z, acc_z, acc_c, acc_c,
        rows, hidden, hidden, 1, 1, 1, 1)  # fmt: skip
    with np.errstate(all="ignore"):
        dz, dc = (vjp(g, expected, z, c) for vjp in lstm_cell.vjps)
        g_mag = np.abs(g[:, :hidden]) + np.abs(g[:, hidden:])
        mag_z = np.concatenate([g_mag * (1 + np.abs(c))] * 4, axis=-1)
        assert_agree(acc_z, prev_z + dz, ulps=16, scale=np.abs(prev_z) + mag_z, what="dz")
        assert_agree(acc_c, prev_c + dc, ulps=16, scale=np.abs(prev_c) + g_mag, what="dc")
    fresh_c = np.full_like(c, 7.0)
    apart = np.concatenate([c, c], axis=-1)  # c as rows 2h apart, as the step before leaves it
    run("lstm_bwd_acc", dtype, rows * hidden, z, apart, expected, g, z, z, fresh_c, fresh_c,
        rows, hidden, 2 * hidden, 0, 0, 1, 0)  # fmt: skip
    assert_agree(fresh_c, dc, ulps=16, scale=g_mag, what="dc alone")


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
def test_optimiser_kernels_agree_with_the_generic_rule_everywhere(case, dtype):
    from tracker_gpu import optim
    from tracker_gpu.cuda import on_host

    kernel, rule = optimiser_cases()[case]
    x = domain(1000, dtype, seed=case)
    state = rule.init(x)
    for step in range(3):  # a few steps: the bias corrections and moments evolve
        dx = domain(1000, dtype, seed=10 + step)
        with np.errstate(all="ignore"):
            expected_x, expected_state = optim.step(rule, x, dx, state)
            with on_host():
                fused_x, fused_state = optim.step(rule, x, dx, state)
        assert_agree(fused_x, expected_x, what=f"{kernel} parameter, step {step}")
        for a, b in zip(_arrays(fused_state), _arrays(expected_state)):
            assert_agree(a, b, what=f"{kernel} state, step {step}")
        x, state = fused_x, fused_state


def _arrays(state):
    if state is None:  # Descent keeps no state
        return []
    if isinstance(state, tuple):
        return [a for part in state for a in _arrays(part)]
    return [np.asarray(state)]


CHECKED = (
    {f"{n}_bwd_acc" for n in UNARY}
    | {f"{n}_bwd_acc" for n in BINARY.values()}
    | {f"{n}_bwd_reduce" for n in BINARY.values()}
    | {"reduce_finish", "sumsq_bwd_acc", "mse_bwd_acc"}
    | {"logitcrossentropy_fwd", "logitcrossentropy_bwd_acc", "onehot_fwd"}
    | {"descent_step", "momentum_step", "nesterov_step", "adam_step", "finite_partials"}
    | {"softmax_fwd", "softmax_bwd_acc", "logsoftmax_fwd", "logsoftmax_bwd_acc"}
    | {"normalise_fwd", "normalise_bwd_acc", "lstm_fwd", "lstm_bwd_acc"}
    | {"scatter_add_ordered"}
)


def test_every_kernel_is_checked():
    assert set(kernels()) == CHECKED


def test_a_broken_kernel_fails_its_check(monkeypatch):
    """The checks see the arithmetic: flip one sign in a copy of a source and its check fails."""
    broken = Family.from_text("unary", source("unary").replace("T(1) - yi * yi", "T(1) + yi * yi"))
    monkeypatch.setitem(globals(), "family", lambda name: broken)
    with pytest.raises(AssertionError):
        test_unary_kernels_agree_with_the_generic_rule_everywhere("tanh", "float64", 7)


def test_a_launch_with_the_wrong_arguments_raises():
    x = np.ones(4)
    with pytest.raises(TypeError, match="takes 8 arguments"):
        launch.launch("tanh_bwd_acc", "float64", 1, x, x, x, 1, x, x, 4)  # has_prev missing
    with pytest.raises(TypeError):
        host.HostLibrary.get(family("unary")).launch("tanh_bwd_acc", "float64", 1, 64,
                                                      (x, x, x, 1, x, x, 4))  # fmt: skip


def test_threads_that_synchronise_run_as_on_the_device():
    """A block reduction (shared memory, barriers) gives the exact sum on the host build."""
    text = Family.from_text(
        "barrier",
        """
template <typename T>
__global__ void block_sum(const T* x, T* out, long long n) {
    __shared__ T lanes[256];
    T total = T(0);
    for (long long i = threadIdx.x; i < n; i += blockDim.x) total += x[i];
    lanes[threadIdx.x] = total;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) lanes[threadIdx.x] += lanes[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = lanes[0];
}
""",
    )
    assert (
        text.kernels["block_sum"].cooperative
        and not family("unary").kernels["tanh_bwd_acc"].cooperative
    )
    x = np.arange(1000, dtype=np.float64)
    out = np.zeros(2)
    host.HostLibrary.get(text).launch("block_sum", "float64", 2, 128, (x, out, 1000))
    assert out.tolist() == [x.sum(), x.sum()]  # without the barriers the lanes would be stale
