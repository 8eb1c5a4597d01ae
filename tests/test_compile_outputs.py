"""What a compiled call hands out and writes, against the eager call, over several calls.

- Every array a call returns is the caller's own (`compiler/program.py`: `_owned`): an array
  that `f` makes without its arguments (from numbers, `np.zeros`, `tg.zeros`, one written
  into, inside a tuple or a dict) is a new object at every call, the recording call's
  included, and writing into one changes nothing of the next call (it was once the program's
  own constant, shared by every call: a write into it changed later losses and gradients).
- A write into an argument that `f` gets as a plain array eagerly (outside `wrt`, or any with
  `gradient=False`): `c += 1.0`, a slice written, an output buffer, one element set to a
  tracked number, is written into the caller's array by every call, as eagerly (it was once
  dropped, at the recording and at every replay: `compiler/recorder.py`, `argument_writes`).
  What NumPy raises eagerly is raised, and a write whose old value `f` reads after it (a view,
  a value a gradient pass saved) is refused with a `RecordingError`, or run eagerly with
  `fallback=True`.
"""

import functools

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu.pytree import tree_leaves


def _same(a, b):
    """Whether two results are equal bit for bit: the same structure, and each array of the
    same type, dtype, shape and bytes."""
    la, lb = tree_leaves(a), tree_leaves(b)
    assert len(la) == len(lb), (a, b)
    for x, y in zip(la, lb):
        if x is None or y is None:
            assert x is None and y is None, (a, b)
            continue
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, (a, b)
        assert x.tobytes() == y.tobytes(), (a, b)
    return True


def _arrays(result):
    return [v for v in tree_leaves(result) if isinstance(v, np.ndarray)]


# --- every array the caller receives is its own


def _from_numbers(x):
    c = tg.asarray([1.0, 2.0]) * 3.0
    return tg.sum(x * c), c


def _np_zeros(x):
    return tg.sum(x * x), np.zeros(3)


def _tg_zeros(x):
    return tg.sum(x * x), tg.zeros(3)


def _written_into(x):
    b = tg.zeros(3)
    b[1] = 5.0
    c = np.zeros(2)
    c[1:] = 2.0
    return tg.sum(x * c), b, c


def _in_containers(x):
    c = tg.asarray([1.0, 2.0])
    return tg.sum(x * c), {"a": np.ones(2), "b": (tg.zeros(2), c), "s": np.array(1.5)}


CONSTANT_OUTPUTS = {
    "from numbers": _from_numbers,
    "np.zeros": _np_zeros,
    "tg.zeros": _tg_zeros,
    "written into": _written_into,
    "inside a tuple and a dict": _in_containers,
}


@pytest.mark.parametrize("gradient", [True, False])
@pytest.mark.parametrize("name", sorted(CONSTANT_OUTPUTS))
def test_constant_outputs_are_the_callers_own_at_every_call(name, gradient):
    f = CONSTANT_OUTPUTS[name]
    step = tg.compile(f, gradient=gradient, fuse=False)
    eager = (lambda x: tg.withgradient(f, x)) if gradient else f
    seen = []
    for call in range(4):
        x = np.array([1.0, 2.0]) * (call + 1)
        got = step(x)
        assert _same(got, eager(x)), (call, got)
        arrays = _arrays(got.val if gradient else got)
        assert arrays
        seen += arrays
        for a in arrays:  # what the caller does with its own arrays
            a[...] = 100.0
    assert len({id(a) for a in seen}) == len(seen)  # a new object for each, at every call
    assert step.cache_info().hits == 3


def test_constant_output_written_into_changes_no_later_loss_or_gradient():
    """The brief's example: the returned constant was the program's own, used by `x * c`."""
    step = tg.compile(_from_numbers)
    x = np.ones(2)
    step(x)
    r = step(x)
    r.val[1][...] = 100.0
    got = step(x)
    assert _same(got, tg.withgradient(_from_numbers, x))
    assert float(got.val[0]) == 9.0 and np.array_equal(got.grad[0], [3.0, 6.0])


def test_constant_outputs_with_the_default_fusion():
    step = tg.compile(_in_containers)
    x = np.array([1.0, 2.0])
    first = step(x)
    for a in _arrays(first.val):
        a[...] = -1.0
    second = step(x)
    assert _same(second, tg.withgradient(_in_containers, x))
    assert not {id(a) for a in _arrays(first.val)} & {id(a) for a in _arrays(second.val)}


# --- writes into arguments that are plain arrays eagerly


def _in_place(x, c):
    c += 1.0
    return tg.sum(x * c)


def _slice(x, c):
    c[1:] = c[:2] * 2.0 + 1.0
    return tg.sum(x * c[1:])


def _output_buffer(x, out):
    out[...] = tg.stop_gradient(x) * 2.0 + out
    return tg.sum(x * x)


def _one_element(x, buf):
    buf[1] = tg.sum(x) + buf[1]
    return tg.sum(x * buf[1])


def _counter(x, n):
    n += 1
    return tg.sum(x) * n


def _returned(x, c):
    c *= 2.0
    return tg.sum(x * c), c


def _twice(x, c, d):
    c += 1.0  # an argument in wrt: eagerly a tracked input, the caller's array is not written
    d -= 0.5  # outside wrt: written
    return tg.sum(x * c) + tg.sum(d)


