"""NumPy's own loops inside the fused host loops (`tracker_gpu/compiler/numpy_loops.py`): every
function they take, in float32 and float64, fused over the whole domain in regions and in
backward chains, is eager's bit for bit; a loop that disagrees with its ufunc is refused."""

import numpy as np
import pytest
from domain import domain
from test_compile_fusion import _finite, _quiet, _same_bits

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.compiler import fusion, loops, numpy_loops
from tracker_gpu.compiler.recorder import Call

pytestmark = pytest.mark.skipif(loops.compiler() is None, reason="no C++ compiler")

DTYPES = (np.float32, np.float64)
CASES = [(name, dtype) for name in sorted(numpy_loops.FUNCTIONS) for dtype in DTYPES]


@pytest.mark.parametrize("name, dtype", CASES)
def test_numpys_loop_is_read_for_every_function(name, dtype):
    """The loop is found and agrees with its ufunc (NumPy 2's `PyUFuncObject`)."""
    assert numpy_loops.available(name, dtype)


@pytest.mark.parametrize("name, dtype", CASES)
def test_an_element_is_the_same_wherever_it_lies(name, dtype):
    """What blocks rely on: NumPy's value of an element does not depend on its place in the
    array (vector lanes, the tail) nor on the array's length."""
    ufunc, x = getattr(np, name), domain((3001,), dtype, seed=1)
    with np.errstate(all="ignore"):
        whole = ufunc(x)
        for start, stop in ((0, 1), (1, 18), (5, 262), (7, 3001)):
            _same_bits(ufunc(x[start:stop]), whole[start:stop], f"{name}[{start}:{stop}]")


@pytest.mark.parametrize("name, dtype", CASES)
def test_a_fused_region_and_its_chain_are_eagers_bit_for_bit(name, dtype):
    """The function between arithmetic, with a broadcast operand, over blocks and their tails
    (4 x 300: a row is a block and a part), forward and backward, by default."""
    function = getattr(tg, name)

    def loss(x, b):  # a finite loss (the backward pass refuses others), the whole domain in y
        y = function(x * 0.5 + b) * 3.0
        return tg.sum(_finite(y))

    x, b = domain((4, 300), dtype, seed=2), domain((300,), dtype, seed=3)
    step = tg.compile(loss, wrt=0)
    _quiet(step, x, b)
    program = step.programs()[0]
    assert program.fused >= 1 and program.chains
    left = [s for s in program.steps if type(s) is Call and fusion.OPS.get(s.function)]
    assert not left, f"{name}: not fused: {left}"
    got = _quiet(step, x, b)
    expected = _quiet(lambda: tg.withgradient(loss, x, b, wrt=0))
    _same_bits(got.val, expected.val, f"{name} value")
    _same_bits(got.grad[0], expected.grad[0], f"{name} gradient")


def test_a_loop_that_disagrees_with_its_ufunc_is_refused():
    """The probe can fail: cos's loop is not sin's."""
    found = numpy_loops._loop("cos", "float64")
    assert found is not None
    assert not numpy_loops._agrees(np.sin, found, np.dtype(np.float64))


def test_regions_on_threads_call_the_loops_in_each(monkeypatch):
    """A region cut between threads: each thread's blocks, the same values."""
    monkeypatch.setattr(loops, "THREADS", [1 << 10, 2])
    f = lambda x: tg.tanh(tg.sin(x * 2.0) + 1.0) * x  # noqa: E731
    x = domain((64, 257), np.float32, seed=4)
    step = tg.compile(f, gradient=False)
    _quiet(step, x)
    assert step.programs()[0].fused == 1
    _same_bits(_quiet(step, x), _quiet(lambda: tg.data(f(x))), "on threads")


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_view_read_by_a_function_takes_numpys_steps(dtype):
    """NumPy's function of a reversed view is not always that of its copy (float64 `exp` and
    `log`, float32 `sinh`, here): a region or chain given a view that a function reads as it is
    runs NumPy's steps; a contiguous array runs the kernel."""
    names = sorted(numpy_loops.FUNCTIONS)

    def loss(x):
        total = 0.0
        for name in names:
            y = getattr(tg, name)(x) * 0.5 + 1.0
            total = total + tg.sum(_finite(y))
        return total

    x = domain((1500,), dtype, seed=7)
    step = tg.compile(loss)
    _quiet(step, x)
    for given in (x[::-1], x[::-1].copy(), np.concatenate([x, x])[::2]):
        got = _quiet(step, given)
        expected = _quiet(tg.withgradient, loss, given)
        _same_bits(got.val, expected.val, "value of a view")
        _same_bits(got.grad[0], expected.grad[0], "gradient of a view")


def test_a_function_that_is_not_numpys_ufunc_is_not_read(monkeypatch):
    """Where `np.sin` is something else (patched by a library), its memory is not read as a
    ufunc's: no loop, and `fuse="exact"` leaves sin to the replay's own call."""
    monkeypatch.setattr(np, "sin", lambda x: x)
    numpy_loops._loop.cache_clear()
    try:
        assert numpy_loops._loop("sin", "float64") is None
        assert not numpy_loops.available("sin", np.float64)
    finally:
        numpy_loops._loop.cache_clear()


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_is_its_rules_operations_around_numpys_exp(dtype):
    """`sigmoid` joins a region by default as the operations of its rule (`exp(-|x|)`, then a
    selection of two quotients), NumPy's `exp` among them: eager's bits over the whole domain,
    values and gradients."""

    def loss(x):
        y = nn.sigmoid(x * 2.0 + 0.5) * 3.0 - x
        return tg.sum(_finite(y))

    x = domain((1500,), dtype, seed=8)
    step = tg.compile(loss)
    _quiet(step, x)
    left = [s for s in step.programs()[0].steps if type(s) is Call and fusion.OPS.get(s.function)]
    assert step.programs()[0].fused and not left, left
    got, expected = _quiet(step, x), _quiet(tg.withgradient, loss, x)
    _same_bits(got.val, expected.val, "sigmoid's value")
    _same_bits(got.grad[0], expected.grad[0], "sigmoid's gradient")
