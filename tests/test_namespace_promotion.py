"""The tracked namespace's binary functions answer as the plain namespace does (the one
`array_namespace` returns for the plain arrays) where the operands' kinds or dtypes differ:
the same value and dtype, or an error where the plain one refuses. A Python number of a higher
kind than the array beside it (2.5 beside integers, 2 beside booleans) was once made an array
of the array's dtype (2.5 became 2: `maximum(ints, 2.5)` gave 2 where NumPy gives 2.5), and
PyTorch's operators, the forwards of `add` and `multiply`, let a 0-d tensor's dtype give way
(float32 times a 0-d float64 was float32). The functions are the standard's `(x1, x2, /)` ones
of test_signatures.py's table, so one added there is covered here too."""

import array_api_compat
import numpy as np
import pytest

import tracker_gpu as tg
from tests.test_signatures import STANDARD_2024_12
from tracker_gpu.backend import half_dtype

BINARY = [line.partition("(")[0] for line in STANDARD_2024_12 if "(x1, x2, /)" in line]

# (left operand as NumPy, whether it is tracked, right operand: a number or a 0-d NumPy array)
CASES = {
    "ints, 2.5": (np.array([1, 7, -3]), False, 2.5),
    "ints, -0.0": (np.array([1, 7, -3]), False, -0.0),
    "ints, 2": (np.array([1, 7, -3]), False, 2),
    "bools, 2": (np.array([True, False]), False, 2),
    "bools, 2.5": (np.array([True, False]), False, 2.5),
    "floats, 1j": (np.array([0.5, -2.0]), True, 1j),
    "float32, 0-d float64": (np.array([1.1, 2.3], np.float32), True, np.array(1 / 3)),
    "int8, 0-d int64": (np.array([100, 120], np.int8), False, np.array(100)),
    "float32, 0-d int64": (np.array([1.5, -2.5], np.float32), True, np.array(3)),
}


def _answer(call):
    """`("value", array)` or `("raised", exception)`."""
    try:
        return "value", call()
    except Exception as error:  # noqa: BLE001 - which error a library raises is its own
        return "raised", error


# The standard orders no complex numbers: what these give beside a complex number is each
# library's own (array-api-strict compares the real part alone), not a promise to mirror.
ORDERED = {"greater", "greater_equal", "less", "less_equal", "maximum", "minimum"}
# Nor does it raise booleans to a power: NumPy's own `**` gives int8 there and its `power`
# int64; `pow`'s forward is the operator, as the tracked `x ** 2` must be the plain one.
UNDEFINED = {(name, case) for name in ORDERED for case in CASES if "1j" in case}
UNDEFINED |= {("pow", "bools, 2"), ("pow", "bools, 2.5")}
PAIRS = [(name, case) for name in BINARY for case in CASES if (name, case) not in UNDEFINED]


@pytest.mark.parametrize(("name", "case"), PAIRS)
def test_a_binary_function_of_mixed_operands_answers_as_the_plain_namespace(backend, name, case):
    left, tracked, right = CASES[case]
    a = backend.asarray(left)
    b = right if type(right) in (int, float, complex) else backend.asarray(right)
    plain_xp = array_api_compat.array_namespace(a)
    xp = array_api_compat.array_namespace(tg.param(backend.asarray([1.0])))
    x = tg.param(a) if tracked else xp.asarray(a)  # on the tape, or a tracked constant
    assert isinstance(x, tg.TrackedArray)
    expected = _answer(lambda: getattr(plain_xp, name)(a, b))
    got = _answer(lambda: tg.data(getattr(xp, name)(x, b)))
    if expected[0] == "raised":
        assert got[0] == "raised", f"{name}: plain raised {expected[1]!r}, tracked gave {got[1]}"
        return
    assert got[0] == "value", f"{name}: tracked raised {got[1]!r}, plain gave {expected[1]}"
    want, have = backend.to_numpy(expected[1]), backend.to_numpy(got[1])
    assert str(expected[1].dtype) == str(got[1].dtype), f"{name}: {got[1].dtype}, not plain's"
    assert np.array_equal(want, have, equal_nan=want.dtype.kind in "fc"), f"{name}: {have}"


def test_every_binary_function_is_enumerated():
    assert {"add", "multiply", "maximum", "atan2", "copysign", "equal", "bitwise_and"} <= set(
        BINARY
    )


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "pow"])
def test_the_gradient_of_a_promoted_operand_is_the_promoted_products(backend, name):
    """float32 with a 0-d float64 computes in float64 (the standard's promotion), and each
    gradient comes back in its operand's dtype: against NumPy's float64 central differences."""
    a = backend.asarray(np.array([1.1, 2.3], np.float32))
    s = backend.asarray(np.array(1 / 3))
    xp = array_api_compat.array_namespace(tg.param(a))
    f = lambda a, s: xp.sum(getattr(xp, name)(a, s))
    ga, gs = tg.gradient(f, a, s)
    assert str(ga.dtype) == str(a.dtype) and str(gs.dtype) == str(s.dtype)
    reference = getattr(np, name if name != "pow" else "power")
    a64, s64, h = np.array([1.1, 2.3], np.float32).astype(np.float64), 1 / 3, 1e-6
    numeric_s = (reference(a64, s64 + h).sum() - reference(a64, s64 - h).sum()) / (2 * h)
    np.testing.assert_allclose(backend.to_numpy(gs), numeric_s, rtol=1e-6)


