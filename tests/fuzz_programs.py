"""The Hypothesis strategy `programs` that draws the random programs of tests/test_fuzz.py.

A program starts from one input of up to 3 dimensions and applies one to `max_steps` operations
(elementwise, arithmetic with random broadcasting, reductions, operations along an axis, shape
changes, indexing, matmul, einsum, where with a fixed mask or one the values make, concat and
stack, indexed updates `tg.at`), drawing
new inputs or reusing values where a second operand is needed. The shape of each value comes
from running the step on tracker_gpu's plain path; a program with a value of more than
`MAX_SIZE` elements or 4 dimensions is rejected.
"""

import math

import numpy as np
from fuzz_operations import (
    ALONG,
    AT,
    BINARY,
    REDUCTIONS,
    UNARY,
    Ints,
    Mask,
    Program,
    Step,
    apply_tg,
)
from hypothesis import reject
from hypothesis import strategies as st

MAX_SIZE = 64  # elements in any value of a program


# --- drawing programs
def _shape_of(step, shapes):
    """The shape of a step's output, from tracker_gpu's plain (untracked) path."""
    dummies = [np.full(shapes[i], 0.7) for i in step.args]
    return tuple(np.shape(apply_tg(lambda a: a)(step, dummies)))


class _Builder:
    def __init__(self, draw):
        self.draw = draw
        self.inputs = []
        self.steps = []
        self.shapes = []

    def value(self, shape, reuse=None):
        """A value of `shape` for a second operand: an existing one, or a new input."""
        draw = self.draw
        same = [i for i, s in enumerate(self.shapes) if s == shape and i != reuse]
        if same and draw(st.booleans()):
            return draw(st.sampled_from(same))
        const = draw(st.integers(0, 3)) == 0
        self.inputs.append((shape, const))
        return self.add(Step("input", (), {"index": len(self.inputs) - 1}), shape)

    def add(self, step, shape=None):
        shape = _shape_of(step, self.shapes) if shape is None else shape
        assert 0 not in shape, f"the generator made an empty value: {step}"
        if math.prod(shape) > MAX_SIZE or len(shape) > 4:
            reject()
        self.steps.append(step)
        self.shapes.append(shape)
        return len(self.steps) - 1

    def step(self, a):
        shape = self.shapes[a]
        kinds = ["unary", "binary", "reduce", "shape", "matmul", "where", "select"]
        if shape:
            kinds += ["along", "index", "index", "join", "einsum", "at"]
        kind = self.draw(st.sampled_from(kinds))
        return getattr(self, kind)(a, shape)

    def unary(self, a, shape):
        return self.add(Step(self.draw(st.sampled_from(sorted(UNARY))), (a,)))

    def binary(self, a, shape):
        draw = self.draw
        op = draw(st.sampled_from(sorted(BINARY)))
        swap = draw(st.booleans())
        if draw(st.integers(0, 4)) == 0:
            scalar = draw(st.sampled_from([-1.5, -0.5, 0.75, 2.0]))
            return self.add(Step(op, (a,), {"scalar": scalar, "swap": swap}))
        if op not in ("maximum", "minimum", "hypot", "atan2") and draw(st.integers(0, 5)) == 0:
            return self.add(Step(op, (a, a), {"swap": swap}))  # a diamond: one value used twice
        b = self.value(draw(_broadcast_partner(shape)), reuse=a)
        return self.add(Step(op, (a, b), {"swap": swap}))

    def reduce(self, a, shape):
        draw = self.draw
        op = draw(st.sampled_from(REDUCTIONS))
        return self.add(
            Step(op, (a,), {"axis": draw(_axes(len(shape))), "keepdims": draw(st.booleans())})
        )

    def along(self, a, shape):
        draw = self.draw
        op = draw(st.sampled_from(ALONG))
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        n = shape[axis]
        kw = {}
        if op == "sort":
            kw = {"descending": draw(st.booleans())}
        elif op == "roll":
            kw = {"shift": draw(st.integers(-n - 1, n + 1))}
        elif op == "take":
            kw = {"indices": Ints(draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=5)))}
        elif op == "diff" and n < 2:
            op = "flip"
        return self.add(Step(op, (a,), {"axis": axis, "kw": kw}))

    def shape(self, a, shape):
        draw = self.draw
        ndim = len(shape)
        options = ["reshape", "expand_dims", "broadcast_to"]
        options += ["permute_dims", "mT", "moveaxis"] if ndim >= 2 else []
        options += ["squeeze"] if 1 in shape else []
        op = draw(st.sampled_from(options))
        if op == "reshape":
            params = {"shape": draw(_reshapes(math.prod(shape)))}
        elif op == "expand_dims":
            params = {"axis": draw(st.integers(-ndim - 1, ndim))}
        elif op == "broadcast_to":
            params = {"shape": draw(_broadcast_targets(shape))}
        elif op == "permute_dims":
            params = {"axes": tuple(draw(st.permutations(range(ndim))))}
        elif op == "moveaxis":
            source = draw(st.integers(-ndim, ndim - 1))
            params = {"source": source, "destination": draw(st.integers(-ndim, ndim - 1))}
        elif op == "squeeze":
            params = {"axis": draw(st.sampled_from([i for i, n in enumerate(shape) if n == 1]))}
        else:
            params = {}
        return self.add(Step(op, (a,), params))

    def index(self, a, shape):
        return self.add(Step("getitem", (a,), {"key": self.draw(_keys(shape))}))

    def matmul(self, a, shape):
        draw = self.draw
        if not shape:
            return self.unary(a, shape)
        if draw(st.booleans()):  # a @ b
            k = shape[-1]
            batch = (2,) if len(shape) <= 2 else (1,)
            other = draw(st.sampled_from([(k,), (k, 2), (k, 3), batch + (k, 1)]))
            return self.add(Step("matmul", (a, self.value(other, reuse=a))))
        n = shape[0] if len(shape) == 1 else shape[-2]
        other = draw(st.sampled_from([(n,), (2, n), (3, n)]))
        return self.add(Step("matmul", (self.value(other, reuse=a), a)))

    def einsum(self, a, shape):
        """A sum over axes (the rest permuted), an outer product, a matrix product over the last
        axis (batched over the first), or a trace over the last two axes."""
        draw = self.draw
        ndim = len(shape)
        letters = "abcd"[:ndim]
        kind = draw(st.sampled_from(["sum", "outer", "contract"] + ["trace"] * (ndim >= 2)))
        if kind == "sum":
            kept = draw(st.lists(st.sampled_from(letters), max_size=ndim, unique=True))
            return self.add(Step("einsum", (a,), {"subscripts": f"{letters}->{''.join(kept)}"}))
        if kind == "trace" and shape[-1] == shape[-2]:  # "ii->" over the last two axes
            subscripts = f"{letters[:-1]}{letters[-2]}->{letters[:-2]}"
            return self.add(Step("einsum", (a,), {"subscripts": subscripts}))
        if kind == "trace":  # the trace of a @ b
            b = self.value(shape[-1:] + shape[-2:-1], reuse=a)
            subscripts = f"{letters},{letters[-1]}{letters[-2]}->{letters[:-2]}"
            return self.add(Step("einsum", (a, b), {"subscripts": subscripts}))
        m = draw(st.integers(1, 3))
        if kind == "outer":
            b = self.value((m,), reuse=a)
            return self.add(Step("einsum", (a, b), {"subscripts": f"{letters},z->{letters}z"}))
        if ndim == 3 and draw(st.booleans()):  # a batch of matrix products
            b = self.value((shape[0], shape[2], m), reuse=a)
            return self.add(Step("einsum", (a, b), {"subscripts": "abc,acz->abz"}))
        b = self.value((shape[-1], m), reuse=a)
        subscripts = f"{letters},{letters[-1]}z->{letters[:-1]}z"
        return self.add(Step("einsum", (a, b), {"subscripts": subscripts}))

    def at(self, a, shape):
        """`tg.at(x)[key].how(v)`, with `v` a number or an array that broadcasts to x[key]."""
        draw = self.draw
        how = draw(st.sampled_from(AT))
        key = draw(_keys(shape))
        params = {"key": key, "how": how}
        if how not in ("min", "max") and draw(st.integers(0, 3)) == 0:
            params["scalar"] = draw(st.sampled_from([-1.5, 0.75, 2.0]))
            return self.add(Step("at", (a,), params), shape)
        selected = _shape_of(Step("getitem", (a,), {"key": key}), self.shapes)
        dims = [draw(st.sampled_from([n, 1])) for n in selected]
        v = self.value(tuple(dims[draw(st.integers(0, len(dims))) :]), reuse=a)
        return self.add(Step("at", (a, v), params), shape)

    def where(self, a, shape):
        draw = self.draw
        scalar = draw(st.integers(0, 3)) == 0
        other = shape if scalar else draw(_broadcast_partner(shape))
        mask_shape = draw(_broadcast_partner(np.broadcast_shapes(shape, other)))
        size = math.prod(mask_shape)
        flags = np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), dtype=bool)
        mask = Mask(flags.reshape(mask_shape).tolist()) if mask_shape else bool(flags[0])
        if scalar:
            return self.add(Step("where", (a,), {"mask": mask, "scalar": 0.5}))
        b = self.value(other, reuse=a)
        return self.add(Step("where", (a, b), {"mask": mask}))

    def select(self, a, shape):
        """A `where` whose condition the values make (`fuzz_operations.select`)."""
        how = self.draw(st.sampled_from(["each", "flags"]))
        b = self.value(self.draw(_broadcast_partner(shape)), reuse=a)
        return self.add(Step("select", (a, b), {"how": how}))

    def join(self, a, shape):
        draw = self.draw
        ndim = len(shape)
        op = draw(st.sampled_from(["concat", "stack"]))
        count = draw(st.integers(1, 2))
        if op == "concat":
            axis = draw(st.integers(-ndim, ndim - 1))
            others = []
            for _ in range(count):
                other = list(shape)
                other[axis] = draw(st.integers(1, 3))
                others.append(self.value(tuple(other), reuse=a))
        else:
            axis = draw(st.integers(-ndim - 1, ndim))
            others = [self.value(shape, reuse=None) for _ in range(count)]
        position = draw(st.integers(0, count))
        args = tuple(others[:position]) + (a,) + tuple(others[position:])
        return self.add(Step(op, args, {"axis": axis}))


