"""Initialisers and the random generator that feeds them.

An initialiser takes a NumPy random generator and a weight shape, `(out, in)` or
`(out, in, *kernel)`, and returns NumPy float64 values (Glorot and Kaiming, uniform or normal,
and the standard normal `randn`); the layer then places them in the library, device and dtype
asked for. `_rng` gives the layers a fresh generator when none is passed.
"""

import math

import numpy as np

__all__ = [
    "SQRT2",
    "glorot_uniform",
    "glorot_normal",
    "kaiming_uniform",
    "kaiming_normal",
    "randn",
]

SQRT2 = math.sqrt(2.0)


def _fans(shape):
    """(fan_in, fan_out) of a weight of `shape`: (out, in) or (out, in, *kernel)."""
    _check_sizes(shape)
    if len(shape) == 1:
        return 1, shape[0]
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def glorot_uniform(rng, shape, gain=1.0):
    """Uniform in `±gain * sqrt(6 / (fan_in + fan_out))` (Glorot & Bengio 2010; Flux's default)."""
    limit = gain * math.sqrt(6.0 / sum(_fans(shape)))
    return rng.uniform(-limit, limit, size=shape)


def glorot_normal(rng, shape, gain=1.0):
    """Normal with standard deviation `gain * sqrt(2 / (fan_in + fan_out))`."""
    return rng.normal(0.0, gain * math.sqrt(2.0 / sum(_fans(shape))), size=shape)


def kaiming_uniform(rng, shape, gain=SQRT2):
    """Uniform in `±gain * sqrt(3 / fan_in)` (He et al. 2015)."""
    limit = gain * math.sqrt(3.0 / _fans(shape)[0])
    return rng.uniform(-limit, limit, size=shape)


def kaiming_normal(rng, shape, gain=SQRT2):
    """Normal with standard deviation `gain / sqrt(fan_in)` (He et al. 2015)."""
    return rng.normal(0.0, gain / math.sqrt(_fans(shape)[0]), size=shape)


def randn(rng, shape):
    """Standard normal values (Flux's `randn32`, the default of `Embedding`)."""
    _check_sizes(shape)
    return rng.standard_normal(size=shape)


def _check_sizes(shape):
    """A layer's sizes are whole numbers of at least 1 (a zero divided by zero in Glorot's)."""
    if not all(isinstance(n, (int, np.integer)) and n >= 1 for n in shape):
        raise ValueError(
            f"a layer's weights of shape {tuple(shape)}: every size (features, units, heads' "
            "dimension, channels, kernel) must be a whole number of at least 1"
        )


def _rng(rng):
    """A generator: the one given, one seeded by an int, or a fresh one."""
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        return np.random.default_rng(rng)
    return rng
