"""Gradients at the edges of the domain (issue 23): where an output is zero, at kinks and ties,
for Python complex scalars and PyTorch tensors that require grad, and the checks of the
probability losses. Every expected gradient is PyTorch's (CPU, float64), computed here, or a
central finite difference; none is copied from our own output.

Conventions (README, "Edges"): PyTorch's, rule by rule.
- A rule whose pullback divides by its output gives 0 where the output is 0 (std, the norms,
  hypot, atan2), as PyTorch's norms do; sqrt and x ** p (p < 1) keep PyTorch's inf there.
- abs and copysign are flat (0) at +-0, as `sign(x)`.
- maximum and minimum split the gradient evenly at a tie; max and min (and the norms and
  matrix norms built on them) share it evenly among all tied extrema (PyTorch's amax).
- clip passes the gradient to x on its bounds (PyTorch's clamp); relu, relu6 and hardtanh are
  flat at their kinks (PyTorch's).
"""

import math
import warnings

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn

torch = pytest.importorskip("torch")


def torch_gradients(f, *arrays):
    """PyTorch's gradients of `sum(f(*arrays))`, float64, as NumPy arrays (zeros for None)."""
    ts = [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for a in arrays]
    torch.sum(f(*ts)).backward()
    return [np.zeros(t.shape) if t.grad is None else t.grad.numpy() for t in ts]


def tg_gradients(backend, f, *arrays, strict=True):
    """Our gradients of `sum(f(*arrays))`; `strict`: with no warning (divide by zero, invalid
    value) either."""
    with warnings.catch_warnings():
        if strict:
            warnings.simplefilter("error")
            # NumPy's own vector_norm of a negative order, in the forward pass, at 0
            warnings.filterwarnings("ignore", "divide by zero encountered in reciprocal")
        inputs = (backend.asarray(a) for a in arrays)
        grads = tg.gradient(lambda *xs: tg.sum(f(*xs)), *inputs)
    return [
        np.zeros(np.shape(a)) if g is None else backend.to_numpy(g) for g, a in zip(grads, arrays)
    ]


def assert_like_torch(backend, ours, theirs, *arrays):
    """Our gradients are PyTorch's, and come with no warning where PyTorch's are finite."""
    expected = torch_gradients(theirs, *arrays)
    finite = all(np.isfinite(e).all() for e in expected)
    with np.errstate(divide="ignore") if not finite else warnings.catch_warnings():
        actual = tg_gradients(backend, ours, *arrays, strict=finite)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-15)


ZEROS = np.zeros(4)
SIGNED_ZEROS = np.array([0.0, -0.0, 0.0, -0.0])
CONSTANT = np.ones(4)

