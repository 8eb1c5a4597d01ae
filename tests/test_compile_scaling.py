"""Recording scales like the eager pass: a long program is generated as functions of bounded
size (each compiled on its own), and the recording keeps no intermediate value that no pullback
saved."""

import gc
import tracemalloc

import numpy as np
import pytest
from helpers import require
from test_compile import FUNCTIONS, _inputs, assert_same

import tracker_gpu as tg
from tracker_gpu.compiler import chunks
from tracker_gpu.cuda.dispatch import on_host_now


@pytest.fixture
def compiled_sources(monkeypatch):
    """The source of every function the compiler compiles, in order (where the replay is
    generated code: while the fused path runs on the host, a replay interprets the steps)."""
    if on_host_now():
        pytest.skip("the fused path on the host replays by interpreting, generating no code")
    seen = []

    def spy(source, *args):
        seen.append(source)
        return compile(source, *args)

    monkeypatch.setattr(chunks, "compile", spy, raising=False)
    return seen


def _chain(n):
    def f(x):
        y = x
        for i in range(n):
            y = tg.sin(y) if i % 3 == 0 else y * 1.0001
        return tg.sum(y)

    return f


def test_a_long_program_is_cut_into_functions_of_bounded_size(monkeypatch, compiled_sources):
    monkeypatch.setattr(chunks, "CHUNK_LINES", 50)
    f, x = _chain(600), np.linspace(0.1, 0.9, 4)
    step = tg.compile(f)
    step(x)
    sizes = [source.count("\n") for source in compiled_sources]
    assert len(sizes) > 20  # 600 operations forward and backward, and the driver
    assert max(sizes) <= 2 * 50 + 10  # a chunk, its loads and stores of crossing values
    for seed in range(2):
        x = np.random.default_rng(seed).uniform(0.1, 0.9, 4)
        got, expected = step(x), tg.withgradient(f, x)
        np.testing.assert_array_equal(got.val, expected.val)
        np.testing.assert_array_equal(got.grad[0], expected.grad[0])


def test_a_short_program_stays_one_function(compiled_sources):
    tg.compile(_chain(30))(np.ones(3))
    assert len(compiled_sources) == 1 and compiled_sources[0].startswith("def run(")


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_program_cut_everywhere_replays_what_withgradient_gives(backend, monkeypatch, name):
    if name == "linalg":
        require(backend, "linalg.det")
    monkeypatch.setattr(chunks, "CHUNK_LINES", 1)  # a cut at every point allowed
    f, shapes = FUNCTIONS[name]
    step = tg.compile(f)
    for seed in range(3):
        args = _inputs(backend, shapes, seed)
        got, expected = step(*args), tg.withgradient(f, *args)
        assert_same(backend, got.val, expected.val)
        for g, e in zip(got.grad, expected.grad):
            assert_same(backend, g, e)


def test_nested_passes_cut_everywhere(monkeypatch):
    monkeypatch.setattr(chunks, "CHUNK_LINES", 1)

    def f(x):
        (g,) = tg.gradient(lambda y: tg.sum(tg.sin(y) * y), x)
        return tg.sum(g * g)

    step = tg.compile(f, gradient=True)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(5)
        got, expected = step(x), tg.withgradient(f, x)
        np.testing.assert_array_equal(got.val, expected.val)
        np.testing.assert_array_equal(got.grad[0], expected.grad[0])


def _peak(run):
    gc.collect()
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_recording_keeps_no_unsaved_intermediate():
    """`y * c` saves nothing of `y`: eagerly each intermediate is freed at once, and so while
    recording (20 MB of intermediates here, were they kept)."""

    def f(x):
        y = x
        for _ in range(100):
            y = y * 1.0001
        return tg.sum(y)

    x = np.ones(25_000)
    eager = _peak(lambda: tg.withgradient(f, x))
    recording = _peak(lambda: tg.compile(f)(x))
    assert recording < 3 * eager + 2_000_000, (recording, eager)
