"""`einsum`: Einstein summation, NumPy's semantics, differentiable to any order.

The subscripts are parsed once (implicit output, `...`) into an explicit form with letters only,
and one primitive records the contraction. The vjp of operand `i` is itself an einsum of the
incoming gradient with the other operands, so a nested pass (`nest=True`) differentiates it
again. Three things an einsum output cannot say are given to it as constant operands:

- a letter of operand `i` that no other operand nor the output has (it was summed away), or
  that has size 1 in all of them and not in `i` (broadcast), comes back by a vector of ones
  over it (the gradient is the same along it);
- a letter of size 1 in operand `i` and larger elsewhere (`i` was broadcast along it) is
  summed: renamed in the output, with a ones vector of length 1 over the new letter;
- a letter repeated within operand `i` (a diagonal, a trace `"ii->"`) is renamed in the output
  and tied to its first occurrence by an identity matrix (the gradient is zero off the
  diagonal).

The forward calls the library's `einsum` (NumPy, CuPy, PyTorch, Dask). Libraries without one
(array-api-strict) get a composition of standard functions: repeated letters are read off the
diagonal with an identity mask, letters no later operand needs are summed away at once, and
each pair is contracted by `matmul` over its shared letters.

>>> import numpy as np, tracker_gpu as tg
>>> A = np.array([[1.0, 2.0], [3.0, 4.0]])
>>> tg.einsum("ij,jk->ik", A, A)
array([[ 7., 10.],
       [15., 22.]])
>>> tg.einsum("ii", A)  # the trace (implicit output: no letter appears once)
array(5.)
>>> tg.gradient(lambda x: tg.einsum("ii->", x), A)[0]
array([[1., 0.],
       [0., 1.]])
"""

import math
import string

import numpy as np

from ..backend import device_of, namespace_of
from ..primitive import ByPosition, Primitive
from ..tracked import data
from .elementwise import conjugate_derivative

__all__ = ["einsum"]

LETTERS = string.ascii_letters


# --- parsing
def parse(subscripts, shapes):
    """`(inputs, output)`: one string of letters per operand and the output's, with `...`
    expanded into fresh letters (right-aligned, so that operands with fewer dimensions there
    broadcast, as in NumPy) and the implicit output made explicit."""
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts must be a string, got {type(subscripts).__name__}")
    text = subscripts.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(shapes):
        raise ValueError(
            f"einsum: {subscripts!r} names {len(inputs)} operands, but {len(shapes)} were given"
        )
    for part in inputs + ([rhs] if arrow else []):
        bad = set(part.replace("...", "")) - set(LETTERS)
        if bad or part.count("...") > 1:
            raise ValueError(
                f"einsum: invalid subscripts {subscripts!r}: use letters a-z, A-Z and at most "
                f"one '...' per operand"
            )
    used = set(text) & set(LETTERS)
    fresh = [c for c in LETTERS if c not in used]
    ellipsis_ndim = 0
    for part, shape in zip(inputs, shapes):
        named = len(part.replace("...", ""))
        if "..." in part:
            ellipsis_ndim = max(ellipsis_ndim, len(shape) - named)
        elif named != len(shape):
            raise ValueError(
                f"einsum: operand subscripts {part!r} name {named} dimensions, but the operand "
                f"has {len(shape)} (shape {tuple(shape)})"
            )
        if named > len(shape):
            raise ValueError(
                f"einsum: operand subscripts {part!r} name more dimensions than the operand's "
                f"{len(shape)}"
            )
    if ellipsis_ndim > len(fresh):
        raise ValueError("einsum: too many dimensions under '...' (52 letters in all)")
    broadcast = "".join(fresh[:ellipsis_ndim])
    expanded = []
    for part, shape in zip(inputs, shapes):
        if "..." in part:
            k = len(shape) - len(part.replace("...", ""))
            part = part.replace("...", broadcast[ellipsis_ndim - k :])
        expanded.append(part)
    if arrow:
        if "..." in rhs:
            rhs = rhs.replace("...", broadcast)
        elif broadcast:
            raise ValueError(
                f"einsum: {subscripts!r}: the operands have dimensions under '...' that the "
                f"output does not name; write '...' in the output too"
            )
        output = rhs
        letters = set("".join(expanded))
        for c in output:
            if c not in letters:
                raise ValueError(f"einsum: output letter {c!r} appears in no operand")
            if output.count(c) > 1:
                raise ValueError(f"einsum: output letter {c!r} appears more than once")
    else:
        joined = "".join(inputs).replace("...", "")
        once = sorted(c for c in set(joined) if joined.count(c) == 1)  # by code: A-Z, a-z
        output = broadcast + "".join(once)
    return expanded, output


