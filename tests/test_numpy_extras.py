"""NumPy's functions beyond the standard (tracker_gpu.rules.numpy_arrays and numpy_math),
`linspace` differentiable in its ends, and `linalg.eig`: values against NumPy's own functions,
first and second derivatives against central finite differences in float64, on NumPy,
array-api-strict and PyTorch through the tracked namespace; `eig`'s gradients also against
PyTorch's autograd."""

import array_api_compat
import numpy as np
import pytest
from conftest import BACKENDS
from helpers import numpy_of

import tracker_gpu as tg
from tracker_gpu.rules import decompositions, numpy_arrays, numpy_math
from tracker_gpu.testing import gradcheck

LIBRARIES = ["numpy", "strict", "torch"]


class Const:
    """An input passed as a plain array of the library, not differentiated."""

    def __init__(self, value):
        self.value = np.asarray(value)


def rand(*shape, seed=0, low=-2.0, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape)


def distinct(*shape, seed=0):
    """Values at least 0.1 apart (no ties: sorts and maxima are differentiable there)."""
    n = int(np.prod(shape))
    values = np.random.default_rng(seed).permutation(n) * 0.37 - 1.1
    return values.reshape(shape) + rand(*shape, seed=seed + 1, low=0, high=0.05)


X34, X5, X234 = rand(3, 4), rand(5), rand(2, 3, 4, seed=1)
NANS = np.array([[np.nan, 0.3, -1.2], [0.7, np.nan, 2.0]])
UNEVEN = np.array([0.0, 0.4, 1.1, 1.5, 2.6])
Z = rand(2, 3, seed=3) + 1j * rand(2, 3, seed=4)

