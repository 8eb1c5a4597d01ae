"""float16 and bfloat16 in the fused kernels, checked without a GPU.

The kernels written for a storage type (`kernels/half.cuh`) load half values into float32,
compute their formula in float32 and round each stored value once, to nearest even. So each is
checked against two references over the whole domain of the half type (zeros of both signs,
subnormals, the largest finite values, infinities, nan, random bit patterns):

- the contract: the generic rule computed in float32 on the inputs widened, rounded once. Since
  rounding is monotone, a kernel whose float32 arithmetic is within `slack` of that value stores
  a value between the roundings of its ends: an exact bound, overflow to infinity included.
- the generic path on the half arrays themselves, which rounds after every operation (NumPy's
  float16 and ml_dtypes' bfloat16 compute each operation in float32 and round it): the same nan
  and infinity pattern, and finite values within a few units in the half type's last place of
  the magnitudes involved, except at the elements where the generic path's own roundings
  overflowed or underflowed on the way (its pattern differs from the float32 result rounded
  once); there the fused path gives the float32 result rounded once, as the first check says.

The software half types of the host build are checked bit for bit against NumPy and ml_dtypes.
"""

import ml_dtypes
import numpy as np
import pytest
from test_kernels import compile_with_nvrtc

import tracker_gpu as tg
from tracker_gpu import optim
from tracker_gpu.cuda import dispatch, generic_only, host, on_host, recording
from tracker_gpu.cuda.elementwise import UNARY
from tracker_gpu.cuda.launch import grid_for
from tracker_gpu.cuda.sources import HALF_C_TYPES, Family, families, family, header, kernels

pytestmark = pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")

HALVES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
HALF_FAMILIES = {"binary", "optim", "scatter", "softmax", "sumsq", "unary"}
EPS32 = float(np.finfo(np.float32).eps)
EPS = {name: float(ml_dtypes.finfo(d).eps) for name, d in HALVES.items()}
SUBNORMAL = {name: float(ml_dtypes.finfo(d).smallest_subnormal) for name, d in HALVES.items()}


# --- the software half types against NumPy and ml_dtypes, bit for bit
CONVERT = """
template <typename S>
__global__ void widen(const S* x, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        y[i] = (float)load(x[i]);
}

template <typename S>
__global__ void narrow(const float* x, S* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        y[i] = store<S>(x[i]);
}
"""


def conversions(half_header=None):
    return Family.from_text("convert", (half_header or header("half")) + CONVERT)


def convert(kernel, dtype, x, out_dtype, text=None):
    out = np.empty(x.shape, out_dtype)
    text = text or conversions()
    host.HostLibrary.get(text).launch(kernel, dtype, grid_for(x.size), 256, (x, out, x.size))
    return out


def every_value(dtype):
    return np.arange(1 << 16, dtype=np.uint16).view(HALVES[dtype])


def float_candidates(dtype):
    """float32 values that test a rounding to `dtype`: every finite value of it, the ties
    between neighbours (and past the largest), a float32 ulp either side of each, random bit
    patterns and float32's own extremes."""
    values = np.unique(every_value(dtype).astype(np.float64))
    finite = values[np.isfinite(values)]
    top = finite[-1] + (finite[-1] - finite[-2]) / 2  # the tie between the largest and inf
    exact = np.concatenate([finite, (finite[:-1] + finite[1:]) / 2, [top, -top]])
    exact = exact.astype(np.float32)
    assert np.all(exact.astype(np.float64)[: finite.size] == finite)  # exact in float32
    up, down = np.nextafter(exact, np.float32(np.inf)), np.nextafter(exact, np.float32(-np.inf))
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    info = np.finfo(np.float32)
    extremes = [0.0, -0.0, np.inf, -np.inf, np.nan, info.max, -info.max, info.smallest_subnormal]
    return np.concatenate([exact, up, down, random, np.array(extremes, np.float32)])