def _sizes(inputs, shapes):
    sizes = {}
    for part, shape in zip(inputs, shapes):
        for c, n in zip(part, shape):
            if sizes.get(c, 1) == 1:
                sizes[c] = n
            elif n not in (1, sizes[c]):
                raise ValueError(
                    f"einsum: letter {c!r} has size {sizes[c]} in one operand and {n} in another"
                )
    return sizes


# --- the forward
def _forward(xp, *operands, subscripts):
    native = getattr(xp, "einsum", None)
    if len({x.dtype for x in operands}) > 1:  # real with complex: PyTorch's einsum refuses
        dtype = xp.result_type(*operands)
        operands = [x if x.dtype == dtype else xp.astype(x, dtype) for x in operands]
    if native is None:
        return _composed(xp, subscripts, operands)
    if xp is np:  # an array, not a NumPy scalar, for a 0-d result
        return np.asarray(np.einsum(subscripts, *operands, optimize=len(operands) > 2))
    return native(subscripts, *operands)


def _composed(xp, subscripts, operands):
    """einsum from standard functions, for libraries without one."""
    lhs, _, output = subscripts.partition("->")
    inputs = lhs.split(",")
    terms = [_diagonals(xp, x, part) for x, part in zip(operands, inputs)]
    sizes = _sizes([p for _, p in terms], [x.shape for x, _ in terms])
    acc, acc_letters = None, ""
    for k, (x, letters) in enumerate(terms):
        later = output + "".join(p for _, p in terms[k + 1 :])
        keep = acc_letters + later
        x, letters = _sum_away(xp, x, letters, keep)
        if acc is None:
            acc, acc_letters = x, letters
        else:
            acc, acc_letters = _pair(xp, acc, acc_letters, x, letters, later, sizes)
    acc, acc_letters = _sum_away(xp, acc, acc_letters, output)
    acc = xp.permute_dims(acc, tuple(acc_letters.index(c) for c in output))
    shape = tuple(sizes[c] for c in output)
    return acc if tuple(acc.shape) == shape else xp.broadcast_to(acc, shape)


def _diagonals(xp, x, letters):
    """`x` with each repeated letter read off its diagonal: `(array, unique letters)`."""
    while len(set(letters)) < len(letters):
        c = next(c for c in letters if letters.count(c) > 1)
        a = letters.index(c)
        b = letters.index(c, a + 1)
        rest = [i for i in range(len(letters)) if i not in (a, b)]
        x = xp.permute_dims(x, tuple(rest) + (a, b))
        n = x.shape[-1]
        eye = xp.eye(n, dtype=x.dtype, device=device_of(x))
        x = xp.sum(x * eye, axis=-1)
        letters = "".join(letters[i] for i in rest) + c
    return x, letters


def _sum_away(xp, x, letters, keep):
    axes = tuple(i for i, c in enumerate(letters) if c not in keep)
    if not axes:
        return x, letters
    return xp.sum(x, axis=axes), "".join(c for c in letters if c in keep)