# name -> cases: (id, inputs, call(fn, *inputs), exact). `fn` is the function under test, or
# NumPy's own one for the expected value; `exact` where both do the same arithmetic on NumPy.
CASES = {
    "atleast_1d": [("0d", [rand()], lambda f, x: f(x), True),
                   ("many", [rand(), X5], lambda f, x, y: f(x, y), True)],
    "atleast_2d": [("1d", [X5], lambda f, x: f(x), True),
                   ("many", [rand(), X5, X34], lambda f, *xs: f(*xs), True)],
    "atleast_3d": [("1d-2d", [X5, X34], lambda f, x, y: f(x, y), True),
                   ("0d", [rand()], lambda f, x: f(x), True)],
    "vstack": [("1d", [X5, rand(5, seed=2)], lambda f, x, y: f([x, y]), True),
               ("2d", [X34, rand(2, 4)], lambda f, x, y: f((x, y)), True)],
    "hstack": [("1d", [X5, rand(2)], lambda f, x, y: f([x, y]), True),
               ("2d", [X34, rand(3, 2)], lambda f, x, y: f([x, y]), True)],
    "dstack": [("2d", [X34, rand(3, 4, seed=5)], lambda f, x, y: f([x, y]), True),
               ("1d", [X5, rand(5, seed=2)], lambda f, x, y: f([x, y]), True)],
    "column_stack": [("1d-2d", [rand(3), X34], lambda f, x, y: f([x, y]), True)],
    "split": [("sections", [rand(6)], lambda f, x: f(x, 3), True),
              ("indices-axis1", [X34], lambda f, x: f(x, [1, 3, 9], axis=1), True)],
    "array_split": [("uneven", [rand(7)], lambda f, x: f(x, 3), True),
                    ("axis0", [X34], lambda f, x: f(x, 2, axis=0), True)],
    "hsplit": [("2d", [X34], lambda f, x: f(x, 2), True)],
    "vsplit": [("2d", [rand(4, 3)], lambda f, x: f(x, [1]), True)],
    "dsplit": [("3d", [X234], lambda f, x: f(x, 2), True)],
    "append": [("flat", [X34, X5], lambda f, x, y: f(x, y), True),
               ("axis", [X34, rand(1, 4)], lambda f, x, y: f(x, y, axis=0), True)],
    "rot90": [("k1", [X34], lambda f, x: f(x), True),
              ("k2", [X34], lambda f, x: f(x, 2), True),
              ("k-1-axes", [X234], lambda f, x: f(x, -1, axes=(2, 1)), True)],
    "pad": [("constant", [X34], lambda f, x: f(x, ((1, 2), (0, 1)),
                                              constant_values=((1.5, -2.0), (3.0, 4.0))), True),
            ("edge", [X34], lambda f, x: f(x, (2, 1), mode="edge"), True),
            ("reflect-wide", [rand(3)], lambda f, x: f(x, (5, 7), mode="reflect"), True),
            ("symmetric", [X34], lambda f, x: f(x, ((3, 1), (4, 2)), mode="symmetric"), True),
            ("wrap", [X34], lambda f, x: f(x, 5, mode="wrap"), True)],
    "fmax": [("nan", [NANS, NANS[::-1].copy()], lambda f, x, y: f(x, y), True),
             ("broadcast", [X34, rand(4, seed=7)], lambda f, x, y: f(x, y), True)],
    "fmin": [("nan", [NANS, NANS[::-1].copy()], lambda f, x, y: f(x, y), True)],
    "logaddexp2": [("pair", [X34, rand(4, seed=8)], lambda f, x, y: f(x, y), False)],
    "angle": [("complex", [Z], lambda f, z: f(z), True),
              ("deg", [Z], lambda f, z: f(z, deg=True), True),
              ("real", [X5], lambda f, x: f(x), True)],
    "nan_to_num": [("defaults", [np.array([np.nan, 1.0, -0.5, np.nan, -2.0])],
                    lambda f, x: f(x), True),
                   ("given", [np.array([[np.nan, 0.5], [np.inf, -np.inf]])],
                    lambda f, x: f(x, nan=1.0, posinf=7.0, neginf=-7.0), True),
                   ("complex", [np.array([complex(np.nan, 1.0), 0.5 - 2j, complex(1.5, np.nan)])],
                    lambda f, x: f(x, nan=3.0), True)],
    "select": [("two", [X34, rand(3, 4, seed=9)],
                lambda f, x, y: f([x < 0, x > 1], [x * y, y], default=x), True),
               ("scalar-default", [X5],
                lambda f, x: f([x > 0.5], [x * x], default=-1.0), True)],
    "dot": [("vv", [X5, rand(5, seed=2)], lambda f, x, y: f(x, y), False),
            ("mm", [X34, rand(4, 2)], lambda f, x, y: f(x, y), False),
            ("nd-v", [X234, rand(4)], lambda f, x, y: f(x, y), False),
            ("nd-nd", [X234, rand(2, 4, 3)], lambda f, x, y: f(x, y), False),
            ("scalar", [rand(), X5], lambda f, x, y: f(x, y), True),
            ("python-number", [X5], lambda f, x: f(x, 2.5), True)],
    "inner": [("vv", [X5, rand(5, seed=2)], lambda f, x, y: f(x, y), False),
              ("nd", [X234, rand(2, 4)], lambda f, x, y: f(x, y), False),
              ("python-number", [X34], lambda f, x: f(-1.5, x), True)],
    "trace": [("2d", [X34], lambda f, x: f(x), False),
              ("3d-first-axes", [X234], lambda f, x: f(x), False),
              ("offset-axes", [X234], lambda f, x: f(x, 1, 2, 0), False)],
    "partition": [("1d", [distinct(7)], lambda f, x: np.sort(f(x, 3)) if f is np.partition
                   else f(x, 3), True),
                  ("axis0", [distinct(4, 3)], lambda f, x: np.sort(f(x, [1, 2], axis=0), axis=0)
                   if f is np.partition else f(x, [1, 2], axis=0), True)],
    "numerical_gradient": [
        ("1d", [X5], lambda f, x: f(x), True),
        ("2d-spacing", [X34, rand(seed=4, low=0.5, high=1.5)], lambda f, x, d: f(x, d), True),
        ("2d-edge2", [X34], lambda f, x: f(x, 0.5, edge_order=2), True),
        ("uneven", [X5, UNEVEN], lambda f, x, c: f(x, c), True),
        ("uneven-edge2", [X5, UNEVEN], lambda f, x, c: f(x, c, edge_order=2), True),
        ("coords-axis", [X34, Const(np.arange(4.0) * 0.5)],
         lambda f, x, c: f(x, c, axis=1), True),
    ],
    "linspace": [("start", [rand(seed=5)], lambda f, a: f(a, 3.4, 5), True),
                 ("both", [rand(seed=5), rand(seed=6)], lambda f, a, b: f(a, b, 4), True),
                 ("array-ends", [rand(3, seed=5), rand(3, seed=6)],
                  lambda f, a, b: f(a, b, 4), True),
                 ("open", [rand(seed=5), rand(seed=6)],
                  lambda f, a, b: f(a, b, 6, endpoint=False), True)],
}  # fmt: skip
NUMPY_NAMES = {"numerical_gradient": "gradient"}
CASE_IDS = [(name, case[0]) for name, cases in CASES.items() for case in cases]


