"""Custom rules: Tracker's `track` with `@grad`, a user's function and its pullback recorded as
one operation (`tg.rule`). The node keeps the pullback and what it closes over, and the
tracked arguments, on which a nested pass runs the forward again so that the pullback is
recorded too.
"""

import functools

from . import backend, recording
from .api import nobacksies
from .backend import namespace_of
from .primitive import fitted, record_saving_arguments, resolve, tracked_values
from .rules.elementwise import subtract
from .tape import Node
from .tracked import TrackedArray, data, istracked

__all__ = ["rule"]


class _CustomRule:
    """A user's rule: the node keeps the pullback (and what it closes over) and the tracked
    arguments, which a nested pass runs the forward on again."""

    def __init__(self, fn):
        self.fn = fn
        self.name = getattr(fn, "__name__", "custom rule")

    def pullback(self, node, args, ctx, saved, g, nested, pending=None):
        pb, kw = ctx
        _, values = resolve(node, args, saved)
        if nested:  # re-run the forward on tracked arguments, so the pullback is recorded too
            _, values = tracked_values(node, args, saved, g)
            _, pb = self.fn(*values, **kw)
        grads = pb(g)
        if not isinstance(grads, tuple) or len(grads) != len(args):
            raise ValueError(
                f"the pullback of custom rule {self.name!r} must return a tuple with one "
                f"gradient (or None) per positional argument: {len(args)}, got {grads!r:.80}"
            )
        if nested:
            grads = self._marked_if_plain(grads, (g, *values))
            grads = self._marked_if_apart_from(grads, g)
        return [
            None if ga is None or type(a) is not Node else self._checked(ga, a, data(v))
            for a, v, ga in zip(args, values, grads)
        ]

    def _marked_if_plain(self, grads, tracked_inputs):
        """A nested pass's plain gradients (the pullback read `tg.data` of its tracked
        cotangent or arguments, or called NumPy on them) marked so that differentiating them
        raises: they lost their dependence on those inputs, and a jvp, a Hessian or an hvp
        through them was silently 0."""
        parent = next((v for v in tracked_inputs if istracked(v)), None)
        if parent is None:
            return grads
        message = (
            f"the pullback of custom rule {self.name!r} returned a plain array in a nested pass "
            "(a Hessian, jvp, jacfwd, hvp or nest=True): it read plain values (tg.data, NumPy) "
            "of its tracked cotangent or arguments, so its derivative is lost; write the "
            "pullback with tracker_gpu functions (tg.*, operators) of g and the arguments, "
            "and it is differentiable again"
        )
        return tuple(
            ga if ga is None or istracked(ga) else nobacksies(message, ga, parent=parent)
            for ga in grads
        )

    def _marked_if_apart_from(self, grads, g):
        """A nested pass's tracked gradients that do not depend on the tracked cotangent `g`
        (the pullback read `tg.data(g)`): the term in `g` is lost, so a jvp, a jacfwd or a
        Hessian through them was silently wrong. Each is given a zero term whose derivative
        in `g` raises: its value and its derivative in the arguments stay as they are."""
        if not istracked(g) or g._node is None:
            return grads
        message = (
            f"the pullback of custom rule {self.name!r} read the plain value of its cotangent "
            "(tg.data(g), NumPy) in a nested pass (a Hessian, jvp, jacfwd, hvp or nest=True), "
            "so its derivative in g is lost; write the pullback with tracker_gpu functions "
            "(tg.*, operators) of g, and it is differentiable again"
        )
        marked = []
        for ga in grads:
            if istracked(ga) and ga._node is not None and not _depends_on(ga._node, g._node):
                zero = namespace_of(data(ga)).zeros_like(data(ga))
                ga = subtract(ga, nobacksies(message, zero, parent=g))  # ga - 0 is ga
            marked.append(ga)
        return tuple(marked)

    def replay(self, kw):
        """`(value, ctx)` of the rule on plain values, for tg.compile's replay."""

        def again(*values):
            y, pb = self.fn(*values, **kw)
            return y, (pb, kw)

        return again

    def _checked(self, ga, node, value):
        """A user's gradient must be of the argument's library and on its device."""
        plain = data(ga)
        backend.common_library(namespace_of(value), plain)
        device = backend.device_of(value)
        if backend.device_of(plain) != device:
            raise ValueError(
                f"the pullback of custom rule {self.name!r} returned a gradient on device "
                f"{backend.device_of(plain)} for an argument on device {device}; create it "
                f"on the argument's device"
            )
        return fitted(ga, node, self.name)


