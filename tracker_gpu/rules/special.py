"""`tg.special`: SciPy's and `torch.special`'s special functions, differentiable.

Values come from the array's own library (`special_libraries`); each derivative is written
with this package's functions, the special ones included (`gammaln' = digamma`,
`digamma' = polygamma(1, .)`), so that it is differentiable again (`nest=True`, `jvp`). An
argument a function is not differentiable in (`polygamma`'s order, `gammainc`'s `a`, `zeta`'s
exponent) must be a constant: a tracked one is refused when the function is called. At the
edges, derivatives follow PyTorch's formulas (`xlogy`'s gradient in `x` is `log(y)`, also at
`x == 0`, and 0 there where `y <= 0`; `i1'(0) = 0.5`; `sinc'(0) = 0`).

>>> import numpy as np, tracker_gpu as tg
>>> float(tg.special.erf(np.array(0.5)))
0.5204998778130465
>>> g, = tg.gradient(lambda x: tg.sum(tg.special.gammaln(x)), np.array([1.0, 2.0]))
>>> np.round(g, 6)  # digamma(1) = -euler_gamma, digamma(2) = 1 - euler_gamma
array([-0.577216,  0.422784])
>>> tg.gradient(lambda x: tg.sum(tg.special.xlogy(x, 2.0)), np.array([0.0, 1.0]))[0]
array([0.69314718, 0.69314718])
"""

import math

from ..backend import HALF, dtype_name, namespace_of
from ..primitive import Primitive
from ..tracked import data, istracked
from .elementwise import PLAIN_FUNCTIONS as _PLAIN
from .elementwise import (
    _as_arrays,
    add,
    conjugated,
    cos,
    exp,
    is_complex,
    log,
    sign,
    square,
    where,
)
from .elementwise import abs as _abs
from .special_libraries import library_function

__all__ = (
    "erf erfc erfinv erfcinv erfcx erfi dawson gammaln gamma digamma polygamma multigammaln "
    "betaln beta gammainc gammaincc ndtr log_ndtr ndtri logit expit xlogy xlog1py entr "
    "rel_entr i0 i0e i1 i1e j0 j1 y0 y1 sinc zeta airyai airyaiprime airybi airybiprime"
).split()

SQRT_PI, SQRT_2PI = math.sqrt(math.pi), math.sqrt(2 * math.pi)


def _unary(name, vjp, saves, doc):
    """A function of one array, its value from the array's library."""

    def forward(xp, x, /):
        (x,) = _as_arrays(xp, x)
        return _half_kept(xp, library_function(name, x)(x), x)

    return Primitive(name, forward, (conjugated(vjp),), doc=doc, saves=saves)


def _half_kept(xp, value, *args):
    """`value` in the half dtype of `args` where they are all of it (SciPy has no float16
    loops and answers float32 or float64; PyTorch keeps the dtype)."""
    dtypes = {a.dtype for a in args}
    if len(dtypes) != 1 or dtype_name(args[0].dtype) not in HALF:
        return value
    return _like(xp, value, args[0])


def _binary(name, vjps, saves, doc):
    """A function of two arrays (or numbers); `None` for an argument it is not differentiable
    in (a tracked one is refused)."""

    def forward(xp, x1, x2, /):
        x1, x2 = _as_arrays(xp, x1, x2)
        return _half_kept(xp, library_function(name, x1)(x1, x2), x1, x2)

    holomorphic = tuple(None if vjp is None else conjugated(vjp) for vjp in vjps)
    rule = Primitive(name, forward, holomorphic, doc=doc, saves=saves)
    constant = [i for i, vjp in enumerate(vjps) if vjp is None]
    return rule if not constant else _constant_in(rule, constant[0])


def _constant_in(rule, i):
    """`rule`, refusing a tracked argument `i` (one it has no derivative in)."""

    def function(*args):
        if len(args) > i and istracked(args[i]):
            raise TypeError(
                f"tg.special.{rule.name} is not differentiable in its argument {i + 1}: pass "
                f"it as a constant (tg.data(x)), or use tg.stop_gradient"
            )
        return rule(*args)

    function.__name__ = function.__qualname__ = rule.name
    function.__doc__, function.__signature__ = rule.__doc__, rule.__signature__
    function.rule = rule
    return function


def _is(condition_name, x, y):
    """A plain (or, in a nested pass, tracked constant) mask: a constant of the derivative."""
    return _PLAIN[condition_name](x, y)


def _where_zero(x, at_zero, elsewhere_of):
    """`at_zero` where `x == 0`, else `elsewhere_of(x)` computed with x = 1 there."""
    zero = _is("equal", x, 0.0)
    return where(zero, at_zero, elsewhere_of(where(zero, 1.0, x)))


