"""`tg.compile` fusion: each elementwise region of a recorded host program, and each chain of
elementwise pullbacks of its backward passes, replayed as one generated C++ loop
(`compiler/fusion.py`, `compiler/backward.py`, `compiler/loops.py`), against eager.

A differential fuzzer runs seeded random elementwise programs (arithmetic with broadcasting and
Python numbers, comparisons, `where`, `clip`, casts, `relu`, `sigmoid`, the standard's unary
functions) on values over the whole domain (zeros of both signs, subnormals, huge values,
infinities, nan), in float32, float64 and both mixed, compiled with fusion and eagerly:
programs of correctly rounded operations agree bit for bit (values and gradients, signs of
zero included); with the C library's transcendental functions, within a few units in the last
place with the same nan and infinity pattern. Then: regions are found and end where a value is
read elsewhere, fusion is exact by default, the loops built for the machine's vector
instructions give the bits of loops built without vectorisation, threads do not change a bit,
chains of pullbacks give eager's gradients, no compiler means an unfused replay with one
warning, and the on-disk cache is reused by a second process and rebuilt where corrupted.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from domain import assert_agree, domain

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.compiler import backward, fusion, loops, numpy_loops, opened
from tracker_gpu.cuda import host

BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)

pytestmark = pytest.mark.skipif(loops.compiler() is None, reason="no C++ compiler")


@pytest.fixture(autouse=True, scope="module")
def cache(tmp_path_factory):
    """A cache directory of this module's own."""
    folder = tmp_path_factory.mktemp("cache")
    before = os.environ.get("TRACKER_GPU_CACHE")
    os.environ["TRACKER_GPU_CACHE"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("TRACKER_GPU_CACHE", None)
    else:
        os.environ["TRACKER_GPU_CACHE"] = before


@pytest.fixture(autouse=True)
def every_region(monkeypatch):
    """Every region of two operations or more is fused, however small its arrays."""
    monkeypatch.setattr(fusion, "SMALL_OPS", 2)


# --- random programs
NUMBERS = [2.0, -0.5, 0.0, -0.0, 3, 1e-3, 1e300, np.inf, -np.inf, np.nan, 0.1, 1e-40]
EXACT_UNARY = {
    "negative": tg.negative, "abs": tg.abs, "square": tg.square, "sqrt": tg.sqrt,
    "relu": nn.relu, "reciprocal": tg.reciprocal,
}  # fmt: skip
LIBM_UNARY = {
    "exp": tg.exp, "log": tg.log, "sin": tg.sin, "cos": tg.cos, "tanh": tg.tanh,
    "expm1": tg.expm1, "log1p": tg.log1p, "sigmoid": nn.sigmoid, "sinh": tg.sinh,
    "cosh": tg.cosh, "tan": tg.tan,
}  # fmt: skip
BINARY = {"add": tg.add, "subtract": tg.subtract, "multiply": tg.multiply,
          "divide": tg.divide, "maximum": tg.maximum, "minimum": tg.minimum}  # fmt: skip
SHAPES = [(4, 5), (5,), (4, 1), (), (1, 5)]


def random_program(rng, n_inputs, steps, libm):
    """`(f, description)`: `f(*inputs)` applies `steps` random elementwise operations, each to
    the last value and a second operand (an input, an earlier value or a Python number); with
    `libm`, one operation of the C library's (exp, sin, ...) at a random place."""
    plan, libm_at = [], rng.integers(steps) if libm else -1
    for k in range(steps):
        kind = (
            "libm"
            if k == libm_at
            else rng.choice(
                ["unary", "binary", "binary", "number", "where", "clip", "astype", "compare_mul"]
            )
        )
        operand = int(rng.integers(-n_inputs, k + 1))  # < 0: input, else value k (k: latest)
        if kind == "libm":
            plan.append(("unary", str(rng.choice(list(LIBM_UNARY)))))
        elif kind == "unary":
            plan.append(("unary", str(rng.choice(list(EXACT_UNARY)))))
        elif kind == "binary":
            plan.append(
                ("binary", str(rng.choice(list(BINARY))), operand, bool(rng.random() < 0.5))
            )
        elif kind == "number":
            number = NUMBERS[rng.integers(len(NUMBERS))]
            plan.append(("number", str(rng.choice(list(BINARY))), number, bool(rng.random() < 0.5)))
        elif kind == "where":
            plan.append(("where", operand, NUMBERS[rng.integers(len(NUMBERS))]))
        elif kind == "clip":
            lo, hi = sorted(float(v) for v in rng.choice([-1.0, 0.0, -0.0, 0.5, 2.0], 2))
            plan.append(("clip", [lo, None][rng.integers(2)] if rng.random() < 0.4 else lo, hi))
        elif kind == "astype":
            plan.append(("astype", str(rng.choice(["float32", "float64"]))))
        else:
            plan.append(("compare_mul", operand, float(rng.choice([0.0, 0.5, -1.0]))))

    def f(*inputs):
        values = [inputs[0]]
        for step in plan:
            values.append(_apply(step, values, inputs))
        return values[-1]

    return f, plan


def _apply(step, values, inputs):
    y = values[-1]
    pick = lambda k: inputs[k] if k < 0 else values[k]
    kind = step[0]
    if kind == "unary":
        return {**EXACT_UNARY, **LIBM_UNARY}[step[1]](y)
    if kind == "binary":
        other = pick(step[2])
        return BINARY[step[1]](*((y, other) if step[3] else (other, y)))
    if kind == "number":
        function, number = BINARY[step[1]], step[2]
        if step[1] in ("maximum", "minimum") or step[3]:
            return function(y, number)
        return {
            "add": lambda: number + y,
            "subtract": lambda: number - y,
            "multiply": lambda: number * y,
            "divide": lambda: number / y,
        }[step[1]]()
    if kind == "where":
        return tg.where(y > pick(step[1]), y, step[2])
    if kind == "clip":
        return tg.clip(y, min=step[1], max=step[2])
    if kind == "astype":
        return tg.astype(y, getattr(np, step[1]))
    return y * (pick(step[1]) > step[2])  # a comparison's mask, multiplied in


def _finite(y):
    """`y` where it is finite and not huge, else 0: a sum that `back` takes (a finite loss); a
    half type's made float32 first (its sum would overflow)."""
    y = tg.where(tg.abs(y) < 1e30, y, 0.0)
    return tg.astype(y, np.float32) if np.dtype(y.dtype) in fusion.HALVES else y


def _inputs(rng, n, dtypes, seed):
    shapes = [SHAPES[0]] + [SHAPES[rng.integers(len(SHAPES))] for _ in range(n - 1)]
    return [domain(s, dtypes[rng.integers(len(dtypes))], seed=seed + k)
            for k, s in enumerate(shapes)]  # fmt: skip


def _same_bits(a, b, what):
    if a is None or b is None:
        assert a is None and b is None, what
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    same &= (np.signbit(a) == np.signbit(b)) | np.isnan(a)
    assert same.all(), f"{what}: {a[~same][:4]} vs {b[~same][:4]}"


def _quiet(function, *args):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return function(*args)


DTYPES = {"float32": [np.float32], "float64": [np.float64], "mixed": [np.float32, np.float64],
          "float16": [np.float16], "bfloat16": [BF16],
          "halves": [np.float16, np.float32, BF16]}  # fmt: skip
STATS = {"programs": 0, "fused": 0, "regions": 0, "chains": 0, "outputs": 0, "several": 0}


FLOAT_DTYPES = ("float32", "float64", "mixed")


def _seeds(floats, halves):
    """`(seed, dtypes)` pairs: `floats` seeds of float32, float64 and mixed, `halves` of the
    half types' (whose programs take longer to build)."""
    counts = {name: floats if name in FLOAT_DTYPES else halves for name in DTYPES}
    return [(seed, name) for name, count in counts.items() for seed in range(count)]


@pytest.fixture
def fallbacks(monkeypatch):
    """The replays' fallbacks, as they happen: a region, a chain of pullbacks or an opened rule
    whose guard refused the arrays it was given and ran NumPy's operations (the rule's own
    code) instead of its kernels."""
    seen = []
    for module, name in ((fusion, "_stepwise"), (backward, "evaluate"), (opened, "own_code")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, f=original, n=name: seen.append(n) or f(*a))
    return seen


@pytest.mark.parametrize(("seed", "dtypes"), _seeds(12, 4))
def test_arithmetic_programs_bit_for_bit(seed, dtypes, fallbacks):
    """Correctly rounded operations only: the fused replay is the eager run bit for bit, its
    values (returned as they are) and its gradients (of their sum), and a replay on the
    recording's own kinds of arrays runs every kernel (no guard falls back to NumPy's
    operations)."""
    rng = np.random.default_rng([seed, len(dtypes[0])])
    for trial in range(3):
        n = int(rng.integers(1, 4))
        f, plan = random_program(rng, n, int(rng.integers(2, 9)), libm=False)
        inputs = _inputs(rng, n, DTYPES[dtypes], seed * 10 + trial)
        forward = tg.compile(f, gradient=False, fuse=True)
        _quiet(forward, *inputs)
        expected = _quiet(lambda *a, f=f: tg.data(f(*a)), *inputs)
        _same_bits(_quiet(forward, *inputs), expected, f"values of {plan}")
        loss = lambda *a, f=f: tg.sum(_finite(f(*a)))  # noqa: E731
        both = tg.compile(loss, fuse=True)
        _quiet(both, *inputs)
        got, eager = _quiet(both, *inputs), _quiet(tg.withgradient, loss, *inputs)
        _same_bits(got.val, eager.val, f"loss of {plan}")
        for g, e in zip(got.grad, eager.grad):
            _same_bits(g, e, f"gradient of {plan}")
        assert not fallbacks, f"{fallbacks} in a replay of {plan}"
        STATS["programs"] += 2
        STATS["fused"] += bool(forward.programs()[0].fused) + bool(both.programs()[0].fused)
        STATS["regions"] += forward.programs()[0].fused + both.programs()[0].fused
        STATS["chains"] += len(both.programs()[0].chains)  # of the backward pass
        written = _written(forward.programs()[0]) + _written(both.programs()[0])
        assert _read_outside(forward.programs()[0]) and _read_outside(both.programs()[0]), plan
        STATS["outputs"] += sum(written)  # a region's extra outputs: values read outside it
        STATS["several"] += sum(count > 1 for count in written)


@pytest.mark.parametrize(("seed", "dtypes"), _seeds(8, 3))
def test_transcendental_programs_within_ulps(seed, dtypes, fallbacks):
    """With one function (exp, log, sin, tanh, sigmoid, ...) after exact arithmetic: the fused
    values are NumPy's bit for bit where the loop calls NumPy's own function (float32 and
    float64), else (the C library's) within 4 units in the last place of NumPy's, with the
    same nan and infinity pattern; computed by the kernels (no fallback)."""
    rng = np.random.default_rng([seed, 7, len(dtypes)])
    for trial in range(3):
        n = int(rng.integers(1, 4))
        f, plan = random_program(rng, n, int(rng.integers(1, 5)), libm=False)
        name = str(rng.choice(list(LIBM_UNARY)))
        g = lambda *a, f=f, name=name: LIBM_UNARY[name](f(*a) * 1.0)  # noqa: E731
        inputs = _inputs(rng, n, DTYPES[dtypes], seed * 10 + trial)
        forward = tg.compile(g, gradient=False, fuse=True)
        _quiet(forward, *inputs)
        expected = _quiet(lambda *a, g=g: tg.data(g(*a)), *inputs)
        got = _quiet(forward, *inputs)
        assert got.dtype == expected.dtype
        if numpy_loops.available("exp" if name == "sigmoid" else name, got.dtype):
            _same_bits(got, expected, f"{name} after {plan}")  # sigmoid: its rule's operations
        assert_agree(got, expected, ulps=4, signed_zeros=True, what=f"{name} after {plan}")
        assert not fallbacks, f"{fallbacks} in a replay of {name} after {plan}"
        if dtypes in FLOAT_DTYPES:  # the half types' may be cut or left
            assert forward.programs()[0].fused == 1


def test_the_fuzzer_fused():
    """The arithmetic programs above fused something in most cases (run after them)."""
    if STATS["programs"] < 50:
        pytest.skip("run with the fuzzer")
    print(STATS)
    assert STATS["fused"] >= STATS["programs"] // 2, STATS
    assert STATS["chains"] >= STATS["programs"] // 8, STATS
    assert STATS["several"] >= STATS["programs"] // 8, STATS  # regions of several outputs
    assert STATS["outputs"] > STATS["regions"], STATS


# --- regions
def chain10(x):
    y = x
    for k in range(10):
        y = [lambda y: y * 1.5, tg.tanh, lambda y: y + 0.25, tg.abs, tg.negative][k % 5](y)
    return y


def test_a_chain_of_ten_operations_is_one_kernel():
    x = domain((3, 4), np.float64, seed=1)
    step = tg.compile(chain10, gradient=False, fuse=True)
    step(x)
    program = step.programs()[0]
    assert program.fused == 1 and program.source.count("FK") == 1, program.source
    np.testing.assert_allclose(step(x), tg.data(chain10(x)), rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_a_half_chain_is_one_kernel_rounding_each_operation(dtype):
    """float16 and bfloat16 load and store the half type and compute each operation in float32,
    rounded to the half type after each, as NumPy and ml_dtypes do: bit for bit over the whole
    domain (subnormals, overflow to infinity, nan), where rounding once at the end would not."""

    def chain(x, w):
        y = tg.maximum(x * w + w, w - x) / (w * w + x)
        return tg.minimum(tg.sqrt(tg.abs(y)) - y * y, x + 2)

    x, w = domain((40, 30), dtype, seed=11), domain((30,), dtype, seed=12)
    step = tg.compile(chain, gradient=False, fuse=True)
    _quiet(step, x, w)
    got, expected = _quiet(step, x, w), _quiet(lambda: tg.data(chain(x, w)))
    assert step.programs()[0].fused == 1 and got.dtype == dtype
    _same_bits(got.astype(np.float32), expected.astype(np.float32), "the chain")
    with np.errstate(all="ignore"):  # the same in float32 rounded once: not the same
        once = tg.data(chain(x.astype(np.float32), w.astype(np.float32))).astype(dtype)
    assert not np.array_equal(once.astype(np.float32), expected.astype(np.float32), equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_the_loops_half_conversions_are_numpys_for_every_value(dtype):
    """Every value of the half type through a region that widens it, computes in float32 and
    rounds back (F16C's instructions where the loops are built for a CPU that has them, the
    integer conversions elsewhere): NumPy's and ml_dtypes' answers bit for bit."""
    x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    factors = np.asarray([1.0, 1.0009765625, 0.7, 3.0, 1e-3], np.float32)

    def round_trips(x):
        wide = tg.astype(x, np.float32)
        return tg.astype(tg.astype(wide * factors[:, None] + wide * 0.0, np.float32), dtype)

    step = tg.compile(round_trips, gradient=False, fuse=True)
    _quiet(step, x)
    got, expected = _quiet(step, x), _quiet(lambda: tg.data(round_trips(x)))
    assert step.programs()[0].fused == 1
    _same_bits(got.astype(np.float32), expected.astype(np.float32), "round trips")


def test_multiplications_by_numbers_fuse_with_their_gradient():
    """`y * c` saves nothing of y: the forward chain is one kernel, the gradient eager's."""

    def f(x):
        y = x
        for _ in range(10):
            y = y * 1.0001
        return tg.sum(y)

    x = domain((8,), np.float32, seed=2)
    step = tg.compile(f, fuse=True)
    _quiet(step, x)
    got, eager = _quiet(step, x), _quiet(tg.withgradient, f, x)
    assert step.programs()[0].fused == 1
    _same_bits(got.val, eager.val, "loss")
    _same_bits(got.grad[0], eager.grad[0], "gradient")


def _written(program):
    """The number of outputs of each fused step of `program`, in order."""
    return [len(s.outs) for s in program.steps if type(s).__name__ == "Fused"]


def _read_outside(program):
    """Whether every value a fused step writes besides its last is read outside its region:
    by another step, as a result, or saved by a pullback."""
    steps, reads = program.steps, set(program.outputs)
    for step in steps:
        calls = step.calls if type(step).__name__ == "Fused" else [step]
        for call in calls:
            reads.update(slot for p, slot in getattr(call, "saves", ()) if p)
            reads.update(call.out for p, _ in getattr(call, "saves", ()) if not p)
        if type(step).__name__ == "Fused" or hasattr(step, "inputs"):
            reads.update(getattr(step, "inputs", ()))
    fused = [s for s in steps if type(s).__name__ == "Fused"]
    return all(slot in reads for s in fused for slot in s.outs[:-1])


def test_a_value_read_elsewhere_is_one_more_output_of_its_region():
    def returned(x):  # y is returned as well: written out by the region that goes on
        y = x * 2.0 + 1.0
        return y, tg.tanh(y - 3.0) * 0.5

    x = domain((6, 5), np.float64, seed=5)
    step = tg.compile(returned, gradient=False, fuse=True)
    step(x)
    y, z = step(x)
    program = step.programs()[0]
    assert program.fused == 1 and _written(program) == [2], program.source
    _same_bits(y, tg.data(returned(x)[0]), "the extra output, the result")
    assert_agree(z, tg.data(returned(x)[1]), ulps=4)  # tanh: the C library's

    def saved(x):  # sin saves its input for its pullback: written out, the region goes on
        return tg.sum(_finite(tg.sin(x * 2.0 + 1.0) * 3.0 - 1.0))

    step = tg.compile(saved, fuse=True)
    _quiet(step, x)
    got, eager = _quiet(step, x), _quiet(tg.withgradient, saved, x)
    # written: x*2+1 (saved by sin's pullback), the mask (saved by where's), the last value
    assert step.programs()[0].fused == 1 and _written(step.programs()[0]) == [3]
    assert_agree(got.val, eager.val, ulps=64)  # a sum of sines, each within 4 ulps
    np.testing.assert_array_equal(got.grad[0], eager.grad[0])  # cos(x*2+1)*3*2: eager's


def test_a_value_read_by_a_pullback_and_a_later_step_exact():
    """`x * w + 1` is saved by `relu`'s pullback... and read by a matrix product after the
    region: written out by it, bit for bit, values and gradients."""

    def f(x, w):
        h = x * w + 1.0
        r = tg.relu(h) * 0.5 - h
        return tg.sum(_finite(r * r)) + tg.sum(_finite(h @ h.T))

    x, w = domain((7, 9), np.float64, seed=6), domain((9,), np.float64, seed=7)
    step = tg.compile(f, fuse="exact")
    _quiet(step, x, w)
    got, eager = _quiet(step, x, w), _quiet(tg.withgradient, f, x, w)
    program = step.programs()[0]
    assert program.fused >= 1 and max(_written(program)) >= 2, program.source
    _same_bits(got.val, eager.val, "value")
    for mine, theirs in zip(got.grad, eager.grad):
        _same_bits(mine, theirs, "gradient")


def test_a_value_read_before_the_region_ends_ends_it():
    """A reader of `y` that comes before the region's last step (a matrix product feeding the
    region) cannot wait for it: `y` ends its region."""

    def f(x):
        y = x * 2.0 + 1.0
        return (y @ y) * 3.0 + y

    x = domain((8, 8), np.float64, seed=8)
    step = tg.compile(f, gradient=False, fuse="exact")
    _quiet(step, x)
    program = step.programs()[0]
    assert _written(program) == [1, 1], program.source
    _same_bits(_quiet(step, x), tg.data(_quiet(f, x)), "value")


def test_a_reader_in_a_region_that_does_not_pay_reads_in_its_own_place(monkeypatch):
    """`a` is read by the region of `a * 3 ...` (eight operations: it pays) and by `a + 1`,
    whose region (`q`, then `q * 5` after the first region's end: two operations on ten
    elements) does not pay: `a + 1` runs in its own place, before the first region's end, so
    `a` cannot be an output of that region."""

    def f(x):
        a = x * 2.0
        q = a + 1.0
        t = a
        for k in range(8):
            t = t * 3.0 - k
        return t, q * 5.0

    monkeypatch.setattr(fusion, "SMALL_OPS", 8)  # as by default
    x = domain((10,), np.float64, seed=9)
    step = tg.compile(f, gradient=False, fuse="exact")
    _quiet(step, x)
    got = _quiet(step, x)
    program = step.programs()[0]
    assert program.fused == 1 and _written(program) == [1], program.source
    for mine, theirs in zip(got, _quiet(lambda: [tg.data(v) for v in f(x)])):
        _same_bits(mine, theirs, "values")


@pytest.mark.parametrize("shape", [(), (3,), (5000,)])
def test_several_outputs_of_every_size(shape):
    """0-d outputs (new arrays each, never a block's rows: those would be scalars), small ones
    (rows of one array) and large ones (arrays of their own): eager's bits, each output its
    own memory."""

    def f(t, u):
        a = t * 2.0 + u
        b = a * a - 1.0
        return a, b * 3.0, a > b

    t, u = domain(shape, np.float64, seed=10), domain(shape, np.float64, seed=11)
    step = tg.compile(f, gradient=False, fuse="exact")
    _quiet(step, t, u)
    got = _quiet(step, t, u)
    assert _written(step.programs()[0]) == [3], step.programs()[0].source
    for mine, theirs in zip(got, _quiet(lambda: [tg.data(v) for v in f(t, u)])):
        _same_bits(mine, theirs, f"outputs of shape {shape}")
    again = _quiet(step, t + 1.0, u)
    assert not np.shares_memory(again[0], got[0]) and not np.shares_memory(again[1], got[1])


def test_a_mask_and_where_fuse():
    def f(x, w):
        return tg.where(x > 0.5, x * w, -x) + tg.clip(x, min=-1.0, max=1.0)

    x, w = domain((5, 3), np.float32, seed=3), domain((3,), np.float32, seed=4)
    step = tg.compile(f, gradient=False, fuse=True)
    _quiet(step, x, w)
    assert step.programs()[0].fused == 1
    _same_bits(_quiet(step, x, w), _quiet(lambda: tg.data(f(x, w))), "where and clip")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, BF16], ids=lambda d: np.dtype(d).name)
def test_a_clip_by_one_bound_is_the_dtypes_maximum(dtype):
    """A clip by one bound is NumPy's maximum (minimum) of the dtype: on a tie of +0 and -0,
    float16's keeps x, float32's and bfloat16's the bound (float16's region once took the
    float32 rule)."""
    x = np.array([-0.0, 0.0, 1.0, -1.0, np.nan], dtype)
    for lo, hi in ((0.0, None), (-0.0, None), (None, 0.0), (None, -0.0)):
        f = lambda x, lo=lo, hi=hi: tg.clip(x * 1.0, min=lo, max=hi) * 1.0  # noqa: E731
        step = tg.compile(f, gradient=False, fuse=True)
        _quiet(step, x)
        assert step.programs()[0].fused == 1
        _same_bits(_quiet(step, x), _quiet(lambda f=f: tg.data(f(x))), f"clip({lo}, {hi})")


@pytest.mark.parametrize("own", [True, False])
def test_exact_fusion_takes_numpy_loops_or_leaves_the_function_out(own, monkeypatch):
    """`fuse="exact"`: tanh is NumPy's own loop called inside the region (one region), or,
    where that loop cannot be had, NumPy's call between two regions; bit for bit both ways."""
    if not own:
        monkeypatch.setattr(numpy_loops, "available", lambda op, dtype: False)

    def f(x):
        return tg.tanh(x * 2.0 + 1.0) * 3.0 - 0.5

    for dtype in (np.float32, np.float64):
        x = domain((4, 3), dtype, seed=5)
        step = tg.compile(f, gradient=False, fuse="exact")
        _quiet(step, x)
        assert step.programs()[0].fused == (1 if own else 2)
        _same_bits(_quiet(step, x), _quiet(lambda x=x: tg.data(f(x))), "exact fusion")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16])
