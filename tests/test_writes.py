"""Writes into tracked arrays: `x[key] = v`, `x[key] += v`, `x *= v`.

Each program of the table writes the way library code does (every kind of key, numbers,
tracked and plain values, augmented writes, writes into a created array) and is checked on
every backend: its value against the same program on plain arrays, its gradient against finite
differences (and, second order, the gradient of its gradient), and against PyTorch's autograd
running the same program on tensors. Then the promises a write keeps: what a pullback saved is
never changed, nor a caller's array, a view or an alias; and a buffer nobody else sees is
written without a copy.
"""

import array_api_compat
import numpy as np
import pytest

import tracker_gpu as tg
from tests.helpers import check, check_nested

X = np.array([[0.5, -1.5, 2.0, 0.2], [-0.25, 3.0, -2.0, 1.0], [1.5, 0.75, -0.5, -3.0]])
V = np.array([0.3, -1.2, 2.5, 0.7])


def _ns(x):
    return array_api_compat.array_namespace(x)


def _set_int(x, v):
    y = x * 1.0
    y[1, :] = v * 2.0
    return y


def _set_element(x, v):
    y = x * 1.0
    y[-1, 2] = v[0] * 3.0
    return y


def _set_slices(x, v):
    y = x * 1.0
    y[::2, 1:] = 0.5
    y[1:3, :] = v
    return y


def _set_ellipsis(x, v):
    y = x * 1.0
    y[..., 0] = v[:3]
    return y


def _set_new_axis(x, v):
    y = x * 1.0
    y[None, 0, :] = v[None, :]
    return y


def _set_mask(x, v):
    y = x * 1.0
    y[y > 0] = 0.0
    y[x < -1] = v[0] * 2.0
    return y


def _set_row_mask(x, v):
    y = x * 1.0
    y[x[:, 0] > 0, :] = v
    return y


def _set_integer_list(x, v):
    y = x * 1.0
    y[[0, 2], :] = v
    y[[0, 1], [1, 3]] = v[:2] * v[2:]
    return y


def _add_slice(x, v):
    y = x * 1.0
    y[1:, :] += v
    return y


def _multiply_column(x, v):
    y = x * 1.0
    y[:, 0] *= x[:, 1]
    return y


def _power_mask(x, v):
    y = x * 1.0
    y[y < 0] **= 2
    return y


def _divide_subtract(x, v):
    y = x * 1.0
    y[0, :] /= 3.0
    y -= v
    y *= y
    return y


def _set_all(x, v):
    y = x * 1.0
    y[...] = v * x[0, :]
    return y


def _read_after_write(x, v):
    y = x * 1.0
    y[0, :] = y[1, :] * 2.0
    y[1, :] = y[0, :] + y[2, :]
    return y * y


def _fill_created(x, v):
    y = _ns(x).zeros((3, 4), dtype=x.dtype, device=array_api_compat.device(x))
    y[0, :] = x[0, :] * 2.0
    y[1:, :] = x[1:, :] ** 2
    y[2, 1] += v[1]
    return y


def _fill_rows(x, v):
    xp = _ns(x)
    y = xp.empty((3, 4), dtype=x.dtype, device=array_api_compat.device(x))
    for i in range(3):
        y[i, :] = xp.mean(x[i, :]) * v
    return y


# --- writes into a slice (NumPy's view) reach the array it was read from
def _through_a_row(x, v):
    y = x * 1.0
    row = y[1, :]
    row[2] = v[0] * 3.0
    return y


def _through_a_chained_index(x, v):
    y = x * 1.0
    y[0][1:3] = v[1:3] * 2.0
    return y


def _through_a_slice_of_a_slice(x, v):
    y = x * 1.0
    inner = y[1:, :][0, 1:]
    inner[1] = v[3]
    return y


def _scale_a_block(x, v):
    y = x * 1.0
    block = y[1:, :2]
    block *= v[:2]
    return y


def _rows_in_turn(x, v):
    y = x * 1.0
    rows = [y[i, :] for i in range(3)]  # each read before the others are written
    for i, row in enumerate(rows):
        row[i] = v[i] * row[i + 1]
    y[2, 0] = v[3]  # the array written, then its old slice
    rows[2][3] = y[2, 0] * 2.0
    return y


def _through_a_transpose(x, v):
    y = x * 1.0
    t = y.T  # a view, as NumPy's: the write reaches y's column
    t[1, :] = v[:3] * 2.0
    return y