def assert_same_bits(actual, expected, what):
    """Bit for bit where `expected` is a number; nan, of the same sign, where it is nan."""
    width = np.uint16 if actual.itemsize == 2 else np.uint32
    nan = np.isnan(expected.astype(np.float32))
    assert np.array_equal(np.isnan(actual.astype(np.float32)), nan), what
    signs = [np.signbit(a.astype(np.float32)) for a in (actual, expected)]
    assert np.array_equal(*signs), what
    bad = np.flatnonzero((actual.view(width) != expected.view(width)) & ~nan)
    pairs = [(expected[i], actual[i]) for i in bad[:5]]
    assert not bad.size, f"{what}: {bad.size} values differ, e.g. (expected, got) {pairs}"


@pytest.mark.parametrize("dtype", HALVES)
def test_widening_every_half_value_is_exact(dtype):
    halves = every_value(dtype)
    assert_same_bits(convert("widen", dtype, halves, np.float32), halves.astype(np.float32),
                     f"{dtype} to float32")  # fmt: skip


@pytest.mark.parametrize("dtype", HALVES)
def test_rounding_to_half_is_to_nearest_even_everywhere(dtype):
    floats = float_candidates(dtype)
    with np.errstate(all="ignore"):
        expected = floats.astype(HALVES[dtype])
    assert_same_bits(convert("narrow", dtype, floats, HALVES[dtype]), expected,
                     f"float32 to {dtype}")  # fmt: skip


def test_a_conversion_that_truncates_fails_the_check():
    broken = header("half").replace("r + 0xfffu + (r >> 13 & 1u)", "r")
    assert broken != header("half")
    floats = float_candidates("float16")
    got = convert("narrow", "float16", floats, np.float16, text=conversions(broken))
    with pytest.raises(AssertionError):
        assert_same_bits(got, floats.astype(np.float16), "truncating")


# --- NVRTC compiles every half instance
def test_the_half_types_are_instantiated_where_the_kernels_take_them():
    halves = {name for name in families() if "float16" in family(name).dtypes}
    assert halves == HALF_FAMILIES  # layers.cu (normalise, LSTM) stays float32/float64
    for name in HALF_FAMILIES:
        expressions = family(name).name_expressions()
        for ctype in HALF_C_TYPES.values():
            assert {f"{k}<{ctype}>" for k in family(name).kernels} <= set(expressions)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(HALF_FAMILIES) + ["convert"])
def test_half_instances_compile_with_nvrtc(name, arch):
    text = conversions() if name == "convert" else family(name)
    assert any("tg_bfloat16" in e for e in text.name_expressions())
    compile_with_nvrtc(text, name, arch)


# --- the comparisons
def half_domain(shape, dtype, seed, special=0.3):
    """Values over the whole domain of a half type: special values (zeros of both signs, the
    smallest subnormal and normal, the largest finite, infinities, nan), random bit patterns
    (every binade, subnormals and nan included) and ordinary values of many magnitudes."""
    rng = np.random.default_rng(seed)
    info = ml_dtypes.finfo(HALVES[dtype])
    small = [float(info.smallest_subnormal), float(info.tiny), float(info.eps), float(info.max)]
    specials = [0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan] + small + [-v for v in small]
    bits = rng.integers(0, 1 << 16, shape).astype(np.uint16).view(HALVES[dtype])
    ordinary = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
    pick = rng.random(shape)
    values = np.where(pick < 0.6, bits.astype(np.float64), ordinary)
    values = np.where(pick < special, rng.choice(specials, shape), values)
    return values.astype(HALVES[dtype])


def few_specials(shape, dtype, seed, special=1e-5):
    """Values of a long sum that stays finite: standard normal, a few of them special."""
    rng = np.random.default_rng(seed)
    values = np.where(rng.random(shape) < special, np.nan, rng.standard_normal(shape))
    values = np.where(rng.random(shape) < special, np.inf, values)
    return values.astype(HALVES[dtype])


def wide(*arrays):
    return [np.asarray(a).astype(np.float32) for a in arrays]


