"""`tg.compile` fusion of the backward passes: each chain of elementwise pullbacks replayed as
one generated C++ loop (`compiler/backward.py`), against eager: gradients bit for bit (by
default: the correctly rounded arithmetic of the vjps), within a few units in the last place
where a vjp reads the C library (`fuse=True`), the same built with and without vectorisation,
and NumPy's operations where a replay hands a chain something else than it recorded.
"""

import numpy as np
import pytest
from domain import assert_agree, domain
from test_compile_fusion import (
    _finite,
    _quiet,
    _read_outside,
    _same_bits,
    _wide_program,
    _written,
    cache,
    every_region,
    fallbacks,
)

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.compiler import backward, fusion, loops, numpy_loops, opened
from tracker_gpu.train.text_loop import TextConfig, build, compiled_text_step, rule, text_step

pytestmark = pytest.mark.skipif(loops.compiler() is None, reason="no C++ compiler")
# the fixtures: a cache of the module's own, small regions, the replays' fallbacks
__all__ = ["cache", "every_region", "fallbacks"]


UNARY_CHAIN = {
    "tanh": tg.tanh, "relu": nn.relu, "sqrt": lambda y: tg.sqrt(tg.abs(y)), "square": tg.square,
    "exp": lambda y: tg.exp(y * 1e-3), "log": lambda y: tg.log(tg.abs(y) + 1.0),
    "neg": tg.negative, "div": lambda y: 1.5 / (y + 3.0), "sub": lambda y: 0.5 - y * 0.25,
    "mask": lambda y: tg.where(MASK, y * 0.5, -np.inf),  # a constant mask: attention's
    "unmask": lambda y: tg.where(MASK, 1.0, y),
}  # fmt: skip
MASK = np.random.default_rng(12).random(29) < 0.7  # broadcast over the rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", range(4))
def test_chains_of_pullbacks_are_one_kernel_bit_for_bit(seed, dtype, fallbacks):
    """A chain of elementwise pullbacks (the vjps of `tanh`, `relu`, `sqrt`, `square`, `exp`,
    `log`, arithmetic) is fused by default (their arithmetic is correctly rounded, `exp`'s
    and `tanh`'s C library calls stay NumPy's forwards): gradients are eager's bit for bit,
    and a replay runs each chain's kernel (none falls back to NumPy's operations)."""
    rng = np.random.default_rng([seed, 13])
    names = [str(rng.choice(list(UNARY_CHAIN))) for _ in range(int(rng.integers(3, 9)))]

    def loss(x):
        y = x
        for name in names:
            y = UNARY_CHAIN[name](y)
        return tg.sum(_finite(y))

    x = domain((37, 29), dtype, seed=seed)
    step = tg.compile(loss)
    _quiet(step, x)
    got, eager = _quiet(step, x), _quiet(tg.withgradient, loss, x)
    assert not fallbacks, f"{fallbacks}: a chain of {names} was refused its recorded arrays"
    _same_bits(got.val, eager.val, f"loss of {names}")
    _same_bits(got.grad[0], eager.grad[0], f"gradient of {names}")
    if loops.default_fuse() == "exact":
        program = step.programs()[0]
        assert program.chains and program.source.count("BK") == len(program.chains), names
        assert _read_outside(program), names  # a region's extra outputs: values read outside


def test_values_saved_by_the_pullbacks_are_outputs_of_one_region():
    """`square`'s pullback saves its input, made by the region: the forward pass is one region
    writing the three saved values and its last (one loop, four stores), the backward pass one
    chain reading them; values and gradients eager's bit for bit, over the whole domain."""

    def f(x):
        y = x
        for _ in range(4):
            y = tg.square(y) * 0.75 + 0.25
        return tg.sum(_finite(y))

    for dtype in (np.float32, np.float64):
        x = domain((41, 27), dtype, seed=3)
        step = tg.compile(f, fuse="exact")
        _quiet(step, x)
        got, eager = _quiet(step, x), _quiet(tg.withgradient, f, x)
        program = step.programs()[0]
        # the region: 4 x (square, * 0.75, + 0.25), then _finite's abs, < and where
        assert program.fused == 1 and _written(program) == [5], program.source
        _same_bits(got.val, eager.val, "loss")
        _same_bits(got.grad[0], eager.grad[0], "gradient")


