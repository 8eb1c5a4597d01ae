"""The opened rules in eager steps (`compiler/native_rules.py`): each rule of its table, through
the public functions that reach it, gives what the rule's NumPy code gives (`generic_only`) bit
for bit over the whole domain, in float32 and float64, on flat arrays, rows and several trailing
axes, split between threads too; anything the loops do not take (small arrays, views, other
axes, half dtypes, a tracked gradient) runs the NumPy code; a floating-point exception that
NumPy's settings report raises as the NumPy code raises it."""

import numpy as np
import pytest
from domain import domain
from test_compile_fusion import _same_bits

import tracker_gpu as tg
from tracker_gpu.compiler import loops, native_rules, opened
from tracker_gpu.cuda import dispatch
from tracker_gpu.rules import nn

pytestmark = [
    pytest.mark.numpy_row,
    pytest.mark.skipif(not native_rules.available(), reason="no native build (no C++ compiler)"),
]


def _onehot(shape, dtype):
    """One-hot rows over the last axis, some all zeros."""
    rng = np.random.default_rng(7)
    t = np.zeros(shape, dtype).reshape(-1, shape[-1])
    t[np.arange(len(t)), rng.integers(0, shape[-1], len(t))] = 1
    t[::5] = 0
    return t.reshape(shape)


def _gradient(f, x, weights):
    """The pullback of `f` at `x` of the seed `weights` (any values: no loss to be finite)."""
    return tg.forward(f, x)[1](weights)[0]


def _normalise(x):
    return nn.normalise(x, axes=tuple(range(min(1, x.ndim - 1), x.ndim)))  # trailing axes


# each rule of native_rules.RULES through what a user calls: `(x, weights) -> array`
CALLS = {
    "gelu": lambda x, w: tg.nn.gelu(x),
    "gelu_vjp": lambda x, w: _gradient(tg.nn.gelu, x, w),
    "softmax": lambda x, w: tg.nn.softmax(x, axis=-1),
    "softmax_vjp": lambda x, w: _gradient(lambda v: tg.nn.softmax(v, axis=-1), x, w),
    "normalise_vjp": lambda x, w: _gradient(_normalise, x, w),
    "crossentropy": lambda x, w: tg.nn.logitcrossentropy(x, _onehot(x.shape, x.dtype)),
}
SHAPES = [(1024,), (37, 61), (3, 5, 129), (8, 4, 2, 16)]


def test_every_opened_rule_is_native_eagerly_and_called_here():
    opening = {o for pair in opened.OPENED.values() for o in pair if o is not None}
    assert {rule[0] for rule in native_rules.RULES.values()} == opening
    assert set(CALLS) == set(native_rules.RULES)


@pytest.fixture
def ran(monkeypatch):
    """The names of the rules that `native_rules.run` ran natively (it gave a result)."""
    seen, original = [], native_rules.run

    def spy(name, *arrays, **kw):
        result = original(name, *arrays, **kw)
        if result is not None:
            seen.append(name)
        return result

    monkeypatch.setattr(native_rules, "run", spy)
    return seen


def _inputs(name, shape, dtype, seed):
    x = domain(shape, dtype, seed=seed)
    if name == "crossentropy":  # logits: an inf makes every term nan
        x = np.where(np.isfinite(x), x, 0.0).astype(dtype)
    return x, domain(shape, dtype, seed=seed + 10, special=0.1)


def _both(name, x, w):
    """`(native, numpy)`: the call with the loops, and with the rules' NumPy code."""
    with np.errstate(all="ignore"):
        native = CALLS[name](x, w)
        with dispatch.generic_only():
            return native, CALLS[name](x, w)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(CALLS))
def test_each_rule_is_its_numpy_code_bit_for_bit_over_the_whole_domain(name, dtype, shape, ran):
    for seed in range(2):
        x, w = _inputs(name, shape, dtype, seed)
        native, numpy = _both(name, x, w)
        _same_bits(tg.data(native), tg.data(numpy), f"{name} {np.dtype(dtype)} {shape}")
    assert name in ran, f"{name} did not run natively on {shape}"


@pytest.mark.parametrize("name", list(CALLS))
def test_threads_split_the_rows_and_keep_every_bit(name, ran):
    before = loops.threads()
    loops.threads(from_elements=1024, count=3)
    try:
        x, w = _inputs(name, (64, 96), np.float32, 3)
        native, numpy = _both(name, x, w)
    finally:
        loops.threads(*before)
    _same_bits(tg.data(native), tg.data(numpy), name)
    assert name in ran


