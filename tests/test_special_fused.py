"""`tg.special` inside `tg.broadcast`: one node whose forward and pullback are generated kernels
calling the functions of kernels/special.cuh (CUDA's math library on the device, the header's
own definitions on the host). Checked here, for every function of the table
(`tracker_gpu.expr.SPECIAL`, so that a function added later is covered):
- the generated sources compile with NVRTC;
- the host build of the same source agrees with the generic path (SciPy) on the whole domain:
  the same nan and infinity pattern, and finite values within `ULPS[name]` units in the last
  place of `|f(x)| + |x f'(x)|` (the change of f when x moves by its own rounding, so a function
  near one of its zeros, as Bessel functions or digamma between its poles, is judged by how
  well it can be computed at all); the tolerance per function says why;
- the fused path against mpmath (an independent reference, to 30 digits) where SciPy itself is
  off by hundreds of ulps (erfc's and ndtr's tails, the Bessel functions near their zeros);
- first derivatives against the generic path's, second derivatives (nested through
  tg.broadcast) against central differences in float64.
"""

import math
import sys

import numpy as np
import pytest
from domain import assert_agree, special_values
from test_kernels import GENERATED_ARCH, compile_with_nvrtc

import tracker_gpu as tg
from tracker_gpu.cuda import codegen, host, on_host, recording
from tracker_gpu.expr import SPECIAL

broadcast_module = sys.modules["tracker_gpu.broadcast"]
S = tg.special


# One case per function of the table; polygamma at orders 1 to 3, the binary ones in both
# arguments. name -> (the user's scalar function, number of arguments)
def _calling(name):
    function = getattr(S, name)
    return lambda x: function(x)


CASES = {name: (_calling(name), 1) for name in sorted(SPECIAL)}
CASES.update({
    "polygamma": (lambda x: S.polygamma(1, x), 1),
    "polygamma_2": (lambda x: S.polygamma(2, x), 1),
    "polygamma_3": (lambda x: S.polygamma(3, x), 1),
    "xlogy": (lambda x, y: S.xlogy(x, y), 2),
    "xlog1py": (lambda x, y: S.xlog1py(x, y), 2),
})  # fmt: skip


def base(case):
    """The function of a case (`polygamma_2` is polygamma)."""
    return case if case in SPECIAL else case.rsplit("_", 1)[0]


# Units in the last place of |f| + |x f'| (of |g| + |x g'| + |f g' / f'| for a derivative g)
# that the host build may differ from SciPy by, about twice the largest difference measured
# (in brackets, values and gradients, float64). Measured against mpmath
# (test_the_fused_path_against_mpmath), the host build is within 2 ulps but for i0e and i1e
# (3.8, series and asymptotic sums); the rest is SciPy's error (its erfcx near 0: 9 ulps; its
# Bessel functions and lgamma: 4 to 6) and the derivatives' own formulas (i1e' subtracts terms
# of about i1e: CANCELLING).
ULPS = {name: 4 for name in CASES}  # (up to 2.9)
ULPS.update(dict.fromkeys(["digamma", "polygamma", "polygamma_2", "polygamma_3"], 8))  # (4.6)
ULPS.update(dict.fromkeys(["gamma", "gammaln", "erfcx"], 8))  # (5.8)
ULPS.update(dict.fromkeys(["j0", "j1", "y0", "y1"], 8))  # (5.9)
ULPS.update(dict.fromkeys(["i0", "i1", "i0e", "i1e"], 16))  # (9.3)

# Zeros whose sign differs: the fused erfinv(-0) is -0 (CUDA's and C's odd functions keep the
# sign), SciPy's +0; SciPy's erfcinv(1) is -0; the generic sinpi (reduced by subtraction) loses
# the sign of -0 and gives +0 at negative integers, the fused one gives -0 (as CUDA's).
ZERO_SIGNS = {"erfinv", "erfcinv", "sinpi"}

