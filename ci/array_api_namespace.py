"""The Array API conformance suite's entry point: the bare tracked namespace,
`tracker_gpu.namespace`, the very module that `array_api_compat.array_namespace(x)` returns for a
tracked NumPy array `x`. Nothing is wrapped: the suite creates its arrays with the namespace's own
creation functions, so they are tracked constants (TrackedArrays with no place on the tape), and
every operator, method and function it checks runs on them as a user's code would (the suite
checks values, dtypes and shapes, never gradients). Both extensions, `linalg` and `fft`, are
included.

To run the suite (data-apis/array-api-tests, with its `array-api` submodule of spec stubs) from a
checkout of it outside this project, with this project installed (`pip install -e .`):

    ARRAY_API_TESTS_MODULE=tracker_gpu.namespace ARRAY_API_TESTS_VERSION=2024.12 \\
    pytest array_api_tests/ -q -p no:cacheprovider --disable-warnings --max-examples 20

and the same with ARRAY_API_TESTS_MODULE=array_api_compat.numpy for NumPy's own figures; the
failures the two do not share are the tracked namespace's own.
"""

from tracker_gpu import namespace

MODULE = namespace.__name__  # "tracker_gpu.namespace": the value of ARRAY_API_TESTS_MODULE

__all__ = ["MODULE", "namespace"]
