"""The base of the linear-algebra rules: `matrix_transpose`, `matmul`, `solve` and `inv`, and
the helpers that `linalg` and `decompositions` share.

Both of those modules build on this one, which imports neither, so the imports go one way;
`linalg` re-exports the four rules, as part of the whole extension.
"""

from ..backend import device_of, namespace_of
from ..primitive import Primitive
from ..tracked import TrackedArray, data
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


# --- products and transposes
matrix_transpose = Primitive(
    "matrix_transpose",
    lambda xp, x, /: xp.matrix_transpose(x),
    (lambda g, ans, x: matrix_transpose(g),),
    saves="",
)


def _matmul_vjp_x(g, ans, x, y):
    if y.ndim == 1:
        return g * y if x.ndim == 1 else expand_dims(g, axis=-1) * y
    if x.ndim == 1:
        return squeeze(matmul(y, expand_dims(g, axis=-1)), axis=-1)
    return matmul(g, matrix_transpose(y))


def _matmul_vjp_y(g, ans, x, y):
    if x.ndim == 1:
        return g * x if y.ndim == 1 else expand_dims(g, axis=-2) * expand_dims(x, axis=-1)
    if y.ndim == 1:
        return squeeze(matmul(matrix_transpose(x), expand_dims(g, axis=-1)), axis=-1)
    return matmul(matrix_transpose(x), g)


matmul = Primitive(
    "matmul",
    lambda xp, x, y: x @ y,
    (_matmul_vjp_x, _matmul_vjp_y),
    saves=("y", "x"),
    signature=lambda x1, x2, /: None,
)


# --- solve and inverse
def _solve_forward(xp, a, b):
    if b.ndim == 1:  # a vector, whatever a's batch shape (the standard's rule)
        return xp.linalg.solve(a, b[:, None])[..., 0]
    return xp.linalg.solve(a, b)


def _solve_adjoint(g, a, vector):
    """inv(a).T @ g: the gradient with respect to the right-hand side."""
    if vector:
        return squeeze(solve(_T(a), expand_dims(g, axis=-1)), axis=-1)
    return solve(_T(a), g)


def _solve_vjp_a(g, ans, a, b):
    gb = _solve_adjoint(g, a, b.ndim == 1)
    if b.ndim == 1:
        return -multiply(expand_dims(gb, axis=-1), expand_dims(ans, axis=-2))
    return -matmul(gb, _T(ans))


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
    at = _T(ans)
    return -matmul(matmul(at, g), at)


inv = Primitive("inv", lambda xp, x, /: xp.linalg.inv(x), (_inv_vjp,), doc="The matrix inverse.")
