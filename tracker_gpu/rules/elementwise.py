"""Elementwise functions of the Array API standard: a table of forward names and vjps.

Each vjp is `vjp(g, ans, *args)`. A possibly-tracked value stays the left operand (some array
libraries refuse a foreign right operand). Masks are computed from plain values: they are
constants of the derivative.

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(lambda x: tg.sum(tg.sin(x) * tg.exp(x)), np.array([0.0]))[0]
array([1.])
"""

import math
import operator

import numpy as np
from array_api_compat import is_torch_array

from ..backend import SCALARS, device_of, is_complex_dtype, is_cupy, isdtype, namespace_of
from ..primitive import Primitive, no_gradient
from ..tracked import TrackedArray, data

__all__ = [
    "add",
    "subtract",
    "multiply",
    "divide",
    "pow",
    "remainder",
    "negative",
    "positive",
    "identity",
    "astype",
    "exp",
    "expm1",
    "log",
    "log1p",
    "log2",
    "log10",
    "sqrt",
    "square",
    "reciprocal",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "abs",
    "sign",
    "real",
    "imag",
    "conj",
    "maximum",
    "minimum",
    "atan2",
    "hypot",
    "logaddexp",
    "nextafter",
    "copysign",
    "where",
    "clip",
    "floor_divide",
]


def _unary(name, vjp, saves):
    """A standard unary function whose vjp reads `saves` ("x", "ans" or ""); on the GPU its
    pullback may be fused (see `cuda.dispatch`)."""

    def forward(xp, x, /):
        return getattr(xp, name)(x)

    return Primitive(name, forward, (vjp,), saves=saves)


def _analytic(name, vjp, saves, complex_vjp=None):
    """A unary function holomorphic off its branch cuts, whose `vjp` is `g * f'(x)` written
    with `ans` and `x` (`complex_vjp` for complex values, where the real one takes another
    branch): `conjugated`."""
    return _unary(name, conjugated(vjp, complex_vjp), saves)


def conjugated(vjp, complex_vjp=None):
    """The vjp `g * conj(f'(z))` of a holomorphic function from its `vjp(g, ans, *args)`,
    `g * f'(z)` (or `complex_vjp` for complex values): `conj(vjp(conj(g), ...))`, `f'` at `z`
    itself (taken at `conj(z)`, as `f'(conj(z))` is `conj(f'(z))` for real coefficients, it
    is across a branch cut from `z` on the cut: acos(-2 + 0j)'s slope had the wrong sign).
    Real values pay one dtype test, no array operation."""
    holomorphic = complex_vjp or vjp

    def conjugating_vjp(g, ans, *args):
        if g.dtype.kind != "c" if type(g) is np.ndarray else not is_complex(g):
            return vjp(g, ans, *args)
        return conj(holomorphic(conj(g), ans, *args))

    return conjugating_vjp


def _binary(name, forward, vjp_x, vjp_y, saves):
    """A binary function; `saves` is what each vjp reads, e.g. ("y", "x") for a product."""
    return Primitive(name, forward, (vjp_x, vjp_y), saves=saves, signature=_binary_signature)


def _binary_signature(x1, x2, /):
    """The standard's signature of a binary elementwise function."""


def _function(name):
    """The forward of a standard binary function, with Python scalars made arrays."""

    def forward(xp, x, y):
        x, y = _as_arrays(xp, x, y)
        return getattr(xp, name)(x, y)

    return forward


def _as_arrays(xp, *args, device=None):
    """The Python numbers among `args` as arrays of the array's dtype (the standard's rule),
    where the number's kind fits it. A number of a higher kind (2.5 beside integers, 2 beside
    booleans) is left to the library's function, which promotes or refuses it as it does
    for a plain array: made an integer, it would silently give another value."""
    like = next((a for a in args if type(a) not in SCALARS), None)
    if like is None:  # only numbers: the library's default dtype, on the given device
        return tuple(xp.asarray(a, device=device) for a in args)
    if all(type(a) not in SCALARS for a in args):
        return args
    dtype, rank = like.dtype, _kind_rank(xp, like.dtype)
    if rank == _RANKS[float] and any(type(a) is complex for a in args):
        dtype, rank = complex_dtype(xp, dtype), _RANKS[complex]  # complex beside real floats
    return tuple(
        xp.asarray(a, dtype=dtype, device=device_of(like))
        if type(a) in SCALARS and _RANKS[type(a)] <= rank
        else a
        for a in args
    )


