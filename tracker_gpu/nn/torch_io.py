"""From PyTorch's modules to our layers: `from_torch` (the way back, `to_torch` and
`load_state_dict`, is in `torch_export`).

`from_torch(module)` converts a `torch.nn` module (a layer, an activation, or a `Sequential`
of them) to the matching layers here with the same weights, buffers and settings. The layers'
arithmetic is PyTorch's (checked in float64 to 1e-12 against `torch.nn`), so a converted model
computes what the module computed; a module or a setting with no exact counterpart here is
refused, naming it.

The table `FROM_TORCH` (PyTorch's class name to a converter) says what converts, and the rows
of `ACTIVATIONS` which activation modules do (`torch_export` reads the same rows the other
way). In a `Sequential`, an activation module after a layer that takes one (`Dense`, `Conv`,
`ConvTranspose`, the norms) becomes that layer's `activation`. PyTorch is imported by these
functions only (`pip install "tracker-gpu[torch]"`).

>>> import torch
>>> from tracker_gpu import nn
>>> _ = torch.manual_seed(0)
>>> module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
>>> model = nn.from_torch(module.double())
>>> model
Chain(Dense(3 => 4, relu), Dense(4 => 2))
>>> x = torch.rand(5, 3, dtype=torch.float64)
>>> bool(abs(model(x.numpy()) - module(x).detach().numpy()).max() < 1e-12)
True
>>> nn.to_torch(model)
Sequential(
  (0): Linear(in_features=3, out_features=4, bias=True)
  (1): ReLU()
  (2): Linear(in_features=4, out_features=2, bias=True)
)
"""

import copy
import dataclasses
import functools
import importlib
from typing import Any

from .activations import (
    celu,
    elu,
    gelu,
    hardtanh,
    identity,
    leakyrelu,
    logsigmoid,
    logsoftmax,
    relu,
    relu6,
    selu,
    sigmoid,
    softmax,
    softsign,
    swish,
    tanh,
)
from .attention import MultiHeadAttention, TransformerBlock
from .conv import Conv, ConvTranspose
from .layers import Chain, Dense, Dropout, Embedding, Flatten, Layer
from .normalise import BatchNorm, GroupNorm, InstanceNorm, LayerNorm
from .placement import asarray
from .pool import AdaptiveMaxPool, AdaptiveMeanPool, MaxPool, MeanPool
from .recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, Recurrence, RNNCell

__all__ = ["from_torch", "gelu_exact", "FROM_TORCH", "ACTIVATIONS"]

INSTALL = 'PyTorch is not installed: pip install "tracker-gpu[torch]" (or pip install torch)'


def _torch():
    try:
        return importlib.import_module("torch")
    except ImportError as error:
        raise ImportError(f"{INSTALL} ({error})") from error


def gelu_exact(x):
    """PyTorch's default GELU, `0.5 x (1 + erf(x / sqrt(2)))`: `gelu(x, approximate="none")`
    (our `gelu` is the tanh form, Flux's).

    >>> import numpy as np
    >>> float(gelu_exact(np.array(1.0)).round(6)), float(gelu(np.array(1.0)).round(6))
    (0.841345, 0.841192)
    """
    return gelu(x, approximate="none")


class Unsupported(ValueError):
    """A module, a layer or a setting with no exact counterpart on the other side."""


# --- activations: (PyTorch's class, ours, {its attribute: (our keyword, our default)},
# {its attribute: the one value ours computes})
ACTIVATIONS = (
    ("ReLU", relu, {}, {}),
    ("Tanh", tanh, {}, {}),
    ("Sigmoid", sigmoid, {}, {}),
    ("GELU", gelu, {}, {"approximate": "tanh"}),
    ("GELU", gelu_exact, {}, {"approximate": "none"}),
    ("SiLU", swish, {}, {}),
    ("LeakyReLU", leakyrelu, {"negative_slope": ("a", 0.01)}, {}),
    ("ELU", elu, {"alpha": ("a", 1.0)}, {}),
    ("CELU", celu, {"alpha": ("a", 1.0)}, {}),
    ("SELU", selu, {}, {}),
    ("Softsign", softsign, {}, {}),
    ("LogSigmoid", logsigmoid, {}, {}),
    ("ReLU6", relu6, {}, {}),
    ("Hardtanh", hardtanh, {}, {"min_val": -1.0, "max_val": 1.0}),
    ("Softmax", softmax, {"dim": ("axis", -1)}, {}),
    ("LogSoftmax", logsoftmax, {"dim": ("axis", -1)}, {}),
    ("Identity", identity, {}, {}),
)


