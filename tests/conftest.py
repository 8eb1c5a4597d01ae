"""The backend matrix: tests that take the `backend` fixture run on the array library chosen by
``--backend`` (default: the TRACKER_GPU_BACKEND environment variable, else numpy)."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# SciPy reads its Array API switch once, when first imported: on for the whole run, so that the
# client tests (SciPy, and scikit-learn's dispatch, which needs it) find it whatever ran first.
os.environ.setdefault("SCIPY_ARRAY_API", "1")

import numpy as np
import pytest

NO_GPU = "cupy backend selected but no CUDA GPU is available"


@dataclass(frozen=True)
class Backend:
    """One array library on one device, with conversions from and to NumPy."""

    name: str
    xp: Any
    device: Any
    host: Callable[[Any], Any] = field(repr=False)

    def asarray(self, obj, dtype=None):
        """`obj` (NumPy array, list or scalar) as an array of this backend on its device."""
        a = np.array(obj, dtype=dtype)
        return self.xp.asarray(a, dtype=getattr(self.xp, a.dtype.name), device=self.device)

    def to_numpy(self, arr) -> np.ndarray:
        """`arr` (a plain array or a tracked constant, never an array on the tape) in NumPy."""
        import tracker_gpu as tg

        if isinstance(arr, tg.TrackedArray) and not tg.istracked(arr):
            arr = arr.data
        return np.asarray(self.host(arr))


def _import(module: str, pip: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(f"cannot import {module} ({exc}); install it with: {pip}")


def _numpy(name="numpy") -> Backend:
    return Backend(name, np, "cpu", np.asarray)


def _strict(name: str) -> Backend:
    xs = _import("array_api_strict", 'pip install "tracker-gpu[test]"')
    cpu = xs.__array_namespace_info__().default_device()
    device = xs.Device("device1") if name == "strict-device1" else cpu
    return Backend(name, xs, device, lambda a: np.asarray(a.to_device(cpu)))


def _torch() -> Backend:
    xp = _import("array_api_compat.torch", 'pip install "tracker-gpu[torch]"')
    cpu = importlib.import_module("torch").device("cpu")
    return Backend("torch", xp, cpu, lambda a: a.detach().cpu().numpy())


def _cupy() -> Backend:
    cp = _import("cupy", 'pip install "tracker-gpu[cuda12]" (or "tracker-gpu[cuda13]")')
    if not cp.is_available():
        pytest.skip(NO_GPU)
    xp = importlib.import_module("array_api_compat.cupy")
    return Backend("cupy", xp, cp.cuda.Device(), lambda a: a.get())


def _dask() -> Backend:
    xp = _import("array_api_compat.dask.array", 'pip install "tracker-gpu[dask]"')
    # The tests' arrays are tiny and computed thousands of times (every finite difference):
    # Dask's thread pool only adds its start-up to each computation.
    importlib.import_module("dask").config.set(scheduler="synchronous")
    return Backend("dask", xp, "cpu", lambda a: a.compute())


BACKENDS: dict[str, Callable[[], Backend]] = {
    "numpy": _numpy,
    # NumPy through the fused path: the host build of the CUDA kernels stands in for a GPU
    "numpy-fused": lambda: _numpy("numpy-fused"),
    "strict": lambda: _strict("strict"),
    "strict-device1": lambda: _strict("strict-device1"),
    "torch": _torch,
    "cupy": _cupy,
    "dask": _dask,
}


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        choices=list(BACKENDS),
        default=os.environ.get("TRACKER_GPU_BACKEND") or "numpy",
        help="array library the `backend` fixture runs on "
        "(default: $TRACKER_GPU_BACKEND, else numpy)",
    )
    parser.addoption(
        "--shard",
        default=None,
        metavar="K/N",
        help="run the K-th of N interleaved shares of the row's tests (ci/matrix splits a long "
        "row so that rows side by side end together)",
    )


def pytest_configure(config):
    if config.getoption("backend") not in BACKENDS:
        raise pytest.UsageError(
            f"unknown backend {config.getoption('backend')!r} (from TRACKER_GPU_BACKEND); "
            f"choose one of {', '.join(BACKENDS)}"
        )
    _share(config)
    if config.getoption("backend") == "numpy-fused":
        # read when tracker_gpu is imported (by the test modules, after this hook)
        os.environ["TRACKER_GPU_FUSED_ON_HOST"] = "1"
    _one_thread_each()


def _one_thread_each():
    """One BLAS and one PyTorch thread: on small shared machines, threaded BLAS (once SciPy is
    imported) and PyTorch's thread pool made some tests tens of times slower."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read by PyTorch when it is imported
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    _LIMITS.append(threadpool_limits(limits=1))