_RANKS = {bool: 0, int: 1, float: 2, complex: 3}  # a Python number's kind
_KINDS = ("bool", "integral", "real floating", "complex floating")  # a dtype's, in that order
_KIND_RANKS = {}


def _kind_rank(xp, dtype):
    key = (type(dtype), dtype)  # libraries' dtypes do not compare with each other
    rank = _KIND_RANKS.get(key)
    if rank is None:
        rank = next((i for i, kind in enumerate(_KINDS) if isdtype(xp, dtype, kind)), 3)
        _KIND_RANKS[key] = rank
    return rank


def zeros_like(x):
    """Plain zeros shaped, typed and placed like `x` (a constant of the derivative)."""
    x = data(x)
    if type(x) in SCALARS:
        return 0.0
    return namespace_of(x).zeros_like(x)


def mask(condition, g):
    """`g` where `condition` holds, zero elsewhere; differentiable in `g`."""
    return where(condition, g, zeros_like(g))


# --- arithmetic, through the operators so that Python scalars keep the array's dtype
add = _binary("add", lambda xp, x, y: x + y, lambda g, ans, x, y: g, lambda g, ans, x, y: g, "")
subtract = _binary(
    "subtract", lambda xp, x, y: x - y, lambda g, ans, x, y: g, lambda g, ans, x, y: -g, ""
)
multiply = _binary(
    "multiply",
    lambda xp, x, y: x * y,
    lambda g, ans, x, y: g * _conj(y),
    lambda g, ans, x, y: g * _conj(x),
    ("y", "x"),
)
divide = _binary(
    "divide",
    lambda xp, x, y: x / y,
    lambda g, ans, x, y: g / _conj(y),
    lambda g, ans, x, y: -g * _conj(ans) / _conj(y),
    ("y", "ans y"),
)


def standard_promotion(function):
    """`function(x1, x2)` (a rule whose forward is the library's operator) with two arrays of
    different dtypes first cast to the standard's result type: the namespace's function where
    the library's operators promote otherwise. PyTorch's let a 0-d tensor's dtype give way
    (float32 times a 0-d float64 is float32; int8 plus a 0-d int64 wraps at 127), where the
    standard's `multiply` and `add`, and array-api-compat's, promote; its operators on tracked
    arrays stay its own, as on plain tensors."""

    def promoted(x1, x2, /):
        a, b = data(x1), data(x2)
        if type(a) not in SCALARS and type(b) not in SCALARS and a.dtype != b.dtype:
            dtype = namespace_of(a).result_type(a, b)
            x1 = x1 if a.dtype == dtype else astype(x1, dtype)
            x2 = x2 if b.dtype == dtype else astype(x2, dtype)
        return function(x1, x2)

    promoted.__name__ = promoted.__qualname__ = function.__name__
    promoted.__doc__, promoted.__signature__ = function.__doc__, function.__signature__
    return promoted


# The conjugates are taken factor by factor, so that on real data each vjp multiplies in the
# order the fused kernels do (the same inf and nan at the edges of the domain).
# At x = 0, d/dx x**0 = 0 and d/dy x**y = 0 (y > 0), not 0 * inf and -inf * 0 (as JAX, PyTorch).
def _widened(g, *values):
    """`values` in the dtype of `g` (the result's) where they are floating arrays of another:
    a derivative that computes with one operand alone (`y - 1`, `log(x)`, `x * x`) rounded a
    float64 result's gradient to a float16 or float32 operand's precision."""
    out = []
    for v in values:
        plain = data(v)
        if type(plain) not in SCALARS and plain.dtype != data(g).dtype:
            if isdtype(namespace_of(plain), plain.dtype, ("real floating", "complex floating")):
                v = astype(v, data(g).dtype)
        out.append(v)
    return out


def _pow_vjp_x(g, ans, x, y):
    """`g y x ** (y - 1)`, 0 where `y == 0` (PyTorch's). A number `y == 0` is a constant: 0
    (`0 * x ** 1` was nan at an infinite `x`). An array's keeps its slope in `y` (the mixed
    second derivative, `1 / x` there): `x ** 1` stands for `x ** -1` where `x == 0` alone (a
    subnormal `x`, whose `x ** -1` overflows, gives nan there, PyTorch 0)."""
    x, y = _widened(g, x, y)
    if type(y) in SCALARS:
        if y == 0:
            return zeros_like(g)
        # a real `x ** 1` is `x` bit for bit: the square's pullback makes one array fewer
        square = y == 2 and type(y) is not complex and not is_complex(x)
        power = x if square else x ** (y - 1)
        return g * _conj(y) * _conj(power)
    return g * _conj(y) * _conj(x ** where((y == 0) & (x == 0), 1.0, y - 1))


