"""The Array API namespace over tracked arrays: `x.__array_namespace__()` returns this module.

Functions accept tracked and plain arrays alike; they record on the tape when any argument is
tracked and return plain arrays otherwise.
"""

from .rules import linalg  # noqa: F401  (the standard's linalg extension)
from .rules.elementwise import *  # noqa: F403
from .rules.elementwise import PLAIN_FUNCTIONS
from .rules.linalg import matmul, matrix_transpose, tensordot, vecdot  # noqa: F401
from .rules.manipulation import *  # noqa: F403
from .rules.nn import logsoftmax, logsumexp, relu, sigmoid, softmax  # noqa: F401
from .rules.reductions import max, mean, min, prod, std, sum, var  # noqa: F401
from .rules.shape import (  # noqa: F401
    broadcast_to,
    concat,
    expand_dims,
    flip,
    permute_dims,
    reshape,
    squeeze,
    stack,
    to_device,
)

globals().update(PLAIN_FUNCTIONS)