def _logarithm_taken(x, y, edge):
    """1.0 where the gradient of `x * log(y)` (`log1p`: `edge` -1) in `x` is the logarithm,
    else 0.0, a constant: everywhere but at `x == 0` with `y <= edge`, where the logarithm is
    -inf or nan and PyTorch's gradient is 0 (at `x == 0`, `y > edge`, it is the logarithm)."""
    taken = (data(x) != 0) | (data(y) > edge)
    return float(taken) if type(taken) is bool else where(taken, 1.0, 0.0)


# --- the error function and its relatives
_ERF = 2 / SQRT_PI
erf = _unary("erf", lambda g, ans, x: g * (exp(-square(x)) * _ERF), "x", "The error function.")
erfc = _unary(
    "erfc", lambda g, ans, x: g * (exp(-square(x)) * -_ERF), "x", "`1 - erf(x)`, accurately."
)
erfi = _unary(
    "erfi", lambda g, ans, x: g * (exp(square(x)) * _ERF), "x", "The imaginary error function."
)
erfinv = _unary(
    "erfinv", lambda g, ans, x: g * (exp(square(ans)) * (SQRT_PI / 2)), "ans",
    "The inverse of `erf`, on [-1, 1] (+-inf at +-1).",
)  # fmt: skip
erfcinv = _unary(
    "erfcinv", lambda g, ans, x: g * (exp(square(ans)) * (-SQRT_PI / 2)), "ans",
    "The inverse of `erfc`, on [0, 2].",
)  # fmt: skip
# erfcx' = 2 x erfcx - 2/sqrt(pi) and dawson' = 1 - 2 x dawson cancel for large x (all digits
# from x = 1e8; two at 10, ten in the second derivative at 50): there, their asymptotic series,
# sum over k >= 1 of (+-1)^k (2k-1)!! / (2x^2)^k, whose sixteenth term is below 1e-17 of the
# first from |x| = TAIL on
TAIL = 10.0


def _tail(x, sign):
    """`sum_{k=1..16} sign^k (2k-1)!! / (2 x^2)^k`, at |x| >= TAIL (x clamped there elsewhere,
    so that the branch not taken stays finite in a nested pass)."""
    u = 1 / (square(where(_abs(x) >= TAIL, x, TAIL)) * 2)
    term, total = 1.0, 0.0
    for k in range(1, 17):
        term = term * (u * ((2 * k - 1) * sign))
        total = total + term
    return total


erfcx = _unary(
    "erfcx",
    lambda g, ans, x: g * where(x >= TAIL, _tail(x, -1.0) * _ERF, x * ans * 2 - _ERF),
    "x ans",
    "The scaled complementary error function, `exp(x**2) * erfc(x)`.",
)
dawson = _unary(
    "dawson",
    lambda g, ans, x: g * where(_abs(x) >= TAIL, -_tail(x, 1.0), 1 - x * ans * 2),
    "x ans",
    "Dawson's integral, `exp(-x**2) * integral of exp(t**2) from 0 to x` (SciPy's `dawsn`).",
)
ndtr = _unary(
    "ndtr", lambda g, ans, x: g * (exp(square(x) * -0.5) / SQRT_2PI), "x",
    "The standard normal distribution function.",
)  # fmt: skip


def _log_ndtr_vjp(g, ans, x):
    """`g * ndtr'(x) / ndtr(x)`: below 0 as `sqrt(2/pi) / erfcx(-x / sqrt 2)`, where
    `exp(-x**2 / 2 - ans)` would subtract two huge numbers; each branch is computed where it is
    finite, so that a nested pass through the branch not taken stays finite too."""
    below = _is("less", x, 0.0)
    tail = math.sqrt(2 / math.pi) / erfcx(where(below, x, -1.0) * -math.sqrt(0.5))
    body = exp(square(where(below, 0.0, x)) * -0.5 - where(below, -math.log(2), ans))
    return g * where(below, tail, body / SQRT_2PI)


log_ndtr = _unary(
    "log_ndtr", _log_ndtr_vjp, "x ans", "The log of `ndtr`, accurate far into the lower tail."
)
ndtri = _unary(
    "ndtri", lambda g, ans, x: g * (exp(square(ans) * 0.5) * SQRT_2PI), "ans",
    "The inverse of `ndtr` (the normal quantile function), on [0, 1].",
)  # fmt: skip
logit = _unary("logit", lambda g, ans, x: g / (x * (1 - x)), "x", "`log(p / (1 - p))`, on [0, 1].")
expit = _unary(
    "expit",
    lambda g, ans, x: g * (ans * (1 - ans)),
    "ans",
    "The logistic sigmoid, `logit`'s inverse.",
)


