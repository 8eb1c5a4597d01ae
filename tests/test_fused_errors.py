"""Floating-point exceptions in fused replays: a kernel that raises one which NumPy's settings
(`np.errstate`, `np.seterr`) do not ignore hands its work to NumPy's steps, which warn or raise
as the eager run does. Every kind of exception and every mode, through a forward region, a
backward chain and an opened rule, against the eager run of the same function."""

import contextlib
import warnings

import numpy as np
import pytest
from test_compile_fusion import _finite

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.compiler import backward, fusion, loops, opened, row_loops

pytestmark = pytest.mark.skipif(loops.compiler() is None, reason="no C++ compiler")

N = 2048  # regions of a few operations pay from 1,024 elements


def _values(kind):
    """Values that make `kind` happen in the programs below, beside ordinary ones."""
    x = np.linspace(0.5, 2.0, N)
    x[::7] = {"divide": 0.0, "over": 800.0, "under": 1e-300, "invalid": -3.0}[kind]
    return x


PROGRAMS = {
    "region, arithmetic": lambda x: tg.sum(_finite(1.0 / (x * 1.0) * 2.0 + x * 1e-300 * 1e-300)),
    "region, NumPy's exp": lambda x: tg.sum(_finite(tg.exp(x * 2.0) * 3.0 - 1.0)),
    "region, NumPy's log": lambda x: tg.sum(_finite(tg.log(x * 1.0 + 0.5) * 3.0)),
    "chain, sqrt's pullback": lambda x: tg.sum(_finite(tg.sqrt(x * 1.0) * 2.0)),
    "opened rule, gelu": lambda x: tg.sum(_finite(nn.gelu(x * 1e153))),
}


def _run(function, x, mode):
    """`(outcome, warnings)`: the value and gradient's bits, or the exception's type; the
    messages of the warnings NumPy gave."""
    with warnings.catch_warnings(record=True) as seen, np.errstate(all=mode):
        warnings.simplefilter("always")
        try:
            val, (grad,) = function(x)
            outcome = (np.asarray(val).tobytes(), np.asarray(grad).tobytes())
        except Exception as error:  # eager's pullbacks wrap it (PullbackError), a replay not
            while error.__cause__ is not None:
                error = error.__cause__
            outcome = type(error)
    return outcome, sorted({str(w.message) for w in seen if w.category is RuntimeWarning})


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("kind", ["divide", "over", "under", "invalid"])
@pytest.mark.parametrize("mode", ["ignore", "warn", "raise"])
def test_a_replay_reports_what_eager_reports(name, kind, mode):
    f = PROGRAMS[name]
    x = _values(kind)
    step = tg.compile(f)
    with np.errstate(all="ignore"):
        step(x)  # the recording
        step(x)  # the first replay, generated and fused
    program = step.programs()[0]
    assert program.fused or program.chains, name
    eager = _run(lambda x: tg.withgradient(f, x), x, mode)
    compiled = _run(step, x, mode)
    assert compiled == eager, (name, kind, mode, compiled[1], eager[1])


def test_the_status_is_read_only_where_a_flag_is_raised(monkeypatch):
    """The common case costs nothing: no flag, no look at NumPy's settings."""
    looked = []
    monkeypatch.setattr(np, "geterr", lambda: looked.append(1) or {})
    step = tg.compile(PROGRAMS["region, NumPy's exp"])
    x = np.linspace(0.5, 2.0, N)
    step(x)
    step(x)
    assert step.programs()[0].fused and not looked


def test_each_kind_of_kernel_hands_over_to_numpy(monkeypatch):
    """The programs above go through each guard: a region's steps, a chain's NumPy operations
    and an opened rule's own code run where a kernel raised what NumPy reports."""
    seen = []
    for module, name in ((fusion, "_stepwise"), (backward, "evaluate"), (opened, "own_code")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, f=original, n=name: seen.append(n) or f(*a))
    cases = (("region, NumPy's exp", "over", "_stepwise"),
             ("chain, sqrt's pullback", "divide", "evaluate"),
             ("opened rule, gelu", "over", "own_code"))  # fmt: skip
    for name, kind, guard in cases:
        step, x = tg.compile(PROGRAMS[name]), _values(kind)
        with np.errstate(all="ignore"):
            step(x)
            step(x)
            assert not seen, name  # ignored: the kernels' results stand
        _run(step, x, "warn")
        assert guard in seen, (name, seen)
        seen.clear()


@pytest.mark.parametrize("mode", ["ignore", "warn", "raise"])
def test_the_row_loop_reports_what_numpy_reports(mode):
    """A row holding +inf: its maximum is inf, and inf - inf is nan, which NumPy reports."""
    x = np.linspace(-1.0, 1.0, 4 * 64).reshape(4, 64)
    x[1, 5] = np.inf
    expected = _shifted(lambda: x - x.max(axis=-1, keepdims=True), mode)
    assert _shifted(lambda: row_loops.shifted(np, x, -1), mode) == expected


def _shifted(function, mode):
    with warnings.catch_warnings(record=True) as seen, np.errstate(all=mode):
        warnings.simplefilter("always")
        try:
            outcome = function().tobytes()
        except FloatingPointError:
            outcome = FloatingPointError
    return outcome, sorted(str(w.message) for w in seen if w.category is RuntimeWarning)


@pytest.mark.parametrize("mode", ["ignore", "warn", "raise"])
@pytest.mark.parametrize("rule", ["Descent", "Momentum", "Nesterov", "Adam"])
def test_an_eager_optimiser_step_reports_what_its_rule_reports(rule, mode):
    """The native steps of eager NumPy parameters: a gradient whose square overflows (Adam's
    second moment) or a step that does, reported as the generic rule's operations report it."""
    from tracker_gpu import optim
    from tracker_gpu.cuda import generic_only

    params = {"w": np.linspace(1.0, 2.0, 64)}
    grads = {"w": np.full(64, 1e300)}
    rule_of = getattr(optim, rule)
    outcomes = []
    for generic in (False, True):
        with contextlib.ExitStack() as stack:
            if generic:
                stack.enter_context(generic_only())
            state = optim.setup(rule_of(1e10) if rule != "Adam" else rule_of(), params)
            outcomes.append(_run(lambda p, s=state: _stepped(s, p, grads), params, mode))
    assert outcomes[0] == outcomes[1], (rule, mode)


def _stepped(state, params, grads):
    """`(new parameter, the state's arrays)` of one update, as `_run` takes a result."""
    from tracker_gpu import optim

    state, params = optim.update(state, params, grads)
    return params["w"], (np.concatenate([np.ravel(a) for a in _arrays(state)]),)


def _arrays(tree):
    if isinstance(tree, np.ndarray):
        return [tree]
    if isinstance(tree, dict):
        return [a for v in tree.values() for a in _arrays(v)]
    if isinstance(tree, (list, tuple)):
        return [a for v in tree for a in _arrays(v)]
    state = getattr(tree, "state", None)
    return _arrays(state) if state is not None else []
