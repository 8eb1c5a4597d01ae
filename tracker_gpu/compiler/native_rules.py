"""The rules that `opened.py` opens for `tg.compile`, opened in eager steps too: on NumPy
arrays, GELU (forward and pullback), softmax (forward and pullback), the normalisations'
pullback and cross-entropy's forward run as the same generated loops around the same library
calls, so that an eager step computes what it computed before, bit for bit, in fewer passes
over memory (GELU's pullback: one `tanh` and two loops where its NumPy code makes eighteen
passes).

A loop's source depends on the structure of its arrays, not on their lengths
(`loops.any_lengths`): each opening is built for one structure, in float32 and float64. GELU's
loops take one flat array; the others take rows (the rule's trailing axes) with one statistic
a row. All are one library, built once per machine by the compiler of `loops.py` (cached on
disk with `tg.compile`'s libraries) and loaded once per process, as the optimiser steps'
native build (`cuda/native.py`). The rules reach `run` through `rules/native_hook.py`, where
this module installs itself when the package is imported.

The rule's NumPy code runs instead (`run` returns None) where no library can be built, inside
`generic_only()` and `on_host()`, and for other arrays (another dtype or layout, fewer than
`FROM` elements, statistics over leading axes). Where a loop raised a floating-point exception
that NumPy's settings report, that loop's operations run again as NumPy's functions, which warn
or raise as the rule's NumPy code does (the library calls before it are not made twice).
"""

import functools
import math
import sys
import threading

from ..backend import NUMPY_FLOATS
from ..cuda import dispatch
from ..nn.primitives import gelu_tanh
from ..rules import losses, native_hook, nn
from ..rules.native_hook import FROM
from . import loops, numpy_loops
from .opened import OPENED, RunWhole, takes, with_fallbacks

__all__ = ["run", "available", "FROM", "RULES"]

# name -> (its opening, the shape of its build: (2,) a flat array, (2, 3) rows, and the
# keywords of that build)
RULES = {
    "gelu": (OPENED[gelu_tanh][0], (2,), {}),
    "gelu_vjp": (OPENED[gelu_tanh][1], (2,), {}),
    "softmax": (OPENED[nn.softmax][0], (2, 3), {"axis": -1}),
    "softmax_vjp": (OPENED[nn.softmax][1], (2, 3), {"axis": -1}),
    "normalise_vjp": (OPENED[nn.normalise][1], (2, 3), {"axes": (-1,)}),
    "crossentropy": (OPENED[losses.logitcrossentropy_primitive][0], (2, 3), {"axis": -1}),
}
_state = {"kernels": None, "tried": False}
_lock = threading.Lock()


def run(name, *arrays, **kw):
    """Rule `name` of `arrays` (C-contiguous NumPy arrays of one float dtype and one shape, in
    the order of the opening's code) by its loops, or None where they do not take them."""
    first = arrays[0]
    dtype, shape = first.dtype, first.shape
    if dtype not in NUMPY_FLOATS or first.size < FROM or not dispatch.native_allowed():
        return None
    if not takes(arrays, dtype, shape):
        return None
    opening, built_for, _ = RULES[name]
    row = 1
    if len(built_for) == 2:
        trailing = _trailing(kw.get("axis", kw.get("axes")), first.ndim)
        if trailing is None:
            return None
        row = math.prod(shape[first.ndim - trailing :])
    if not available():
        return None
    kernels, regions = _state["kernels"][name, dtype]
    bound = [functools.partial(kernel, row, shape) for kernel in kernels]
    try:
        return opening.composed(with_fallbacks(bound, regions, opening.loop_first), *arrays, **kw)
    except RunWhole:
        return None


def _trailing(axes, ndim):
    """How many trailing axes `axes` (an int or a tuple of them) are, or None if they are not
    the last ones."""
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    if not axes or any(not -ndim <= a < ndim for a in axes):
        return None
    given = sorted(a % ndim for a in axes)
    return len(given) if given == list(range(ndim - len(given), ndim)) else None


def available():
    """Whether the loops are built (once per process, from the disk cache where it can)."""
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                _state["kernels"] = _built()
                _state["tried"] = True
    return _state["kernels"] is not None


def _built():
    """`{(name, dtype): ([kernel, ...], [region, ...])}`, each opening's loops for each dtype;
    None where the library cannot be had."""
    found = loops.compiler()
    if loops.default_fuse() != "exact" or found is None:
        return None
    regions, owners = [], []
    for name, (opening, shape, kw) in RULES.items():
        for dtype in NUMPY_FLOATS:
            for region in opening.regions(dtype, shape, kw):
                regions.append(region)
                owners.append((name, dtype))
    text = loops.source(regions, object.__basicsize__, tuple.__basicsize__)
    try:
        library = loops.library_of(text, found)
    except (OSError, RuntimeError):
        return None
    if not library.objects:
        return None
    table = numpy_loops.table(regions)
    if table:  # the addresses of NumPy's loops in this process
        library.held.tg_set_numpy_loops(numpy_loops.pointers(list(table)))
    kernels = {}
    for k, (region, owner) in enumerate(zip(regions, owners)):
        made, of = kernels.setdefault(owner, ([], []))
        made.append(loops.any_lengths(library, f"tg_region_{k}", region))
        of.append(region)
    return kernels


native_hook.install(sys.modules[__name__])