# --- rules whose pullback divides by their output (or by what vanishes with it), at zero
AT_ZERO = {
    "std": (lambda x: tg.std(x), lambda x: torch.std(x, correction=0), CONSTANT),
    "std(correction=1)": (
        lambda x: tg.std(x, correction=1),
        lambda x: torch.std(x, correction=1),
        CONSTANT,
    ),
    "std(axis)": (
        lambda x: tg.std(x, axis=0),
        lambda x: torch.std(x, dim=0, correction=0),
        np.array([[1.0, 2.0], [1.0, 3.0]]),
    ),
    "var": (lambda x: tg.var(x), lambda x: torch.var(x, correction=0), CONSTANT),
    "vector_norm": (tg.linalg.vector_norm, torch.linalg.vector_norm, SIGNED_ZEROS),
    "vector_norm(axis)": (
        lambda x: tg.linalg.vector_norm(x, axis=1),
        lambda x: torch.linalg.vector_norm(x, dim=1),
        np.array([[0.0, -0.0], [3.0, 4.0]]),
    ),
    **{
        f"vector_norm(ord={p})": (
            lambda x, p=p: tg.linalg.vector_norm(x, ord=p),
            lambda x, p=p: torch.linalg.vector_norm(x, ord=p),
            SIGNED_ZEROS,
        )
        for p in (1, 3, 0.5, -1, math.inf, -math.inf)  # ord=0 has no gradient
    },
    "vector_norm(ord=-1, a zero)": (
        lambda x: tg.linalg.vector_norm(x, ord=-1),
        lambda x: torch.linalg.vector_norm(x, ord=-1),
        np.array([0.0, 1.0, 2.0]),
    ),
    **{
        f"matrix_norm(ord={p})": (
            lambda x, p=p: tg.linalg.matrix_norm(x, ord=p),
            lambda x, p=p: torch.linalg.matrix_norm(x, ord=p),
            np.zeros((2, 3)),
        )
        for p in ("fro", 1, -1, math.inf, -math.inf, "nuc", 2, -2)
    },
    **{  # tied singular values: the gradient shared (ord 2, -2) as PyTorch
        f"matrix_norm(ord={p}) of I": (
            lambda x, p=p: tg.linalg.matrix_norm(x, ord=p),
            lambda x, p=p: torch.linalg.matrix_norm(x, ord=p),
            np.eye(2),
        )
        for p in ("nuc", 2, -2)
    },
    "hypot": (  # PyTorch's hypot gives nan at (0, 0); its vector_norm of the pair gives 0
        lambda x: tg.hypot(x[:2], x[2:]),
        lambda x: torch.linalg.vector_norm(torch.stack([x[:2], x[2:]]), dim=0),
        SIGNED_ZEROS,
    ),
    "atan2": (lambda x: tg.atan2(x[:2], x[2:]), lambda x: torch.atan2(x[:2], x[2:]), SIGNED_ZEROS),
    "sqrt": (tg.sqrt, torch.sqrt, np.array([0.0, 1.0])),  # inf at 0, as PyTorch
    "x ** 0.5": (lambda x: x**0.5, lambda x: x**0.5, np.array([0.0, 4.0])),
    "x ** 1.5": (lambda x: x**1.5, lambda x: x**1.5, np.array([0.0, 4.0])),
    "x ** 0": (lambda x: x**0.0, lambda x: x**0.0, np.array([0.0, -0.0, 4.0])),
    "x ** y at 0": (
        lambda x: x[:2] ** x[2:],
        lambda x: x[:2] ** x[2:],
        np.array([0.0, 0.0, 0.5, 0.0]),
    ),
}


@pytest.mark.parametrize("name", sorted(AT_ZERO))
def test_a_gradient_where_the_output_is_zero_is_pytorchs(backend, name):
    ours, theirs, x = AT_ZERO[name]
    assert_like_torch(backend, ours, theirs, x)


def test_std_of_constant_features_is_zero_without_a_warning(backend):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (g,) = tg.gradient(lambda x: tg.std(x), backend.asarray(np.ones(4)))
    assert np.array_equal(backend.to_numpy(g), np.zeros(4))


def test_std_away_from_zero_matches_finite_differences(backend):
    x = np.array([1.0, 2.0, 4.0, 7.0])
    (g,) = tg.gradient(lambda x: tg.std(x, correction=1), backend.asarray(x))
    h = 1e-6
    fd = [(np.std(x + h * e, ddof=1) - np.std(x - h * e, ddof=1)) / (2 * h) for e in np.eye(4)]
    np.testing.assert_allclose(backend.to_numpy(g), fd, rtol=1e-7)


# --- kinks: abs and copysign at signed zero
KINKS = {
    "abs": (tg.abs, torch.abs, np.array([0.0, -0.0, 1.0, -2.0])),
    "copysign": (
        lambda x: tg.copysign(x[:3], x[3:]),
        lambda x: torch.copysign(x[:3], x[3:]),
        np.array([0.0, -0.0, 2.0, 1.0, -1.0, -0.0]),
    ),
    "sum(abs)": (lambda x: tg.sum(tg.abs(x)), lambda x: torch.sum(torch.abs(x)), SIGNED_ZEROS),
}


@pytest.mark.parametrize("name", sorted(KINKS))
def test_a_kink_at_zero_is_flat_as_in_pytorch(backend, name):
    ours, theirs, x = KINKS[name]
    assert_like_torch(backend, ours, theirs, x)


def test_abs_in_a_broadcast_expression_is_flat_at_zero(backend):
    x = SIGNED_ZEROS + np.array([0.0, 0.0, 1.0, -1.0])
    assert_like_torch(
        backend, lambda x: tg.broadcast(lambda a: abs(a) * 3.0, x), lambda x: x.abs() * 3.0, x
    )


