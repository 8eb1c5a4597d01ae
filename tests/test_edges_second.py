"""Edge points where a gradient, or its own derivative, was silently wrong: a sigmoid traced by
`tg.broadcast` (flat at 0), pow's mixed second derivative at y == 0, xlogy's and xlog1py's
gradient in x at x == 0, sinc's second derivative at 0, logaddexp beside an infinity, and the
eigenvalues or singular values alone of a matrix whose values tie. Each expected value is
PyTorch's (float64), a closed form, or a central finite difference of our own first derivative
(which is checked against PyTorch where it differs from it); none is copied from our output.

Then the promise that covers the first: for every elementwise function of the tracked
namespace and of `tg.special`, and every activation of `tg.nn`, that `tg.broadcast` traces, the
traced function's value and gradient are the function's own over the whole domain (zeros of
both signs, tiny, huge, infinite, nan)."""

import math

import array_api_compat
import numpy as np
import pytest
from domain import assert_agree, special_values
from test_edges import torch_gradients

import tracker_gpu as tg
from tracker_gpu.cuda import generic_only

torch = pytest.importorskip("torch")


def hessian_by_differences(f, x, h=1e-6):
    """Central differences of our gradient: the Hessian's columns."""
    grad = lambda v: tg.gradient(f, v)[0]
    columns = []
    for i in range(x.size):
        step = np.zeros_like(x)
        step[i] = h
        columns.append((grad(x + step) - grad(x - step)) / (2 * h))
    return np.stack(columns, axis=-1)


@pytest.mark.parametrize("how", ["eager", "broadcast", "broadcast of swish"])
def test_the_slope_of_sigmoid_at_zero_is_a_quarter_wherever_it_is_traced(backend, how):
    x = backend.asarray(np.array([0.0, -0.0, 1.0]))
    f = {
        "eager": tg.sigmoid,
        "broadcast": lambda x: tg.broadcast(tg.sigmoid, x),
        "broadcast of swish": lambda x: tg.broadcast(tg.nn.swish, x),
    }[how]
    (ours,) = tg.gradient(lambda x: tg.sum(f(x)), x)
    swish = lambda t: t * torch.sigmoid(t)
    (expected,) = torch_gradients(swish if "swish" in how else torch.sigmoid, [0.0, -0.0, 1.0])
    np.testing.assert_allclose(backend.to_numpy(ours), expected, rtol=1e-14)


def test_the_second_derivative_of_swish_at_zero_through_broadcast():
    hessian = tg.hessian(lambda x: tg.sum(tg.broadcast(tg.nn.swish, x)), np.array([0.0]))
    np.testing.assert_allclose(hessian, [[0.5]], rtol=1e-14)  # d2/dx2 x sigmoid(x) at 0


@pytest.mark.parametrize("point", [(2.0, 0.0), (0.5, 0.0), (3.0, 1.5)])
@pytest.mark.parametrize("how", ["eager", "broadcast"])
def test_the_mixed_second_derivative_of_a_power_at_a_zero_exponent(point, how):
    """d2/dxdy x**y = x**(y-1) (1 + y log x): at y == 0, 1/x; symmetric."""
    power = (lambda v: v[0] ** v[1]) if how == "eager" else (
        lambda v: tg.broadcast(lambda a, b: a**b, v[0], v[1]))  # fmt: skip
    hessian = tg.hessian(power, np.array(point))
    x, y = point
    mixed = x ** (y - 1) * (1 + y * math.log(x))
    np.testing.assert_allclose(hessian[0, 1], mixed, rtol=1e-12)
    np.testing.assert_allclose(hessian[1, 0], mixed, rtol=1e-12)


def test_a_zero_power_has_a_zero_slope_everywhere_in_x(backend):
    """d/dx x**0 = 0, also at x = +-inf (0 * inf was nan) and x = 0."""
    x = backend.asarray(np.array([np.inf, -np.inf, 0.0, -2.0, 3.0]))
    (g,) = tg.gradient(lambda x: tg.sum(x ** backend.asarray(np.zeros(5))), x)
    assert np.array_equal(backend.to_numpy(g), np.zeros(5))


@pytest.mark.parametrize("name", ["xlogy", "xlog1py"])
def test_the_gradient_of_xlogy_in_x_at_zero_is_the_logarithm(backend, name):
    x = np.zeros(6)
    y = np.array([2.0, 0.5, 0.0, -1.0, -2.0, np.inf])
    with np.errstate(all="ignore"), tg.sync_checks(False):
        try:
            ours = tg.gradient(lambda x, y: tg.sum(getattr(tg.special, name)(x, y)),
                               backend.asarray(x), backend.asarray(y))  # fmt: skip
        except NotImplementedError as e:  # a library without special functions says so
            pytest.skip(str(e))
    expected = torch_gradients(getattr(torch.special, name), x, y)
    for a, e in zip(ours, expected):
        np.testing.assert_allclose(backend.to_numpy(a), e, rtol=1e-14)


