"""From our layers to PyTorch's: `to_torch`, and `load_state_dict` of a PyTorch `state_dict`
into a model of ours, the reverse of `torch_io.from_torch` by the table `TO_TORCH` (our class
to a converter); PyTorch is imported by these functions only.

>>> import torch
>>> from tracker_gpu import nn
>>> module = nn.to_torch(nn.LSTM(3, 4, num_layers=2, bias_h=True))
>>> module
LSTM(3, 4, num_layers=2, batch_first=True)
>>> sorted(module.state_dict())[:4]
['bias_hh_l0', 'bias_hh_l1', 'bias_ih_l0', 'bias_ih_l1']
"""

import contextvars
import dataclasses
import functools

import numpy as np

from ..backend import device_of, namespace_of
from ..optim.tree import tree_map_with_path
from ..tracked import data
from .activations import identity, relu
from .attention import MultiHeadAttention, TransformerBlock
from .conv import Conv, ConvTranspose
from .io import _parameters
from .layers import Chain, Dense, Dropout, Embedding, Flatten, Layer
from .normalise import BatchNorm, GroupNorm, InstanceNorm, LayerNorm
from .placement import _dtype_name, asarray, lossy_cast, to_numpy
from .pool import AdaptiveMaxPool, AdaptiveMeanPool, MaxPool, MeanPool
from .recurrent import GRUCell, LSTMCell, Recurrence, RNNCell
from .torch_io import (
    ACTIVATIONS,
    NONLINEARITY,
    Unsupported,
    _suffix,
    _torch,
    from_torch,
    gelu_exact,
)

__all__ = ["to_torch", "load_state_dict", "TO_TORCH"]


def _activation_to(f):
    """PyTorch's module computing our activation `f` (a function, or a functools.partial)."""
    func, given = (f.func, f.keywords) if isinstance(f, functools.partial) else (f, {})
    for name, ours, options, fixed in ACTIVATIONS:
        if ours is func:
            ours_to_theirs = {ours_k: (k, d) for k, (ours_k, d) in options.items()}
            if set(given) - set(ours_to_theirs):
                break
            kw = {k: given.get(ours_k, d) for ours_k, (k, d) in ours_to_theirs.items()}
            return getattr(_torch().nn, name)(**fixed, **kw)
    names = sorted({row[1].__name__ for row in ACTIVATIONS})
    raise Unsupported(
        f"the function {getattr(f, '__name__', f)!r} has no PyTorch module; to_torch converts "
        f"the activations {', '.join(names)} (functools.partial of them with PyTorch's "
        "options); write the rest as a torch.nn.Module yourself"
    )


def _activations_to(layer):
    return [] if layer.activation in (None, identity) else [_activation_to(layer.activation)]


def _tensor(a):
    if isinstance(a, _torch().Tensor):
        return a
    values = to_numpy(data(a))
    if values.dtype.name == "bfloat16":  # ml_dtypes': PyTorch takes it through float32, exact
        return _torch().as_tensor(values.astype("float32")).to(_torch().bfloat16)
    return _torch().as_tensor(values)


def _dtype(a):
    return getattr(_torch(), _dtype_name(data(a).dtype))


# {id(array): the tensor first filled from it, or None} for the model `to_torch` converts
_FILLED = contextvars.ContextVar("filled", default=None)


def _filled(module, arrays):
    """`module` with its state_dict set to `arrays` (every one of them, checked by PyTorch);
    within `to_torch`, an array of the model met before (tied weights) gives the tensor made
    the first time, so PyTorch's module ties it too."""
    module.load_state_dict({k: _tensor(a) for k, a in arrays.items()}, strict=True)
    filled = _FILLED.get()
    for name, a in arrays.items() if filled is not None else ():
        _tie(module, name, filled, id(data(a)))
    return module


def _tie(module, name, filled, key):
    if key not in filled:  # not an array of the model (a concatenation, zeros)
        return
    prefix, _, leaf = name.rpartition(".")
    owner = module.get_submodule(prefix)
    if filled[key] is None:
        filled[key] = getattr(owner, leaf)
    else:
        setattr(owner, leaf, filled[key])


def _symmetric(layer, rank):
    if len(layer.pad) != rank:
        raise Unsupported(
            f"{layer!r}: asymmetric padding has no PyTorch layer; pad the input with "
            "torch.nn.functional.pad and use pad=0"
        )
    return layer.pad


