"""`tg.special` under Julia's names: the rest of DiffRules' table, so that Tracker code ports
line by line.

The elementary ones (`sec`, `acoth`, `sind`, `sinpi`, `cbrt`, `exp2`, ...) are computed with the
standard's functions, so they run on every backend; `sinpi`/`cospi` and the degree functions are
exact at the multiples of a half turn and of a quarter turn (`sind(180) == 0`, `cospi(0.5) ==
0`). SpecialFunctions' names are SciPy's functions (`lgamma` is `gammaln`, `besselj0` is `j0`),
and `invdigamma` is the inverse of the library's `digamma`, found by Newton's method.

>>> import numpy as np, tracker_gpu as tg
>>> float(tg.special.sind(np.array(180.0))), float(tg.special.cospi(np.array(0.5)))
(0.0, 0.0)
>>> tg.gradient(lambda x: tg.sum(tg.special.sec(x)), np.array([0.0]))[0]
array([0.])
"""

import math

from ..primitive import Primitive
from . import special
from .elementwise import _as_arrays, abs, cos, expm1, is_complex, log, sin, sinh, sqrt, tanh
from .nn import sigmoid

__all__ = (
    "sec csc cot asec acsc acot sech csch coth asech acsch acoth sinpi cospi sind cosd tand "
    "secd cscd cotd asind acosd atand asecd acscd acotd cbrt exp2 exp10 deg2rad rad2deg abs2 "
    "inv xlogx logistic log1pexp log1mexp lgamma loggamma lbeta logbeta trigamma invdigamma "
    "besselj0 besselj1 bessely0 bessely1"
).split()

DEG = math.pi / 180


def _traced(xp, name):
    """`name` as an operation of `tg.broadcast`'s traced values (their namespace provides
    `special_function`), or None for an array library."""
    provider = getattr(xp, "special_function", None)
    return None if provider is None else provider(name)


def _sinpi(xp, x):
    traced = _traced(xp, "sinpi")
    if traced is not None:
        return traced(x)
    return _sin_half_turn(xp, _half_turns(xp, x))


def _cospi(xp, x):
    traced = _traced(xp, "cospi")
    if traced is not None:
        return traced(x)
    # cos(pi r) = sin(pi (1/2 - |r|)); 1/2 - |r| is exact for |r| >= 1/4 (Sterbenz), and
    # below its rounding is at most half an ulp of 1/2, against a cosine near 1
    return _sin_half_turn(xp, 0.5 - xp.abs(_half_turns(xp, x)))


def _half_turns(xp, x):
    """`x` reduced exactly to `[-1, 1]` modulo 2 (`x - 2 round(x / 2)`)."""
    return x - xp.round(x * 0.5) * 2


def _sin_half_turn(xp, r):
    """`sin(pi r)` for `r` in `[-1, 1]`, folded exactly into `[-1/2, 1/2]` (sin(pi - a) =
    sin(a)) so that the rounding of `pi r` stays relative to the result: near a whole turn,
    `sin(pi r)` computed directly loses every digit (hundreds of ulps). Zeros at the whole
    turns are +0 or -0 as `r` is."""
    folded = xp.where(r > 0.5, 1.0 - r, xp.where(r < -0.5, -1.0 - r, r))
    return xp.sin(folded * math.pi)


def _cbrt(xp, x):
    native = getattr(xp, "cbrt", None)  # NumPy's, CuPy's and Dask's; PyTorch has none
    return native(x) if native is not None else xp.sign(x) * xp.abs(x) ** (1 / 3)


def _exp2(xp, x):
    native = getattr(xp, "exp2", None)
    return native(x) if native is not None else xp.pow(xp.full_like(x, 2.0), x)


def _rule(name):
    """The rule `name` of the table below (its vjps call each other)."""
    return RULES[name]


