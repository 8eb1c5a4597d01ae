"""A CUDA graph's capture cut at library calls (`compiler/graphs.py`), on a stand-in stream:
kernels launched while it captures are kept for the graph's launches, and the library's
matrix product refuses to run under capture, as CuPy's cuBLAS calls do. What runs on CuPy
itself is tested on a GPU (`ci/gpu`); these check the cutting, the replay and the clean-up."""

import contextlib
import functools
import sys
import threading
import types

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu.compiler import graphs
from tracker_gpu.compiler.graphs import Parts, cut_at_library_calls


class Stream:
    def __init__(self):
        self.captured = None

    def begin_capture(self):
        assert self.captured is None, "a capture is already open"
        self.captured = []

    def end_capture(self):
        if self.captured is None:
            raise RuntimeError("the stream is not capturing")
        kernels, self.captured = self.captured, None
        return Graph(kernels)

    def is_capturing(self):
        return self.captured is not None

    def launch(self, kernel):
        if self.captured is None:
            kernel()
        else:
            self.captured.append(kernel)

    def synchronize(self):
        assert self.captured is None, "a capturing stream cannot synchronize"

    def __enter__(self):
        return self

    def __exit__(self, *failure):
        return False


class Graph:
    def __init__(self, kernels):
        self.kernels = kernels

    def launch(self, stream):
        for kernel in self.kernels:
            kernel()


def library(stream):
    """A namespace whose matrix product and solve refuse a capturing stream."""

    def matmul(a, b):
        if stream.is_capturing():
            raise NotImplementedError("calling the BLAS during stream capture")
        return a @ b

    def solve(a, b):  # calls the namespace's matmul, as a library's own functions may
        if stream.is_capturing():
            raise NotImplementedError("calling the solver during stream capture")
        x = np.linalg.solve(a, b)
        return x, xp.matmul(a, x)

    xp = types.SimpleNamespace(matmul=matmul, linalg=types.SimpleNamespace(solve=solve))
    return xp


def program(stream, xp, x, w):
    """h = 2x (a kernel), y = h @ w (the library), z = y + 1 (a kernel)."""
    h = np.empty_like(x)
    stream.launch(lambda: np.multiply(x, 2, out=h))
    y = xp.matmul(h, w)
    z = np.empty_like(y)
    stream.launch(lambda: np.add(y, 1, out=z))
    return z


def expected(x, w):
    return (2 * x) @ w + 1


@pytest.fixture
def setting():
    rng = np.random.default_rng(0)
    stream = Stream()
    return stream, library(stream), rng.normal(size=(3, 4)), rng.normal(size=(4, 2))


def test_a_program_with_a_library_call_cannot_be_captured_whole(setting):
    stream, xp, x, w = setting
    stream.begin_capture()
    with pytest.raises(NotImplementedError):
        program(stream, xp, x, w)


def test_the_capture_is_cut_at_the_library_call_and_the_parts_replay_it(setting):
    stream, xp, x, w = setting
    matmul = xp.matmul
    parts = Parts(stream)
    with cut_at_library_calls(xp, parts):
        z = program(stream, xp, x, w)
        done = parts.done()
    np.testing.assert_array_equal(z, expected(x, w))  # the capturing run is a real run
    assert len(done) == 3 and xp.matmul is matmul and not stream.is_capturing()
    for _ in range(2):  # new arguments in the static input, the parts launched again
        x[...] = np.random.default_rng(len(done)).normal(size=x.shape)
        for part in done:
            part(stream)
        np.testing.assert_array_equal(z, expected(x, w))


def test_a_library_call_returning_several_arrays_is_replayed_into_each(setting):
    stream, xp, x, _ = setting
    a = np.eye(3) * 3 + 0.5
    parts = Parts(stream)
    with cut_at_library_calls(xp, parts):
        solved, back = xp.linalg.solve(a, x)  # its inner matmul runs inside the live call
        done = parts.done()
    assert len(done) == 3
    x[...] = 1.0
    for part in done:
        part(stream)
    np.testing.assert_allclose(solved, np.linalg.solve(a, x))
    np.testing.assert_allclose(back, x)


