"""Every function of the standard, called on the tracked namespace's own arrays, returns the
namespace's own arrays (`array_namespace(result) is xp`): tracked where the result depends
differentiably on a tracked argument, tracked constants otherwise. The functions are those of
the standard's table in test_signatures.py, so a function added there is covered here too.
"""

import array_api_compat
import numpy as np
import pytest

import tracker_gpu as tg
from tests.test_signatures import STANDARD_2024_12

NAMES = [line.split("(")[0] for line in STANDARD_2024_12]
# Functions that answer with dtypes, flags or information, not arrays.
NOT_ARRAYS = {"can_cast", "finfo", "iinfo", "isdtype", "result_type"}
BITWISE = {name for name in NAMES if name.startswith("bitwise_")}
LOGICAL = {name for name in NAMES if name.startswith("logical_")}
INTEGER_RESULTS = {"argmax", "argmin", "argsort", "count_nonzero", "searchsorted", "nonzero"}
INTEGER_RESULTS |= {"unique_counts", "unique_inverse", "unique_all", "linalg.matrix_rank"}
INTEGER_RESULTS |= {"floor_divide"}  # of floats: a float, but not differentiable


def _matrix(backend):
    return backend.asarray([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])


def _calls(xp, x, device):
    """How to call each function that does not take `(x)` or `(x1, x2)` alone."""
    ints = xp.asarray([[1, 2, 3], [4, 5, 6], [7, 8, 9]], device=device)
    mask = x > 1.5
    row = x[0, :]
    kw = dict(device=device)
    return {
        "arange": lambda f: f(3, **kw),
        "asarray": lambda f: f([1.0, 2.0], **kw),
        "astype": lambda f: f(x, xp.float32),
        "broadcast_arrays": lambda f: f(x, row),
        "broadcast_to": lambda f: f(row, (2, 3)),
        "can_cast": lambda f: f(xp.float32, xp.float64),
        "clip": lambda f: f(x, 0.5, 2.0),
        "concat": lambda f: f([x, x], axis=1),
        "empty": lambda f: f((2, 2), **kw),
        "eye": lambda f: f(3, **kw),
        "expand_dims": lambda f: f(x, axis=0),
        "finfo": lambda f: f(x.dtype),
        "from_dlpack": lambda f: f(xp.ones(3, **kw)),
        "full": lambda f: f((2,), 3.0, **kw),
        "full_like": lambda f: f(x, 3.0),
        "iinfo": lambda f: f(ints.dtype),
        "isdtype": lambda f: f(x.dtype, "real floating"),
        "linspace": lambda f: f(0.0, 1.0, 4, **kw),
        "meshgrid": lambda f: f(row, row),
        "moveaxis": lambda f: f(x, 0, 1),
        "ones": lambda f: f((2,), **kw),
        "permute_dims": lambda f: f(x, (1, 0)),
        "repeat": lambda f: f(x, 2, axis=0),
        "reshape": lambda f: f(x, (9,)),
        "result_type": lambda f: f(x, xp.float32),
        "roll": lambda f: f(x, 1),
        "searchsorted": lambda f: f(xp.sort(row), row),
        "squeeze": lambda f: f(xp.expand_dims(x, axis=0), axis=0),
        "stack": lambda f: f([x, x]),
        "take": lambda f: f(x, xp.asarray([2, 0], **kw), axis=0),
        "take_along_axis": lambda f: f(x, xp.argsort(x, axis=1), axis=1),
        "tensordot": lambda f: f(x, x, axes=1),
        "tile": lambda f: f(x, (2, 1)),
        "where": lambda f: f(mask, x, 0.0),
        "zeros": lambda f: f((2,), **kw),
        "isin": lambda f: f(ints, xp.asarray([2, 5], **kw)),
        "fft.fftfreq": lambda f: f(4, **kw),
        "fft.rfftfreq": lambda f: f(4, **kw),
        "fft.hfft": lambda f: f(row),
        "fft.irfft": lambda f: f(row),
        "fft.irfftn": lambda f: f(x),
        "linalg.matrix_power": lambda f: f(x, 3),  # NumPy multiplies a cube as (x x) x
        "imag": lambda f: f(x * (1.0 + 2.0j)),  # the standard's imag takes complex arrays
        "cumulative_sum": lambda f: f(x, axis=0),
        "cumulative_prod": lambda f: f(x, axis=1),
        "linalg.solve": lambda f: f(x, x),
        "linalg.tensordot": lambda f: f(x, x, axes=1),
        "linalg.cross": lambda f: f(x, x),
        "linalg.outer": lambda f: f(row, row),  # the standard's takes vectors
        **{name: (lambda f: f(ints, ints)) for name in BITWISE},
        "bitwise_invert": lambda f: f(ints),
        **{name: (lambda f: f(mask, mask)) for name in LOGICAL},
        "logical_not": lambda f: f(mask),
    }


def _function(xp, name):
    owner = xp
    for part in name.split("."):
        owner = getattr(owner, part)
    return owner


def _arrays(result):
    if isinstance(result, tuple):
        return [a for part in result for a in _arrays(part)]
    return [result]


def _call(xp, x, device, name):
    f = _function(xp, name)
    special = _calls(xp, x, device).get(name)
    if special is not None:
        return special(f)
    line = next(s for s in STANDARD_2024_12 if s.split("(")[0] == name)
    return f(x, x) if line.split("(")[1].startswith("x1, x2") else f(x)


