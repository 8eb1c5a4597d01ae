"""Complex values (PyTorch's convention: the gradient of a real loss L of z = a + ib is
dL/da + i dL/db), on every backend: elementwise functions, reductions, shape and indexing
operations against finite differences along both axes of each element; the same functions
against PyTorch's autograd; second derivatives; the fused path and `broadcast`."""

import sys
import types

import array_api_compat.numpy
import numpy as np
import pytest
from helpers import check_like, lazy_options, numpy_of, on_backend

import tracker_gpu as tg
from tracker_gpu.testing import gradcheck

# Dask's integer-array indexing makes its integer offsets' metadata from the indexed array's
# (complex here): a cast warning of Dask's own, meaningless to the result.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Casting complex values to real:numpy.exceptions.ComplexWarning:dask"
)


def complex_values(shape, seed=0):
    """complex128 values off every branch cut of the standard's functions: real part in
    (-1, 1), imaginary part of either sign in (0.3, 0.8) (the cuts lie on the axes, |y| >= 1
    on the imaginary one), so that finite differences see a smooth function."""
    rng = np.random.default_rng(seed)
    re = rng.uniform(-1.0, 1.0, shape)
    im = rng.uniform(0.3, 0.8, shape) * rng.choice([-1.0, 1.0], shape)
    return re + 1j * im


# Every elementwise function the Array API standard defines for complex numbers.
UNARY = (
    "exp expm1 log log1p log2 log10 sqrt square reciprocal sin cos tan asin acos atan sinh "
    "cosh tanh asinh acosh atanh sign abs real imag conj negative positive"
).split()


def check_complex(backend, f, *xs):
    """The gradient of `real(sum(w * f(xs)))` (w complex) has each input's library, dtype,
    device and shape, and agrees with finite differences along both axes."""
    y = f(*xs)
    w = backend.asarray(complex_values(tuple(y.shape), seed=9))
    grads = tg.gradient(lambda *a: tg.real(tg.sum(f(*a) * w)), *xs)
    for x, g in zip(xs, grads):
        if tg.backend.is_array(x):
            check_like(backend, g, x)
    assert gradcheck(f, *xs, **lazy_options(backend, {}))
    return grads


@pytest.mark.parametrize("name", UNARY)
def test_unary(backend, name):
    z = backend.asarray(complex_values((2, 3)))
    check_complex(backend, getattr(tg, name), z)


def test_unary_on_the_other_side_of_the_real_axis(backend):
    # acosh(z) takes its own branch off the reals: 1/sqrt(z*z - 1) has the wrong sign where
    # re z < 0 (a real formula on complex numbers would pass only half of the plane)
    z = backend.asarray(np.array([-0.6 + 0.4j, -0.5 - 0.7j, 0.2 + 0.5j, -1.5 + 0.3j]))
    check_complex(backend, tg.acosh, z)


BINARY = {
    "multiply": lambda z, x: z * x * z,
    "divide": lambda z, x: (z / x) / (z + 2.0),
    "pow": lambda z, x: z ** (x + 1j),
    "pow of a number": lambda z, x: (0.5 + 1j) ** z + z**2.5 * x,
    "add and subtract": lambda z, x: (z + x) - (x - 2.0 * z) + 1j,
    "a real array times complex": lambda z, x: x * (1 + 2j) * tg.real(z),
    "where with complex numbers": lambda z, x: tg.where(x > 0, 1j, z) + tg.where(x < 0, x, 2j),
}


@pytest.mark.parametrize("name", BINARY)
def test_binary_with_real_and_complex_operands(backend, name):
    # a real operand of a complex function gets the real part of its gradient
    z = backend.asarray(complex_values((2, 3)))
    x = backend.asarray(np.random.default_rng(1).uniform(-1.0, 1.0, (3,)))
    grads = check_complex(backend, BINARY[name], z, x)
    assert not tg.backend.namespace_of(grads[1]).isdtype(grads[1].dtype, "complex floating")


