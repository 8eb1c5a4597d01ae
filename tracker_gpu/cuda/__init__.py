"""Fused CUDA kernels: the sources, how they are launched (CuPy on a GPU, or a host build of the
same source text for checking them without one), and the fused implementations, registered by
name in `dispatch`, the one place that decides whether they run.

Importing this package never imports CuPy.
"""

from . import dispatch, elementwise, layers, rows, scatter, steps  # noqa: F401  (they register)
from .dispatch import generic_only, on_host, recording

__all__ = ["on_host", "generic_only", "recording"]
