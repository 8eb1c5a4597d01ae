"""Shape rules, concat/stack and indexing, on every backend: finite differences for every case,
NumPy references for where the gradient of an index lands (repeated indices accumulate)."""

import numpy as np
import pytest
from helpers import (
    CONTIGUOUS,
    STRIDED,
    TRANSPOSED,
    check,
    check_like,
    check_nested,
    numpy_of,
    on_backend,
    uniform,
)

import tracker_gpu as tg
from tracker_gpu.rules.shape import getitem

# name: (function, shape of the input)
SHAPE_OPS = {
    "reshape": (lambda x: tg.reshape(x, (3, 2)), (2, 3)),
    "reshape-1": (lambda x: tg.reshape(x, (-1,)), (2, 3)),
    "reshape-3d": (lambda x: tg.reshape(x, (2, 1, 3)), (3, 2)),
    "reshape-0d": (lambda x: tg.reshape(x, (1, 1)), ()),
    "reshape-to-0d": (lambda x: tg.reshape(x, ()), (1,)),
    "reshape-empty": (lambda x: tg.reshape(x, (3, 0)), (0, 2)),
    "permute_dims": (lambda x: tg.permute_dims(x, (1, 0)), (2, 3)),
    "permute_dims-3d": (lambda x: tg.permute_dims(x, (2, 0, 1)), (2, 3, 2)),
    "permute_dims-negative": (lambda x: tg.permute_dims(x, (-1, 0, -2)), (2, 3, 2)),
    ".T": (lambda x: x.T, (2, 3)),
    "expand_dims-0": (lambda x: tg.expand_dims(x, axis=0), (2, 3)),
    "expand_dims--1": (lambda x: tg.expand_dims(x, axis=-1), (2, 3)),
    "expand_dims-1": (lambda x: tg.expand_dims(x, axis=1), (2, 3)),
    "expand_dims-0d": (lambda x: tg.expand_dims(x, axis=0), ()),
    "squeeze-0": (lambda x: tg.squeeze(x, axis=0), (1, 3)),
    "squeeze-tuple": (lambda x: tg.squeeze(x, axis=(0, -1)), (1, 3, 1)),
    "squeeze-empty": (lambda x: tg.squeeze(x, axis=1), (0, 1)),
    "flip": (lambda x: tg.flip(x), (2, 3)),
    "flip-0": (lambda x: tg.flip(x, axis=0), (2, 3)),
    "flip--1": (lambda x: tg.flip(x, axis=-1), (2, 3)),
    "flip-tuple": (lambda x: tg.flip(x, axis=(0, 2)), (2, 2, 3)),
    "broadcast_to": (lambda x: tg.broadcast_to(x, (2, 3)), (3,)),
    "broadcast_to-inner": (lambda x: tg.broadcast_to(x, (2, 2, 3)), (2, 1)),
    "broadcast_to-0d": (lambda x: tg.broadcast_to(x, (2, 3)), ()),
    "broadcast_to-same": (lambda x: tg.broadcast_to(x, (2, 3)), (2, 3)),
    "broadcast_to-empty": (lambda x: tg.broadcast_to(x, (0, 3)), (1, 3)),
}


@pytest.mark.parametrize("layout", [CONTIGUOUS, TRANSPOSED, STRIDED])
@pytest.mark.parametrize("name", SHAPE_OPS)
def test_shape_op(backend, name, layout):
    f, shape = SHAPE_OPS[name]
    if layout == TRANSPOSED and len(shape) < 2:
        pytest.skip("a transpose of fewer than two axes is the array itself")
    if layout == STRIDED and (len(shape) == 0 or shape[-1] == 0):
        pytest.skip("no stride to take")
    values = uniform(shape, (-2.0, 2.0), seed=40)
    x = on_backend(backend, values, layout)
    y = f(tg.param(x))
    np.testing.assert_array_equal(numpy_of(backend, y), backend.to_numpy(f(x)))
    check(backend, f, x)