REDUCTIONS = {
    "sum": lambda z: tg.sum(z, axis=1),
    "mean": lambda z: tg.mean(z, axis=0, keepdims=True),
    "prod": tg.prod,
    "prod along an axis": lambda z: tg.prod(z, axis=1),
    "cumulative_sum": lambda z: tg.cumulative_sum(z, axis=1),
    "cumulative_prod": lambda z: tg.cumulative_prod(z, axis=1, include_initial=True),
    "sumabs2": tg.sumabs2,
    "sum of squares": lambda z: tg.sum(z**2) + tg.sum(z * z) + tg.sum(tg.square(z)),
    "vecdot(z, z)": lambda z: _vecdot_with_itself(tg.reshape(z, (-1,))),
}


def _vecdot_with_itself(z):
    return tg.vecdot(z, z)  # recorded as sumabs2, complex in dtype


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction(backend, name):
    z = backend.asarray(complex_values((3, 4)))
    check_complex(backend, REDUCTIONS[name], z)


def test_prod_with_a_zero(backend):
    z = complex_values((2, 4))
    z[0, 1] = 0
    check_complex(backend, lambda z: tg.prod(z, axis=1), backend.asarray(z))


def test_sumabs2_is_the_sum_of_squared_moduli(backend):
    z = complex_values((5,))
    value = numpy_of(backend, tg.sumabs2(backend.asarray(z)))
    np.testing.assert_allclose(value, np.sum(np.abs(z) ** 2))
    assert numpy_of(backend, tg.sum(tg.param(backend.asarray(z)) ** 2)) == pytest.approx(
        np.sum(z**2)  # the sum of complex squares is no sum of moduli: it stays a plain sum
    )


@pytest.mark.parametrize("name", ["var", "std"])
def test_var_and_std_refuse_complex_data(backend, name):
    z = tg.param(backend.asarray(complex_values((3,))))
    with pytest.raises(TypeError, match=f"{name} of complex data.*tg.real"):
        getattr(tg, name)(z)


@pytest.mark.parametrize("name", ["sigmoid", "relu", "softmax", "logsoftmax", "logsumexp"])
def test_activations_refuse_complex_data(backend, name):
    z = tg.param(backend.asarray(complex_values((3,))))
    with pytest.raises(TypeError, match=f"{name} takes real data.*no order.*tg.real"):
        getattr(tg, name)(z)


def test_losses_refuse_complex_logits(backend):
    z = tg.param(backend.asarray(complex_values((2, 3))))
    labels = backend.asarray(np.eye(3)[[0, 2]])
    with pytest.raises(TypeError, match="logitcrossentropy takes real data"):
        tg.nn.logitcrossentropy(z, labels)


INDEX = np.array([2, 0, 2])
SHAPES = {
    "reshape": lambda z: tg.reshape(z, (4, 3)),
    "permute_dims": lambda z: tg.permute_dims(z, (1, 0)),
    "expand_dims and squeeze": lambda z: tg.squeeze(tg.expand_dims(z, axis=0), axis=0),
    "flip": lambda z: tg.flip(z, axis=1),
    "broadcast_to": lambda z: tg.broadcast_to(z, (2, 3, 4)),
    "concat": lambda z: tg.concat([z, z * 2.0], axis=0),
    "stack": lambda z: tg.stack([z, z], axis=1),
    "slice": lambda z: z[1:, ::2],
    "take": lambda z, i=INDEX: tg.take(z, i, axis=1),
    "take_along_axis": lambda z: tg.take_along_axis(z, np.array([[0, 1], [2, 3], [1, 1]]), axis=1),
    "moveaxis": lambda z: tg.moveaxis(z, 0, 1),
    "repeat": lambda z: tg.repeat(z, 2, axis=0),
    "tile": lambda z: tg.tile(z, (2, 1)),
    "roll": lambda z: tg.roll(z, 1, axis=1),
    "unstack": lambda z: tg.unstack(z)[1],
    "diff": lambda z: tg.diff(z, axis=1),
    "matrix_transpose": lambda z: tg.matrix_transpose(z),
    "at set": lambda z: tg.at(z)[1, ...].set(z[0, ...] * 2.0),
    "at multiply": lambda z: tg.at(z)[1:, ...].multiply(z[0, ...]),
}