def _pow_vjp_y(g, ans, x, y):
    """`g log(x) x ** y`, and 0 where `x == 0` and `y >= 0` (where `x == 0` and `y < 0`,
    log(0) times an infinite power: -inf, PyTorch's)."""
    x, y = _widened(g, x, y)
    if is_complex(y):  # no order: log(1) wherever x == 0
        at_zero = x == 0
    else:  # y first: a tracked y's operator takes a plain x's comparison, not the reverse
        at_zero = (y >= 0) & (x == 0)
    if type(x) in SCALARS:
        if type(x) is not complex and x < 0 and is_complex(y):  # (-2.0) ** z: log(-2 + 0j)
            x = complex(x)  # (the real log of a negative number is nan)
        factor = log(x) if x != 0 else where(at_zero, 0.0, -math.inf)
        return g * _conj(factor) * _conj(ans)
    return g * _conj(log(where(at_zero, 1.0, x))) * _conj(ans)


pow = _binary("pow", lambda xp, x, y: x**y, _pow_vjp_x, _pow_vjp_y, ("x y", "x y ans"))


def _pow_as_written_in_place(xp, x, y):
    """The value of `x **= y`: CuPy computes `x ** 2` by squaring but `x **= 2` by pow, which
    differ in the last bit; elsewhere, and where the power would not fit in `x`, `x ** y`."""
    if not (is_cupy(x) and type(y) in SCALARS) or xp.result_type(x, y) != x.dtype:
        return x**y
    out = x.copy()
    out **= y
    return out


# `x **= y` on a tracked array (the operators bind it): `pow`, as the library writes it in place
pow_in_place = _binary("pow", _pow_as_written_in_place, _pow_vjp_x, _pow_vjp_y, ("x y", "x ans"))
remainder = _binary(
    "remainder",
    lambda xp, x, y: x % y,
    lambda g, ans, x, y: g,
    lambda g, ans, x, y: -g * _plain_floor_divide(x, y),
    ("", "x y"),
)
negative = Primitive("negative", lambda xp, x, /: -x, (lambda g, ans, x: -g,), saves="")
identity = Primitive("identity", lambda xp, x, /: x, (lambda g, ans, x: g,), saves="")


def positive(x, /):
    """`+x` as the library answers it: NumPy's is a new array (a write into it leaves `x` as it
    was), PyTorch's `x` itself."""
    if type(x) is TrackedArray:
        return x if is_torch_array(x.data) else identity(x)
    return x if type(x) in SCALARS else namespace_of(x).positive(x)


def _astype_forward(xp, x, dtype, /, *, copy=True, device=None):
    if device is None:
        return xp.astype(x, dtype, copy=copy)
    return xp.astype(x, dtype, copy=copy, device=device)


# The cast back to the argument's dtype is done by the one place that fits gradients.
astype = Primitive("astype", _astype_forward, (lambda g, ans, x, dtype, **kw: g, None), saves="")


def as_floating(x):
    """`x` (tracked or plain), or its values as float64 where they are integers or booleans
    (a norm of integers, or a derivative with respect to them, is a float, as NumPy's)."""
    plain = data(x)
    xp = namespace_of(plain)
    if isdtype(xp, plain.dtype, ("real floating", "complex floating")):
        return x
    return astype(x, xp.float64)


# --- unary functions: name and vjp
exp = _analytic("exp", lambda g, ans, x: g * ans, "ans")
expm1 = _analytic("expm1", lambda g, ans, x: g * exp(x), "x")  # not ans + 1: it cancels at -40
log = _analytic("log", lambda g, ans, x: g / x, "x")
log1p = _analytic("log1p", lambda g, ans, x: g / (x + 1), "x")
log2 = _analytic("log2", lambda g, ans, x: g / (x * math.log(2)), "x")
log10 = _analytic("log10", lambda g, ans, x: g / (x * math.log(10)), "x")
sqrt = _analytic("sqrt", lambda g, ans, x: g / (ans * 2), "ans")
square = _analytic("square", lambda g, ans, x: g * (x * 2), "x")
reciprocal = _analytic("reciprocal", lambda g, ans, x: -g * ans * ans, "ans")
sin = _analytic("sin", lambda g, ans, x: g * cos(x), "x")
cos = _analytic("cos", lambda g, ans, x: -g * sin(x), "x")
tan = _analytic("tan", lambda g, ans, x: g * (ans * ans + 1), "ans")