def test_flip_and_permute_reference(backend):
    """Where the gradient lands, against NumPy: it is undone by the inverse permutation."""
    values = uniform((2, 3, 4), (-1.0, 1.0), seed=41)
    w = uniform((4, 2, 3), (0.5, 1.5), seed=42)
    x = on_backend(backend, values)
    (g,) = tg.gradient(lambda x: tg.sum(tg.permute_dims(x, (2, 0, 1)) * on_backend(backend, w)), x)
    np.testing.assert_array_equal(numpy_of(backend, g), np.transpose(w, (1, 2, 0)))
    (g,) = tg.gradient(lambda x: tg.sum(tg.flip(x, axis=1) * on_backend(backend, values)), x)
    np.testing.assert_array_equal(numpy_of(backend, g), np.flip(values, axis=1))


# --- concat and stack: every axis, empty pieces, tracked and plain pieces mixed
# name: (shapes of the pieces, axis)
CONCATS = {
    "axis0": ([(2, 3), (1, 3), (3, 3)], 0),
    "axis1": ([(2, 1), (2, 3), (2, 2)], 1),
    "axis-1": ([(2, 2), (2, 3)], -1),
    "axis-2": ([(1, 2), (2, 2)], -2),
    "3d-axis1": ([(2, 1, 2), (2, 2, 2)], 1),
    "axisNone": ([(2, 3), (4,), (1, 2)], None),
    "empty-piece0": ([(2, 3), (0, 3), (1, 3)], 0),
    "empty-piece1": ([(0, 2), (0, 3)], 1),
    "empty-middle1": ([(2, 1), (2, 0), (2, 2)], 1),
    "one": ([(2, 3)], 0),
    "vectors": ([(3,), (2,), (0,)], 0),
}


@pytest.mark.parametrize("name", CONCATS)
def test_concat(backend, name):
    shapes, axis = CONCATS[name]
    pieces = [on_backend(backend, uniform(s, (-1, 1), seed=43 + i)) for i, s in enumerate(shapes)]
    check(backend, lambda *xs: tg.concat(list(xs), axis=axis), *pieces)


@pytest.mark.parametrize("name", CONCATS)
def test_concat_mixed_tracked_and_plain(backend, name):
    """Every other piece is plain; the tracked ones get exactly their slice of the gradient."""
    shapes, axis = CONCATS[name]
    values = [uniform(s, (-1.0, 1.0), seed=50 + i) for i, s in enumerate(shapes)]
    pieces = [on_backend(backend, v) for v in values]
    tracked = pieces[::2]

    def f(*xs):
        parts = list(pieces)
        parts[::2] = xs
        return tg.concat(parts, axis=axis)

    check(backend, f, *tracked)
    out_shape = np.concatenate([v.ravel() if axis is None else v for v in values], axis=axis or 0)
    w = uniform(out_shape.shape, (0.5, 1.5), seed=60)
    grads = tg.gradient(lambda *xs: tg.sum(f(*xs) * on_backend(backend, w)), *tracked)
    sizes = [v.size if axis is None else v.shape[axis] for v in values]
    splits = np.split(w, np.cumsum(sizes)[:-1], axis=axis or 0)
    for g, piece, expected in zip(grads, values[::2], splits[::2]):
        np.testing.assert_array_equal(numpy_of(backend, g), np.reshape(expected, piece.shape))


def test_concat_plain_pieces_give_plain(backend):
    a = on_backend(backend, np.ones((2, 2)))
    out = tg.concat([a, a], axis=1)
    assert not tg.istracked(out)
    assert tuple(out.shape) == (2, 4)


# name: (shape of each piece, number of pieces, axis)
STACKS = {
    "axis0": ((2, 3), 3, 0),
    "axis1": ((2, 3), 2, 1),
    "axis-1": ((2, 3), 2, -1),
    "axis-2": ((3,), 2, -2),
    "0d": ((), 3, 0),
    "empty": ((0, 2), 2, 1),
    "one": ((2,), 1, 0),
}


@pytest.mark.parametrize("mixed", [False, True], ids=["tracked", "mixed"])
@pytest.mark.parametrize("name", STACKS)
def test_stack(backend, name, mixed):
    shape, count, axis = STACKS[name]
    pieces = [on_backend(backend, uniform(shape, (-1.0, 1.0), seed=61 + i)) for i in range(count)]
    if not mixed:
        check(backend, lambda *xs: tg.stack(list(xs), axis=axis), *pieces)
        return

    i = count // 2

    def f(x):  # the tracked piece in the middle (or alone), plain ones around it
        return tg.stack(pieces[:i] + [x] + pieces[i + 1 :], axis=axis)

    check(backend, f, pieces[i])


