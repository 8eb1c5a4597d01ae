"""Comparisons, maximum, minimum and clip by one bound in generated kernels (kernels/compare.cuh),
over every pair of special values: the host build computes them as NumPy does, and the NVRTC
build as CuPy does.

CuPy compiles every kernel with -ftz=true, a float subnormal read as a zero of its sign (its
comparisons do so; ptxas once dropped the flush from a fused `x < 0`, and the gradient of abs
at the smallest negative subnormal was -1 where CuPy's was 0), and its maximum is nan where
either operand is, else CUDA's fmax, which orders -0 below +0 (a tie of +0 and -0 was -0 fused,
+0 on CuPy). The device build is modelled on the host: the header as NVRTC reads it, with
CUDA's bit casts and fmax/fmin as the GPU computes them, against CuPy's rules written in NumPy.
"""

import ctypes

import numpy as np
import pytest
from domain import special_values

from tracker_gpu.compiler import loops
from tracker_gpu.cuda import codegen, host
from tracker_gpu.cuda.sources import header
from tracker_gpu.expr import Expr, e, partials

pytestmark = pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")

# name: (op, the dtype the generated code writes it for), for loops._expression; "abs'": the
# partial derivative of abs, as tg.broadcast's backward kernel writes it
OPS = {
    "maximum": ("maximum", "float32"), "minimum": ("minimum", "float32"),
    "maximum16": ("maximum", "float16"), "minimum16": ("minimum", "float16"),
    "clip_lo": ("clip", "float32"), "clip_hi": ("clip", "float32"),
    "clip_lo16": ("clip", "float16"), "clip_hi16": ("clip", "float16"),
    "gt": ("gt", "float32"), "ge": ("ge", "float32"), "lt": ("lt", "float32"),
    "le": ("le", "float32"), "eq": ("eq", "float32"), "ne": ("ne", "float32"),
    "sign": ("sign", "float32"), "abs'": ("abs'", "float32"),
}  # fmt: skip

# The device build on the host: CUDA's bit casts; fmax and fmin of non-nan operands as the GPU
# computes them, -0 below +0 (no <cmath>: its fmax would clash)
DEVICE = r"""
#define __CUDACC__ 1
#define __device__
#define __forceinline__ inline
#include <cstring>
template <typename To, typename From> static inline To cast(From x) {
    To y;
    memcpy(&y, &x, sizeof y);
    return y;
}
static inline unsigned int __float_as_uint(float x) { return cast<unsigned int>(x); }
static inline float __uint_as_float(unsigned int u) { return cast<float>(u); }
template <typename T> static inline bool negative(T x) { return x < 0 || 1 / x < 0; }
template <typename T> static inline T fmax(T a, T b) {
    return a > b || (a == b && !negative(a)) ? a : b;
}
template <typename T> static inline T fmin(T a, T b) {
    return a < b || (a == b && negative(a)) ? a : b;
}
"""


def _statement(name):
    op, dtype = OPS[name]
    if op == "abs'":
        return codegen.body([("out[i]", partials(e("abs", Expr("arg", value=0)), 1)[0])])
    values = {"clip": ["x", None, "y"] if name.startswith("clip_hi") else ["x", "y", None]}
    return loops._expression(op, values.get(op, ["x", "y"]), "out[i]", dtype)


def _source(device):
    cases = "".join(f"case {k}: {{ {_statement(n)} }} break;\n" for k, n in enumerate(OPS))
    loop = (f"template <typename T> static void run(int op, const T* a, const T* b, T* out, "
            f"long long n) {{\n  typedef T S;  // the storage type of tg.broadcast's kernels\n"
            f"  for (long long i = 0; i < n; ++i) {{ const T x = a[i], "
            f"y = b[i], a0 = x;\n switch (op) {{\n{cases} }} }}\n}}\n")  # fmt: skip
    entries = "".join(f'extern "C" void run_{t}(int op, const {t}* a, const {t}* b, {t}* out, '
                      f"long long n) {{ run(op, a, b, out, n); }}\n"
                      for t in ("float", "double"))  # fmt: skip
    prelude = DEVICE if device else "#define __device__\n#define __forceinline__ inline\n"
    return prelude + header("half") + header("compare") + loop + entries


def _run(device, name, x, y):
    """`name` of x and y, elementwise, by the header of the device or the host build."""
    library = host.compile_shared(_source(device), "compare-device" if device else "compare-host")
    ctype = "float" if x.dtype == np.float32 else "double"
    out = np.empty_like(x)
    pointers = [ctypes.c_void_p(a.ctypes.data) for a in (x, y, out)]
    getattr(library, f"run_{ctype}")(list(OPS).index(name), *pointers, ctypes.c_longlong(x.size))
    return out


def _pairs(dtype):
    x, y = np.meshgrid(special_values(dtype), special_values(dtype), indexing="ij")
    return x.ravel(), y.ravel()


