"""Layers, activations, initialisers and saving, for training small models the Flux way.

A model is a plain nested structure of dataclasses whose fields are arrays, sublayers or
settings, so `tg.withgradient(loss, model)` returns a gradient of the same shape and
`tracker_gpu.optim` updates it. A layer is called on a batch whose *first* axis is the batch
(the NumPy and PyTorch layout; Flux puts it last): `Dense` takes `(batch, features)`, `Conv`
and the pools take `(batch, channels, *spatial)`: `(batch, channels, height, width)` in 2-D,
one or three spatial axes in 1-D or 3-D (the length of the kernel or window tuple).

Parameters are drawn with a NumPy random generator (`rng`), then created where you ask: `dtype`
(float32 by default), `device` (the library is the one that owns the device: a CuPy device, a
PyTorch device, an array-api-strict device) and `xp` (a namespace, or a name: "numpy", "torch",
"cupy", "strict").

The package is one module per concern: `activations`, `init` (initialisers), `layers` (the
`Layer` base, `Dense`, `Chain`, ...), `conv` (`Conv`, `ConvTranspose`), `pool` (the pools),
`geometry` (their sizes and padding), `padding` (padding modes), `primitives` (`linear`,
`im2col`, `col2im`), `losses` (Flux's names, PyTorch's options), `placement` (`asarray`,
`place`, `to_numpy`), `io` (`save`, `load`) and `torch_io`, `torch_export` (`from_torch`,
`to_torch`, `load_state_dict`: PyTorch's modules and weights); every name is re-exported here.

>>> import numpy as np, tracker_gpu as tg
>>> from tracker_gpu import nn
>>> model = nn.Chain(nn.Dense(3, 4, nn.relu, rng=np.random.default_rng(0)), nn.Dense(4, 2))
>>> model
Chain(Dense(3 => 4, relu), Dense(4 => 2))
>>> x = np.ones((5, 3), dtype=np.float32)
>>> model(x).shape
(5, 2)
>>> val, (g,) = tg.withgradient(lambda m: tg.sum(m(x)), model)
>>> g.layers[0].weight.shape, g.layers[0].activation is None
((4, 3), True)
"""

from ..files import BadFileError, SaveError
from . import activations, losses
from .activations import *  # noqa: F403 (its __all__ is part of ours)
from .attention import MultiHeadAttention, TransformerBlock
from .conv import Conv, ConvTranspose
from .init import SQRT2 as SQRT2
from .init import glorot_normal, glorot_uniform, kaiming_normal, kaiming_uniform, randn
from .io import _parameters as _parameters
from .io import load, save
from .layers import Chain, Dense, Dropout, Embedding, Flatten, testmode, trainmode
from .layers import Layer as Layer
from .losses import *  # noqa: F403 (its __all__ is part of ours)
from .normalise import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, normalise
from .placement import LIBRARIES as LIBRARIES
from .placement import asarray, place, to_numpy
from .pool import (
    AdaptiveMaxPool,
    AdaptiveMeanPool,
    GlobalMaxPool,
    GlobalMeanPool,
    MaxPool,
    MeanPool,
)
from .primitives import col2im, im2col, linear
from .recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, Recurrence, RNNCell
from .torch_export import load_state_dict, to_torch
from .torch_io import from_torch, gelu_exact

__all__ = [
    # layers
    "Chain",
    "Dense",
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "MeanPool",
    "AdaptiveMaxPool",
    "AdaptiveMeanPool",
    "GlobalMaxPool",
    "GlobalMeanPool",
    "Flatten",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "GroupNorm",
    "BatchNorm",
    "InstanceNorm",
    "RNNCell",
    "LSTMCell",
    "GRUCell",
    "Recurrence",
    "RNN",
    "LSTM",
    "GRU",
    "MultiHeadAttention",
    "TransformerBlock",
    "trainmode",
    "testmode",
    # initialisers
    "glorot_uniform",
    "glorot_normal",
    "kaiming_uniform",
    "kaiming_normal",
    "randn",
    # placement and saving
    "asarray",
    "place",
    "to_numpy",
    "save",
    "load",
    "BadFileError",
    "SaveError",
    "from_torch",
    "to_torch",
    "load_state_dict",
    "gelu_exact",
    "linear",
    "normalise",
    "im2col",
    "col2im",
]
__all__ += activations.__all__  # the activations, listed once in their module
__all__ += losses.__all__  # the losses (their names in losses.LOSSES), likewise
