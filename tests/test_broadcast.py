"""`tg.broadcast`: a user's scalar function as one tape node, traced once, differentiated
symbolically; on the GPU one generated kernel each way (checked here with NVRTC and a host
build of the same generated code)."""

import math
import sys
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
from domain import assert_agree, domain
from test_kernels import GENERATED_ARCH, compile_with_nvrtc

import tracker_gpu as tg
from tracker_gpu.broadcast import _CACHE
from tracker_gpu.cuda import codegen, generic_only, host, on_host, recording
from tracker_gpu.testing import gradcheck

broadcast_module = sys.modules["tracker_gpu.broadcast"]  # tg.broadcast is the function


def softplus_mix(x, y):
    return tg.log1p(tg.exp(-tg.abs(x))) + tg.maximum(x, 0.0) * y - tg.tanh(y) / (y * y + 1.0)


def gated(x, y, z):
    return tg.where(x > y, tg.sigmoid(x) * z, tg.relu(y) ** 2 + tg.sin(z))


def power(x, y):
    return (x * x + 1.0) ** (y * 0.5) - tg.sqrt(x * x + 2.0) * tg.cos(y)


FUNCTIONS = {
    "softplus_mix": (softplus_mix, [(4, 3), (3,)]),
    "gated": (gated, [(5,), (5,), ()]),
    "power": (power, [(2, 1, 3), (1, 4, 1)]),
}