def test_the_mixed_chain_is_one_region_per_256_operations_with_fuse_true():
    """The benchmark's chain mixed (`* c`, `sin`, `+ c`, `tanh`): `sin` saves its input and
    `tanh` its output, so no region formed before regions had several outputs; with
    `fuse=True` each region writes the values its pullbacks read, half of its operations'."""
    kinds = [lambda y: y * 1.0001, tg.sin, lambda y: y + 0.5, tg.tanh] * 125

    def f(x):
        y = x
        for kind in kinds:
            y = kind(y)
        return tg.sum(y)

    x = domain((3, 5), np.float64, seed=4)
    x = np.where(np.abs(x) < 1e3, x, 0.5)  # a finite loss
    step = tg.compile(f, fuse=True)
    _quiet(step, x)
    got, eager = _quiet(step, x), _quiet(tg.withgradient, f, x)
    program = step.programs()[0]
    # 500 operations: regions of 244 and 256 (`fusion.MAX_OPS`), from the end; of every four,
    # two are read by a pullback (`* c`'s value by sin's, tanh's own), the last among them
    assert program.fused == 2 and _written(program) == [122, 128], _written(program)
    assert _read_outside(program)
    # 250 functions of the C library, each within 4 ulps of NumPy's, then their product
    assert_agree(got.val, eager.val, ulps=1000)
    assert_agree(got.grad[0], eager.grad[0], ulps=1000)


def test_a_chain_of_multiplications_by_a_number_is_one_kernel_both_ways(monkeypatch):
    """The benchmark's chain `y * c`: the forward pass one kernel, its backward pass another."""
    monkeypatch.setattr(fusion, "SMALL_OPS", 8)

    def f(x):
        y = x
        for _ in range(50):
            y = y * 1.0001
        return tg.sum(y)

    x = np.array([0.5])
    step = tg.compile(f)
    step(x)
    got, eager = step(x), tg.withgradient(f, x)
    if loops.default_fuse() == "exact":
        program = step.programs()[0]
        assert program.fused == 1 and len(program.chains) == 1, program.source
        assert program.source.count(" * ") == 0, program.source  # no multiplication left
    _same_bits(got.val, eager.val, "loss")
    _same_bits(got.grad[0], eager.grad[0], "gradient")


@pytest.mark.parametrize("own", [True, False])
def test_the_functions_in_a_pullback_are_numpys_loops_else_fused_with_fuse_true_only(
    own, monkeypatch
):
    """`sin`'s vjp reads `cos`: NumPy's own loop inside the chain with either `fuse`, bit for
    bit; where that loop cannot be had, the C library's with `fuse=True` (within 4 ulps), and
    not fused by default."""
    if not own:
        monkeypatch.setattr(numpy_loops, "available", lambda op, dtype: False)

    def loss(x):
        return tg.sum(tg.sin(x * 0.5 + 0.25) * 3.0)

    x = np.random.default_rng(14).standard_normal((50, 40)) * 10.0
    exact, libm = tg.compile(loss, fuse="exact"), tg.compile(loss, fuse=True)
    for step in (exact, libm):
        _quiet(step, x)
    eager = _quiet(tg.withgradient, loss, x)
    _same_bits(_quiet(exact, x).grad[0], eager.grad[0], "exact")
    chains = [str(c.region.ops) for c in exact.programs()[0].chains.values()]
    assert any("cos" in c for c in chains) == own
    assert any("cos" in str(c.region.ops) for c in libm.programs()[0].chains.values())
    if own:
        _same_bits(_quiet(libm, x).grad[0], eager.grad[0], "fuse=True")
    else:
        assert_agree(_quiet(libm, x).grad[0], eager.grad[0], ulps=4, what="sin's vjp, fused")


def test_a_chain_given_something_else_takes_numpys_operations():
    """A chain's guard: a NumPy scalar (made a 0-d array), a view (copied contiguous) and
    NumPy's operations themselves give eager's result."""
    step = tg.compile(lambda x: tg.sum(tg.tanh(x) * 2.0 - x))
    x = np.random.default_rng(15).standard_normal((64, 20))
    _quiet(step, x)
    (chain,) = step.programs()[0].chains.values()
    values = [np.array(1.0) if k == "g" else domain((64, 20), np.float64, seed=16)
              for k, _ in chain.inputs]  # fmt: skip
    expected = _quiet(chain.run, *values)
    scalars = [v[()] if v.ndim == 0 else v for v in values]
    _same_bits(_quiet(chain.run, *scalars), expected, "a NumPy scalar")
    _same_bits(_quiet(backward.evaluate, chain.region, values), expected, "NumPy's operations")
    strided = [np.asfortranarray(v) for v in values]
    _same_bits(_quiet(chain.run, *strided), expected, "a view")


