"""Fused optimiser steps: one launch per parameter, into fresh buffers (nothing is mutated), with
the generic rule's scalars computed here in double precision as the rule computes them (on
NumPy arrays, the same kernels built natively for the host: `native`); and the
loss scaler's check that every gradient is finite, one launch per eight arrays and one
reduction of their blocks' answers."""

import math

from . import native
from .dispatch import register
from .fused import ready
from .launch import empty, empty_like, grid_for, launch, library

__all__ = []


def _launcher(*arrays):
    """How a step runs on these arrays: the native build's launch for NumPy arrays it steps
    (`native.takes`: outside `on_host()`), the fused path's `launch` where it takes them (CuPy,
    or NumPy inside `on_host()`), else None: the generic rule."""
    if native.takes(*arrays):
        return native.launch
    return launch if ready(*arrays) else None


@register("step", "Descent")
def descent_step(rule, x, dx, state):
    run = _launcher(x, dx)
    if run is None:
        return None
    out = empty_like(x)
    run("descent_step", x.dtype, grid_for(x.size), x, dx, out, x.size, rule.eta)
    return out, state


@register("step", "Momentum")
def momentum_step(rule, x, dx, v):
    run = _launcher(x, dx, v)
    if run is None:
        return None
    out, v_out = empty_like(x), empty_like(x)
    run("momentum_step", x.dtype, grid_for(x.size), x, dx, v, out, v_out, x.size, rule.eta,
        rule.rho)  # fmt: skip
    return out, v_out


@register("step", "Nesterov")
def nesterov_step(rule, x, dx, v):
    run = _launcher(x, dx, v)
    if run is None:
        return None
    rho, eta = rule.rho, rule.eta
    out, v_out = empty_like(x), empty_like(x)
    run("nesterov_step", x.dtype, grid_for(x.size), x, dx, v, out, v_out, x.size, eta, rho,
        (1 + rho) * eta, rho**2)  # fmt: skip
    return out, v_out


@register("step", "Adam", "AdamW")
def adam_step(rule, x, dx, state):
    """Adam and AdamW (`weight_decay`, `couple`): moments and parameter in one launch."""
    m, v, (beta1_t, beta2_t) = state
    run = _launcher(x, dx, m, v)
    if run is None:
        return None
    beta1, beta2 = rule.beta
    correction = math.sqrt(1 - beta2_t)
    scale = correction / (1 - beta1_t)
    if not hasattr(rule, "weight_decay"):
        mode, decay = 0, 0.0
    else:
        mode, decay = (1 if rule.couple else 2), rule.weight_decay
    out, m_out, v_out = empty_like(x), empty_like(x), empty_like(x)
    run("adam_step", x.dtype, grid_for(x.size), x, dx, m, v, out, m_out, v_out, x.size,
        1 - beta1, 1 - beta2, rule.epsilon * correction, scale, rule.eta, rule.eta * scale,
        decay, mode)  # fmt: skip
    return out, (m_out, v_out, (beta1_t * beta1, beta2_t * beta2))


FINITE_SLOTS = 8  # the arrays one launch of `finite_partials` reads


@register("forward", "all_finite")
def all_finite(*arrays):
    """Whether every element of `arrays` (C-contiguous, of one floating dtype) is finite, a
    0-d boolean array as the generic rule's `all(isfinite(x))` for each, combined: one launch
    per eight arrays writes each block's answer, one reduction of them gives the flag."""
    if not arrays or not ready(*arrays):
        return None
    first, blocks = arrays[0], min(grid_for(max(a.size for a in arrays)), 1024)
    groups = [arrays[i : i + FINITE_SLOTS] for i in range(0, len(arrays), FINITE_SLOTS)]
    partial = empty((len(groups) * blocks,), first, "bool")
    for j, group in enumerate(groups):
        unused = FINITE_SLOTS - len(group)
        pointers = [*group, *(first,) * unused]
        sizes = [a.size for a in group] + [0] * unused
        launch("finite_partials", first.dtype, blocks, *pointers, *sizes,
               partial[j * blocks : (j + 1) * blocks])  # fmt: skip
    return library(first).all(partial)