_LIMITS = []


# Rows that run every test. The other rows run only the tests that take the `backend` fixture
# (and the modules that choose their row themselves): a test that makes its own NumPy arrays
# would run the same way there, a second time.
EVERY_TEST = ("numpy", "numpy-fused")
CHOOSE_THEIR_ROW = ("test_dask", "test_distributed")
# Modules that run in the numpy row alone: how transforms compose does not depend on the fused
# path (a nested pass takes the generic one), and running them through it doubles their time;
# tg.compile's fusion applies to generated replays, which the fused path does not make; the
# text job's transformer through the host build (a slow stand-in for a GPU, each CUDA thread a
# fiber) took 14 minutes (and its resumes more), its kernels being checked by the layer tests
# there; the native optimiser steps are NumPy's outside `on_host()`, which that row is inside.
NUMPY_ROW_ONLY = (
    "test_compose",
    "test_compile_fusion",
    "test_compile_fusion_backward",
    "test_compile_fusion_cuda",
    "test_compile_opened",
    "test_fused_errors",
    "test_native_steps",
    "test_numpy_loops",
    "test_resume_settings",
    "test_row_loops",
    "test_train_text",
)


# Modules of saved files and of the job's control (signals, resumes, what a recording costs):
# their tests that make their own NumPy arrays run in the numpy row alone, the fused path
# changing nothing they check (the jobs' training through it is test_train's); their tests that
# take the `backend` fixture run in every row.
FILES_AND_JOBS = (
    "test_bad_files",
    "test_compile_scaling",
    "test_durability",
    "test_saved",
    "test_train_resume",
    "test_train_signals",
)


# Modules that test the host build of the CUDA kernels directly (against SciPy, mpmath, the
# generic rules, NVRTC): they run the same in both rows that run every test, so once, in the
# row named for that build.
HOST_BUILD_ROW_ONLY = (
    "test_kernels",
    "test_half_kernels",
    "test_special_fused",
    "test_compare_rules",
)


def pytest_collection_modifyitems(config, items):
    row = config.getoption("backend")
    kept, dropped = [], []
    for item in items:
        takes_backend = "backend" in getattr(item, "fixturenames", ())
        name = _module_name(item)
        if name in NUMPY_ROW_ONLY or item.get_closest_marker("numpy_row"):
            keep = row == "numpy"
        elif name in FILES_AND_JOBS and not takes_backend:
            keep = row == "numpy"
        elif name in HOST_BUILD_ROW_ONLY:
            keep = row == "numpy-fused"
        else:
            keep = row in EVERY_TEST or takes_backend or name in CHOOSE_THEIR_ROW
        (kept if keep else dropped).append(item)
    share = _share(config)
    if share is not None:
        units = _units(kept)
        k, n = share
        dropped += [item for i, unit in enumerate(units) if i % n != k - 1 for item in unit]
        kept = [item for unit in units[k - 1 :: n] for item in unit]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# Modules whose last tests read what the earlier ones made (the fuzzer's statistics, the sources
# its programs generated): a share of a row takes them whole.
WHOLE_IN_A_SHARE = ("test_compile_fusion", "test_compile_fusion_cuda")


