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


RANDOM_OR_STATEFUL = {  # f, x: what f draws or updates must be the same for value and tangent
    "dropout": (lambda: tg.nn.Dropout(0.5, rng=np.random.default_rng(0), active=True),
                np.linspace(1.0, 2.0, 8)),
    "batchnorm": (lambda: tg.nn.BatchNorm(2, dtype="float64"),
                  np.array([[1.0, 2.0], [3.0, -1.0], [0.0, 0.5]])),
    "numpy draws": (lambda: _times_draws(np.random.default_rng(1)), np.array([1.0, 2.0, 3.0])),
}  # fmt: skip


def _times_draws(rng):
    return lambda x: x * rng.standard_normal(3)


@pytest.mark.parametrize("name", sorted(RANDOM_OR_STATEFUL))
def test_jvp_runs_f_once_for_its_value_and_tangent(name):
    """The value and tangent of one run: a linear f's tangent along x is its value at x (the
    value had come from a second run: other masks, batch norm in inference mode), and a batch
    norm's running statistics are updated once, as one forward pass does."""
    make, x = RANDOM_OR_STATEFUL[name]
    f, twin = make(), make()
    value, tangent = tg.jvp(f, (x,), (x,))
    if name == "batchnorm":  # not linear; its training-mode value, and one update
        twin = tg.nn.trainmode(twin)
        np.testing.assert_allclose(value, tg.data(twin(x)), rtol=1e-12)
        np.testing.assert_array_equal(f.running_mean, twin.running_mean)
        return
    np.testing.assert_allclose(tangent, value, rtol=1e-12)
    np.testing.assert_array_equal(value, tg.data(twin(x)))


def test_jvp_past_an_infinite_or_nan_output_is_the_derivative():
    """`<J^T u, t>` with u = 0 is nan where an output is infinite: no error for it, the tangent
    is the derivative (as JAX's)."""
    x, t = np.array([0.0, 1.0]), np.ones(2)
    np.testing.assert_array_equal(tg.jvp(tg.log, (x,), (t,))[1], [np.inf, 1.0])
    found = tg.jvp(lambda x: tg.where(x > 0, tg.sqrt(x), 0.0), (x,), (t,))[1]
    np.testing.assert_array_equal(found, [0.0, 0.5])
    np.testing.assert_array_equal(tg.hvp(lambda x: tg.sum(x**3 / 6), x, t), x)


def test_jvp_gives_integer_outputs_a_zero_tangent_of_their_dtype():
    value, tangent = tg.jvp(lambda a: (a * 2.0, tg.argmax(a)), (np.array([1.0, 5.0]),),
                            (np.ones(2),))  # fmt: skip
    np.testing.assert_array_equal(tangent[0], [2.0, 2.0])
    assert int(value[1]) == 1 and tangent[1].dtype == value[1].dtype and int(tangent[1]) == 0


EMPTY = {  # f, x, the shape of the Jacobian (JAX's layout: f(x).shape + x.shape)
    "empty output": (lambda a: a[:0] * 2.0, np.ones(2), (0, 2)),
    "empty input": (lambda a: tg.sum(a) * np.ones(3), np.zeros(0), (3, 0)),
    "empty both": (lambda a: a * 2.0, np.zeros((0, 2)), (0, 2, 0, 2)),
}


@pytest.mark.parametrize("name", sorted(EMPTY))
@pytest.mark.parametrize("transform", ["jacobian", "jacfwd"])
def test_jacobians_of_empty_arrays_are_empty(name, transform):
    f, x, shape = EMPTY[name]
    found = getattr(tg, transform)(f, x)
    assert found.shape == shape and not isinstance(found, tg.TrackedArray)


def test_the_hessian_at_an_empty_point_is_empty():
    assert tg.hessian(lambda a: tg.sum(a**2), np.zeros(0)).shape == (0, 0)