@pytest.mark.parametrize("layout", [TRANSPOSED, STRIDED])
def test_concat_stack_non_contiguous(backend, layout):
    a = on_backend(backend, uniform((2, 3), (-1.0, 1.0), seed=70), layout)
    b = on_backend(backend, uniform((2, 3), (-1.0, 1.0), seed=71), layout)
    check(backend, lambda a, b: tg.concat([a, b], axis=1), a, b)
    check(backend, lambda a, b: tg.stack([a, b], axis=1), a, b)


# --- indexing
def int_index(backend, values):
    return backend.asarray(np.array(values, dtype=np.int64))


# name: (key, built from the backend; shape of the input)
KEYS = {
    "int": (lambda b: 1, (3, 4)),
    "negative int": (lambda b: -1, (3, 4)),
    "slice": (lambda b: slice(1, 3), (4, 3)),
    "step": (lambda b: slice(None, None, 2), (5, 2)),
    "negative step": (lambda b: slice(None, None, -1), (4,)),
    "reversed step": (lambda b: slice(3, 0, -2), (5,)),
    "empty slice": (lambda b: slice(2, 2), (4, 2)),
    "None": (lambda b: None, (2, 3)),
    "Ellipsis": (lambda b: Ellipsis, (2, 3)),
    "Ellipsis int": (lambda b: (Ellipsis, 1), (2, 3, 2)),
    "int Ellipsis": (lambda b: (0, Ellipsis), (2, 3, 2)),
    "slice None int": (lambda b: (slice(None), None, 1), (2, 3)),
    "int slice": (lambda b: (1, slice(1, None)), (3, 4)),
    "int int": (lambda b: (1, 2), (3, 4)),
    "0d Ellipsis": (lambda b: Ellipsis, ()),
    "0d empty tuple": (lambda b: (), ()),
    "0d None": (lambda b: None, ()),
    "int array repeated": (lambda b: int_index(b, [0, 2, 2, 0, 2]), (4,)),
    "Tracker x[[1,2,2]]": (lambda b: [0, 1, 1], (3,)),
    "int array rows": (lambda b: int_index(b, [2, 0, 2]), (3, 2)),
    "int array 2d": (lambda b: int_index(b, [[0, 1], [1, 1]]), (3, 2)),
    "int array empty": (lambda b: int_index(b, []), (3, 2)),
    "int arrays pair": (lambda b: (int_index(b, [0, 1, 1]), int_index(b, [2, 0, 2])), (2, 3)),
    "slice int array": (lambda b: (slice(None), int_index(b, [1, 1, 0])), (2, 3)),
    "int array negative": (lambda b: int_index(b, [-1, 0, -1]), (3,)),
    # a one-element index: Dask's own index array of it gave the result a wrong lazy shape
    "slice one-element list": (lambda b: (slice(None), [0]), (3, 4)),
    "one-element list slice": (lambda b: ([0], slice(None)), (3, 4)),
    "Ellipsis one-element list": (lambda b: (Ellipsis, [1]), (2, 3, 2)),
    "bool mask 1d": (lambda b: b.asarray(np.array([True, False, True])), (3,)),
    "bool mask rows": (lambda b: b.asarray(np.array([False, True, True])), (3, 2)),
    "bool mask full": (lambda b: b.asarray(np.array([[True, False], [False, True]])), (2, 2)),
    "bool mask none": (lambda b: b.asarray(np.zeros((2, 2), dtype=bool)), (2, 2)),
}


# Keys that the array library itself refuses, on plain arrays too: torch has no negative steps,
# the standard (array-api-strict) no integer array indexing fewer than all axes of an array.
STRICT_REFUSES = {"slice int array", "int array rows", "int array 2d", "int array empty",
                  "slice one-element list", "one-element list slice",
                  "Ellipsis one-element list"}  # fmt: skip
REFUSED = {
    "torch": {"negative step", "reversed step"},
    "strict": STRICT_REFUSES,
    "strict-device1": STRICT_REFUSES,
    "dask": {"int array 2d"},
}
# Dask leaves the shape of a boolean-mask index unknown (nan) until it is computed
DASK_UNKNOWN_SHAPE = {"bool mask 1d", "bool mask rows", "bool mask full", "bool mask none"}


