"""Random draws that `checkpoint` replays.

`checkpoint(f, x)` runs `f` again in the backward pass. If `f` draws random numbers (a
`Dropout`), the second run must see the numbers the first one saw, or the gradient belongs to
another function. Layers draw through `uniform(rng, shape)`; inside a checkpointed block it notes
the state of the generator before each draw, and the re-run draws each from its noted state,
then puts the generator back where it was (PyTorch's checkpoint does the same with its
generators). A draw reads and moves the state under one lock, so a layer's generator may be
shared by threads: another thread's draws may fall between a block's, never into them.
A generator whose state cannot be read and restored is refused inside a checkpointed block.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> with noted() as states:
...     first = uniform(rng, (2,))
>>> with replayed(states):
...     again = uniform(rng, (2,))
>>> bool(np.array_equal(first, again))
True
"""

import contextlib
import threading

import numpy as np

from . import backend, recording

__all__ = ["uniform", "draw", "noted", "replayed"]

_local = threading.local()
_lock = threading.RLock()


def uniform(rng, shape, like=None):
    """`rng.random(shape)`: uniform draws in [0, 1), in the library and on the device of `like`
    (a plain array) if given; noted for the checkpointed blocks running, and, while tg.compile
    records, a traced draw that every replay makes anew."""
    with _lock:  # a generator may be shared by threads: its state is read as it draws
        again = _replaying(rng)
        now = None if again is None else _state(rng)
        if again is not None:
            _restore(rng, again)
        for states in getattr(_local, "blocks", ()):
            states.setdefault(id(rng), (rng, []))[1].append(_state(rng))
        try:
            recorder = recording.current()
            if recorder is not None:
                return recorder.draw(rng, shape, like)
            return draw(rng, shape, like)
        finally:
            if now is not None:
                _restore(rng, now)


def draw(rng, shape, like=None):
    """`rng.random(shape)`, moved to the library and device of `like` if it is another's."""
    with _lock:
        u = rng.random(shape)
    if like is None:
        return u
    xp = backend.namespace_of(like)
    if backend.namespace_of(u) is xp:
        return u
    return xp.asarray(u, device=backend.device_of(like))


@contextlib.contextmanager
def noted():
    """A block whose generators' states, before each of their draws, are collected in the
    dict it yields."""
    blocks = _local.__dict__.setdefault("blocks", [])
    states = {}
    blocks.append(states)
    try:
        yield states
    finally:  # by identity: two blocks may have noted equal states
        del blocks[next(i for i, b in enumerate(blocks) if b is states)]


@contextlib.contextmanager
def replayed(states):
    """Within the block, the draws of each generator of `states` are those it noted, in turn;
    the generator itself is left where it is (other threads may draw from it meanwhile)."""
    replays = _local.__dict__.setdefault("replays", [])
    replays.append({key: iter(noted) for key, (_, noted) in states.items()})
    try:
        yield
    finally:
        replays.pop()


def _replaying(rng):
    """The state to draw from for a draw being replayed, or None."""
    replays = getattr(_local, "replays", None)
    if not replays:
        return None
    return next(replays[-1].get(id(rng), iter(())), None)


def _state(rng):
    if isinstance(rng, np.random.Generator):
        return rng.bit_generator.state
    if hasattr(rng, "get_state") and hasattr(rng, "set_state"):
        return rng.get_state()  # NumPy's RandomState, a torch.Generator
    raise TypeError(
        f"checkpoint cannot replay the draws of a {type(rng).__module__}.{type(rng).__name__}: "
        "its state cannot be read and restored, so the backward pass would draw other numbers. "
        "Give the layer a NumPy generator (rng=np.random.default_rng(seed)), or keep it out of "
        "the checkpointed block"
    )


def _restore(rng, state):
    if isinstance(rng, np.random.Generator):
        rng.bit_generator.state = state
    else:
        rng.set_state(state)