def _scale_a_block_of_a_transpose(x, v):
    y = x * 1.0
    t = y.mT
    block = t[:2, 1:]  # a slice of a view
    block *= v[1]
    return y


# --- the namespace's functions that move elements make views where the library's do: a
# write reaches the array (NumPy's and PyTorch's reshape and permute_dims; not PyTorch's flip,
# a copy, nor Dask's results), as the same program on plain arrays says
def _through_a_reshape(x, v):
    y = x * 1.0
    flat = _ns(y).reshape(y, (12,))
    flat[5:8] = v[:3] * 2.0
    return y


def _through_permute_dims(x, v):
    y = x * 1.0
    t = _ns(y).permute_dims(y, (1, 0))
    t[1, :] = v[:3] ** 2
    return y


def _through_expand_dims_and_squeeze(x, v):
    y = x * 1.0
    xp = _ns(y)
    inner = xp.squeeze(xp.expand_dims(y, axis=0), axis=0)  # a view of a view
    inner[2, 1:] = v[1:] * inner[0, 1:]
    return y


def _through_a_flip(x, v):
    y = x * 1.0
    f = _ns(y).flip(y, axis=1)
    f[0, :2] = v[2:]
    return y


def _scale_through_matrix_transpose(x, v):
    y = x * 1.0
    t = _ns(y).matrix_transpose(y)
    t *= v[0]
    return y


def _a_reshape_copy_written(x, v):
    y = x * 1.0
    copied = _ns(y).reshape(y, (4, 3), copy=True)
    copied[0, 0] = v[0]
    return y * _ns(y).sum(copied)


# --- what NumPy copies, a write leaves as it was (PyTorch's element is a view: it reaches y)
def _a_running_total_from_an_element(x, v):
    y = x * 1.0
    total = y[0, 0]  # one element: NumPy's scalar, a copy
    for w in v[:3]:
        total += w
    return y * total


def _a_positive_copy_written(x, v):
    y = x * 1.0
    z = +y  # a new array, as NumPy's +y
    z += v[0]
    return y * z


PROGRAMS = {
    f.__name__[1:]: f
    for f in (
        _set_int, _set_element, _set_slices, _set_ellipsis, _set_new_axis, _set_mask,
        _set_row_mask, _set_integer_list, _add_slice, _multiply_column, _power_mask,
        _divide_subtract, _set_all, _read_after_write, _fill_created, _fill_rows,
        _through_a_row, _through_a_chained_index, _through_a_slice_of_a_slice, _scale_a_block,
        _rows_in_turn, _through_a_transpose, _scale_a_block_of_a_transpose,
        _through_a_reshape, _through_permute_dims, _through_expand_dims_and_squeeze,
        _through_a_flip, _scale_through_matrix_transpose, _a_reshape_copy_written,
        _a_running_total_from_an_element, _a_positive_copy_written,
    )
}  # fmt: skip
# Programs that write after a value was saved: PyTorch refuses to differentiate them.
SAVED_THEN_WRITTEN = {"multiply_column", "power_mask", "divide_subtract", "read_after_write",
                      "rows_in_turn", "through_expand_dims_and_squeeze"}  # fmt: skip
LIBRARY_LACKS = {
    ("strict", "set_integer_list"), ("strict-device1", "set_integer_list"),
    ("dask", "set_integer_list"), ("dask", "set_row_mask"), ("dask", "set_mask"),
    ("dask", "power_mask"), ("dask", "set_new_axis"), ("strict", "set_new_axis"),
    ("strict-device1", "set_new_axis"), ("strict", "set_row_mask"),
    ("strict-device1", "set_row_mask"), ("strict", "through_a_chained_index"),
    ("strict-device1", "through_a_chained_index"), ("dask", "scale_a_block_of_a_transpose"),
}  # fmt: skip


def _skip_what_the_library_lacks(backend, name):
    if (backend.name, name) in LIBRARY_LACKS:
        pytest.skip(f"{backend.name} arrays do not take this key in an assignment (or have no mT)")


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_write_has_the_plain_value_and_the_finite_difference_gradient(backend, name):
    _skip_what_the_library_lacks(backend, name)
    program = PROGRAMS[name]
    x, v = backend.asarray(X), backend.asarray(V)
    tracked = program(tg.param(x), tg.param(v))
    assert tg.istracked(tracked)
    np.testing.assert_array_equal(
        backend.to_numpy(tg.data(tracked)), backend.to_numpy(program(x, v))
    )
    check(backend, program, x, v, zero=True)  # a program that ignores v gives it None


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_write_is_differentiable_twice(backend, name):
    _skip_what_the_library_lacks(backend, name)
    check_nested(backend, PROGRAMS[name], backend.asarray(X), backend.asarray(V))