@st.composite
def _broadcast_partner(draw, shape):
    """A shape that broadcasts with `shape`: dims kept or made 1, leading dims dropped or added,
    and size-1 dims of `shape` grown."""
    dims = [
        draw(st.sampled_from([n, 1])) if n != 1 else draw(st.sampled_from([1, 1, 2, 3]))
        for n in shape
    ]
    dims = dims[draw(st.integers(0, len(dims))) :] if dims and draw(st.booleans()) else dims
    if len(dims) == len(shape) < 4 and draw(st.integers(0, 3)) == 0:
        dims = [draw(st.integers(1, 3))] + dims
    return tuple(dims)


@st.composite
def _broadcast_targets(draw, shape):
    dims = [draw(st.sampled_from([1, 2, 3])) if n == 1 else n for n in shape]
    lead = draw(st.integers(0, 4 - len(dims))) if len(dims) < 4 else 0
    return tuple(draw(st.integers(1, 3)) for _ in range(lead)) + tuple(dims)


@st.composite
def _axes(draw, ndim):
    if ndim == 0 or draw(st.integers(0, 3)) == 0:
        return None
    if draw(st.booleans()):
        return draw(st.integers(-ndim, ndim - 1))
    axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(a - ndim if draw(st.booleans()) else a for a in axes)


