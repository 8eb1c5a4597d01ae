"""The optimiser steps built natively for the host (`cuda/native.py`): an eager NumPy update takes
them, and each is the generic rule's step bit for bit over the whole domain (zeros of both
signs, subnormals, huge values, infinities, nan), for every rule with a fused step, in float32
and float64, through several steps. Where they cannot run (no compiler, a layout or dtype they
do not take, `generic_only()`), the generic rule steps: the same answer."""

import warnings

import numpy as np
import pytest

from tests.domain import domain
from tracker_gpu import optim
from tracker_gpu.cuda import dispatch, native
from tracker_gpu.cuda.dispatch import generic_only, recording

pytestmark = pytest.mark.skipif(
    not native.available(), reason="no native build (no compiler, or not x86-64)"
)

RULES = {
    "Descent": [optim.Descent(0.1), optim.Descent(3.0)],
    "Momentum": [optim.Momentum(0.01, 0.9), optim.Momentum(3.0, 0.0)],
    "Nesterov": [optim.Nesterov(0.01, 0.9), optim.Nesterov(0.1, 0.99)],
    "Adam": [optim.Adam(1e-3), optim.Adam(0.1, (0.5, 0.9), 0.0), optim.Adam(3.0, (0.0, 0.0), 1.0)],
    "AdamW": [
        optim.AdamW(1e-3, weight_decay=0.1),
        optim.AdamW(0.1, (0.5, 0.9), 0.01, 1e-8, couple=False),
        optim.AdamW(3.0, (0.0, 0.0), 0.0, 1.0),
    ],
}
CASES = [(name, k) for name, rules in RULES.items() for k in range(len(rules))]


def test_every_fused_step_is_covered_and_built():
    """The table above names every rule with a fused step; the native build has each kernel."""
    assert set(RULES) == set(dispatch.STEPS)
    assert set(native.KERNELS) <= set(native.family(native.FAMILY).kernels)


def _same_bits(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, what
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    same &= (np.signbit(a) == np.signbit(b)) | np.isnan(a)
    assert same.all(), f"{what}: {a[~same][:4]} != {b[~same][:4]}"


def _leaves(model, state):
    out = []
    for key in sorted(model):
        out.append((key, model[key]))
        leaf = state[key].state
        for i, a in enumerate(leaf if isinstance(leaf, tuple) else (leaf,)):
            if a is not None:  # the moments, and Adam's powers of the betas (a tuple of floats)
                out.append((f"{key} state {i}", np.asarray(a)))
    return out


def _updates(rule, model, steps, seed, special):
    """`(native, generic)`: the model and state after `steps` updates each way, and the
    kernels the native way launched."""
    results, launched = [], []
    for generic in (False, True):
        state, current = optim.setup(rule, model), model
        for t in range(steps):
            grads = {k: domain(v.shape, v.dtype, seed + 10 * (t + 1), special)
                     for k, v in current.items()}  # fmt: skip
            with np.errstate(all="ignore"), recording() as log:
                if generic:
                    with generic_only():
                        state, current = optim.update(state, current, grads)
                else:
                    state, current = optim.update(state, current, grads)
            launched += [] if generic else [name for kind, name in log if kind == "launch"]
        results.append((current, state))
    return results, launched


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("special", [0.0, 0.3])
@pytest.mark.parametrize("name, k", CASES)
def test_native_steps_are_the_generic_rule_bit_for_bit(name, k, dtype, special):
    rule = RULES[name][k]
    for seed in range(3):
        model = {"w": domain((7, 33), dtype, seed, special), "b": domain((33,), dtype, seed + 1)}
        ((native_model, native_state), (model_g, state_g)), launched = _updates(
            rule, model, 3, seed, special
        )
        assert len(launched) == 3 * len(model), launched  # every step ran natively
        for (what, a), (_, b) in zip(_leaves(native_model, native_state),
                                     _leaves(model_g, state_g)):  # fmt: skip
            _same_bits(a, b, f"{name} {dtype} seed {seed}: {what}")


def test_large_parameters_release_the_lock_and_agree():
    """From `_RELEASE_FROM` elements a call lets other threads run; the answer is the same."""
    rule = optim.Adam(1e-3)
    model = {"w": domain((native._RELEASE_FROM + 5,), "float32", 3, 0.1)}
    ((a, sa), (b, sb)), launched = _updates(rule, model, 2, 3, 0.1)
    assert launched == ["adam_step", "adam_step"]
    for (what, x), (_, y) in zip(_leaves(a, sa), _leaves(b, sb)):
        _same_bits(x, y, what)


@pytest.mark.parametrize(
    "layout",
    [
        lambda w: w.T,  # not C-contiguous
        lambda w: w.astype(np.float16),  # steps in float32: natively, then rounded back
        lambda w: w.astype(">f4"),  # the other byte order: not the kernels' to read
    ],
)
def test_other_layouts_and_dtypes_step_as_the_generic_rule(layout):
    rule = optim.Adam(1e-2)
    model = {"w": layout(domain((6, 5), "float32", 7, 0.0))}
    ((a, sa), (b, sb)), _ = _updates(rule, model, 2, 7, 0.0)
    for (what, x), (_, y) in zip(_leaves(a, sa), _leaves(b, sb)):
        _same_bits(x, y, what)


def test_without_the_build_the_generic_rule_steps(monkeypatch):
    """No compiler (or a failed build): no launch, no warning, the generic answer."""
    monkeypatch.setattr(native, "_state", {"library": None, "tried": True})
    rule = optim.AdamW(1e-2, weight_decay=0.1)
    model = {"w": domain((4, 3), "float64", 11, 0.0)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ((a, sa), (b, sb)), launched = _updates(rule, model, 2, 11, 0.0)
    assert launched == []
    for (what, x), (_, y) in zip(_leaves(a, sa), _leaves(b, sb)):
        _same_bits(x, y, what)


def test_inside_on_host_the_emulated_build_runs_instead():
    """`on_host()` (the test matrix's stand-in for a GPU) keeps the emulated kernels."""
    assert native.takes(np.ones(3))
    with dispatch.on_host():
        assert not native.takes(np.ones(3))
    with generic_only():
        assert not native.takes(np.ones(3))