def _beside_the_axis(z):
    """Complex `z` with a zero imaginary part moved off the real axis, by the least normal
    amount, to the side its zero's sign says: on a branch cut `1 - z * z` loses that sign
    (0 - 0 is +0), and the slope there took the other side's branch (acos at -2 + 0j)."""
    plain = data(z)
    xp = namespace_of(plain)
    im = xp.imag(plain)
    least = xp.asarray(xp.finfo(im.dtype).smallest_normal * 4, dtype=im.dtype, device=device_of(im))
    nudge = xp.where(im == 0, xp.copysign(least, im), xp.zeros_like(im))
    return z + xp.astype(nudge, plain.dtype) * 1j


def _one_minus_square(x):
    z = _beside_the_axis(x)
    return 1 - z * z


def _square_plus_one(x):
    z = _beside_the_axis(x)
    return z * z + 1


asin = _analytic(
    "asin",
    lambda g, ans, x: g / sqrt(1 - x * x),
    "x",
    lambda g, ans, x: g / sqrt(_one_minus_square(x)),
)
acos = _analytic(
    "acos",
    lambda g, ans, x: -g / sqrt(1 - x * x),
    "x",
    lambda g, ans, x: -g / sqrt(_one_minus_square(x)),
)
atan = _analytic("atan", lambda g, ans, x: g / (x * x + 1), "x")
sinh = _analytic("sinh", lambda g, ans, x: g * cosh(x), "x")
cosh = _analytic("cosh", lambda g, ans, x: g * sinh(x), "x")
tanh = _analytic("tanh", lambda g, ans, x: g * (1 - ans * ans), "ans")
asinh = _analytic(
    "asinh",
    lambda g, ans, x: g / sqrt(x * x + 1),
    "x",
    lambda g, ans, x: g / sqrt(_square_plus_one(x)),
)
acosh = _analytic(
    "acosh",
    lambda g, ans, x: g / sqrt(x * x - 1),
    "x",
    lambda g, ans, x: _acosh_slope(g, _beside_the_axis(x)),
)
atanh = _analytic("atanh", lambda g, ans, x: g / (1 - x * x), "x")


def _acosh_slope(g, z):
    return g / (sqrt(z - 1) * sqrt(z + 1))  # the branch of acosh(z) off the reals


def _abs_vjp(g, ans, x):
    if not is_complex(x):
        return _sign_times(x, g)  # abs'(+-0) = 0: sign(x), as Tracker and PyTorch
    r = abs(x)  # recomputed: real data, the common case, keeps only x
    zero = r == 0
    unit = where(zero, zeros_like(x), x / where(zero, 1.0, r))
    return g * unit  # the gradient of |z| is z / |z| (0 at 0, as PyTorch)


def _sign_times(x, g):
    """`sign(x) * g` for real `x`, by selection (0 at +-0 and nan; never 0 * inf)."""
    return where(x > 0, g, mask(x < 0, -g))


def _sign_vjp(g, ans, x):
    if not is_complex(x):
        return None  # the sign of a real number is piecewise constant
    # sign(z) = z / |z|: the gradient is (g - s real(g conj(s))) / |z|, 0 at 0 (as PyTorch)
    r = abs(x)
    nonzero = r != 0
    r = where(nonzero, r, 1.0)
    s = x / r
    return mask(nonzero, (g - s * real(g * conj(s))) / r)


def _imag_vjp(g, ans, x):
    return astype(g, complex_dtype(namespace_of(data(g)), g.dtype)) * 1j


abs = _unary("abs", _abs_vjp, "x")
sign = _unary("sign", _sign_vjp, "x")
real = _unary("real", lambda g, ans, x: g, "")
imag = _unary("imag", _imag_vjp, "")
conj = _unary("conj", lambda g, ans, x: conj(g), "")


def is_complex(x):
    """Whether `x` (tracked or plain) holds complex numbers."""
    if type(x) is np.ndarray:  # the common case first
        return x.dtype.kind == "c"
    x = data(x)
    if type(x) is np.ndarray:  # a tracked NumPy array's
        return x.dtype.kind == "c"
    if type(x) in SCALARS:
        return type(x) is complex
    return is_complex_dtype(x.dtype)