def _pattern(v):
    v = np.asarray(v, np.float64)
    return np.where(np.isnan(v), 2, np.where(v == np.inf, 3, np.where(v == -np.inf, 4, 0)))


def assert_rounded_once(actual, exact, scale, ulps32, what):
    """`actual` (half) is the float32 value `exact`, give or take `ulps32` float32 ulps of
    `scale` (how far the kernel's float32 arithmetic may be from NumPy's), rounded once: nan
    where `exact` is nan, else between the roundings of the ends of that interval."""
    a, e = np.asarray(actual, np.float64), np.asarray(exact, np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    nan = np.isnan(e)
    bad = np.flatnonzero(np.isnan(a) != nan)
    assert not bad.size, f"{what}: nan pattern differs at {_pairs(a, e, bad)}"
    slack = ulps32 * EPS32 * np.abs(np.asarray(scale, np.float64)) + 1e-45 * ulps32
    slack = np.where(np.isfinite(slack), slack, 0.0)
    with np.errstate(all="ignore"):
        lo = np.nextafter((e - slack).astype(np.float32), np.float32(-np.inf))
        hi = np.nextafter((e + slack).astype(np.float32), np.float32(np.inf))
        lo = np.where(e == -np.inf, -np.inf, lo).astype(np.float32).astype(actual.dtype)
        hi = np.where(e == np.inf, np.inf, hi).astype(np.float32).astype(actual.dtype)
    inside = (lo.astype(np.float64) <= a) & (a <= hi.astype(np.float64))
    bad = np.flatnonzero(~nan & ~inside)
    assert not bad.size, f"{what}: not the float32 result rounded once at {_pairs(a, e, bad)}"


def assert_near_generic(actual, generic, exact, scale, ulps, what):
    """`actual` agrees with `generic`, the generic path on the half arrays: the same nan and
    infinity pattern and finite values within `ulps` of the half type's last place of `scale`,
    wherever the generic path's pattern is that of the float32 result `exact` rounded once (it
    did not overflow or underflow on the way). Returns the elements left out."""
    dtype = actual.dtype
    with np.errstate(all="ignore"):
        rounded = np.asarray(exact, np.float32).astype(dtype)
    kept = _pattern(generic) == _pattern(rounded)
    a, g = np.asarray(actual, np.float64)[kept], np.asarray(generic, np.float64)[kept]
    bad = np.flatnonzero(_pattern(a) != _pattern(g))
    assert not bad.size, f"{what}: nan/inf pattern differs at {_pairs(a, g, bad)}"
    info = ml_dtypes.finfo(dtype)
    finite = np.isfinite(a)
    s = np.broadcast_to(np.abs(np.asarray(scale, np.float64)), kept.shape)[kept]
    s = np.where(np.isfinite(s), s, 0.0)
    limit = ulps * float(info.eps) * np.maximum(np.maximum(np.abs(a), np.abs(g)), s)
    limit = limit + ulps * float(info.smallest_subnormal)
    with np.errstate(all="ignore"):
        far = finite & ~(np.abs(a - g) <= limit)
    bad = np.flatnonzero(far)
    assert not bad.size, f"{what}: values differ by more than {ulps} ulp at {_pairs(a, g, bad)}"
    return np.count_nonzero(~kept)


def _pairs(actual, expected, bad):
    first = ", ".join(f"[{i}] {actual.flat[i]!r} vs {expected.flat[i]!r}" for i in bad[:5])
    return f"{bad.size} of {actual.size} elements: {first}"


def check(actual, generic, exact, scale, what, ulps32=8, ulps=4, generic_scale=None):
    """Both references (module docstring); `generic_scale` for the second where the generic
    path's roundings on the way are amplified beyond `scale`."""
    assert actual.dtype == generic.dtype, f"{what}: dtype {actual.dtype} != {generic.dtype}"
    assert_rounded_once(actual, exact, scale, ulps32, what)
    generic_scale = scale if generic_scale is None else generic_scale
    assert_near_generic(actual, generic, exact, generic_scale, ulps, what)


def run(name, dtype, items, *args, block=64, text=None):
    """A launch through the host build on a grid that does not cover the items."""
    text = text or family(kernels()[name].family)
    grid = max(1, min(-(-items // block), 3))
    host.HostLibrary.get(text).launch(name, dtype, grid, block, args)


def generic(f, *arrays, dtype=None):
    with np.errstate(all="ignore"):
        out = np.asarray(f(*arrays))
    return out if dtype is None else out.astype(dtype)


# --- the kernels
UNARY_SCALE = {  # the magnitudes each contribution's formula multiplies together
    "tanh": lambda g, y, x: np.abs(g) * (1 + y * y),
    "sigmoid": lambda g, y, x: np.abs(g * y) * (1 + np.abs(y)),
    "relu": lambda g, y, x: np.abs(g),
    "exp": lambda g, y, x: np.abs(g * y),
    "log": lambda g, y, x: np.abs(g / x),
    "sqrt": lambda g, y, x: np.abs(g / y),
    "sin": lambda g, y, x: np.abs(g),
    "cos": lambda g, y, x: np.abs(g),
    "square": lambda g, y, x: np.abs(2 * g * x),
    "abs": lambda g, y, x: np.abs(g),
}


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("has_prev", [0, 1])
def test_unary_kernels(name, dtype, has_prev):
    n = 1000
    x, g, prev = (half_domain(n, dtype, seed=s) for s in (1, 2, 3))
    y = generic(getattr(tg, name), x, dtype=HALVES[dtype])
    rule = getattr(tg, name).vjps[0]
    add = (lambda p, c: p + c) if has_prev else (lambda p, c: c)
    expected = generic(lambda *a: add(a[3], rule(*a[:3])), g, y, x, prev, dtype=HALVES[dtype])
    exact = generic(lambda *a: add(a[3], rule(*a[:3])), *wide(g, y, x, prev))
    with np.errstate(all="ignore"):
        scale = UNARY_SCALE[name](*wide(g, y, x)).astype(np.float64)
        scale += has_prev * np.abs(prev.astype(np.float64))
    acc = prev.copy()
    run(f"{name}_bwd_acc", dtype, n, x, y, g, 1, acc, acc, n, has_prev)
    check(acc, expected, exact, scale, f"{name} pullback")


@pytest.mark.parametrize("dtype", HALVES)
def test_sum_of_squares_and_squared_error_kernels(dtype):
    from tracker_gpu.rules.losses import mse_primitive

    n = 1000
    x, y = half_domain(n, dtype, seed=4), half_domain(n, dtype, seed=5)
    for g in half_domain(6, dtype, seed=6, special=0.5):
        g = np.asarray(g, HALVES[dtype])
        acc = np.empty(n, HALVES[dtype])
        run("sumsq_bwd_acc", dtype, n, x, g, acc, acc, n, 0)
        rule = lambda g, x: tg.sumabs2.vjps[0](g, None, x)
        scale = np.abs(np.float64(g) * wide(x)[0])
        check(acc, generic(rule, g, x, dtype=HALVES[dtype]), generic(rule, *wide(g, x)), scale,
              f"sumsq, g={g}")  # fmt: skip
        for side in (0, 1):
            run("mse_bwd_acc", dtype, n, x, y, g, 2.0 / n, side, acc, acc, n, 0)
            rule = lambda g, a, b, side=side: mse_primitive.vjps[side](g, None, a, b, agg="mean")
            # g * (2 / n) rounds to the half type on the generic path, to zero where it is tiny
            factor = np.abs(np.float64(g)) * 2 / n + SUBNORMAL[dtype] / EPS[dtype]
            magnitude = (np.abs(wide(x)[0]) + np.abs(wide(y)[0])) * factor
            check(acc, generic(rule, g, x, y, dtype=HALVES[dtype]), generic(rule, *wide(g, x, y)),
                  magnitude, f"mse side {side}, g={g}")  # fmt: skip


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
@pytest.mark.parametrize("shape", [(3, 10), (37, 7), (2, 300)], ids=str)
def test_rowwise_kernels(name, dtype, shape):
    rows, cols = shape
    x = half_domain(shape, dtype, seed=rows)
    primitive = getattr(tg, name)
    with np.errstate(all="ignore"):
        shift = np.abs(x.astype(np.float64) - np.max(x.astype(np.float64), axis=-1, keepdims=True))
        scale = (shift + np.log(cols)) * (name == "logsoftmax") + (name == "softmax")
    y = np.empty_like(x)
    run(f"{name}_fwd", dtype, rows, x, y, rows, cols, block=32)
    forward = lambda x: primitive(x, axis=-1)
    check(y, generic(forward, x, dtype=x.dtype), generic(forward, *wide(x)), scale,
          f"{name} forward", ulps32=2 * cols, ulps=2 * cols)  # fmt: skip
    g, prev = half_domain(shape, dtype, seed=7), half_domain(shape, dtype, seed=8)
    acc = prev.copy()
    run(f"{name}_bwd_acc", dtype, rows, y, g, acc, acc, rows, cols, 1, block=32)
    rule = lambda y, g, prev: prev + primitive.vjps[0](g, y, None, axis=-1)
    with np.errstate(all="ignore"):
        y64, g64 = y.astype(np.float64), g.astype(np.float64)
        weight = np.exp(y64) if name == "logsoftmax" else np.abs(y64)
        scale = (
            np.abs(prev.astype(np.float64))
            + np.abs(g64) * (name == "logsoftmax")
            + ((np.abs(y64) + weight) * np.sum(np.abs(g64) * weight, axis=-1, keepdims=True))
        )
    check(acc, generic(rule, y, g, prev, dtype=x.dtype), generic(rule, *wide(y, g, prev)), scale,
          f"{name} pullback", ulps32=4 * cols, ulps=4 * cols)  # fmt: skip


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("soft", [False, True], ids=["onehot", "probabilities"])
def test_logitcrossentropy_kernels(dtype, soft):
    from tracker_gpu.rules.losses import _lce_vjp_logits, logitcrossentropy_primitive

    rows, cols = 37, 10
    rng = np.random.default_rng(2)
    x = half_domain((rows, cols), dtype, seed=9)
    onehot = np.eye(cols)[rng.integers(0, cols, rows)]
    targets = rng.uniform(0.0, 1.0, (rows, cols)) * 2.0 if soft else onehot
    targets = targets.astype(HALVES[dtype])
    x64, t64 = x.astype(np.float64), targets.astype(np.float64)
    with np.errstate(all="ignore"):
        lse = np.abs(x64 - np.max(x64, axis=-1, keepdims=True)) + np.log(cols)
        terms = np.sum(np.abs(t64) * np.where(t64 != 0, lse, 0), axis=1)
    with on_host(), recording() as log:
        loss = dispatch.FORWARDS["logitcrossentropy"](x, targets)
    assert ("launch", "logitcrossentropy_fwd") in log
    forward = lambda x, t: tg.data(logitcrossentropy_primitive(x, t))
    with generic_only():
        check(np.asarray(loss), generic(forward, x, targets, dtype=x.dtype),
              generic(forward, *wide(x, targets)), np.sum(terms) / rows, "loss",
              ulps32=4 * cols, ulps=4 * cols)  # fmt: skip
    g = np.asarray(0.7, HALVES[dtype])
    acc = np.empty_like(x)
    run("logitcrossentropy_bwd_acc", dtype, rows, x, targets, g, rows, int(not soft), acc, acc,
        rows, cols, 0, block=32)  # fmt: skip
    rule = lambda g, x, t: _lce_vjp_logits(g, None, x, t, axis=-1, agg="mean", normalized=not soft)
    scale = (1 + np.sum(t64, axis=1, keepdims=True)) * 0.7 / rows
    check(acc, generic(rule, g, x, targets, dtype=x.dtype), generic(rule, *wide(g, x, targets)),
          scale, "pullback", ulps32=4 * cols, ulps=4 * cols)  # fmt: skip


# --- broadcast arithmetic and tg.broadcast, through the fused path
BINARY_OPS = {"add": tg.add, "subtract": tg.subtract, "multiply": tg.multiply,
              "divide": tg.divide, "pow": tg.pow}  # fmt: skip
# the last two reduced in slices (two, and 32 for each of 64 outputs) added by reduce_finish
SHAPES = [((6, 5), (5,)), ((3, 1, 4), (1, 7, 1)), ((5000,), ()), ((2048, 64), (64,))]


def _reduce_to(full, shape):
    lead = full.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + a for a, n in enumerate(shape) if n == 1)
    return np.sum(full, axis=axes).reshape(shape)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_broadcast_arithmetic_pullbacks(op, dtype, shapes):
    f = BINARY_OPS[op]
    out_shape = np.broadcast_shapes(*shapes)
    values = half_domain if max(shapes[0][0], 1) < 1000 else few_specials  # sums stay finite
    x, y = (values(s, dtype, seed=10 + i) for i, s in enumerate(shapes))
    w = values(out_shape, dtype, seed=12, special=0.0)
    loss = lambda x, y: tg.sum(f(x, y) * w)
    with np.errstate(all="ignore"), tg.sync_checks(False):
        with generic_only():
            expected = tg.gradient(loss, x, y)
        with on_host(), recording() as log:
            fused = tg.gradient(loss, x, y)
        out = generic(f, x, y, dtype=x.dtype)  # the forward the pullbacks read (not fused)
        operands = [np.broadcast_to(a, out_shape).astype(np.float32) for a in (w, out, x, y)]
        partials = [np.asarray(f.vjps[side](*operands), np.float32) for side in (0, 1)]
    assert any(event[0] == "launch" and event[1].startswith(f"{_kernel(op)}_bwd") for event in log)
    for side, (a, b, arg) in enumerate(zip(fused, expected, (x, y))):
        full = np.broadcast_to(partials[side], out_shape).astype(np.float64)
        exact = _reduce_to(full, arg.shape)
        with np.errstate(all="ignore"):
            magnitude = _binary_scale(op, side, full, w, x, y, out_shape, dtype)
            scale, conditioned = (
                _reduce_to(np.abs(full), arg.shape),
                _reduce_to(magnitude, arg.shape),
            )
        terms = max(1, full.size // max(arg.size, 1))
        # float32 sums: a thread's strided share, a tree of 256 lanes, the slices; NumPy's pairwise
        ulps32 = 2 * (terms // 256 + 16 + terms.bit_length())
        check(np.asarray(a), np.asarray(b), exact, scale, f"{op} side {side}",
              ulps32=ulps32, ulps=4 + 2 * terms, generic_scale=conditioned)  # fmt: skip


def _binary_scale(op, side, full, w, x, y, shape, dtype):
    """The magnitudes the generic path's roundings on the way are measured against: the
    result's, and for division and pow what an intermediate's error (relative, or absolute
    where it is subnormal) is multiplied by: 1 / y after -g * out, and for pow's
    g * y * x ** (y - 1) the factors around x ** (y - 1), |log x| times |y| for y - 1 (and
    the whole value where that rounding changes the parity of an integer exponent)."""
    w, x, y = (np.broadcast_to(a, shape).astype(np.float64) for a in (w, x, y))
    tiny = SUBNORMAL[dtype] / EPS[dtype]  # an absolute error of a subnormal, in these units
    with np.errstate(all="ignore"):
        if op == "divide" and side:
            return np.abs(full) + tiny / np.abs(y)
        if op == "pow" and not side:
            power = np.abs(x) ** (y - 1)
            # where y - 1 rounds, a negative x's power may change sign: the whole value
            parity = (x < 0) & ((y - 1).astype(HALVES[dtype]).astype(np.float64) != y - 1)
            amplified = 1 + np.abs(np.log(np.abs(x))) * (np.abs(y) + 1) + parity / EPS[dtype]
            return np.abs(full) * amplified + tiny * (np.abs(w * y) + power)
    return np.abs(full)


def _kernel(op):
    from tracker_gpu.cuda.elementwise import BINARY

    return BINARY[op]


def softclip(x, y):
    return tg.tanh(x) * y + tg.exp(-tg.abs(y))


@pytest.mark.parametrize("dtype", HALVES)
def test_generated_broadcast_kernels(dtype):
    x, y = half_domain((40, 3), dtype, seed=13), half_domain((3,), dtype, seed=14)
    w = half_domain((40, 3), dtype, seed=15, special=0.0)
    loss = lambda x, y: tg.sum(tg.broadcast(softclip, x, y) * w)
    with np.errstate(all="ignore"), tg.sync_checks(False):
        plain = tg.data(tg.broadcast(softclip, x, y))
        exact = tg.data(tg.broadcast(softclip, *wide(x, y)))
        generic_grads = tg.gradient(loss, x, y)
        exact_grads = tg.gradient(loss, *wide(x, y, w)[:2])
        with on_host(), recording() as log:
            value = tg.data(tg.broadcast(softclip, x, y))
            grads = tg.gradient(loss, x, y)
    assert ("launch", "broadcast_fwd") in log and ("launch", "broadcast_bwd") in log
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(all="ignore"):
        scale = np.abs(np.tanh(x64) * y64) + np.exp(-np.abs(y64))
    check(value, plain, exact, scale, "value", ulps32=16)
    w64 = np.abs(w.astype(np.float64))
    with np.errstate(all="ignore"):
        scales = [w64 * np.abs(y64), np.sum(w64 * (np.abs(np.tanh(x64)) + 1), axis=0)]
    for i, (a, b, e) in enumerate(zip(grads, generic_grads, exact_grads)):
        check(a, b, e, scales[i], f"gradient {i}", ulps32=16 * 40, ulps=4 + 40)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name", ["maximum", "minimum", "sign"])
def test_a_generated_extremum_or_sign_follows_the_half_types_rules(dtype, name):
    """One operation of a generated kernel is the generic one bit for bit, each half type's own
    rules included: NumPy's float16 maximum and minimum keep the first operand on a tie of +0
    and -0 (its float32 the second), and ml_dtypes' bfloat16 sign keeps the sign of a zero."""
    values = np.array([-0.0, 0.0, np.nan, -np.inf, 1.0, -2.0], dtype=HALVES[dtype])
    x, y = (a.ravel() for a in np.meshgrid(values, values[::-1], indexing="ij"))
    f = getattr(tg, name)
    args = (x,) if name == "sign" else (x, y)
    with np.errstate(all="ignore"):
        with generic_only():
            expected = tg.data(tg.broadcast(f, *args))
        with on_host(), recording() as log:
            actual = tg.data(tg.broadcast(f, *args))
    assert ("launch", "broadcast_fwd") in log
    assert actual.dtype == expected.dtype
    assert np.array_equal(actual.view(np.uint16), expected.view(np.uint16))


# --- optimiser steps: float32 master weights take the float32 kernels; half state takes these
def optimiser_cases():
    return [optim.Descent(0.1), optim.Momentum(0.05, 0.9), optim.Nesterov(0.05, 0.8),
            optim.Adam(0.01), optim.AdamW(0.01, weight_decay=0.1)]  # fmt: skip


def _halved(state, dtype):
    if isinstance(state, tuple):
        return tuple(_halved(s, dtype) for s in state)
    return state.astype(dtype) if isinstance(state, np.ndarray) else state


def _flat(state):
    if state is None:
        return []
    if isinstance(state, tuple):
        return [a for s in state for a in _flat(s)]
    return [state] if isinstance(state, np.ndarray) else []


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("case", range(5))
def test_optimiser_kernels(case, dtype):
    rule = optimiser_cases()[case]
    x = half_domain(1000, dtype, seed=case)
    state = _halved(rule.init(x.astype(np.float32)), HALVES[dtype])
    fused_step = dispatch.STEPS[type(rule).__name__]
    for step in range(3):  # each step against the float32 step from the same half values
        dx = half_domain(1000, dtype, seed=20 + step)
        wide_state = _halved(state, np.float32)
        with np.errstate(all="ignore"), generic_only():
            exact_x, exact_state = optim.step(rule, x.astype(np.float32), dx.astype(np.float32),
                                              wide_state)  # fmt: skip
        with np.errstate(all="ignore"), on_host(), recording() as log:
            new_x, new_state = fused_step(rule, x, dx, state)
        assert log and log[-1][0] == "launch"
        magnitude = np.abs(x.astype(np.float64)) + np.abs(exact_x.astype(np.float64))
        assert_rounded_once(new_x, exact_x, magnitude, 8, f"{rule} parameter, step {step}")
        for a, e, before in zip(_flat(new_state), _flat(exact_state), _flat(wide_state)):
            scale = np.abs(e.astype(np.float64)) + np.abs(before.astype(np.float64))
            assert_rounded_once(a, e, scale, 8, f"{rule} state, step {step}")
        x, state = new_x, new_state


# --- through the API: half arrays take the kernels that take them, and only those
@pytest.mark.parametrize("dtype", HALVES)
def test_half_gradients_take_the_fused_path_and_agree(dtype):
    x = half_domain((8, 5), dtype, seed=30, special=0.0)
    b = half_domain((5,), dtype, seed=31, special=0.0)
    loss = lambda x, b: tg.sum(tg.logsoftmax(tg.tanh(x * b + b), axis=-1) ** 2)
    with np.errstate(all="ignore"):
        expected = tg.gradient(loss, x, b)
        with on_host(), recording() as log:
            got = tg.gradient(loss, x, b)
    launched = {event[1] for event in log if event[0] == "launch"}
    assert {"tanh_bwd_acc", "logsoftmax_fwd", "logsoftmax_bwd_acc", "mul_bwd_reduce"} <= launched
    for a, e in zip(got, expected):
        assert a.dtype == e.dtype == HALVES[dtype]
        scale = np.max(np.abs(e.astype(np.float64)))
        assert_near_generic(a, e, e.astype(np.float32), scale, 32, "gradient")


@pytest.mark.parametrize("dtype", HALVES)
def test_kernels_without_half_instances_leave_half_arrays_to_the_generic_path(dtype):
    from tracker_gpu.rules.nn import normalise

    x = half_domain((4, 6), dtype, seed=32, special=0.0)
    with np.errstate(all="ignore"):
        expected = tg.gradient(lambda x: tg.sum(normalise(x, axes=(1,)) * x), x)[0]
        with on_host(), recording() as log:
            got = tg.gradient(lambda x: tg.sum(normalise(x, axes=(1,)) * x), x)[0]
    assert not any(event[1].startswith("normalise") for event in log if event[0] == "launch")
    assert got.dtype == expected.dtype
    scale = np.max(np.abs(expected.astype(np.float64)))
    assert_near_generic(got, expected, expected.astype(np.float32), scale, 16, "normalise")


def test_a_kernel_that_rounds_twice_fails_the_check(monkeypatch):
    """The contract is seen: round the contribution to the half type before adding it to the
    gradient already there (the generic path's order of roundings) and the check fails."""
    text = family("unary").text.replace("const T c = (contribution);",
                                        "const T c = load(store<S>(contribution));")  # fmt: skip
    assert text != family("unary").text
    broken = Family.from_text("unary", text)
    monkeypatch.setitem(globals(), "family", lambda name: broken)
    with pytest.raises(AssertionError, match="rounded once"):
        test_unary_kernels("tanh", "float16", 1)
