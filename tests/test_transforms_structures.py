"""jvp, hvp, jacobian and forward on structures and Python numbers, against JAX's answers
written out by hand (JAX itself is not a dependency): a tangent pairs with its primal by
place (a dict's by key, not by insertion order), an array passed in two places is two
variables with a tangent each, a Python float primal is a 0-d array whose tangent is the
derivative (it used to come back as the value itself), a number in the output has a zero
tangent, and jacobian and forward refuse a structure they would have taken for a constant.
jacobian keeps wrt's order, and refuses a complex output of a real input."""

import numpy as np
import pytest

import tracker_gpu as tg


def test_a_float_primal_has_the_derivative_as_its_tangent():
    assert tuple(map(float, tg.jvp(lambda y: y * y, (3.0,), (1.0,)))) == (9.0, 6.0)
    assert tuple(map(float, tg.jvp(lambda t: t, (2.0,), (7.0,)))) == (2.0, 7.0)
    value, tangent = tg.jvp(tg.sin, (1.0,), (1.0,))
    assert float(value) == np.sin(1.0) and float(tangent) == np.cos(1.0)


@pytest.mark.parametrize("point", [2.0, 2], ids=["float", "int"])
def test_jacobians_and_the_hessian_take_a_python_number_as_gradient_does(point):
    """They refused one (gradient, jvp and hvp take it as a 0-d array)."""
    f = lambda x: tg.stack([x * x, x * 3.0])  # noqa: E731
    for transform in (tg.jacobian, tg.jacfwd):
        np.testing.assert_array_equal(transform(f, point), [4.0, 3.0])
    assert float(tg.hessian(lambda x: x**3, point)) == 12.0
    assert float(tg.gradient(lambda x: x**3, float(point))[0]) == 12.0


def test_a_number_in_the_output_has_a_zero_tangent():
    value, tangent = tg.jvp(lambda y: {"a": y * y, "b": 2.0}, (np.array(3.0),), (np.array(1.0),))
    assert value["b"] == 2.0 and tangent["b"] == 0.0 and float(tangent["a"]) == 6.0


def test_nested_jvps_of_floats_do_not_confuse_their_perturbations():
    inner = lambda x: tg.jvp(lambda y: x + y, (1.0,), (1.0,))[1]  # d/dy (x + y) = 1
    assert float(tg.jvp(lambda x: x * inner(x), (3.0,), (1.0,))[1]) == 1.0


def test_tangents_pair_with_primals_by_key():
    a, b = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    primal = {"a": a, "b": b}
    direction = {"b": np.ones(2), "a": np.zeros(2)}  # another insertion order
    _, t = tg.jvp(lambda d: d["a"] * 2 + d["b"] ** 2, (primal,), (direction,))
    np.testing.assert_array_equal(t, 2 * b)
    (h,) = tg.hvp(lambda d: tg.sum(d["a"] ** 3 + d["b"] ** 2), (primal,), (direction,))
    np.testing.assert_array_equal(h["a"], [0.0, 0.0])
    np.testing.assert_array_equal(h["b"], [2.0, 2.0])
    single = tg.hvp(lambda d: tg.sum(d["a"] ** 3), {"a": a}, {"a": np.ones(2)})
    np.testing.assert_array_equal(single["a"], 6 * a)


@pytest.mark.parametrize("given", ["arguments", "dict"])
def test_an_array_in_two_places_is_two_variables(given):
    x, o = np.array([1.0, 2.0, 3.0]), np.ones(3)
    if given == "arguments":
        _, t = tg.jvp(lambda a, b: a * b, (x, x), (o, o))
    else:
        _, t = tg.jvp(lambda d: d["a"] * d["b"], ({"a": x, "b": x},), ({"a": o, "b": o},))
    np.testing.assert_array_equal(t, 2 * x)  # o * x + x * o
    ha, hb = tg.hvp(lambda a, b: tg.sum(a**2 * b), (x, x), (o, o))
    np.testing.assert_array_equal(ha, 2 * x + 2 * x)  # (2b) o + (2a) o at a = b = x
    np.testing.assert_array_equal(hb, 2 * x)  # (2a) o


