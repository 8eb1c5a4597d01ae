"""Differential fuzzing of the fused path against the generic path, with random programs.

Hypothesis draws small programs made only of operations with a fused implementation
(`fused_programs.py`: unary functions, broadcast arithmetic, `tg.broadcast` of random expression
trees, softmax and logsoftmax, the normalisation statistics and the LSTM cell, the losses
sumabs2, mse and logitcrossentropy) over float32 and
float64 inputs that cover the whole floating-point domain, and optimiser steps. The fused path
runs the CUDA kernels: on NumPy arrays through their host build (`on_host`), on CuPy arrays on
the GPU. Each program is checked against the generic path (`generic_only`):

- each step's tracked value against the generic plain value of the step on the same inputs
  (every forward kernel where it runs, and a tracked value against the plain expression's);
- every gradient, from one forward pass taken back once through the fused pullbacks and once
  through the generic ones;
- the launches: each step launched the kernels it must, so generic is never compared with
  generic.

Both paths compute every result by the same formula, operation for operation, but not with the
same functions (NumPy's SIMD exp, log, tanh, sin, cos and pow differ from the C library's by up
to LIBM ulp) nor in the same order where they sum (broadcast reductions, softmax rows, the
cross-entropy). So each element is compared against a bound of its own, never a blanket
tolerance: a forward value within first-order propagation of those differences through the
expression (`expression_bounds`) or the bound of a row's sums, and exactly equal where both run
the same NumPy code; a gradient within Λ ulp of its magnitude (`Mag`): the absolute values of
the partial derivatives times the magnitude of the incoming gradient, summed wherever the
gradient is, Λ the sum over the steps of the ulp each may add.

An element is not compared where the order of a sum decides between overflow and a finite value
(the magnitude it adds up passes the largest finite value), or where a comparison of values the
paths compute differently is too close to call; where a term is ±inf or nan only the nan/inf
pattern is compared. Each generated operation is also checked alone, over every combination of
special values (`test_every_generated_operation_*`). CI runs a bounded, derandomized number of
examples; set TRACKER_GPU_FUZZ_EXAMPLES to run that many per test.
"""

import contextlib
import functools
import math
import os
import string

import numpy as np
import pytest
from domain import assert_agree, domain, special_values
from fused_programs import (
    BINARY,
    BINARY_PARTIALS,
    LAYERS,
    LIBM,
    ROWS,
    SUMS_OF_SQUARES,
    UNARY,
    UNARY_PARTIALS,
    apply,
    evaluate,
    expression,
    expression_bounds,
    operands,
    programs,
)
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

import tracker_gpu as tg
from tracker_gpu import optim
from tracker_gpu.broadcast import _COMPARISONS, trace
from tracker_gpu.cuda import codegen, generic_only, host, on_host, recording
from tracker_gpu.cuda.elementwise import BINARY as FUSED_BINARY
from tracker_gpu.expr import COMPARISONS, SPECIAL, partials, topological

EXAMPLES = int(os.environ.get("TRACKER_GPU_FUZZ_EXAMPLES", "0"))
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


@pytest.fixture(scope="session")
def fused(backend):
    """The context in which the backend's arrays take the fused path."""
    if backend.name in ("numpy", "numpy-fused"):
        if not host.available():
            pytest.skip("no C++ compiler for the host build of the kernels")
        return on_host
    if backend.name == "cupy":
        return contextlib.nullcontext
    pytest.skip(f"{backend.name} arrays never take the fused path (CuPy arrays do, and NumPy "
                "arrays through the host build of the kernels)")  # fmt: skip


@settings(max_examples=EXAMPLES or 1000, **SETTINGS)
@given(program=programs())
def test_programs_agree_with_the_generic_path(backend, fused, program):
    check_program(backend, fused, program)


@settings(max_examples=EXAMPLES or 100, **SETTINGS)
@given(program=programs(trees=True))
def test_programs_with_broadcast_expressions_agree_with_the_generic_path(backend, fused, program):
    check_program(backend, fused, program)


# --- a program both ways
def run(backend, program, arrays, fused_back):
    """Every value (plain) and every input's gradient, backward through the fused pullbacks or
    (`fused_back` false) the generic ones."""
    params = [a if const else tg.param(a) for a, (_, const, _) in zip(arrays, program.inputs)]
    values = evaluate(program, params)
    with contextlib.nullcontext() if fused_back else generic_only():
        tg.back(values[-1])
    grads = [None if const else backend.to_numpy(tg.grad(p))
             for p, (_, const, _) in zip(params, program.inputs)]  # fmt: skip
    return [tg.data(v) for v in values], grads