def test_jvp_and_hvp_of_complex_primals_are_those_of_their_real_pairs():
    """A real f of z = a + ib along v = c + id: the derivative along (c, d) of f(a, b), and the
    Hessian of f(a, b) times (c, d) as a complex array (PyTorch's autograd on the pairs)."""
    torch = pytest.importorskip("torch")
    z, v = np.array([1 + 2j, -0.5 + 0.3j]), np.array([1j, 0.7 - 0.2j])
    _, tangent = tg.jvp(lambda z: tg.abs(z) ** 2, (z,), (v,))
    np.testing.assert_allclose(tangent, 2 * (z.real * v.real + z.imag * v.imag), rtol=1e-12)
    found = tg.hvp(lambda z: tg.sum(tg.abs(z) ** 4), z, v)
    a, b = (torch.tensor(part, requires_grad=True) for part in (z.real, z.imag))
    ga, gb = torch.autograd.grad(torch.sum((a**2 + b**2) ** 2), (a, b), create_graph=True)
    along = torch.sum(ga * torch.tensor(v.real)) + torch.sum(gb * torch.tensor(v.imag))
    ha, hb = torch.autograd.grad(along, (a, b))
    np.testing.assert_allclose(found, ha.numpy() + 1j * hb.numpy(), rtol=1e-12)


def test_jvp_checks_its_tangents():
    x = np.ones(3)
    with pytest.raises(ValueError, match="one tangent per primal"):
        tg.jvp(tg.sin, (x,), ())
    with pytest.raises(ValueError, match="shaped like its primal"):
        tg.jvp(tg.sin, (x,), (np.ones(2),))


CUBE = lambda x: tg.sum(x**3)  # noqa: E731