def inputs(backend, shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [backend.asarray(rng.uniform(-1.5, 1.5, s)) for s in shapes]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_broadcast_matches_finite_differences(backend, name):
    f, shapes = FUNCTIONS[name]
    xs = inputs(backend, shapes)
    assert gradcheck(lambda *a: tg.broadcast(f, *a), *xs)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_broadcast_agrees_with_the_unfused_function(backend, name):
    f, shapes = FUNCTIONS[name]
    xs = inputs(backend, shapes, seed=1)
    fused = tg.gradient(lambda *a: tg.sum(tg.broadcast(f, *a)), *xs)
    plain = tg.gradient(lambda *a: tg.sum(f(*a)), *xs)
    for a, b in zip(fused, plain):
        assert np.allclose(backend.to_numpy(a), backend.to_numpy(b), rtol=1e-12, atol=1e-12)
        assert tg.backend.device_of(tg.data(a)) == backend.device


def test_one_node_and_one_trace():
    calls = []

    def f(x, y):
        calls.append(1)
        return tg.exp(x) * y + x

    x, y = tg.param(np.ones(3)), tg.param(np.ones(3))
    out = tg.broadcast(f, x, y)
    assert out._node.args == (x._node, y._node)  # one node whose parents are the arguments
    tg.broadcast(f, x, y)
    assert len(calls) == 1  # traced once for this dtype signature
    tg.broadcast(f, np.ones(3, dtype=np.float32), np.ones(3, dtype=np.float32))
    assert len(calls) == 2


def test_second_derivatives_through_broadcast():
    x = np.linspace(-1.0, 1.0, 5)
    fused = tg.hessian(lambda x: tg.sum(tg.broadcast(lambda v: tg.sin(v) * v**3, x)), x)
    assert np.allclose(np.diag(fused), -np.sin(x) * x**3 + 6 * np.cos(x) * x**2 + 6 * np.sin(x) * x)


def test_a_negative_zero_number_stays_negative_where_a_fill_drops_its_sign(backend):
    """CuPy fills any zero with a memset (-0.0 becomes +0.0): the generic path's Python numbers
    and the fused path's device scalars keep a negative zero, as the plain expression does."""
    memset = SimpleNamespace(
        full=lambda shape, value, **kw: np.full(shape, 0.0 if value == 0 else value, **kw),
        zeros=np.zeros,
    )
    assert np.signbit(tg.backend.full_exactly(memset, (), -0.0, dtype=np.float32))
    x = backend.asarray([0.0, -0.0, 1.0])
    with generic_only():
        value = tg.data(tg.broadcast(lambda a, b: tg.where(a > 5, a, b), x, -0.0))
    assert np.signbit(backend.to_numpy(value)).all()


def test_python_numbers_as_arguments():
    (g,) = tg.gradient(lambda x: tg.sum(tg.broadcast(lambda a, k: a * k + k, x, 3.0)), np.ones(2))
    assert np.allclose(g, 3.0)


def test_equality_operators_trace_and_a_truth_value_is_refused(backend):
    f = lambda a, b: tg.where(a == b, a, 0.0) + tg.where(a != b, b * 2.0, 0.0)
    x, y = backend.asarray([1.0, 2.0, np.nan]), backend.asarray([1.0, 3.0, np.nan])
    value = backend.to_numpy(tg.broadcast(f, x, y))
    assert np.array_equal(value, [1.0, 6.0, np.nan], equal_nan=True)
    with pytest.raises(TypeError, match="no truth value inside f; select with tg.where"):
        tg.broadcast(lambda a: a if a > 0.0 else -a, x)


def test_python_numbers_alone_in_a_nested_pass(backend):
    """log(0) and exp(-inf) on a number: IEEE arithmetic, in second derivatives too."""
    f = lambda a, k: a * a * tg.exp(tg.log(k)) + a * a
    x = backend.asarray([1.0, 2.0])
    with np.errstate(divide="ignore"):
        hessian = tg.hessian(lambda x: tg.sum(tg.broadcast(f, x, 0.0)), x)
    assert np.array_equal(backend.to_numpy(hessian), 2.0 * np.eye(2))


def test_unsupported_functions_are_named():
    with pytest.raises(TypeError, match="'sum' is not an elementwise function"):
        tg.broadcast(lambda x: tg.sum(x), np.ones(2))


def generated(name):
    f, shapes = FUNCTIONS[name]
    tg.broadcast(f, *(np.ones(s) for s in shapes))
    return next(c for (fn, _), c in _CACHE.items() if fn is f)


def generated_sources(compiled, n):
    """The texts CuPy would compile for `compiled` on n arrays: forward, and backward for each
    set of tracked arguments the tests use (all, and the first alone)."""
    arrays = (False,) * n
    needed = [(True,) * n, (True,) + (False,) * (n - 1)]
    backward = [codegen.family(compiled, arrays, m) for m in needed]
    return [codegen.family(compiled, arrays), *backward]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_generated_kernels_compile_with_nvrtc(name):
    compiled = generated(name)
    for text in generated_sources(compiled, len(compiled.partials)):
        compile_with_nvrtc(text, name, GENERATED_ARCH)


def test_constants_inf_and_nan_compile_and_compute():
    f = lambda x: tg.where(x > 0.0, x * math.inf, x + math.nan) + tg.minimum(x, -math.inf)
    x = np.array([1.0, -1.0, 0.0])
    with np.errstate(all="ignore"):
        expected = tg.data(f(x))
        with on_host():
            fused = tg.data(tg.broadcast(f, x))
    assert_agree(fused, expected)
    compiled = next(c for (fn, _), c in _CACHE.items() if fn is f)
    for text in generated_sources(compiled, 1):
        assert "__longlong_as_double" in text.text
        compile_with_nvrtc(text, "constants", GENERATED_ARCH)


@pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_generated_kernels_agree_with_the_generic_path_everywhere(name, dtype):
    f, shapes = FUNCTIONS[name]
    xs = [domain(s, dtype, seed=i, special=0.3) for i, s in enumerate(shapes)]
    w = np.random.default_rng(4).standard_normal(np.broadcast_shapes(*shapes)).astype(dtype)
    loss = lambda *a: tg.sum(tg.broadcast(f, *a) * w)
    with np.errstate(all="ignore"), tg.sync_checks(False):
        value, generic = tg.withgradient(loss, *xs)
        plain = tg.data(tg.broadcast(f, *xs))
        with on_host(), recording() as log:
            fused_value = tg.data(tg.broadcast(f, *xs))
            _, fused = tg.withgradient(loss, *xs)
    assert ("launch", "broadcast_fwd") in log and ("launch", "broadcast_bwd") in log
    assert_agree(fused_value, plain, what="value")
    for i, (a, b) in enumerate(zip(fused, generic)):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        scale = np.nanmax(np.where(np.isfinite(b), np.abs(b), 0), initial=0)  # sums cancel
        assert_agree(a, b, scale=scale, what=f"gradient {i}")


@pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")
def test_a_field_of_a_structured_array_is_read_as_the_generic_path_reads_it():
    records = np.zeros(5, dtype=[("x", "f8"), ("y", "f4")])  # x's stride, 12 bytes, is no element
    records["x"], records["y"] = np.linspace(-2.0, 2.0, 5), 100.0
    x = records["x"]
    loss = lambda x: tg.sum(tg.broadcast(lambda a: a * a - a, x) * np.arange(5.0))  # noqa: E731
    with on_host():
        value, grads = tg.withgradient(loss, x)
    assert value == np.sum((x * x - x) * np.arange(5.0))
    assert np.array_equal(grads[0], (2 * x - 1) * np.arange(5.0))


@pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")
def test_float32_and_float64_arguments_are_promoted():
    f = lambda x, y: x * y + tg.exp(y)
    x, y = np.linspace(-1, 1, 6, dtype=np.float32), np.linspace(0, 2, 6)
    expected_value = tg.data(f(x, y))
    expected = tg.gradient(lambda x, y: tg.sum(tg.broadcast(f, x, y)), x, y)
    with on_host():
        value = tg.data(tg.broadcast(f, x, y))
        grads = tg.gradient(lambda x, y: tg.sum(tg.broadcast(f, x, y)), x, y)
    assert value.dtype == np.float64 and np.array_equal(value, expected_value)
    for a, b, arg in zip(grads, expected, (x, y)):
        assert a.dtype == arg.dtype and np.allclose(a, b)


def test_generated_code_is_keyed_by_the_expression_itself():
    """Thousands of distinct functions, made and dropped so that Python reuses their memory (and
    ids): each gets the source of its own expression, and equal expressions share one."""
    digests, texts = {}, set()
    for k in range(1000):
        f = eval(f"lambda x, y: x * {k}.5 + y")  # a new function object each time
        compiled = broadcast_module._Compiled(f, 2)
        text = codegen.family(compiled, (False, False))
        assert f"{k}.5" in text.text
        digests.setdefault(text.digest, text.text)
        texts.add(text.text)
    assert len(digests) == len(texts) == 1000
    again = codegen.family(broadcast_module._Compiled(lambda x, y: x * 7.5 + y, 2), (False, False))
    assert digests[again.digest] == again.text


@pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")
def test_the_caches_are_bounded_and_evict_the_least_recently_used(monkeypatch):
    monkeypatch.setattr(broadcast_module, "_CACHE", OrderedDict())
    monkeypatch.setattr(broadcast_module, "_CACHE_SIZE", 2)
    monkeypatch.setattr(host.HostLibrary, "_cache", OrderedDict())
    monkeypatch.setattr(host.HostLibrary, "_CACHE_SIZE", 2)
    x = np.array([1.0, 2.0])
    functions = [eval(f"lambda x: x * {k}.0 + 1.0") for k in range(4)]
    with on_host():
        for round_ in range(2):  # evicted expressions come back right
            for k, f in enumerate(functions):
                assert np.array_equal(tg.broadcast(f, x), x * k + 1.0), (round_, k)
                assert len(broadcast_module._CACHE) <= 2
                assert len(host.HostLibrary._cache) <= 2
