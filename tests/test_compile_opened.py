"""Rules the host target opens (`compiler/opened.py`, every rule of its table): replayed as
generated loops around the library's own calls, their values and gradients are eager's bit for
bit over the whole domain, in float32 and float64; anything else than the recorded arrays
takes the rule's own code; small arrays stay NumPy's; a second derivative through a compiled
function is eager's. Eager's references run the rules' NumPy code (`generic_only`): eagerly too
the rules take these loops (`compiler/native_rules.py`)."""

import functools

import numpy as np
import pytest
from domain import domain
from test_compile_fusion import _quiet, _same_bits, cache, fallbacks

import tracker_gpu as tg
from tracker_gpu.compiler import fusion, loops, opened
from tracker_gpu.cuda import dispatch
from tracker_gpu.nn.primitives import gelu_tanh
from tracker_gpu.rules import losses, nn

pytestmark = pytest.mark.skipif(loops.compiler() is None, reason="no C++ compiler")
__all__ = ["cache", "fallbacks"]  # the fixtures: a cache of the module's own, the fallbacks

SHAPE = (48, 40)  # more elements than fusion.SMALL_SIZE: opened


def _targets(shape, dtype):
    """One-hot rows, a few of them all zeros (their terms are where's zeros)."""
    rng = np.random.default_rng(7)
    t = np.zeros(shape, dtype)
    t[np.arange(shape[0]), rng.integers(0, shape[1], shape[0])] = 1
    t[::5] = 0
    return t


# how a loss reaches each opened rule (a rule added to the table needs its line here)
CALLS = {
    gelu_tanh: lambda x: gelu_tanh(x),
    nn.softmax: lambda x: nn.softmax(x, axis=-1),
    nn.normalise: lambda x: nn.normalise(x, axes=(-1,)),
    losses.logitcrossentropy_primitive: lambda x: losses.logitcrossentropy_primitive(
        x, _targets(x.shape, x.dtype), axis=-1, agg="mean", normalized=True
    ),
}
RULES = list(opened.OPENED)


def test_every_opened_rule_is_called_here():
    assert set(RULES) == set(CALLS)


def _loss(rule, weights):
    def loss(x):
        y = CALLS[rule](x) * weights  # a gradient of every value, signs and zeros included
        return tg.sum(tg.where(tg.abs(y) < 1e30, y, 0.0))

    return loss


def _numpy_code(function, *args):
    """`function(*args)` with the rules' NumPy code, quietly."""
    with dispatch.generic_only():
        return _quiet(function, *args)


def _opened_parts(program):
    forwards = [s for s in program.steps if type(s) is fusion.Fused and len(s.calls) == 1
                and s.calls[0].node.rule in opened.OPENED]  # fmt: skip
    chains = [c for c in program.chains.values() if c.opening is not None]
    return forwards, chains


def _expected_parts(rule):
    forward, vjp = opened.OPENED[rule]
    return int(forward is not None), int(vjp is not None)


def _compiled_as_eager(loss, x, what):
    """`loss` compiled (`fuse="exact"`), its value and gradient checked bit for bit against
    eager's at its second call: `(step, its opened parts)`."""
    step = tg.compile(loss, fuse="exact")
    _quiet(step, x)
    got, eager = _quiet(step, x), _numpy_code(tg.withgradient, loss, x)
    _same_bits(got.val, eager.val, f"{what}: the loss")
    _same_bits(got.grad[0], eager.grad[0], f"{what}: the gradient")
    return step, _opened_parts(step.programs()[0])


