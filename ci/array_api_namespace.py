"""The tracked namespace as the Array API conformance suite sees it: bound to NumPy, with every
array a creation function returns made a tracked leaf, so that the suite's operators, methods and
functions all run on `TrackedArray`s (float and complex arrays are leaves to differentiate with
respect to; integer and boolean arrays are tracked too, carrying no gradient).

To run the suite (data-apis/array-api-tests) against it, from a checkout of that suite (with its
`array-api` submodule), this project's root on the path:

    PYTHONPATH=/path/to/this/project \\
    ARRAY_API_TESTS_MODULE=ci.array_api_namespace ARRAY_API_TESTS_VERSION=2024.12 \\
    pytest array_api_tests/ --max-examples 20

and the same with ARRAY_API_TESTS_MODULE=array_api_compat.numpy for NumPy's own figures.
Both extensions, `linalg` and `fft`, are included.
"""

import functools
import inspect

from tracker_gpu import namespace
from tracker_gpu.backend import is_array, namespace_of
from tracker_gpu.tracked import TrackedArray

CREATION = (
    "asarray arange empty empty_like eye from_dlpack full full_like linspace ones ones_like "
    "zeros zeros_like tril triu meshgrid"
).split()


def tracked(value):
    """A plain array as a tracked leaf; anything else (tracked, tuples, lists) as it is."""
    if isinstance(value, (list, tuple)):
        return type(value)(tracked(v) for v in value)
    if is_array(value) and not isinstance(value, TrackedArray):
        return TrackedArray(value, namespace_of(value))
    return value


def _creating_tracked(function):
    @functools.wraps(function)
    def create(*args, **kw):
        return tracked(function(*args, **kw))

    create.__signature__ = inspect.signature(function)
    return create


globals().update({name: getattr(namespace, name) for name in namespace.__all__})
globals().update({name: _creating_tracked(getattr(namespace, name)) for name in CREATION})
__array_api_version__ = namespace.__array_api_version__
__array_namespace_info__ = namespace.__array_namespace_info__
linalg = namespace.linalg
fft = namespace.fft