def check_program(backend, fused, program):
    arrays = [backend.asarray(a) for a in program.arrays()]
    with np.errstate(all="ignore"), tg.sync_checks(False):  # a nan loss is legitimate here
        with fused(), recording() as log:
            values, grads = run(backend, program, arrays, fused_back=True)
        with fused():
            again, expected_grads = run(backend, program, arrays, fused_back=False)
        with generic_only():
            expected = [None if s.op == "input" else apply(s, [values[i] for i in s.args])
                        for s in program.steps]  # fmt: skip
    launches = expected_launches(program, values)
    values = [backend.to_numpy(v) for v in values]
    for a, b in zip(values, again):
        assert np.array_equal(a, backend.to_numpy(b), equal_nan=True), "the forward changed"
    for k, step in enumerate(program.steps):
        if step.op != "input":
            generic = backend.to_numpy(expected[k])
            bound = forward_bound(step, [values[i] for i in step.args], generic)
            compare_value(values[k], generic, bound, f"value of step {k}")
    mags, ulps = gradient_bounds(program, values)
    for i, (a, b) in enumerate(zip(grads, expected_grads)):
        if a is not None:
            position = next(k for k, s in enumerate(program.steps) if s.params.get("index") == i)
            compare_gradient(a, b, mags[position], ulps, f"gradient of input {i}")
    launched = {name for kind, name in log if kind == "launch"}
    assert launches <= launched, f"kernels launched: {sorted(launched)}"


def note(text):
    if currently_in_test_context():  # the statistics of a Hypothesis run
        event(text)


# --- values: each step against the generic one on the same inputs
def eps_of(a):
    return float(np.finfo(a.dtype).eps)


def forward_bound(step, args, out):
    """`(bound, unsure)` for the fused value of `step` against its generic value `out`, or None
    where both paths run the same code (then the values are equal)."""
    eps, op = eps_of(out), step.op
    with np.errstate(all="ignore"):
        if op == "tree":
            _, bound, unsure = expression_bounds([expression(step)], operands(step, args), eps)[0]
            return bound, unsure
        if op in ROWS or op == "lce":
            return _row_bound(op, args, out, eps)
        if op == "normalise":
            return _normalise_bound(args[0], step.params["axes"], eps)[:2]
        if op == "lstm":
            return _lstm_bound(args[0], args[1], out, eps)
        if op in SUMS_OF_SQUARES:  # tracked: one sumabs2 node (a dot product); plain: a sum
            total = np.sum(np.square(args[0].astype(np.float64)))
            n = args[0].size + 2
            return n * eps * total, total >= np.finfo(out.dtype).max * (1 - n * eps)
    return None


def _row_bound(op, args, out, eps):
    """A row's sums of `cols` terms in another order, and LIBM ulp in exp and log."""
    x = args[0].astype(np.float64)
    cols, rows = x.shape[-1], x.size // x.shape[-1]
    shifted = x - np.max(x, axis=-1, keepdims=True)
    log_sum = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    tiny = cols * float(np.finfo(out.dtype).smallest_subnormal)
    certain = np.zeros(out.shape, bool)
    if op == "softmax":
        return (2 * LIBM + cols + 2) * eps * np.abs(out) + tiny, certain
    bound = eps * (LIBM + cols + 1 + LIBM * np.abs(log_sum) + np.abs(shifted - log_sum)) + tiny
    if op == "logsoftmax":
        return bound, certain
    targets = _targets(args[1], x.shape)  # the cross-entropy, a mean over the rows
    terms = np.sum(np.abs(targets * (shifted - log_sum)))
    total = np.sum(np.abs(targets) * bound) + (x.size + 2) * eps * terms
    return total / rows + tiny, certain


def _normalise_bound(x, axes, eps):
    """`(bound, unsure, parts)` of `(x - mean) / sigma`: the mean and the variance are sums in
    another order, so the mean moves by `count` ulp of the values' magnitude, every centred value
    with it; `parts` are the quantities the pullback's bound needs. Not compared: groups whose
    sums may overflow in one order and not in another."""
    x = x.astype(np.float64)
    count = int(np.prod([x.shape[a] for a in axes]))
    group = lambda a, f=np.mean: f(a, axis=axes, keepdims=True)
    mean_abs = group(np.abs(x))
    centred = x - group(x)
    sigma = np.sqrt(group(centred * centred) + 1e-5)
    d_centred = (count + 2) * eps * mean_abs + eps * np.abs(centred)
    d_sigma = ((count + 4) * eps * sigma**2 + 2 * group(np.abs(centred) * d_centred)) / sigma
    y = centred / sigma
    bound = d_centred / sigma + np.abs(y) * (d_sigma / sigma + 2 * eps)
    top = float(np.finfo(np.float32 if eps > 1e-10 else np.float64).max)
    unsure = np.broadcast_to(group(np.abs(x), np.sum) * count >= top / 4, x.shape)
    unsure = unsure | np.broadcast_to(group(centred * centred, np.sum) >= top / 4, x.shape)
    return np.where(np.isfinite(bound), bound, 0.0), unsure, (y, sigma, mean_abs, count)


