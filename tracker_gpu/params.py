"""Flux's implicit parameters: `Params`, the tracked leaves a gradient is taken for, and
`Grads`, their gradients looked up by parameter (`tg.gradient(lambda: loss, Params([W]))`).

>>> import numpy as np, tracker_gpu as tg
>>> W = tg.param(np.array([1.0, 2.0]))
>>> gs = tg.gradient(lambda: tg.sum(W * W), tg.Params([W]))
>>> gs[W]
array([2., 4.])
"""

from .tracked import TrackedArray

__all__ = ["Params", "Grads"]


class Params:
    """An ordered set of tracked leaves, de-duplicated by identity (Flux's implicit params)."""

    def __init__(self, xs=()):
        self._items = []
        self._ids = set()
        for x in xs:
            self.append(x)

    def append(self, x):
        if not isinstance(x, TrackedArray):
            raise TypeError(f"Params holds tracked values (tg.param(x)), got {type(x).__name__}")
        if x._node is None:
            raise TypeError(
                "Params holds tracked values (tg.param(x)), got a tracked constant (a "
                "TrackedArray that records no gradient, such as tg.zeros(2)); make it a "
                "parameter with tg.param(x) to differentiate with respect to it"
            )
        if id(x) not in self._ids:
            self._ids.add(id(x))
            self._items.append(x)

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)

    def __contains__(self, x):
        return id(x) in self._ids

    def __reduce__(self):  # a copy or a pickle holds its own arrays, found by their new ids
        return Params, (self._items,)

    def __repr__(self):
        return f"Params({len(self)} arrays)"


class Grads:
    """Gradients of implicit parameters, looked up by parameter: `gs[W]`."""

    def __init__(self, params, found):
        self.params = params
        self._found = found

    def __getitem__(self, x):
        if x not in self.params:
            raise KeyError("not one of the Params this gradient was taken for")
        return self._found.get(id(x))

    def __iter__(self):
        return iter(self.params)

    def __len__(self):
        return len(self.params)

    def items(self):
        return [(p, self[p]) for p in self.params]

    def __reduce__(self):  # the gradients by position: ids change with a copy or a pickle
        return _grads, (self.params, [self._found.get(id(p)) for p in self.params])

    def __repr__(self):
        return f"Grads({len(self)} arrays)"


def _grads(params, gradients):
    return Grads(params, {id(p): g for p, g in zip(params, gradients)})