def _dense_to(layer, rank):
    n_out, n_in = layer.weight.shape
    bias, dtype = layer.bias is not None, _dtype(layer.weight)
    module = _torch().nn.Linear(n_in, n_out, bias=bias, dtype=dtype)
    arrays = {"weight": layer.weight, "bias": layer.bias}
    module = _filled(module, {k: a for k, a in arrays.items() if a is not None})
    return [module] + _activations_to(layer)


def _conv_to(layer, rank):
    transposed = isinstance(layer, ConvTranspose)
    a, b, *kernel = layer.weight.shape
    kind = f"{'ConvTranspose' if transposed else 'Conv'}{len(kernel)}d"
    in_out = (a, b * layer.groups) if transposed else (b * layer.groups, a)
    options = dict(stride=layer.stride, padding=_symmetric(layer, len(kernel)),
                   dilation=layer.dilation, groups=layer.groups, bias=layer.bias is not None,
                   dtype=_dtype(layer.weight))  # fmt: skip
    if transposed:
        options["output_padding"] = layer.outpad
    else:
        options["padding_mode"] = layer.pad_mode
    module = getattr(_torch().nn, kind)(*in_out, tuple(kernel), **options)
    arrays = {"weight": layer.weight, "bias": layer.bias}
    module = _filled(module, {k: a for k, a in arrays.items() if a is not None})
    return [module] + _activations_to(layer)


def _norm_module(layer, rank):
    """PyTorch's norm with `layer`'s settings (a BatchNorm's or InstanceNorm's rank: `rank`)."""
    nn_ = _torch().nn
    affine = layer.scale is not None
    if isinstance(layer, LayerNorm):
        options = dict(elementwise_affine=affine, bias=layer.bias is not None)
        return nn_.LayerNorm(layer.size, eps=layer.eps, **options)
    if isinstance(layer, GroupNorm):
        return nn_.GroupNorm(layer.groups, layer.channels, eps=layer.eps, affine=affine)
    kind = getattr(nn_, f"{type(layer).__name__}{rank}d")
    return kind(layer.channels, eps=layer.eps, momentum=layer.momentum, affine=affine,
                track_running_stats=layer.running_mean is not None)  # fmt: skip


def _norm_to(layer, rank):
    arrays = {"weight": layer.scale, "bias": layer.bias}
    running = getattr(layer, "running_mean", None)
    if running is not None:
        arrays.update(running_mean=running, running_var=layer.running_var)
    arrays = {k: a for k, a in arrays.items() if a is not None}
    if running is not None:  # PyTorch's counter, read with momentum=None only (our count)
        arrays["num_batches_tracked"] = _count(getattr(layer, "count", None))
    module = _norm_module(layer, rank)
    placed = [a for a in (layer.scale, running) if a is not None]
    module = module.to(_dtype(placed[0])) if placed else module
    return [_filled(module, arrays)] + _activations_to(layer)


def _count(count):
    """Our count of batches as PyTorch's `num_batches_tracked`."""
    value = 0 if count is None else int(to_numpy(data(count)))
    return _torch().tensor(value, dtype=_torch().long)


def _embedding_to(layer, rank):
    vocab, dim = layer.weight.shape
    module = _torch().nn.Embedding(vocab, dim, padding_idx=layer.padding_idx,
                                   max_norm=layer.max_norm, norm_type=layer.norm_type,
                                   dtype=_dtype(layer.weight))  # fmt: skip
    return [_filled(module, {"weight": layer.weight})]


TORCH_CELLS = {RNNCell: "RNN", LSTMCell: "LSTM", GRUCell: "GRU"}


def _nonlinearity(cell):
    for name, f in NONLINEARITY.items():
        if cell.activation is f:
            return {"nonlinearity": name}
    raise Unsupported(f"{cell!r}: PyTorch's RNN has the activations tanh and relu only")