def _activation_from(module):
    name = type(module).__name__
    rows = [row for row in ACTIVATIONS if row[0] == name]
    for _, ours, options, fixed in rows:
        if all(getattr(module, k) == v for k, v in fixed.items()):
            given = {ours_k: getattr(module, k) for k, (ours_k, _) in options.items()}
            if any(v is None for v in given.values()):
                raise Unsupported(f"{module!r}: give dim= (PyTorch's implicit dim has no match)")
            defaults = {ours_k: d for ours_k, d in options.values()}
            return ours if given == defaults else functools.partial(ours, **given)
    fixed = " or ".join(", ".join(f"{k}={v!r}" for k, v in row[3].items()) for row in rows)
    raise Unsupported(f"{module!r} has no exact counterpart here; supported: {name}({fixed})")


# --- from PyTorch
@dataclasses.dataclass(frozen=True)
class _Target:
    """Where converted arrays go: library `xp`, `device`, `dtype` (None: the tensor's). A
    tensor met again (tied weights) gives the array made the first time."""

    xp: Any
    device: Any
    dtype: Any
    made: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def __call__(self, tensor, dtype=None):
        if tensor is None:
            return None
        key = (id(tensor), dtype)
        if key not in self.made:  # the tensor kept too, so that its id is not reused
            self.made[key] = (tensor, self._converted(tensor, dtype))
        return self.made[key][1]

    def _converted(self, tensor, dtype):
        tensor = tensor.detach().cpu()
        name = str(tensor.dtype).split(".")[-1]
        if name == "bfloat16":  # NumPy has none of its own: exact in float32, then cast
            tensor = tensor.float()
        values = tensor.numpy().copy()  # never the module's memory
        return asarray(values, xp=self.xp, device=self.device,
                       dtype=self.dtype or dtype or name)  # fmt: skip

    def place(self, module):
        tensors = [t for t in module.parameters()] + [t for t in module.buffers()]
        floating = [t for t in tensors if t.is_floating_point()]
        dtype = self.dtype or (str(floating[0].dtype).split(".")[-1] if floating else "float32")
        return dict(xp=self.xp, device=self.device, dtype=dtype)


def _rank(module):
    """The spatial rank of PyTorch's `Conv2d` and the like, from the class's name."""
    return int(type(module).__name__[-2])


def _sizes(value, rank):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * rank


def _refuse_if(condition, module, setting, fix):
    if condition:
        raise Unsupported(f"{type(module).__name__} with {setting} has no counterpart here; {fix}")


def _linear(m, put):
    return Dense(weight=put(m.weight), bias=put(m.bias))


def _conv(m, put):
    pad = m.padding if isinstance(m.padding, str) else tuple(m.padding)
    common = dict(weight=put(m.weight), bias=put(m.bias), stride=tuple(m.stride), pad=pad,
                  dilation=tuple(m.dilation), groups=m.groups)  # fmt: skip
    if not m.transposed:
        return Conv(pad_mode=m.padding_mode, **common)
    _refuse_if(m.padding_mode != "zeros", m, f"padding_mode={m.padding_mode!r}", "use zeros")
    return ConvTranspose(outpad=tuple(m.output_padding), **common)


def _running(m, put):
    """The arrays and options of a BatchNorm or an InstanceNorm."""
    _shifts(m)
    return dict(affine=m.affine, track_stats=m.track_running_stats, eps=m.eps,
                scale=put(m.weight), bias=put(m.bias), running_mean=put(m.running_mean),
                running_var=put(m.running_var), **put.place(m))  # fmt: skip


def _batchnorm(m, put):
    count = None
    if m.momentum is None and m.track_running_stats:  # the cumulative average counts batches
        count = asarray(int(m.num_batches_tracked), dtype="int64", xp=put.xp, device=put.device)
    return BatchNorm(m.num_features, momentum=m.momentum, count=count, **_running(m, put))


def _instancenorm(m, put):
    momentum = 0.0 if m.momentum is None else m.momentum  # PyTorch's None never updates
    return InstanceNorm(m.num_features, momentum=momentum, **_running(m, put))


def _layernorm(m, put):
    bias = False if m.bias is None else put(m.bias)
    return LayerNorm(tuple(m.normalized_shape), eps=m.eps, affine=m.elementwise_affine,
                     scale=put(m.weight), bias=bias, **put.place(m))  # fmt: skip


def _shifts(m):
    """Refuse PyTorch's norms that scale without a shift (`affine=True, bias=False`)."""
    _refuse_if(m.affine and m.bias is None, m, "affine=True and bias=False",
               "ours shifts whenever it scales: build it with bias=True")  # fmt: skip


