"""Checks that read a value back from the device: whether they run.

Two checks of the training loop read data on the host: that the loss `back` starts from is
finite, and that class labels lie in range. On a CPU that costs nothing; on a GPU each one stops
the stream until the device has caught up, every step. So by default (`"auto"`) they run for
data in host memory and are skipped for data on an accelerator (CuPy arrays, PyTorch CUDA
tensors) and for lazy data (dask arrays, whose values reading back would compute the whole
graph before the backward pass is even built), where a bad value shows up lazily instead: a
non-finite loss propagates into the gradients, and out-of-range labels make the loss nan.
`sync_checks()` (or the environment variable TRACKER_GPU_SYNC_CHECKS=always) turns them on
everywhere, with their clear errors, for debugging; `sync_checks(False)` (or `never`) turns
them off everywhere.

>>> import numpy as np, tracker_gpu as tg
>>> with tg.sync_checks(False):
...     tg.gradient(lambda x: tg.sum(tg.log(x)), np.array([0.0, 1.0]))[0]
array([inf,  1.])
"""

import contextlib
import os
import threading

from .backend import is_lazy, on_accelerator

__all__ = ["sync_checks", "checking"]

_MODES = ("auto", "always", "never")
_DEFAULT = os.environ.get("TRACKER_GPU_SYNC_CHECKS", "auto")
if _DEFAULT not in _MODES:
    raise ValueError(f"TRACKER_GPU_SYNC_CHECKS={_DEFAULT!r}: choose one of {', '.join(_MODES)}")
_local = threading.local()  # a thread's own `sync_checks` block, as `notrack` is its own


def checking(x):
    """Whether a check that reads `x` back to the host runs now."""
    mode = getattr(_local, "mode", _DEFAULT)
    return mode == "always" or (mode == "auto" and not on_accelerator(x) and not is_lazy(x))


@contextlib.contextmanager
def sync_checks(enabled=True):
    """Within the block, run the checks that synchronise with the device everywhere (`True`)
    or nowhere (`False`), in this thread (other threads keep their own)."""
    previous = getattr(_local, "mode", _DEFAULT)
    _local.mode = "always" if enabled else "never"
    try:
        yield
    finally:
        _local.mode = previous