def test_another_threads_library_calls_are_not_cut(setting):
    stream, xp, x, w = setting
    seen = {}
    parts = Parts(stream)
    with cut_at_library_calls(xp, parts):
        worker = threading.Thread(target=lambda: seen.setdefault("y", xp.matmul(x, w)))
        stream.captured_before, stream.captured = stream.captured, None  # that thread's stream
        worker.start()
        worker.join()
        stream.captured = stream.captured_before
        done = parts.done()
    np.testing.assert_array_equal(seen["y"], x @ w)
    assert len(done) == 1  # no cut


def test_a_failure_under_capture_closes_it_and_restores_the_namespace(setting):
    stream, xp, x, w = setting
    matmul, solve = xp.matmul, xp.linalg.solve
    parts = Parts(stream)
    with pytest.raises(ZeroDivisionError):
        with cut_at_library_calls(xp, parts):
            xp.matmul(x, w)
            raise ZeroDivisionError
    assert not stream.is_capturing()
    assert xp.matmul is matmul and xp.linalg.solve is solve


def test_a_capture_that_cannot_begin_leaves_the_namespace_as_it_was(setting):
    stream, xp, x, w = setting
    matmul = xp.matmul
    stream.begin_capture()  # a capture already open: the next cannot begin
    with pytest.raises(AssertionError, match="already open"):
        with cut_at_library_calls(xp, Parts(stream)):
            pass
    assert xp.matmul is matmul and not graphs._PARTS


def test_a_library_call_that_gives_no_array_is_refused(setting):
    stream, xp, x, w = setting
    xp.matmul = lambda a, b: float(np.sum(a @ b))
    parts = Parts(stream)
    with pytest.raises(TypeError, match="not arrays"):
        with cut_at_library_calls(xp, parts):
            xp.matmul(x, w)
    assert not stream.is_capturing()


class Array(np.ndarray):
    """A NumPy array on "device 0"."""

    device = types.SimpleNamespace(id=0)


def stand_in_cupy(stream):
    cuda = types.SimpleNamespace(
        Device=lambda index: contextlib.nullcontext(),
        MemoryPool=lambda: types.SimpleNamespace(malloc=None),
        Stream=lambda non_blocking: stream,
        using_allocator=lambda malloc: contextlib.nullcontext(),
        get_current_stream=lambda: stream,
    )
    return types.SimpleNamespace(cuda=cuda, empty=np.empty, copyto=np.copyto, copy=np.copy,
                                 array_equal=np.array_equal)  # fmt: skip


class Program:
    """The program above, as `Captured` runs one: slot 0 the argument, slot 1 the result.
    With `drift`, its second run (the capturing one) adds a kernel that the first did not."""

    steps, outputs = [], [1]

    def __init__(self, stream, xp, w, drift=False):
        self.stream, self.xp, self.w, self.drift, self.runs = stream, xp, w, drift, 0

    def interpret(self, inputs):
        self.runs += 1
        z = program(self.stream, self.xp, inputs[0], self.w)
        if self.drift and self.runs == 2:
            self.stream.launch(lambda: np.add(z, 1e-12, out=z))
        return [inputs[0], z]


@pytest.fixture
def captured(setting, monkeypatch):
    stream, xp, x, w = setting
    monkeypatch.setattr(graphs, "is_cupy", lambda a: isinstance(a, np.ndarray))
    monkeypatch.setattr(graphs, "namespace_of", lambda a: xp)
    return stream, xp, x.view(Array), w


def test_a_captured_program_replays_new_arguments_through_its_parts(captured):
    stream, xp, x, w = captured
    graph = graphs.Captured(Program(stream, xp, w), [x], stand_in_cupy(stream))
    assert graph.describe() == {"graphs": 2, "library_calls": 1}
    for seed in range(2):
        new = np.random.default_rng(seed).normal(size=x.shape)
        np.testing.assert_array_equal(graph.run([new])[1], expected(new, w))


def test_a_capture_that_answers_otherwise_than_the_first_run_is_refused(captured):
    stream, xp, x, w = captured
    with pytest.raises(RuntimeError, match="differs from the first run"):
        graphs.Captured(Program(stream, xp, w, drift=True), [x], stand_in_cupy(stream))


