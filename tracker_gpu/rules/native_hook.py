"""How a rule's NumPy code hands its arrays to the native loops of its opened form and takes
their result, or goes on where they do not take them. The loops are the compiler's
(`compiler/native_rules.py`), a layer above the rules: that module installs itself here when
the package is imported, so that the rules import nothing above them.

>>> import numpy as np
>>> native("gelu", np.zeros(3)) is None  # fewer than FROM elements: the rule's own code
True
"""

import numpy as np

__all__ = ["native", "install", "FROM"]

FROM = 1024  # fewer elements stay NumPy's: a loop's call costs about 2 us
_installed = []  # the module whose `run` computes a rule natively


def install(module):
    """Make `module.run(name, *arrays, **kw)` compute the rules natively (None: it does not)."""
    _installed[:] = [module]


def native(name, *arrays, **kw):
    """Rule `name` of `arrays` by its native loops, or None: the rule's NumPy code then runs."""
    first = arrays[0]
    if type(first) is not np.ndarray or first.size < FROM or not _installed:
        return None
    return _installed[0].run(name, *arrays, **kw)