def _groupnorm(m, put):
    _shifts(m)
    return GroupNorm(m.num_channels, m.num_groups, eps=m.eps, affine=m.affine,
                     scale=put(m.weight), bias=put(m.bias), **put.place(m))  # fmt: skip


def _embedding(m, put):
    fix = "train with PyTorch's dense gradients, unscaled"
    _refuse_if(m.scale_grad_by_freq, m, "scale_grad_by_freq=True", fix)
    _refuse_if(m.sparse, m, "sparse=True", fix)
    return Embedding(weight=put(m.weight), padding_idx=m.padding_idx, max_norm=m.max_norm,
                     norm_type=m.norm_type)  # fmt: skip


RECURRENT = {"RNN": (RNN, RNNCell), "LSTM": (LSTM, LSTMCell), "GRU": (GRU, GRUCell)}
NONLINEARITY = {"tanh": tanh, "relu": relu}
CELL_NAMES = {"Wi": "weight_ih", "Wh": "weight_hh", "bias": "bias_ih", "bias_h": "bias_hh"}


def _suffix(layer, direction):
    return f"_l{layer}" + ("_reverse" if direction else "")


def _recurrent(m, put):
    name = type(m).__name__
    _refuse_if(getattr(m, "proj_size", 0), m, f"proj_size={getattr(m, 'proj_size', 0)}",
               "an LSTM without projection (proj_size=0) converts")  # fmt: skip
    extra = {"activation": NONLINEARITY[m.nonlinearity]} if name == "RNN" else {}
    cells = []
    for layer in range(m.num_layers):
        for direction in range(2 if m.bidirectional else 1):
            s = _suffix(layer, direction)
            get = {k: put(getattr(m, w + s, None)) for k, w in CELL_NAMES.items()}
            cells.append(RECURRENT[name][1](**get, **extra))
    ours = RECURRENT[name][0]
    layer = ours.__new__(ours)  # PyTorch's cells as they are, in its order
    Recurrence.__init__(layer, *cells, return_state=True, bidirectional=m.bidirectional,
                        dropout=m.dropout, batch_first=m.batch_first)  # fmt: skip
    return layer


def _batch_first(m, batch_first):
    _refuse_if(not batch_first, m, "batch_first=False",
               "ours is batch-first, (batch, length, dim): build it with batch_first=True "
               "(the weights are the same) and convert that")  # fmt: skip


def _attention(m, put):
    _batch_first(m, m.batch_first)
    _refuse_if(m.bias_k is not None, m, "add_bias_kv=True", "build it without")
    _refuse_if(m.add_zero_attn, m, "add_zero_attn=True", "build it without")
    d = m.embed_dim
    if m._qkv_same_embed_dim:
        weights = [m.in_proj_weight[i * d : (i + 1) * d] for i in range(3)]
    else:
        weights = [m.q_proj_weight, m.k_proj_weight, m.v_proj_weight]
    biases = [None] * 3 if m.in_proj_bias is None else m.in_proj_bias.split(d)
    q, k, v = (Dense(weight=put(w), bias=put(b)) for w, b in zip(weights, biases))
    out = Dense(weight=put(m.out_proj.weight), bias=put(m.out_proj.bias))
    return MultiHeadAttention(nheads=m.num_heads, q_proj=q, k_proj=k, v_proj=v, out_proj=out,
                              dropout_prob=m.dropout)  # fmt: skip


def _encoder_activation(m):
    F = _torch().nn.functional
    if m.activation is F.relu:
        return relu
    if m.activation is F.gelu:
        return gelu_exact
    if isinstance(m.activation, _torch().nn.Module):
        return _activation_from(m.activation)
    raise Unsupported(
        f"TransformerEncoderLayer with activation {m.activation!r} has no counterpart here; "
        '"relu", "gelu" or an activation module (e.g. torch.nn.GELU(approximate="tanh")) convert'
    )


def _encoder_layer(m, put):
    _batch_first(m, m.self_attn.batch_first)
    p = m.dropout.p
    _refuse_if(m.dropout1.p != p or m.dropout2.p != p, m, "dropouts of different rates",
               "give dropout, dropout1 and dropout2 one rate")  # fmt: skip
    first = dataclasses.replace(_linear(m.linear1, put), activation=_encoder_activation(m))
    hidden = (Dropout(p),) if p else ()
    mlp = Chain(first, *hidden, _linear(m.linear2, put))
    return TransformerBlock(norm1=_layernorm(m.norm1, put), attention=_attention(m.self_attn, put),
                            norm2=_layernorm(m.norm2, put), mlp=mlp, dropout=p,
                            norm_first=m.norm_first)  # fmt: skip


