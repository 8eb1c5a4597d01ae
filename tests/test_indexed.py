"""tg.at: values against NumPy (np.add.at and friends, assignment for set), gradients in x and v
against finite differences on every backend, repeated indices, broadcast values, no mutation."""

import numpy as np
import pytest
from helpers import check, check_nested, numpy_of

import tracker_gpu as tg

SHAPE = (4, 5)
MASK = np.random.default_rng(3).uniform(size=SHAPE) > 0.5

# name: an index into an array of SHAPE, in NumPy terms (arrays become the backend's)
KEYS = {
    "int": 1,
    "negative-int": -1,
    "slice": slice(1, 3),
    "step-slice": (slice(None), slice(None, None, 2)),
    "int-slice": (2, slice(1, 4)),
    "ints": (1, 3),
    "array": np.array([2, 0, 3]),
    "array-repeated": np.array([0, 2, 0, 3, 0]),
    "arrays-repeated": (np.array([0, 1, 0, 3]), np.array([2, 2, 2, 4])),
    "slice-array-repeated": (slice(None), np.array([1, 1, 4, 1])),
    "mask": MASK,
    "mask-rows": np.array([True, False, True, True]),
    "ellipsis": (Ellipsis, 2),
    "empty-array": np.array([], dtype=np.int64),
    "empty-slice": (slice(None), slice(3, 3)),
    "empty-mask": np.zeros(SHAPE, dtype=bool),
}
METHODS = ["set", "add", "subtract", "multiply", "min", "max"]
UFUNCS = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
}


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def numpy_reference(x, key, v, method):
    y = x.copy()
    if method == "set":
        y[key] = v  # NumPy's assignment: the last value wins where an element repeats
    else:
        UFUNCS[method].at(y, key, np.broadcast_to(v, y[key].shape))
    return y


def on(backend, key):
    if isinstance(key, tuple):
        return tuple(on(backend, k) for k in key)
    if isinstance(key, np.ndarray):
        return backend.asarray(key)
    return key