@pytest.mark.parametrize("name", ["xlogy", "xlog1py"])
def test_the_hessian_of_xlogy_at_x_zero_is_symmetric(name):
    f = lambda v: getattr(tg.special, name)(v[0], v[1])
    point = np.array([0.0, 2.0])
    hessian = tg.hessian(f, point)
    np.testing.assert_allclose(hessian, hessian_by_differences(f, point), atol=1e-8)
    assert hessian[0, 1] == hessian[1, 0] != 0


@pytest.mark.parametrize("how", ["eager", "broadcast"])
def test_the_second_derivative_of_sinc_at_zero(how):
    f = tg.special.sinc if how == "eager" else lambda x: tg.broadcast(tg.special.sinc, x)
    hessian = tg.hessian(lambda x: tg.sum(f(x)), np.array([0.0, 0.25]))
    expected = hessian_by_differences(lambda x: tg.sum(tg.special.sinc(x)), np.array([1e-3, 0.25]))
    np.testing.assert_allclose(hessian[0, 0], -(math.pi**2) / 3, rtol=1e-12)
    np.testing.assert_allclose(hessian, expected, rtol=1e-5, atol=1e-6)


def test_logaddexp_beside_an_infinity_has_pytorchs_gradient(backend):
    x = np.array([np.inf, 1.0, -np.inf, 3.0, 800.0, -800.0])
    y = np.array([1.0, np.inf, 1.0, 3.0, 0.0, 0.0])
    with tg.sync_checks(False):  # the loss is infinite
        ours = tg.gradient(lambda x, y: tg.sum(tg.logaddexp(x, y)), *map(backend.asarray, (x, y)))
    expected = torch_gradients(torch.logaddexp, x, y)
    for a, e in zip(ours, expected):
        np.testing.assert_allclose(backend.to_numpy(a), e, rtol=1e-14)


def _logistic_slope(t):
    """sigmoid(t) (1 - sigmoid(t)), stably: e^-|t| / (1 + e^-|t|)^2."""
    e = np.exp(-np.abs(t))
    return e / (1 + e) ** 2


SATURATED = np.array([-800.0, -100.0, -30.0, 0.0, 1.0, 30.0, 100.0, 800.0])
# the second derivatives of the functions built on logaddexp, in closed form
LOGADDEXP_FAMILY = {
    "softplus": (tg.nn.softplus, _logistic_slope),
    "logsigmoid": (tg.nn.logsigmoid, lambda t: -_logistic_slope(t)),
    "logaddexp": (lambda x: tg.logaddexp(2.0 * x, x), _logistic_slope),  # x + softplus(x)
    "logaddexp2": (  # log2(1 + 2**(2x)), whose 2**(-2x) overflows at -800
        lambda x: tg.logaddexp2(2.0 * x, 0.0),
        lambda t: 4 * math.log(2) * _logistic_slope(2 * t * math.log(2)),
    ),
}


@pytest.mark.parametrize("name", LOGADDEXP_FAMILY)
def test_second_derivatives_of_softplus_and_its_family_where_exp_overflows(backend, name):
    """softplus'' at -800 was nan (PyTorch's first-order formula 1 / (1 + exp(y - x))
    differentiated again multiplies 0 by an overflowed exp); the nan spread through a
    Hessian-vector product to every weight of a model with one confident logit."""
    f, second = LOGADDEXP_FAMILY[name]
    x = backend.asarray(SATURATED)
    with np.errstate(over="ignore"):
        found = tg.hvp(lambda x: tg.sum(f(x)), x, backend.asarray(np.ones_like(SATURATED)))
    # (absolute: sigmoid's slope from its value, as PyTorch's, keeps 1e-16 of 0.25 beyond 30)
    np.testing.assert_allclose(backend.to_numpy(found), second(SATURATED), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    "matrix", [np.eye(2), np.array([[2.0, 1.0, 0.0], [1.0, 2.0, 0.0], [0.0, 0.0, 3.0]])]
)
@pytest.mark.parametrize("name", ["eigh", "svd"])
def test_tied_values_alone_have_a_finite_gradient(name, matrix):
    """The loss reads the eigenvalues (singular values) only: the vectors' term adds nothing,
    even where two values tie, as in PyTorch (it was nan everywhere)."""
    if name == "eigh":
        ours = lambda a: tg.sum(tg.linalg.eigh(a).eigenvalues ** 2)
        theirs = lambda a: torch.linalg.eigh(a).eigenvalues ** 2
    else:
        ours = lambda a: tg.sum(tg.linalg.svd(a, full_matrices=False).S ** 2)
        theirs = lambda a: torch.linalg.svd(a, full_matrices=False).S ** 2
    with np.errstate(divide="ignore"):
        (g,) = tg.gradient(ours, matrix)
    np.testing.assert_allclose(g, torch_gradients(theirs, matrix)[0], atol=1e-12)