@pytest.mark.parametrize("layout", [CONTIGUOUS, TRANSPOSED])
@pytest.mark.parametrize("name", KEYS)
def test_getitem(backend, name, layout):
    make_key, shape = KEYS[name]
    if layout == TRANSPOSED and len(shape) < 2:
        pytest.skip("a transpose of fewer than two axes is the array itself")
    key = make_key(backend)
    values = uniform(shape, (-2.0, 2.0), seed=72)
    x = on_backend(backend, values, layout)
    if backend.name == "dask" and name in DASK_UNKNOWN_SHAPE:
        pytest.skip("Dask leaves the shape of a boolean-mask index unknown (nan) until computed")
    if name in REFUSED.get(backend.name, ()):
        with pytest.raises((IndexError, ValueError, TypeError, AssertionError)):
            x[key]
        pytest.skip(f"{backend.name} refuses this key on its own arrays")
    y = tg.param(x)[key]
    expected = values[_numpy_key(backend, key)]
    np.testing.assert_array_equal(numpy_of(backend, y), expected)
    check(backend, lambda x: getitem(x, key), x)  # also on plain x, for finite differences
    # where the gradient lands: NumPy's add.at of the weights, an independent reference
    w = uniform(expected.shape, (0.5, 1.5), seed=73)
    (g,) = tg.gradient(lambda x: tg.sum(getitem(x, key) * on_backend(backend, w)), x)
    reference = np.zeros(shape)
    np.add.at(reference, _numpy_key(backend, key), w)
    np.testing.assert_allclose(numpy_of(backend, g), reference, rtol=1e-15)


def _numpy_key(backend, key):
    if isinstance(key, tuple):
        return tuple(_numpy_key(backend, k) for k in key)
    if isinstance(key, list):
        return np.array(key)
    if isinstance(key, (int, slice)) or key is None or key is Ellipsis:
        return key
    return backend.to_numpy(key)


def test_getitem_with_numpy_index_on_any_backend(backend):
    """A NumPy index (or list) is moved to the data's library and device."""
    x = on_backend(backend, [1.0, 2.0, 3.0])
    for key in (np.array([0, 2, 2]), [0, 2, 2]):
        (g,) = tg.gradient(lambda x, key=key: tg.sum(x[key]), x)
        check_like(backend, g, x)
        np.testing.assert_array_equal(numpy_of(backend, g), [1.0, 0.0, 2.0])


def test_getitem_repeated_second_derivative(backend):
    """The adjoint of indexing (a scatter-add) is itself differentiable."""
    key = int_index(backend, [0, 2, 2])
    x = on_backend(backend, uniform((3,), (0.5, 1.5), seed=74))
    check_nested(backend, lambda x: x[key] * x[key] * x[key], x)
    mask = backend.asarray(np.array([True, False, True]))
    check_nested(backend, lambda x: x[mask] * x[mask] * x[None, 1:], x)


def test_getitem_float32(backend):
    x = on_backend(backend, uniform((3, 2), (-1.0, 1.0), seed=75), dtype=np.float32)
    pair = (int_index(backend, [0, 0, 2]), int_index(backend, [1, 0, 1]))
    for key in (1, slice(None, None, 2), pair, backend.asarray(np.eye(3, 2) > 0)):
        (g,) = tg.gradient(lambda x, key=key: tg.sum(x[key]), x)
        check_like(backend, g, x)


@pytest.mark.parametrize("iterate", [False, True], ids=["x[i]", "iter"])
def test_rows_of_a_matrix(backend, iterate):
    """x[i] of a matrix, and iteration, which yields x[i] (on any backend)."""
    values = uniform((3, 2), (-1.0, 1.0), seed=76)
    x = tg.param(on_backend(backend, values))
    rows = list(x) if iterate else [x[i] for i in range(3)]
    np.testing.assert_array_equal(numpy_of(backend, tg.stack(rows)), values)
    tg.back(tg.sum(tg.stack([row * (i + 1.0) for i, row in enumerate(rows)])))
    check_like(backend, tg.grad(x), tg.data(x))
    np.testing.assert_array_equal(numpy_of(backend, tg.grad(x)), [[1, 1], [2, 2], [3, 3]])


