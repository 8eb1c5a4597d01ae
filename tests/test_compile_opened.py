"""Rules the host target opens (`compiler/opened.py`, every rule of its table): replayed as
generated loops around the library's own function, their values and gradients are eager's bit
for bit over the whole domain, in float32 and float64; anything else than the recorded arrays
takes the rule's own code; small arrays stay NumPy's; a second derivative through a compiled
function is eager's."""

import numpy as np
import pytest
from domain import domain
from test_compile_fusion import _quiet, _same_bits, cache

import tracker_gpu as tg
from tracker_gpu.compiler import fusion, loops, opened

pytestmark = pytest.mark.skipif(loops.compiler() is None, reason="no C++ compiler")
__all__ = ["cache"]  # the fixture: a cache of the module's own

RULES = list(opened.OPENED)
SHAPE = (48, 40)  # more elements than fusion.SMALL_SIZE: opened


def _loss(rule, weights):
    def loss(x):
        y = rule(x) * weights  # a gradient of every value, signs and zeros included
        return tg.sum(tg.where(tg.abs(y) < 1e30, y, 0.0))

    return loss


def _opened_parts(program, rule):
    forwards = [s for s in program.steps if type(s) is fusion.Fused
                and any(c.node.rule is rule for c in s.calls) and len(s.calls) == 1]  # fmt: skip
    chains = [c for c in program.chains.values() if c.opening is not None]
    return forwards, chains


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
@pytest.mark.parametrize("seed", range(3))
def test_opened_rules_replay_eager_bit_for_bit(rule, dtype, seed):
    x = domain(SHAPE, dtype, seed=seed)
    weights = domain(SHAPE, dtype, seed=seed + 10, special=0.1)
    loss = _loss(rule, weights)
    step = tg.compile(loss, fuse="exact")
    _quiet(step, x)
    got, eager = _quiet(step, x), _quiet(tg.withgradient, loss, x)
    _same_bits(got.val, eager.val, f"{rule.name}: the loss")
    _same_bits(got.grad[0], eager.grad[0], f"{rule.name}: the gradient")
    forwards, chains = _opened_parts(step.programs()[0], rule)
    assert len(forwards) == 1 and len(chains) == 1, (forwards, chains)
    again = domain(SHAPE, dtype, seed=seed + 20)  # new arguments, the same program
    _same_bits(_quiet(step, again).grad[0], _quiet(tg.withgradient, loss, again).grad[0],
               f"{rule.name}: a second call")  # fmt: skip


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_something_else_than_recorded_takes_the_rules_own_code(rule):
    step = tg.compile(_loss(rule, 1.5))
    x = domain(SHAPE, np.float64, seed=4)
    _quiet(step, x)
    forwards, chains = _opened_parts(step.programs()[0], rule)
    (forward,), (chain,) = forwards, chains
    (vjp,) = [v for v in rule.vjps if v is not None]
    g = domain(SHAPE, np.float64, seed=5)
    expected_value = _quiet(rule.forward, np, x)
    expected_gradient = _quiet(vjp, g, None, x)
    changes = (("a view", np.asfortranarray), ("float32", lambda a: a.astype(np.float32)))
    for what, change in changes:
        y, h = _quiet(change, x), _quiet(change, g)
        _same_bits(_quiet(forward.run, y), _quiet(rule.forward, np, y), f"{what}: forward")
        _same_bits(_quiet(chain.run, y, h), _quiet(vjp, h, None, y), f"{what}: pullback")
    _same_bits(_quiet(forward.run, x), expected_value, "the recorded arrays: forward")
    _same_bits(_quiet(chain.run, x, g), expected_gradient, "the recorded arrays: pullback")


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_small_arrays_stay_numpys(rule):
    step = tg.compile(_loss(rule, 2.0))
    x = domain((3, 5), np.float64, seed=6)
    got = _quiet(step, x)
    assert _opened_parts(step.programs()[0], rule) == ([], [])
    _same_bits(got.grad[0], _quiet(tg.withgradient, _loss(rule, 2.0), x).grad[0], "small")


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_a_second_derivative_through_an_opened_rule_is_eagers(rule):
    def first(x):
        return tg.sum(tg.gradient(lambda y: tg.sum(rule(y)), x)[0] * 0.5)

    x = np.linspace(-4.0, 4.0, 2048)
    step = tg.compile(first, gradient=True)
    _quiet(step, x)
    got, eager = _quiet(step, x), _quiet(tg.withgradient, first, x)
    _same_bits(got.val, eager.val, "the value")
    _same_bits(got.grad[0], eager.grad[0], "the second derivative")