def _input(rule, dtype, seed):
    x = domain(SHAPE, dtype, seed=seed)
    if rule is losses.logitcrossentropy_primitive:  # logits: an inf makes every term nan
        x = np.where(np.isfinite(x), x, 0.0).astype(dtype)
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
@pytest.mark.parametrize("seed", range(3))
def test_opened_rules_replay_eager_bit_for_bit(rule, dtype, seed, fallbacks):
    """Replays on the recording's kinds of arrays run the opened code (no fallback to the
    rule's own), bit for bit eager's."""
    x = _input(rule, dtype, seed)
    weights = domain(x.shape if rule is not losses.logitcrossentropy_primitive else (),
                     dtype, seed=seed + 10, special=0.1)  # fmt: skip
    loss = _loss(rule, weights)
    step, (forwards, chains) = _compiled_as_eager(loss, x, rule.name)
    assert (len(forwards), len(chains)) == _expected_parts(rule), (forwards, chains)
    again = _input(rule, dtype, seed + 20)  # new arguments, the same program
    _same_bits(_quiet(step, again).grad[0], _numpy_code(tg.withgradient, loss, again).grad[0],
               f"{rule.name}: a second call")  # fmt: skip
    assert not fallbacks, f"{fallbacks} in a replay of {rule.name}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_something_else_than_recorded_takes_the_rules_own_code(rule):
    step = tg.compile(_loss(rule, 1.5))
    x = _input(rule, np.float64, 4)
    _quiet(step, x)
    forwards, chains = _opened_parts(step.programs()[0])
    changes = (("a view", np.asfortranarray), ("float32", lambda a: a.astype(np.float32)))
    runs = [(f.run, f.calls[0], "forward") for f in forwards]
    runs += [(c.run, c, "pullback") for c in chains]
    for run, part, what in runs:
        opening, *_, kw = part.opening if what == "pullback" else _opening_of(part)
        eager = functools.partial(opening.eager, **kw)
        arrays = [domain(SHAPE, np.float64, seed=5 + k) for k in range(len(part.inputs))]
        expected = _numpy_code(eager, *arrays)
        _same_bits(_quiet(run, *arrays), expected, f"{rule.name} {what}: the recorded arrays")
        for name, change in changes:
            changed = [_quiet(change, a) for a in arrays]
            _same_bits(_quiet(run, *changed), _numpy_code(eager, *changed),
                       f"{rule.name} {what}: {name}")  # fmt: skip


def _opening_of(call):
    types = {slot: ("array", np.dtype(np.float64), SHAPE) for slot in call.inputs}
    return opened.forward(call, types)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_small_arrays_stay_numpys(rule):
    step = tg.compile(_loss(rule, 2.0))
    x = domain((3, 5), np.float64, seed=6, special=0.0)
    got = _quiet(step, x)
    assert _opened_parts(step.programs()[0]) == ([], [])
    _same_bits(got.grad[0], _quiet(tg.withgradient, _loss(rule, 2.0), x).grad[0], "small")


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_a_second_derivative_through_an_opened_rule_is_eagers(rule):
    def first(x):
        return tg.sum(tg.gradient(lambda y: tg.sum(CALLS[rule](y) * 0.75), x)[0] * 0.5)

    x = np.linspace(-4.0, 4.0, 2048).reshape(32, 64)
    step = tg.compile(first, gradient=True)
    _quiet(step, x)
    got, eager = _quiet(step, x), _numpy_code(tg.withgradient, first, x)
    _same_bits(got.val, eager.val, "the value")
    _same_bits(got.grad[0], eager.grad[0], "the second derivative")


def _onehot_columns(shape, dtype):
    return _targets(shape[::-1], dtype).T.copy()


OTHER_AXES = {
    "softmax over axis 0": lambda x: nn.softmax(x, axis=0),
    "normalise over (0,)": lambda x: nn.normalise(x, axes=(0,)),
    "normalise over (0, 2)": lambda x: nn.normalise(tg.reshape(x, (8, 6, 40)), axes=(0, 2)),
    "cross-entropy over axis 0, summed": lambda x: losses.logitcrossentropy_primitive(
        x, _onehot_columns(x.shape, x.dtype), axis=0, agg="sum", normalized=True
    ),
}


@pytest.mark.parametrize("name", list(OTHER_AXES))
def test_opened_rules_on_other_axes_replay_eager_bit_for_bit(name):
    x = domain(SHAPE, np.float64, seed=2, special=0.1)
    if "cross-entropy" in name:
        x = np.where(np.isfinite(x), x, 0.0)

    def loss(x):
        y = OTHER_AXES[name](x)
        return tg.sum(tg.where(tg.abs(y) < 1e30, y * 0.75, 0.0))

    _, (forwards, chains) = _compiled_as_eager(loss, x, name)
    assert forwards or chains, name
