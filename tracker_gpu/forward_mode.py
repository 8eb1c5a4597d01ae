"""Forward mode from reverse mode: `jvp` (a Jacobian-vector product) and `jacfwd`.

The pullback `u -> J^T u` of `f` is linear in the cotangent `u`, so the gradient with respect
to `u` of `<J^T u, t>` is `J t`: a nested gradient (the pullback recorded with `nest=True`)
differentiated once more. It works on every backend and every rule that has a nested pullback,
at the cost of about three passes.

>>> import numpy as np, tracker_gpu as tg
>>> y, t = tg.jvp(lambda x: x**2, (np.array([1.0, 3.0]),), (np.array([1.0, 0.5]),))
>>> y, t
(array([1., 9.]), array([2., 3.]))
"""

import math

import numpy as np

from . import backend, nesting, recording
from .api import (
    backprop,
    check_one_array,
    cut_off,
    gradients_in_place,
    quiet_gradient,
    top_levels,
    track_inputs,
    untracked,
)
from .pytree import tree_leaves, tree_map
from .rules.elementwise import as_floating, conj, identity, imag, is_complex, multiply, real
from .rules.reductions import sum as _sum
from .rules.shape import reshape, stack
from .tape import older_nodes
from .tracked import TrackedArray, data

__all__ = ["jvp", "jacfwd"]


@nesting.transform
def jvp(f, primals, tangents):
    """`(f(*primals), J t)`: the value and its derivative along `tangents` (shaped like
    `primals`, nested structures alike). The value may be an array or a structure of arrays;
    the tangent comes back in the same structure (zeros for integer and boolean arrays). `f`
    runs once: the value and the tangent are of the same run (the same dropout masks, one
    update of a batch norm's statistics)."""
    primals, tangents = untied(_floats_as_arrays(primals)), _floats_as_arrays(tangents)
    check_directions(primals, tangents)
    value, outputs, transposed, finish = _linearized(f, primals)
    along = lambda *u: transposed(u, lambda grads: directional(grads, tangents))  # noqa: E731
    value, found = finish(value, quiet_gradient(along, *[_zeros_like(y) for y in outputs]))
    found = iter(found)
    return value, tree_map(lambda v: _tangent(v, found) if _is_array(v) else _still(v), value)


def _linearized(f, primals):
    """`f` run once on `primals`, and its pullback `u -> J^T u` to differentiate once more:
    `(value, outputs, transposed, finish)`, where `transposed(u, reduce)` is `reduce` of the
    gradients in place (linear in the cotangents `u`, one per floating output), and
    `finish(value, tangents)` gives them back plain at top level."""
    _, since = nesting.begin(True)  # recorded: the pullback is differentiated once more
    args, inputs, tracked = track_inputs(primals, True)
    with nesting.inside():
        value = f(*tracked)
    outputs = [y for y in _leaves(value) if _is_floating(y)]
    # nested, both stay linked to the outer pass; recorded, traced (a replay computes them)
    at_top = not nesting.active() and recording.current() is None
    older = []  # at top level, the tracked values from before `since` the tangents depend on

    def transposed(cotangents, reduce):
        weighted = _total([_sum(multiply(y, u)) for y, u in zip(outputs, cotangents)])
        found = {}
        if isinstance(weighted, TrackedArray):
            found = backprop(weighted, inputs.values(), True, since=since, finite=False)
        reduced = reduce(gradients_in_place(args, inputs, found, True))
        if at_top and isinstance(reduced, TrackedArray) and reduced._node is not None:
            older.extend(older_nodes(reduced._node, since))  # before the pass frees the graph
        return reduced

    def finish(value, tangents):
        if not at_top:
            return value, tangents
        return untracked(value), [_cut_off_at_top(t, older) for t in tangents]

    return value, outputs, transposed, finish


def _cut_off_at_top(tangent, older):
    """A tangent taken at top level, plain; where the tangents depend on tracked values from
    before the transform (`older`: a parameter given, or one `f` closes over), linked to one by
    `cut_off`, so that differentiating it raises, as a gradient taken at top level does (it
    was plain: the dependence dropped silently)."""
    if tangent is None:
        return None
    plain = data(tangent)
    return cut_off(plain, older[0], backend.namespace_of(plain)) if older else plain


