"""Kernel launches of a step, counted without a GPU: what a CuPy run of it would launch,
counted on its host build (`cuda.on_host()`, NumPy arrays standing for CuPy's).

A launch is either one of the fused path's kernels (the generated regions of `tg.compile`'s
CUDA target, the fused pullbacks and optimiser steps: each noted by `cuda/launch.py`), or a
library call that computes an array, as CuPy launches a kernel (or cuBLAS a GEMM) for each array
it computes: counted as the NumPy arrays the step allocates (a data allocation of NumPy's, seen
through NumPy's memory handler), less the buffers the fused path makes without computing
(`("buffer", ...)` and `("meta", ...)` events). Arrays of 8 bytes or less are not counted:
NumPy makes a 0-d array of every Python number an operation reads, which CuPy passes to its
kernel as an argument, so a 0-d result (a loss) is not counted either. Nor does this see a
library call that writes into an existing array (`out=`, `x[...] = y`: a launch on a GPU,
nothing allocated here), or NumPy reusing a temporary (`a + b + c` on large arrays): the
library counts are a floor. The copies into and out of a CUDA graph are not part of a step's
count (`graphs.py` makes one per argument and per result).

>>> import numpy as np, tracker_gpu as tg
>>> from tracker_gpu.compiler import launches
>>> x = np.ones(4)
>>> with tg.cuda.on_host():
...     found = launches.count(lambda: tg.gradient(lambda x: tg.sum(tg.tanh(x) * 2.0), x))
>>> found.names, found.library  # tanh's forward, then x * 2.0 (x's gradient: fused, in place)
(('mul_bwd_acc', 'tanh_bwd_acc'), 2)
"""

import ctypes
import sysconfig
from dataclasses import dataclass

import numpy as np

from ..cuda import dispatch, host

__all__ = ["Count", "count", "available"]


@dataclass(frozen=True)
class Count:
    """`kernels`: the fused path's launches by name; `library`: arrays computed by library
    calls. `total` is their sum."""

    kernels: int
    library: int
    names: tuple

    @property
    def total(self):
        return self.kernels + self.library


def count(function, *args):
    """The launches `function(*args)` makes (see the module's docstring): a `Count`. Call it
    inside `cuda.on_host()` on NumPy arrays."""
    counter = _counter()
    with dispatch.recording() as log:
        before = counter.tg_allocations()
        previous = counter.tg_install()
        try:
            function(*args)
        finally:
            counter.tg_restore(previous)
        made = counter.tg_allocations() - before
    names = tuple(name for kind, name in log if kind == "launch")
    quiet = sum(1 for kind, size in log if kind in ("buffer", "meta") and size > 8)
    return Count(len(names), made - quiet, names)


def available():
    """Whether allocations can be counted: a C++ compiler and the headers of Python and NumPy."""
    try:
        _counter()
    except (OSError, RuntimeError):
        return False
    return True


_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>
#include <cstdlib>

static long long allocations = 0;  // of more than one number (see SCALAR_BYTES)
static void* counted_malloc(void*, size_t size) {
    allocations += size > 8;
    return std::malloc(size ? size : 1);
}
static void* counted_calloc(void*, size_t n, size_t size) {
    allocations += n * size > 8;
    return std::calloc(n ? n : 1, size ? size : 1);
}
static void* counted_realloc(void*, void* p, size_t size) {
    return std::realloc(p, size ? size : 1);
}
static void counted_free(void*, void* p, size_t) { std::free(p); }
static PyDataMem_Handler handler = {
    "tracker_gpu_counting", 1,
    {nullptr, counted_malloc, counted_calloc, counted_realloc, counted_free}};

extern "C" long long tg_allocations(void) { return allocations; }

extern "C" PyObject* tg_install(void) {
    if (PyArray_API == nullptr && _import_array() < 0) return nullptr;
    PyObject* capsule = PyCapsule_New(&handler, "mem_handler", nullptr);
    if (capsule == nullptr) return nullptr;
    PyObject* previous = PyDataMem_SetHandler(capsule);
    Py_DECREF(capsule);
    return previous;
}

extern "C" PyObject* tg_restore(PyObject* previous) {
    return PyDataMem_SetHandler(previous);
}
"""
_loaded = []


def _counter():
    """The counting memory handler's library (built once; kept loaded: the arrays it allocated
    free their memory through it)."""
    if _loaded:
        return _loaded[0]
    if not host.available():
        raise RuntimeError("no C++ compiler")
    include = ["-I" + sysconfig.get_paths()["include"], "-I" + np.get_include()]
    built = host.compile_shared(_SOURCE, "allocations", tuple(include))
    library = ctypes.PyDLL(built._name)
    library.tg_allocations.restype = ctypes.c_longlong
    library.tg_install.restype = ctypes.py_object
    library.tg_restore.restype = ctypes.py_object
    library.tg_restore.argtypes = [ctypes.py_object]
    _loaded.append(library)
    return library