def test_exact_fusion_takes_numpys_fast_powers(dtype):
    """`x ** 2`, `** 0.5`, `** -1` (NumPy's square, square root, reciprocal: correctly rounded)
    join a region with `fuse="exact"`, bit for bit over the whole domain; `x ** 3` (`pow`) and
    `2 ** x` stay NumPy's."""
    x = domain((1500,), dtype, seed=9)
    for exponent in (2, 2.0, 0.5, -1, -1.0):
        f = lambda x, e=exponent: (x * 1.0 + 0.0) ** e * 3.0 - 0.5  # noqa: E731
        step = tg.compile(f, gradient=False, fuse="exact")
        _quiet(step, x)
        assert step.programs()[0].fused == 1 and not _powers(step), exponent
        _same_bits(_quiet(step, x), _quiet(lambda f=f: tg.data(f(x))), f"x ** {exponent}")
    for f in (lambda x: (x * 1.0) ** 3 * 3.0, lambda x: 2.0 ** (x * 1.0) * 3.0):
        step = tg.compile(f, gradient=False, fuse="exact")
        _quiet(step, x)
        assert _powers(step) == 1  # the power is a step of its own
        _same_bits(_quiet(step, x), _quiet(lambda f=f: tg.data(f(x))), "pow")


def _powers(step):
    """The powers a compiled step's program runs as steps of their own (not in a region)."""
    pow_forward = next(f for f, known in fusion.OPS.items() if known == ("binary", "pow"))
    return sum(getattr(s, "function", None) is pow_forward for s in step.programs()[0].steps)