def _depends_on(node, target):
    """Whether `node` is `target` or is computed from it (nodes older than `target` are not)."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n is target:
            return True
        if id(n) in seen or n.serial < target.serial:
            continue
        seen.add(id(n))
        stack.extend(a for a in n.args if type(a) is Node)
    return False


def rule(fn):
    """Turn `fn(*args) -> (y, pullback)` into a tracked operation (Tracker's `@grad`).

    `fn` receives plain arrays and returns the plain result, one array, and a pullback that
    maps the gradient of the result to a tuple with one gradient (or `None`) per positional
    argument. Keyword arguments are constants, passed to `fn` as they are and given no
    gradient: a tracked one raises (pass differentiable values positionally); a tracked
    constant is passed as its plain value. Write the pullback with tracker_gpu functions and it
    is differentiable again (`nest=True`).

    >>> import numpy as np, tracker_gpu as tg
    >>> @tg.rule
    ... def cube(x):
    ...     return x**3, lambda g: (g * 3 * x**2,)
    >>> tg.gradient(lambda x: tg.sum(cube(x)), np.array([1.0, 2.0]))[0]
    array([ 3., 12.])
    """
    custom = _CustomRule(fn)

    @functools.wraps(fn)
    def tracked_fn(*args, **kw):
        if kw:
            kw = _constant_keywords(custom.name, kw)
        if not any(isinstance(a, TrackedArray) for a in args):
            return fn(*args, **kw)[0]
        xp = next(a._xp for a in args if isinstance(a, TrackedArray))
        values = [data(a) for a in args]
        returned = fn(*values, **kw)
        if not (isinstance(returned, tuple) and len(returned) == 2 and callable(returned[1])):
            raise TypeError(
                f"custom rule {custom.name!r} must return (value, pullback), got "
                f"{type(returned).__name__}"
            )
        y, pb = returned
        if isinstance(y, TrackedArray):
            raise TypeError(
                f"custom rule {custom.name!r} must return a plain array, not a tracked one"
            )
        if not backend.is_array(y):
            number = isinstance(y, (bool, int, float, complex))
            raise TypeError(
                f"custom rule {custom.name!r} must return (value, pullback) with the value one "
                f"array, got {type(y).__name__}: "
                + (
                    "return a number as a 0-d array of the arguments' library (xp.asarray)"
                    if number
                    else "stack outputs or write one rule per output"
                )
            )
        return record_saving_arguments(y, xp, custom, args, (pb, kw), custom.replay(kw))

    return tracked_fn


def _constant_keywords(name, kw):
    """The keyword arguments of custom rule `name`, constants: a tracked constant as its plain
    value; a tracked value, which would get no gradient (the pullback gives one per positional
    argument), raises."""
    out = dict(kw)
    for key, value in kw.items():
        if isinstance(value, TrackedArray):
            if value._node is not None and recording.current() is not None:
                recording.refuse(
                    f"custom rule {name!r}'s keyword argument {key}= computed from f's "
                    "arguments (a replay would keep its recorded value; pass it to the rule "
                    "positionally, its pullback returning None for it)"
                )
            if value._node is not None:
                raise TypeError(
                    f"custom rule {name!r} got the tracked keyword argument {key}=: keyword "
                    "arguments are constants, given no gradient (the pullback returns one per "
                    "positional argument); pass differentiable values positionally"
                )
            out[key] = value.data
    return out
