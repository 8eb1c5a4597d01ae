"""Nested differentiation and the functional API: hessian, hvp, jacobian, forward, hook,
checkpoint, nobacksies, notrack. Hessians are checked against finite differences of the
first-order gradient (itself checked against finite differences of the function elsewhere)."""

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.cuda import on_host

W2 = np.array([[0.3, -0.2, 0.5], [0.1, 0.4, -0.3]])


def mlp_loss(x):
    hidden = tg.tanh(tg.reshape(x[:6], (2, 3)) @ x[6:9] + x[9:11])
    return tg.sum(tg.logsoftmax(tg.concat([hidden, tg.sigmoid(hidden)]), axis=0) * x[11])


def const(x, values):
    """A constant on the library and device of `x`."""
    return tg.asarray(np.asarray(values), device=x.device)


def eye(x, n):
    return tg.eye(n, dtype=x.dtype, device=x.device)


def square_matrix(x, n):
    return tg.reshape(x[: n * n], (n, n))


HESSIANS = {
    "cube": (lambda x: tg.sum(x**3), 4),
    "prod with a zero": (lambda x: tg.prod(x * const(x, [1.0, 0.0, 1.0, 1.0])), 4),
    "prod": (tg.prod, 4),
    "indexing with repeats": (lambda x: tg.sum(tg.sin(x[const(x, [0, 1, 1, 3])]) ** 2), 4),
    "logsumexp": (tg.logsumexp, 4),
    "softmax": (lambda x: tg.sum(tg.softmax(x) * const(x, [1.0, 2.0, 3.0, 4.0])), 4),
    "logsoftmax": (lambda x: tg.sum(tg.logsoftmax(x) * const(x, [1.0, -2.0, 3.0, 0.5])), 4),
    "max": (lambda x: tg.max(x * x), 4),
    "min": (lambda x: tg.min(tg.exp(x)), 4),
    "var": (lambda x: tg.var(x, correction=1), 4),
    "std": (tg.std, 4),
    "exp sin": (lambda x: tg.sum(tg.exp(x) * tg.sin(x)), 4),
    "tanh sigmoid": (lambda x: tg.sum(tg.tanh(x) * tg.sigmoid(x)), 4),
    "division": (lambda x: tg.sum(x[:2] / (x[2:] + 3.0)), 4),
    "power": (lambda x: tg.sum((x + 2.0) ** (x * 0.5)), 4),
    "mlp": (mlp_loss, 12),
    "det": (lambda x: tg.linalg.det(square_matrix(x, 3) + 3 * eye(x, 3)), 9),
    "solve": (
        lambda x: tg.sum(tg.linalg.solve(square_matrix(x, 2) + 2 * eye(x, 2), x[:2])),
        4,
    ),
    "inv": (lambda x: tg.sum(tg.linalg.inv(square_matrix(x, 2) + 2 * eye(x, 2)) ** 2), 4),
    "logdet": (lambda x: tg.logdet(square_matrix(x, 2) @ square_matrix(x, 2).mT + eye(x, 2)), 4),
    "matmul": (lambda x: tg.sum((square_matrix(x, 2) @ square_matrix(x, 2)) ** 2), 4),
    "cumulative_sum": (lambda x: tg.sum(tg.cumulative_sum(x) ** 3), 4),
    "cumulative_prod": (lambda x: tg.sum(tg.cumulative_prod(x)), 4),
    "sort": (lambda x: tg.sum(tg.sort(x) * const(x, [1.0, 2.0, 3.0, 4.0]) * x), 4),
    "take": (lambda x: tg.sum(tg.take(x, const(x, [0, 0, 2])) ** 3), 4),
    "where maximum abs": (lambda x: tg.sum(tg.maximum(x, 0.1) * tg.abs(x) * x), 4),
}


def numeric_hessian(f, x, eps=1e-5):
    """Central differences of the (separately verified) first-order gradient."""
    n = x.size
    columns = []
    for j in range(n):
        step = np.zeros(n)
        step[j] = eps
        up = tg.gradient(f, x + step)[0]
        down = tg.gradient(f, x - step)[0]
        columns.append((np.asarray(up) - np.asarray(down)) / (2 * eps))
    return np.stack(columns, axis=1)