# Where SciPy's value is wrong, the true one: SciPy's erfcinv and gammaln are inf at the
# smallest numbers, its i0 and i1 overflow from 709 where they are finite up to 713.9.
FAULTS = {
    "erfcinv": (lambda x: (x > 0) & (x < 1e-300), lambda x: _erfc_root(x)),
    "gammaln": (lambda x: (x != 0) & (abs(x) < 1e-300), lambda x: -mpmath.log(abs(x))),
    "i0": (lambda x: (abs(x) > 709) & (abs(x) < 714), lambda x: mpmath.besseli(0, x)),
    "i1": (lambda x: (abs(x) > 709) & (abs(x) < 714), lambda x: mpmath.besseli(1, x)),
}
# The derivatives that subtract terms of about |f| (1 + |x|) (so they cancel, on both paths),
# and those with f(x) / x, which both paths round before dividing at subnormal x.
CANCELLING = {"i0e", "i1e", "i1", "j1", "y1", "erfcx", "sinc"}
OVER_X = {"i1", "i1e", "j1", "sinc"}


def _erfc_root(z):
    return mpmath.findroot(lambda t: mpmath.log(mpmath.erfc(t)) - mpmath.log(z), (20, 28),
                           solver="anderson")  # fmt: skip


def edges(name):
    """Where each function is hardest: its poles, the ends of its domain, its tails."""
    near = [1 - 2**-52, 1 + 2**-52]
    table = {
        "erfinv": [1.0, -1.0, 1.5, -1.5, 1 - 2**-53, -(1 - 2**-53), 0.5, 1e-300],
        "erfcinv": [0.0, 2.0, 1.0, -1.0, 3.0, 5e-324, 1e-300, 2 - 2**-52, 0.5],
        "ndtri": [0.0, 1.0, 0.5, -1.0, 2.0, 5e-324, 1e-300, 1 - 2**-53],
        "logit": [0.0, 1.0, 0.5, -1.0, 2.0, 5e-324, 0.25, 0.75, 1 - 2**-53],
        "gamma": [-1.0, -2.0, -100.0, 171.6, 172.0, -171.5, -1 + 1e-9, 1e-300],
        "exp2": [1024.0, 1023.99, -1074.0, -1075.0, -1022.5],
        "i0": [700.0, 713.0, 714.0, -713.0],
        "sinpi": [3.0, -3.0, 2.5, -0.5, 2.0**52 + 1, 2.0**53, 1e300],
    }
    table["gammaln"] = table["digamma"] = table["polygamma"] = table["gamma"]
    table["cospi"], table["i1"] = table["sinpi"], table["i0"]
    tails = [26.0, -26.0, 26.7, 27.0, -27.0, 38.0, -38.0, 40.0, -40.0]
    for f in ("erf", "erfc", "erfcx", "ndtr", "log_ndtr", "expit"):
        table[f] = tails
    return np.array(table.get(base(name), []) + near)


def domain_of(name, dtype, n=4000, seed=0):
    rng = np.random.default_rng(seed)
    ordinary = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)
    wide = rng.uniform(-40, 40, n)
    unit = rng.uniform(-0.5, 2.5, n)  # the domains of erfinv, erfcinv, ndtri, logit and past
    values = np.concatenate([special_values(dtype), edges(name), ordinary, wide, unit])
    with np.errstate(over="ignore"):
        return values.astype(dtype)


def arguments(name, dtype):
    """The domain; for a binary function, random pairs of it and every pair of special values
    (zeros of x with every y: xlogy's edge)."""
    x = domain_of(name, dtype)
    if CASES[name][1] == 1:
        return [x]
    y = np.random.default_rng(1).permutation(domain_of(name, dtype, seed=1))
    pairs = np.meshgrid(special_values(dtype), special_values(dtype), indexing="ij")
    return [np.concatenate([x, pairs[0].ravel()]), np.concatenate([y, pairs[1].ravel()])]


def generic(f, args):
    """The value and the gradients on the generic path (SciPy's values)."""
    loss = lambda *a: tg.sum(f(*a))
    with np.errstate(all="ignore"), tg.sync_checks(False):  # the loss may be nan
        return tg.data(f(*args)), tg.gradient(loss, *args)


def fused(f, args):
    loss = lambda *a: tg.sum(tg.broadcast(f, *a))
    with np.errstate(all="ignore"), tg.sync_checks(False), on_host(), recording() as log:
        value = tg.data(tg.broadcast(f, *args))
        grads = tg.gradient(loss, *args)
    assert ("launch", "broadcast_fwd") in log and ("launch", "broadcast_bwd") in log
    return value, grads


