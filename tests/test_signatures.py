"""Every function of the tracked namespace has the standard's signature (version 2024.12):
the same parameter names, defaults, positional-only `/` and keyword-only `*` markers.

The table is the standard's own text (its function stubs), one signature a line; the inspection
functions of `__array_namespace_info__` are the array library's and are not listed.
"""

import inspect

import pytest

import tracker_gpu as tg

STANDARD_2024_12 = (
    "abs(x, /)",
    "acos(x, /)",
    "acosh(x, /)",
    "add(x1, x2, /)",
    "all(x, /, *, axis=None, keepdims=False)",
    "any(x, /, *, axis=None, keepdims=False)",
    "arange(start, /, stop=None, step=1, *, dtype=None, device=None)",
    "argmax(x, /, *, axis=None, keepdims=False)",
    "argmin(x, /, *, axis=None, keepdims=False)",
    "argsort(x, /, *, axis=-1, descending=False, stable=True)",
    "asarray(obj, /, *, dtype=None, device=None, copy=None)",
    "asin(x, /)",
    "asinh(x, /)",
    "astype(x, dtype, /, *, copy=True, device=None)",
    "atan(x, /)",
    "atan2(x1, x2, /)",
    "atanh(x, /)",
    "bitwise_and(x1, x2, /)",
    "bitwise_invert(x, /)",
    "bitwise_left_shift(x1, x2, /)",
    "bitwise_or(x1, x2, /)",
    "bitwise_right_shift(x1, x2, /)",
    "bitwise_xor(x1, x2, /)",
    "broadcast_arrays(*arrays)",
    "broadcast_to(x, /, shape)",
    "can_cast(from_, to, /)",
    "ceil(x, /)",
    "clip(x, /, min=None, max=None)",
    "concat(arrays, /, *, axis=0)",
    "conj(x, /)",
    "copysign(x1, x2, /)",
    "cos(x, /)",
    "cosh(x, /)",
    "count_nonzero(x, /, *, axis=None, keepdims=False)",
    "cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False)",
    "cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False)",
    "diff(x, /, *, axis=-1, n=1, prepend=None, append=None)",
    "divide(x1, x2, /)",
    "empty(shape, *, dtype=None, device=None)",
    "empty_like(x, /, *, dtype=None, device=None)",
    "equal(x1, x2, /)",
    "exp(x, /)",
    "expand_dims(x, /, axis)",
    "expm1(x, /)",
    "eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None)",
    "fft.fft(x, /, *, n=None, axis=-1, norm='backward')",
    "fft.fftfreq(n, /, *, d=1.0, dtype=None, device=None)",
    "fft.fftn(x, /, *, s=None, axes=None, norm='backward')",
    "fft.fftshift(x, /, *, axes=None)",
    "fft.hfft(x, /, *, n=None, axis=-1, norm='backward')",
    "fft.ifft(x, /, *, n=None, axis=-1, norm='backward')",
    "fft.ifftn(x, /, *, s=None, axes=None, norm='backward')",
    "fft.ifftshift(x, /, *, axes=None)",
    "fft.ihfft(x, /, *, n=None, axis=-1, norm='backward')",
    "fft.irfft(x, /, *, n=None, axis=-1, norm='backward')",
    "fft.irfftn(x, /, *, s=None, axes=None, norm='backward')",
    "fft.rfft(x, /, *, n=None, axis=-1, norm='backward')",
    "fft.rfftfreq(n, /, *, d=1.0, dtype=None, device=None)",
    "fft.rfftn(x, /, *, s=None, axes=None, norm='backward')",
    "finfo(type, /)",
    "flip(x, /, *, axis=None)",
    "floor(x, /)",
    "floor_divide(x1, x2, /)",
    "from_dlpack(x, /, *, device=None, copy=None)",
    "full(shape, fill_value, *, dtype=None, device=None)",
    "full_like(x, /, fill_value, *, dtype=None, device=None)",
    "greater(x1, x2, /)",
    "greater_equal(x1, x2, /)",
    "hypot(x1, x2, /)",
    "iinfo(type, /)",
    "imag(x, /)",
    "isdtype(dtype, kind)",
    "isfinite(x, /)",
    "isinf(x, /)",
    "isnan(x, /)",
    "less(x1, x2, /)",
    "less_equal(x1, x2, /)",
    "linalg.cholesky(x, /, *, upper=False)",
    "linalg.cross(x1, x2, /, *, axis=-1)",
    "linalg.det(x, /)",
    "linalg.diagonal(x, /, *, offset=0)",
    "linalg.eigh(x, /)",
    "linalg.eigvalsh(x, /)",
    "linalg.inv(x, /)",
    "linalg.matmul(x1, x2, /)",
    "linalg.matrix_norm(x, /, *, keepdims=False, ord='fro')",
    "linalg.matrix_power(x, n, /)",
    "linalg.matrix_rank(x, /, *, rtol=None)",
    "linalg.matrix_transpose(x, /)",
    "linalg.outer(x1, x2, /)",
    "linalg.pinv(x, /, *, rtol=None)",
    "linalg.qr(x, /, *, mode='reduced')",
    "linalg.slogdet(x, /)",
    "linalg.solve(x1, x2, /)",
    "linalg.svd(x, /, *, full_matrices=True)",
    "linalg.svdvals(x, /)",
    "linalg.tensordot(x1, x2, /, *, axes=2)",
    "linalg.trace(x, /, *, offset=0, dtype=None)",
    "linalg.vecdot(x1, x2, /, *, axis=-1)",
    "linalg.vector_norm(x, /, *, axis=None, keepdims=False, ord=2)",
    "linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True)",
    "log(x, /)",
    "log10(x, /)",
    "log1p(x, /)",
    "log2(x, /)",
    "logaddexp(x1, x2, /)",
    "logical_and(x1, x2, /)",
    "logical_not(x, /)",
    "logical_or(x1, x2, /)",
    "logical_xor(x1, x2, /)",
    "matmul(x1, x2, /)",
    "matrix_transpose(x, /)",
    "max(x, /, *, axis=None, keepdims=False)",
    "maximum(x1, x2, /)",
    "mean(x, /, *, axis=None, keepdims=False)",
    "meshgrid(*arrays, indexing='xy')",
    "min(x, /, *, axis=None, keepdims=False)",
    "minimum(x1, x2, /)",
    "moveaxis(x, source, destination, /)",
    "multiply(x1, x2, /)",
    "negative(x, /)",
    "nextafter(x1, x2, /)",
    "nonzero(x, /)",
    "not_equal(x1, x2, /)",
    "ones(shape, *, dtype=None, device=None)",
    "ones_like(x, /, *, dtype=None, device=None)",
    "permute_dims(x, /, axes)",
    "positive(x, /)",
    "pow(x1, x2, /)",
    "prod(x, /, *, axis=None, dtype=None, keepdims=False)",
    "real(x, /)",
    "reciprocal(x, /)",
    "remainder(x1, x2, /)",
    "repeat(x, repeats, /, *, axis=None)",
    "reshape(x, /, shape, *, copy=None)",
    "result_type(*arrays_and_dtypes)",
    "roll(x, /, shift, *, axis=None)",
    "round(x, /)",
    "searchsorted(x1, x2, /, *, side='left', sorter=None)",
    "sign(x, /)",
    "signbit(x, /)",
    "sin(x, /)",
    "sinh(x, /)",
    "sort(x, /, *, axis=-1, descending=False, stable=True)",
    "sqrt(x, /)",
    "square(x, /)",
    "squeeze(x, /, axis)",
    "stack(arrays, /, *, axis=0)",
    "std(x, /, *, axis=None, correction=0.0, keepdims=False)",
    "subtract(x1, x2, /)",
    "sum(x, /, *, axis=None, dtype=None, keepdims=False)",
    "take(x, indices, /, *, axis=None)",
    "take_along_axis(x, indices, /, *, axis=-1)",
    "tan(x, /)",
    "tanh(x, /)",
    "tensordot(x1, x2, /, *, axes=2)",
    "tile(x, repetitions, /)",
    "tril(x, /, *, k=0)",
    "triu(x, /, *, k=0)",
    "trunc(x, /)",
    "unique_all(x, /)",
    "unique_counts(x, /)",
    "unique_inverse(x, /)",
    "unique_values(x, /)",
    "unstack(x, /, *, axis=0)",
    "var(x, /, *, axis=None, correction=0.0, keepdims=False)",
    "vecdot(x1, x2, /, *, axis=-1)",
    "where(condition, x1, x2, /)",
    "zeros(shape, *, dtype=None, device=None)",
    "zeros_like(x, /, *, dtype=None, device=None)",
)