@pytest.mark.parametrize("seed", range(3))
def test_vectorised_gradients_are_the_scalar_ones_bit_for_bit(seed, monkeypatch):
    rng = np.random.default_rng([seed, 17])
    for _ in range(3):
        f, plan, inputs = _wide_program(rng)
        loss = lambda *a, f=f: tg.sum(_finite(f(*a)))  # noqa: E731
        results = {}
        for vectorise in (True, False):
            monkeypatch.setattr(loops, "VECTORISE", vectorise)
            step = tg.compile(loss)
            _quiet(step, *inputs)
            results[vectorise] = _quiet(step, *inputs)
        eager = _quiet(tg.withgradient, loss, *inputs)
        for got in results.values():
            _same_bits(got.val, eager.val, f"loss of {plan}")
            for g, e in zip(got.grad, eager.grad):
                _same_bits(g, e, f"gradient of {plan}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_masked_product_pulls_back_as_one_kernel_bit_for_bit(dtype, fallbacks):
    """Attention's masked scores, `where(mask, x * scale, -inf)` with a mask made while
    recording: `where`'s pullback reads the mask, a boolean array, where the program keeps it,
    and joins the product's in one chain, whose kernel runs at every replay (its guard takes
    the mask as recorded, not for NumPy's operations); gradients are eager's bit for bit,
    zeros' signs included."""
    mask = np.tril(np.ones((24, 24), bool))

    def loss(x):
        y = tg.exp(tg.where(mask, x * 0.25, -np.inf))
        return tg.sum(_finite(y * x))

    x = domain((6, 24, 24), dtype, seed=21)
    step = tg.compile(loss, fuse="exact")
    _quiet(step, x)
    got, eager = _quiet(step, x), _quiet(tg.withgradient, loss, x)
    assert not fallbacks, f"{fallbacks}: a chain's kernel was refused its recorded arrays"
    _same_bits(got.val, eager.val, "the loss")
    _same_bits(got.grad[0], eager.grad[0], "the gradient")
    chains = step.programs()[0].chains.values()
    assert any(c.count >= 2 and any(op == "where" for op, _, _ in c.region.ops) for c in chains)


def test_the_transformers_training_step_replays_every_kernel(fallbacks):
    """The text job's step (attention's masked scores, softmax, GELU, the normalisations,
    cross-entropy, AdamW, clipping), every region fused however small: every opened rule is
    opened, its replays run every kernel they built, none refused its recorded arrays, and
    they train as eager does, bit for bit."""
    config = TextConfig(layers=1, width=16, heads=2, context=16, batch_size=4, steps=3)
    rng = np.random.default_rng(31)
    x, y = rng.integers(0, 20, (4, 16)), rng.integers(0, 20, (4, 16))
    model, _ = build(config, 20)
    runs = {"eager": text_step, "compiled": compiled_text_step()}
    held = {kind: (model, optim.setup(rule(config), model)) for kind in runs}
    for _ in range(3):
        losses = {}
        for kind, step in runs.items():
            loss, *held[kind] = _quiet(step, *held[kind], x, y)
            losses[kind] = loss
        _same_bits(losses["compiled"], losses["eager"], "the loss")
    program = runs["compiled"].compiled.programs()[0]
    assert program.fused and program.chains, "nothing fused"
    assert not fallbacks, f"{fallbacks} in a replay of the transformer's step"
    forwards = {c.node.rule for s in program.steps if type(s) is fusion.Fused for c in s.calls}
    pullbacks = {c.opening[0] for c in program.chains.values() if c.opening is not None}
    for kind, (forward, vjp) in opened.OPENED.items():  # the model calls every opened rule
        assert forward is None or kind in forwards, f"{kind.name}'s forward is not opened"
        assert vjp is None or vjp in pullbacks, f"{kind.name}'s pullback is not opened"
