"""The transforms beside `gradient`: `wrt=` (differentiate some arguments only), forward mode
(`jvp`, `jacfwd`) and DLPack. Forward-mode results are checked against central differences of
the function (float64) and against reverse mode's `jacobian`."""

import numpy as np
import pytest

import tracker_gpu as tg


def directional(backend, f, xs, ts, eps=1e-6):
    """Central differences of `f` along the tangents `ts`, as NumPy."""
    up = f(*(x + eps * t for x, t in zip(xs, ts)))
    down = f(*(x - eps * t for x, t in zip(xs, ts)))
    return (backend.to_numpy(tg.data(up)) - backend.to_numpy(tg.data(down))) / (2 * eps)


FUNCTIONS = {
    "elementwise": (lambda x, y: tg.sin(x) * y + x**2, [(3,), (3,)]),
    "matmul": (lambda a, b: tg.tanh(a @ b), [(2, 3), (3, 2)]),
    "reduction": (lambda x, y: tg.sum(tg.exp(x) * y, axis=0), [(2, 3), (2, 3)]),
    "softmax": (lambda x, y: tg.softmax(x * y, axis=-1), [(2, 3), (3,)]),
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_jvp_agrees_with_central_differences(backend, name):
    f, shapes = FUNCTIONS[name]
    rng = np.random.default_rng(len(name))
    xs = [backend.asarray(rng.standard_normal(s)) for s in shapes]
    ts = [backend.asarray(rng.standard_normal(s)) for s in shapes]
    value, tangent = tg.jvp(f, xs, ts)
    np.testing.assert_allclose(backend.to_numpy(value), backend.to_numpy(f(*xs)), rtol=1e-12)
    expected = directional(backend, f, xs, ts)
    np.testing.assert_allclose(backend.to_numpy(tangent), expected, rtol=1e-6, atol=1e-8)


def test_jvp_of_nested_structures(backend):
    def f(params, x):
        return {"loss": tg.sum(params["w"] * x), "scaled": params["w"] * 2.0}

    w, x = backend.asarray([1.0, -2.0]), backend.asarray([0.5, 3.0])
    dw, dx = backend.asarray([1.0, 2.0]), backend.asarray([-1.0, 1.0])
    value, tangent = tg.jvp(f, ({"w": w}, x), ({"w": dw}, dx))
    assert set(value) == set(tangent) == {"loss", "scaled"}
    by_hand = np.sum(np.array([1.0, 2.0]) * [0.5, 3.0] + np.array([1.0, -2.0]) * [-1.0, 1.0])
    assert float(backend.to_numpy(tangent["loss"])) == pytest.approx(by_hand)
    np.testing.assert_allclose(backend.to_numpy(tangent["scaled"]), [2.0, 4.0])


def test_jvp_of_an_output_independent_of_the_input_is_zero(backend):
    c = backend.asarray([1.0, 2.0])
    _, tangent = tg.jvp(lambda x: c * 3.0, (backend.asarray([0.0, 1.0]),), (c,))
    np.testing.assert_array_equal(backend.to_numpy(tangent), [0.0, 0.0])


def test_jvp_checks_its_tangents():
    x = np.ones(3)
    with pytest.raises(ValueError, match="one tangent per primal"):
        tg.jvp(tg.sin, (x,), ())
    with pytest.raises(ValueError, match="shaped like its primal"):
        tg.jvp(tg.sin, (x,), (np.ones(2),))


@pytest.mark.parametrize("name", ["elementwise", "matmul", "softmax"])
def test_jacfwd_equals_the_reverse_mode_jacobian(backend, name):
    f, shapes = FUNCTIONS[name]
    rng = np.random.default_rng(3)
    x, y = (backend.asarray(rng.standard_normal(s)) for s in shapes)
    forward = tg.jacfwd(lambda x: f(x, y), x)
    reverse = tg.jacobian(lambda x: f(x, y), x)
    forward, reverse = backend.to_numpy(forward), backend.to_numpy(reverse)
    # the two modes add the same products in other orders (a GPU's BLAS too): an entry that
    # cancels to near zero is as exact as the largest entry, not as itself
    np.testing.assert_allclose(forward, reverse, rtol=1e-12, atol=1e-14 * np.abs(reverse).max())


# --- wrt
def test_wrt_differentiates_only_the_named_arguments(backend):
    seen = []

    def f(w, x, b):
        seen.append((tg.istracked(w), tg.istracked(x), tg.istracked(b)))
        return tg.sum(tg.add(tg.tanh(tg.multiply(w, x)), b))  # tg.add: either may be plain

    w, x, b = (backend.asarray(v) for v in ([0.5, -1.0], [2.0, 3.0], [1.0, 1.0]))
    full = tg.gradient(f, w, x, b)
    for wrt, chosen in ((0, {0}), ((0, 2), {0, 2}), (-1, {2})):
        grads = tg.gradient(f, w, x, b, wrt=wrt)
        assert seen[-1] == tuple(i in chosen for i in range(3))
        for i, (g, expected) in enumerate(zip(grads, full)):
            if i in chosen:
                np.testing.assert_allclose(backend.to_numpy(g), backend.to_numpy(expected))
            else:
                assert g is None


def test_wrt_keeps_a_float_batch_out_of_the_tape():
    val, grads = tg.withgradient(lambda m, x: tg.sum(m["w"] @ x), {"w": np.eye(2)}, np.ones(2),
                                 wrt=0)  # fmt: skip
    assert grads[1] is None and float(val) == 2.0
    np.testing.assert_array_equal(grads[0]["w"], np.ones((2, 2)))


def test_wrt_must_name_arguments_that_exist():
    with pytest.raises(ValueError, match="names position 2, but the function is given 2"):
        tg.gradient(lambda a, b: tg.sum(a * b), np.ones(2), np.ones(2), wrt=2)
    with pytest.raises(TypeError, match="argument's position or a tuple"):
        tg.gradient(lambda a: tg.sum(a), np.ones(2), wrt="a")


def test_jacobian_and_hessian_with_wrt(backend):
    rng = np.random.default_rng(5)
    a = backend.asarray(rng.standard_normal((2, 3)))
    x = backend.asarray(rng.standard_normal(3))
    jac_x = tg.jacobian(lambda a, x: tg.tanh(tg.matmul(a, x)), a, x, wrt=1)
    np.testing.assert_allclose(
        backend.to_numpy(jac_x),
        backend.to_numpy(tg.jacobian(lambda x: tg.tanh(tg.matmul(a, x)), x)),
    )
    jac_a, jac_x2 = tg.jacobian(lambda a, x: tg.tanh(tg.matmul(a, x)), a, x, wrt=(0, 1))
    assert tuple(jac_a.shape) == (2, 2, 3)  # output shape + input shape
    np.testing.assert_allclose(backend.to_numpy(jac_x2), backend.to_numpy(jac_x))
    hess = tg.hessian(lambda a, x: tg.sum(tg.tanh(tg.matmul(a, x)) ** 2), a, x, wrt=1)
    grad = lambda x: tg.gradient(lambda x: tg.sum(tg.tanh(tg.matmul(a, x)) ** 2), x)[0]  # noqa: E731
    for j in range(3):
        step = backend.asarray(np.eye(3)[j] * 1e-6)
        column = (backend.to_numpy(grad(x + step)) - backend.to_numpy(grad(x - step))) / 2e-6
        np.testing.assert_allclose(backend.to_numpy(hess)[:, j], column, rtol=1e-5, atol=1e-8)


# --- DLPack
def test_dlpack_exports_constants_and_refuses_arrays_on_the_tape():
    torch = pytest.importorskip("torch")
    x = tg.param(np.array([1.0, 2.0, 3.0]))
    y = x * 2.0
    for export in (torch.from_dlpack, np.from_dlpack, tg.from_dlpack):
        with pytest.raises(BufferError, match="would carry no gradient.*tg.data"):
            export(y)
    t = torch.from_dlpack(tg.stop_gradient(y))
    assert t.tolist() == [2.0, 4.0, 6.0]
    assert y.__dlpack_device__() == tg.data(y).__dlpack_device__()
    back = tg.from_dlpack(t)
    np.testing.assert_array_equal(back, [2.0, 4.0, 6.0])
    assert not tg.istracked(back)
