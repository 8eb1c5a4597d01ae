"""`tg.broadcast`: a user's scalar function as one tape node, traced once, differentiated
symbolically; on the GPU one generated kernel each way (checked here with NVRTC and a host
build of the same generated code)."""

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu.broadcast import _CACHE
from tracker_gpu.cuda import codegen, host
from tracker_gpu.testing import gradcheck


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
        assert tg.data(a).device == backend.device


def test_one_node_and_one_trace():
    calls = []

    def f(x, y):
        calls.append(1)
        return tg.exp(x) * y + x

    x, y = tg.param(np.ones(3)), tg.param(np.ones(3))
    out = tg.broadcast(f, x, y)
    assert out._args == (x, y)  # one node whose parents are the arguments themselves
    tg.broadcast(f, x, y)
    assert len(calls) == 1  # traced once for this dtype signature
    tg.broadcast(f, np.ones(3, dtype=np.float32), np.ones(3, dtype=np.float32))
    assert len(calls) == 2


def test_second_derivatives_through_broadcast():
    x = np.linspace(-1.0, 1.0, 5)
    fused = tg.hessian(lambda x: tg.sum(tg.broadcast(lambda v: tg.sin(v) * v**3, x)), x)
    assert np.allclose(np.diag(fused), -np.sin(x) * x**3 + 6 * np.cos(x) * x**2 + 6 * np.sin(x) * x)


def test_python_numbers_as_arguments():
    (g,) = tg.gradient(lambda x: tg.sum(tg.broadcast(lambda a, k: a * k + k, x, 3.0)), np.ones(2))
    assert np.allclose(g, 3.0)


def test_unsupported_functions_are_named():
    with pytest.raises(TypeError, match="'sum' is not an elementwise function"):
        tg.broadcast(lambda x: tg.sum(x), np.ones(2))


def generated(name):
    f, shapes = FUNCTIONS[name]
    tg.broadcast(f, *(np.ones(s) for s in shapes))
    return next(c for (fn, _), c in _CACHE.items() if fn is f)


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_generated_kernels_compile_with_nvrtc(name, arch):
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="pip install cuda-python")
    for ctype in ("float", "double"):
        src = codegen.kernel_source(generated(name), ctype).encode()
        err, program = nvrtc.nvrtcCreateProgram(src, b"broadcast.cu", 0, [], [])
        (result,) = nvrtc.nvrtcCompileProgram(program, 1, [f"--gpu-architecture={arch}".encode()])
        assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS, (name, ctype)


@pytest.mark.skipif(not host.available(), reason="no C++ compiler for the host build")
@pytest.mark.parametrize("name", FUNCTIONS)
def test_generated_code_computes_the_expression_on_the_host(name):
    import ctypes

    compiled = generated(name)
    n_args = len(compiled.partials)
    library = host.compile_shared(host.SHIM + codegen.host_source(compiled, "double"), "broadcast")
    rng = np.random.default_rng(4)
    n = 257
    xs = [rng.uniform(-1.5, 1.5, n) for _ in range(n_args)]
    g = rng.standard_normal(n)
    out = np.empty(n)
    grads = [np.empty(n) for _ in range(n_args)]
    pointer = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
    library.host_broadcast_fwd(*map(pointer, xs), pointer(out), ctypes.c_longlong(n))
    f = FUNCTIONS[name][0]
    assert np.allclose(out, tg.data(f(*xs)), rtol=1e-13)
    arrays = [*map(pointer, xs), pointer(g), *map(pointer, grads)]
    library.host_broadcast_bwd(*arrays, ctypes.c_longlong(n))
    expected = tg.gradient(lambda *a: tg.sum(f(*a) * g), *xs)
    for a, b in zip(grads, expected):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-12)
