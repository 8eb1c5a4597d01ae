"""The host target's row loop: each row of the last axis less its maximum, `x - max(x)`, the
first step of the softmax and of cross-entropy's log-softmax where `opened.py` opens them.

NumPy's `max` over short rows pays per row (`rules/rows.py`): the 8,192 rows of 64 attention
scores of a transformer at batch 32 take 0.3 ms, and their subtraction another pass. One C++
function finds each row's maximum in vector lanes (a maximum is the same whatever the order of
its comparisons) and writes the row less it while the row is in cache. A nan in a row makes its
maximum nan, as NumPy's; a zero maximum is +0, as `rules.rows.row_max` makes NumPy's, so the
result is eager's `x - row_max(x)` bit for bit. It is built once by the compiler of `loops.py`
and cached on disk with its libraries; where none can be built, NumPy computes it.

>>> import numpy as np
>>> shifted(np, np.array([[1.0, 3.0, 2.0]]), -1)
array([[-2.,  0., -1.]])
"""

import ctypes
import warnings

import numpy as np

from ..cuda import fp_status
from ..rules.rows import row_max
from . import loops

__all__ = ["shifted", "SOURCE"]

SOURCE = r"""#include <cmath>
// lanes: the columns j = k (mod LANES) of a row, compared in vector lanes (32: the fastest of
// 8, 16, 32 and 64 for rows of 64 floats or doubles, measured)
template <typename T, int LANES>
static void shifted_rows(const T* __restrict x, T* __restrict out, long long rows, long long n) {
    for (long long r = 0; r < rows; ++r) {
        const T* row = x + r * n;
        T lanes[LANES];
        int nan[LANES];
        for (int k = 0; k < LANES; ++k) {
            lanes[k] = -INFINITY;
            nan[k] = 0;
        }
        long long j = 0;
        for (; j + LANES <= n; j += LANES)
            for (int k = 0; k < LANES; ++k) {
                T v = row[j + k];
                lanes[k] = v > lanes[k] ? v : lanes[k];
                nan[k] |= v != v;
            }
        for (int k = 0; j < n; ++j, ++k) {
            T v = row[j];
            lanes[k] = v > lanes[k] ? v : lanes[k];
            nan[k] |= v != v;
        }
        for (int width = LANES / 2; width > 0; width /= 2)
            for (int k = 0; k < width; ++k) {
                lanes[k] = lanes[k + width] > lanes[k] ? lanes[k + width] : lanes[k];
                nan[k] |= nan[k + width];
            }
        T m = nan[0] ? (T)NAN : lanes[0] + (T)0;  // + 0: a zero maximum is +0
        T* to = out + r * n;
        for (j = 0; j < n; ++j)
            to[j] = row[j] - m;
    }
}
extern "C" int tg_shifted_rows_float(const float* x, float* out, long long rows, long long n) {
    feclearexcept(TG_FP_ALL);
    shifted_rows<float, 32>(x, out, rows, n);
    return tg_fp_status();
}
extern "C" int tg_shifted_rows_double(const double* x, double* out, long long rows,
                                      long long n) {
    feclearexcept(TG_FP_ALL);
    shifted_rows<double, 32>(x, out, rows, n);
    return tg_fp_status();
}
"""

_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_built = {}  # "functions": {dtype: (holding the GIL, releasing it)}, or None: none built


def _functions():
    if "functions" not in _built:
        _built["functions"] = _build()
    return _built["functions"]


def _build():
    found = loops.compiler()
    if found is None:
        return None
    try:
        library = loops.library_of(fp_status.STATUS + SOURCE + loops.object_macros(), found)
    except (OSError, RuntimeError) as error:
        warnings.warn(f"tg.compile: the row loop could not be built ({error}); NumPy "
                      "computes the rows' maxima", RuntimeWarning, stacklevel=2)  # fmt: skip
        return None
    functions = {}
    for dtype, ctype in _CTYPES.items():
        pair = []
        for handle in (library.held, library.released):
            function = getattr(handle, f"tg_shifted_rows_{ctype}")
            function.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_longlong] * 2
            function.restype = ctypes.c_int
            pair.append(function)
        functions[dtype] = tuple(pair)
    return functions


def shifted(xp, x, axis):
    """`x - row_max(xp, x, axis)`: by the row loop for a C-contiguous float32 or float64
    NumPy array reduced over its last axis, by the library else, and again by the library where
    the loop raised a floating-point exception that NumPy's settings report (it warns)."""
    functions = _functions() if type(x) is np.ndarray else None
    found = functions and functions.get(x.dtype)
    if not (
        found
        and x.ndim
        and x.size
        and axis in (-1, x.ndim - 1)
        and x.flags.c_contiguous
        and x.flags.aligned
    ):
        return x - row_max(xp, x, axis)
    held, released = found
    out = np.empty_like(x)
    n = x.shape[-1]
    function = released if x.size >= loops.RELEASE_FROM else held
    status = function(x.ctypes.data, out.ctypes.data, x.size // n, n)
    if status and fp_status.reported(status):  # inf - inf, say: NumPy's steps warn or raise
        return x - row_max(xp, x, axis)
    return out