def test_small_regions_are_left_to_numpy(monkeypatch):
    """A region of few operations on a small array would cost more as a kernel call."""
    monkeypatch.setattr(fusion, "SMALL_OPS", 8)
    f = lambda x: tg.abs(x * 2.0 + 1.0)  # noqa: E731
    step = tg.compile(f, gradient=False, fuse=True)
    step(np.ones(10))
    assert step.programs()[0].fused == 0
    step(np.ones(fusion.SMALL_SIZE))
    assert step.programs()[-1].fused == 1


def test_fusion_is_exact_by_default_and_checked(monkeypatch):
    """By default (`fuse=None`) the correctly rounded operations are fused where vector
    instructions are IEEE arithmetic (x86-64, AArch64), and nothing elsewhere."""
    step = tg.compile(chain10, gradient=False)
    x = domain((3, 4), np.float64, seed=6)
    _quiet(step, x)
    expected = "exact" if loops.default_fuse() == "exact" else False
    exact = tg.compile(chain10, gradient=False, fuse=expected)
    _quiet(exact, x)
    assert step.programs()[0].fused == exact.programs()[0].fused
    if expected:  # tanh (twice) NumPy's own loop inside the region, else left to NumPy
        assert step.programs()[0].fused == (1 if numpy_loops.available("tanh", x.dtype) else 2)
    _same_bits(_quiet(step, x), _quiet(lambda: tg.data(chain10(x))), "by default")
    monkeypatch.setattr(loops.platform, "machine", lambda: "sparc64")
    assert loops.default_fuse() is False
    unfused = tg.compile(chain10, gradient=False)
    _quiet(unfused, x)
    assert unfused.programs()[0].fused == 0
    with pytest.raises(TypeError, match="fuse"):
        tg.compile(chain10, fuse="yes")