def _tangent(y, found):
    """The tangent of the output array `y`: the next one `found` for a floating one (zeros
    where it does not depend on the primals), zeros of its dtype for another."""
    g = next(found) if _is_floating(y) else None
    return _zeros_like(y) if g is None else g


def directional(grads, tangents):
    """The sum of `sum(g * t)` over each gradient and the tangent in its place (a dict's by
    key), 0.0 for none: a directional derivative, for `jvp` and `hvp`. A complex `g` is a
    gradient in PyTorch's convention (`df/da + i df/db`), so its part is `Re(conj(g) t)`."""
    parts = []

    def part(g, t):
        if isinstance(g, TrackedArray):  # a complex g: Re(conj(g) t), the real pairs' product
            parts.append(_sum(real(conj(g) * t) if is_complex(g) else g * t))

    tree_map(part, grads, tangents)
    return _total(parts)


def untied(primals):
    """`primals` with an array found in several places copied in the later ones: a directional
    derivative takes each place as its own variable, with its own tangent (as JAX does), where
    `gradient` gives a tied array the whole gradient in each place."""
    seen = set()

    def once(x):
        tracked = isinstance(x, TrackedArray)
        if tracked or backend.is_array(x):
            if id(x) in seen:  # a tracked one stays linked to what it was computed from
                return identity(x) if tracked else backend.namespace_of(x).asarray(x, copy=True)
            seen.add(id(x))
        return x

    return tree_map(once, primals)


def _floats_as_arrays(primals):
    """Python floats given as primals (or tangents) themselves, as 0-d arrays, as `gradient`
    takes them (`api.top_levels`), so that the value and its tangent are arrays."""
    primals = tuple(primals)
    return top_levels(primals, frozenset(range(len(primals))))


def _still(v):
    """The tangent of an output that is not an array: 0 for a number (a constant), else
    the value itself (a name, None)."""
    return type(v)(0) if type(v) in (int, float, complex) else v


@nesting.transform
def jacfwd(f, x):
    """The Jacobian of `f` at the array `x` by forward mode, in `jacobian`'s layout
    (`f(x).shape + x.shape`). `f` runs once (one dropout mask, one update of a batch norm's
    statistics); each column is the derivative of its pullback along one element of `x`,
    about two reverse passes, so it is the cheaper of the two where `f(x)` has over twice as
    many elements as `x`.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.jacfwd(lambda x: tg.stack([x[0] * x[1], 3.0 * x[0]]), np.array([2.0, 5.0]))
    array([[5., 2.],
           [3., 0.]])
    """
    (x,) = _floats_as_arrays((_as_float(x),))  # integers are differentiated as floats
    value, outputs, transposed, finish = _linearized(f, (x,))
    check_one_array(value, "jacfwd", "tg.jacfwd(lambda x: f(x)[0], x)")
    plain = data(x)
    n, shape = math.prod(plain.shape), tuple(getattr(value, "shape", ())) + tuple(plain.shape)
    if not outputs or n == 0:  # an integer output (zeros of x's dtype, as `jacobian`'s)
        dtype = data(outputs[0]).dtype if outputs else plain.dtype
        xp = backend.namespace_of(plain)
        return xp.zeros(shape, dtype=dtype, device=backend.device_of(plain))
    # (J^T u)_j is linear in u, and its gradient in u is column j; for a complex x, its real
    # and imaginary parts give df/da + i df/db, `jacobian`'s convention
    parts = (real, imag) if backend.is_complex_dtype(plain.dtype) else (None,)
    columns = [_column(transposed, outputs[0], n, j, parts) for j in range(n)]
    _, (jac,) = finish(value, [reshape(stack(columns, axis=1), shape)])
    return jac