def corrected(name, x, expected):
    """SciPy's values with its `FAULTS` replaced by mpmath's (left out without mpmath)."""
    if name not in FAULTS:
        return expected
    where, truth = FAULTS[name]
    at = np.flatnonzero(where(x))
    expected = expected.copy()
    for i in at:
        with np.errstate(over="ignore"):  # inf in float32
            expected[i] = np.nan if mpmath is None else float(truth(mpmath.mpf(float(x[i]))))
    return expected


FLOOR = 32


def scale(args, grads):
    """|x f'(x)| summed over the arguments, and at least the smallest normal number over
    epsilon: results below the smallest normal agree in absolute terms (SciPy flushes some
    tails to 0 early, or returns subnormals with fewer digits). Where |x f'| overflows, only
    the nan and infinity pattern is compared (erfcx next to -26.6: checked against mpmath)."""
    dtype = args[0].dtype
    total = FLOOR * np.finfo(dtype).tiny / np.finfo(dtype).eps
    with np.errstate(all="ignore"):
        for x, g in zip(args, grads):
            s = np.abs(x.astype(np.float64) * g)
            total = total + np.where(np.isnan(s), 0.0, s)
    return total


# --- the sources compile
def test_the_table_and_its_derivatives_are_complete():
    """Every function has a C expression and a derivative rule, every case runs, and every
    derivative is written with functions of the table (so it compiles, and nests)."""
    assert SPECIAL <= set(codegen.C) and SPECIAL <= set(broadcast_module.RULES)
    assert {base(c) for c in CASES} == set(SPECIAL)
    for name in SPECIAL:
        assert codegen.C[name].startswith(f"tg_{name}(")


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_sources_compile_with_nvrtc(name):
    f, n = CASES[name]
    compiled = broadcast_module._Compiled(f, n)
    texts = [codegen.family(compiled, (False,) * n), codegen.family(compiled, (False,) * n,
                                                                    (True,) * n)]  # fmt: skip
    for text in texts:
        assert text.text.startswith("// The special functions")  # the header, written out
        compile_with_nvrtc(text, name, GENERATED_ARCH)


# --- the host build against the generic path
needs_host = pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")


@needs_host
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_values_and_gradients_agree_with_scipy_everywhere(name):
    f, _ = CASES[name]
    args = arguments(name, np.float64)
    value, grads = generic(f, args)
    value = corrected(name, args[0], value)
    fused_value, fused_grads = fused(f, args)
    if name in FAULTS and mpmath is None:
        fused_value = np.where(FAULTS[name][0](args[0]), np.nan, fused_value)
    ulps = ULPS[name]
    signed = name not in ZERO_SIGNS
    assert_agree(fused_value, value, ulps=ulps, scale=scale(args, grads), signed_zeros=signed,
                 what=f"{name} value")  # fmt: skip
    for i, (a, b) in enumerate(zip(fused_grads, grads)):
        second = _second_scale(name, f, args, i, value, b)
        x = args[i]
        left_out = FAULTS[name][0](x) if name in FAULTS else np.zeros(x.shape, bool)
        if name in OVER_X:  # f(x) subnormal
            left_out |= (x != 0) & (np.abs(x) < 4 * np.finfo(x.dtype).tiny)
        a, b = np.where(left_out, 0.0, a), np.where(left_out, 0.0, b)
        assert_agree(a, b, ulps=ulps, scale=second, what=f"{name} gradient {i}")


def _second_scale(name, f, args, i, value, grad):
    """For the partial derivative g in argument i: |g| + |x g'| + |f g'/ f'| (its sensitivity to
    x, and to f where it is computed from f), plus |f| (1 + |x|) where it subtracts such terms."""
    first = lambda *a: tg.gradient(lambda *b: tg.sum(f(*b)), *a, nest=True)[i]
    with np.errstate(all="ignore"), tg.sync_checks(False):
        g = tg.data(first(*args))
        g2 = tg.gradient(lambda *a: tg.sum(first(*a)), *args)[i]
    g2 = np.zeros_like(g) if g2 is None else g2
    x = args[i]
    with np.errstate(all="ignore"):
        s = np.abs(g) + np.abs(x * g2) + np.abs(value * g2 / grad)
        if name in CANCELLING:
            s = s + np.abs(value) * (1 + np.abs(x))
    return np.where(np.isnan(s), 0.0, s) + FLOOR * np.finfo(x.dtype).tiny / np.finfo(x.dtype).eps


