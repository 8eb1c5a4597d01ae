"""`tg.special`: every function of `tg.special.__all__`, on the backend under test, against SciPy
in float64 on grids that include the edges (zeros, poles, +-1 of erfinv, inf, nan; where the
library's own value differs there, against the library's plain call), and its first and second
derivatives against central finite differences. A function the backend's library
lacks skips, saying which function and which library."""

import importlib
import math

import numpy as np
import pytest
from helpers import check, check_nested, numpy_of, on_backend, uniform

import tracker_gpu as tg
from tracker_gpu.rules import special_julia, special_libraries

sp = pytest.importorskip("scipy.special", reason="SciPy gives the reference values")
optimize = pytest.importorskip("scipy.optimize", reason="SciPy gives the reference values")

INF, NAN = math.inf, math.nan
NONZERO = ((-3.0, -0.3), (0.3, 3.0))
BEYOND_ONE = ((-3.0, -1.2), (1.2, 3.0))
GAMMA_DOMAIN = ((-0.8, -0.2), (0.5, 3.0))  # negative non-integers too
COMMON = [0.0, -0.0, 1e-300, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, 40.0, -40.0, INF, -INF, NAN]


def _invdigamma(y):
    y = np.asarray(y, dtype=float)
    roots = [optimize.brentq(lambda x, t=t: sp.psi(x) - t, 1e-12, 1e12, xtol=1e-300, rtol=1e-15)
             for t in y.ravel()]  # fmt: skip
    return np.reshape(roots, y.shape)