# --- the gamma function and its relatives
gammaln = _unary(
    "gammaln", lambda g, ans, x: g * digamma(x), "x", "`log(abs(gamma(x)))`, real `x`."
)
gamma = _unary("gamma", lambda g, ans, x: g * (ans * digamma(x)), "x ans", "The gamma function.")
digamma = _unary(
    "digamma", lambda g, ans, x: g * polygamma(1, x), "x",
    "The logarithmic derivative of the gamma function (SciPy's `psi`).",
)  # fmt: skip


def _order(name, n):
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        raise TypeError(f"tg.special.{name} takes its order as a Python int >= 0, got {n!r}")
    return n


def _like(xp, value, x):
    """`value` in `x`'s dtype (SciPy's polygamma and multigammaln answer float32 in float64)."""
    return value if value.dtype == x.dtype else xp.astype(value, x.dtype)


def _polygamma_forward(xp, n, x, /):
    (x,) = _as_arrays(xp, x)
    if is_complex(x):  # SciPy's has no complex loops (nor digamma's derivative, this)
        raise TypeError(f"tg.special.polygamma takes real arrays, got {x.dtype}")
    return _like(xp, library_function("polygamma", x)(_order("polygamma", n), x), x)


_polygamma = Primitive(
    "polygamma",
    _polygamma_forward,
    (None, lambda g, ans, n, x: g * polygamma(n + 1, x)),
    saves="n x",
    doc="The `n`-th derivative of `digamma` (`n` a Python int, not differentiated).",
)
polygamma = _constant_in(_polygamma, 0)


def _multigammaln_forward(xp, a, d, /):
    (a,) = _as_arrays(xp, a)
    return _like(xp, library_function("multigammaln", a)(a, _order("multigammaln", d)), a)


def _multigammaln_vjp(g, ans, a, d):
    total = digamma(a)
    for j in range(1, d):
        total = total + digamma(a - j / 2)
    return g * total


_multigammaln = Primitive(
    "multigammaln",
    _multigammaln_forward,
    (_multigammaln_vjp, None),
    saves="a d",
    doc="The log of the multivariate gamma function of dimension `d` (a Python int, not "
    "differentiated).",
)
multigammaln = _constant_in(_multigammaln, 1)


def _digamma_difference(a, b):
    return digamma(a) - digamma(add(a, b))


betaln = _binary(
    "betaln",
    (
        lambda g, ans, a, b: g * _digamma_difference(a, b),
        lambda g, ans, a, b: g * _digamma_difference(b, a),
    ),
    "x1 x2",
    "`log(abs(beta(a, b)))`.",
)
beta = _binary(
    "beta",
    (
        lambda g, ans, a, b: g * (ans * _digamma_difference(a, b)),
        lambda g, ans, a, b: g * (ans * _digamma_difference(b, a)),
    ),
    "x1 x2 ans",
    "The beta function, `gamma(a) gamma(b) / gamma(a + b)`.",
)


def _gammainc_density(a, x):
    """`x**(a - 1) exp(-x) / gamma(a)`, the derivative of `gammainc(a, x)` in `x`: 0 at
    x = inf, where the exponent's terms are inf - inf."""
    exponent = where(x == math.inf, -math.inf, xlogy(a - 1, x) - x)
    return exp(exponent - gammaln(a))


gammainc = _binary(
    "gammainc",
    (None, lambda g, ans, a, x: g * _gammainc_density(a, x)),
    "x1 x2",
    "The regularised lower incomplete gamma function; differentiable in `x`, not in `a`.",
)
gammaincc = _binary(
    "gammaincc",
    (None, lambda g, ans, a, x: -g * _gammainc_density(a, x)),
    "x1 x2",
    "The regularised upper incomplete gamma function; differentiable in `x`, not in `a`.",
)
zeta = _binary(
    "zeta",
    (None, lambda g, ans, x, q: g * (zeta(x + 1, q) * -x)),
    "x1 x2",
    "The Hurwitz zeta function `sum((k + q)**-x for k >= 0)`; differentiable in `q`, not in "
    "the exponent `x` (as PyTorch and DiffRules).",
)