def _gates(z, c, eps):
    """An LSTM cell's gates as the generic rule computes them, in float64, and the units where
    the two paths may compute a gate differently in a way that matters: an exponential of the
    sigmoids' landing among the subnormal numbers (there a few ulp are all of its value), or a
    saturated gate whose complement `1 - gate` may be 0 in one path and not in the other."""
    h = c.shape[-1]
    info = np.finfo(np.float32 if eps > 1e-10 else np.float64)
    z = z.astype(np.float64)
    quarter = lambda a, k: a[..., k * h : (k + 1) * h]
    with np.errstate(all="ignore"):
        e = np.exp(-np.abs(z))
        sig = np.where(z >= 0, 1 / (1 + e), e / (1 + e))
    finite = np.isfinite(z)
    fringe = finite & (e < float(info.tiny) * 2**LIBM) & (e >= float(info.smallest_subnormal) / 4)
    saturated = finite & (np.abs(np.tanh(z)) >= 1 - (LIBM + 4) * eps)  # also sigmoid's e small
    risky = fringe | saturated
    uncertain = functools.reduce(np.logical_or, [quarter(risky, k) for k in range(4)])
    i, f, o = quarter(sig, 0), quarter(sig, 1), quarter(sig, 3)
    return (
        i,
        f,
        np.tanh(quarter(z, 2)),
        o,
        uncertain,
        quarter(fringe, 0) | quarter(fringe, 1) | quarter(fringe, 3),
    )


def _lstm_bound(c, z, out, eps):
    """`[h', c']`: c' = f * c + i * u and h' = o * tanh(c'), each operation within an ulp and
    exp and tanh within LIBM; c' moves h' by tanh's slope (none where c' is infinite)."""
    i, f, u, o, _, fringe = _gates(z, c, eps)
    h = c.shape[-1]
    c = c.astype(np.float64)
    c_new = out[..., h:].astype(np.float64)
    d_c = (2 * LIBM + 8) * eps * (np.abs(f * c) + np.abs(i * u))
    slope = np.where(np.isfinite(c_new), 1 - np.tanh(c_new) ** 2, 0.0)
    moved = np.where(slope > 0, slope * d_c, 0.0)
    d_h = np.abs(o) * moved + (2 * LIBM + 8) * eps * np.abs(out[..., :h])
    bound = np.concatenate([d_h, d_c], axis=-1)
    unsure = np.concatenate([fringe, fringe], axis=-1)
    return np.where(np.isfinite(bound), bound, 0.0), unsure


def _targets(labels, shape):
    if labels.dtype.kind in "iu":
        return np.eye(shape[1])[labels]
    return labels.astype(np.float64)


def compare_value(actual, expected, bound, what):
    if bound is None:
        assert_agree(actual, expected, ulps=0, what=what)
        return
    bound, unsure = (np.broadcast_to(np.asarray(b), actual.shape) for b in bound)
    bound = np.where(np.isfinite(bound), bound, 0.0)  # non-finite values: their pattern
    keep = ~unsure
    note(f"values with elements not compared: {bool(np.any(unsure))}")
    with np.errstate(over="ignore"):  # an infinite scale: a bound past the largest value
        scale = bound[keep] / eps_of(actual)
    assert_agree(actual[keep], expected[keep], ulps=1, scale=scale, what=what)


# --- gradients: magnitudes backpropagated like the gradient
class Mag:
    """How far two computations of a gradient may be apart, element by element: Λ ulp of `size`,
    the magnitude of what was summed into it; `wild` where a term is ±inf or nan (only the
    nan/inf pattern is compared), `lost` where the order of a sum decides between overflow and
    a finite value (not compared)."""

    def __init__(self, size, wild, lost, top):
        self.size, self.wild, self.top = size, wild, top
        self.lost = lost | (size >= top)

    def pull(self, partial, select=None, unsure=None):
        """The magnitude of `partial * g` for a g of this magnitude; `select` where the partial
        is an exact selection of zero, whatever g is; `unsure` where it is not bounded."""
        partial = np.abs(np.asarray(partial, dtype=np.float64))
        finite = np.isfinite(partial)
        size = np.where(finite, partial, 0.0) * self.size
        wild = ~finite | self.wild
        lost = self.lost | np.isinf(size) | (False if unsure is None else unsure)
        if select is not None:
            size, wild, lost = np.where(select, 0.0, size), wild & ~select, lost & ~select
        return Mag(np.where(lost, 0.0, size), wild, lost, self.top)

    def fit(self, shape):
        """Summed over the axes along which an operand of `shape` was broadcast."""
        lead = self.size.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, n in enumerate(shape) if n == 1 and self.size.shape[lead + i] != 1
        )
        parts = [np.reshape(f(a, axis=axes), shape) for f, a in
                 ((np.sum, self.size), (np.any, self.wild), (np.any, self.lost))]  # fmt: skip
        return Mag(*parts, self.top)

    def __add__(self, other):
        return Mag(self.size + other.size, self.wild | other.wild, self.lost | other.lost, self.top)


def gradient_bounds(program, values):
    """The `Mag` of the gradient of each value (by position), and Λ."""
    no = np.zeros((), bool)
    mags = {len(values) - 1: Mag(np.ones(()), no, no, float(np.finfo(values[-1].dtype).max))}
    ulps = 0
    for k in reversed(range(len(program.steps))):
        step = program.steps[k]
        if step.op == "input" or k not in mags:
            continue
        with np.errstate(all="ignore"):  # magnitudes past the range are `lost`
            parts, step_ulps = pullback_bounds(step, [values[i] for i in step.args], values[k],
                                               mags[k])  # fmt: skip
            for position, mag in zip(step.args, parts):
                if mag is not None:
                    mags[position] = mags[position] + mag if position in mags else mag
        ulps += step_ulps + 2  # and the additions into the totals
    return mags, ulps


