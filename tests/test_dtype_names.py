"""`backend.dtype_name` answers from a table (NumPy's `dtype.name` is Python, and the rules ask
it at every operation): every dtype the libraries have, byte-swapped and structured ones, the
type objects and strings that stand for them, each gives the name its library gives, read again
and again, also once the table has been cleared for the dtypes made at run time."""

import importlib

import numpy as np
import pytest

from tracker_gpu import backend

pytestmark = pytest.mark.numpy_row

NUMPY = sorted({np.dtype(t) for t in np.sctypeDict.values()}, key=str)
STANDS_FOR = [float, int, bool, complex, "float32", "f8", "<i2", np.float16, np.uint64]


def _numpy_cases():
    swapped = [d.newbyteorder() for d in NUMPY if d.byteorder not in "|="]
    return [(d, np.dtype(d).name) for d in NUMPY + swapped + STANDS_FOR]


def _library_cases():
    cases = []
    torch = pytest.importorskip("torch")
    for d in (torch.float16, torch.float32, torch.float64, torch.int8, torch.int64, torch.bool):
        cases.append((d, torch.empty(0, dtype=d).numpy().dtype.name))  # its NumPy twin's name
    cases.append((torch.bfloat16, "bfloat16"))
    ml_dtypes = importlib.import_module("ml_dtypes")
    cases.append((np.dtype(ml_dtypes.bfloat16), "bfloat16"))
    strict = pytest.importorskip("array_api_strict")
    for name in ("float32", "float64", "int32", "uint8", "bool", "complex128"):
        cases.append((getattr(strict, name), name))
    return cases


@pytest.mark.filterwarnings("error")  # array-api-strict warns where its dtypes meet NumPy's
def test_every_dtype_is_named_as_its_library_names_it():
    for dtype, expected in _numpy_cases() + _library_cases():
        for _ in range(3):  # the first answer computed, the others looked up
            assert backend.dtype_name(dtype) == expected, (dtype, expected)


def test_dtypes_made_at_run_time_do_not_grow_the_table_and_keep_their_names():
    made = [np.dtype([("a", np.float32), (f"f{k}", np.int8)]) for k in range(600)]
    for dtype in made:
        assert backend.dtype_name(dtype) == np.dtype(dtype).name
    assert len(backend._NAMES) <= 256
    for dtype, expected in _numpy_cases():  # the common ones still answer after a clearing
        assert backend.dtype_name(dtype) == expected


def test_what_is_not_a_dtype_has_no_name():
    for thing in (object(), [1, 2], "not a dtype"):
        assert backend.dtype_name(thing) is None