# --- ties: one convention (PyTorch's) on every rule that selects
TIES_X = np.array([1.0, 2.0, 3.0, -0.0, 5.0, 5.0])
TIES_Y = np.array([1.0, 1.0, 4.0, 0.0, 5.0, -1.0])
SELECTIONS = {
    "maximum": (tg.maximum, torch.maximum),
    "minimum": (tg.minimum, torch.minimum),
    "broadcast maximum": (lambda x, y: tg.broadcast(tg.maximum, x, y), torch.maximum),
    "broadcast minimum": (lambda x, y: tg.broadcast(tg.minimum, x, y), torch.minimum),
    "maximum with a number": (
        lambda x, y: tg.maximum(x, 5.0) + y,
        lambda x, y: torch.maximum(x, torch.full_like(x, 5.0)) + y,
    ),
}


@pytest.mark.parametrize("name", sorted(SELECTIONS))
def test_ties_of_maximum_and_minimum_split_evenly(backend, name):
    ours, theirs = SELECTIONS[name]
    assert_like_torch(backend, ours, theirs, TIES_X, TIES_Y)


REDUCTIONS = {
    "max": (lambda x: tg.max(x), torch.amax),
    "min": (lambda x: tg.min(x), torch.amin),
    "max(axis=1)": (lambda x: tg.max(x, axis=1), lambda x: torch.amax(x, dim=1)),
    "min(axis=0)": (lambda x: tg.min(x, axis=0), lambda x: torch.amin(x, dim=0)),
    "max(axis=(0, 1), keepdims)": (
        lambda x: tg.max(x, axis=(0, 1), keepdims=True) * 2.0,
        lambda x: torch.amax(x, dim=(0, 1), keepdim=True) * 2.0,
    ),
    "matrix_norm(ord=1)": (
        lambda x: tg.linalg.matrix_norm(x, ord=1),
        lambda x: torch.linalg.matrix_norm(x, ord=1),
    ),
    "vector_norm(ord=inf)": (
        lambda x: tg.linalg.vector_norm(x, ord=math.inf),
        lambda x: torch.linalg.vector_norm(x, ord=math.inf),
    ),
}
TIED = np.array([[3.0, 1.0, 3.0], [3.0, -3.0, 1.0], [1.0, 1.0, 1.0]])


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_ties_of_max_and_min_share_evenly_among_all_extrema(backend, name):
    ours, theirs = REDUCTIONS[name]
    assert_like_torch(backend, ours, theirs, TIED)


