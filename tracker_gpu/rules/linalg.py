"""Linear algebra: matmul (every vector/matrix/batch combination), matrix_transpose,
tensordot, vecdot.

>>> import numpy as np, tracker_gpu as tg
>>> A = np.array([[1.0, 2.0], [3.0, 4.0]])
>>> tg.gradient(lambda x: tg.sum(A @ x), np.array([1.0, 1.0]))[0]
array([4., 6.])
"""

from ..tracked import Primitive
from .elementwise import multiply
from .reductions import sum as _sum
from .shape import expand_dims, permute_dims, reshape, squeeze

matrix_transpose = Primitive(
    "matrix_transpose",
    lambda xp, x: xp.matrix_transpose(x),
    (lambda g, ans, x: matrix_transpose(g),),
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


matmul = Primitive("matmul", lambda xp, x, y: x @ y, (_matmul_vjp_x, _matmul_vjp_y))


def tensordot(x1, x2, /, *, axes=2):
    """Contract `axes` of `x1` with those of `x2` (an int: the last of x1 with the first of x2)."""
    if isinstance(axes, int):
        a1 = tuple(range(x1.ndim - axes, x1.ndim))
        a2 = tuple(range(axes))
    else:
        a1 = tuple(a % x1.ndim for a in axes[0])
        a2 = tuple(a % x2.ndim for a in axes[1])
    free1 = tuple(a for a in range(x1.ndim) if a not in a1)
    free2 = tuple(a for a in range(x2.ndim) if a not in a2)
    k = 1
    for a in a1:
        k *= x1.shape[a]
    left = reshape(permute_dims(x1, free1 + a1), (-1, k))
    right = reshape(permute_dims(x2, a2 + free2), (k, -1))
    out_shape = tuple(x1.shape[a] for a in free1) + tuple(x2.shape[a] for a in free2)
    return reshape(matmul(left, right), out_shape)


def vecdot(x1, x2, /, *, axis=-1):
    """The dot product of `x1` and `x2` along `axis` (real arrays), with broadcasting."""
    return _sum(multiply(x1, x2), axis=axis)