def selected_shape(key):
    return np.zeros(SHAPE)[key].shape


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", KEYS)
def test_value(backend, name, method):
    key = KEYS[name]
    x, v = randn(*SHAPE), randn(*selected_shape(key), seed=1)
    expected = numpy_reference(x, key, v, method)
    bx, bv = backend.asarray(x), backend.asarray(v)
    got = getattr(tg.at(bx)[on(backend, key)], method)(bv)
    assert not tg.istracked(got)
    np.testing.assert_allclose(numpy_of(backend, got), expected, rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(numpy_of(backend, bx), x)  # x is not written to
    tracked = getattr(tg.at(tg.param(bx), on(backend, key)), method)(tg.param(bv))
    assert tg.istracked(tracked)
    np.testing.assert_allclose(numpy_of(backend, tracked), expected, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", KEYS)
def test_gradient(backend, name, method):
    key = on(backend, KEYS[name])
    x = backend.asarray(randn(*SHAPE))
    v = backend.asarray(randn(*selected_shape(KEYS[name]), seed=1))
    check(backend, lambda x, v: getattr(tg.at(x)[key], method)(v), x, v)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["array-repeated", "arrays-repeated", "slice", "mask"])
def test_broadcast_value(backend, name, method):
    """v of the last axis's size or a 0-d array broadcasts to x[idx]; so does a number."""
    key = KEYS[name]
    x = randn(*SHAPE)
    sel = selected_shape(key)
    for v in [randn(*sel[-1:], seed=2), np.array(0.7), randn(1, seed=3)]:
        expected = numpy_reference(x, key, v, method)
        bv = backend.asarray(v)
        got = getattr(tg.at(backend.asarray(x))[on(backend, key)], method)(bv)
        np.testing.assert_allclose(numpy_of(backend, got), expected, rtol=1e-14, atol=1e-14)
        k = on(backend, key)
        check(backend, lambda x, v, k=k: getattr(tg.at(x)[k], method)(v), backend.asarray(x), bv)
    got = getattr(tg.at(tg.param(backend.asarray(x)))[on(backend, key)], method)(0.7)
    expected = numpy_reference(x, key, np.array(0.7), method)
    np.testing.assert_allclose(numpy_of(backend, got), expected, rtol=1e-14, atol=1e-14)


def test_repeated_add_accumulates(backend):
    x = backend.asarray(np.zeros(3))
    got = tg.at(x)[backend.asarray(np.array([1, 1, 1, 0]))].add(1.0)
    np.testing.assert_array_equal(numpy_of(backend, got), [1.0, 3.0, 0.0])


def test_repeated_set_last_wins_gradient(backend):
    """Only the last value written to a repeated position gets a gradient; x gets none there."""
    x = backend.asarray(np.ones(3))
    v = backend.asarray(np.array([2.0, 3.0, 4.0]))
    key = backend.asarray(np.array([1, 0, 1]))
    y = tg.at(x)[key].set(v)
    np.testing.assert_array_equal(numpy_of(backend, y), [3.0, 4.0, 1.0])
    gx, gv = tg.gradient(lambda x, v: tg.sum(tg.at(x)[key].set(v) * y), x, v)
    np.testing.assert_array_equal(numpy_of(backend, gx), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(numpy_of(backend, gv), [0.0, 3.0, 4.0])


@pytest.mark.parametrize("method", METHODS)
def test_second_order(backend, method):
    key = on(backend, KEYS["array-repeated"])
    x = backend.asarray(randn(*SHAPE))
    v = backend.asarray(randn(*selected_shape(KEYS["array-repeated"]), seed=1))

    def in_x(x):
        y = getattr(tg.at(x)[key], method)(x[0, :] * v)
        return y * y

    def in_v(v):
        y = getattr(tg.at(x)[key], method)(v)
        return y * y * y

    check_nested(backend, in_x, x)
    check_nested(backend, in_v, v)


def test_refused(backend):
    x = backend.asarray(randn(*SHAPE))
    with pytest.raises(ValueError, match="broadcast"):
        tg.at(x)[1].set(backend.asarray(randn(4)))
    with pytest.raises(ValueError, match="no index"):
        tg.at(x).set(1.0)
    with pytest.raises(ValueError, match="twice"):
        tg.at(x, 1)[2]


def test_a_compiled_read_at_a_traced_integer_index_is_eagers(backend):
    """A traced index array on a vector keys it as eager does (tg.compile added an Ellipsis
    that array-api-strict refuses beside an index array)."""
    import array_api_compat

    def f(x):
        xp = array_api_compat.array_namespace(x)
        ranks = xp.arange(3, dtype=x.dtype, device=array_api_compat.device(x))
        return xp.sum(x[xp.argsort(x)] * ranks) + x[xp.argmax(x)]

    x = backend.asarray(np.array([0.5, 0.3, 0.9]))
    eager = tg.withgradient(f, x)
    compiled = tg.compile(f)
    for _ in range(2):
        got = compiled(x)
        assert float(got.val) == float(eager.val)
        assert np.array_equal(numpy_of(backend, got.grad[0]), numpy_of(backend, eager.grad[0]))


SPECIAL = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e308, 2.5])
INTEGER_KEYS = ["array", "array-repeated", "arrays-repeated", "slice-array-repeated"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", INTEGER_KEYS)
def test_non_finite_values_reach_their_elements_alone(backend, name, method):
    """Libraries without a scatter sum by a product with the one-hot matrix, where 0 * inf is
    nan: an inf written at one element made others nan (on array-api-strict and Dask)."""
    key = KEYS[name]
    x, v = randn(*SHAPE), np.resize(SPECIAL, selected_shape(key))
    with np.errstate(all="ignore"):
        expected = numpy_reference(x, key, v, method)
        got = getattr(tg.at(backend.asarray(x))[on(backend, key)], method)(backend.asarray(v))
    np.testing.assert_allclose(numpy_of(backend, got), expected, rtol=1e-14)


def test_an_infinite_gradient_reaches_its_element_alone(backend):
    x = backend.asarray(np.array([0.0, 1.0, 4.0, 9.0]))
    indices = backend.asarray(np.array([0, 2, 3])), backend.asarray(np.array([0, 0, 3]))

    def f(x):
        return tg.sum(tg.sqrt(tg.take(x, indices[0]))) + tg.sum(tg.sqrt(x[indices[1]]))

    with np.errstate(divide="ignore"):
        (got,) = tg.gradient(f, x)
        counts = np.array([3.0, 0.0, 1.0, 2.0])  # how often each element is read
        expected = np.where(counts > 0, counts / (2 * np.sqrt([0.0, 1.0, 4.0, 9.0])), 0.0)
    np.testing.assert_allclose(numpy_of(backend, got), expected, rtol=1e-15)


@pytest.mark.parametrize("method", sorted(set(METHODS) - {"min", "max"}))
@pytest.mark.parametrize("name", INTEGER_KEYS)
def test_signed_zeros_are_written_as_numpy_writes_them(backend, name, method):
    """A value was placed by a scatter into zeros, where 0.0 + -0.0 is 0.0: `x[[1]] = -0.0`
    wrote 0.0. (Which zero the minimum of 0.0 and -0.0 is, is each library's own.)"""
    key = KEYS[name]
    x = randn(*SHAPE)
    v = np.resize(np.array([-0.0, 0.0, -0.0, 1.0]), selected_shape(key))
    expected = numpy_reference(x, key, v, method)
    got = numpy_of(backend, getattr(tg.at(backend.asarray(x))[on(backend, key)], method)(
        backend.asarray(v)))  # fmt: skip
    np.testing.assert_array_equal(got, expected)
    assert np.array_equal(np.signbit(got), np.signbit(expected))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", ["bool", "int64", "float32"])
def test_an_empty_selection_keeps_or_refuses_as_a_selection_of_one(backend, dtype, method):
    """Nothing selected: x's values, in the dtype that selecting one element gives, or the
    error selecting one raises (NumPy's `same_kind` casting refuses 1 into bool and 0.5 into
    integers; array-api-strict, bool arithmetic)."""
    x = backend.asarray(np.ones(SHAPE, dtype=dtype))
    for v in [True, 1, 0.5]:
        update = getattr(tg.at(x)[on(backend, np.array([1]))], method)
        try:
            one = update(v)
        except Exception as refused:  # noqa: BLE001 (the library's own error, whichever)
            with pytest.raises(type(refused)):
                getattr(tg.at(x)[on(backend, KEYS["empty-array"])], method)(v)
            continue
        got = getattr(tg.at(x)[on(backend, KEYS["empty-array"])], method)(v)
        assert got.dtype == one.dtype == x.dtype, (v, got.dtype, one.dtype)
        np.testing.assert_array_equal(numpy_of(backend, got), np.ones(SHAPE, dtype=dtype))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", INTEGER_KEYS)
def test_integer_updates_are_numpys(backend, name, method):
    """Integers in, integers out, NumPy's values: repeated indices accumulate exactly (where
    a library has no scatter, its sums are a product with a one-hot matrix)."""
    key = KEYS[name]
    x = np.arange(np.prod(SHAPE), dtype=np.int64).reshape(SHAPE) - 7
    v = np.arange(np.prod(selected_shape(key)), dtype=np.int64).reshape(selected_shape(key)) % 5
    expected = numpy_reference(x, key, v, method)
    got = getattr(tg.at(backend.asarray(x))[on(backend, key)], method)(backend.asarray(v))
    assert numpy_of(backend, got).dtype == np.int64
    np.testing.assert_array_equal(numpy_of(backend, got), expected)