def complex_dtype(xp, dtype):
    """The complex dtype of the precision of the real floating `dtype`: complex64 for float32
    and the narrower float16 and bfloat16 (NumPy's promotion), complex128 for float64."""
    narrow = dtype == xp.float32 or getattr(dtype, "itemsize", 8) < 4
    return xp.complex64 if narrow else xp.complex128


def real_dtype(xp, dtype):
    """The real dtype of the precision of `dtype` (float32 for complex64; a real one as it is)."""
    if not is_complex_dtype(dtype):
        return dtype
    return xp.float32 if dtype == xp.complex64 else xp.float64


def conjugate_derivative(x):
    """`conj(x)` for complex `x`, `x` itself otherwise: a holomorphic function's vjp is
    `g * conj(f'(z))` (PyTorch's convention, so that `z - lr * grad` descends)."""
    kind = type(x)
    if kind is float or kind is int:  # the common cases first: nothing to test further
        return x
    value = x.data if kind is TrackedArray else x  # a nested pass's saved value: its data's
    if type(value) is np.ndarray:
        return conj(x) if value.dtype.kind == "c" else x
    return conj(x) if is_complex(x) else x


_conj = conjugate_derivative


# --- binary functions
# A tie of maximum/minimum splits the gradient evenly between the two arguments (as PyTorch:
# maximum(x, y) stays symmetric); where either is nan, neither gets any.
_OPERATORS = {"equal": operator.eq, "greater": operator.gt, "less": operator.lt,
              "greater_equal": operator.ge, "less_equal": operator.le}  # fmt: skip


def _compare(name, x, y):
    """`x <op> y` in a pullback: plain for plain values, the namespace's comparison where one
    is tracked (a nested pass: traced while tg.compile records, so a replay computes it)."""
    if type(x) is TrackedArray or type(y) is TrackedArray:
        return PLAIN_FUNCTIONS[name](x, y)
    return _OPERATORS[name](x, y)


def _tie_split(g, chosen, x, y):
    """`g` where the plain mask `chosen` holds, half of it where `x == y`, zero elsewhere."""
    return where(chosen, g, mask(_compare("equal", x, y), g * 0.5))


maximum = _binary(
    "maximum",
    _function("maximum"),
    lambda g, ans, x, y: _tie_split(g, _compare("greater", x, y), x, y),
    lambda g, ans, x, y: _tie_split(g, _compare("less", x, y), x, y),
    "x y",
)
minimum = _binary(
    "minimum",
    _function("minimum"),
    lambda g, ans, x, y: _tie_split(g, _compare("less", x, y), x, y),
    lambda g, ans, x, y: _tie_split(g, _compare("greater", x, y), x, y),
    "x y",
)


def nonzero_divide(g, numerator, denominator):
    """`g * numerator / denominator`, and 0 (a subgradient, as PyTorch's norms) where the
    denominator is 0: no division by zero, no warning."""
    zero = denominator == 0
    return mask(~zero, g * numerator / where(zero, 1.0, denominator))


# atan2 and hypot divide by what vanishes at (0, 0): their gradient there is 0 (PyTorch's for
# atan2 and for the 2-norm of (x, y); PyTorch's hypot gives nan).
def _atan2_vjp_y(g, ans, y, x):
    y, x = _widened(g, y, x)
    return nonzero_divide(g, x, add(x * x, y * y))


def _atan2_vjp_x(g, ans, y, x):
    y, x = _widened(g, y, x)
    return -nonzero_divide(g, y, add(x * x, y * y))


atan2 = _binary("atan2", _function("atan2"), _atan2_vjp_y, _atan2_vjp_x, "x y")
hypot = _binary(
    "hypot",
    _function("hypot"),
    lambda g, ans, x, y: nonzero_divide(g, x, ans),
    lambda g, ans, x, y: nonzero_divide(g, y, ans),
    ("x ans", "y ans"),
)


# d/dx logaddexp(x, y) = sigmoid(x - y): 1 and 0 beside an infinite argument, where
# exp(x - ans) would be exp(inf - inf). PyTorch's 1 / (1 + exp(y - x)) has the same values, but
# its own derivative multiplies 0 by an exp that overflows (nan for softplus'' at -800).
def _logaddexp_vjp(g, ans, x, y):
    return g * sigmoid(subtract(x, y))