# linalg functions of the standard that call neither cuBLAS nor cuSOLVER on CuPy
BLAS_FREE = {"cross", "diagonal", "trace", "matrix_transpose", "outer"}


def test_every_linalg_function_the_library_calls_is_cut_or_known_to_need_no_blas():
    """A linalg call that CuPy runs through cuBLAS or cuSOLVER and that the cut list lacks
    would make a CUDA graph's capture fail (then the replay runs step by step): each one that
    the library's source calls is listed, or known to need neither."""
    import re
    from pathlib import Path

    import tracker_gpu

    source = "\n".join(p.read_text() for p in Path(tracker_gpu.__file__).parent.rglob("*.py"))
    called = set(re.findall(r"\.linalg\.(\w+)\(", source))
    assert {"solve", "cholesky", "svd", "vector_norm"} <= called  # the scan finds them
    assert called - BLAS_FREE <= set(graphs.LIBRARY_CALLS["linalg"])


def test_the_captured_run_is_compared_with_the_first_value_for_value():
    """Values, nan where nan, shapes, dtypes; None and plain values as they are."""
    equal = functools.partial(graphs._equal, np)
    nan = np.array([np.nan, 1.0])
    assert equal(nan, nan.copy()) and equal(None, None) and equal(2, 2)
    assert not equal(nan, np.array([np.nan, 1.0 + 2**-52]))
    assert not equal(nan, nan.astype(np.float32)) and not equal(nan, nan[:1])
    assert not equal(None, nan) and not equal(2, 2.5)


def test_every_join_the_library_calls_is_cut():
    """CuPy joins several arrays with one kernel that reads their addresses copied from the
    host, which a capture refuses: each join the library's source calls is cut."""
    import re
    from pathlib import Path

    import tracker_gpu

    source = "\n".join(p.read_text() for p in Path(tracker_gpu.__file__).parent.rglob("*.py"))
    called = set(re.findall(r"\bxp\.(stack|concat|concatenate|hstack|vstack)\(", source))
    assert {"stack", "concat"} <= called  # the scan finds them
    assert called <= set(graphs.LIBRARY_CALLS[""])


def test_an_error_in_an_interpreted_replay_names_the_step_it_came_from():
    """The host's interpreted replay (a GPU's too): the library's own error, as eagerly, with a
    note naming the step that raised."""
    with tg.cuda.on_host():
        step = tg.compile(lambda x: tg.sum(tg.linalg.cholesky(x)))
        step(np.eye(3) * 2.0)
        with pytest.raises(np.linalg.LinAlgError) as raised:
            step(-np.eye(3))
    assert "tg.compile: raised while replaying the call of cholesky" in raised.value.__notes__


def test_a_capture_that_fails_says_which_step_failed(monkeypatch):
    """CuPy refusing a host copy during the capture (its joins did): the warning names the step,
    so that the user sees what kept the program from being a CUDA graph."""
    from tracker_gpu.compiler import program as program_module

    def capture(program, arrays, cp):
        return program.interpret(arrays)  # the capture's own run, which meets the refusal

    def refused(*args, **kw):
        raise RuntimeError("the current stream is capturing, so H2D transfers are disallowed")

    step = tg.compile(lambda x: tg.sum(tg.stack([x, x * 2.0])))
    x = np.arange(3.0)
    with tg.cuda.on_host():
        step(x)
        (program,) = step.programs()
        program.graphs, program.graph = True, None
        monkeypatch.setattr(graphs, "plan", lambda p, a: graphs.Plan([], [], []))
        monkeypatch.setattr(graphs, "Captured", capture)
        monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))  # not used here
        call = next(s for s in program.steps if getattr(s, "function", None) is not None
                    and s.node.rule.name == "stack")  # fmt: skip
        monkeypatch.setattr(call, "function", refused)
        with pytest.warns(
            UserWarning,
            match="H2D transfers are disallowed; tg.compile: raised "
            "while replaying the call of stack\\); replaying step by step",
        ):
            with pytest.raises(RuntimeError):  # then step by step, where it raises again
                step(x)
    assert program_module.describe_step(call) == "the call of stack"