@needs_host
@pytest.mark.parametrize("name", sorted(CASES))
def test_float32_agrees_with_scipy(name):
    f, _ = CASES[name]
    args = arguments(name, np.float32)
    value, grads = generic(f, args)
    value = corrected(name, args[0], value)
    fused_value, _ = fused(f, args)
    assert fused_value.dtype == value.dtype == np.float32  # (SciPy's polygamma: float64)
    if name in FAULTS and mpmath is None:
        fused_value = np.where(FAULTS[name][0](args[0]), np.nan, fused_value)
    assert_agree(fused_value, value, ulps=ULPS[name], scale=scale(args, grads), what=name)


# --- the host build against mpmath, where SciPy is not accurate enough to judge it
try:
    import mpmath
except ImportError:  # a dependency of torch (through sympy), not of tracker_gpu
    mpmath = None

REFERENCE = {
    "erfc": (lambda x: mpmath.erfc(x), (-5, 26.5)),
    "erfcx": (lambda x: mpmath.exp(x * x) * mpmath.erfc(x), (-26.5, 30)),
    "ndtr": (lambda x: mpmath.ncdf(x), (-37, 8)),
    "log_ndtr": (lambda x: mpmath.log(mpmath.ncdf(x)), (-1e4, 5)),
    "j0": (lambda x: mpmath.besselj(0, x), (-200, 200)),
    "j1": (lambda x: mpmath.besselj(1, x), (-200, 200)),
    "y0": (lambda x: mpmath.bessely(0, x), (0, 200)),
    "y1": (lambda x: mpmath.bessely(1, x), (0, 200)),
    "i0e": (lambda x: mpmath.besseli(0, x) * mpmath.exp(-abs(x)), (-60, 60)),
    "i1e": (lambda x: mpmath.besseli(1, x) * mpmath.exp(-abs(x)), (-60, 60)),
    "sinpi": (lambda x: mpmath.sinpi(x), (-40, 40)),
    "cospi": (lambda x: mpmath.cospi(x), (-40, 40)),
    "digamma": (lambda x: mpmath.digamma(x), (-30, 30)),
    "erfinv": (lambda x: mpmath.erfinv(x), (-1, 1)),
    "gammaln": (lambda x: mpmath.log(abs(mpmath.gamma(x))), (3, 1e5)),
}
# The host build's own error, in ulps of |f| (measured: up to 1.9, 3.8 for i0e and i1e), or
# for the functions with zeros inside the range (the Bessel functions j0-y1, digamma) of
# |f| + |x f'| (measured: up to 1.2; relative to |f| alone, digamma's reflection loses up to
# 100 ulps next to its zeros between negative poles, as SciPy's does).
ACCURACY = dict.fromkeys(REFERENCE, 2)
ACCURACY.update({"erfinv": 3, "i0e": 5, "i1e": 5})
WITH_ZEROS = {"j0", "j1", "y0", "y1", "digamma"}


def against_mpmath(name, path):
    """`(x, values, true values, scale)` of `path` (`fused` or `generic`) for `name`."""
    mpmath.mp.dps = 30
    truth, (lo, hi) = REFERENCE[name]
    x = np.random.default_rng(7).uniform(lo, hi, 300)
    value, (grad,) = path(CASES[name][0], [x])
    expected = np.array([float(truth(mpmath.mpf(float(v)))) for v in x])
    return x, value, expected, scale([x], [grad]) if name in WITH_ZEROS else None


@needs_host
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_the_fused_path_against_mpmath(name):
    if mpmath is None:
        pytest.skip("mpmath is not installed (pip install mpmath)")
    x, value, expected, scaled = against_mpmath(name, fused)
    assert_agree(value, expected, ulps=ACCURACY[name], scale=scaled, what=name)