# name: (forward(xp, x), vjp(g, ans, x), what the vjp reads, doc)
ELEMENTARY = {
    "sec": (lambda xp, x: 1 / xp.cos(x), lambda g, ans, x: g * (ans * ans * sin(x)), "x ans",
            "`1 / cos(x)`."),
    "csc": (lambda xp, x: 1 / xp.sin(x), lambda g, ans, x: -g * (ans * ans * cos(x)), "x ans",
            "`1 / sin(x)`."),
    "cot": (lambda xp, x: 1 / xp.tan(x), lambda g, ans, x: -g * (ans * ans + 1), "ans",
            "`1 / tan(x)`."),
    "asec": (lambda xp, x: xp.acos(1 / x), lambda g, ans, x: g / (abs(x) * sqrt(x * x - 1)),
             "x", "`acos(1 / x)`."),
    "acsc": (lambda xp, x: xp.asin(1 / x), lambda g, ans, x: -g / (abs(x) * sqrt(x * x - 1)),
             "x", "`asin(1 / x)`."),
    "acot": (lambda xp, x: xp.atan(1 / x), lambda g, ans, x: -g / (x * x + 1), "x",
             "`atan(1 / x)` (pi/2 at +0)."),
    "sech": (lambda xp, x: 1 / xp.cosh(x), lambda g, ans, x: -g * (ans * tanh(x)), "x ans",
             "`1 / cosh(x)`."),
    # -csch coth and -csch^2: csch^2 cosh underflows times overflows (0 * inf), 1 - coth^2
    # cancels, beyond x = 5
    "csch": (lambda xp, x: 1 / xp.sinh(x), lambda g, ans, x: -g * (ans / tanh(x)), "x ans",
             "`1 / sinh(x)`."),
    "coth": (lambda xp, x: 1 / xp.tanh(x), lambda g, ans, x: -g * _csch_squared(x), "x",
             "`1 / tanh(x)`."),
    "asech": (lambda xp, x: xp.acosh(1 / x), lambda g, ans, x: -g / (x * sqrt(1 - x * x)), "x",
              "`acosh(1 / x)`, on (0, 1]."),
    "acsch": (lambda xp, x: xp.asinh(1 / x), lambda g, ans, x: -g / (abs(x) * sqrt(x * x + 1)),
              "x", "`asinh(1 / x)`."),
    "acoth": (lambda xp, x: xp.atanh(1 / x), lambda g, ans, x: g / (1 - x * x), "x",
              "`atanh(1 / x)`, for `abs(x) > 1`."),
    "sinpi": (_sinpi, lambda g, ans, x: g * (_rule("cospi")(x) * math.pi), "x", "`sin(pi x)`."),
    "cospi": (_cospi, lambda g, ans, x: g * (_rule("sinpi")(x) * -math.pi), "x", "`cos(pi x)`."),
    "sind": (lambda xp, x: _sinpi(xp, x / 180), lambda g, ans, x: g * (_rule("cosd")(x) * DEG),
             "x", "The sine of `x` degrees."),
    "cosd": (lambda xp, x: _cospi(xp, x / 180), lambda g, ans, x: g * (_rule("sind")(x) * -DEG),
             "x", "The cosine of `x` degrees."),
    "tand": (lambda xp, x: _sinpi(xp, x / 180) / _cospi(xp, x / 180),
             lambda g, ans, x: g * ((ans * ans + 1) * DEG), "ans", "The tangent of `x` degrees."),
    "secd": (lambda xp, x: 1 / _cospi(xp, x / 180),
             lambda g, ans, x: g * (ans * _rule("tand")(x) * DEG), "x ans", "`1 / cosd(x)`."),
    "cscd": (lambda xp, x: 1 / _sinpi(xp, x / 180),
             lambda g, ans, x: -g * (ans * _rule("cotd")(x) * DEG), "x ans", "`1 / sind(x)`."),
    "cotd": (lambda xp, x: _cospi(xp, x / 180) / _sinpi(xp, x / 180),
             lambda g, ans, x: -g * ((ans * ans + 1) * DEG), "ans", "`1 / tand(x)`."),
    "asind": (lambda xp, x: xp.asin(x) / DEG, lambda g, ans, x: g / (sqrt(1 - x * x) * DEG), "x",
              "`asin(x)` in degrees."),
    "acosd": (lambda xp, x: xp.acos(x) / DEG, lambda g, ans, x: -g / (sqrt(1 - x * x) * DEG),
              "x", "`acos(x)` in degrees."),
    "atand": (lambda xp, x: xp.atan(x) / DEG, lambda g, ans, x: g / ((x * x + 1) * DEG), "x",
              "`atan(x)` in degrees."),
    "asecd": (lambda xp, x: xp.acos(1 / x) / DEG,
              lambda g, ans, x: g / (abs(x) * sqrt(x * x - 1) * DEG), "x",
              "`asec(x)` in degrees."),
    "acscd": (lambda xp, x: xp.asin(1 / x) / DEG,
              lambda g, ans, x: -g / (abs(x) * sqrt(x * x - 1) * DEG), "x",
              "`acsc(x)` in degrees."),
    "acotd": (lambda xp, x: xp.atan(1 / x) / DEG, lambda g, ans, x: -g / ((x * x + 1) * DEG), "x",
              "`acot(x)` in degrees."),
    "cbrt": (_cbrt, lambda g, ans, x: g / (ans * ans * 3), "ans", "The real cube root."),
    "exp2": (_exp2, lambda g, ans, x: g * (ans * math.log(2)), "ans", "`2**x`."),
    "exp10": (lambda xp, x: xp.pow(xp.full_like(x, 10.0), x),
              lambda g, ans, x: g * (ans * math.log(10)), "ans", "`10**x`."),
    "deg2rad": (lambda xp, x: x * DEG, lambda g, ans, x: g * DEG, "", "Degrees to radians."),
    "rad2deg": (lambda xp, x: x / DEG, lambda g, ans, x: g / DEG, "", "Radians to degrees."),
    "abs2": (lambda xp, x: x * x, lambda g, ans, x: g * (x * 2), "x", "`x**2` (real `x`)."),
    "inv": (lambda xp, x: 1 / x, lambda g, ans, x: -g * (ans * ans), "ans", "`1 / x`."),
    "xlogx": (lambda xp, x: special.xlogy(x, x), lambda g, ans, x: g * (log(x) + 1), "x",
              "`x log(x)`, 0 at 0."),
    "log1pexp": (lambda xp, x: xp.logaddexp(xp.zeros_like(x), x),
                 lambda g, ans, x: g * sigmoid(x), "x", "`log(1 + exp(x))`, without overflow."),
    "log1mexp": (lambda xp, x: xp.where(x < -math.log(2), xp.log1p(-xp.exp(x)),
                                        xp.log(-xp.expm1(x))),
                 lambda g, ans, x: g / -expm1(-x), "x", "`log(1 - exp(x))`, for `x < 0`."),
}  # fmt: skip