@pytest.mark.parametrize("name", SHAPES)
def test_shape_and_indexing_pass_complex_gradients(backend, name):
    f = SHAPES[name]
    if name in ("take", "take_along_axis"):
        index = backend.asarray(INDEX if name == "take" else [[0, 1], [2, 3], [1, 1]])
        f = {
            "take": lambda z: tg.take(z, index, axis=1),
            "take_along_axis": lambda z: tg.take_along_axis(z, index, axis=1),
        }[name]
    check_complex(backend, f, backend.asarray(complex_values((3, 4))))


def test_a_scatter_add_that_refuses_complex_adds_the_parts(monkeypatch):
    """CuPy's scatter-add (the pullback of indexing) refuses complex dtypes; imitated on NumPy."""

    def real_only(z, key, values):
        if z.dtype.kind == "c" or values.dtype.kind == "c":
            raise TypeError("add.at of a complex dtype")
        np.add.at(z, key, values)

    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(scatter_add=real_only))
    monkeypatch.setattr(tg.backend, "is_cupy", lambda x: isinstance(x, np.ndarray))
    key, values = (np.array([0, 2, 0]), slice(1, None)), complex_values((3, 2))
    z = tg.backend.scatter_add(array_api_compat.numpy, np.zeros((3, 3), complex), key, values)
    expected = np.zeros((3, 3), complex)
    np.add.at(expected, key, values)
    np.testing.assert_array_equal(z, expected)


@pytest.mark.parametrize(
    "f",
    [
        lambda z: tg.sin(z) * tg.exp(z) / (z + 2.0),
        lambda z: tg.sqrt(z) * tg.conj(z) + tg.abs(z),
        lambda z: tg.prod(z) + tg.cumulative_prod(z, axis=0),
        lambda z: tg.sign(z) * tg.atanh(z),
    ],
    ids=["holomorphic", "conj and abs", "products", "sign"],
)
def test_second_derivative(backend, f):
    z = backend.asarray(complex_values((4,)))
    w = backend.asarray(complex_values((4,), seed=3))

    def first(z):
        return tg.gradient(lambda a: tg.real(tg.sum(f(a) * w)), z, nest=True)[0]

    assert tg.istracked(first(z))
    assert gradcheck(first, z, **lazy_options(backend, {}))


# --- an independent reference: PyTorch's autograd on complex tensors
TORCH_NAMES = {"sign": "sgn", "conj": "conj_physical", "positive": "positive"}


@pytest.mark.parametrize("name", UNARY + ["prod", "cumulative_prod", "sumabs2"])
def test_gradients_match_pytorch(name):
    torch = pytest.importorskip("torch")
    z = complex_values((2, 3), seed=4)
    w = complex_values((2, 3), seed=5)
    if name in ("prod", "sumabs2"):
        w = w[0, 0]
    f_torch = {
        "prod": torch.prod,
        "cumulative_prod": lambda t: torch.cumprod(t, dim=1),
        "sumabs2": lambda t: torch.sum(torch.abs(t) ** 2),
    }.get(name) or getattr(torch, TORCH_NAMES.get(name, name))
    f_ours = {"cumulative_prod": lambda z: tg.cumulative_prod(z, axis=1)}.get(name) or getattr(
        tg, name
    )
    t = torch.tensor(z, requires_grad=True)
    torch.real(torch.sum(f_torch(t) * torch.tensor(w))).backward()
    (ours,) = tg.gradient(lambda a: tg.real(tg.sum(f_ours(a) * w)), z)
    np.testing.assert_allclose(ours, t.grad.numpy(), rtol=1e-12, atol=1e-12)