BOUNDS = np.array([-1.0, 0.0, 1.0, 6.0, -2.0, 0.5, 7.0, -0.0])
ACTIVATIONS = {
    "clip": (lambda x: tg.clip(x, 0.0, 1.0), lambda x: torch.clamp(x, 0.0, 1.0)),
    "clip(max only)": (lambda x: tg.clip(x, max=1.0), lambda x: torch.clamp(x, max=1.0)),
    "relu": (nn.relu, torch.relu),
    "relu6": (nn.relu6, torch.nn.functional.relu6),
    "hardtanh": (nn.hardtanh, torch.nn.functional.hardtanh),
    "leakyrelu": (nn.leakyrelu, torch.nn.functional.leaky_relu),
    "elu": (nn.elu, torch.nn.functional.elu),
    "celu": (nn.celu, torch.nn.functional.celu),
    "selu": (nn.selu, torch.nn.functional.selu),
    "softsign": (nn.softsign, torch.nn.functional.softsign),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_kinks_of_clip_and_activations_are_pytorchs(backend, name):
    ours, theirs = ACTIVATIONS[name]
    assert_like_torch(backend, ours, theirs, BOUNDS)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_kinks_of_activations_replay_under_compile(name):
    """The kinks are decided by each replay's own values, not the recording's."""
    ours, _ = ACTIVATIONS[name]
    step = lambda x: tg.withgradient(lambda x: tg.sum(ours(x) * 1.5), x)
    compiled = tg.compile(step, gradient=False)
    for x in (BOUNDS, BOUNDS[::-1] * 3.0, np.ones(8), -BOUNDS):
        replayed, eager = compiled(x), step(x)
        np.testing.assert_allclose(float(replayed.val), float(eager.val), rtol=1e-15)
        np.testing.assert_allclose(replayed.grad[0], eager.grad[0], rtol=1e-15)


SPECIALS = np.array([np.nan, -np.inf, -1.0, -0.0, 0.0, 5e-324, 1.0, np.inf])


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("how", ["eager", "compiled"])
def test_activations_of_nan_and_infinities_are_pytorchs(name, how):
    """Values bit for bit (nan stays nan: relu gave 0, so a diverging model looked well) and
    gradients with PyTorch's nan pattern, eagerly and in a fused replay."""
    ours, theirs = ACTIVATIONS[name]
    expected = theirs(torch.tensor(SPECIALS)).numpy()
    # PyTorch's elu-like gradients at nan differ between its vector loop (nan) and its scalar
    # tail (1), whose length depends on the machine's vector width: the reference is read
    # from the vector loop, over the specials repeated
    (g,) = torch_gradients(theirs, np.tile(SPECIALS, 16))
    g = g[: len(SPECIALS)]

    def step(x):
        return tg.withgradient(lambda x: tg.sum(ours(x) * 1.0), x), ours(x)

    run = step if how == "eager" else tg.compile(step, gradient=False)
    with tg.sync_checks(False):  # the loss is nan
        for _ in range(2):  # a compiled one: its recording, then a replay
            (_, (found_g,)), found = run(SPECIALS)
    found = tg.data(found)
    np.testing.assert_array_equal(np.signbit(found), np.signbit(expected))
    np.testing.assert_array_equal(found, expected)
    np.testing.assert_array_equal(found_g, g)


def test_clip_with_array_bounds_gives_x_the_tie(backend):
    x, lo, hi = np.array([0.0, 1.0, 0.5, -1.0]), np.zeros(4), np.ones(4)
    assert_like_torch(backend, tg.clip, torch.clamp, x, lo, hi)


POWERS = {  # x, y where one gradient was nan and PyTorch's is finite or infinite
    "array exponent": (np.array([2.0, 0.0, -0.0, 0.0, np.inf, np.inf]),
                       np.array([0.0, -1.0, -1.0, 2.0, 0.0, 2.0])),
    "zero exponent": (np.array([np.inf, -np.inf, 1e-310, 0.0, 2.0]), 0.0),
    "zero base": (0.0, np.array([-1.0, -2.0, 0.0, 0.5, 2.0])),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(POWERS))
def test_pow_at_zero_exponents_and_bases_is_pytorchs(backend, name):
    """x's gradient is 0 where y == 0 (it was nan at a subnormal or infinite x), y's is
    log(0) times an infinite power where x == 0 and y < 0 (it was nan), as PyTorch's."""
    x, y = POWERS[name]
    arrays = [a for a in (x, y) if isinstance(a, np.ndarray)]

    def f(*given):
        it = iter(given)
        return tg.pow(*(next(it) if isinstance(a, np.ndarray) else a for a in (x, y)))

    def tf(*given):
        it = iter(given)
        return torch.pow(*(next(it) if isinstance(a, np.ndarray) else a for a in (x, y)))

    expected = torch_gradients(tf, *arrays)
    with tg.sync_checks(False):
        found = tg.gradient(lambda *a: tg.sum(f(*a)), *(backend.asarray(a) for a in arrays))
    for ours, theirs in zip(found, expected):
        np.testing.assert_array_equal(backend.to_numpy(ours), theirs)


# --- nextafter: PyTorch's gradient (1 to x where x != y, none to y)
def test_nextafter_has_pytorchs_gradient(backend):
    x, y = np.array([0.0, 1.0, -2.0, 3.0]), np.array([1.0, 0.0, 5.0, 3.0])
    gx, gy = tg_gradients(backend, tg.nextafter, x, y)
    try:
        expected = torch_gradients(torch.nextafter, x, y)
    except RuntimeError:  # some PyTorch releases (2.11) have no derivative for it: as 2.13's
        expected = [np.array([1.0, 1.0, 1.0, 0.0]), np.zeros(4)]
    np.testing.assert_array_equal(gx, expected[0])
    np.testing.assert_array_equal(gy, expected[1])


# --- inputs: Python complex numbers, PyTorch tensors that require grad
def test_a_python_complex_scalar_gets_a_gradient_like_a_float():
    (g,) = tg.gradient(lambda z: tg.abs(z) ** 2, 1 + 2j)
    z = torch.tensor(1 + 2j, dtype=torch.complex128, requires_grad=True)
    (torch.abs(z) ** 2).backward()
    assert g is not None
    assert complex(g) == complex(z.grad)
    (g,) = tg.gradient(lambda z: tg.real(z * z), 1 + 2j)
    assert complex(g) == pytest.approx(2 - 4j)  # d/dz real(z^2) = 2 conj(z), PyTorch's convention


def test_a_torch_tensor_that_requires_grad_is_taken_as_its_value():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    before = x.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (g,) = tg.gradient(lambda x: tg.sum(x**3), x)
        val, (g2,) = tg.withgradient(lambda x: tg.sum(x * x), x)
    assert g.grad_fn is None and not g.requires_grad
    assert g2.grad_fn is None and not g2.requires_grad
    assert np.array_equal(g.numpy(), 3 * before.numpy() ** 2)
    assert x.requires_grad and x.grad is None and torch.equal(x.detach(), before)


# --- the probability losses check their probabilities where that costs no synchronisation
def test_crossentropy_refuses_logits():
    logits = np.array([[2.0, -1.0, 0.5], [0.1, 3.0, -2.0]])
    with pytest.raises(ValueError, match="logitcrossentropy"):
        nn.crossentropy(logits, np.array([0, 1]))
    with pytest.raises(ValueError, match="probabilit"):
        tg.gradient(lambda z: nn.crossentropy(z, np.array([0, 1])), logits)


@pytest.mark.parametrize("p", [1.5, -0.5, math.nan])
def test_binarycrossentropy_refuses_values_outside_zero_one(p):
    yhat, y = np.array([0.2, p]), np.array([0.0, 1.0])
    with pytest.raises(ValueError, match="logitbinarycrossentropy"):
        nn.binarycrossentropy(yhat, y)


def test_probability_losses_accept_probabilities_and_skip_the_check_when_told(backend):
    p = backend.asarray(np.array([[0.2, 0.8], [1.0, 0.0]]))
    labels = backend.asarray(np.array([1, 0]))
    for value in (nn.crossentropy(p, labels), nn.binarycrossentropy(p, p)):
        assert np.isfinite(float(value))
    with tg.sync_checks(False), np.errstate(invalid="ignore"):
        nn.binarycrossentropy(np.array([1.5]), np.array([1.0]))  # not checked: nan, no error


# --- the fused kernels agree with the generic rules at every edge, signed zeros included
FUSED_EDGES = {
    "abs": lambda x, y: tg.abs(x),
    "sqrt": lambda x, y: tg.sqrt(x),
    "relu": lambda x, y: tg.relu(x),
    "x ** 0.5": lambda x, y: x**0.5,
    "broadcast abs": lambda x, y: tg.broadcast(abs, x),
    "broadcast maximum": lambda x, y: tg.broadcast(tg.maximum, x, y),
    "broadcast minimum": lambda x, y: tg.broadcast(tg.minimum, x, y),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(FUSED_EDGES))
def test_fused_kernels_agree_with_the_generic_rules_at_the_edges(name, dtype):
    from domain import assert_agree, special_values

    from tracker_gpu.cuda import generic_only, host, on_host, recording

    if not host.available():
        pytest.skip("no C++ compiler for the host build of the kernels")
    values = special_values(dtype)
    x, y = np.repeat(values, values.size), np.tile(values, values.size)  # every pair: all ties
    f = FUSED_EDGES[name]
    weights = np.linspace(0.5, 1.5, x.size).astype(dtype)

    def gradients():
        loss = lambda x, y: tg.sum(f(x, y) * weights)
        with np.errstate(all="ignore"), tg.sync_checks(False), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tg.gradient(loss, x, y)

    with generic_only():
        expected = gradients()
    with on_host(), recording() as log:
        actual = gradients()
    assert any(event[0] == "launch" and "bwd" in event[1] for event in log), "no fused pullback"
    for a, e in zip(actual, expected):
        if e is None:
            assert a is None
        else:
            assert_agree(a, e, signed_zeros=True, what=name)