def _parse(line):
    """`name(params)` as (name, inspect.Signature)."""
    name, _, params = line.partition("(")
    scope = {}
    exec(f"def f({params[:-1]}): pass", scope)  # the standard's text, as Python reads it
    return name, inspect.signature(scope["f"])


def _found(namespace, dotted):
    head, _, name = dotted.rpartition(".")
    scope = getattr(namespace, head, None) if head else namespace
    return None if scope is None else getattr(scope, name, None)


@pytest.mark.parametrize("line", STANDARD_2024_12, ids=lambda line: line.partition("(")[0])
def test_the_namespace_has_the_standards_signature(backend, line):
    namespace = tg.param(backend.asarray([1.0])).__array_namespace__()
    name, standard = _parse(line)
    if name.startswith("fft.") and getattr(namespace, "fft", None) is None:
        pytest.skip("the tracked namespace has no fft extension yet")
    function = _found(namespace, name)
    assert function is not None, f"the tracked namespace lacks {name}"
    assert str(inspect.signature(function)) == str(standard), name


def test_the_table_is_read_as_the_standard_writes_it():
    name, signature = _parse("reshape(x, /, shape, *, copy=None)")
    kinds = [p.kind for p in signature.parameters.values()]
    assert name == "reshape"
    assert kinds == [
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    ]
    assert signature.parameters["copy"].default is None