def test_a_gradient_that_is_none_takes_the_steps_one_by_one():
    """A region reading what the recording saw as an array, given something else at a replay,
    runs its steps as the unfused replay does."""

    def exact(x):
        return tg.abs(x * 1.5 + 0.25) / 3.0 - x

    x = np.linspace(-1, 1, 4)
    step = tg.compile(exact, gradient=False, fuse=True)
    step(x)
    (fused,) = [s for s in step.programs()[0].steps if type(s).__name__ == "Fused"]
    strided = np.linspace(-1, 1, 8)[::2]  # not contiguous: copied first
    np.testing.assert_array_equal(fused.run(strided), tg.data(exact(strided)))
    single = x.astype(np.float32)  # not the recorded dtype: step by step
    np.testing.assert_array_equal(fused.run(single), tg.data(exact(single)))
    assert fused.run(single).dtype == np.float32


def test_a_reductions_numpy_scalar_runs_the_kernel(monkeypatch):
    """A region reading a 0-d value that NumPy's reduction gives as a scalar (a clipping
    factor, say) runs its kernel on it at every replay, not the steps one by one."""

    def scaled(x, y):
        factor = 1.0 / (tg.sqrt(tg.sum(x * x)) + 1e-6)
        return tg.abs(y * factor + 0.25) * 1.5 - y

    x, y = domain((5,), np.float64, seed=8, special=0.0), domain((3, 4), np.float64, seed=9)
    step = tg.compile(scaled, gradient=False, fuse=True)
    step(x, y)
    stepwise = []
    original = fusion._stepwise
    monkeypatch.setattr(fusion, "_stepwise", lambda *a: stepwise.append(1) or original(*a))
    for _ in range(3):
        _same_bits(_quiet(step, x, y), _quiet(lambda: tg.data(scaled(x, y))), "a scalar in")
    assert step.programs()[0].fused >= 1 and not stepwise