def _skip_what_the_library_lacks(backend, name):
    if backend.name == "dask" and name in ("unique_all", "unique_inverse", "nonzero"):
        pytest.skip("dask lacks data-dependent shapes for this function")
    if backend.name == "dask" and name == "from_dlpack":
        pytest.skip("dask arrays lack __dlpack__")
    if backend.name == "torch" and name in ("unique_all",):
        pytest.skip("array-api-compat does not implement unique_all for PyTorch")


@pytest.mark.parametrize("name", sorted(set(NAMES) - NOT_ARRAYS))
def test_every_function_returns_the_namespaces_arrays(backend, name):
    _skip_what_the_library_lacks(backend, name)
    x = tg.param(_matrix(backend))
    xp = array_api_compat.array_namespace(x)
    with np.errstate(all="ignore"):
        result = _call(xp, x, backend.device, name)
    arrays = _arrays(result)
    assert arrays, f"{name} returned nothing"
    for a in arrays:
        assert isinstance(a, tg.TrackedArray), f"{name} returned {type(a).__name__}"
        assert array_api_compat.array_namespace(a) is xp, name
        assert array_api_compat.array_namespace(x, a) is xp, name
        if name in INTEGER_RESULTS or name in BITWISE or name in LOGICAL:
            assert not tg.istracked(a), f"{name} gives no gradient, yet its result is on the tape"


def test_namespace_arrays_with_other_arrays(backend):
    x = tg.param(_matrix(backend))
    xp = array_api_compat.array_namespace(x)
    assert array_api_compat.array_namespace(xp.zeros(2)) is xp
    assert array_api_compat.array_namespace(xp.zeros(2), x > 0, xp.argmax(x)) is xp
    assert xp.argmax(x).ndim == 0  # a 0-d array, not a library's scalar


def test_where_on_a_tracked_boolean_condition(backend):
    """array-api-extra's sinc casts its input to bool for the condition of a where."""

    def f(x):
        xp = array_api_compat.array_namespace(x)
        return xp.sum(xp.where(xp.astype(x, xp.bool), x * x, 5.0))

    (g,) = tg.gradient(f, backend.asarray([0.0, 2.0, -3.0]))
    np.testing.assert_allclose(backend.to_numpy(g), [0.0, 4.0, -6.0])


@pytest.mark.parametrize("on_tape", [True, False], ids=["on the tape", "constant"])
def test_asarray_copies_when_asked(backend, on_tape):
    x = tg.param(backend.asarray([1.0, 2.0]))
    if not on_tape:
        x = tg.stop_gradient(x)
    xp = array_api_compat.array_namespace(x)
    y = xp.asarray(x, copy=True)
    assert y is not x and xp.asarray(x) is x
    y[0] = 9.0
    assert backend.to_numpy(tg.data(x)).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("dtype", ["uint8", "int64", "float32", "complex64", "bool"])
def test_asarray_without_a_copy_is_the_array_itself(dtype):
    xp = array_api_compat.array_namespace(tg.param(np.ones(2)))
    x = xp.zeros(2, dtype=getattr(xp, dtype))
    out = xp.asarray(x, copy=False)
    x[0] = 1
    assert out is x and bool(out[0])


def test_the_zero_norm_of_complex_values_is_real():
    xp = array_api_compat.array_namespace(tg.param(np.ones(2)))
    z = xp.asarray([0j, 1 + 1j], dtype=xp.complex64)
    assert xp.linalg.vector_norm(z, ord=0).dtype == xp.float32
    assert xp.linalg.vector_norm(tg.param(np.asarray([0j, 2j])), ord=0).dtype == xp.float64


UNINITIALISED = {"empty", "empty_like"}


def _resolved(value):
    """PyTorch's lazy conjugate made real: NumPy's view of it would read the unconjugated."""
    return value.resolve_conj() if hasattr(value, "resolve_conj") else value


@pytest.mark.parametrize("name", sorted(set(NAMES) - NOT_ARRAYS - UNINITIALISED))
def test_every_function_gives_the_plain_namespaces_value_bit_for_bit(backend, name):
    """A tracked expression's value is the plain expression's: the same dtype and the same
    bits (`svdvals` ran the full decomposition, whose values differ in the last bits; a cube
    by `matrix_power` multiplied in another order than NumPy's)."""
    _skip_what_the_library_lacks(backend, name)
    if backend.name == "dask" and name == "linalg.cholesky":
        pytest.skip("Dask's own factor is the upper one; the tracked one is the standard's")
    plain = _matrix(backend)
    plain_xp = array_api_compat.array_namespace(plain)
    x = tg.param(plain)
    xp = array_api_compat.array_namespace(x)
    with np.errstate(all="ignore"):
        try:
            expected = _arrays(_call(plain_xp, plain, backend.device, name))
        except TypeError as refusal:  # array-api-strict's fft of real arrays
            pytest.skip(f"the plain namespace refuses it ({refusal}); the tracked one answers")
        except ValueError:  # array-api-compat's frequencies refuse CUDA devices: CuPy's own
            if not (backend.name == "cupy" and name.endswith("freq")):
                raise
            import cupy

            expected = [_function(cupy, name)(4)]
        got = _arrays(_call(xp, x, backend.device, name))
    assert len(got) == len(expected), name
    for a, b in zip(got, expected):
        a, b = (_resolved(v) for v in (tg.data(a), b))
        a, b = backend.to_numpy(a), backend.to_numpy(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype)
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), (name, (a - b).tolist())