def _csch_squared(x):
    c = 1 / sinh(x)
    return c * c


def _elementary(name, forward, vjp, saves, doc):
    def forward_of_arrays(xp, x, /):
        (x,) = _as_arrays(xp, x)
        if is_complex(x):  # their forwards reduce half turns and square as reals do, and
            raise TypeError(  # their derivatives are not conjugated
                f"tg.special.{name} takes real arrays, got {x.dtype}; for complex values, write "
                "it with the namespace's functions (tg.cos, tg.sin, tg.tanh, tg.abs, ...)"
            )
        return forward(xp, x)

    return Primitive(name, forward_of_arrays, (vjp,), doc=doc, saves=saves)


RULES = {name: _elementary(name, *entry) for name, entry in ELEMENTARY.items()}
globals().update(RULES)

# SpecialFunctions' names of SciPy's functions
lgamma = loggamma = special.gammaln
lbeta = logbeta = special.betaln
besselj0, besselj1, bessely0, bessely1 = special.j0, special.j1, special.y0, special.y1
logistic = special.expit


def trigamma(x, /):
    """The derivative of `digamma`, `polygamma(1, x)`."""
    return special.polygamma(1, x)


def _invdigamma_forward(xp, y, /):
    """Newton's method on the library's `digamma`, from Minka's start (as SpecialFunctions)."""
    (y,) = _as_arrays(xp, y)
    digamma = special.digamma
    start = xp.where(y >= -2.22, xp.exp(y) + 0.5, -1 / (y - digamma(xp.ones_like(y))))
    x = start
    for _ in range(6):
        x = x - (digamma(x) - y) / special.polygamma(1, x)
    return xp.where(xp.isinf(start), start, x)  # beyond y = 709.8: inf, not Newton's inf - inf


invdigamma = Primitive(
    "invdigamma",
    _invdigamma_forward,
    (lambda g, ans, y: g / trigamma(ans),),
    saves="ans",
    doc="The inverse of `digamma` on the positive reals (SpecialFunctions' `invdigamma`).",
)
