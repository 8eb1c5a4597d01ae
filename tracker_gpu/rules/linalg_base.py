"""The base of the linear-algebra rules: `matrix_transpose`, `matmul`, `solve` and `inv`, and
the helpers that `linalg` and `decompositions` share.

Complex matrices follow PyTorch's convention: each vjp is the real one with every transpose of
a saved value made a conjugate transpose (`_H`) and every derivative conjugated (`_conj`); both
are the plain transpose and the value itself for real dtypes, so the real path does no extra
array operation.

Both of those modules build on this one, which imports neither, so the imports go one way;
`linalg` re-exports the four rules, as part of the whole extension.
"""

import numpy as np

from ..backend import SCALARS, device_of, is_cupy, namespace_of
from ..primitive import Primitive
from ..tracked import TrackedArray, data
from .elementwise import conjugate_derivative as _conj
from .elementwise import multiply
from .shape import expand_dims, squeeze

__all__ = ["matrix_transpose", "matmul", "solve", "inv"]


# --- helpers: constants of the derivative are built from plain values, on the data's device
def _xp(x):
    return namespace_of(data(x))


def _tracked(*args):
    return any(isinstance(a, TrackedArray) for a in args)


def _eye(like, n, k=0):
    x = data(like)
    return namespace_of(x).eye(n, k=k, dtype=x.dtype, device=device_of(x))


def _T(x):
    return matrix_transpose(x)


def _H(x):
    """The conjugate transpose of complex `x`, the transpose of real `x`."""
    return matrix_transpose(_conj(x))


# --- products and transposes
matrix_transpose = Primitive(
    "matrix_transpose",
    lambda xp, x, /: xp.matrix_transpose(x),
    (lambda g, ans, x: matrix_transpose(g),),
    saves="",
)


def _matmul_vjp_x(g, ans, x, y):  # g @ y^H
    y = _conj(y)
    if y.ndim == 1:
        return g * y if x.ndim == 1 else expand_dims(g, axis=-1) * y
    if x.ndim == 1:
        return squeeze(matmul(y, expand_dims(g, axis=-1)), axis=-1)
    return matmul(g, matrix_transpose(y))


def _matmul_vjp_y(g, ans, x, y):  # x^H @ g
    x = _conj(x)
    if x.ndim == 1:
        return g * x if y.ndim == 1 else expand_dims(g, axis=-2) * expand_dims(x, axis=-1)
    if y.ndim == 1:
        return squeeze(matmul(matrix_transpose(x), expand_dims(g, axis=-1)), axis=-1)
    return matmul(matrix_transpose(x), g)


def _matmul_forward(xp, x, y):
    # The namespace's matmul promotes a real operand with a complex one (PyTorch's @ refuses),
    # and on CuPy it is where a CUDA graph's capture is cut (compiler/graphs.py).
    if type(x) in SCALARS or type(y) in SCALARS:  # NumPy's @ refuses them too
        raise TypeError("matmul of a Python number: multiply by it with * instead")
    return x @ y if x.dtype == y.dtype and not is_cupy(x) else xp.matmul(x, y)


matmul = Primitive(
    "matmul",
    _matmul_forward,
    (_matmul_vjp_x, _matmul_vjp_y),
    saves=("y", "x"),
    signature=lambda x1, x2, /: None,
)


# --- solve and inverse
def _solve_forward(xp, a, b):
    """The standard's solve on any library: CuPy's takes neither a vector against a batch of
    matrices nor batch dimensions to broadcast, so both are made explicit here."""
    if b.ndim == 1:  # a vector, whatever a's batch shape (the standard's rule)
        return _solve_forward(xp, a, b[:, None])[..., 0]
    if tuple(a.shape[:-2]) != tuple(b.shape[:-2]):
        batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
        a = xp.broadcast_to(a, batch + tuple(a.shape[-2:]))
        b = xp.broadcast_to(b, batch + tuple(b.shape[-2:]))
    return xp.linalg.solve(a, b)


def _solve_adjoint(g, a, vector):
    """inv(a)^H @ g: the gradient with respect to the right-hand side."""
    if vector:
        return squeeze(solve(_H(a), expand_dims(g, axis=-1)), axis=-1)
    return solve(_H(a), g)


def _solve_vjp_a(g, ans, a, b):
    gb = _solve_adjoint(g, a, b.ndim == 1)
    if b.ndim == 1:
        return -multiply(expand_dims(gb, axis=-1), expand_dims(_conj(ans), axis=-2))
    return -matmul(gb, _H(ans))


solve = Primitive(
    "solve",
    _solve_forward,
    (_solve_vjp_a, lambda g, ans, a, b: _solve_adjoint(g, a, b.ndim == 1)),
    saves=("ans a", "a"),
    doc="Solve `x1 @ out = x2` for square `x1` (..., M, M); `x2` is a vector (M,) or a "
    "batch of matrices (..., M, K).",
    signature=lambda x1, x2, /: None,
)


def _inv_vjp(g, ans, x):
    at = _H(ans)
    return -matmul(matmul(at, g), at)


inv = Primitive("inv", lambda xp, x, /: xp.linalg.inv(x), (_inv_vjp,), doc="The matrix inverse.")