# --- NumPy's rules: the host build
def numpy_rule(name, x, y, dtype):
    """What NumPy computes for arrays of `dtype` (x and y of its values)."""
    op = OPS[name][0]
    x, y = x.astype(dtype), y.astype(dtype)
    if op == "clip":
        lo, hi = (None, y) if name.startswith("clip_hi") else (y, None)
        return np.clip(x, lo, hi)
    if op == "sign":
        return np.sign(x)
    if op == "abs'":
        return np.where(x > 0, 1, np.where(x < 0, -1, 0)).astype(dtype)
    function = {"gt": "greater", "ge": "greater_equal", "lt": "less", "le": "less_equal",
                "eq": "equal", "ne": "not_equal"}.get(op, op)  # fmt: skip
    return getattr(np, function)(x, y).astype(dtype)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [(name, dtype) for name in OPS
     for dtype in (["float32"] if name.endswith("16") else ["float32", "float64"])],
)  # fmt: skip
def test_the_host_build_is_numpys(name, dtype):
    """Signed zeros included; the ...16 forms are float16's, computed in float (as tg.compile's
    regions compute float16)."""
    half = name.endswith("16")
    x, y = _pairs("float16" if half else dtype)
    x, y = x.astype(dtype), y.astype(dtype)
    with np.errstate(all="ignore"):
        expected = numpy_rule(name, x, y, "float16" if half else dtype).astype(dtype)
    _same(_run(False, name, x, y), expected, x, y, name)


# --- CuPy's rules: the NVRTC build
def daz(x):
    """A float32 subnormal read as a zero of its sign (-ftz=true); float64 as it is."""
    if x.dtype != np.float32:
        return x
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.copysign(0.0, x), x).astype(x.dtype)


def cupy_rule(name, x, y):
    """What CuPy computes: maximum nan where either is, else fmax of the flushed operands (-0
    below +0); comparisons of the flushed operands; the Array API's clip keeps x unless it is
    below lo (above hi); sign 0 at a flushed zero. float16 is computed in float, alike."""
    op, (a, b) = OPS[name][0], (daz(x), daz(y))
    nan = np.isnan(x) | np.isnan(y)
    if op in ("maximum", "minimum"):
        pick_a = (a > b) | ((a == b) & ~np.signbit(a)) if op == "maximum" else (
            (a < b) | ((a == b) & np.signbit(a)))  # fmt: skip
        return np.where(nan, np.nan, np.where(pick_a, a, b)).astype(x.dtype)
    if op == "clip":
        moved = a > b if name.startswith("clip_hi") else a < b
        return np.where(moved, y, x)
    if op == "sign":
        return np.where(np.isnan(x), x, np.sign(a) + 0.0).astype(x.dtype)
    if op == "abs'":
        return np.where(a > 0, 1, np.where(a < 0, -1, 0)).astype(x.dtype)
    compare = {"gt": np.greater, "ge": np.greater_equal, "lt": np.less, "le": np.less_equal,
               "eq": np.equal, "ne": np.not_equal}[op]  # fmt: skip
    return compare(a, b).astype(x.dtype)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_device_build_is_cupys(name, dtype):
    """Subnormal float32 operands flushed, float64 ones not; the float16 forms the same."""
    x, y = _pairs(dtype)
    with np.errstate(all="ignore"):
        expected = cupy_rule(name, x, y)
    _same(_run(True, name, x, y), expected, x, y, name)


def _same(actual, expected, x, y, name):
    """Equal, signed zeros included, nan where nan; a clip is not compared at a nan bound (the
    fused path takes none)."""
    skip = np.isnan(y) if OPS[name][0] == "clip" else np.zeros(x.shape, bool)
    same = (actual == expected) & (np.signbit(actual) == np.signbit(expected))
    same |= np.isnan(actual) & np.isnan(expected)
    bad = np.flatnonzero(~same & ~skip)
    assert not bad.size, [(x[k], y[k], actual[k], expected[k]) for k in bad[:6]]


def test_the_builds_part_where_the_libraries_do():
    """A tie of +0 and -0 and a float32 subnormal: the cases the GPU found (maximum's sign of
    zero, abs' gradient at the smallest negative subnormal)."""
    x = np.array([0.0, -0.0, -1e-45, 1e-45], np.float32)
    y = np.array([-0.0, 0.0, 0.0, -0.0], np.float32)
    assert np.signbit(_run(False, "maximum", x, y)).tolist() == [True, False, False, False]
    assert np.signbit(_run(True, "maximum", x, y)).tolist() == [False, False, False, False]
    assert _run(False, "abs'", x, y).tolist() == [0, 0, -1, 1]
    assert _run(True, "abs'", x, y).tolist() == [0, 0, 0, 0]
    x64, y64 = x.astype(np.float64), y.astype(np.float64)  # no flush in float64
    assert _run(True, "abs'", x64, y64).tolist() == [0, 0, -1, 1]
