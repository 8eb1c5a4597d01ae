"""The hook through which `tg.compile` watches a function while it records it.

The core calls `current()` where a recording must see or refuse something: a node made, a leaf
made, a random draw, a backward walk, a tracked value turned into a Python number or used as a
condition. When no thread records, `current()` is one test of an empty set, so eager code pays
nothing more. The recorder itself (what it keeps, how it replays) lives in `tracker_gpu.compile`.

>>> current() is None
True
"""

import contextlib
import threading

import array_api_compat

__all__ = [
    "RecordingError",
    "current",
    "recording",
    "paused",
    "refuse",
    "DATA",
    "is_data",
    "read",
    "write",
    "Journal",
    "tracks",
]

ACTIVE = set()  # the threads recording now
_local = threading.local()


class RecordingError(TypeError):
    """What `tg.compile` cannot replay: Python control flow or numbers that depend on the data."""


def current():
    """The recorder of this thread, or None."""
    if not ACTIVE:
        return None
    return getattr(_local, "recorder", None)


@contextlib.contextmanager
def recording(recorder):
    """Within the block, this thread's operations are shown to `recorder`."""
    outer = getattr(_local, "recorder", None)
    _local.recorder = recorder
    ACTIVE.add(threading.get_ident())
    try:
        yield recorder
    finally:
        _local.recorder = outer
        if outer is None:
            ACTIVE.discard(threading.get_ident())


@contextlib.contextmanager
def paused():
    """Within the block, nothing is recorded (a checkpoint's own forward pass, which its
    replay runs again as a whole)."""
    outer = getattr(_local, "recorder", None)
    _local.recorder = None
    try:
        yield
    finally:
        _local.recorder = outer


def tracks(x):
    """Whether `x` is tracked as it would be eagerly (a layer's training mode is decided so):
    on the tape, and, while tg.compile records, computed from a parameter, not from data only
    (arguments outside `wrt`, integer labels), which eagerly are plain arrays.

    >>> import numpy as np
    >>> tracks(np.ones(2))
    False
    """
    node = getattr(x, "_node", None)
    if node is None:
        return False
    recorder = current()
    return True if recorder is None else recorder.tracks(node)


def read(buffer):
    """A layer's buffer (a running statistic) as a step reads it: the buffer itself, or, while
    tg.compile records, traced data that every replay reads anew (after the step's own writes).

    >>> import numpy as np
    >>> b = np.zeros(2)
    >>> read(b) is b
    True
    """
    recorder = current()
    return buffer if recorder is None else recorder.read(buffer)


def write(buffer, value):
    """Write `value` into the plain array `buffer` in place: now, and, while tg.compile records,
    at the end of every replay too (a layer's state is part of the recorded program).

    >>> import numpy as np
    >>> b = np.zeros(2)
    >>> write(b, np.ones(2)); b
    array([1., 1.])
    """
    journals = getattr(_local, "journals", None)
    if journals:
        journals[-1].note(buffer)
    recorder = current()
    if recorder is not None:
        recorder.write(buffer, value)
    else:
        buffer[...] = value


class Journal:
    """A block within which the buffers that `write` writes get their values back if it
    raises: a step refused after its forward pass (a nan loss, labels out of range) leaves a
    BatchNorm's running statistics as they were, as a compiled step's replay, which writes them
    at its end, does. Every transform runs in one. Blocks nest: one that raises restores what
    was written within it; one that ends well hands its notes to the block around it.

    >>> import numpy as np
    >>> b = np.zeros(2)
    >>> try:
    ...     with Journal():
    ...         write(b, np.ones(2))
    ...         raise ValueError("the loss is nan")
    ... except ValueError:
    ...     pass
    >>> b
    array([0., 0.])
    """

    __slots__ = ("kept",)

    def __init__(self):
        self.kept = None  # {id: (buffer, its value before the block's first write)}

    def note(self, buffer):
        if self.kept is None:
            self.kept = {}
        if id(buffer) not in self.kept:
            xp = array_api_compat.array_namespace(buffer)
            self.kept[id(buffer)] = (buffer, xp.asarray(buffer, copy=True))

    def __enter__(self):
        journals = getattr(_local, "journals", None)
        if journals is None:
            journals = _local.journals = []
        journals.append(self)
        return self

    def __exit__(self, kind, error, trace):
        journals = _local.journals
        journals.pop()
        if self.kept is None:
            return
        if kind is not None:
            for buffer, value in reversed(self.kept.values()):
                buffer[...] = value
        elif journals:
            outer = journals[-1]
            if outer.kept is None:
                outer.kept = {}
            for key, kept in self.kept.items():
                outer.kept.setdefault(key, kept)


class _Data:
    """The `grad` of a data node: a traced value that carries no gradient (an integer argument,
    a random draw, a comparison, a recorded pass's gradient). To the tape it is the constant it
    stands for; to the recorder, a slot read anew by every replay."""

    def __repr__(self):
        return "DATA"


DATA = _Data()


def is_data(node):
    """Whether `node` stands for data (only while recording can it): a leaf whose `grad` is
    DATA (a node made by a rule has no `grad`: it is not looked up, which would raise inside)."""
    return getattr(node, "rule", False) is None and getattr(node, "grad", None) is DATA


def refuse(operation, goes_on=False):
    """Raise the error for `operation` on a traced value while recording. A caller that goes
    on as eagerly should this return (`goes_on`) lets a recording made with fallback=True stop
    here instead, so that the run finishes eagerly and `f` runs once."""
    error = RecordingError(
        f"tg.compile cannot replay {operation}: a Python value or branch that depends on the "
        "data would be fixed at its recorded value. Compute it with tracker_gpu's functions "
        "(tg.where for a branch), pass the number as an argument, or use "
        "tg.compile(f, fallback=True) to run f eagerly every time"
    )
    recorder = current()
    if goes_on and getattr(recorder, "lenient", False):
        recorder.refused = error
        _local.recorder = None
        return
    raise error