def _pool(m, put):
    rank, name = _rank(m), type(m).__name__
    _refuse_if(getattr(m, "return_indices", False), m, "return_indices=True", "build it without")
    if name.startswith("Adaptive"):
        out = _sizes(m.output_size, rank)
        return (AdaptiveMaxPool if "Max" in name else AdaptiveMeanPool)(out)
    window = _sizes(m.kernel_size, rank)
    common = dict(stride=_sizes(m.stride, rank), pad=_sizes(m.padding, rank),
                  ceil_mode=m.ceil_mode)  # fmt: skip
    if name.startswith("Max"):
        return MaxPool(window, dilation=_sizes(m.dilation, rank), **common)
    _refuse_if(getattr(m, "divisor_override", None), m, "divisor_override", "build it without")
    return MeanPool(window, count_include_pad=m.count_include_pad, **common)


def _flatten(m, put):
    _refuse_if((m.start_dim, m.end_dim) != (1, -1), m, f"start_dim={m.start_dim}, end_dim="
               f"{m.end_dim}", "Flatten(1, -1) converts; reshape yourself")  # fmt: skip
    return Flatten()


def _takes_activation(layer):
    return isinstance(layer, Layer) and getattr(layer, "activation", False) is None


def _sequential(m, put):
    layers = []
    for child in m:
        ours = _convert(child, put)
        if type(child).__name__ in _ACTIVATION_NAMES and layers and _takes_activation(layers[-1]):
            layers[-1] = copy.copy(layers[-1])
            layers[-1].activation = ours
        else:
            layers.append(ours)
    return Chain(*layers)


def _ranked(names, convert):
    return {f"{name}{r}d": convert for name in names for r in (1, 2, 3)}


FROM_TORCH = {
    "Linear": _linear,
    **_ranked(("Conv", "ConvTranspose"), _conv),
    **_ranked(("BatchNorm",), _batchnorm),
    **_ranked(("InstanceNorm",), _instancenorm),
    "LayerNorm": _layernorm,
    "GroupNorm": _groupnorm,
    "Embedding": _embedding,
    "RNN": _recurrent,
    "LSTM": _recurrent,
    "GRU": _recurrent,
    "MultiheadAttention": _attention,
    "TransformerEncoderLayer": _encoder_layer,
    **_ranked(("MaxPool", "AvgPool", "AdaptiveMaxPool", "AdaptiveAvgPool"), _pool),
    "Flatten": _flatten,
    "Dropout": lambda m, put: Dropout(m.p),
    "Sequential": _sequential,
}
_ACTIVATION_NAMES = {row[0] for row in ACTIVATIONS}


def _convert(module, put):
    torch, name = _torch(), type(module).__name__
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch converts a torch.nn.Module, got {type(module).__name__}")
    known = name in FROM_TORCH or name in _ACTIVATION_NAMES
    if not known or getattr(torch.nn, name, None) is not type(module):
        supported = ", ".join(sorted(set(FROM_TORCH) | _ACTIVATION_NAMES))
        raise Unsupported(
            f"from_torch converts PyTorch's own modules ({supported}); {type(module).__module__}"
            f".{type(module).__qualname__} is not one of them: convert its children "
            "(module.named_children()) and compose them (a Chain, or a function calling them)"
        )
    if name in _ACTIVATION_NAMES:
        return _activation_from(module)
    return FROM_TORCH[name](module, put)


def from_torch(module, *, dtype=None, xp=None, device=None):
    """A `torch.nn` module as our layers (a `Sequential` as a `Chain`), with the same weights,
    running statistics and settings; arrays of library `xp` ("numpy" by default) on `device`,
    in `dtype` (the tensors' own by default).

    The modules converted are the keys of `FROM_TORCH` and the activations of `ACTIVATIONS`;
    anything else (a module of your own class, a setting we lack such as `proj_size`) raises
    `ValueError` naming it. A converted recurrent layer returns `(outputs, state)` as PyTorch's
    (`return_state=True`); a BatchNorm keeps `num_batches_tracked` only with `momentum=None`
    (as its `count`), where PyTorch reads it.

    >>> import torch
    >>> from tracker_gpu import nn
    >>> nn.from_torch(torch.nn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect"))
    Conv((3, 3), 3 => 8, pad=(1, 1), pad_mode='reflect')
    """
    return _convert(module, _Target(xp, device, dtype))