@pytest.mark.parametrize("v", [np.ones((3, 1)), np.ones(1), 1.0, np.ones(2), np.ones((1, 3))])
@pytest.mark.parametrize("form", ["one", "tuple", "dict"])
def test_hvp_refuses_a_direction_not_shaped_like_its_point(v, form):
    """A (3, 1) direction was broadcast through the pass: H times ones((3, 3)), summed."""
    x = np.array([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"hvp: a direction must be shaped like its point"):
        if form == "one":
            tg.hvp(CUBE, x, v)
        elif form == "tuple":
            tg.hvp(CUBE, (x,), (v,))
        else:
            tg.hvp(lambda d: CUBE(d["x"]), {"x": x}, {"x": v})


@pytest.mark.parametrize("direction", [np.ones(2), np.array([1, 0]), np.array([False, True])])
@pytest.mark.parametrize("transform", ["jvp", "hvp"])
def test_a_direction_of_an_integer_point_is_refused_not_dropped(transform, direction):
    """An integer array is data, as gradient takes it: jvp's tangent was zeros, hvp None, for
    a float direction, and for integers or booleans that are not all zero."""
    x, v = np.array([1, 2]), direction
    with pytest.raises(ValueError, match=r"of dtype int64 is data.*astype\(float\)"):
        if transform == "jvp":
            tg.jvp(lambda x: x * 3.0, (x,), (v,))
        else:
            tg.hvp(CUBE, x, v)
    with pytest.raises(ValueError, match=r"of dtype int is data"):  # a Python integer
        if transform == "jvp":
            tg.jvp(lambda x: x * 3.0, (3,), (1,))
        else:
            tg.hvp(CUBE, (3,), (1,))
    # integer data beside a float argument, with an integer direction: the data's part is zero
    y, w = np.array([0.5, 1.5]), np.array([1.0, -1.0])
    if transform == "jvp":
        _, t = tg.jvp(lambda x, y: x * y**2, (x, y), (np.zeros(2, int), w))
        np.testing.assert_allclose(t, 2 * x * y * w)
    else:
        _, h = tg.hvp(lambda x, y: tg.sum(x * y**3), (x, y), (np.zeros(2, int), w))
        np.testing.assert_allclose(h, 6 * x * y * w)


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


def test_jacfwd_of_a_complex_input_is_the_reverse_mode_jacobian():
    """`df/da + i df/db` per element of z = a + ib, as `jacobian` gives it (PyTorch's
    convention); jacfwd took the real directions only, and dropped df/db silently. Checked
    against central differences of the real pairs."""
    z = np.array([1.0 + 2.0j, -0.5 + 0.3j])
    f = lambda z: tg.real(z * tg.conj(z)) * tg.sin(tg.imag(z)) + 3.0 * tg.imag(z)  # noqa: E731

    def plain(a, b):
        return (a * a + b * b) * np.sin(b) + 3.0 * b

    eps, columns = 1e-6, []
    for j in range(2):
        e = np.eye(2)[j] * eps
        da = (plain(z.real + e, z.imag) - plain(z.real - e, z.imag)) / (2 * eps)
        db = (plain(z.real, z.imag + e) - plain(z.real, z.imag - e)) / (2 * eps)
        columns.append(da + 1j * db)
    expected = np.stack(columns, axis=1)
    np.testing.assert_allclose(tg.jacobian(f, z), expected, rtol=1e-8)
    np.testing.assert_allclose(tg.jacfwd(f, z), expected, rtol=1e-8)


def test_jacfwd_of_an_integer_input_differentiates_it_as_jacobian_does():
    """jacfwd gave integer zeros where jacobian gives the derivative at the integers."""
    x = np.array([1, 2])
    forward = tg.jacfwd(lambda x: x**3, x)
    assert forward.dtype == np.float64
    np.testing.assert_array_equal(forward, np.diag(3.0 * x**2))
    np.testing.assert_array_equal(forward, tg.jacobian(lambda x: x**3, x))


def test_jacfwd_runs_f_once_as_jacobian_does():
    """It ran f once a column: a batch norm's statistics were updated once per element of x,
    and each column had its own dropout mask, the Jacobian of no one run."""
    from tracker_gpu import nn

    x = np.random.default_rng(0).standard_normal((4, 2))
    by_reverse, by_forward = nn.BatchNorm(2), nn.BatchNorm(2)
    nn.trainmode(by_reverse)
    nn.trainmode(by_forward)
    np.testing.assert_allclose(tg.jacfwd(by_forward, x), tg.jacobian(by_reverse, x), rtol=1e-5)
    np.testing.assert_array_equal(by_forward.running_mean, by_reverse.running_mean)
    dropout, v, calls = nn.Dropout(0.5, rng=np.random.default_rng(1)), np.arange(1.0, 7.0), []
    nn.trainmode(dropout)
    jac = tg.jacfwd(lambda v: calls.append(1) or dropout(v) * tg.sum(v), v)
    assert len(calls) == 1
    for i, row in enumerate(jac):  # one mask m: row i is 0, or 2 (v_i + sum(v) [i == j])
        kept = 2 * (v[i] + v.sum() * (np.arange(6) == i))
        assert np.array_equal(row, np.zeros(6)) or np.allclose(row, kept), (i, row)
    assert 0 < sum(row.any() for row in jac) < 6  # the seed keeps some and drops some


@pytest.mark.parametrize("structure", [lambda x: (x, 2 * x), lambda x: {"a": x}])
def test_jacfwd_of_a_structure_is_refused_as_jacobians(structure):
    with pytest.raises(TypeError, match="jacfwd: f must return one array"):
        tg.jacfwd(structure, np.array([1.0, 2.0]))  # an AttributeError on .shape before


def test_jacfwd_of_an_integer_output_is_jacobians_float_zeros():
    f = lambda x: tg.astype(x, tg.int64)  # noqa: E731
    x = np.array([1.5, 2.0])
    forward, reverse = tg.jacfwd(f, x), tg.jacobian(f, x)
    assert forward.dtype == reverse.dtype == np.float64
    np.testing.assert_array_equal(forward, np.zeros((2, 2)))


@pytest.mark.parametrize("transform", ["jvp", "jacfwd"])
@pytest.mark.parametrize("tracked_by", ["a parameter given", "a parameter closed over"])
def test_forward_mode_at_top_level_of_a_parameter_is_cut_off(transform, tracked_by):
    """Its tangent was a plain array: differentiating it again dropped the dependence on the
    parameter silently (d/dq sum(2q * q) came out 2q, not 4q). As a top-level gradient's, it
    raises, naming the fix."""
    q = tg.param(np.array([1.0, 2.0]))
    if tracked_by == "a parameter given":
        f, at = (lambda x: x**2), q
    else:
        f, at = (lambda x: q * x**2), np.array([1.0, 2.0])
    if transform == "jvp":
        derivative = tg.jvp(f, (at,), (np.ones(2),))[1]
    else:
        derivative = tg.jacfwd(f, at) @ np.ones(2)
    np.testing.assert_array_equal(tg.data(derivative), [2.0, 4.0] if at is q else [2.0, 8.0])
    with pytest.raises(tg.PullbackError, match="taken at top level"):
        tg.back(tg.sum(derivative * q))


def test_forward_mode_at_top_level_of_plain_arrays_stays_plain():
    _, t = tg.jvp(lambda x: x**2, (np.array([1.0, 2.0]),), (np.ones(2),))
    assert type(t) is np.ndarray
    assert type(tg.jacfwd(lambda x: x**2, np.array([1.0, 2.0]))) is np.ndarray


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
    total = tg.stop_gradient(tg.sum(y))  # its data a NumPy scalar, which has no __dlpack__
    assert total.__dlpack_device__() == (1, 0)
    for export in (torch.from_dlpack, np.from_dlpack):
        assert float(export(total)) == 12.0