@st.composite
def _reshapes(draw, size):
    dims = []
    left = size
    for _ in range(draw(st.integers(0, 3))):
        d = draw(st.sampled_from([d for d in range(1, left + 1) if left % d == 0]))
        dims.append(d)
        left //= d
    dims.append(left)
    dims = draw(st.permutations(dims))
    if draw(st.integers(0, 3)) == 0:
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    return tuple(dims)


@st.composite
def _slices(draw, n):
    """A non-empty slice of an axis of length `n`, in one of its spellings."""
    step = draw(st.sampled_from([1, 1, 2, -1, -2]))
    start = draw(st.integers(0, n - 1))
    if step > 0:
        stop = draw(st.integers(start + 1, n))
        start = None if start == 0 and draw(st.booleans()) else start
        if stop == n:
            stop = None if draw(st.booleans()) else n
        elif draw(st.booleans()):
            stop -= n  # the same stop, counted from the end
    else:
        stop = draw(st.integers(-1, start - 1))
        stop = None if stop == -1 else stop
        start = None if start == n - 1 and draw(st.booleans()) else start
    step = None if step == 1 and draw(st.booleans()) else step
    return slice(start, stop, step)


@st.composite
def _keys(draw, shape):
    ndim = len(shape)
    mode = draw(st.sampled_from(["basic", "array", "array", "mask"]))
    if mode == "mask":
        flags = draw(st.lists(st.booleans(), min_size=math.prod(shape), max_size=math.prod(shape)))
        flags[draw(st.integers(0, len(flags) - 1))] = True
        return Mask(np.array(flags).reshape(shape).tolist())
    count = draw(st.integers(1, ndim))
    ellipsis = count < ndim and draw(st.booleans())
    axes = range(ndim - count, ndim) if ellipsis else range(count)
    array_at = draw(st.integers(0, count - 1)) if mode == "array" else None
    parts = []
    for j, axis in enumerate(axes):
        n = shape[axis]
        if j == array_at:
            index_shape = draw(st.sampled_from([(1,), (2,), (3,), (5,), (2, 2)]))
            flat = draw(
                st.lists(
                    st.integers(-n, n - 1),
                    min_size=math.prod(index_shape),
                    max_size=math.prod(index_shape),
                )
            )
            parts.append(Ints(np.array(flat).reshape(index_shape).tolist()))
        elif mode == "basic" and draw(st.booleans()):
            parts.append(draw(st.integers(-n, n - 1)))
        else:
            parts.append(draw(_slices(n)))
    if draw(st.integers(0, 3)) == 0:
        parts.insert(draw(st.integers(0, len(parts))), None)
    if ellipsis:
        parts.insert(0, Ellipsis)
    return parts[0] if len(parts) == 1 and draw(st.booleans()) else tuple(parts)


@st.composite
def programs(draw, max_steps=5):
    builder = _Builder(draw)
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    builder.inputs.append((shape, False))
    current = builder.add(Step("input", (), {"index": 0}), shape)
    for _ in range(draw(st.integers(1, max_steps))):
        if len(builder.steps) > 1 and draw(st.integers(0, 4)) == 0:
            current = draw(st.sampled_from(range(len(builder.steps))))
        current = builder.step(current)
    return Program(builder.inputs, builder.steps, draw(st.integers(0, 2**31)))
