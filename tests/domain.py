"""The whole floating-point domain, for checking fused kernels against generic rules: zeros of
both signs, tiny (subnormal) and huge magnitudes, infinities, nan and ordinary values, and the
comparison that says two results agree: the same nan and infinity pattern (signs included), and
finite values within a few units in the last place.
"""

import numpy as np

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -2.0, np.inf, -np.inf, np.nan]


def _finfo(dtype):
    try:
        import ml_dtypes  # its finfo knows bfloat16 as well as NumPy's own types
    except ImportError:
        return np.finfo(dtype)
    return ml_dtypes.finfo(dtype)


def special_values(dtype):
    """Every special value of `dtype`: zeros, units, the smallest subnormal and normal, the
    largest finite, infinities and nan, each with both signs."""
    info = _finfo(dtype)
    tiny = [info.smallest_subnormal, info.tiny, info.eps]
    huge = [info.max, np.sqrt(info.max), 1 / info.eps]
    values = SPECIAL + tiny + huge + [-v for v in tiny + huge]
    return np.array(values, dtype=dtype)


def domain(shape, dtype, seed=0, special=0.3):
    """Random values of `shape`: about `special` of them special values, the others ordinary
    values of both signs across many magnitudes."""
    rng = np.random.default_rng(seed)
    ordinary = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
    picks = rng.choice(special_values(dtype), size=shape)
    chosen = np.where(rng.random(shape) < special, picks, ordinary)
    return np.asarray(chosen, dtype=dtype)


def ulp_tolerance(dtype, ulps):
    return ulps * float(np.finfo(dtype).eps)


def assert_agree(actual, expected, *, ulps=4, scale=None, signed_zeros=False, what=""):
    """`actual` agrees with `expected`: nan where it is nan, the same infinities, and finite
    values within `ulps` units in the last place of the larger magnitude (or of `scale`, an
    array of the sum of the magnitudes that were added up, for results that may cancel). With
    `signed_zeros`, zeros have the same sign too."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    bad = np.flatnonzero(nan_a != nan_e)
    assert not bad.size, _report(what, "nan pattern differs", actual, expected, bad)
    inf_a, inf_e = np.isinf(actual), np.isinf(expected)
    same_inf = (inf_a == inf_e) & (~inf_a | (np.sign(actual) == np.sign(expected)))
    bad = np.flatnonzero(~same_inf)
    assert not bad.size, _report(what, "infinity pattern differs", actual, expected, bad)
    finite = np.isfinite(actual) & np.isfinite(expected)
    a, e = actual[finite].astype(np.float64), expected[finite].astype(np.float64)
    magnitude = np.maximum(np.abs(a), np.abs(e))
    if scale is not None:
        magnitude = np.maximum(magnitude, np.broadcast_to(np.asarray(scale), actual.shape)[finite])
    tiny = float(np.finfo(actual.dtype).smallest_subnormal) * ulps
    limit = ulp_tolerance(actual.dtype, ulps) * magnitude + tiny
    bad = np.flatnonzero(finite)[np.abs(a - e) > limit]
    assert not bad.size, _report(what, f"values differ by more than {ulps} ulp", actual,
                                 expected, bad)  # fmt: skip
    if signed_zeros:
        zeros = (actual == 0) & (expected == 0)
        bad = np.flatnonzero(zeros & (np.signbit(actual) != np.signbit(expected)))
        assert not bad.size, _report(what, "the sign of zero differs", actual, expected, bad)


def _report(what, problem, actual, expected, bad):
    first = bad[:5]
    pairs = ", ".join(f"[{i}] {actual.flat[i]!r} vs {expected.flat[i]!r}" for i in first)
    return f"{what}: {problem} at {bad.size} of {actual.size} elements: {pairs}"