CLIPS = {
    "float32, float64 bounds": (np.array([0.5, 3.0], np.float32), np.array(0.0), np.array(2.0)),
    "ints, float bounds": (np.array([-3, 0, 3]), -0.5, 0.5),
    "int8, a bound beyond int8": (np.array([-3, 0, 3], np.int8), -300, 2),
    "float64, float32 bounds": (np.array([0.5, 3.0]), np.array(1.0, np.float32), None),
}


@pytest.mark.parametrize("case", list(CLIPS))
def test_clip_keeps_the_dtype_of_x_as_the_plain_namespace(backend, case):
    """The standard's clip returns x's dtype where the bounds are of its kind (beyond it, each
    library's compat namespace answers its own way, or refuses); NumPy's own clip promotes."""
    left, lo, hi = CLIPS[case]
    a = backend.asarray(left)
    lo, hi = (b if b is None or type(b) in (int, float) else backend.asarray(b) for b in (lo, hi))
    xp = array_api_compat.array_namespace(tg.param(backend.asarray([1.0])))
    x = tg.param(a) if left.dtype.kind == "f" else xp.asarray(a)
    expected = _answer(lambda: array_api_compat.array_namespace(a).clip(a, lo, hi))
    got = _answer(lambda: tg.data(xp.clip(x, lo, hi)))
    assert got[0] == expected[0], f"plain: {expected[1]!r}, tracked: {got[1]!r}"
    if got[0] == "value":
        assert str(got[1].dtype) == str(expected[1].dtype)
        assert np.array_equal(backend.to_numpy(got[1]), backend.to_numpy(expected[1]))
    if case != "ints, float bounds":
        assert str(got[1].dtype) == str(a.dtype)


INTEGER_BOUNDS = [
    (np.int8, None, np.int64(300)),
    (np.int8, None, np.int16(1000)),
    (np.int8, np.int64(-1000), np.uint8(3)),
    (np.uint8, np.int64(-1), None),
    (np.uint8, np.array([-1, 300, 7, 0]), None),
    (np.int16, np.array(-40000), np.array([5, 70000, -3, 2])),
    (np.uint64, np.int64(-3), np.int64(6)),
]


@pytest.mark.parametrize(("dtype", "lo", "hi"), INTEGER_BOUNDS)
def test_an_integer_bound_beyond_the_dtype_of_x_is_its_end(dtype, lo, hi):
    """An integer bound (a NumPy scalar or array) that x's dtype cannot hold clips as its
    range's end: cast first, 300 became 44 in int8 and clipped 100 to it."""
    info = np.iinfo(dtype)
    x = np.array([info.min, 0, 5, info.max], dtype)
    xp = array_api_compat.array_namespace(tg.param(np.array([1.0])))
    wide = [None if b is None else np.asarray(b).astype(object) for b in (lo, hi)]
    expected = np.clip(np.clip(x.astype(object), *wide), info.min, info.max).astype(dtype)
    got = tg.data(xp.clip(xp.asarray(x), lo, hi))
    assert got.dtype == dtype and np.array_equal(got, expected), got


HALF = ["float16", "bfloat16"]
COMPLEX_OF_HALF = {
    "fft": lambda xp, x: xp.fft.fft(x),
    "where with 1j": lambda xp, x: xp.where(x > 2, x, 1j),
    "maximum with 1j": lambda xp, x: xp.maximum(x, 1j),
    "multiply by 1j": lambda xp, x: x * 1j,
}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", list(COMPLEX_OF_HALF))
def test_half_floats_made_complex_are_complex64_as_numpy_makes_them(dtype, name):
    x = np.array([1, 2, 3, 4], half_dtype(dtype, np))
    f = COMPLEX_OF_HALF[name]
    expected = f(np, x.astype(np.float32)) if dtype == "bfloat16" else f(np, x)
    xp = array_api_compat.array_namespace(tg.param(np.array([1.0])))
    assert tg.data(f(xp, tg.param(x))).dtype == expected.dtype == np.complex64


FLOOR_DIVISIONS = {  # (left operand, right operand) as the library's operator takes them
    "bfloat16 // 2.5": lambda: (np.array([1e4, 3.0], half_dtype("bfloat16", np)), 2.5),
    "2.5 // bfloat16": lambda: (2.5, np.array([1.5, 3.0], half_dtype("bfloat16", np))),
    "float32 // 0-d float64": lambda: (np.array([7.0, -7.5], np.float32), np.array(2.0)),
    "torch float32 // 0-d float64": lambda: (
        _torch().tensor([3.0, 5.0]),
        _torch().tensor(2.0, dtype=_torch().float64),
    ),
}


def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("case", list(FLOOR_DIVISIONS))
def test_the_floor_division_operator_is_the_librarys(case):
    """`x // y` on a tracked array is the library's operator, as `+` and `*` are (it went
    through the namespace's floor_divide: bfloat16 // 70000.0 divided by 70144)."""
    left, right = FLOOR_DIVISIONS[case]()
    expected = left // right
    tracked = (tg.param(left) if hasattr(left, "dtype") else left) // (
        right if hasattr(left, "dtype") else tg.param(right)
    )
    got = tg.data(tracked)
    assert str(got.dtype) == str(expected.dtype), got.dtype
    assert np.array_equal(np.asarray(got, dtype=np.float64), np.asarray(expected, np.float64))