def _log1mexp(x):
    return np.where(x < -np.log(2), np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


def unary(ref, domain, edges=COMMON, **kw):
    return dict(ref=ref, domains=(domain,), edges=[(e,) for e in edges], **kw)


def binary(ref, domains, edges, constant=None, **kw):
    return dict(ref=ref, domains=domains, edges=edges, constant=constant, **kw)


PAIRS = [(0.0, 0.0), (0.0, 2.0), (1.0, 0.0), (2.0, 0.5), (0.5, 3.0), (-1.0, 2.0), (3.0, INF)]
PAIRS += [(INF, 2.0), (NAN, 1.0), (1.0, NAN), (1e-300, 1e300)]

SPECS = {
    "erf": unary(sp.erf, (-2.0, 2.0)),
    "erfc": unary(sp.erfc, (-2.0, 2.0), COMMON + [27.0, 30.0]),
    "erfi": unary(sp.erfi, (-1.5, 1.5)),
    "dawson": unary(sp.dawsn, (-2.0, 2.0), COMMON + [1e5]),
    "erfinv": unary(sp.erfinv, (-0.9, 0.9), [-1.0, 1.0, 0.0, 0.5, -0.999999, 2.0, NAN]),
    "erfcinv": unary(sp.erfcinv, (0.1, 1.9), [0.0, 2.0, 1.0, 1e-300, 1.5, 3.0, NAN]),
    "erfcx": unary(sp.erfcx, (-1.0, 3.0), COMMON + [1e5, -30.0]),
    "ndtr": unary(sp.ndtr, (-3.0, 3.0)),
    "log_ndtr": unary(sp.log_ndtr, (-5.0, 3.0), COMMON + [-1e5]),
    "ndtri": unary(sp.ndtri, (0.05, 0.95), [0.0, 1.0, 0.5, 1e-300, 0.975, 2.0, NAN]),
    "logit": unary(sp.logit, (0.05, 0.95), [0.0, 1.0, 0.5, 1e-300, 2.0, -1.0, NAN]),
    "expit": unary(sp.expit, (-3.0, 3.0), COMMON + [800.0, -800.0]),
    "gammaln": unary(sp.gammaln, GAMMA_DOMAIN, COMMON + [-2.5, -1.0, 171.0, 1e10]),
    "gamma": unary(sp.gamma, GAMMA_DOMAIN, [0.5, -2.5, 1.0, 5.0, 171.5, 1e-300, INF, NAN]),
    "digamma": unary(sp.psi, GAMMA_DOMAIN, [0.5, -2.5, 1.0, 1e-300, 1e10, INF, NAN]),
    "polygamma": unary(lambda x: sp.polygamma(2, x), (0.5, 3.0), [0.5, -2.5, 3.0, 1e5, NAN],
                       call=lambda s, x: s.polygamma(2, x)),
    "multigammaln": unary(lambda a: sp.multigammaln(a, 3), (2.0, 4.0), [1.5, 2.0, 10.0, 1e5],
                          call=lambda s, a: s.multigammaln(a, 3)),
    "betaln": binary(sp.betaln, ((0.5, 3.0), (0.5, 3.0)), [(0.5, 0.5), (1.0, 1e5), (3.0, 1e-300)]),
    "beta": binary(sp.beta, ((0.5, 3.0), (0.5, 3.0)), [(0.5, 0.5), (1.0, 100.0), (3.0, 2.0)]),
    "gammainc": binary(sp.gammainc, ((0.5, 3.0), (0.5, 3.0)), PAIRS, constant=0),
    "gammaincc": binary(sp.gammaincc, ((0.5, 3.0), (0.5, 3.0)), PAIRS, constant=0),
    "zeta": binary(sp.zeta, ((2.0, 4.0), (0.5, 3.0)),
                   [(2.0, 1.0), (3.0, 0.5), (1.0, 1.0), (2.0, INF), (4.0, 1e5)], constant=0),
    "xlogy": binary(sp.xlogy, ((-2.0, 2.0), (0.5, 3.0)), PAIRS),
    "xlog1py": binary(sp.xlog1py, ((-2.0, 2.0), (-0.5, 2.0)), PAIRS + [(1.0, -1.0)]),
    "rel_entr": binary(sp.rel_entr, ((0.1, 3.0), (0.1, 3.0)), PAIRS),
    "entr": unary(sp.entr, (0.1, 3.0)),
    "i0": unary(sp.i0, (-3.0, 3.0), COMMON + [700.0]),
    "i0e": unary(sp.i0e, NONZERO, COMMON + [1e5]),
    "i1": unary(sp.i1, (-3.0, 3.0), COMMON + [700.0]),
    "i1e": unary(sp.i1e, NONZERO, COMMON + [1e5]),
    "j0": unary(sp.j0, (-5.0, 5.0), COMMON + [1e5]),
    "j1": unary(sp.j1, (-5.0, 5.0), COMMON + [1e5]),
    "y0": unary(sp.y0, (0.5, 5.0), [0.0, 0.5, 1.0, 1e5, -1.0, INF, NAN]),
    "y1": unary(sp.y1, (0.5, 5.0), [0.0, 0.5, 1.0, 1e5, -1.0, INF, NAN]),
    # sinc's zeros, the integers, are rounding errors of sin(pi x) in NumPy and PyTorch (4e-17
    # at 1), exact in CuPy (sinpi)
    "sinc": unary(np.sinc, (-2.0, 2.0), COMMON + [1e5], atol=1e-15),
    "airyai": unary(lambda x: sp.airy(x)[0], (-2.0, 2.0), COMMON[:-3]),
    "airyaiprime": unary(lambda x: sp.airy(x)[1], (-2.0, 2.0), COMMON[:-3]),
    "airybi": unary(lambda x: sp.airy(x)[2], (-2.0, 2.0), COMMON[:-3]),
    "airybiprime": unary(lambda x: sp.airy(x)[3], (-2.0, 2.0), COMMON[:-3]),
    # Julia's (DiffRules') names
    "sec": unary(lambda x: 1 / np.cos(x), (-1.0, 1.0)),
    "csc": unary(lambda x: 1 / np.sin(x), (0.3, 2.5)),
    "cot": unary(lambda x: 1 / np.tan(x), (0.3, 2.5)),
    "asec": unary(lambda x: np.arccos(1 / x), BEYOND_ONE),
    "acsc": unary(lambda x: np.arcsin(1 / x), BEYOND_ONE),
    "acot": unary(lambda x: np.arctan(1 / x), NONZERO),
    "sech": unary(lambda x: 1 / np.cosh(x), (-2.0, 2.0)),
    "csch": unary(lambda x: 1 / np.sinh(x), NONZERO),
    "coth": unary(lambda x: 1 / np.tanh(x), NONZERO),
    "asech": unary(lambda x: np.arccosh(1 / x), (0.2, 0.9)),
    "acsch": unary(lambda x: np.arcsinh(1 / x), NONZERO),
    "acoth": unary(lambda x: np.arctanh(1 / x), BEYOND_ONE),
    "sinpi": unary(lambda x: np.sin(np.pi * np.remainder(x, 2)), (-2.0, 2.0),
                   [1.0, 2.0, -3.0, 0.5, 1e17], atol=1e-15),
    "cospi": unary(lambda x: np.cos(np.pi * np.remainder(x, 2)), (-2.0, 2.0),
                   [0.5, 1.5, -2.5, 1.0, 1e17], atol=1e-15),
    "sind": unary(sp.sindg, (-400.0, 400.0), [0.0, 90.0, 180.0, -270.0, 360.0, 45.0, NAN]),
    "cosd": unary(sp.cosdg, (-400.0, 400.0), [0.0, 90.0, 180.0, -270.0, 360.0, 45.0, NAN]),
    "tand": unary(sp.tandg, (-80.0, 80.0), [0.0, 45.0, 180.0, -135.0, 30.0]),
    "secd": unary(lambda x: 1 / sp.cosdg(x), (-80.0, 80.0), [0.0, 180.0, 60.0]),
    "cscd": unary(lambda x: 1 / sp.sindg(x), (10.0, 170.0), [90.0, -90.0, 30.0]),
    "cotd": unary(sp.cotdg, (10.0, 170.0), [45.0, 90.0, -135.0, 30.0]),
    "asind": unary(lambda x: np.degrees(np.arcsin(x)), (-0.9, 0.9), [0.0, 1.0, -1.0, 0.5]),
    "acosd": unary(lambda x: np.degrees(np.arccos(x)), (-0.9, 0.9), [0.0, 1.0, -1.0, 0.5]),
    "atand": unary(lambda x: np.degrees(np.arctan(x)), (-3.0, 3.0)),
    "asecd": unary(lambda x: np.degrees(np.arccos(1 / x)), BEYOND_ONE, [1.0, -1.0, 2.0, INF]),
    "acscd": unary(lambda x: np.degrees(np.arcsin(1 / x)), BEYOND_ONE, [1.0, -1.0, 2.0, INF]),
    "acotd": unary(lambda x: np.degrees(np.arctan(1 / x)), NONZERO),
    "cbrt": unary(np.cbrt, NONZERO, COMMON + [27.0, -8.0]),
    "exp2": unary(np.exp2, (-2.0, 2.0), COMMON + [1100.0]),
    "exp10": unary(sp.exp10, (-2.0, 2.0), [0.0, 1.0, -2.0, 0.5, 400.0, -INF, NAN]),
    "deg2rad": unary(np.deg2rad, (-400.0, 400.0)),
    "rad2deg": unary(np.rad2deg, (-4.0, 4.0)),
    "abs2": unary(np.square, (-2.0, 2.0)),
    "inv": unary(lambda x: 1 / x, NONZERO, [1.0, -2.0, 0.5, INF, NAN]),
    "xlogx": unary(lambda x: sp.xlogy(x, x), (0.1, 3.0), [0.0, 1.0, 0.5, 3.0, INF, NAN]),
    "logistic": unary(sp.expit, (-3.0, 3.0)),
    "log1pexp": unary(lambda x: np.logaddexp(0, x), (-3.0, 3.0), COMMON[2:] + [800.0]),
    "log1mexp": unary(_log1mexp, (-3.0, -0.1), [-1e-300, -0.5, -1.0, -50.0]),
    "lgamma": unary(sp.gammaln, (0.5, 3.0), [0.5, 1.0, 171.0]),
    "loggamma": unary(sp.gammaln, (0.5, 3.0), [0.5, 1.0, 171.0]),
    "lbeta": binary(sp.betaln, ((0.5, 3.0), (0.5, 3.0)), [(0.5, 0.5), (1.0, 1e5)]),
    "logbeta": binary(sp.betaln, ((0.5, 3.0), (0.5, 3.0)), [(0.5, 0.5), (1.0, 1e5)]),
    "trigamma": unary(lambda x: sp.polygamma(1, x), (0.5, 3.0), [0.5, 1.0, 1e5, -2.5]),
    "invdigamma": unary(_invdigamma, (-3.0, 3.0), [-10.0, -0.5, 0.0, 1.0, 20.0], rtol=1e-9),
    "besselj0": unary(sp.j0, (-5.0, 5.0), [0.0, 1.0, -30.0]),
    "besselj1": unary(sp.j1, (-5.0, 5.0), [0.0, 1.0, -30.0]),
    "bessely0": unary(sp.y0, (0.5, 5.0), [0.5, 1.0, 30.0]),
    "bessely1": unary(sp.y1, (0.5, 5.0), [0.5, 1.0, 30.0]),
}  # fmt: skip

# Values are the array's own library's. Where a library is less accurate than SciPy in float64:
# PyTorch's Bessel functions and polygamma (through zeta) to about 1e-9 (absolute, near their
# zeros); CuPy's j0-y1 (CUDA's) to about 1e-11 beyond |x| = 8.
BESSEL = {"j0", "j1", "y0", "y1", "besselj0", "besselj1", "bessely0", "bessely1"}
LESS_ACCURATE = {
    "torch": (BESSEL | {"trigamma", "polygamma", "digamma"}, 1e-8),
    "cupy": (BESSEL, 1e-10),
}
# Edges where a library's value is its own convention, or its own error, not SciPy's: there the
# value is checked against the library's plain call. PyTorch: log|gamma(-inf)| is +inf (-inf in
# SciPy), zeta(x, inf) nan (0). CuPy: j0-y1 are 0 at +-inf and i0, i1 +-inf (the limits, CUDA's;
# nan in SciPy); i0e and i1e, computed as exp(-|x|) * i0(x), are nan where i0 overflows (SciPy:
# finite, 0 at inf); sinc(nan) is 1; rel_entr is x * log(x / y), -inf where x / y underflows.
INFINITIES = [(INF,), (-INF,)]
LIBRARY_EDGES = {
    "torch": {"gammaln": [(-INF,)], "zeta": [(2.0, INF)]},
    "cupy": {
        **dict.fromkeys(["i0", "i1", "j0", "j1"], INFINITIES),
        **dict.fromkeys(["y0", "y1"], [(INF,)]),
        **dict.fromkeys(["i0e", "i1e"], INFINITIES + [(1e5,)]),
        "sinc": [(NAN,)],
        "rel_entr": [(1e-300, 1e300)],
    },
}
LIBRARIES = {"torch": "torch.special", "cupy": "cupyx.scipy.special"}

NAMES = sorted(tg.special.__all__)


def test_every_function_has_a_spec():
    assert sorted(SPECS) == NAMES


def _call(name):
    spec = SPECS[name]
    call = spec.get("call")
    function = getattr(tg.special, name)
    return (lambda *a: call(tg.special, *a)) if call else function


def _available(name, run):
    """`run()`, skipping where the backend's library lacks the function (its error names the
    function and the library)."""
    try:
        return run()
    except NotImplementedError as e:
        pytest.skip(str(e))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", NAMES)
def test_values_at_the_edges(backend, name):
    spec = SPECS[name]
    rtol, atol = spec.get("rtol", 1e-12), spec.get("atol", 1e-300)
    less_accurate, tolerance = LESS_ACCURATE.get(backend.name, ((), None))
    if name in less_accurate:
        rtol, atol = tolerance, tolerance
    edges = spec["edges"]
    columns = [np.array(c, dtype=float) for c in zip(*edges)]
    grid = [np.concatenate([c, uniform((7,), d, seed=3 + i)]) for i, (c, d) in
            enumerate(zip(columns, spec["domains"]))]  # fmt: skip
    with np.errstate(all="ignore"):
        expected = spec["ref"](*grid)
    xs = [on_backend(backend, g) for g in grid]
    got = _available(name, lambda: _call(name)(*xs))
    own = LIBRARY_EDGES.get(backend.name, {}).get(name, [])
    theirs = np.array([e in own for e in edges] + [False] * (len(grid[0]) - len(edges)))
    if theirs.any():
        expected = np.where(theirs, _plain(backend, name, xs), expected)
    np.testing.assert_allclose(
        numpy_of(backend, got), expected, rtol=rtol, atol=atol,
        equal_nan=True,
    )  # fmt: skip


def _plain(backend, name, xs):
    """The value of the backend's library's own function `name`, called directly."""
    return numpy_of(backend, getattr(importlib.import_module(LIBRARIES[backend.name]), name)(*xs))


def _inputs(backend, name, shape=(5,)):
    spec = SPECS[name]
    xs = [on_backend(backend, uniform(shape, d, seed=11 + i)) for i, d in
          enumerate(spec["domains"])]  # fmt: skip
    constant = spec.get("constant")
    if constant is None:
        return _call(name), xs
    fixed = xs.pop(constant)
    f = _call(name)
    if constant == 0:
        return (lambda y: f(fixed, y)), xs
    return (lambda x: f(x, fixed)), xs


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", NAMES)
def test_first_derivative(backend, name):
    f, xs = _inputs(backend, name)
    _available(name, lambda: check(backend, f, *xs))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", NAMES)
def test_second_derivative(backend, name):
    f, xs = _inputs(backend, name, shape=(3,))
    _available(name, lambda: check_nested(backend, f, *xs, rtol=1e-4, atol=1e-4))


def test_jvp_of_a_special_function():
    x = np.array([0.5, 1.5])
    _, tangent = tg.jvp(tg.special.gammaln, (x,), (np.ones(2),))
    np.testing.assert_allclose(tangent, sp.psi(x), rtol=1e-12)


@pytest.mark.parametrize(
    "call",
    [lambda x: tg.special.zeta(x, 2.0), lambda x: tg.special.gammainc(x, 1.0)],
    ids=["zeta", "gammainc"],
)
def test_a_tracked_argument_without_a_derivative_is_refused(call):
    with pytest.raises(TypeError, match="not differentiable in its argument 1"):
        call(tg.param(np.array([3.0])))


def test_polygamma_takes_an_int_order():
    with pytest.raises(TypeError, match="Python int"):
        tg.special.polygamma(1.5, np.array([1.0]))


def test_the_order_reaches_the_library_as_an_array(monkeypatch):
    """CuPy's `polygamma` compares its order with 0 elementwise, which a Python int cannot do
    (`cupy.where` got a bool and failed every derivative of the gamma functions): a SciPy
    doing the same stands in for it."""
    scipy_polygamma = sp.polygamma

    def elementwise_order(n, x):
        (n == 0).astype(bool)
        return scipy_polygamma(n, x)

    monkeypatch.setattr(special_libraries, "_CACHE", {})
    monkeypatch.setattr(sp, "polygamma", elementwise_order)
    np.testing.assert_allclose(tg.special.trigamma(np.array([1.0])), [math.pi**2 / 6], rtol=1e-14)


def test_python_numbers_give_python_numbers():
    assert tg.special.erf(0.5) == pytest.approx(sp.erf(0.5), rel=1e-15)
    assert isinstance(tg.special.xlogy(2.0, 3.0), float)


def test_a_library_without_special_functions_is_named():
    xs = pytest.importorskip("array_api_strict")
    with pytest.raises(NotImplementedError, match="erf: array-api-strict has no special"):
        tg.special.erf(tg.param(xs.asarray([0.5])))
    tg.special.sinpi(tg.param(xs.asarray([0.5])))  # the elementary ones run anywhere


def test_pytorch_lacks_a_function_by_name():
    torch = pytest.importorskip("torch")
    with pytest.raises(NotImplementedError, match="erfcinv: PyTorch"):
        tg.special.erfcinv(torch.tensor([0.5], dtype=torch.float64))


@pytest.mark.parametrize("name", ["sinpi", "cospi"])
def test_half_turns_are_accurate_near_every_whole_turn(name):
    """Within 2 ulps of mpmath, also where `sin(pi x)` computed directly loses its digits
    (next to the zeros at whole and half turns: 427 ulps before the exact folding)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    rng = np.random.default_rng(7)
    near = np.round(rng.uniform(-40, 40, 400)) * 0.5 + rng.uniform(-1e-3, 1e-3, 400)
    xs = np.concatenate([near, rng.uniform(-1e6, 1e6, 200), np.arange(-4, 4.25, 0.25)])
    got = np.asarray(getattr(tg.special, name)(xs))
    exact = getattr(mpmath, name)
    for x, value in zip(xs, got):
        reference = float(exact(mpmath.mpf(float(x))))
        assert abs(value - reference) <= 2 * np.spacing(abs(reference)), (x, value, reference)


def _sinc_slope(x, mpmath):
    t = mpmath.pi * mpmath.mpf(float(x))
    return float((mpmath.cos(t) - mpmath.sin(t) / t) / mpmath.mpf(float(x)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_sinc_slope_is_accurate_near_zero(backend, dtype):
    """Within 4 ulps of mpmath from 1e-12 to 1, where `(cos(pi x) - sinc(x)) / x` cancels (81%
    off at 1e-4 in float32): the Taylor branch below the switch, the formula above, both
    sides of it."""
    mpmath = pytest.importorskip("mpmath")
    switch = 0.3 if dtype == np.float64 else 0.4
    around = switch * (1 + np.linspace(-0.02, 0.02, 21))
    xs = np.concatenate([np.geomspace(1e-12, 1.0, 200), around, -np.geomspace(1e-9, 0.9, 30)])
    xs = xs.astype(dtype)
    g = _available("sinc", lambda: tg.gradient(lambda x: tg.sum(tg.special.sinc(x)),
                                               on_backend(backend, xs))[0])  # fmt: skip
    got = numpy_of(backend, g)
    assert got.dtype == dtype
    with mpmath.workdps(40):
        expected = np.array([_sinc_slope(x, mpmath) for x in xs])
    ulps = np.abs(got - expected) / (np.abs(expected) * np.finfo(dtype).eps)
    assert ulps.max() <= 4, (xs[ulps.argmax()], got[ulps.argmax()], expected[ulps.argmax()])


def test_sinc_second_derivative_is_smooth_across_the_switch():
    """sinc'' from the nested pass agrees with mpmath on both sides of the switch between the
    Taylor branch and the formula (and is -pi^2 / 3 at 0)."""
    mpmath = pytest.importorskip("mpmath")
    xs = np.array([0.0, 1e-6, 0.1, 0.29, 0.299999, 0.3, 0.300001, 0.31, 0.39, 0.41, 0.7])
    h = tg.hessian(lambda x: tg.sum(tg.special.sinc(x)), xs)
    with mpmath.workdps(40):
        exact = [float(mpmath.diff(lambda t: mpmath.sinc(mpmath.pi * t), x, 2)) for x in xs]
    np.testing.assert_allclose(np.diag(h), exact, rtol=1e-9)
    assert np.all(h[~np.eye(len(xs), dtype=bool)] == 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", NAMES)
def test_a_float16_argument_gives_a_float16_value_and_gradient(name):
    """SciPy has no float16 loops and answered float32 or float64; PyTorch keeps the dtype."""
    domains = SPECS[name]["domains"]
    args = [np.array([(low + high) / 2 for low, high in (d if isinstance(d[0], tuple) else [d])],
                     np.float16) for d in domains]  # fmt: skip
    value = _call(name)(*args)
    assert value.dtype == np.float16
    constant = SPECS[name].get("constant")
    moving = [i for i in range(len(args)) if i != constant]

    def loss(*moved):
        given = list(args)
        for i, a in zip(moving, moved):
            given[i] = a
        return tg.sum(_call(name)(*given))

    grads = tg.gradient(loss, *(args[i] for i in moving))
    assert all(g is None or g.dtype == np.float16 for g in grads)


def _coth_slope(x):
    """-csch(x)^2 = -4 e^-2|x| / (1 - e^-2|x|)^2, even in x."""
    e = np.exp(-2 * np.abs(x))
    return -4 * e / (1 - e) ** 2


def _csch_slope(x):
    """-csch(x) coth(x) = -2 e^-|x| (1 + e^-2|x|) / (1 - e^-2|x|)^2, even in x."""
    a = np.abs(x)
    return -2 * np.exp(-a) * (1 + np.exp(-2 * a)) / (1 - np.exp(-2 * a)) ** 2


TAILS = np.array([0.5, -3.0, 10.0, 15.0, -19.0, 40.0, 400.0, 800.0])


@pytest.mark.parametrize("name, slope", [("coth", _coth_slope), ("csch", _csch_slope)])
def test_slopes_of_coth_and_csch_in_their_tails(name, slope):
    """coth's 1 - coth^2 cancelled (10: eight digits, 19 on: 0); csch's csch^2 cosh was
    0 * inf beyond 710 (nan) and 0 from 355. Against closed forms in e^-|x|."""
    with np.errstate(all="ignore"):
        (got,) = tg.gradient(lambda x: tg.sum(getattr(tg.special, name)(x)), TAILS)
        np.testing.assert_allclose(got, slope(TAILS), rtol=1e-13, atol=0)


@pytest.mark.parametrize("name, sign", [("xlogy", 1.0), ("rel_entr", -1.0)])
def test_the_tangent_in_y_of_xlogy_over_a_tiny_y_is_its_gradient(name, sign):
    """jvp computed (t * x) / y, whose t / y overflowed (inf, and nan where x == 0), where
    the gradient, x / y first, is finite."""
    f = getattr(tg.special, name)
    for x in (np.array([1e-300]), np.array([0.0])):
        y = np.array([1e-310])
        (gradient,) = tg.gradient(lambda y, x=x: tg.sum(f(x, y)), y)
        _, tangent = tg.jvp(lambda y, x=x: f(x, y), (y,), (np.ones(1),))
        np.testing.assert_array_equal(tangent, gradient)
        np.testing.assert_allclose(gradient, sign * x / y, rtol=1e-15)


@pytest.mark.parametrize("a", [0.5, 1.0, 3.0, 40.0])
@pytest.mark.parametrize("name, sign", [("gammainc", 1.0), ("gammaincc", -1.0)])
def test_the_slope_of_the_incomplete_gamma_in_x_is_the_gamma_density_up_to_infinity(a, name, sign):
    """At x = inf the density's exponent was inf - inf: a nan gradient where it is 0."""
    stats = pytest.importorskip("scipy.stats")
    x = np.array([np.inf, 1e300, 50.0, 2.0, 0.5, 1e-3])
    with np.errstate(all="ignore"):
        (got,) = tg.gradient(lambda x: tg.sum(getattr(tg.special, name)(a, x)), x)
    with np.errstate(all="ignore"):  # (SciPy's pdf at inf is nan for a > 1; its limit is 0)
        density = np.where(np.isinf(x), 0.0, stats.gamma.pdf(x, a))
    np.testing.assert_allclose(got, sign * density, rtol=1e-12, atol=0)


def test_invdigamma_beyond_the_largest_float_is_infinite():
    """From y = 709.8 the start exp(y) + 0.5 overflows and Newton's step was inf - inf: nan.
    Below, digamma of the answer is y again; beyond, the answer (e^y) is past float64's."""
    special = pytest.importorskip("scipy.special")
    y = np.array([-5.0, 1.0, 700.0, 709.0, 710.0, 1000.0, np.inf])
    with np.errstate(all="ignore"):
        x = np.asarray(tg.special.invdigamma(y))
        np.testing.assert_allclose(special.digamma(x[:4]), y[:4], rtol=1e-12)
    assert np.isposinf(x[4:]).all()


def _erfcx_slopes(x):
    """erfcx' and erfcx'' for x >= 10 from its asymptotic series in float64 Python floats,
    summed far beyond the rule's sixteen terms (60), so that the reference is independent."""
    first, second = [], []
    for t in x.tolist():
        u, term, s1, s2 = 1 / (2 * t * t), 1.0, 0.0, 0.0
        for k in range(1, 60):
            term *= -(2 * k - 1) * u
            s1 += term  # erfcx' = 2/sqrt(pi) sum_k c_k u^k, u = 1 / (2 t^2)
            s2 += term * -2 * k / t  # d/dt u^k = -2k u^k / t
        first.append(2 / math.sqrt(math.pi) * s1)
        second.append(2 / math.sqrt(math.pi) * s2)
    return np.array(first), np.array(second)


def test_the_slopes_of_erfcx_and_dawson_where_the_textbook_rule_cancels():
    """2 x erfcx(x) - 2/sqrt(pi) cancelled from x of 10 on (0 at 1e8, the second derivative
    1e16 times too large); dawson's 1 - 2 x D(x) likewise. Against the asymptotic series
    summed independently, and dawson against erfcx's (D' = -sum (2k-1)!! / (2x^2)^k, the same
    terms without the alternating sign)."""
    x = np.array([10.0, 12.0, 30.0, 100.0, 1e4, 1e8])
    first, second = _erfcx_slopes(x)
    (got,) = tg.gradient(lambda x: tg.sum(tg.special.erfcx(x)), x)
    np.testing.assert_allclose(got, first, rtol=1e-14)
    hvp = tg.hvp(lambda x: tg.sum(tg.special.erfcx(x)), x, np.ones_like(x))
    np.testing.assert_allclose(hvp, second, rtol=1e-13)
    for sign in (1.0, -1.0):
        (dawson,) = tg.gradient(lambda x: tg.sum(tg.special.dawson(x)), sign * x)
        u = 1 / (2 * x * x)
        expected = -sum(math.prod(range(1, 2 * k, 2)) * u**k for k in range(1, 40))
        np.testing.assert_allclose(dawson, expected, rtol=1e-14)


@pytest.mark.parametrize("name", sorted(special_julia.ELEMENTARY))
def test_julias_elementary_functions_refuse_complex_input(name):
    """Their forwards reduce half turns and square as reals do (`abs2(1+2j)` was -3+4j,
    `sinpi(1+2j)` 0), and their derivatives are not conjugated: refused, naming the function,
    as `cbrt` and `expit` refuse it."""
    with pytest.raises(TypeError, match=rf"tg.special.{name} takes real arrays"):
        getattr(tg.special, name)(np.array([0.25 + 0.5j]))
    with np.errstate(invalid="ignore", divide="ignore"):  # acoth(0.25) is nan
        assert getattr(tg.special, name)(np.array([0.25])).dtype == np.float64  # reals go on