# --- the fused path: its kernels know real numbers only
def test_complex_data_takes_the_generic_path():
    from tracker_gpu.cuda import generic_only, host, on_host, recording

    if not host.available():
        pytest.skip("no C++ compiler for the host build")
    z = complex_values((64,))

    def f(z):
        return tg.real(tg.sum(tg.exp(z) * tg.sin(z) + z * z + z**2.0 / (z + 2.0)))

    with on_host(), recording() as log:
        tg.gradient(f, z.real)
    assert [e for e in log if e[0] == "launch"], "real data takes the fused path (the control)"
    with generic_only():
        generic = tg.gradient(f, z)[0]
    with on_host(), recording() as log:
        (fused,) = tg.gradient(f, z)
    assert [e for e in log if e[0] == "launch"] == []
    np.testing.assert_array_equal(fused, generic)
    assert gradcheck(lambda z: tg.exp(z) * tg.sin(z) + z * z, z, directions=4)


# --- broadcast: one fused node for a holomorphic f
def test_broadcast_of_a_holomorphic_function(backend):
    z = backend.asarray(complex_values((3, 4)))
    x = backend.asarray(np.random.default_rng(2).uniform(0.5, 1.0, (4,)))

    def f(a, b):
        return tg.exp(a) * b + tg.sin(a) / b - a**b + tg.sqrt(a * a + 1.0)

    check_complex(backend, lambda z, x: tg.broadcast(f, z, x), z, x)


def test_broadcast_refuses_what_it_cannot_differentiate_for_complex_arguments(backend):
    z = tg.param(backend.asarray(complex_values((3,))))
    with pytest.raises(TypeError, match="must be holomorphic, but it uses abs.*directly"):
        tg.broadcast(lambda a: tg.abs(a) * a, z)
    with pytest.raises(TypeError, match="real Python numbers, got 1j.*as an argument"):
        tg.broadcast(lambda a: a * 1j, z)
    x = tg.param(backend.asarray([1.0, -2.0, 3.0]))  # real arguments: abs is fine
    assert tg.gradient(lambda x: tg.sum(tg.broadcast(lambda a: tg.abs(a) * a, x)), x) is not None


def test_complex_numbers_beside_real_arrays(backend):
    x = on_backend(backend, np.array([0.5, -1.0, 2.0]))
    y = tg.where(x > 0, 2j, x) * (1 - 1j)
    expected = np.where(np.array([0.5, -1.0, 2.0]) > 0, 2j, [0.5, -1.0, 2.0]) * (1 - 1j)
    np.testing.assert_allclose(numpy_of(backend, y), expected)
    (g,) = tg.gradient(lambda x: tg.real(tg.sum(tg.where(x > 0, 2j, x) * (1 - 1j))), x)
    np.testing.assert_allclose(numpy_of(backend, g), [0.0, 1.0, 0.0])


def test_a_replay_by_tg_compile_takes_the_complex_vjps(backend):
    # tg.compile's generated code writes the hottest vjps as real formulas: not for complex data
    z = backend.asarray(complex_values((2, 3)))
    x = backend.asarray(np.random.default_rng(6).uniform(-1.0, 1.0, (3,)))

    def loss(z, x):
        y = tg.exp(z) * x * z / (x + z) + tg.sin(z) * tg.sqrt(z) - tg.tanh(z) * tg.cos(x)
        return tg.real(tg.sum(tg.log(z) * tg.square(y) - z))

    step = tg.compile(lambda z, x: tg.withgradient(loss, z, x), gradient=False)
    step(z, x)
    replayed = step(z, x).grad
    for g, expected in zip(replayed, tg.gradient(loss, z, x)):
        np.testing.assert_allclose(numpy_of(backend, g), numpy_of(backend, expected), rtol=1e-12)


