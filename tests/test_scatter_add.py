"""`backend.scatter_add` on NumPy: a key of integer arrays on the leading axes (an embedding's
gradient, `take`'s) takes `_add_at_flat`, which must equal `np.add.at` bit for bit (each
element's sum in the same order) over the whole domain, every real dtype, repeated and
negative indices, broadcast index arrays, keys of any shape and chunks; anything else is
`np.add.at`'s own, its errors included."""

import array_api_compat.numpy
import numpy as np
import pytest
from domain import domain

from tracker_gpu import backend

DTYPES = [np.float16, np.float32, np.float64]
ROWS = 11


def _keys(rng, name):
    """Integer keys of several kinds, on an array of shape (ROWS, 5, 7)."""
    return {
        "rows": rng.integers(-ROWS, ROWS, 50),
        "rows 2-d": (rng.integers(-ROWS, ROWS, (6, 9)),),
        "rows and columns, broadcast": (rng.integers(-ROWS, ROWS, (40, 1)), np.arange(5)[None]),
        "every axis": (rng.integers(0, ROWS, 30).astype(np.uint32),
                       rng.integers(-5, 5, 30), rng.integers(0, 7, (2, 30))),
    }[name]  # fmt: skip


def _values_shape(key, z_shape):
    keys = key if type(key) is tuple else (key,)
    return np.broadcast_shapes(*(k.shape for k in keys)) + z_shape[len(keys) :]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["rows", "rows 2-d", "rows and columns, broadcast", "every axis"])
def test_flat_add_at_is_add_at_bit_for_bit(dtype, name, monkeypatch):
    key = _keys(np.random.default_rng(len(name)), name)
    shape = (ROWS, 5, 7)
    values = domain(_values_shape(key, shape), dtype, seed=3)
    start = domain(shape, dtype, seed=5)
    with np.errstate(all="ignore"):
        expected = start.copy()
        np.add.at(expected, key, values)
        for at_once in (1 << 20, 7):  # one pass, and chunks
            monkeypatch.setattr(backend, "INDICES_AT_ONCE", at_once)
            got = start.copy()
            assert backend._add_at_flat(got, key, values)
            assert got.tobytes() == expected.tobytes(), "not add.at's bits"  # nan's too
            again = backend.scatter_add(np, start.copy(), key, values)
            assert again.tobytes() == expected.tobytes()


def test_other_keys_are_add_ats_own():
    z = np.zeros((5, 3))
    values = np.ones((4, 3))
    for key in (np.array([True, False, True, False, True]), slice(0, 4), np.array([0.0, 1.0]),
                (slice(None), np.array([0, 1]))):  # fmt: skip
        assert not backend._add_at_flat(z.copy(), key, values)
    assert not backend._add_at_flat(np.zeros((5, 3))[:, ::2], np.array([0, 1]), np.ones((2, 2)))
    assert not backend._add_at_flat(z.astype(np.float32), np.array([0, 1]), np.ones((2, 3)))
    assert not backend._add_at_flat(z, np.array([0, 1]), np.ones((1, 3)))  # values broadcast
    complex_z = z.astype(np.complex128)
    assert not backend._add_at_flat(complex_z, np.array([0, 1]), np.ones((2, 3), complex))
    for key in (np.array([0, 5]), np.array([-6, 0]), (np.array([0]), np.array([3]))):
        with pytest.raises(IndexError):
            backend.scatter_add(np, z.copy(), key, np.ones(_values_shape(key, z.shape)))


CUPY_SCATTER_DTYPES = ("int32", "int64", "float16", "float32", "float64", "uint32", "uint64")


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "uint8", "uint16"])
def test_a_scatter_add_that_refuses_narrow_dtypes_adds_in_a_wider_one(monkeypatch, dtype):
    """CuPy's scatter-add refuses bool and the narrow integers (imitated on NumPy): the sums
    made in a wider type equal `np.add.at`'s, a bool one a logical or and the integers wrapped
    (200 added 9 times to one int8 element overflows)."""
    import sys
    import types

    def cupy_like(z, key, values):
        if z.dtype.name not in CUPY_SCATTER_DTYPES:
            raise TypeError(f"add.at of {z.dtype}")
        np.add.at(z, key, values)

    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(scatter_add=cupy_like))
    monkeypatch.setattr(backend, "is_cupy", lambda x: isinstance(x, np.ndarray))
    rng = np.random.default_rng(3)
    key = np.array([0, 2, 0, 0, 5, 2, 0, 0, 0, 0, 0, 0])
    big = np.iinfo(dtype).max if dtype != "bool" else True
    values = np.concatenate([np.full(9, big), rng.integers(0, 2, 3)]).astype(dtype)
    start = (rng.integers(0, 2, 7) * (dtype != "bool" and 3)).astype(dtype)
    expected = start.copy()
    np.add.at(expected, key, values)
    got = backend.scatter_add(array_api_compat.numpy, start.copy(), key, values)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