def _column(transposed, y, n, j, parts):
    """Column `j` of the Jacobian, flat: the gradient in `u` of element `j` of `J^T u` (each
    of `parts` of it, joined as `re + 1j im`)."""
    pieces = []
    for part in parts:

        def element(u, part=part):
            g = transposed((u,), lambda grads: grads[0])
            if g is None:  # the output does not depend on x
                return 0.0
            e = reshape(g, (n,))[j]
            return e if part is None else part(e)

        (c,) = quiet_gradient(element, _zeros_like(y))
        pieces.append(_zeros_like(y) if c is None else c)
    column = pieces[0] if len(pieces) == 1 else pieces[0] + 1j * pieces[1]
    return reshape(column, (-1,))


def _as_float(x):
    """An integer or boolean array, or a Python number, as a float64 (complex128) array; a
    tracked one as it is."""
    if type(x) in (int, float, complex):
        return np.asarray(x, dtype=np.complex128 if type(x) is complex else np.float64)
    if isinstance(x, TrackedArray) or not backend.is_array(x):
        return x
    return as_floating(x)


def _leaves(value):
    return [v for v in tree_leaves(value) if _is_array(v)]


def _is_array(v):
    return isinstance(v, TrackedArray) or backend.is_array(v)


def _is_floating(y):
    """Whether the output `y` has a tangent to compute: real floating (integer and boolean
    outputs have zeros; complex ones are refused)."""
    y = data(y)
    xp = backend.namespace_of(y)
    if backend.isdtype(xp, y.dtype, "complex floating"):
        raise TypeError(
            f"jvp differentiates real outputs; f returned dtype {y.dtype}: take tg.real and "
            "tg.imag of it apart"
        )
    return backend.isdtype(xp, y.dtype, "real floating")


def _zeros_like(y):
    y = data(y)
    return backend.namespace_of(y).zeros_like(y)


def _total(parts):
    return sum(parts[1:], parts[0]) if parts else 0.0


def check_directions(primals, tangents, what="jvp"):
    """Each tangent (`jvp`'s, or `hvp`'s direction) shaped like its primal, and not a float
    direction for an integer primal: that is data, as `gradient` takes it, and the direction
    would be dropped silently."""
    point, direction = ("primal", "tangent") if what == "jvp" else ("point", "direction")
    if len(primals) != len(tangents):
        raise ValueError(
            f"{what} takes one {direction} per {point}: {len(primals)} {point}s, "
            f"{len(tangents)} {direction}s"
        )
    if all(type(p) is np.ndarray and type(t) is np.ndarray and p.shape == t.shape
           and (p.dtype.kind in "fc" or (t.dtype.kind not in "fc" and not t.any()))
           for p, t in zip(primals, tangents)):  # fmt: skip
        return  # NumPy arrays, checked at once (hvp's cost per call)
    pairs = []
    tree_map(lambda p, t: pairs.append((p, t)), primals, tangents)  # dicts by key
    for p, t in pairs:
        if _is_array(p) and (not _is_array(t) or tuple(t.shape) != tuple(p.shape)):
            shape = tuple(t.shape) if _is_array(t) else type(t).__name__
            raise ValueError(
                f"{what}: a {direction} must be shaped like its {point}: {point} "
                f"{tuple(p.shape)}, got {shape}"
            )
        if _dropped(p, t):
            kind = data(p).dtype if _is_array(p) else type(p).__name__
            given = data(t).dtype if _is_array(t) else type(t).__name__
            raise ValueError(
                f"{what}: a {point} of dtype {kind} is data, as gradient takes integers, so "
                f"its {direction} of {given} would be dropped: pass the {point} as floats "
                f"(x.astype(float)) to differentiate along it (a zero integer {direction} is "
                "taken, as JAX's float0)"
            )


def _dropped(p, t):
    """Whether `t` is a direction that would be dropped: a float direction, or integers not all
    zero, for a `p` of integers or booleans (data)."""
    if type(p) in (int, bool):  # a Python integer is data, as gradient takes it
        return t != 0
    if not _is_array(p) or _is_floating_dtype(p):
        return False
    if _is_floating_dtype(t):
        return True
    return bool(backend.namespace_of(data(t)).any(data(t) != 0))


def _is_floating_dtype(x):
    x = data(x)
    xp = backend.namespace_of(x)
    return backend.isdtype(xp, x.dtype, ("real floating", "complex floating"))