T1, T2 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
X2 = np.array([1.0, 2.0])


def _tied_jvp(x):
    return tg.jvp(lambda a, b: a * b, (x, x), (T1, T2))[1]  # T1 * x + x * T2


def _tied_hvps(x):
    return tg.hvp(lambda a, b: tg.sum(a**2 * b), (x, x), (T1, T2))  # (2b T1 + 2a T2, 2a T1)


@pytest.mark.parametrize("where", ["a parameter", "inside a gradient"])
def test_a_tracked_array_in_two_places_is_two_variables(where):
    """A tracked array given twice was one variable: its whole gradient in each place, and
    the tangent the sum of both directions' (2x the answer, silently)."""
    if where == "a parameter":
        np.testing.assert_array_equal(tg.data(_tied_jvp(tg.param(X2))), T1 * X2 + X2 * T2)
        ha, hb = _tied_hvps(tg.param(X2))
        np.testing.assert_array_equal(tg.data(ha), 2 * X2 * T1 + 2 * X2 * T2)
        np.testing.assert_array_equal(tg.data(hb), 2 * X2 * T1)
    else:  # d/dx sum(T1 * x + x * T2) = T1 + T2
        (g,) = tg.gradient(lambda x: tg.sum(_tied_jvp(x)), X2)
        np.testing.assert_array_equal(g, T1 + T2)


def test_hvp_of_one_structure_with_an_array_in_two_places_is_of_two_variables():
    """The one-argument hvp never untied a structure: a dict of one array twice gave both
    places the sum of both directions' product."""
    f = lambda d: tg.sum(d["u"] ** 2 * d["w"])  # noqa: E731
    h = tg.hvp(f, {"u": X2, "w": X2}, {"u": T1, "w": T2})
    np.testing.assert_array_equal(h["u"], 2 * X2 * T1 + 2 * X2 * T2)  # (2w) T1 + (2u) T2
    np.testing.assert_array_equal(h["w"], 2 * X2 * T1)  # (2u) T1


@pytest.mark.parametrize("output", [lambda t: (t * 2, t * 3), lambda t: {"p": t * 2}])
def test_jacobian_and_forward_refuse_a_structure(output):
    x = np.array([1.0, 2.0])
    with pytest.raises(TypeError, match="jacobian: f must return one array"):
        tg.jacobian(output, x)
    with pytest.raises(TypeError, match="forward: f must return one array"):
        tg.forward(output, x)


@pytest.mark.parametrize("wrt", [(1, 0), (-1, 0), (0, 1)])
def test_jacobians_come_in_the_order_wrt_names_them(wrt):
    a, x = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([5.0, -6.0])
    by_position = {0: np.kron(np.eye(2), x).reshape(2, 2, 2), 1: a}  # d(a @ x)/da and /dx
    found = tg.jacobian(lambda a, x: a @ x, a, x, wrt=wrt)
    assert len(found) == len(wrt)
    for i, jac in zip(wrt, found):
        np.testing.assert_array_equal(jac, by_position[i % 2])


def test_jacobian_refuses_a_complex_output_of_a_real_input():
    """Its Jacobian is complex, (1 + 2j) I here, and the reverse passes would give its real
    part alone, as they once did; the parts taken apart give it."""
    x = np.array([1.0, 2.0])
    with pytest.raises(TypeError, match=r"complex values .*tg\.real\(f\(x\)\)"):
        tg.jacobian(lambda x: x * (1 + 2j), x)
    real = tg.jacobian(lambda x: tg.real(x * (1 + 2j)), x)
    imag = tg.jacobian(lambda x: tg.imag(x * (1 + 2j)), x)
    np.testing.assert_array_equal(real + 1j * imag, (1 + 2j) * np.eye(2))