WRITES = {
    "in-place operator": (_in_place, lambda: (np.array(0.0),)),
    "slice written": (_slice, lambda: (np.array([1.0, 2.0, 3.0]),)),
    "output buffer": (_output_buffer, lambda: (np.zeros(2),)),
    "one element set to a tracked number": (_one_element, lambda: (np.zeros(3),)),
    "integer counter": (_counter, lambda: (np.array(0),)),
    "returned after the write": (_returned, lambda: (np.array([1.0, -1.0]),)),
}


def _calls(f, make, gradient, fuse=False, wrt=0, **options):
    """Three calls of the compiled `f` and of the eager one on arguments of their own (`make`
    gives the arguments after `x`): each result and each argument after it, bit for bit."""
    step = tg.compile(f, gradient=gradient, wrt=None if gradient is False else wrt, fuse=fuse,
                      **options)  # fmt: skip
    mine, theirs = make(), make()
    for call in range(3):
        x = np.array([1.0, 2.0]) + call
        if gradient is False:
            expected = f(x.copy(), *theirs)
        else:
            expected = tg.withgradient(f, x.copy(), *theirs, wrt=wrt)
        got = step(x, *mine)
        assert _same(got, expected), (call, got, expected)
        assert _same(mine, theirs), (call, mine, theirs)
        assert np.array_equal(x, np.array([1.0, 2.0]) + call)
    return step


@pytest.mark.parametrize("gradient", [False, True])
@pytest.mark.parametrize("name", sorted(WRITES))
def test_writes_into_arguments_are_the_eager_writes_at_every_call(name, gradient):
    f, make = WRITES[name]
    step = _calls(f, make, gradient)
    assert step.cache_info().hits == 2


def test_writes_into_arguments_with_the_default_fusion():
    _calls(_slice, WRITES["slice written"][1], False, fuse=None)
    _calls(_in_place, WRITES["in-place operator"][1], True, fuse=None)


def test_an_argument_in_wrt_is_not_written_one_outside_is():
    def make():
        return np.array([1.0, 1.0]), np.array([0.0, 4.0])

    _calls(_twice, make, True, wrt=(0, 1))
    step = tg.compile(_twice, wrt=(0, 1), fuse=False)
    c, d = make()
    step(np.ones(2), c, d)
    step(np.ones(2), c, d)
    assert np.array_equal(c, [1.0, 1.0]) and np.array_equal(d, [-1.0, 3.0])


def test_writes_into_keyword_arguments():
    def f(x, *, out):
        out[...] = out * 0.5 + 1.0
        return tg.sum(x * out)

    step = tg.compile(f, fuse=False)
    mine, theirs = np.array([2.0, 4.0]), np.array([2.0, 4.0])
    for _ in range(3):
        got = step(np.ones(2), out=mine)
        assert _same(got, tg.withgradient(functools.partial(f, out=theirs), np.ones(2)))
        assert _same(mine, theirs)


def test_the_zero_d_counter_the_warning_recommends_is_written_back():
    """`Compiled._warn_changed` says that a 0-d array argument that `f` writes into is
    written back by every replay: a counter kept in the globals is not, one passed is."""
    state = {"calls": 0.0}

    def counted(x):
        state["calls"] += 1.0
        return tg.sum(x) * state["calls"]

    with pytest.warns(RuntimeWarning, match="0-d array argument"):
        tg.compile(counted, gradient=False, fuse=False)(np.ones(2))

    def passed(x, calls):
        calls += 1.0
        return tg.sum(x) * calls

    _calls(passed, lambda: (np.array(0.0),), False)


def _adds_tracked(x, c):
    c += x
    return tg.sum(x)


def _writes_tracked_slice(x, buf):
    buf[0:1] = tg.sum(x)
    return tg.sum(x)


@pytest.mark.parametrize("f", [_adds_tracked, _writes_tracked_slice])
def test_a_tracked_value_written_into_a_plain_argument_raises_as_eagerly(f):
    c, mine = np.zeros(2), np.zeros(2)
    with pytest.raises(TypeError) as eager:
        tg.withgradient(f, np.ones(2), c, wrt=0)
    with pytest.raises(TypeError) as compiled:
        tg.compile(f, wrt=0, fuse=False)(np.ones(2), mine)
    assert not isinstance(compiled.value, tg.RecordingError)
    assert str(compiled.value) == str(eager.value)
    assert np.array_equal(mine, c) and np.array_equal(mine, np.zeros(2))


def _reads_a_view(x, c):
    v = c[0:1]
    c += 1.0
    return tg.sum(x * v)


def _reads_a_reshaped_view(x, c):
    v = tg.reshape(c, (2, 1))
    c += 1.0
    return tg.sum(x * v)


def _gradient_reads_the_old_value(x, c):
    y = x * c  # the pullback of x * c reads c: eagerly, after the write
    c += 1.0
    return tg.sum(y)


READS_AFTER = {
    "a view": (_reads_a_view, False),
    "a reshaped view": (_reads_a_reshaped_view, False),
    "a saved value": (_gradient_reads_the_old_value, True),
}


@pytest.mark.parametrize("name", sorted(READS_AFTER))
def test_a_write_whose_old_value_is_read_after_it_is_refused_or_run_eagerly(name):
    f, gradient = READS_AFTER[name]

    def make():
        return (np.array([1.0, 2.0]),)

    mine = make()
    step = tg.compile(f, gradient=gradient, wrt=None if gradient is False else 0, fuse=False)
    with pytest.raises(tg.RecordingError, match="write into its argument.*Return the new value"):
        step(np.ones(2), *mine)
    assert _same(mine, make())  # refused before any write
    step = _calls(f, make, gradient, fallback=True)
    assert step.cache_info().eager == 1