def _recurrent_to(layer, rank):
    cells = (layer.cell, *layer.cells)
    kinds = {type(c) for c in cells}
    if len(kinds) > 1:
        raise Unsupported(f"{layer!r}: cells of different kinds have no PyTorch layer")
    kind = TORCH_CELLS[kinds.pop()]
    has_bias = any(c.bias is not None or c.bias_h is not None for c in cells)
    n_in, n_out = layer.cell.size
    extra = _nonlinearity(layer.cell) if kind == "RNN" else {}
    if kind == "RNN" and any(c.activation is not layer.cell.activation for c in cells):
        raise Unsupported(f"{layer!r}: cells of different activations have no PyTorch layer")
    dropout = 0.0 if layer.dropout is None else layer.dropout.p
    module = getattr(_torch().nn, kind)(
        n_in, n_out, num_layers=layer.num_layers, bias=has_bias, batch_first=layer.batch_first,
        dropout=dropout, bidirectional=layer.bidirectional, dtype=_dtype(layer.cell.Wi), **extra,
    )  # fmt: skip
    directions, arrays = 2 if layer.bidirectional else 1, {}
    for i, cell in enumerate(cells):
        s = _suffix(i // directions, i % directions)
        arrays.update({f"weight_ih{s}": cell.Wi, f"weight_hh{s}": cell.Wh})
        if has_bias:  # a bias we lack is PyTorch's zeros
            zeros = namespace_of(data(cell.Wi)).zeros_like(data(cell.Wi)[:, 0])
            arrays[f"bias_ih{s}"] = zeros if cell.bias is None else cell.bias
            arrays[f"bias_hh{s}"] = zeros if cell.bias_h is None else cell.bias_h
    return [_filled(module, arrays)]


def _same_bias(layers, what):
    present = {layer.bias is not None for layer in layers}
    if len(present) > 1:
        raise Unsupported(f"{what}: PyTorch's has biases on all its projections or on none")
    return present.pop()


def _attention_to(layer, rank):
    if layer.causal is True:
        raise Unsupported(
            f"{layer!r}: PyTorch's MultiheadAttention takes a causal mask at each call, not in "
            "the layer: convert dataclasses.replace(layer, causal=False) and pass attn_mask="
            "torch.nn.Transformer.generate_square_subsequent_mask(length), is_causal=True"
        )
    projections = (layer.q_proj, layer.k_proj, layer.v_proj)
    bias = _same_bias((*projections, layer.out_proj), repr(layer))
    dim, kdim, vdim = (p.weight.shape[1] for p in projections)
    p = 0.0 if layer.attn_drop is None else layer.attn_drop.p
    module = _torch().nn.MultiheadAttention(
        dim, layer.nheads, dropout=p, bias=bias, kdim=kdim, vdim=vdim, batch_first=True,
        dtype=_dtype(layer.q_proj.weight),
    )  # fmt: skip
    arrays = {"out_proj.weight": layer.out_proj.weight}
    if kdim == vdim == dim:
        arrays["in_proj_weight"] = _concat([q.weight for q in projections])
    else:
        arrays.update({f"{n}_proj_weight": q.weight for n, q in zip("qkv", projections)})
    if bias:
        arrays["in_proj_bias"] = _concat([q.bias for q in projections])
        arrays["out_proj.bias"] = layer.out_proj.bias
    return [_filled(module, arrays)]


def _concat(arrays):
    plain = [data(a) for a in arrays]
    return namespace_of(plain[0]).concat(plain, axis=0)


ENCODER_ACTIVATIONS = {relu: "relu", gelu_exact: "gelu"}


def _block_to(layer, rank):
    mlp = list(getattr(layer.mlp, "layers", ()))
    dropouts = [m.p for m in mlp if isinstance(m, Dropout)]
    linears = [m for m in mlp if not isinstance(m, Dropout)]
    shape = [type(m) for m in mlp] in ([Dense, Dense], [Dense, Dropout, Dense])
    if not shape or linears[1].activation is not None:
        raise Unsupported(f"{layer!r}: PyTorch's TransformerEncoderLayer has the MLP "
                          "Chain(Dense(activation), Dropout, Dense)")  # fmt: skip
    if any(n.activation is not None for n in (layer.norm1, layer.norm2)):
        raise Unsupported(f"{layer!r}: PyTorch's TransformerEncoderLayer has no activation "
                          "after its layer norms")  # fmt: skip
    rates = {0.0 if d is None else d.p for d in (layer.dropout, layer.attention.attn_drop)}
    rates |= set(dropouts) or {0.0}
    if len(rates) > 1:
        raise Unsupported(f"{layer!r}: PyTorch's TransformerEncoderLayer has one dropout rate "
                          f"for its attention, MLP and branches, not {sorted(rates)}")  # fmt: skip
    first, second = linears
    f = first.activation
    activation = ENCODER_ACTIVATIONS.get(f) or _activation_to(f)
    norm1, norm2 = (_norm_to(n, rank)[0] for n in (layer.norm1, layer.norm2))
    module = _torch().nn.TransformerEncoderLayer(
        first.weight.shape[1], layer.attention.nheads, first.weight.shape[0],
        dropout=rates.pop(), activation=activation, layer_norm_eps=norm1.eps, batch_first=True,
        norm_first=layer.norm_first, bias=first.bias is not None, dtype=_dtype(first.weight),
    )  # fmt: skip
    module.self_attn = _attention_to(layer.attention, rank)[0]
    module.linear1, module.linear2 = (_dense_to(dataclasses.replace(d, activation=None), rank)[0]
                                      for d in (first, second))  # fmt: skip
    module.norm1, module.norm2 = norm1, norm2
    return [module]


def _pool_to(layer, rank):
    nn_, r = _torch().nn, len(getattr(layer, "window", getattr(layer, "out", ())))
    if isinstance(layer, (AdaptiveMaxPool, AdaptiveMeanPool)):
        kind = "AdaptiveMaxPool" if isinstance(layer, AdaptiveMaxPool) else "AdaptiveAvgPool"
        return [getattr(nn_, f"{kind}{r}d")(layer.out)]
    options = dict(stride=layer.stride, padding=_symmetric(layer, r), ceil_mode=layer.ceil_mode)
    if isinstance(layer, MaxPool):
        return [getattr(nn_, f"MaxPool{r}d")(layer.window, dilation=layer.dilation, **options)]
    count = layer.count_include_pad
    return [getattr(nn_, f"AvgPool{r}d")(layer.window, count_include_pad=count, **options)]


def _chain_to(layer, rank):
    modules = []
    for inner in layer.layers:
        modules += _to(inner, rank)
        rank = _rank_after(inner, rank)
    return [_torch().nn.Sequential(*modules)]


def _rank_after(layer, rank):
    """The spatial rank of what `layer` outputs (a norm after it picks BatchNorm1d/2d/3d)."""
    if isinstance(layer, (Conv, ConvTranspose)):
        return len(layer.weight.shape) - 2
    if isinstance(layer, (MaxPool, MeanPool)):
        return len(layer.window)
    if isinstance(layer, Chain):  # its last layer's (it was the rank going in)
        for inner in layer.layers:
            rank = _rank_after(inner, rank)
        return rank
    return 1 if isinstance(layer, (Dense, Flatten)) else rank


TO_TORCH = {
    Dense: _dense_to,
    Conv: _conv_to,
    ConvTranspose: _conv_to,
    BatchNorm: _norm_to,
    InstanceNorm: _norm_to,
    LayerNorm: _norm_to,
    GroupNorm: _norm_to,
    Embedding: _embedding_to,
    Recurrence: _recurrent_to,
    MultiHeadAttention: _attention_to,
    TransformerBlock: _block_to,
    MaxPool: _pool_to,
    MeanPool: _pool_to,
    AdaptiveMaxPool: _pool_to,
    AdaptiveMeanPool: _pool_to,
    Flatten: lambda layer, rank: [_torch().nn.Flatten()],
    Dropout: lambda layer, rank: [_torch().nn.Dropout(layer.p)],
    Chain: _chain_to,
}


def _to(layer, rank):
    if not isinstance(layer, Layer):
        return [_activation_to(layer)]
    convert = next((TO_TORCH[t] for t in type(layer).__mro__ if t in TO_TORCH), None)
    if convert is None:
        supported = ", ".join(t.__name__ for t in TO_TORCH)
        raise Unsupported(f"to_torch converts {supported} and activations, not {layer!r}")
    return convert(layer, rank)


def to_torch(model, *, rank=1):
    """Our layer, `Chain` or activation as a `torch.nn` module (a `Chain` as a `Sequential`,
    a layer's activation as a module after it), with the same weights and settings, on the
    CPU in the weights' dtype (`module.to(device)` moves it).

    A BatchNorm or InstanceNorm becomes PyTorch's of the rank of the convolution or pool
    before it in its Chain, else of `rank` (1: `BatchNorm1d`, for `(batch, channels)` too; 2:
    `BatchNorm2d`, ...): ours are the same layer for every rank. Something PyTorch has no
    layer for (asymmetric padding, a causal attention layer, a function of your own in a
    Chain) raises `ValueError`. An array held in several places (tied weights) is one tensor
    of the module, where PyTorch's layers hold it whole (not in `MultiheadAttention`'s
    `in_proj_weight`, which concatenates three).

    >>> import numpy as np
    >>> from tracker_gpu import nn
    >>> module = nn.to_torch(nn.Chain(nn.Conv((3, 3), 1, 2, nn.relu), nn.BatchNorm(2)))
    >>> [type(m).__name__ for m in module]
    ['Conv2d', 'ReLU', 'BatchNorm2d']
    """
    token = _FILLED.set(dict.fromkeys(id(a) for a in _parameters(model).values()))
    try:
        modules = _to(model, rank)
    finally:
        _FILLED.reset(token)
    return modules[0] if len(modules) == 1 else _torch().nn.Sequential(*modules)


def load_state_dict(model, state_dict):
    """`model` with the arrays of PyTorch's `state_dict` in place of its own, each placed like
    the array it replaces (library, device, dtype); the names are PyTorch's for the module
    `to_torch(model)` (e.g. "0.weight" for the first layer of a Chain, "weight_ih_l0" for an
    LSTM's first cell). Missing or unexpected names, or a shape that differs, raise
    `ValueError` before anything is loaded; so do different values for two places that the
    model holds one array in (tied weights), which stays one array.

    >>> import numpy as np, torch
    >>> from tracker_gpu import nn
    >>> model = nn.Dense(2, 1, dtype="float64")
    >>> state = {"weight": torch.tensor([[1.0, 2.0]]), "bias": torch.tensor([0.5])}
    >>> nn.load_state_dict(model, state).weight
    array([[1., 2.]])
    """
    module = to_torch(model)
    _held_without_loss(module, state_dict)
    try:
        module.load_state_dict(state_dict, strict=True)
    except RuntimeError as error:
        raise ValueError(
            f"load_state_dict: the state_dict does not fit the model (its names and shapes are "
            f"those of nn.to_torch(model).state_dict()): {error}"
        ) from None
    _same_where_tied(module, state_dict)
    new, old = _by_place(_parameters(from_torch(module)), _parameters(model))
    if set(new) != set(old):
        raise ValueError(
            f"load_state_dict: the state_dict gives {sorted(set(new) - set(old))} which the "
            f"model lacks, and not {sorted(set(old) - set(new))}; build the model with the "
            "matching options (bias_h=True for PyTorch's recurrent layers, momentum=None for "
            "a BatchNorm's count)"
        )

    made = {}  # by the model's array: (its first place, the array loaded there)

    def placed(path, a):
        key = path or "_"
        if key not in old:
            return a
        like = old[key]
        if id(like) not in made:
            value = to_numpy(new[key])
            made[id(like)] = key, asarray(value, xp=namespace_of(like), device=device_of(like),
                                          dtype=like.dtype)  # fmt: skip
        first, array = made[id(like)]
        same = first == key or np.array_equal(new[first], new[key], equal_nan=True)
        if not same:
            raise _untied(f"the model's {first} and {key}")  # a tie PyTorch's module lacks
        return array

    return tree_map_with_path(placed, model)


def _held_without_loss(module, state_dict):
    """Refuse a value that the module's tensor cannot hold (complex into real, beyond float16's
    range, a fraction into integers), as `nn.load` refuses it: PyTorch's copy writes inf, or
    drops the imaginary parts with a warning."""
    own = module.state_dict()
    for name, value in state_dict.items():
        if name in own:
            why = lossy_cast(to_numpy(value), own[name].dtype)
            if why is not None:
                raise ValueError(f"load_state_dict: {name} does not fit the model: {why}")


def _by_place(new, old):
    """The arrays read back from the module (`new`, by path), by the model's paths (`old`): a
    layer with an activation comes back from `to_torch`'s Sequential as a Chain of the layer
    and the activation, its arrays the same, in the same order, under other paths."""
    shapes = [tuple(a.shape) for a in new.values()]
    if set(new) != set(old) and shapes == [tuple(a.shape) for a in old.values()]:
        return dict(zip(old, new.values())), old
    return new, old


def _same_where_tied(module, state_dict):
    """Refuse a `state_dict` with different values for two names of one tensor of `module`
    (`to_torch` of a model with tied weights)."""
    first = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        seen = first.setdefault(id(tensor), name)
        a, b = state_dict[seen], state_dict[name]
        if seen != name and not _torch().allclose(a, b.to(a), rtol=0, atol=0, equal_nan=True):
            raise _untied(f"{seen!r} and {name!r}")


def _untied(places):
    return ValueError(
        f"load_state_dict: the model holds one array (tied weights) at {places}, but the "
        "state_dict gives them different values; give them one value (tie them in PyTorch: "
        "`b.weight = a.weight`) or build the model without the tie"
    )