logaddexp = _binary(
    "logaddexp",
    _function("logaddexp"),
    _logaddexp_vjp,
    lambda g, ans, x, y: _logaddexp_vjp(g, ans, y, x),
    ("x y", "x y"),
)
# copysign(x, y) = |x| sign(y): flat at x = +-0, as abs (and PyTorch).
copysign = _binary(
    "copysign",
    _function("copysign"),
    lambda g, ans, x, y: mask(x != 0, where(_plain_signbit(x) == _plain_signbit(ans), g, -g)),
    lambda g, ans, x, y: None,
    ("x ans", ""),
)


# nextafter(x, y) moves x by one ulp: PyTorch's gradient, g to x where x != y and none to y.
nextafter = _binary(
    "nextafter",
    _function("nextafter"),
    lambda g, ans, x, y: mask(x != y, g),
    lambda g, ans, x, y: None,
    ("x y", ""),
)
nextafter.__doc__ = """The next float after `x1` towards `x2`. As in PyTorch, its gradient is
the incoming gradient for `x1` where `x1 != x2` (the step of one ulp is treated as a constant;
where they are equal the result is `x2`, and 0) and none for `x2` (the result is piecewise
constant in it)."""


def _where_forward(xp, condition, x, y):
    x, y = _as_arrays(xp, x, y, device=device_of(condition))
    return xp.where(condition, x, y)


where = Primitive(
    "where",
    _where_forward,
    (
        None,
        lambda g, ans, c, x, y: where(c, g, zeros_like(g)),
        lambda g, ans, c, x, y: where(c, zeros_like(g), g),
    ),
    saves="",  # the condition carries no gradient (a constant): kept as it was given
    signature=lambda condition, x1, x2, /: None,
)


def _clip_forward(xp, x, lo, hi):
    y = xp.clip(x, data(lo), data(hi))
    if y.dtype == x.dtype or not (xp is np or is_cupy(x)):
        return y
    # NumPy's and CuPy's own clip promote x with its bounds; the standard's keeps x's dtype, as
    # array-api-compat's does: the bounds in that dtype (an integer beyond it, no bound)
    return xp.clip(x, *(_bound_in_dtype(xp, data(b), x) for b in (lo, hi)))


def _bound_in_dtype(xp, bound, x):
    if bound is None:
        return None
    if not isdtype(xp, x.dtype, "integral"):
        return xp.asarray(bound, dtype=x.dtype, device=device_of(x))
    info = xp.iinfo(x.dtype)
    if type(bound) is int:
        return bound if info.min < bound < info.max else None
    bound = xp.asarray(bound, device=device_of(x))
    if not isdtype(xp, bound.dtype, "integral"):
        return xp.astype(bound, x.dtype)
    # an integer bound beyond x's range is the range's end: cast first, 300 would be 44 in int8
    wide = xp.result_type(bound.dtype, x.dtype)  # holds both (float64 for uint64 with int64)
    return xp.astype(xp.clip(xp.astype(bound, wide), info.min, info.max), x.dtype)


def _clip_vjp_x(g, ans, x, lo, hi):
    inside = _and(
        lo is None or _compare("greater_equal", x, lo), hi is None or _compare("less_equal", x, hi)
    )
    return g if inside is True else mask(inside, g)


# Where the bounds cross (lo > hi) the value is hi (NumPy's and the standard's): the gradient
# goes to hi alone, as PyTorch's clamp sends it (and so nowhere where x < lo == hi).
def _clip_vjp_lo(g, ans, x, lo, hi):
    below = _compare("less", x, lo)
    return mask(below if hi is None else _and(below, _compare("less", lo, hi)), g)


def _clip_vjp_hi(g, ans, x, lo, hi):
    above = _compare("greater", x, hi)
    return mask(above if lo is None else above | _compare("less", hi, lo), g)


_clip = Primitive(
    "clip",
    _clip_forward,
    (_clip_vjp_x, _clip_vjp_lo, _clip_vjp_hi),
    saves="x lo hi",
)


def _and(a, b):
    if a is True:
        return b
    return a if b is True else a & b