def _units(items):
    """The items as the units a share takes: one test, or a whole module of WHOLE_IN_A_SHARE."""
    units, whole = [], {}
    for item in items:
        name = _module_name(item)
        if name not in WHOLE_IN_A_SHARE:
            units.append([item])
        elif name in whole:
            whole[name].append(item)
        else:
            whole[name] = [item]
            units.append(whole[name])
    return units


def _module_name(item):
    """The test module's own name (`test_tape`), or "" for an item of no module."""
    module = getattr(item, "module", None)
    return module.__name__.rpartition(".")[2] if module is not None else ""


def _share(config):
    """`(k, n)` from `--shard K/N`, or None; a usage error names a bad one."""
    text = config.getoption("shard")
    if text is None:
        return None
    k, slash, n = text.partition("/")
    if not (slash and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise pytest.UsageError(f"--shard takes K/N with 1 <= K <= N (2/3, say), got {text!r}")
    return int(k), int(n)


def pytest_report_header(config):
    return f"tracker_gpu backend: {config.getoption('backend')}"


@pytest.fixture(scope="session")
def backend(request) -> Backend:
    return BACKENDS[request.config.getoption("backend")]()


# Dask's own refusals of parts of the Array API standard: a dask-row test that meets one (raised
# inside Dask, with exactly this message) skips, saying what Dask lacks. Any other error fails.
DASK_LACKS = (
    (AttributeError, r"module 'array_api_compat\.dask\.array(\.linalg)?' has no attribute '(\w+)'",
     lambda m: f"Dask lacks {'linalg.' if m[1] else ''}{m[2]} of the Array API standard"),
    ((ValueError, NotImplementedError),
     r"Dimension must be 2 to perform|Array must be 2D|SVD based norm not implemented for ndim",
     lambda m: "Dask's linalg takes single matrices, not the standard's stacks of matrices"),
    (ValueError, r"full_matrices=True is not supported by dask",
     lambda m: "Dask lacks svd with full_matrices=True"),
    (ValueError, r"dask arrays only support using mode='reduced'",
     lambda m: "Dask lacks qr with mode='complete'"),
    (ValueError, r"Input must have the following properties",
     lambda m: "Dask's qr and svd take only tall-and-skinny or short-and-fat matrices"),
    (TypeError, r"svd\(\) got an unexpected keyword argument 'compute_uv'",
     lambda m: "Dask's svd lacks compute_uv, which array-api-compat's matrix_rank needs"),
    (NotImplementedError, r"Only integer valued repeats supported",
     lambda m: "Dask lacks repeat with an array of repeats"),
    (NotImplementedError, r"Don't yet support nd fancy indexing",
     lambda m: "Dask lacks integer-array indexing on several axes (take_along_axis, sort)"),
    (ValueError, r"zero-size array to reduction operation (maximum|minimum) which has no identity",
     lambda m: "Dask's max and min fail on empty chunks even where the reduced axis is not empty"),
    (ValueError, r"operands could not be broadcast together with shapes \(.*nan",
     lambda m: "Dask leaves the shape of a boolean-mask index unknown (nan) until computed"),
)  # fmt: skip


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    outcome = yield
    if pyfuncitem.config.getoption("backend") != "dask" or outcome.excinfo is None:
        return
    reason = dask_lacks(outcome.excinfo[1])
    if reason is not None:
        outcome.force_exception(pytest.skip.Exception(reason, _use_item_location=True))


def dask_lacks(exc):
    """The reason to skip for one of Dask's refusals in `DASK_LACKS`, else None."""
    named = re.match(DASK_LACKS[0][1], str(exc))  # the message names Dask's namespace
    if exc.__traceback__ is None or not (named or _raised_in_dask(exc.__traceback__)):
        return None
    for kinds, pattern, reason in DASK_LACKS:
        found = isinstance(exc, kinds) and re.search(pattern, str(exc))
        if found:
            return reason(found)
    return None


def _raised_in_dask(tb):
    """True where the error came from inside Dask (or its array-api-compat wrapper)."""
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if "/dask/" in path or "/array_api_compat/" in path:
            return True
        tb = tb.tb_next
    return False