@pytest.mark.parametrize("name", HESSIANS)
def test_hessian_matches_finite_differences(backend, name):
    f, n = HESSIANS[name]
    rng = np.random.default_rng(7)
    x = rng.uniform(0.2, 1.2, n) * rng.choice([-1.0, 1.0], n)
    if name.startswith("prod with"):
        x = np.abs(x)
    H = backend.to_numpy(tg.hessian(f, backend.asarray(x)))
    assert np.allclose(H, numeric_hessian(f, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("wrt", [(0, 1), (1, 0), (1,)])
def test_hessian_blocks_of_several_arguments_match_finite_differences(backend, wrt):
    """`wrt` a tuple (as the README promises, JAX's argnums): the blocks of the Hessian of `f`
    in all its arguments, `h[a][b]` of shape `x_a.shape + x_b.shape` (it was refused)."""

    def f(x, y, c):  # tg.multiply: array-api-strict refuses a tracked right operand
        return tg.sum(tg.multiply(tg.sin(x)[:, None], y**2)) * tg.sum(x * x) + c * tg.sum(tg.exp(y))

    rng = np.random.default_rng(9)
    args = (rng.uniform(-1.0, 1.0, 2), rng.uniform(-1.0, 1.0, (2, 3)), 0.5)
    shapes, sizes = [(2,), (2, 3)], [2, 6]
    flat = lambda z: f(z[:2], tg.reshape(z[2:], (2, 3)), 0.5)  # noqa: E731
    full = numeric_hessian(flat, np.concatenate([args[0], args[1].ravel()]))
    starts = [0, 2]
    blocks = tg.hessian(f, *(backend.asarray(a) for a in args[:2]), args[2], wrt=wrt)
    assert len(blocks) == len(wrt)
    for a, row in zip(wrt, blocks):
        assert len(row) == len(wrt)
        for b, block in zip(wrt, row):
            expected = full[starts[a] : starts[a] + sizes[a], starts[b] : starts[b] + sizes[b]]
            got = backend.to_numpy(block)
            assert got.shape == shapes[a] + shapes[b]
            assert np.allclose(got.reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)


FORWARD_OVER_REVERSE = ("logsumexp", "mlp", "matmul", "indexing with repeats", "det")


@pytest.mark.parametrize("name", FORWARD_OVER_REVERSE)
def test_forward_over_reverse_agrees_with_reverse_over_reverse(backend, name):
    """The Hessian as `jacfwd` of the nested gradient (forward over reverse, which
    benchmarks/higher_order.py times against `hessian`'s reverse over reverse) equals finite
    differences, and `hessian` to rounding."""
    f, n = HESSIANS[name]
    x = np.random.default_rng(8).uniform(-1.2, 1.2, n)
    forward = backend.to_numpy(
        tg.jacfwd(lambda x: tg.gradient(f, x, nest=True)[0], backend.asarray(x))
    )
    assert np.allclose(forward, numeric_hessian(f, x), rtol=1e-5, atol=1e-6)
    reverse = backend.to_numpy(tg.hessian(f, backend.asarray(x)))
    assert np.allclose(forward, reverse, rtol=1e-12, atol=1e-12)


def test_hessian_of_prod_is_exact_at_zeros():
    x = np.array([2.0, 0.0, 3.0, 5.0])
    H = tg.hessian(tg.prod, x)
    expected = np.array(
        [[np.prod(np.delete(x, [i, j])) if i != j else 0.0 for j in range(4)] for i in range(4)]
    )
    assert np.allclose(H, expected)


@pytest.mark.parametrize(
    "f",
    [
        lambda x: tg.sum(tg.floor(x)),
        lambda x: tg.sum(tg.sign(x) * 2.0),
        lambda x: tg.max(tg.round(x)),
    ],
    ids=["floor", "sign", "round"],
)
def test_the_hessian_of_a_piecewise_constant_function_is_zeros(f):
    """Its nested gradient is None (no tracked path to x): the Hessian raised that f must
    return one array, naming a NoneType the user's f never returned. Away from the steps
    (as here) the second derivative is zero."""
    x = np.array([1.5, 2.25, -0.75])
    np.testing.assert_array_equal(tg.hessian(f, x), np.zeros((3, 3)))
    np.testing.assert_array_equal(tg.hessian(f, tg.param(x)), np.zeros((3, 3)))


def test_hessian_of_a_100_parameter_mlp(backend):
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((8, 6))
    labels = np.eye(3)[rng.integers(0, 3, 8)]
    xb, yb = backend.asarray(inputs), backend.asarray(labels)
    sizes = [(12, 6), (12,), (3, 12), (3,)]  # 72 + 12 + 36 + 3 = 123 parameters

    def loss(theta, x=xb, y=yb):
        parts, start = [], 0
        for shape in sizes:
            size = int(np.prod(shape))
            parts.append(tg.reshape(theta[start : start + size], shape))
            start += size
        W1, b1, W2, b2 = parts
        hidden = tg.tanh(tg.matmul(x, W1.mT) + b1)
        logits = tg.matmul(hidden, W2.mT) + b2
        return -tg.mean(tg.sum(tg.logsoftmax(logits, axis=-1) * y, axis=-1))

    theta = rng.standard_normal(123) * 0.3
    H = backend.to_numpy(tg.hessian(loss, backend.asarray(theta)))
    reference = numeric_hessian(lambda t: loss(t, inputs, labels), theta)
    assert np.allclose(H, H.T, atol=1e-10)
    scale = np.max(np.abs(reference))
    assert np.max(np.abs(H - reference)) <= 1e-6 * scale


def test_hvp_equals_hessian_times_vector(backend):
    f = HESSIANS["mlp"][0]
    rng = np.random.default_rng(1)
    x, v = rng.uniform(-1, 1, 12), rng.uniform(-1, 1, 12)
    hv = tg.hvp(f, backend.asarray(x), backend.asarray(v))
    assert np.allclose(backend.to_numpy(hv), numeric_hessian(f, x) @ v, atol=1e-6)


@pytest.mark.parametrize("name", list(HESSIANS))
def test_hvp_is_its_definition_bit_for_bit(backend, name):
    """`hvp` at top level walks its nested pass itself (one transform, no identity node): the
    same bits as its definition, the gradient of `sum(gradient(f, x) * v)`."""
    f, n = HESSIANS[name]
    rng = np.random.default_rng(2)
    x, v = backend.asarray(rng.uniform(-1, 1, n)), backend.asarray(rng.uniform(-1, 1, n))
    by_definition = tg.gradient(lambda x: tg.sum(tg.gradient(f, x, nest=True)[0] * v), x)[0]
    np.testing.assert_array_equal(backend.to_numpy(tg.hvp(f, x, v)),
                                  backend.to_numpy(by_definition))  # fmt: skip


def test_third_order_of_a_scalar_function():
    def d(f):
        return lambda x: tg.gradient(f, x, nest=True)[0]

    third = tg.gradient(d(d(lambda x: tg.sin(x) * x**3)), 0.7)[0]
    x = 0.7
    expected = -np.cos(x) * x**3 - 9 * np.sin(x) * x**2 + 18 * np.cos(x) * x + 6 * np.sin(x)
    assert np.isclose(float(third), expected)


# --- Tracker's behaviour cases
def test_a_hook_that_returns_none_keeps_the_gradient():
    """A hook that only looks (prints, notes) returns None: the gradient was dropped, with no
    word; PyTorch's register_hook keeps it, and so does tg.hook now."""
    seen = []
    (g,) = tg.gradient(lambda x: tg.sum(tg.hook(seen.append, x) * 3.0), np.array([1.0, 2.0]))
    assert np.array_equal(g, [3.0, 3.0]) and np.array_equal(seen[0], [3.0, 3.0])


def test_hook_flips_the_gradient():
    assert float(tg.gradient(lambda x: tg.hook(lambda d: -d, x), 2.0)[0]) == -1.0


def test_a_hook_reading_a_tracked_value_gives_plain_gradients_at_top_level():
    """A hook `g * W` of a parameter W, or of the outer variable inside a nested gradient:
    the values were right, but top-level gradients came back tracked (on the tape). Against
    PyTorch's register_hook, to second order."""
    torch = pytest.importorskip("torch")
    W, x0 = np.array([2.0, 3.0]), np.array([1.2, 0.7])
    w = tg.param(W)
    (g,) = tg.gradient(lambda y: tg.sum(tg.hook(lambda d: d * w, y) ** 2), np.ones(2))
    assert type(g) is np.ndarray
    np.testing.assert_array_equal(g, 2.0 * W)

    inner = lambda x: tg.gradient(lambda y: tg.sum(tg.hook(lambda d: d * x, y) ** 2), x)[0]  # noqa: E731
    (g,) = tg.gradient(lambda x: tg.sum(inner(x)), x0)
    assert type(g) is np.ndarray
    t = torch.tensor(x0, requires_grad=True)
    y = t * 1.0  # the inner variable at the outer point, as tg.gradient's inner input is
    y.register_hook(lambda d: d * t)
    (gy,) = torch.autograd.grad(torch.sum(y**2), y, create_graph=True)
    (expected,) = torch.autograd.grad(gy.sum(), t)
    np.testing.assert_allclose(g, expected.numpy(), rtol=1e-12)


def test_checkpoint_runs_f_again_in_the_backward_pass():
    count = []

    def mul(a, b):
        count.append(1)
        return a * b

    assert float(tg.gradient(lambda x: mul(5.0, x), 3.0)[0]) == 5.0
    assert len(count) == 1
    assert float(tg.gradient(lambda x: tg.checkpoint(mul, 5.0, x), 3.0)[0]) == 5.0
    assert len(count) == 3


def test_checkpoint_is_twice_differentiable():
    f = lambda x: tg.sum(tg.checkpoint(lambda y: tg.sin(y) * y, x))  # noqa: E731
    x = np.array([0.3, 1.1])
    assert np.allclose(np.diag(tg.hessian(f, x)), 2 * np.cos(x) - x * np.sin(x))


def _dropout_block(rng):
    drop = nn.Dropout(0.5, rng=rng)
    return lambda x: drop(tg.tanh(x)) * x


def test_checkpoint_replays_the_random_draws_of_its_block(backend):
    """The backward re-run of a block with Dropout uses the forward's mask: the gradient is that
    of the function whose value was computed (here written out by hand from the same draws)."""
    x_np = np.linspace(-1.5, 1.5, 16)
    x = backend.asarray(x_np)
    rng = np.random.default_rng(7)
    keep = np.random.default_rng(7).random(16) >= 0.5
    block = _dropout_block(rng)
    value, (g,) = tg.withgradient(lambda x: tg.sum(tg.checkpoint(block, x)), x)
    t = np.tanh(x_np)
    assert np.isclose(float(value), np.sum(keep * 2 * t * x_np))
    assert np.allclose(backend.to_numpy(g), keep * 2 * ((1 - t**2) * x_np + t))


def test_checkpoint_leaves_the_generator_where_the_forward_left_it():
    rng, twin = np.random.default_rng(3), np.random.default_rng(3)
    x = tg.param(np.linspace(0.5, 1.5, 6))
    loss = tg.sum(tg.checkpoint(_dropout_block(rng), x))
    twin.random(6)  # the forward's draw
    tg.back(loss, once=False)
    first = np.copy(tg.grad(x))
    tg.zero_grad(x)
    tg.back(loss)  # a second re-run, with the forward's mask again
    assert np.array_equal(tg.grad(x), first)
    assert rng.random() == twin.random()


def test_jacobian_of_a_linear_map_is_the_matrix(backend):
    A = backend.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    J = tg.jacobian(lambda x: tg.matmul(A, x), backend.asarray([1.0, 1.0, 1.0]))
    assert np.array_equal(backend.to_numpy(J), backend.to_numpy(A))


def test_jacobian_keeps_the_shapes_of_output_and_input():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    J = tg.jacobian(lambda x: x * x, x)
    assert J.shape == (2, 2, 2, 2)
    assert np.allclose(J.reshape(4, 4), np.diag(2 * x.ravel()))
    J = tg.jacobian(lambda x: tg.sum(x, axis=0), np.ones((3, 2)))
    assert J.shape == (2, 3, 2) and np.array_equal(J[1], [[0, 1], [0, 1], [0, 1]])
    H = tg.hessian(lambda x: tg.sum(x**3), x)
    assert H.shape == (2, 2, 2, 2) and np.allclose(H.reshape(4, 4), np.diag(6 * x.ravel()))


def test_forward_returns_a_reusable_pullback():
    y, back = tg.forward(lambda x: tg.stack([3 * x**2, 2 * x]), 5.0)
    assert np.allclose(y, [75.0, 10.0])
    assert float(back([1, 1])[0]) == 32.0
    assert float(back([1, 0])[0]) == 30.0


def test_nobacksies_refuses_a_second_order_pass():
    @tg.rule
    def first_order_only(x):
        return x**2, lambda g: (
            tg.nobacksies("first_order_only is not twice differentiable", g * 2 * x),
        )

    x = np.array([1.0, 2.0])
    (g,) = tg.gradient(lambda x: tg.sum(first_order_only(x)), x)
    assert np.allclose(g, 2 * x)
    with pytest.raises(tg.PullbackError, match="not twice differentiable"):
        tg.hessian(lambda x: tg.sum(first_order_only(x)), x)


KERNEL = np.array([1.0, 2.0, 3.0])


@tg.rule
def convolve_by_numpy(x):  # the pullback reads plain values: its derivative is lost
    x = tg.data(x)
    return np.convolve(x, KERNEL, "same"), lambda g: (np.correlate(tg.data(g), KERNEL, "same"),)


@tg.rule
def convolve_by_tg(x):  # the same rule written with tracker_gpu's functions
    n = x.shape[0]
    matrix = np.stack([np.convolve(np.eye(n)[j], KERNEL, "same") for j in range(n)], axis=1)
    return matrix @ x, lambda g: (tg.matrix_transpose(matrix) @ g,)


NESTED_OF_A_RULE = {
    "jacfwd": lambda rule, x: tg.jacfwd(rule, x),
    "jvp": lambda rule, x: tg.jvp(rule, (x,), (np.ones_like(x),))[1],
    "hessian": lambda rule, x: tg.hessian(lambda x: tg.sum(rule(x) ** 2), x),
    "hvp": lambda rule, x: tg.hvp(lambda x: tg.sum(rule(x) ** 2), (x,), (np.ones_like(x),))[0],
}


@pytest.mark.parametrize("name", NESTED_OF_A_RULE)
def test_a_rule_whose_pullback_reads_plain_values_refuses_a_nested_pass(name):
    """Its gradient in a nested pass lost its dependence on the cotangent and the arguments:
    jacfwd, jvp and the Hessian were zeros and hvp None, silently. Written with tracker_gpu's
    functions, the same rule gives them, against central differences of its Jacobian."""
    x = np.array([1.0, -2.0, 0.5, 4.0])
    first = tg.jacobian(convolve_by_numpy, x)
    assert np.array_equal(first, tg.jacobian(convolve_by_tg, x))  # first order is right
    with pytest.raises(tg.PullbackError, match="custom rule 'convolve_by_numpy'.*nested pass"):
        NESTED_OF_A_RULE[name](convolve_by_numpy, x)
    expected = {  # the map is linear: its Jacobian is `first`, the Hessian 2 first^T first
        "jacfwd": first,
        "jvp": first @ np.ones(4),
        "hessian": 2 * first.T @ first,
        "hvp": 2 * first.T @ first @ np.ones(4),
    }[name]
    np.testing.assert_allclose(NESTED_OF_A_RULE[name](convolve_by_tg, x), expected, atol=1e-12)


@tg.rule
def cube_reading_the_cotangent(x):  # still tracked through x, but not through g
    return x**3, lambda g: (tg.data(g) * 3.0 * x**2,)


@tg.rule
def cube(x):
    return x**3, lambda g: (g * 3.0 * x**2,)


@pytest.mark.parametrize("name", NESTED_OF_A_RULE)
def test_a_rule_whose_pullback_reads_its_cotangent_refuses_a_nested_pass(name):
    """Its gradient stayed tracked through the argument, so it was not marked as a plain one:
    jvp and jacfwd were zeros, the Hessian lacked its term in the cotangent, silently."""
    x = np.array([0.5, 1.5, -2.0])
    with pytest.raises(tg.PullbackError, match="custom rule 'cube_reading_the_cotangent'"):
        NESTED_OF_A_RULE[name](cube_reading_the_cotangent, x)
    expected = {  # d/dx of 3 x^2 g with g = 2 x^3: 30 x^4 on the diagonal
        "jacfwd": np.diag(3 * x**2),
        "jvp": 3 * x**2,
        "hessian": np.diag(30 * x**4),
        "hvp": 30 * x**4,
    }[name]
    np.testing.assert_allclose(NESTED_OF_A_RULE[name](cube, x), expected, rtol=1e-12)
    (g,) = tg.gradient(lambda x: tg.sum(cube_reading_the_cotangent(x)), x)  # first order
    np.testing.assert_allclose(g, 3 * x**2, rtol=1e-15)


def test_notrack_and_stop_gradient():
    x = tg.param(np.array([1.0, 2.0]))
    with tg.notrack():
        y = tg.exp(x) * 2.0
    assert not tg.istracked(y)
    (g,) = tg.gradient(lambda x: tg.sum(x * tg.stop_gradient(x)), np.array([3.0]))
    assert np.allclose(g, [3.0])


TRANSFORMS_UNDER_NOTRACK = {  # each against its derivative worked out by hand at x
    "gradient": (lambda x: tg.gradient(lambda x: tg.sum(x**3), x)[0], lambda x: 3 * x**2),
    "withgradient": (
        lambda x: tg.withgradient(lambda x: tg.sum(x**3), x).grad[0],
        lambda x: 3 * x**2,
    ),  # fmt: skip
    "jacobian": (lambda x: tg.jacobian(lambda x: x**2, x), lambda x: np.diag(2 * x)),
    "jacfwd": (lambda x: tg.jacfwd(lambda x: x**2, x), lambda x: np.diag(2 * x)),
    "jvp": (lambda x: tg.jvp(lambda x: x**2, (x,), (np.ones(2),))[1], lambda x: 2 * x),
    "hessian": (lambda x: tg.hessian(lambda x: tg.sum(x**3), x), lambda x: np.diag(6 * x)),
    "hvp": (lambda x: tg.hvp(lambda x: tg.sum(x**3), x, np.ones(2)), lambda x: 6 * x),
    "forward": (lambda x: tg.forward(lambda x: x**2, x)[1](np.ones(2))[0], lambda x: 2 * x),
    "compile": (lambda x: tg.compile(lambda x: tg.sum(x**3))(x).grad[0], lambda x: 3 * x**2),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMS_UNDER_NOTRACK))
def test_transforms_differentiate_inside_notrack(name):
    """notrack() stops recording, not differentiating: a transform called in it tracks its own
    function (as PyTorch's do under no_grad), and hands back plain arrays."""
    transform, by_hand = TRANSFORMS_UNDER_NOTRACK[name]
    x = np.array([1.0, 2.0])
    with tg.notrack():
        found = transform(x)
        assert not tg.istracked(tg.exp(tg.param(x)))  # still not tracking after it
    assert not isinstance(found, tg.TrackedArray)
    np.testing.assert_allclose(found, by_hand(x))


def test_a_transform_in_notrack_inside_f_is_a_constant_to_the_outer_pass():
    def f(x):
        with tg.notrack():
            J = tg.jacobian(lambda y: x * y**2, x)  # closes over the outer x: a constant here
        return tg.sum(x * 3.0) + tg.sum(J)

    x = np.array([1.0, 2.0])
    (g,) = tg.gradient(f, x)
    np.testing.assert_array_equal(g, [3.0, 3.0])


def test_fused_pullbacks_serve_first_order_passes_only():
    calls = []

    def fused(ans, args, values, kw, g, pending):
        calls.append("fused")
        return [g * 2.0]

    double = tg.primitive.Primitive(
        "double", lambda xp, x: x * 2.0, (lambda g, ans, x: g * 2.0,), fused=fused
    )
    x = np.array([1.0, 3.0])
    with on_host(False):
        (g,) = tg.gradient(lambda x: tg.sum(double(x) ** 2), x)
    assert np.allclose(g, 8 * x) and calls == []  # NumPy data: the fused path is for the GPU
    with on_host():  # NumPy standing in for device arrays
        (g,) = tg.gradient(lambda x: tg.sum(double(x) ** 2), x)
        assert np.allclose(g, 8 * x) and calls == ["fused"]
        calls.clear()
        (nested,) = tg.gradient(lambda x: tg.sum(double(x) ** 2), x, nest=True)
        assert calls == [] and tg.istracked(nested)
    assert np.allclose(tg.hessian(lambda x: tg.sum(double(x) ** 2), x), 8 * np.eye(2))