# --- tg.broadcast against the functions it traces, over the whole domain
NOT_OF_ARRAYS = {"nn.testmode", "nn.trainmode"}  # a model's mode, which passes arrays through


def _domain(arity):
    """The domain's values, and for two arguments every pair of them."""
    x = np.concatenate([special_values(np.float64), np.linspace(-4, 4, 17)])
    if arity == 1:
        return [x]
    a, b = np.meshgrid(x, x)
    return [a.ravel(), b.ravel()]


def _traceable():
    """Every function of the tracked namespace, of `tg.special` and activation of tg.nn that
    broadcast traces on one or two float64 arguments, elementwise."""
    xp = array_api_compat.array_namespace(tg.param(np.zeros(1)))
    found = {name: getattr(xp, name) for name in dir(xp) if not name.startswith("_")}
    for prefix, module in (("special.", tg.special), ("nn.", tg.nn)):
        found.update({prefix + n: getattr(module, n) for n in dir(module)
                      if n.islower() and not n.startswith("_")})  # fmt: skip
    traced = {}
    for name, f in sorted(found.items()):
        if not callable(f) or isinstance(f, type) or name in NOT_OF_ARRAYS:
            continue
        for arity in (1, 2):
            args = _domain(arity)
            try:
                with np.errstate(all="ignore"), tg.sync_checks(False):
                    value = tg.data(f(*map(tg.param, args)))
                    if getattr(value, "shape", None) != args[0].shape or value.dtype != np.float64:
                        continue
                    tg.data(tg.broadcast(f, *args))
            except Exception:  # noqa: BLE001 - not a function of arrays, or not traceable
                continue
            traced[name] = (f, arity)
            break
    return traced


TRACEABLE = _traceable()


def test_the_traceable_functions_are_enumerated():
    names = set(TRACEABLE)
    assert {"exp", "tanh", "sigmoid", "nn.swish", "nn.gelu", "nn.elu"} <= names
    assert {"add", "multiply", "divide", "pow", "maximum", "minimum"} <= names
    assert {"special.sech", "special.xlogx", "special.sinc", "special.xlogy"} <= names


@pytest.mark.parametrize("name", sorted(TRACEABLE))
def test_broadcast_of_a_function_is_the_function_over_the_domain(name):
    f, arity = TRACEABLE[name]
    args = _domain(arity)
    positions = tuple(range(arity))
    # the symbolic derivative against the rule, both generic (the generated kernels against
    # the generic path: test_broadcast.py)
    with np.errstate(all="ignore"), tg.sync_checks(False), generic_only():
        grads = tg.gradient(lambda *a: tg.sum(f(*a)), *args)
        expected_value = tg.data(f(*args))
        traced_value = tg.data(tg.broadcast(f, *args))
        traced = tg.gradient(lambda *a: tg.sum(tg.broadcast(f, *a)), *args)
    assert_agree(traced_value, expected_value, ulps=4, what=f"{name} value")
    for i in positions:  # a constant's gradient is None, broadcast's 0
        expected = np.zeros_like(args[i]) if grads[i] is None else grads[i]
        assert_agree(traced[i], expected, ulps=4, what=f"{name} gradient {i}")


def test_a_rule_whose_vjp_does_not_trace_is_differentiated_through_its_forward():
    """A vjp that needs concrete values (here a Python float of the gradient) cannot be traced:
    broadcast then differentiates the rule's traced forward, as it did every rule before."""
    from tracker_gpu.primitive import Primitive

    doubled_exp = Primitive(
        "doubled_exp",
        lambda xp, x: xp.exp(x) * 2.0,
        # float() of a traced value raises; were this traced, the gradient would be 10 times
        (lambda g, ans, x: g * (float(g) * ans * 10.0),),
    )
    x = np.array([-1.0, 0.0, 2.0])
    (traced,) = tg.gradient(lambda a: tg.sum(tg.broadcast(doubled_exp, a)), x)
    np.testing.assert_allclose(traced, 2.0 * np.exp(x), rtol=1e-15)