def pullback_bounds(step, args, out, m):
    """The `Mag` of each argument's contribution (None for none), and the ulp the step adds."""
    op, f64 = step.op, [a.astype(np.float64) for a in args]
    if op in UNARY:
        select = ~(out > 0) if op == "relu" else None  # relu selects: 0, never inf * 0
        return [m.pull(UNARY_PARTIALS[op](f64[0], out.astype(np.float64)), select)], LIBM + 3
    if op in BINARY or op == "tree":
        return _broadcast_bounds(step, args, out, m)
    if op in ROWS:
        return [_rows_bound(op, out.astype(np.float64), m)], out.shape[-1] + LIBM + 4
    if op == "normalise":
        return _normalise_pullback_bound(args[0], step.params["axes"], m)
    if op == "lstm":
        return _lstm_pullback_bound(args[0], args[1], out, m)
    if op == "lce":
        return [_lce_bound(f64[0], args[1], m), None], 2 * LIBM + 2 * args[0].shape[-1] + 4
    if op in SUMS_OF_SQUARES:
        return [m.pull(2 * f64[0])], 3
    if op == "mse":
        partial = 2 * (np.abs(f64[0]) + np.abs(f64[1])) / args[0].size
        return [m.pull(partial), m.pull(partial)], 4
    return [m.pull(f64[1]), None], 3  # sum(v * w)