def clip(x, /, min=None, max=None):
    """Clamp `x` to `[min, max]`: the value of NumPy and the standard (`max` where the bounds
    cross, `min > max`), the gradient of PyTorch's `clamp`: to `x` where it is inside, bounds
    included, else to the bound that clips it; where the bounds cross, to `max` alone.

    >>> import numpy as np, tracker_gpu as tg
    >>> x, lo, hi = np.array([0.0, 3.0]), np.array([1.0, 2.0]), np.array([2.0, 1.0])
    >>> tg.gradient(lambda x, lo, hi: tg.sum(tg.clip(x, lo, hi)), x, lo, hi)
    (array([0., 0.]), array([1., 0.]), array([0., 1.]))
    """
    return _clip(x, min, max)


# --- non-differentiable elementwise functions: constants out of tracked arrays, plain arrays out
# of plain ones (traced ones, with no gradient, while tg.compile records, so that a replay
# computes them from its own inputs)
def _plain(name, signature):
    def forward(xp, *values, **kw):
        return getattr(xp, name)(*_as_arrays(xp, *values), **kw)

    return no_gradient(name, forward, signature=signature)


def _unary_signature(x, /):
    """The standard's signature of a unary elementwise function."""


_UNARY_PLAIN = (
    "ceil floor trunc round signbit isfinite isinf isnan logical_not bitwise_invert"
).split()
_BINARY_PLAIN = (
    "equal not_equal greater greater_equal less less_equal logical_and logical_or logical_xor "
    "bitwise_and bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift floor_divide"
).split()
PLAIN_FUNCTIONS = {name: _plain(name, _unary_signature) for name in _UNARY_PLAIN}
PLAIN_FUNCTIONS.update({name: _plain(name, _binary_signature) for name in _BINARY_PLAIN})
floor_divide = _plain_floor_divide = PLAIN_FUNCTIONS["floor_divide"]
# `x // y` as the library's operator computes it, as `+` and `*` do (the namespace's
# `floor_divide` promotes as the standard says: PyTorch's operator keeps float32 beside a 0-d
# float64, and NumPy's bfloat16 over a Python float is float32, where the namespace's is not)
floor_divide_operator = no_gradient(
    "floor_divide_operator", lambda xp, x, y: x // y, signature=_binary_signature
)


def _operator_rule(name, compare):
    return no_gradient(f"{name}_operator", lambda xp, x, y: compare(x, y),
                       signature=_binary_signature)  # fmt: skip


# `x < c` as the library's operator compares an array with a Python number where the
# namespace's function does otherwise: ml_dtypes compares bfloat16 with a float in float32 (the
# namespace in bfloat16: bfloat16(0.1) == 0.1), NumPy 2 an integer array with an int beyond its
# range exactly (the namespace cannot make the int an array of that dtype)
COMPARISON_OPERATORS = {
    name: _operator_rule(name, compare)
    for name, compare in (("less", operator.lt), ("less_equal", operator.le),
                          ("greater", operator.gt), ("greater_equal", operator.ge),
                          ("equal", operator.eq), ("not_equal", operator.ne))
}  # fmt: skip


def comparison(name, x, other):
    """`x <op> other` as the tracked array's operator records it: the namespace's function,
    or the library's operator where the two differ (above)."""
    if _operator_differs(x, other):
        return COMPARISON_OPERATORS[name](x, other)
    return PLAIN_FUNCTIONS[name](x, other)


def _operator_differs(x, other):
    kind = type(other)
    if kind is not int and kind is not float:
        return False
    dtype = data(x).dtype
    if str(dtype).endswith("bfloat16"):
        return kind is float
    if kind is int and isdtype(namespace_of(data(x)), dtype, "integral"):
        info = namespace_of(data(x)).iinfo(dtype)
        return not info.min <= other <= info.max
    return False


_plain_signbit = PLAIN_FUNCTIONS["signbit"]


# --- the logistic function: stable both ways, the activation and logaddexp's derivative
def real_only(name, x):
    """Refuse complex `x`: activations, normalisers and losses order their inputs (max, > 0),
    which complex numbers do not have."""
    if is_complex(x):
        raise TypeError(
            f"{name} takes real data, got {x.dtype}: complex numbers have no order; apply it to "
            "tg.real(z), tg.imag(z) or tg.abs(z)"
        )


def sigmoid_values(xp, x):
    """The logistic function of a plain array, stably: e^-|x| never overflows."""
    real_only("sigmoid", x)
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


sigmoid = Primitive(
    "sigmoid",
    sigmoid_values,
    (lambda g, ans, x: g * ans * (1 - ans),),
    saves="ans",
)
