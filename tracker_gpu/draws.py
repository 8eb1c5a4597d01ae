"""Random draws that `checkpoint` replays.

`checkpoint(f, x)` runs `f` again in the backward pass. If `f` draws random numbers (a
`Dropout`), the second run must see the numbers the first one saw, or the gradient belongs to
another function. Layers draw through `uniform(rng, shape)`; inside a checkpointed block it notes
the state of each generator before its first draw, and the re-run starts each generator from
that state, then puts it back where it was, as PyTorch's checkpoint does with its generators.
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

__all__ = ["uniform", "draw", "noted", "replayed", "rewind"]

_local = threading.local()


def uniform(rng, shape, like=None):
    """`rng.random(shape)`: uniform draws in [0, 1), in the library and on the device of `like`
    (a plain array) if given; noted for the checkpointed blocks running, and, while tg.compile
    records, a traced draw that every replay makes anew."""
    for states in getattr(_local, "blocks", ()):
        if id(rng) not in states:
            states[id(rng)] = (rng, _state(rng))
    recorder = recording.current()
    if recorder is not None:
        return recorder.draw(rng, shape, like)
    return draw(rng, shape, like)


def draw(rng, shape, like=None):
    """`rng.random(shape)`, moved to the library and device of `like` if it is another's."""
    u = rng.random(shape)
    if like is None:
        return u
    xp = backend.namespace_of(like)
    if backend.namespace_of(u) is xp:
        return u
    return xp.asarray(u, device=backend.device_of(like))


@contextlib.contextmanager
def noted():
    """A block whose generators' states (before their first draw) are collected in the dict it
    yields."""
    blocks = _local.__dict__.setdefault("blocks", [])
    states = {}
    blocks.append(states)
    try:
        yield states
    finally:
        blocks.remove(states)


@contextlib.contextmanager
def replayed(states):
    """Within the block, each generator of `states` starts from its noted state; afterwards it
    is back where it was."""
    current = [(rng, _state(rng)) for rng, _ in states.values()]
    rewind(states)
    try:
        yield
    finally:
        for rng, state in current:
            _restore(rng, state)


def rewind(states):
    """Each generator of `states` back to its noted state, to draw again what it drew (a run
    that tg.compile could not record, run again eagerly)."""
    for rng, state in states.values():
        _restore(rng, state)


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