# What NumPy copies and PyTorch views (an element, +y), and the reverse (PyTorch's flip is a
# copy): each library's own answer above.
NUMPY_COPIES = {"a_running_total_from_an_element", "a_positive_copy_written"}
TORCH_COPIES = {"through_a_flip"}


@pytest.mark.parametrize(
    "name", sorted(set(PROGRAMS) - SAVED_THEN_WRITTEN - NUMPY_COPIES - TORCH_COPIES)
)
def test_a_write_differentiates_as_in_pytorch(name):
    torch = pytest.importorskip("torch")
    program = PROGRAMS[name]
    weights = np.random.default_rng(3).uniform(0.5, 1.5, size=X.shape)
    x, v = torch.tensor(X, requires_grad=True), torch.tensor(V, requires_grad=True)
    torch.sum(program(x, v) * torch.tensor(weights)).backward()
    ours = tg.gradient(lambda x, v: tg.sum(program(x, v) * weights), X, V)
    np.testing.assert_allclose(ours[0], x.grad.numpy(), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(ours[1], v.grad.numpy(), rtol=1e-13, atol=1e-13)


def test_a_saved_value_survives_a_later_write(backend):
    def f(a):
        z = a * 2.0  # a fresh buffer, seen by z alone...
        y = z * z  # ...until the pullback of * saves it
        z[0] = 100.0  # must not change what the pullback reads
        return tg.sum(y) + tg.sum(z)

    (g,) = tg.gradient(f, backend.asarray([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(backend.to_numpy(g), [8.0, 18.0, 26.0])


def test_views_and_aliases_of_a_written_array(backend):
    def f(a):
        z = a * 2.0
        row = z[0:2]  # a view on NumPy: the write must not show through it
        alias = z  # the same tracked array: it sees the write, as with NumPy
        z[0] = 7.0
        assert backend.to_numpy(tg.data(alias))[0] == 7.0
        return tg.sum(row * 3.0) + tg.sum(alias * alias)

    a = [1.0, 2.0, 3.0]
    (g,) = tg.gradient(f, backend.asarray(a))
    np.testing.assert_allclose(backend.to_numpy(g), [6.0, 6.0 + 16.0, 24.0])


def test_the_callers_arrays_are_never_written(backend):
    x, w = backend.asarray([1.0, -2.0, 3.0]), backend.asarray([4.0, 5.0, 6.0])

    def f(x, w):
        x[0] = 10.0
        x[1:] *= 3.0
        x += w
        w[1:] = 0.0
        return tg.sum(x * x) + tg.sum(w)

    (gx, gw) = tg.gradient(f, x, w)
    np.testing.assert_array_equal(backend.to_numpy(x), [1.0, -2.0, 3.0])
    np.testing.assert_array_equal(backend.to_numpy(w), [4.0, 5.0, 6.0])
    np.testing.assert_allclose(backend.to_numpy(gx), [0.0, 2 * -1.0 * 3.0, 2 * 15.0 * 3.0])
    np.testing.assert_allclose(backend.to_numpy(gw), [2 * 14.0 + 1.0, 2 * -1.0, 2 * 15.0])


def test_a_parameter_written_outside_gradient_is_a_new_value(backend):
    x = tg.param(backend.asarray([1.0, 2.0]))
    x[1] = x[0] * 5.0
    assert not tg.isleaf(x)
    with pytest.raises(ValueError, match="a write x\\[key\\] = v or x \\+= v makes x a new value"):
        tg.grad(x)
    tg.back(tg.sum(x))


@pytest.mark.skipif(
    not hasattr(np.ndarray, "ctypes"), reason="the buffer's address is NumPy's ctypes.data"
)
def test_a_buffer_nobody_else_sees_is_written_in_place():
    x = tg.param(np.arange(6.0))
    y = x + 1.0  # add saves nothing: y's buffer is y's alone
    before = id(tg.data(y))  # the buffer object itself (an address may be reused)
    y[2:4] = x[0:2] * 3.0
    assert id(tg.data(y)) == before
    y[y > 5] += 1.0
    assert id(tg.data(y)) == before
    z = y * y  # now the pullback of * holds y's buffer: [1, 2, 0, 3, 5, 7]
    y[0] = 0.0
    assert id(tg.data(y)) != before  # copied: the saved value is intact
    tg.back(tg.sum(z))  # d(sum y*y)/dx, by hand: y0, y1, y4, y5 are x + 1, y2 and y3 are 3 x0, 3 x1
    np.testing.assert_array_equal(tg.grad(x), [2.0, 4.0 + 18.0, 0.0, 0.0, 10.0, 14.0])
    (g,) = tg.gradient(lambda x: _written_sum(x), np.arange(6.0))
    np.testing.assert_allclose(g, [3.0, 3.0, 0.0, 0.0, 1.0, 1.0])


def _written_sum(x):
    y = x + 1.0
    y[2:4] = x[0:2] * 3.0
    y[0:2] = 0.0
    return tg.sum(y)


def test_writes_into_integer_and_boolean_arrays(backend):
    x = tg.param(backend.asarray([0.5, 1.5, 2.5]))
    k = tg.astype(x, x.__array_namespace__().int64)
    k[0] = 7
    k += 1
    m = x > 1.0
    m[0] = True
    assert not tg.istracked(k) and not tg.istracked(m)
    assert backend.to_numpy(k).tolist() == [8, 2, 3]
    assert backend.to_numpy(m).tolist() == [True, True, True]


def test_array_api_extra_at_runs_through_writes():
    xpx = pytest.importorskip("array_api_extra")

    def f(x):
        y = xpx.at(x)[1:].multiply(x[:-1])
        return tg.sum(xpx.at(y, 0).set(5.0, copy=True) * y)

    x = np.array([1.0, 2.0, 3.0])
    (g,) = tg.gradient(f, x)
    assert np.array_equal(x, [1.0, 2.0, 3.0])
    assert tg.testing.gradcheck(f, x)
    assert g.shape == (3,)


# --- every transform of a function that writes into its argument
def _writes_into_its_argument(x):
    y = x * x
    x[0] = 0.0  # recorded: y read x before it
    return y + x


def _jacobian_by_hand(a):
    """d/dx of x * x + (x with x[0] = 0)."""
    return np.diag(2 * a + np.array([0.0, 1.0, 1.0]))


def _rows(pullback):
    return np.stack([np.asarray(tg.data(pullback(i))) for i in range(3)])


WRITING_TRANSFORMS = {
    "gradient": lambda f, a: _rows(lambda i: tg.gradient(lambda x: f(x)[i], a)[0]),
    "withgradient": lambda f, a: _rows(lambda i: tg.withgradient(lambda x: f(x)[i], a).grad[0]),
    "jacobian": lambda f, a: tg.jacobian(f, a),
    "jacfwd": lambda f, a: tg.jacfwd(f, a),
    "jvp": lambda f, a: _rows(lambda i: tg.jvp(f, (a,), (np.eye(3)[i],))[1]).T,
    "forward": lambda f, a: _rows(lambda i: tg.forward(f, a)[1](np.eye(3)[i])[0]),
    "checkpoint": lambda f, a: tg.jacobian(lambda x: tg.checkpoint(f, x), a),
    "hessian": lambda f, a: tg.hessian(lambda x: tg.sum(f(x) * a), a),
}


@pytest.mark.parametrize("given", ["array", "param"])
@pytest.mark.parametrize("transform", WRITING_TRANSFORMS)
def test_every_transform_differentiates_a_function_writing_into_its_argument(transform, given):
    """The derivative is the one by hand, and the caller's array (or parameter) is as it was
    given: jacobian once gave zeros, checkpoint the derivative after the write, and jvp wrote
    into the caller's array."""
    a = np.array([1.0, 2.0, 3.0])
    x = a.copy() if given == "array" else tg.param(a.copy())
    found = np.asarray(tg.data(WRITING_TRANSFORMS[transform](_writes_into_its_argument, x)))
    expected = _jacobian_by_hand(a) if transform != "hessian" else np.diag(2 * a)  # of a . f
    np.testing.assert_allclose(found, expected, rtol=1e-15)
    np.testing.assert_array_equal(tg.data(x), a)
    assert given == "array" or tg.isleaf(x)


# --- dtypes and shapes of written values, as NumPy's own writes
WRITE_KEYS = {
    "slice": slice(0, 2),
    "integer array": np.array([0, 1]),
    "boolean mask": np.array([True, True, False]),
}


@pytest.mark.parametrize("key", WRITE_KEYS)
@pytest.mark.parametrize("dtypes", [("int64", "float64"), ("float32", "float64")])
def test_a_write_keeps_the_arrays_dtype_as_numpy_does(key, dtypes):
    """x[key] = v and at(x)[key].set(v) cast v to x's dtype (an integer-array key once made x
    float64 and kept the fractions)."""
    into, value = dtypes
    v = np.array([2.7, -3.2], dtype=value)
    expected = np.zeros(3, dtype=into)
    expected[WRITE_KEYS[key]] = v  # NumPy's own write
    x = tg.zeros(3, dtype=getattr(tg, into))
    x[WRITE_KEYS[key]] = v
    assert x.dtype == expected.dtype and np.array_equal(tg.data(x), expected)
    y = tg.at(np.zeros(3, dtype=into))[WRITE_KEYS[key]].set(v)
    assert y.dtype == expected.dtype and np.array_equal(y, expected)


@pytest.mark.parametrize("how", ["add", "subtract", "multiply"])
def test_an_update_integers_cannot_hold_is_refused_as_numpy_refuses_it(how):
    """at(ints)[k].add(0.5) left the array as it was, and .multiply(2.5) multiplied by 2."""
    ints = np.array([1, 2, 3])
    with pytest.raises(TypeError):  # NumPy's own in-place operator refuses it
        getattr(ints[0:2], f"__i{how[:3] if how != 'subtract' else 'sub'}__")(2.5)
    with pytest.raises(TypeError, match=rf"at\(x\)\[idx\]\.{how}\(v\) gives values of dtype"):
        getattr(tg.at(ints)[0:2], how)(2.5)
    expected = ints.copy()
    getattr(expected[0:2], f"__i{how[:3] if how != 'subtract' else 'sub'}__")(2)
    np.testing.assert_array_equal(getattr(tg.at(ints)[0:2], how)(2), expected)


@pytest.mark.parametrize("key", [0, np.array([0, 2])], ids=["integer", "integer array"])
def test_a_value_with_leading_axes_of_one_is_written_and_differentiated(key):
    """NumPy takes v of shape (1, 4) for a row of shape (4,); its gradient has v's shape
    (it was refused in the backward pass, after the forward took it)."""
    v = np.arange(1.0, 5.0).reshape(1, 1, 4)

    def f(x, v):
        y = x * 1.0
        y[key] = v
        return tg.sum(y**2)

    rows = 1 if isinstance(key, int) else 2
    expected = np.ones((3, 4))
    expected[key] = v.reshape(4)
    assert float(f(np.ones((3, 4)), v)) == np.sum(expected**2)
    gx, gv = tg.gradient(f, np.ones((3, 4)), v)
    assert gv.shape == v.shape
    np.testing.assert_array_equal(gv, rows * 2 * v)  # each written row's d(y**2) = 2 v
    kept = np.ones((3, 4), dtype=bool)
    kept[key] = False
    np.testing.assert_array_equal(gx, 2.0 * kept)  # d(x**2) where x was not written over


def _masked_set(x):
    xp = _ns(x)
    c = xp.zeros(3, dtype=xp.int64)
    c[x > 0.4] = 2.7  # truncated to 2, as NumPy's write
    y = xp.astype(x, xp.float32)
    y[x > 0.6] = xp.sum(x)  # rounded to float32
    return xp.sum(x * c) + xp.sum(xp.astype(y, x.dtype))


def _masked_updates(x):
    xp = _ns(x)
    y = xp.astype(x, xp.float32)
    y = tg.at(y)[x > 0.4].add(xp.sum(x))
    z = tg.at(xp.astype(x, xp.float32))[xp.argsort(x)].add(x * 3.0)
    return xp.sum(xp.astype(y, x.dtype)) + xp.sum(xp.astype(z, x.dtype) ** 2)


@pytest.mark.parametrize("program", [_masked_set, _masked_updates], ids=lambda f: f.__name__)
def test_a_compiled_write_at_a_traced_index_keeps_the_arrays_dtype(program):
    """A replayed write through a traced mask or index casts as the eager write does (it made
    an int64 array float64 and kept 2.7, a float32 one float64)."""
    x = np.array([0.3, 0.5, 0.9])
    eager = tg.withgradient(program, x)
    compiled = tg.compile(program)
    for _ in range(2):
        got = compiled(x)
        assert got.val == eager.val and np.array_equal(got.grad[0], eager.grad[0])


def test_a_new_axis_written_into_a_0_d_array():
    def f(x):
        y = tg.sum(x) * 1.0
        y[None] = x[0] * 3.0
        z = tg.sum(x) * 1.0
        z[None] = 2.0
        return y + z

    (g,) = tg.gradient(f, np.array([0.3, 0.5, 0.9]))
    assert np.array_equal(g, [3.0, 0.0, 0.0])


def test_a_checkpoint_block_whose_closure_is_written_after_it_ran_is_refused():
    """The backward pass runs the block again: a value it closes over, written or rebound in
    between, would give another function's gradient (PyTorch's checkpoint gives it silently)."""

    def written(x):
        y = x * 1.0
        z = tg.checkpoint(lambda a: tg.sum(tg.sin(y * a)), x[0])
        y[0] = 100.0
        return z

    def rebound(x):
        y = x * 1.0
        z = tg.checkpoint(lambda a: tg.sum(tg.sin(y * a)), x[0])
        y = y * 5.0
        return z + 0.0 * tg.sum(y)

    def untouched(x):
        y = x * 1.0
        return tg.checkpoint(lambda a: tg.sum(tg.sin(y * a)), x[0])

    x = np.array([0.3, 0.5, 0.9])
    for f in (written, rebound):
        with pytest.raises(tg.PullbackError, match="written or rebound after the block ran"):
            tg.gradient(f, x)
    (g,) = tg.gradient(untouched, x)
    np.testing.assert_allclose(g, tg.gradient(lambda x: tg.sum(tg.sin(x * x[0])), x)[0])


def test_an_in_place_operator_on_a_slice_read_before_its_array_was_written_is_refused():
    """NumPy's slice shows the array's later writes; a tracked slice, a copy, does not, so
    its new value computed from its own (`row += 1`) would undo them: refused, where a write
    of given elements (`row[0] = 7.0`) writes those elements alone, as NumPy does."""
    x, plain = tg.param(X.copy()), X.copy()
    for y in (x, plain):
        row = y[0, :]
        y[0, 1] = 5.0
        row[0] = 7.0
    np.testing.assert_array_equal(tg.data(x), plain)
    with pytest.raises(ValueError, match="Read the slice again"):
        row = x[1, :]
        x[1, 2] = 1.0
        row += 1.0


@pytest.mark.parametrize("name", ["through_a_row", "scale_a_block", "rows_in_turn"])
def test_a_compiled_write_through_a_slice_replays_as_eagerly(name):
    program = PROGRAMS[name]
    f = lambda x, v: tg.sum(program(x, v) ** 2)  # noqa: E731
    step = tg.compile(f)
    for scale in (1.0, -0.5, 2.0):  # records, then replays
        x, v = X * scale, V * scale
        got, expected = step(x, v), tg.withgradient(f, x, v)
        assert float(got.val) == float(expected.val)
        for g, e in zip(got.grad, expected.grad):
            np.testing.assert_array_equal(g, e)
    assert step.cache_info().hits == 2


_IN_PLACE_DTYPES = ["uint8", "int8", "int32", "float32", "float64"]


@pytest.mark.parametrize("value", _IN_PLACE_DTYPES)
@pytest.mark.parametrize("into", _IN_PLACE_DTYPES)
def test_an_in_place_operator_stores_or_refuses_as_numpys(into, value):
    """Each pair of dtypes against NumPy's own `x += y` (same-kind casting): a signed result
    stored into unsigned integers wrapped (-2 became 254), where NumPy refuses."""
    x, y = np.array([1, 2], dtype=into), np.array([-2, 3]).astype(value)
    tracked = tg.asarray(x.copy())
    try:
        expected = x.copy()
        expected += y
    except TypeError:
        with pytest.raises(TypeError, match="cannot store a result of dtype"):
            tracked += tg.asarray(y)
        return
    tracked += tg.asarray(y)
    assert tracked.dtype == expected.dtype
    np.testing.assert_array_equal(tg.data(tracked), expected)
