"""Whether a transform runs inside another: the one model of nesting.

A transform (`gradient`, `jacobian`, `jvp`, `forward`, `checkpoint`'s pullback...) called
while the function of another one runs is part of what the outer one differentiates, so it
nests by itself: its backward pass is recorded on the tape (the pullbacks see tracked
gradients) and its results stay tracked, linked to what it read. At top level it takes the
fast path: plain results, a graph freed as it is walked.

Levels never mix: a pass differentiates with respect to the inputs it made when it began
(`tape.serial_now`) and walks only the nodes made since; an older node is a value it closes
over, which belongs to an outer pass and is a constant to this one (as JAX tags its traces).

>>> active()
False
>>> with inside():
...     active()
True
"""

import contextlib
import functools
import threading

from .recording import Journal
from .tape import serial_now

__all__ = ["active", "begin", "inside", "top_level_passes", "transform", "resumed", "NOT_TRACKING"]

_local = threading.local()

# Threads inside a `notrack()` block: their operations record nothing.
NOT_TRACKING = set()


def active():
    """Whether the function of a transform is running in this thread."""
    return getattr(_local, "depth", 0) > 0


class _Inside:
    """The context of `inside()`: a class, not a generator, as every transform enters one."""

    __slots__ = ()

    def __enter__(self):
        _local.depth = getattr(_local, "depth", 0) + 1

    def __exit__(self, *exc):
        _local.depth -= 1


_INSIDE = _Inside()


def inside():
    """Within the block, a transform's function runs: transforms called in it nest."""
    return _INSIDE


def begin(nest=False):
    """`(nest, since)` for a transform about to make its inputs: whether it nests (asked for,
    or inside another transform's function) and the serial from which its pass walks. One
    that does not nest is noted (`top_level_passes`)."""
    nest = nest or active()
    if not nest:
        _local.passes = top_level_passes() + 1
    return nest, serial_now()


def top_level_passes():
    """How many transforms have taken the fast path in this thread: tg.compile asks whether
    `f` ran one, which `withgradient(f)` would have nested."""
    return getattr(_local, "passes", 0)


def transform(run):
    """`run`, a transform (`gradient`, `jacobian`, `jvp`...): called inside `notrack()` it
    differentiates all the same, its own function tracked and its results plain, as at top
    level (PyTorch's transforms likewise differentiate under `no_grad`)."""

    @functools.wraps(run)
    def transformed(*args, **kw):
        with Journal():  # a transform that raises leaves the layers' buffers as they were
            if not (NOT_TRACKING and threading.get_ident() in NOT_TRACKING):
                return run(*args, **kw)
            with resumed():
                return _served["untracked"](run(*args, **kw))

    return transformed


_served = {}  # what a higher layer serves this one: `untracked` (api), plain values of a result


def serve_untracked(untracked):
    _served["untracked"] = untracked


@contextlib.contextmanager
def resumed():
    """Within the block, this thread tracks, at top level, if it was inside `notrack()`."""
    ident = threading.get_ident()
    if ident not in NOT_TRACKING:
        yield
        return
    depth = getattr(_local, "depth", 0)
    NOT_TRACKING.discard(ident)
    _local.depth = 0
    try:
        yield
    finally:
        _local.depth = depth
        NOT_TRACKING.add(ident)