def test_the_table_covers_every_added_function():
    added = set(numpy_arrays.__all__) | set(numpy_math.__all__) | {"linspace"}
    assert added == set(CASES)
    for name in added:
        assert getattr(tg, name) is getattr(tg.namespace, name)
    assert {"eig", "eigvals", "EigResult"} <= set(decompositions.__all__)
    assert tg.gradient is tg.api.gradient  # Tracker's transform keeps its name


@pytest.fixture(params=LIBRARIES)
def library(request):
    return BACKENDS[request.param]()


def _case(name, case_id):
    return next(c for c in CASES[name] if c[0] == case_id)


def _inputs(library, inputs):
    return [library.asarray(x.value if isinstance(x, Const) else x) for x in inputs]


def _varying(inputs):
    return [i for i, x in enumerate(inputs) if not isinstance(x, Const)]


def _flat(ns, out):
    """One array of the (possibly several) results."""
    if isinstance(out, (tuple, list)):
        return ns.concat([ns.reshape(o, (-1,)) for o in out])
    return out


def _with(values, positions, moving):
    values = list(values)
    for p, v in zip(positions, moving):
        values[p] = v
    return values


@pytest.mark.parametrize("name, case_id", CASE_IDS)
def test_value_is_numpys(library, name, case_id):
    _, inputs, call, exact = _case(name, case_id)
    plain = [x.value if isinstance(x, Const) else x for x in inputs]
    expected = call(getattr(np, NUMPY_NAMES.get(name, name)), *plain)
    xs = _inputs(library, inputs)
    positions = _varying(inputs)
    tracked = _with(xs, positions, [tg.param(xs[p]) for p in positions])
    xp = array_api_compat.array_namespace(tracked[positions[0]])
    got = call(getattr(xp, name), *tracked)
    expected = expected if isinstance(expected, (tuple, list)) else [expected]
    got = got if isinstance(got, (tuple, list)) else [got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        value = library.to_numpy(tg.data(g))
        assert value.shape == np.shape(e) and value.dtype == np.asarray(e).dtype
        if exact and library.name == "numpy":
            np.testing.assert_array_equal(value, e)
        else:
            np.testing.assert_allclose(value, e, rtol=1e-13, atol=1e-14)


def _loss_parts(library, name, case_id):
    _, inputs, call, _ = _case(name, case_id)
    xs = _inputs(library, inputs)
    positions = _varying(inputs)

    xp = array_api_compat.array_namespace(tg.param(xs[positions[0]]))  # the tracked one

    def f(*moving):
        return _flat(xp, call(getattr(xp, name), *_with(xs, positions, moving)))

    return f, [xs[p] for p in positions]


@pytest.mark.parametrize("name, case_id", CASE_IDS)
def test_gradient_matches_finite_differences(library, name, case_id):
    f, xs = _loss_parts(library, name, case_id)
    grads = tg.gradient(lambda *a: tg.sum(tg.real(f(*a))), *xs)
    assert any(g is not None for g in grads)
    assert gradcheck(f, *xs)


@pytest.mark.parametrize("name, case_id", CASE_IDS)
def test_second_derivative_matches_finite_differences(library, name, case_id):
    """The gradient of `sum(w * sin(f(x)))`, itself differentiated: each rule's pullback is
    recorded (a tracked cotangent passes through it, and through what it read of x)."""
    f, xs = _loss_parts(library, name, case_id)
    out = f(*xs)
    w = library.asarray(np.random.default_rng(2).uniform(0.5, 1.5, size=tuple(out.shape)))

    def first(*a):
        return tg.gradient(lambda *b: tg.sum(tg.sin(tg.real(f(*b))) * w), *a, nest=True)[0]

    assert gradcheck(first, *xs)


# --- what the table cannot say
def test_identity_and_trace_of_the_namespace_are_numpys():
    """The namespace's `identity` was Tracker's (`identity(3)` gave 3) and its `trace` the
    standard's `linalg.trace`, over the last two axes, where NumPy's takes the first two."""
    xp = array_api_compat.array_namespace(tg.param(np.ones(1)))
    for args in ((3,), (2, np.float32)):
        got = xp.identity(*args)
        assert tg.data(got).dtype == np.identity(*args).dtype
        np.testing.assert_array_equal(tg.data(got), np.identity(*args))
    np.testing.assert_array_equal(tg.data(xp.trace(tg.param(X234))), np.trace(X234))
    np.testing.assert_array_equal(tg.linalg.trace(X234), np.linalg.trace(X234))


def test_partition_puts_the_kth_element_where_numpy_does(library):
    x = distinct(3, 6, seed=11)
    got = library.to_numpy(tg.data(tg.partition(tg.param(library.asarray(x)), [1, 4])))
    expected = np.partition(x, [1, 4])
    np.testing.assert_array_equal(got[:, [1, 4]], expected[:, [1, 4]])
    assert (got[:, :1] <= got[:, 1:2]).all() and (got[:, 5:] >= got[:, 4:5]).all()


def test_fmax_gives_the_gradient_to_the_number_beside_nan():
    x, y = np.array([np.nan, 1.0, 2.0, np.nan]), np.array([3.0, np.nan, 1.0, np.nan])
    gx, gy = tg.gradient(lambda x, y: tg.sum(tg.nan_to_num(tg.fmax(x, y))), x, y)
    np.testing.assert_array_equal(gx, [0.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(gy, [1.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(tg.fmin(x, y), np.fmin(x, y))


def test_nan_to_num_defaults_are_the_dtypes_extremes():
    for dtype in (np.float32, np.float64):
        x = np.array([np.inf, -np.inf, np.nan, 1.5], dtype=dtype)
        got = tg.data(tg.nan_to_num(tg.param(x)))
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, np.nan_to_num(x))


def test_angle_gradient_is_pytorchs():
    torch = pytest.importorskip("torch")
    z = np.array([1.0 + 2.0j, -0.5 - 1.0j, 0.0 + 0.0j, -3.0 + 0.0j])
    (ours,) = tg.gradient(lambda z: tg.sum(tg.angle(z) * np.arange(1.0, 5.0)), z)
    t = torch.tensor(z, requires_grad=True)
    (torch.angle(t) * torch.arange(1.0, 5.0, dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(ours, t.grad.numpy(), atol=1e-15)


def test_linspace_of_plain_ends_is_not_tracked_and_the_error_is_gone():
    assert not tg.istracked(tg.linspace(0.0, 1.0, 3))
    start = tg.param(np.array(1.0))
    out = tg.linspace(start, 3.4, 5, dtype=tg.float32)
    assert out.dtype == np.float32 and tg.istracked(out)
    np.testing.assert_array_equal(tg.data(out), np.linspace(1.0, 3.4, 5, dtype=np.float32))
    (g,) = tg.gradient(lambda a: tg.sum(tg.linspace(a, 3.4, 5)), np.array(1.0))
    assert float(g) == pytest.approx(2.5)  # weights 1, 3/4, 1/2, 1/4, 0
    ones = tg.linspace(tg.param(np.array(2.0)), 3.0, 1)
    np.testing.assert_array_equal(tg.data(ones), np.linspace(2.0, 3.0, 1))


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: tg.split(np.ones(5), 2), "equal division"),
        (lambda: tg.pad(np.ones(3), 1, mode="median"), "not supported"),
        (lambda: tg.pad(np.ones(3), 1, mode="reflect", reflect_type="odd"), "reflect_type"),
        (lambda: tg.rot90(np.ones(3)), "two dimensions"),
        (lambda: tg.select([np.ones(2) > 0], []), "same length"),
        (lambda: tg.numerical_gradient(np.ones(2), edge_order=2), "too small"),
        (lambda: tg.partition(np.ones(3), 3), "out of bounds"),
    ],
)
def test_bad_arguments_are_refused(call, error):
    with pytest.raises((ValueError, TypeError), match=error):
        call()


# --- linalg.eig: general matrices, complex eigenvalues and unit-norm eigenvectors
A3 = np.array([[0.3, -1.2, 0.5], [1.1, 0.2, -0.4], [0.6, 0.9, -0.7]])  # one complex pair
ROWS = np.array([0.7, 1.3, 2.1])


def _eig_losses(ns, rows=ROWS):
    """Losses that do not depend on the eigenvectors' phases, nor on the eigenvalues' order;
    `rows` weighs the rows of the eigenvectors."""
    return {
        "abs-values": lambda a: ns.sum(ns.abs(ns.linalg.eig(a).eigenvalues)),
        "real-values-cubed": lambda a: ns.sum(ns.real(ns.linalg.eigvals(a)) ** 3),
        "vector-moduli": lambda a: ns.sum(
            ns.abs(ns.linalg.eig(a).eigenvectors) ** 2 * ns.reshape(rows, (3, 1))
        ),
        "both": lambda a: ns.sum(ns.abs(_scaled_columns(ns, *ns.linalg.eig(a))) * rows),
    }


def _scaled_columns(ns, w, v):
    """Each eigenvector times its eigenvalue (a stack of them: each matrix's)."""
    return v * ns.reshape(w, tuple(w.shape[:-1]) + (1, w.shape[-1]))


@pytest.mark.parametrize("loss", list(_eig_losses(np)))
def test_eig_gradient_matches_torch_autograd(loss):
    torch = pytest.importorskip("torch")
    for a in (A3, A3 + 0.1j * rand(3, 3, seed=12), rand(2, 3, 3, seed=13)):
        (ours,) = tg.gradient(_eig_losses(tg)[loss], a)
        t = torch.tensor(a, requires_grad=True)
        _eig_losses(torch, torch.tensor(ROWS))[loss](t).backward()
        np.testing.assert_allclose(ours, t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("loss", list(_eig_losses(np)))
def test_eig_first_and_second_derivatives(library, loss):
    f = _eig_losses(tg, library.asarray(ROWS))[loss]
    for a in (A3, A3 + 0.1j * rand(3, 3, seed=12)):
        x = library.asarray(a)
        assert gradcheck(f, x, rtol=1e-6, atol=1e-7)
        assert gradcheck(lambda a: tg.gradient(f, a, nest=True)[0], x, rtol=1e-5, atol=1e-6)


def test_eig_values_and_vectors(library):
    a = library.asarray(A3)
    w, v = tg.linalg.eig(tg.param(a))
    w, v = library.to_numpy(tg.data(w)), library.to_numpy(tg.data(v))
    assert w.dtype == np.complex128 and v.dtype == np.complex128
    np.testing.assert_allclose(A3 @ v, v * w, atol=1e-13)
    np.testing.assert_allclose(np.linalg.norm(v, axis=0), 1.0, rtol=1e-14)
    np.testing.assert_allclose(np.sort_complex(w), np.sort_complex(np.linalg.eigvals(A3)),
                               rtol=1e-13)  # fmt: skip
    plain = tg.linalg.eig(np.diag([1.0, 2.0]))  # real eigenvalues: complex all the same
    assert plain.eigenvalues.dtype == np.complex128 and not tg.istracked(plain.eigenvalues)


def test_eig_refuses_a_library_without_eig():
    class NoEig:
        __name__ = "nolinalg"
        linalg = object()

    with pytest.raises(NotImplementedError, match="linalg.eig needs the array library's own"):
        decompositions._eig_forward(NoEig, np.eye(2))


def test_logaddexp2_is_numpys_over_the_whole_domain():
    edges = [0.0, -0.0, 1e-310, -1.0, 3.5, 1e300, -1e300, 1100.0, -1100.0, np.inf, -np.inf, np.nan]
    x, y = (a.ravel() for a in np.meshgrid(edges, edges))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(tg.data(tg.logaddexp2(tg.param(x), y)), np.logaddexp2(x, y))
    small = np.array([1, -3], np.int8)
    assert tg.logaddexp2(small, small).dtype == np.logaddexp2(small, small).dtype


def test_logaddexp2_gradient_at_ties_and_beside_infinities():
    x, y = np.array([2.0, np.inf, 5.0, -np.inf]), np.array([2.0, 1.0, -np.inf, 0.0])
    _, back = tg.forward(tg.logaddexp2, x, y)
    gx, gy = back(np.ones(4))
    np.testing.assert_array_equal(gx, [0.5, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(gy, [0.5, 0.0, 0.0, 1.0])


@pytest.mark.parametrize("posinf", [None, 7.0])
def test_nan_to_num_of_complex_values_is_numpys_bits(backend, posinf):
    """Rebuilt as re + im * 1j, -2 - 0j became -2 + 0j (the sign of sqrt's result flips on
    it); a finite value is now kept as it is."""
    z = np.array([complex(-2.0, -0.0), complex(1.0, np.inf), complex(np.nan, 2.0), -0.0 + 1j])
    got = numpy_of(backend, tg.nan_to_num(tg.param(backend.asarray(z)), posinf=posinf))
    expected = np.nan_to_num(z, posinf=posinf)
    for part in (np.real, np.imag):
        np.testing.assert_array_equal(part(got), part(expected))
        np.testing.assert_array_equal(np.signbit(part(got)), np.signbit(part(expected)))