@pytest.mark.parametrize(
    "operation",
    [lambda c, t: c + t, lambda c, t: c - t, lambda c, t: c * t, lambda c, t: c / t,
     lambda c, t: c**t],
    ids=["add", "subtract", "multiply", "divide", "power"],
)  # fmt: skip
def test_a_python_complex_on_the_left_of_a_0d_real_value(operation):
    """`1j * x[1]`: NumPy's float scalar times Python's complex is Python's complex, which the
    tape took for an array (AttributeError); checked against central differences."""
    x = np.array([0.3, -0.7])
    f = lambda x: tg.abs(operation(1.0 + 2.0j, x[1]) + x[0])  # noqa: E731
    (g,) = tg.gradient(f, x)
    plain = lambda x: abs(operation(1.0 + 2.0j, x[1]) + x[0])  # noqa: E731
    eps = 1e-6
    expected = [(plain(x + e) - plain(x - e)) / (2 * eps) for e in np.eye(2) * eps]
    np.testing.assert_allclose(g, expected, rtol=1e-7)
    assert float(tg.data(f(tg.param(x)))) == plain(x)  # the plain expression's value


def _special_functions_of_complex():
    """The `tg.special` functions that take a complex array (others refuse it, naming it)."""
    z, found = np.array([0.3 + 0.4j]), []
    for name in tg.special.__all__:
        try:
            with np.errstate(all="ignore"):
                getattr(tg.special, name)(z)
        except (TypeError, NotImplementedError, ValueError):
            continue
        found.append(name)
    return found


@pytest.mark.parametrize("name", _special_functions_of_complex())
def test_a_special_function_of_a_complex_array_has_the_conjugated_gradient(name):
    """Holomorphic: `g * conj(f'(z))`, as PyTorch's convention and finite differences along
    both axes say (every special function taking complex arrays gave `g * f'(z)`)."""
    f = getattr(tg.special, name)
    z = np.array([0.3 + 0.4j, -0.7 + 0.2j])
    if name == "sinc":
        z = z + 0.25  # away from its removable point
    if name == "digamma":  # its derivative, polygamma, is SciPy's real one only
        with pytest.raises(tg.PullbackError, match="polygamma takes real arrays"):
            tg.gradient(lambda z: tg.sum(tg.real(f(z))), z)
        return
    assert gradcheck(f, z)


# points of the real axis beyond the branch cuts, cast to complex (+0j): the function is real
# along them and its slope there is one-sided, the side the value was taken on
CUTS = {"acos": [-2.0, 2.0], "asin": [-2.0, 2.0], "acosh": [-2.0, 0.5], "atanh": [-2.0, 2.0],
        "log": [-2.0], "sqrt": [-2.0]}  # fmt: skip


@pytest.mark.parametrize("part", ["real", "imag"])
@pytest.mark.parametrize("name", ["asinh", "acos", "asin"])
def test_the_slope_on_an_imaginary_cut_is_the_side_of_the_value(name, part):
    """asinh's cuts lie on the imaginary axis beyond +-i: at iy it took the other side's."""
    y, h = np.array([-2.0, 2.0, 0.5]), 1e-7

    def f(a):
        return tg.sum(getattr(tg, part)(getattr(tg, name)(a * 1j)))

    expected = [(float(f(y + h * e)) - float(f(y - h * e))) / (2 * h) for e in np.eye(y.size)]
    np.testing.assert_allclose(tg.gradient(f, y)[0], expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("part", ["real", "imag"])
@pytest.mark.parametrize("name", CUTS)
def test_the_slope_on_a_branch_cut_is_the_side_of_the_value(name, part):
    """Taken at conj(z), across the cut, the slope had the wrong sign (acos at -2 + 0j)."""
    x, h = np.array(CUTS[name]), 1e-7

    def f(a):  # real along the axis: tracked, or plain for the finite differences
        return tg.sum(getattr(tg, part)(getattr(tg, name)(tg.astype(a, tg.complex128))))

    expected = [(float(f(x + h * e)) - float(f(x - h * e))) / (2 * h) for e in np.eye(x.size)]
    np.testing.assert_allclose(tg.gradient(f, x)[0], expected, rtol=1e-6, atol=1e-9)