# --- logarithms of products, entropies
xlogy = _binary(
    "xlogy",
    (
        lambda g, ans, x, y: g * xlogy(_logarithm_taken(x, y, 0), y),
        lambda g, ans, x, y: g * (x / y),  # not (g * x) / y: a tangent over a tiny y overflows
    ),
    "x1 x2",
    "`x * log(y)`, and 0 where `x == 0`; the gradient in `x` is `log(y)`, 0 where `x == 0` "
    "and `y <= 0` (as PyTorch).",
)
xlog1py = _binary(
    "xlog1py",
    (
        lambda g, ans, x, y: g * xlog1py(_logarithm_taken(x, y, -1), y),
        lambda g, ans, x, y: g * x / (y + 1),
    ),
    "x1 x2",
    "`x * log1p(y)`, and 0 where `x == 0`; the gradient in `x` is `log1p(y)`, 0 where "
    "`x == 0` and `y <= -1` (as PyTorch).",
)
entr = _unary("entr", lambda g, ans, x: g * -(log(x) + 1), "x", "`-x log(x)`: 0 at 0, -inf below.")
rel_entr = _binary(
    "rel_entr",
    (
        lambda g, ans, x, y: g * (log(x) - log(y) + 1),
        lambda g, ans, x, y: -g * (x / y),
    ),
    "x1 x2",
    "`x log(x / y)` for positive `x`, `y`; 0 where `x == 0 <= y`; inf elsewhere.",
)


# --- Bessel functions
def _over_x_vjp(pair, half):
    """The vjp of `f` with `f' = pair(x) - f / x` (`half` at 0: i1, j1, y1)."""

    def vjp(g, ans, x):
        if half is None:
            return g * (pair(x) - ans / x)
        return g * _where_zero(x, half, lambda x: pair(x) - ans / x)

    return vjp


i0 = _unary("i0", lambda g, ans, x: g * i1(x), "x", "The modified Bessel function I0.")
i1 = _unary("i1", _over_x_vjp(lambda x: i0(x), 0.5), "x ans", "The modified Bessel function I1.")
i0e = _unary(
    "i0e", lambda g, ans, x: g * (i1e(x) - sign(x) * ans), "x ans", "`exp(-abs(x)) * i0(x)`."
)
i1e = _unary(
    "i1e",
    _over_x_vjp(lambda x: i0e(x) - sign(x) * i1e(x), 0.5),
    "x ans",
    "`exp(-abs(x)) * i1(x)`.",
)
j0 = _unary("j0", lambda g, ans, x: -g * j1(x), "x", "The Bessel function of the first kind J0.")
j1 = _unary("j1", _over_x_vjp(lambda x: j0(x), 0.5), "x ans", "The Bessel function J1.")
y0 = _unary("y0", lambda g, ans, x: -g * y1(x), "x", "The Bessel function of the second kind Y0.")
y1 = _unary("y1", _over_x_vjp(lambda x: y0(x), None), "x ans", "The Bessel function Y1.")
# sinc'(x) = (cos(pi x) - sinc(x)) / x, whose terms cancel near 0 (at 1e-4 in float32 80% of
# it is rounding). There it is the Taylor series pi^2 x sum_n (-1)^n 2n u^(n-1) / (2n+1)! in
# u = (pi x)^2, out to where the two agree within a few ulps: 9 terms below |x| = 0.3 in
# float64, 6 below 0.4 in float32 (and narrower floats).
_SINC_SERIES = [(-1) ** n * 2 * n / math.factorial(2 * n + 1) for n in range(1, 10)]


def _sinc_vjp(g, ans, x):
    double = namespace_of(data(x)).finfo(x.dtype).eps < 1e-10
    switch, terms = (0.3, 9) if double else (0.4, 6)
    near = _is("less", _abs(x), switch)
    series = _sinc_slope_series(where(near, x, 0.0), terms)  # each branch finite everywhere
    far = where(near, 1.0, x)
    return g * where(near, series, (cos(far * math.pi) - ans) / far)


def _sinc_slope_series(x, terms):
    u = square(x * math.pi)
    total = _SINC_SERIES[terms - 1]
    for c in reversed(_SINC_SERIES[: terms - 1]):
        total = total * u + c
    return total * (x * math.pi**2)


sinc = _unary("sinc", _sinc_vjp, "x ans", "The normalised sinc, `sin(pi x) / (pi x)` (1 at 0).")

# --- Airy functions (SciPy's and CuPy's `airy`): Ai'' = x Ai, Bi'' = x Bi
airyai = _unary("airyai", lambda g, ans, x: g * airyaiprime(x), "x", "The Airy function Ai.")
airyaiprime = _unary(
    "airyaiprime", lambda g, ans, x: g * (x * airyai(x)), "x", "The derivative of `airyai`."
)
airybi = _unary("airybi", lambda g, ans, x: g * airybiprime(x), "x", "The Airy function Bi.")
airybiprime = _unary(
    "airybiprime", lambda g, ans, x: g * (x * airybi(x)), "x", "The derivative of `airybi`."
)