def test_to_device_gradient_comes_back(backend):
    """Moving to another device and back: the gradient lands on the input's device."""
    xp = backend.xp
    devices = [backend.device]
    if backend.name.startswith("strict"):  # its default (CPU) device and a stand-in for a GPU
        devices = [xp.__array_namespace_info__().default_device(), xp.Device("device1")]
    x = on_backend(backend, uniform((2, 3), (-1.0, 1.0), seed=78))
    for device in devices:
        w = xp.asarray(on_backend(backend, np.arange(6.0).reshape(2, 3)), device=device, copy=True)
        (g,) = tg.gradient(lambda x, w=w, d=device: tg.sum(tg.to_device(x, d) * w), x)
        check_like(backend, g, x)
        np.testing.assert_array_equal(numpy_of(backend, g), np.arange(6.0).reshape(2, 3))


def test_astype_to_another_device_sends_the_gradient_back(backend):
    """`astype(x, dtype, device=d)` of the namespace as `array_namespace` gives it: the
    gradient lands on x's device (it stayed on d, and a second path to x then failed)."""
    xp = backend.xp
    devices = [backend.device]
    if backend.name.startswith("strict"):
        devices = [xp.__array_namespace_info__().default_device(), xp.Device("device1")]
    x = on_backend(backend, uniform((2, 3), (-1.0, 1.0), seed=79))
    txp = tg.param(x).__array_namespace__()
    for device in devices:
        (g,) = tg.gradient(lambda x, d=device: tg.sum(txp.to_device(
            txp.astype(x, x.dtype, device=d) * 3.0, x.device)) + tg.sum(x), x)  # fmt: skip
        check_like(backend, g, x)
        np.testing.assert_array_equal(numpy_of(backend, g), np.full((2, 3), 4.0))


# --- second derivatives through the shape rules' vjps
NESTED = {
    "reshape": lambda x: tg.reshape(x * x, (3, 2)),
    "permute_dims": lambda x: tg.permute_dims(x * x, (1, 0)),
    "expand_dims": lambda x: tg.expand_dims(x * x, axis=1),
    "squeeze": lambda x: tg.squeeze(tg.expand_dims(x, axis=0) * x, axis=0),
    "flip": lambda x: tg.flip(x * x, axis=1),
    "broadcast_to": lambda x: tg.broadcast_to(x[:1, :] * x[:1, :], (4, 3)),
    "concat": lambda x: tg.concat([x * x, x], axis=1),
    "concat-None": lambda x: tg.concat([x * x, x], axis=None),
    "stack": lambda x: tg.stack([x * x, x], axis=-1),
    "getitem": lambda x: x[1:, 1:] * x[:1, :2] * x[0, :2],
    "getitem-None": lambda x: x[None, :, 1] * x[:, None, 0],
}


@pytest.mark.parametrize("name", NESTED)
def test_second_derivative(backend, name):
    check_nested(backend, NESTED[name], on_backend(backend, uniform((2, 3), (-1.0, 1.0), seed=77)))


@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128", ">f8", "int64"])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 4), (3, 4)])
def test_a_scalar_broadcast_is_numpys_view(dtype, shape):
    """A 0-d array broadcast (the gradient of a sum spread over its input) is made directly on
    NumPy: the same values, shape, dtype and read-only view as `np.broadcast_to`'s, over the
    whole domain of a value."""
    for value in (0.0, -0.0, 1.5, -np.inf, np.nan, 5e-324, 1e308):
        with np.errstate(over="ignore"):
            x = np.array(value).astype(dtype) if dtype != "int64" else np.array(7, dtype=dtype)
        ours, numpys = tg.broadcast_to(x, shape), np.broadcast_to(x, shape)
        assert ours.shape == numpys.shape and ours.dtype == numpys.dtype
        assert not ours.flags.writeable
        assert ours.tobytes() == numpys.tobytes()


def test_a_gradient_summed_to_a_scalar_is_a_0d_array():
    """A 0-d argument's gradient, summed from a broadcast, is a 0-d array as the argument is
    (NumPy's sum over every axis gives a NumPy scalar), first-order and nested."""
    g = tg.gradient(lambda x, v: tg.sum(x * v), np.ones(4), np.array(3.0))[1]
    assert type(g) is np.ndarray and g.shape == () and float(g) == 4.0
    h = tg.hvp(lambda v: tg.sum(tg.sin(np.arange(4.0) * v)), np.array(0.0), np.array(1.0))
    assert type(h) is np.ndarray and h.shape == () and float(h) == 0.0