# each rule's arrays and keywords as `native_rules.run` takes them, from `(x, weights)`
ARGUMENTS = {
    "gelu": lambda x, w: ((x,), {}),
    "gelu_vjp": lambda x, w: ((x, w), {}),
    "softmax": lambda x, w: ((x,), {"axis": -1}),
    "softmax_vjp": lambda x, w: ((x, w), {"axis": -1}),
    "normalise_vjp": lambda x, w: ((x, x, w), {"axes": (-1,)}),
    "crossentropy": lambda x, w: ((x, w), {"axis": -1, "agg": "mean", "normalized": True}),
}
UNTAKEN = {
    "fewer elements than FROM": lambda x: x[:3, :5].copy(),
    "a strided view": lambda x: x[:, ::2],
    "Fortran order": np.asfortranarray,
    "float16": lambda x: x.astype(np.float16),
    "int64": lambda x: x.astype(np.int64),
    "byte-swapped": lambda x: x.astype(x.dtype.newbyteorder()),
}


def test_every_rule_has_its_arguments_here():
    assert set(ARGUMENTS) == set(native_rules.RULES)


@pytest.mark.parametrize("change", list(UNTAKEN))
@pytest.mark.parametrize("name", list(ARGUMENTS))
def test_what_the_loops_do_not_take_is_left_to_the_numpy_code(name, change):
    x, w = (domain((40, 64), np.float64, seed=k, special=0.0) for k in (4, 5))
    arrays, kw = ARGUMENTS[name](x, w)
    assert native_rules.run(name, *arrays, **kw) is not None  # as given, taken
    assert native_rules.run(name, *[UNTAKEN[change](a) for a in arrays], **kw) is None, change
    mixed = [arrays[0].astype(np.float32), *arrays[1:]] if len(arrays) > 1 else arrays
    assert len(arrays) == 1 or native_rules.run(name, *mixed, **kw) is None, "mixed dtypes"
    with dispatch.generic_only():
        assert native_rules.run(name, *arrays, **kw) is None


def test_statistics_over_leading_axes_run_the_numpy_code(ran):
    x, w = _inputs("softmax", (40, 64), np.float64, 5)
    with np.errstate(all="ignore"):
        native = tg.nn.softmax(x, axis=0)
        grad = _gradient(lambda v: nn.normalise(v, axes=(0,)), x, w)
        with dispatch.generic_only():
            _same_bits(native, tg.nn.softmax(x, axis=0), "softmax over axis 0")
            again = _gradient(lambda v: nn.normalise(v, axes=(0,)), x, w)
    _same_bits(grad, again, "normalise over axis 0")
    assert not ran


def test_a_second_derivative_takes_the_numpy_code_for_its_tracked_gradient(ran):
    x = np.linspace(-4.0, 4.0, 2048).reshape(32, 64)

    def first(v):
        return tg.sum(tg.gradient(lambda y: tg.sum(tg.nn.gelu(y) * 0.75), v)[0] * 0.5)

    got = tg.gradient(first, x)[0]
    with dispatch.generic_only():
        _same_bits(got, tg.gradient(first, x)[0], "gelu's second derivative")
    assert "gelu" in ran and "gelu_vjp" not in ran  # the nested pullback's gradient is tracked


@pytest.mark.parametrize("name", ["gelu", "gelu_vjp"])
def test_a_reported_floating_point_exception_raises_as_the_numpy_code_does(name):
    """An overflow (x * x of 1e30 in float32) that NumPy's settings raise: the loop flags it,
    and the NumPy code raises it."""
    x = np.full((40, 64), 1e30, np.float32)
    w = np.ones_like(x)
    for context in (dispatch.generic_only, lambda: np.errstate()):  # numpy code, then native
        with context(), np.errstate(all="raise"), pytest.raises(FloatingPointError):
            CALLS[name](x, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(CALLS))
def test_the_same_warnings_as_the_numpy_code(name, dtype):
    """Under NumPy's default settings, over the whole domain (overflows, inf - inf, 0 * inf)."""
    import contextlib
    import warnings

    x, w = _inputs(name, (40, 64), dtype, 6)

    def warned(context):
        with context(), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            CALLS[name](x, w)
        return sorted(str(s.message) for s in seen)

    numpy = warned(dispatch.generic_only)
    assert numpy, "the domain makes the NumPy code warn"
    assert warned(contextlib.nullcontext) == numpy