def _pair(xp, x, xl, y, yl, later, sizes):
    """Contract `x` (letters `xl`) with `y` (`yl`) by one matmul: shared letters that `later`
    needs are batch dimensions, the other shared ones are summed."""
    batch = [c for c in xl if c in yl and c in later]
    summed = [c for c in xl if c in yl and c not in later]
    left = [c for c in xl if c not in yl]
    right = [c for c in yl if c not in xl]

    def arrange(a, letters, order):
        a = xp.permute_dims(a, tuple(letters.index(c) for c in order))
        shape = tuple(sizes[c] for c in order)
        return a if tuple(a.shape) == shape else xp.broadcast_to(a, shape)

    nb, nl, ns, nr = (math.prod(sizes[c] for c in part) for part in (batch, left, summed, right))
    a = xp.reshape(arrange(x, xl, batch + left + summed), (nb, nl, ns))
    b = xp.reshape(arrange(y, yl, batch + summed + right), (nb, ns, nr))
    out = xp.reshape(xp.matmul(a, b), tuple(sizes[c] for c in batch + left + right))
    return out, "".join(batch + left + right)


# --- the pullback
def _vjp(i, g, ans, *operands, subscripts):
    lhs, _, output = subscripts.partition("->")
    inputs = lhs.split(",")
    target = inputs[i]
    shape = tuple(operands[i].shape)
    fresh = iter(c for c in LETTERS if c not in subscripts)
    parts = [output] + [p for j, p in enumerate(inputs) if j != i]
    # einsum is linear in each operand: the vjp contracts g with the others' conjugates
    args = [g] + [conjugate_derivative(x) for j, x in enumerate(operands) if j != i]
    x = data(g)
    xp, device = namespace_of(x), device_of(x)
    renamed = ""
    for axis, c in enumerate(target):
        if c in renamed:  # a repeated letter: a new one, tied to the first by an identity
            new = next(fresh)
            parts.append(c + new)
            args.append(xp.eye(shape[axis], dtype=x.dtype, device=device))
            c = new
        renamed += c
    renamed = _own_shape(parts, args, renamed, shape, fresh,
                         lambda n: xp.ones((n,), dtype=x.dtype, device=device))  # fmt: skip
    return _einsum(*args, subscripts=",".join(parts) + "->" + renamed)


def _own_shape(parts, args, letters, shape, fresh, ones):
    """The output letters that give a vjp's einsum (`parts` of `args`, appended to) the operand's
    `shape`, its `letters` otherwise. A letter the einsum lacks (summed away in the forward), or
    has of size 1 where the operand's is larger, comes by `ones` over it (the gradient is
    constant along it; einsum broadcasts the size-1 axes); one of size 1 in the operand and
    larger in the einsum (the operand was broadcast) is summed, a fresh letter of size 1 in its
    place."""
    sizes = _sizes(parts, [tuple(a.shape) for a in args])
    out = ""
    for c, n in zip(letters, shape):
        if sizes.get(c) != n:
            if c in sizes and n == 1:
                c = next(fresh)
            parts.append(c)
            args.append(ones(n))
        out += c
    return out


_einsum = Primitive("einsum", _forward, ByPosition(_vjp), saves=None)


def einsum(subscripts, /, *operands):
    """Einstein summation over tracked and plain arrays, as `numpy.einsum`.

    Explicit (`"ij,jk->ik"`) and implicit (`"ij,jk"`: the output holds the letters that appear
    once, in alphabetical order) forms, `...` for broadcast dimensions, repeated letters within
    an operand (diagonals, traces). Differentiable to any order. `optimize` and the other
    keywords of `numpy.einsum` are not taken; a letter may not repeat in the output.

    >>> import numpy as np, tracker_gpu as tg
    >>> x, y = np.array([1.0, 2.0]), np.array([3.0, 4.0, 5.0])
    >>> tg.einsum("i,j->ij", x, y).shape
    (2, 3)
    >>> tg.gradient(lambda a, b: tg.einsum("i,j->", a, b), x, y)
    (array([12., 12.]), array([3., 3., 3.]))
    """
    if not operands:
        raise ValueError("einsum: no operands")
    shapes = [tuple(x.shape) for x in operands]
    inputs, output = parse(subscripts, shapes)
    _sizes(inputs, shapes)
    return _einsum(*operands, subscripts=",".join(inputs) + "->" + output)