# --- second derivatives through tg.broadcast, against central differences
SMOOTH = {"erfinv": (-0.9, 0.9), "erfcinv": (0.1, 1.9), "ndtri": (0.05, 0.95),
          "logit": (0.05, 0.95), "entr": (0.1, 3.0), "xlogy": (0.1, 3.0),
          "xlog1py": (0.1, 3.0), "y0": (0.5, 10.0), "y1": (0.5, 10.0),
          "gamma": (0.3, 5.0), "gammaln": (0.3, 5.0), "digamma": (0.3, 5.0),
          "polygamma": (0.3, 5.0), "polygamma_2": (0.3, 5.0), "polygamma_3": (0.3, 5.0),
          "cbrt": (0.5, 3.0)}  # fmt: skip


@needs_host
@pytest.mark.parametrize("name", sorted(CASES))
def test_second_derivatives_nest_through_broadcast(name):
    f, n = CASES[name]
    lo, hi = SMOOTH.get(name, (-3.0, 3.0))
    args = [np.random.default_rng(k).uniform(lo, hi, 9) for k in range(n)]
    first = lambda *a: tg.gradient(lambda *b: tg.sum(tg.broadcast(f, *b)), *a, nest=True)[0]
    with on_host():
        second = tg.gradient(lambda *a: tg.sum(first(*a)), *args)
        for i in range(n):  # d/dx_i of the first partial, by central differences
            h = 1e-5 * np.maximum(1.0, np.abs(args[i]))
            up = [a + h if k == i else a for k, a in enumerate(args)]
            down = [a - h if k == i else a for k, a in enumerate(args)]
            numeric = (tg.data(first(*up)) - tg.data(first(*down))) / (2 * h)
            found = np.zeros_like(numeric) if second[i] is None else second[i]
            np.testing.assert_allclose(found, numeric, rtol=1e-5, atol=1e-6, err_msg=name)


# --- one node, and clear refusals
@needs_host
def test_a_scalar_function_of_special_functions_is_one_node_and_one_kernel_each_way():
    f = lambda x: S.erf(x) * 2 + S.gammaln(x)
    x = tg.param(np.linspace(0.1, 4.0, 7))
    with on_host(), recording() as log:
        y = tg.broadcast(f, x)
        assert y._node.args == (x._node,)
        tg.back(tg.sum(y))
    assert [e for e in log if e[0] == "launch"] == [("launch", "broadcast_fwd"),
                                                   ("launch", "broadcast_bwd")]  # fmt: skip
    expected = tg.gradient(lambda x: tg.sum(f(x)), tg.data(x))[0]
    terms = np.abs(S.digamma(tg.data(x))) + 2  # erf' <= 2 / sqrt(pi) each
    assert_agree(tg.grad(x), expected, ulps=4, scale=terms)


def test_functions_broadcast_does_not_fuse_are_named():
    with pytest.raises(TypeError, match=r"tg.special.betaln is not a function broadcast can fuse"):
        tg.broadcast(lambda x: S.betaln(x, 2.0), np.ones(2))
    with pytest.raises(TypeError, match="polygamma fuses orders 0 to 16"):
        tg.broadcast(lambda x: S.polygamma(17, x), np.ones(2))


def test_julia_names_trace_to_the_same_operations():
    compiled = broadcast_module._Compiled(lambda x: S.trigamma(x) + S.sind(x) + S.lgamma(x), 1)
    assert "polygamma(1.0, x0)" in repr(compiled.out) and "sinpi(" in repr(compiled.out)
    assert "gammaln(x0)" in repr(compiled.out)
    assert math.isfinite(float(tg.broadcast(lambda x: S.cbrt(x) + S.exp2(x), np.array(2.0))))


def report():
    """The largest error of the fused path and of the generic one (SciPy's values; the
    standard's sin and cos for sinpi and cospi) against mpmath, per function."""
    for name in sorted(REFERENCE):
        errors = []
        for path in (fused, generic):
            x, value, expected, scaled = against_mpmath(name, path)
            size = np.abs(expected) if scaled is None else np.abs(expected) + scaled
            finite = np.isfinite(value) & np.isfinite(expected)
            errors.append(np.max(np.abs(value - expected)[finite] / size[finite]) / 2.0**-52)
        unit = "|f| + |x f'|" if name in WITH_ZEROS else "|f|"
        print(f"{name:9} fused {errors[0]:6.2f}  generic {errors[1]:8.2f}  ulps of {unit}")


if __name__ == "__main__":  # python tests/test_special_fused.py: the figures of the README
    report()