def _broadcast_bounds(step, args, out, m):
    """Arithmetic and tg.broadcast: each array operand's partials, summed over the axes it was
    broadcast along (in another order in each path). A tree's kernel recomputes its partials:
    their bounds are added to them, weighted so that Λ ulp of the magnitude covers them."""
    eps, ops = eps_of(out), operands(step, args)
    arrays = [i for i, o in enumerate(ops) if isinstance(o, np.ndarray)]
    ulps = 3 + max(out.size // max(1, ops[i].size) for i in arrays)
    if step.op == "tree":
        bounds = expression_bounds([partials(expression(step), len(ops))[i] for i in arrays],
                                   ops, eps)  # fmt: skip
        parts = [(np.abs(v.astype(np.float64)) + d / (ulps * eps), unsure)
                 for v, d, unsure in bounds]  # fmt: skip
    else:
        ulps += LIBM
        both = BINARY_PARTIALS[step.op](*(np.asarray(o, np.float64) for o in ops),
                                        out.astype(np.float64))  # fmt: skip
        parts = [(both[i], None) for i in arrays]
    fits = [m.pull(partial, unsure=unsure).fit(ops[i].shape)
            for i, (partial, unsure) in zip(arrays, parts)]  # fmt: skip
    return fits, ulps


def _rows_bound(op, y, m):
    """softmax: y * (g - sum(g * y)); logsoftmax: g - exp(y) * sum(g), over the last axis."""
    finite = np.isfinite(y)
    ay = np.where(finite, np.abs(y), 0.0)
    if op == "softmax":
        size = ay * (m.size + np.sum(ay * m.size, axis=-1, keepdims=True))
    else:
        size = m.size + np.exp(np.where(finite, y, -np.inf)) * np.sum(m.size, -1, keepdims=True)
    row = lambda a: np.broadcast_to(np.any(a, axis=-1, keepdims=True), y.shape)
    return Mag(size, row(~finite | m.wild), row(m.lost), m.top)


def _normalise_pullback_bound(x, axes, m):
    """((g - mean(g)) - y * mean(g * y)) / sigma: the magnitudes of its terms, times what the
    centred values' rounding may move y by (mean |x| / sigma); its sums add `count` ulp."""
    eps = eps_of(x)
    _, unsure, (y, sigma, mean_abs, count) = _normalise_bound(x, axes, eps)
    group = lambda a, f=np.mean: f(a, axis=axes, keepdims=True)
    finite = np.isfinite(y)
    ay = np.where(finite, np.abs(y), 0.0)
    size = (m.size + group(m.size) + ay * group(ay * m.size)) / sigma * (1 + mean_abs / sigma)
    spread = lambda a: np.broadcast_to(group(a, np.any), x.shape)
    wild, lost = spread(~finite | m.wild), spread(m.lost) | unsure
    size = np.where(np.isfinite(size) & ~lost, size, 0.0)
    return [Mag(size, wild, lost, m.top)], 2 * count + LIBM + 8


def _lstm_pullback_bound(c, z, out, m):
    """dc' = g_c + g_h * o * (1 - t * t); dz = [dc' * u * i(1 - i), dc' * c * f(1 - f),
    dc' * i * (1 - u * u), g_h * t * o(1 - o)]; dc = dc' * f. Each subtraction's magnitude is
    a sum; exp, tanh and the products add LIBM and a few ulp. A unit is wild where a factor may
    be infinite or nan (the gradient, the cell state, a nan gate), and not compared where it is
    wild and a gate is uncertain (inf * 0 against inf * tiny)."""
    eps = eps_of(c)
    i, f, u, o, uncertain, fringe = _gates(z, c, eps)
    h = c.shape[-1]
    c = c.astype(np.float64)
    c_new = out[..., h:].astype(np.float64)
    t = np.tanh(c_new)
    uncertain = uncertain | (np.isfinite(c_new) & (np.abs(t) >= 1 - (LIBM + 4) * eps))
    both = lambda a: np.broadcast_to(a, out.shape)
    m_size, mw, ml = both(m.size), both(m.wild), both(m.lost)
    m_h, m_c = m_size[..., :h], m_size[..., h:]
    d_c = m_c + m_h * o * (1 + t * t)
    parts = [d_c * np.abs(u) * i * (1 + i), d_c * np.abs(c) * f * (1 + f), d_c * i * (1 + u * u),
             m_h * np.abs(t) * o * (1 + o)]  # fmt: skip
    nan_gate = functools.reduce(np.logical_or, [np.isnan(z[..., k * h : (k + 1) * h])
                                                for k in range(4)])  # fmt: skip
    wild = nan_gate | ~np.isfinite(c) | mw[..., :h] | mw[..., h:]
    lost = (wild & uncertain) | fringe | ml[..., :h] | ml[..., h:]
    mags = []
    for size in (np.concatenate(parts, axis=-1), d_c * f):
        k = size.shape[-1] // h
        w, lo = np.concatenate([wild] * k, axis=-1), np.concatenate([lost] * k, axis=-1)
        lo = lo | ~np.isfinite(size)
        mags.append(Mag(np.where(lo | w, 0.0, size), w, lo, m.top))
    return [mags[1], mags[0]], 2 * LIBM + 12


def _lce_bound(x, labels, m):
    """The cross-entropy's pullback: (softmax(x) * sum(t) - t) * g / rows."""
    t = _targets(labels, x.shape)
    finite = np.all(np.isfinite(x), axis=1, keepdims=True)
    e = np.exp(np.where(finite, x - np.max(x, axis=1, keepdims=True), 0.0))
    p = e / np.sum(e, axis=1, keepdims=True)
    size = (p * np.sum(np.abs(t), axis=1, keepdims=True) + np.abs(t)) * (m.size / x.shape[0])
    return Mag(size, np.broadcast_to(~finite | m.wild, x.shape), m.lost, m.top)


def compare_gradient(actual, expected, mag, ulps, what):
    keep = ~np.broadcast_to(mag.lost, actual.shape)
    note(f"gradients with elements not compared: {bool(np.any(~keep))}")
    scale = np.broadcast_to(np.where(mag.wild, 0.0, mag.size), actual.shape)
    assert_agree(actual[keep], expected[keep], ulps=ulps, scale=scale[keep], what=what)


# --- the kernels each step must launch
def launches_of(op):
    if op in UNARY:
        return {f"{op}_bwd_acc"}
    if op in ROWS:
        return {f"{op}_fwd", f"{op}_bwd_acc"}
    if op in LAYERS:
        name = "lstm" if op == "lstm" else op
        return {f"{name}_fwd", f"{name}_bwd_acc"}
    if op in SUMS_OF_SQUARES:
        return {"sumsq_bwd_acc"}
    return {"tree": {"broadcast_fwd", "broadcast_bwd"}, "mse": {"mse_bwd_acc"},
            "lce": {"logitcrossentropy_fwd", "logitcrossentropy_bwd_acc"},
            "weighted": {"mul_bwd_acc"}}.get(op, set())  # fmt: skip


def expected_launches(program, values):
    """The kernels the steps must launch. NumPy's 0-d results are NumPy scalars, not arrays (so is
    the product in `sum(v * w)` of a 0-d v): the fused path takes neither them nor a gradient
    that passed back through them."""
    steps, last = program.steps, len(program.steps) - 1
    array = [not isinstance(v, np.generic) for v in values]
    v = values[steps[last].args[0]]
    array[last] = steps[last].op != "weighted" or not (isinstance(v, np.ndarray) and v.ndim == 0)
    taken = [k for k, s in enumerate(steps) if all(array[i] for i in s.args) and all(array[k:])]
    return set().union(*(launches_of(steps[k].op) for k in taken))


# --- optimiser steps
ETA = st.sampled_from([0.1, 1e-3, 3.0])
RHO = st.sampled_from([0.9, 0.0, 0.99])
BETA = st.sampled_from([(0.9, 0.999), (0.5, 0.9), (0.0, 0.0)])
EPSILON = st.sampled_from([1e-8, 0.0, 1.0])
RULES = st.one_of(
    st.builds(optim.Descent, ETA),
    st.builds(optim.Momentum, ETA, RHO),
    st.builds(optim.Nesterov, ETA, RHO),
    st.builds(optim.Adam, ETA, BETA, EPSILON),
    st.builds(optim.AdamW, ETA, BETA, st.sampled_from([0.0, 0.1]), EPSILON, st.booleans()),
)
STEP_KERNELS = {"Descent": "descent_step", "Momentum": "momentum_step",
                "Nesterov": "nesterov_step", "Adam": "adam_step", "AdamW": "adam_step"}  # fmt: skip


@settings(max_examples=EXAMPLES or 40, **SETTINGS)
@given(
    rule=RULES,
    dtype=st.sampled_from(["float32", "float64"]),
    shapes=st.lists(st.lists(st.integers(1, 5), max_size=2).map(tuple), min_size=1, max_size=2),
    steps=st.integers(1, 3),
    special=st.sampled_from([0.0, 0.1, 0.3]),
    seed=st.integers(0, 2**20),
)
def test_optimiser_steps_agree_with_the_generic_path(backend, fused, rule, dtype, shapes, steps,
                                                     special, seed):  # fmt: skip
    """Each update from the same model and state both ways, then on from the fused one."""
    model = {f"p{i}": backend.asarray(domain(s, dtype, seed + i, special))
             for i, s in enumerate(shapes)}  # fmt: skip
    state = optim.setup(rule, model)
    for t in range(steps):
        grads = {k: backend.asarray(domain(v.shape, dtype, seed + 10 * (t + 1), special))
                 for k, v in model.items()}  # fmt: skip
        with np.errstate(all="ignore"), fused():
            with recording() as log:
                new_state, new_model = optim.update(state, model, grads)
            with generic_only():
                expected_state, expected_model = optim.update(state, model, grads)
        launched = [name for kind, name in log if kind == "launch"]
        assert launched == [STEP_KERNELS[type(rule).__name__]] * len(model)
        for k in model:
            old = _host_state(backend, state[k].state)
            x, dx = backend.to_numpy(model[k]), backend.to_numpy(grads[k])
            scales = step_scales(rule, x, dx, old)
            pairs = zip(_arrays(backend, new_model[k], new_state[k].state),
                        _arrays(backend, expected_model[k], expected_state[k].state))  # fmt: skip
            for (a, b), scale in zip(pairs, scales):
                scale = np.where(np.isnan(scale), 0.0, scale)
                assert_agree(a, b, ulps=4, scale=scale, what=f"{k} after step {t}")
        assert _powers(new_state) == _powers(expected_state)
        state, model = new_state, new_model


def _host_state(backend, state):
    if isinstance(state, tuple):
        return (backend.to_numpy(state[0]), backend.to_numpy(state[1]), state[2])
    return None if state is None else backend.to_numpy(state)


def _arrays(backend, x, state):
    """The new parameter and state arrays, on the host."""
    state = _host_state(backend, state)
    arrays = [] if state is None else list(state[:2]) if isinstance(state, tuple) else [state]
    return [backend.to_numpy(x), *arrays]


def _powers(state):
    return [leaf.state[2] for leaf in state.values() if isinstance(leaf.state, tuple)]


def step_scales(rule, x, dx, state):
    """The magnitudes the new parameter and each new state array are summed from."""
    x, dx = np.abs(x.astype(np.float64)), dx.astype(np.float64)
    name, eta = type(rule).__name__, rule.eta
    with np.errstate(all="ignore"):
        if name == "Descent":
            return [x + np.abs(dx) * eta]
        if name in ("Momentum", "Nesterov"):
            v, rho = np.abs(state), rule.rho
            velocity = v * rho + np.abs(dx) * eta
            lead = np.abs(dx) * (1 + rho) * eta + v * rho**2 if name == "Nesterov" else velocity
            return [x + lead, velocity]
        return _adam_scales(rule, x, dx, *state)


def _adam_scales(rule, x, dx, m, v, powers):
    """Adam's moments and parameter: a rounding in m (which may cancel) moves the direction
    m / (sqrt(v) + epsilon') by that much over the root."""
    (beta1, beta2), (beta1_t, beta2_t) = rule.beta, powers
    m1 = (dx - m) * (1 - beta1) + m
    v1 = (dx * dx - v) * (1 - beta2) + v
    correction = np.sqrt(1 - beta2_t)
    root = np.sqrt(v1) + rule.epsilon * correction
    scale_m, scale_v = np.abs(dx) + 2 * np.abs(m), dx * dx + 2 * np.abs(v)
    direction = (scale_m + np.abs(m1)) / root * (correction / (1 - beta1_t))
    decay = getattr(rule, "weight_decay", 0.0)
    return [x + direction * rule.eta + x * decay * (1 + rule.eta), scale_m, scale_v]


# --- disagreements the fuzzer once avoided, pinned
def both_ways(fused, f, *args):
    with np.errstate(all="ignore"), tg.sync_checks(False):
        with generic_only():
            expected = f(*args)
        with fused():
            actual = f(*args)
    return actual, expected


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_a_nan_operand_of_a_generated_extremum(backend, fused, name):
    """A nan on either side wins, as NumPy's maximum; a tie splits the gradient evenly, and
    a nan gives neither side any."""
    x = backend.asarray([np.nan, 1.0, -2.0, 0.5, 0.5, np.nan, 0.0])
    y = backend.asarray([0.5, np.nan, 0.5, 0.5, -0.0, np.nan, -0.0])
    for f in (lambda a: getattr(tg, name)(a, 0.5), lambda a: getattr(tg, name)(0.5, a)):
        actual, expected = both_ways(fused, lambda x, f=f: tg.broadcast(f, x), x)
        assert_agree(backend.to_numpy(actual), backend.to_numpy(expected), signed_zeros=True)
    f = getattr(tg, name)
    actual, expected = both_ways(fused, lambda x, y: tg.broadcast(f, x, y), x, y)
    assert_agree(backend.to_numpy(actual), backend.to_numpy(expected), signed_zeros=True)
    assert np.array_equal(backend.to_numpy(expected)[[0, 1, 5]], [np.nan] * 3, equal_nan=True)
    gradient = lambda x, y: tg.gradient(lambda x, y: tg.sum(tg.broadcast(f, x, y)), x, y)
    grads = both_ways(fused, gradient, x, y)
    for a, b in zip(*grads):
        assert_agree(backend.to_numpy(a), backend.to_numpy(b))
    first = 1.0 if name == "maximum" else 0.0  # x's share where x and y are ordered
    expected = [0, 0, 1 - first, 0.5, first, 0, 0.5]
    assert np.array_equal(backend.to_numpy(grads[1][0]), expected)


NUMBERS_ALONE = {  # case: f, the Python number, the dtype, the IEEE value of f(x, number)
    "log(0)": (lambda a, b: a + tg.log(b), 0.0, "float64", [-np.inf, -np.inf]),
    "1/0": (lambda a, b: a + 1.0 / b, 0.0, "float64", [np.inf, np.inf]),
    "abs": (lambda a, b: a + abs(b), -2.0, "float64", [3.0, 0.0]),
    "(-8)**0.25": (lambda a, b: a + b**0.25, -8.0, "float64", [np.nan, np.nan]),
    "exp(1000)": (lambda a, b: a - tg.exp(b), 1e3, "float64", [-np.inf, -np.inf]),
    "in float32": (lambda a, b: a + b * b / b, 1e30, "float32", [np.inf, np.inf]),
}


@pytest.mark.parametrize("case", sorted(NUMBERS_ALONE))
def test_an_operation_on_python_numbers_alone_in_a_broadcast(backend, fused, case):
    """Computed in the kernel's dtype with IEEE arithmetic, never with Python's math."""
    f, number, dtype, ieee = NUMBERS_ALONE[case]
    x = backend.asarray([1.0, -2.0], dtype=dtype)
    actual, expected = both_ways(fused, lambda x: tg.broadcast(f, x, number), x)
    expected = backend.to_numpy(expected)
    assert expected.dtype == dtype
    assert_agree(backend.to_numpy(actual), expected)
    assert_agree(expected, np.array(ieee, dtype=dtype))


@pytest.mark.parametrize("f", [lambda a: a / 0.0, lambda a: (-3.0) ** a], ids=["x/0", "(-3)**x"])
def test_a_derivative_of_python_numbers_alone_in_a_broadcast(backend, fused, f):
    x = backend.asarray([1.0, -2.0])
    gradient = lambda x: tg.gradient(lambda x: tg.sum(tg.broadcast(f, x)), x)[0]
    actual, expected = both_ways(fused, gradient, x)
    assert_agree(backend.to_numpy(actual), backend.to_numpy(expected))


@pytest.mark.parametrize("f", [lambda a, b: a * 2.0, lambda a, b: 2.0], ids=["a*2", "2"])
def test_an_argument_the_expression_does_not_use(backend, fused, f):
    """It broadcasts and promotes the result, and its gradient is g times 0."""
    x = backend.asarray([1.0, 2.0, 3.0], dtype="float32")
    y = backend.asarray(np.ones((2, 3)))
    actual, expected = both_ways(fused, lambda x, y: tg.broadcast(f, x, y), x, y)
    actual, expected = backend.to_numpy(actual), backend.to_numpy(expected)
    assert actual.shape == expected.shape == (2, 3)
    assert actual.dtype == expected.dtype == np.float64
    assert np.array_equal(actual, expected)
    gradient = lambda x, y: tg.gradient(lambda x, y: tg.sum(tg.broadcast(f, x, y)), x, y)
    for a, b, arg in zip(*both_ways(fused, gradient, x, y), (x, y)):
        a, b = backend.to_numpy(a), backend.to_numpy(b)
        assert a.shape == b.shape == tuple(arg.shape) and a.dtype == b.dtype == arg.dtype
        assert np.array_equal(a, b)


# --- every operation the generated code knows, over the whole domain
PUBLIC = {v: k for k, v in _COMPARISONS.items()}  # "gt": "greater"
# The standard's operations; tg.special's (`SPECIAL`) are checked over the whole domain with a
# tolerance per function, and against mpmath, in test_special_fused.py. `ruled` is no operation
# but a rule's traced forward (each rule broadcast traces: test_edges_second.py); `zeros_like`
# and `narrow` are operations of the pullbacks only.
STANDARD = sorted(set(codegen.C) - SPECIAL - {"ruled", "zeros_like", "narrow"})


def arity(op):
    fields = string.Formatter().parse(codegen.C[op])
    return 1 + max(int(field) for _, field, _, _ in fields if field)


def operation(op):
    """A scalar function that traces to `op` of its arguments and returns a number (a
    comparison selects its first argument)."""
    if op in COMPARISONS:
        compare = getattr(tg, PUBLIC[op])
        return lambda a, b: tg.where(compare(a, b), a, b)
    if op == "where":
        return lambda c, a, b: tg.where(c, a, b)
    return getattr(tg, op)


def grid(op, dtype):
    """Every combination of special values for the arguments of `op` (a condition of `where`:
    each special value compared with 0)."""
    values = special_values(dtype)
    columns = [a.ravel() for a in np.meshgrid(*[values] * arity(op), indexing="ij")]
    if op == "where":
        columns[0] = columns[0] > 0
    return columns


def weights(n, dtype):
    """Incoming gradients: ones, then every special value in turn."""
    values = special_values(dtype)
    return [np.ones(n, dtype), np.resize(values, n), np.resize(values[::-1], n)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", STANDARD)
def test_every_generated_operation_agrees_with_the_generic_path(backend, fused, op, dtype):
    """Values (signed zeros included) and every partial derivative times incoming gradients
    over the whole domain, arrays on every side."""
    f = operation(op)
    assert op in {node.op for node in topological([trace(f, arity(op))])}
    args = [backend.asarray(c) for c in grid(op, dtype)]
    actual, expected = both_ways(fused, lambda *a: tg.broadcast(f, *a), *args)
    assert_agree(*_host(backend, actual, expected), ulps=LIBM, signed_zeros=True, what=op)
    for k, w in enumerate(weights(args[-1].shape[0], dtype)):
        grads = both_ways(fused, _gradient(f, backend.asarray(w)), *args)
        for i, (a, b) in enumerate(zip(*grads)):
            if b is not None:
                what = f"{op}: gradient {i}, incoming gradient {k}"
                assert_agree(*_host(backend, a, b), ulps=LIBM, what=what)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", [op for op in STANDARD if arity(op) == 2])
def test_every_generated_operation_on_a_python_number_agrees(backend, fused, op, dtype):
    """A Python number on either side of every binary operation, for every special value."""
    f = operation(op)
    x = backend.asarray(special_values(dtype))
    for number in map(float, special_values(dtype)):
        if op == "pow" and number == 0.5:
            continue  # NumPy computes x ** 0.5 as sqrt(x): nan at -inf and -0 at -0
        for right, sides in ((True, (x, number)), (False, (number, x))):
            what = f"{op} with {number!r} on the {'right' if right else 'left'}"
            value = both_ways(fused, lambda *a: tg.broadcast(f, *a), *sides)
            assert_agree(*_host(backend, *value), ulps=LIBM, signed_zeros=True, what=what)
            grads = both_ways(fused, _gradient(f, 1.0), *sides)
            for a, b in zip(*grads):
                if b is not None:
                    assert_agree(*_host(backend, a, b), ulps=LIBM, what=f"{what}: gradient")


@pytest.mark.parametrize("op", sorted(COMPARISONS))
def test_a_comparison_alone_is_a_boolean_array_both_ways(backend, fused, op):
    x, y = (backend.asarray(c) for c in grid("gt", "float64"))
    compare = getattr(tg, PUBLIC[op])
    actual, expected = both_ways(fused, lambda x, y: tg.broadcast(compare, x, y), x, y)
    actual, expected = _host(backend, actual, expected)
    assert actual.dtype == expected.dtype == np.bool_ and np.array_equal(actual, expected)


def _gradient(f, w):
    """The gradient of `sum(broadcast(f, ...) * w)`, a function of the arguments."""
    return lambda *args: tg.gradient(lambda *a: tg.sum(tg.broadcast(f, *a) * w), *args)


def _host(backend, *arrays):
    return [backend.to_numpy(tg.data(a)) for a in arrays]


@pytest.mark.parametrize("name", sorted(FUSED_BINARY))  # the rules with a fused pullback
@pytest.mark.parametrize("wide", [0, 1])  # which operand is float64 (the other float32)
@pytest.mark.parametrize("shapes", [((3,), (3,)), ((2, 3), (3,)), ((3,), (2, 3))])
def test_an_operand_of_another_dtype_gets_a_gradient_of_its_own(backend, fused, name, wide,
                                                                shapes):  # fmt: skip
    """A float32 operand of a float64 result: the gradient is float32 on both paths (the
    fused pullback once handed the float64 `g` itself to the float32 operand of `+`)."""
    dtypes = ["float32", "float32"]
    dtypes[wide] = "float64"
    arrays = [backend.asarray(0.5 + np.arange(math.prod(s)).reshape(s) / 4, dtype=d)
              for s, d in zip(shapes, dtypes)]  # fmt: skip
    f = lambda x, y: tg.sum(getattr(tg, name)(x, y))  # noqa: E731
    with fused():
        actual = tg.gradient(f, *arrays)
    with generic_only():
        expected = tg.gradient(f, *arrays)
    for a, b, arg in zip(actual, expected, arrays):
        assert a.dtype == b.dtype == arg.dtype, (a.dtype, b.dtype, arg.dtype)
        np.testing.assert_array_equal(backend.to_numpy(a), backend.to_numpy(b))