# --- the compiler and the cache
def test_no_compiler_replays_unfused_with_one_warning(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-for-tracker-gpu")
    monkeypatch.setattr(loops, "_warned", set())
    x = np.linspace(-1, 1, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for shift, fuse in ((0.5, True), (1.5, None)):  # None: the default
            step = tg.compile(lambda x, s=shift: tg.tanh(x * 2.0 + s) * 3.0, gradient=False,
                              fuse=fuse)  # fmt: skip
            step(x)
            np.testing.assert_array_equal(step(x), np.tanh(x * 2.0 + shift) * 3.0)  # NumPy's
            assert step.programs()[0].fused == 0
    messages = [str(w.message) for w in caught if "compiler" in str(w.message)]
    assert len(messages) == 1, messages


SCRIPT = textwrap.dedent("""
    import numpy as np, tracker_gpu as tg
    from tracker_gpu.compiler import fusion, loops
    fusion.SMALL_OPS = 2
    step = tg.compile(lambda x: tg.abs(x * 0.5 + 0.125) * 3.0, gradient=False, fuse=True)
    x = np.linspace(-1, 1, 5)
    step(x)
    assert step.programs()[0].fused == 1
    assert np.array_equal(step(x), np.abs(x * 0.5 + 0.125) * 3.0)
    print(loops.STATS["built"], loops.STATS["loaded"])
""")


def _run_script(cache):
    env = dict(os.environ, TRACKER_GPU_CACHE=str(cache))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return tuple(int(n) for n in done.stdout.split())


def test_the_cache_is_reused_by_a_second_process_and_a_corrupted_entry_rebuilt(tmp_path):
    assert _run_script(tmp_path) == (1, 0)  # built
    assert _run_script(tmp_path) == (0, 1)  # loaded from the cache
    (entry,) = (tmp_path / "fused").glob("fused-*.so")
    entry.write_bytes(b"not a shared library" * 10)
    assert _run_script(tmp_path) == (1, 0)  # rebuilt
    assert _run_script(tmp_path) == (0, 1)
    assert [p.name for p in (tmp_path / "fused").iterdir()] == [entry.name]  # no scratch left


def test_the_build_keeps_ieee_semantics(monkeypatch):
    chosen = loops.flags(loops.compiler())
    assert "-ffp-contract=off" in chosen
    assert not any("fast-math" in f and "no" not in f for f in chosen)
    assert not any(f.startswith("-Ofast") or f.startswith("-ffinite") for f in chosen)
    assert not any(f.startswith("-march") for f in loops.FLAGS)  # only where keyed
    monkeypatch.setattr(loops, "VECTORISE", False)
    scalar = loops.flags(loops.compiler())
    assert "-fno-tree-vectorize" in scalar and "-march=native" not in scalar


# --- the vectorised build, the call path and threads
WIDE = [((67, 131), (131,)), ((4099,), ()), ((9, 1, 37), (9, 5, 37)), ((33, 65), (33, 1))]


def _wide_program(rng):
    """An arithmetic program and inputs of odd sizes (loop epilogues, broadcasting)."""
    f, plan = random_program(rng, 2, int(rng.integers(4, 9)), libm=False)
    shapes = WIDE[rng.integers(len(WIDE))]
    dtypes = [np.float32, np.float64][rng.integers(2)], [np.float32, np.float64][rng.integers(2)]
    inputs = [domain(shape, dtype, seed=int(rng.integers(1000)))
              for shape, dtype in zip(shapes, dtypes)]  # fmt: skip
    return f, plan, inputs


@pytest.mark.parametrize("seed", range(6))
def test_the_vectorised_build_is_the_scalar_build_bit_for_bit(seed, monkeypatch):
    """Correctly rounded operations give the same bits in vector registers as in scalar code
    (`-march=native`, against loops built without vectorisation), and as eager."""
    rng = np.random.default_rng([seed, 11])
    for _ in range(3):
        f, plan, inputs = _wide_program(rng)
        results = {}
        for vectorise in (True, False):
            monkeypatch.setattr(loops, "VECTORISE", vectorise)
            step = tg.compile(f, gradient=False, fuse="exact")
            _quiet(step, *inputs)
            results[vectorise] = _quiet(step, *inputs)
            assert step.programs()[0].fused >= 1, plan
        _same_bits(results[True], results[False], f"vectorised vs scalar {plan}")
        _same_bits(results[True], _quiet(lambda f=f, a=inputs: tg.data(f(*a))), f"eager {plan}")


def test_threads_do_not_change_the_results():
    """A region cut between threads (from `threads()[0]` elements) gives every element the bits
    one thread gives it."""
    before = loops.threads()
    try:
        rng = np.random.default_rng(12)
        for _ in range(6):
            f, plan, inputs = _wide_program(rng)
            results = {}
            for start, count in ((1 << 62, 1), (0, 3), (0, 2)):
                loops.threads(start, count)
                step = tg.compile(f, gradient=False, fuse="exact")
                _quiet(step, *inputs)
                results[count] = _quiet(step, *inputs)
            _same_bits(results[1], results[3], f"3 threads, {plan}")
            _same_bits(results[1], results[2], f"2 threads, {plan}")
    finally:
        loops.threads(*before)


def test_invariant_operations_are_computed_once(monkeypatch):
    """Adam's update: what depends on its 0-d step count only is computed before the loop, in
    float64 as NumPy computes it on 0-d arrays; the result is eager's bit for bit."""

    def update(p, m, v, correction):
        return p - (m / (tg.sqrt(v) + 1e-8)) * (tg.sqrt(1.0 - correction) * 1e-3)

    p, m, v = (domain((40, 50), np.float32, seed=k) for k in (1, 2, 3))
    v, correction = np.abs(v), np.array(0.999**3)
    texts, source = [], loops.source
    monkeypatch.setattr(loops, "source", lambda *a: texts.append(source(*a)) or texts[-1])
    monkeypatch.setattr(loops, "_loaded", {})
    step = tg.compile(update, gradient=False)
    _quiet(step, p, m, v, correction)
    if loops.default_fuse() != "exact":
        pytest.skip("not fused by default on this machine")
    assert step.programs()[0].fused == 1
    (text,) = texts
    loop = text.index("for (long long i")
    before = text[text.index("_loops(") : loop]  # 1 - correction, its sqrt, * 1e-3: once
    assert "typedef double T;" in before and "= sqrt(t" in before, text
    assert "sqrt(t" not in text[loop:].split("\n}")[0], text
    got = _quiet(step, p, m, v, correction)
    _same_bits(got, _quiet(lambda: tg.data(update(p, m, v, correction))), "Adam's update")


def test_arrays_are_handed_over_by_address_where_objects_cannot_be_read(monkeypatch):
    """A library that cannot read NumPy's array objects takes their addresses: the same bits."""
    region = fusion.Region(
        [("multiply", np.dtype(np.float64), [("in", 0), ("const", 2.5)]),
         ("add", np.dtype(np.float64), [("op", 0), ("in", 1)]),
         ("sqrt", np.dtype(np.float64), [("op", 1)])],
        [(np.dtype(np.float64), (5, 3)), (np.dtype(np.float64), (3,))], (5, 3),
    )  # fmt: skip
    a, b = domain((5, 3), np.float64, seed=8), domain((3,), np.float64, seed=9)
    (by_object,) = loops.build([region])

    class Addresses(loops._Library):
        def __init__(self, path):
            super().__init__(path)
            self.objects = False

    monkeypatch.setattr(loops, "_Library", Addresses)
    monkeypatch.setattr(loops, "_loaded", {})
    (by_address,) = loops.build([region])
    expected = _quiet(lambda: np.sqrt(a * 2.5 + b))
    _same_bits(_quiet(by_object, a, b), expected, "by object")
    _same_bits(_quiet(by_address, a, b), expected, "by address")


def test_the_declared_math_functions_are_cmaths():
    """A region's source declares the libm functions it calls rather than include <cmath> (a
    third of the build time): calls of each, in float and double, build to the machine code
    that <cmath>'s `std::` functions build to."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump to compare the machine code with")
    calls = [f"{f}(x)" for f in host.UNARY_MATH] + ["pow(x, y)"]
    body = "".join(f"    out[{k}] = {c};\n" for k, c in enumerate(calls))
    functions = "".join(
        f'extern "C" void tg_calls_{t}(const {t}* v, {t}* out) {{\n'
        f"    const {t} x = v[0], y = v[1];\n{body}}}\n"
        for t in ("float", "double")
    )
    names = (*host.UNARY_MATH, "pow")
    with_cmath = "#include <cmath>\n" + "".join(f"using std::{f};\n" for f in names)
    codes = []
    for prelude in (with_cmath, loops._PRELUDE):
        path = loops.cache_dir() / f"calls-{len(codes)}.so"
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = [*loops.FLAGS, "-march=native"]
        done = loops._compile(loops.compiler(), flags, (prelude + functions).encode(), path)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        shown = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(path)],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        codes.append(_instructions(shown, ("tg_calls_float", "tg_calls_double")))
    assert codes[0] == codes[1]
    assert all(f"<{f}@" in codes[0] for f in ("expm1f", "tanhf", "powf"))  # float functions


def _instructions(disassembly, names):
    """The instructions of the functions `names` in objdump's `disassembly`, without addresses
    and comments (calls name their targets)."""
    kept, inside = [], False
    for line in disassembly.splitlines():
        header = re.match(r"^[0-9a-f]+ <(\w+)>:$", line)
        if header:
            inside = header[1] in names
            kept.append(line.split()[-1] if inside else "")
        elif inside and "\t" in line:
            instruction = line.split("\t", 1)[1].split("#")[0]
            kept.append(re.sub(r"(?<![\w@])[0-9a-f]+ (?=<)", "", instruction))
    return "\n".join(kept)


def _bfloat16():
    return pytest.importorskip("ml_dtypes").bfloat16


COMPARED = {  # (array, Python number): where the namespace's conversion of the number differs
    "bfloat16 with a float": (lambda: np.array([0.1, 0.0, 1.0, np.inf] * 512, _bfloat16()), 0.1),
    "bfloat16 beyond its range": (lambda: np.array([np.inf, 1.0] * 1024, _bfloat16()), 1e39),
    "uint8 with 300": (lambda: np.array([0, 3, 255] * 700, np.uint8), 300),
    "int8 with -129": (lambda: np.array([-128, 0, 127] * 700, np.int8), -129),
    "int64 with 2**70": (lambda: np.array([1, -1] * 1024, np.int64), 2**70),
}
COMPARISONS = {"<": lambda a, c: a < c, "==": lambda a, c: a == c, "!=": lambda a, c: a != c,
               ">=": lambda a, c: a >= c, "tg.greater": lambda a, c: tg.greater(a, c)}  # fmt: skip


@pytest.mark.parametrize("compare", COMPARISONS)
@pytest.mark.parametrize("case", COMPARED)
@pytest.mark.parametrize("fuse", [None, False, True])
def test_a_comparison_with_a_python_number_replays_as_eagerly(case, compare, fuse):
    """Recorded, `a == 0.1` went through the namespace's `equal` where eagerly NumPy's operator
    compares (bfloat16(0.1) == 0.1 true compiled, false eagerly; uint8 < 300 an OverflowError),
    and a fused comparison of bfloat16 with a float ran in float64 (inf > 1e39 true)."""
    make, number = COMPARED[case]
    a, w = make(), np.linspace(0.5, 1.5, make().size).astype(np.float32)
    f = lambda w, a: tg.sum(w * tg.astype(COMPARISONS[compare](a, number), w.dtype))  # noqa: E731
    if compare == "tg.greater" and "int" in case:
        pytest.skip("the namespace's greater takes the number as an array of a's dtype")
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = tg.withgradient(f, w, a, wrt=0)
        step = tg.compile(f, wrt=0, fuse=fuse)
        for _ in range(3):  # the recording, then replays
            got = step(w, a)
            assert float(got.val) == float(eager.val)
            np.testing.assert_array_equal(got.grad[0], eager.grad[0])
