"""tracker_gpu: reverse-mode automatic differentiation over any Array API library.

>>> import numpy as np, tracker_gpu as tg
>>> tg.gradient(lambda x: tg.sum(x**2) + tg.prod(x[1:]), np.array([1.0, 2.0, 3.0]))
(array([2., 7., 8.]),)
"""

# isort: skip_file
# `tracked` first: the rule modules build on it, and it binds its operators to them.
from .tracked import TrackedArray, grad, isleaf, istracked, param, update, zero_grad
from .tracked import user_data as data
from .custom import rule
from . import operators  # binds Python's operators to TrackedArray
from . import namespace, testing
from .namespace import *
from .api import NestedDerivativeError, WithGradient, back, gradient, nobacksies
from .api import withgradient
from .params import Grads, Params
from .broadcast import broadcast
from .rules.indexed import at
from .checks import sync_checks
from .functional import checkpoint, forward, hessian, hook, hvp, jacobian, notrack, stop_gradient
from .forward_mode import jacfwd, jvp
from .compiler import RecordingError, compile
from .tape import BackError, PullbackError
from . import nn, optim
from . import precision
from .precision import LossScale, Policy

__version__ = "0.1.0"
