"""Layers, activations, initialisers and saving, for training small models the Flux way.

A model is a plain nested structure of dataclasses whose fields are arrays, sublayers or
settings, so `tg.withgradient(loss, model)` returns a gradient of the same shape and
`tracker_gpu.optim` updates it. A layer is called on a batch whose *first* axis is the batch
(the NumPy and PyTorch layout; Flux puts it last): `Dense` takes `(batch, features)`, `Conv`
and the pools take `(batch, channels, height, width)`.

Parameters are drawn with a NumPy random generator (`rng`), then created where you ask: `dtype`
(float32 by default), `device` (the library is the one that owns the device: a CuPy device, a
PyTorch device, an array-api-strict device) and `xp` (a namespace, or a name: "numpy", "torch",
"cupy", "strict").

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

import copy
import dataclasses
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

from .backend import device_of, is_array, is_cupy, namespace_of
from .creation import DTYPE_NAMES, library_of_device
from .optim import tree_map_with_path
from .rules.elementwise import abs as _abs
from .rules.elementwise import (
    add,
    astype,
    clip,
    divide,
    expm1,
    logaddexp,
    multiply,
    negative,
    sqrt,
    square,
    subtract,
    tanh,
    where,
)
from .rules.linalg import matmul, matrix_transpose
from .rules.losses import (
    binarycrossentropy,
    crossentropy,
    logitbinarycrossentropy,
    logitcrossentropy,
    mse,
)
from .rules.manipulation import take
from .rules.nn import logsoftmax, relu, sigmoid, softmax
from .rules.reductions import max as _max
from .rules.reductions import mean
from .rules.reductions import sum as _sum
from .rules.shape import permute_dims, reshape
from .tracked import Primitive, TrackedArray, data

__all__ = [
    # layers
    "Chain",
    "Dense",
    "Conv",
    "MaxPool",
    "MeanPool",
    "Flatten",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "trainmode",
    "testmode",
    # activations
    "identity",
    "relu",
    "sigmoid",
    "tanh",
    "softmax",
    "logsoftmax",
    "leakyrelu",
    "elu",
    "selu",
    "celu",
    "gelu",
    "swish",
    "mish",
    "softplus",
    "logsigmoid",
    "softsign",
    "hardtanh",
    "relu6",
    "flatten",
    # losses
    "mse",
    "logitcrossentropy",
    "crossentropy",
    "binarycrossentropy",
    "logitbinarycrossentropy",
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
    "linear",
    "im2col",
    "col2im",
]


# --- activations: composites of the rules, differentiable to any order
def identity(x):
    return x


def leakyrelu(x, a=0.01):
    """`x` where positive, `a * x` elsewhere."""
    return where(data(x) > 0, x, multiply(x, a))


def _negative_part(x):
    """`min(x, 0)`, with the gradient 1 at 0 (so that elu'(0) = a, as NNlib)."""
    return where(data(x) > 0, 0.0, x)


def elu(x, a=1.0):
    """`x` where positive, `a * (exp(x) - 1)` elsewhere."""
    return where(data(x) > 0, x, multiply(expm1(_negative_part(x)), a))


def selu(x):
    """Scaled exponential linear unit, with the constants of Klambauer et al. (2017)."""
    scale, alpha = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717
    return multiply(where(data(x) > 0, x, multiply(expm1(_negative_part(x)), alpha)), scale)


def celu(x, a=1.0):
    """`x` where positive, `a * (exp(x / a) - 1)` elsewhere."""
    return where(data(x) > 0, x, multiply(expm1(divide(_negative_part(x), a)), a))


def gelu(x):
    """Gaussian error linear unit, in the tanh approximation (Flux's `gelu`)."""
    c = math.sqrt(2 / math.pi)
    inner = multiply(add(x, multiply(x * x * x, 0.044715)), c)
    return multiply(multiply(x, 0.5), add(tanh(inner), 1.0))


def swish(x):
    """`x * sigmoid(x)` (also called SiLU)."""
    return multiply(x, sigmoid(x))


def softplus(x):
    """`log(1 + exp(x))`, computed stably."""
    return logaddexp(x, 0.0)


def mish(x):
    """`x * tanh(softplus(x))`."""
    return multiply(x, tanh(softplus(x)))


def logsigmoid(x):
    """`log(sigmoid(x))`, computed stably."""
    return negative(softplus(negative(x)))


def softsign(x):
    """`x / (1 + |x|)`."""
    return divide(x, add(_abs(x), 1.0))


def hardtanh(x):
    """`x` clipped to [-1, 1]."""
    return clip(x, -1.0, 1.0)


def relu6(x):
    """`x` clipped to [0, 6]."""
    return clip(x, 0.0, 6.0)


def flatten(x):
    """Every axis but the first (the batch) made one."""
    return reshape(x, (x.shape[0], math.prod(x.shape[1:])))


def _activate(activation, y):
    return y if activation is None or activation is identity else activation(y)


# --- initialisers: NumPy float64 values from a NumPy generator, placed by the layer
SQRT2 = math.sqrt(2.0)


def _fans(shape):
    """(fan_in, fan_out) of a weight of `shape`: (out, in) or (out, in, *kernel)."""
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
    return rng.standard_normal(size=shape)


# --- placement: which library, device and dtype arrays are created in
LIBRARIES = {
    "numpy": "numpy",
    "torch": "array_api_compat.torch",
    "cupy": "array_api_compat.cupy",
    "strict": "array_api_strict",
    "array_api_strict": "array_api_strict",
}


def _namespace(xp):
    """A namespace from a namespace or a library name ("numpy", "torch", "cupy", "strict")."""
    if not isinstance(xp, str):
        name = getattr(xp, "__name__", "")
        return importlib.import_module(LIBRARIES[name]) if name in ("torch", "cupy") else xp
    if xp not in LIBRARIES:
        raise ValueError(f"unknown array library {xp!r}; choose one of {', '.join(LIBRARIES)}")
    try:
        return importlib.import_module(LIBRARIES[xp])
    except ImportError as error:
        raise ImportError(f"array library {xp!r} is not installed ({error})") from error


def _dtype_name(dtype):
    try:
        return np.dtype(dtype).name
    except TypeError:
        name = str(dtype).rsplit(".", 1)[-1].strip("'>")
        if name in DTYPE_NAMES:
            return name
        raise TypeError(f"unknown dtype {dtype!r}; pass e.g. 'float32' or 'float64'") from None


def asarray(values, *, xp=None, device=None, dtype=None):
    """NumPy `values` (or a list) as an array of library `xp` (a namespace or a name; else the
    library that owns `device`) on `device`, with `dtype` (a name or any library's dtype)."""
    values = np.asarray(values)
    target = _namespace(xp) if xp is not None else library_of_device(device, np)
    name = _dtype_name(dtype if dtype is not None else values.dtype)
    return target.asarray(values, dtype=getattr(target, name), device=device)


def _rng(rng):
    return rng if rng is not None else np.random.default_rng()


def _zeros_like(like, n):
    xp = namespace_of(like)
    return xp.zeros((n,), dtype=like.dtype, device=device_of(like))


def _bias(bias, like, n):
    """A bias from `bias=True` (zeros placed like `like`), False/None (no bias) or an array."""
    if bias is True:
        return _zeros_like(like, n)
    if bias is False or bias is None:
        return None
    return bias


def to_numpy(x):
    """The NumPy copy of an array of any library and device (a tracked one's value)."""
    x = data(x)
    if isinstance(x, (np.ndarray, np.generic)):
        return np.asarray(x)
    if is_cupy(x):
        return x.get()
    if array_api_compat.is_torch_array(x):
        return x.detach().cpu().numpy()
    cpu = namespace_of(x).__array_namespace_info__().default_device()
    return np.asarray(array_api_compat.to_device(x, cpu))


def place(model, *, xp=None, device=None, dtype=None):
    """`model` (or an array) with every floating array moved to library `xp` and `device`, and
    cast to `dtype` (Flux's `gpu`, `cpu` and `f32` in one). Unset arguments are kept as they are.
    """

    def move(x):
        if not is_array(x) or not namespace_of(x).isdtype(x.dtype, "real floating"):
            return x
        return _place_array(x, xp, device, dtype)

    return tree_map_with_path(lambda path, x: move(x), model)


def _place_array(x, xp, device, dtype):
    source = namespace_of(x)
    if xp is not None:
        target = _namespace(xp)
    else:
        target = library_of_device(device, source) if device is not None else source
    name = _dtype_name(dtype if dtype is not None else x.dtype)
    if target is not source:
        return asarray(to_numpy(x), xp=target, device=device, dtype=name)
    if device is not None and device_of(x) != device:
        x = array_api_compat.to_device(x, device)
    return x if name == _dtype_name(x.dtype) else source.astype(x, getattr(source, name))


# --- saving and loading parameters
def _parameters(model):
    """`{path: array}` for every array of `model`, paths like "layers.0.weight"."""
    found = {}

    def record(path, x):
        if is_array(data(x)):
            found[path or "_"] = data(x)
        return x

    tree_map_with_path(record, model)
    return found


def save(path, model):
    """Write every array of `model` to the `.npz` file `path`, as NumPy arrays (so a model
    trained on any library or device loads anywhere), keyed by its place in the model."""
    np.savez(path, **{key: to_numpy(a) for key, a in _parameters(model).items()})


def load(path, model=None, *, xp=None, device=None, dtype=None):
    """The arrays saved by `save`, put into `model` (a model of the same structure).

    Each array goes where the model's array is (same library, device and dtype), unless `xp`,
    `device` or `dtype` is given. Without a model, returns `{key: NumPy array}`.
    """
    with np.load(path) as file:
        saved = {key: file[key] for key in file.files}
    if model is None:
        return saved
    expected = _parameters(model)
    _check_same_keys(path, saved, expected)
    explicit = xp is not None or device is not None

    def fill(key, x):
        key = key or "_"
        if key not in expected:
            return x
        values, template = saved[key], expected[key]
        if tuple(values.shape) != tuple(template.shape):
            raise ValueError(
                f"load: {key} has shape {tuple(values.shape)} in {path} but "
                f"{tuple(template.shape)} in the model"
            )
        if explicit:
            return asarray(values, xp=xp, device=device, dtype=dtype or values.dtype)
        return asarray(
            values,
            xp=namespace_of(template),
            device=device_of(template),
            dtype=dtype or template.dtype,
        )

    return tree_map_with_path(fill, model)


def _check_same_keys(path, saved, expected):
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    if missing or extra:
        raise ValueError(
            f"load: {path} does not fit the model: missing {missing or 'nothing'}, "
            f"unexpected {extra or 'nothing'}; load it into a model built the same way"
        )


# --- im2col and col2im: adjoint primitives, so convolutions and pools are matmuls
def _pair(name, value, what):
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 0 for v in pair):
        raise ValueError(f"{name}: {what} must be an int or a pair of ints >= 0, got {value!r}")
    return pair


def _output_size(size, kernel, stride, pad):
    return (size + 2 * pad - kernel) // stride + 1


def _windows(kernel, stride, out):
    """The slices of a padded image that each kernel offset `(i, j)` sees, in order."""
    (kh, kw), (sh, sw), (oh, ow) = kernel, stride, out
    for i in range(kh):
        for j in range(kw):
            yield (
                slice(None),
                slice(None),
                slice(i, i + sh * (oh - 1) + 1, sh),
                slice(j, j + sw * (ow - 1) + 1, sw),
            )


def _im2col_forward(xp, x, *, kernel, stride, pad, fill=0.0):
    n, c, h, w = x.shape
    (ph, pw) = pad
    out = (_output_size(h, kernel[0], stride[0], ph), _output_size(w, kernel[1], stride[1], pw))
    if ph or pw:
        shape = (n, c, h + 2 * ph, w + 2 * pw)
        padded = xp.full(shape, fill, dtype=x.dtype, device=device_of(x))
        padded[:, :, ph : ph + h, pw : pw + w] = x
        x = padded
    patches = xp.stack([x[key] for key in _windows(kernel, stride, out)], axis=-1)
    patches = xp.permute_dims(patches, (0, 2, 3, 1, 4))  # (n, oh, ow, c, kh * kw)
    return xp.reshape(patches, (n * out[0] * out[1], c * kernel[0] * kernel[1]))


def _col2im_forward(xp, cols, *, shape, kernel, stride, pad):
    n, c, h, w = shape
    (ph, pw) = pad
    out = (_output_size(h, kernel[0], stride[0], ph), _output_size(w, kernel[1], stride[1], pw))
    cols = xp.reshape(cols, (n, out[0], out[1], c, kernel[0] * kernel[1]))
    cols = xp.permute_dims(cols, (0, 3, 1, 2, 4))  # (n, c, oh, ow, kh * kw)
    z = xp.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype, device=device_of(cols))
    for k, key in enumerate(_windows(kernel, stride, out)):
        z[key] = z[key] + cols[..., k]
    return z[:, :, ph : ph + h, pw : pw + w] if ph or pw else z


im2col = Primitive(
    "im2col",
    _im2col_forward,
    (
        lambda g, ans, x, *, kernel, stride, pad, fill=0.0: col2im(
            g, shape=tuple(x.shape), kernel=kernel, stride=stride, pad=pad
        ),
    ),
    doc="""Patches of an NCHW image as rows: `(n * oh * ow, c * kh * kw)`.

    `kernel`, `stride` and `pad` are pairs; padding is filled with `fill`. Its vjp is `col2im`.
    """,
)
col2im = Primitive(
    "col2im",
    _col2im_forward,
    (
        lambda g, ans, cols, *, shape, kernel, stride, pad: im2col(
            g, kernel=kernel, stride=stride, pad=pad
        ),
    ),
    doc="The adjoint of `im2col`: patch rows summed back into an NCHW image of `shape`.",
)


# --- the affine map of Dense and Conv: one primitive
def _linear_forward(xp, x, weight, bias):
    y = xp.matmul(x, xp.matrix_transpose(weight))
    return y if bias is None else y + bias


# The vjps call the library directly on plain arrays (a first-order pass: the hot path of
# training) and this package's functions on tracked ones (a nested pass, differentiable again).
def _plain_namespace(*values):
    """The library of plain arrays, or None if any of `values` is tracked."""
    if any(type(v) is TrackedArray for v in values):
        return None
    return namespace_of(values[0])


def _linear_vjp_x(g, ans, x, weight, bias):
    xp = _plain_namespace(g, weight)
    return xp.matmul(g, weight) if xp is not None else matmul(g, weight)


def _linear_vjp_weight(g, ans, x, weight, bias):
    # g.T @ x over every leading axis: a fresh (out, in) array, laid out like the weight
    n_out, n_in = weight.shape
    if len(x.shape) == 1:
        return multiply(reshape(g, (n_out, 1)), reshape(x, (1, n_in)))
    if len(x.shape) > 2:
        rows = math.prod(x.shape[:-1])
        g, x = reshape(g, (rows, n_out)), reshape(x, (rows, n_in))
    xp = _plain_namespace(g, x)
    if xp is not None:
        return xp.matmul(xp.matrix_transpose(g), x)
    return matmul(matrix_transpose(g), x)


def _linear_vjp_bias(g, ans, x, weight, bias):
    if len(g.shape) == 1:
        return g
    axes = tuple(range(len(g.shape) - 1))
    xp = _plain_namespace(g)
    return xp.sum(g, axis=axes) if xp is not None else _sum(g, axis=axes)


linear = Primitive(
    "linear",
    _linear_forward,
    (_linear_vjp_x, _linear_vjp_weight, _linear_vjp_bias),
    doc="""`x @ weight.T + bias` (`bias` may be None), one primitive: `weight` is `(out, in)`.

    The weight's gradient is computed as `g.T @ x`, so it comes out laid out like the weight.
    """,
)


# --- layers
def _is_layer_field(value):
    return is_array(data(value))


class Layer:
    """What the layers share: a short repr, and the check of an input's shape."""

    def __repr__(self):
        return self._fields_repr()

    def _fields_repr(self):
        """`Name(field=value, ...)`, arrays summarised: for gradients and optimiser states,
        which have a layer's structure but not its arrays."""
        fields = ", ".join(
            f"{f.name}={_describe(getattr(self, f.name))}" for f in dataclasses.fields(self)
        )
        return f"{type(self).__name__}({fields})"

    def _expect(self, condition, x, expected):
        if not condition:
            self._refuse(x, expected)

    def _refuse(self, x, expected):
        raise ValueError(f"{self!r} expects {expected}, got an input of shape {_shape(x)}")


def _describe(value):
    if _is_layer_field(value):
        v = data(value)
        return f"{_dtype_name(v.dtype)}{list(v.shape)}"
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    return repr(value)


def _shape(x):
    return tuple(getattr(x, "shape", ()))


def _match_dtype(x, like):
    """Cast a (plain or tracked) input to the dtype of the layer's weight, as Flux does."""
    if data(x).dtype == like.dtype:
        return x
    return astype(x, data(like).dtype)


@dataclass(init=False, repr=False)
class Dense(Layer):
    """`activation(x @ weight.T + bias)`: `weight` is `(n_out, n_in)`, `x` is `(..., n_in)`.

    `Dense(n_in, n_out, activation)` draws `weight` with `init` (Glorot uniform) and makes a zero
    bias (`bias=False` for none); `Dense(weight=W, bias=b, activation=f)` wraps given arrays.
    """

    weight: Any
    bias: Any
    activation: Callable | None

    def __init__(
        self,
        n_in=None,
        n_out=None,
        activation=None,
        *,
        weight=None,
        bias=True,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if weight is None:
            if n_in is None or n_out is None:
                raise TypeError("Dense needs its sizes, Dense(n_in, n_out), or weight=")
            values = init(_rng(rng), (n_out, n_in))
            weight = asarray(values, xp=xp, device=device, dtype=dtype)
        self.weight = weight
        self.bias = _bias(bias, weight, weight.shape[0])
        self.activation = activation

    def __call__(self, x):
        n_in = self.weight.shape[1]
        if _shape(x)[-1:] != (n_in,):
            self._refuse(x, f"{n_in} features on the last axis")
        y = linear(_match_dtype(x, self.weight), self.weight, self.bias)
        return _activate(self.activation, y)

    def __repr__(self):
        if not _is_layer_field(self.weight):
            return self._fields_repr()
        n_out, n_in = self.weight.shape
        extra = "" if self.activation is None else f", {_describe(self.activation)}"
        extra += "" if self.bias is not None else ", bias=False"
        return f"Dense({n_in} => {n_out}{extra})"


@dataclass(init=False, repr=False)
class Conv(Layer):
    """2-D convolution (cross-correlation, as Flux and PyTorch) of NCHW input, by im2col and a
    matmul: `weight` is `(out_channels, in_channels, kh, kw)`, `stride` and `pad` pairs of ints.

    `Conv(kernel, in_channels, out_channels, activation, stride=1, pad=0)`, Flux's order
    (`pad="same"` keeps the size of an odd kernel at stride 1), or `Conv(weight=W, bias=b, ...)`.
    """

    weight: Any
    bias: Any
    activation: Callable | None
    stride: tuple
    pad: tuple

    def __init__(
        self,
        kernel=None,
        in_channels=None,
        out_channels=None,
        activation=None,
        *,
        stride=1,
        pad=0,
        weight=None,
        bias=True,
        init=glorot_uniform,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if weight is None:
            if kernel is None or in_channels is None or out_channels is None:
                raise TypeError("Conv needs Conv(kernel, in_channels, out_channels) or weight=")
            kernel = _pair("Conv", kernel, "kernel")
            values = init(_rng(rng), (out_channels, in_channels, *kernel))
            weight = asarray(values, xp=xp, device=device, dtype=dtype)
        if len(weight.shape) != 4:
            raise ValueError(f"Conv weight must be (out, in, kh, kw), got shape {weight.shape}")
        self.weight = weight
        self.bias = _bias(bias, weight, weight.shape[0])
        self.activation = activation
        self.stride = _pair("Conv", stride, "stride")
        self.pad = (
            _same_pad(tuple(weight.shape[2:])) if pad == "same" else _pair("Conv", pad, "pad")
        )
        if 0 in self.stride:
            raise ValueError(f"Conv: stride must be positive, got {stride!r}")

    def __call__(self, x):
        o, c, kh, kw = self.weight.shape
        self._expect(len(_shape(x)) == 4 and _shape(x)[1] == c, x, f"(batch, {c}, height, width)")
        n, _, h, w = x.shape
        oh, ow = _spatial(self, (h, w), (kh, kw), self.stride, self.pad)
        cols = im2col(
            _match_dtype(x, self.weight), kernel=(kh, kw), stride=self.stride, pad=self.pad
        )
        y = linear(cols, reshape(self.weight, (o, c * kh * kw)), self.bias)
        y = permute_dims(reshape(y, (n, oh, ow, o)), (0, 3, 1, 2))
        return _activate(self.activation, y)

    def __repr__(self):
        if not _is_layer_field(self.weight) or not isinstance(self.stride[0], int):
            return self._fields_repr()
        o, c, kh, kw = self.weight.shape
        extra = "" if self.activation is None else f", {_describe(self.activation)}"
        extra += "" if self.stride == (1, 1) else f", stride={self.stride}"
        extra += "" if self.pad == (0, 0) else f", pad={self.pad}"
        extra += "" if self.bias is not None else ", bias=False"
        return f"Conv(({kh}, {kw}), {c} => {o}{extra})"


def _same_pad(kernel):
    if any(k % 2 == 0 for k in kernel):
        raise ValueError(f'pad="same" needs an odd kernel, got {kernel}')
    return tuple(k // 2 for k in kernel)


def _spatial(layer, size, kernel, stride, pad):
    """The output height and width, or a clear error when the input is too small."""
    out = tuple(_output_size(n, k, s, p) for n, k, s, p in zip(size, kernel, stride, pad))
    if min(out) < 1:
        raise ValueError(
            f"{layer!r}: an input of height and width {size} is smaller than the window "
            f"{kernel} (padding {pad})"
        )
    return out


@dataclass(init=False, repr=False)
class _Pool(Layer):
    window: tuple
    stride: tuple
    pad: tuple

    def __init__(self, window=2, *, stride=None, pad=0):
        self.window = _pair(type(self).__name__, window, "window")
        self.stride = (
            self.window if stride is None else _pair(type(self).__name__, stride, "stride")
        )
        self.pad = _pair(type(self).__name__, pad, "pad")
        if 0 in self.window or 0 in self.stride:
            raise ValueError(f"{type(self).__name__}: window and stride must be positive")
        if any(p >= k for p, k in zip(self.pad, self.window)):
            raise ValueError(f"{type(self).__name__}: padding must be smaller than the window")

    def _windows(self, x, fill):
        """`(rows, shape)`: one row per window, and the NCHW shape of the output."""
        self._expect(len(_shape(x)) == 4, x, "(batch, channels, height, width)")
        n, c, h, w = x.shape
        oh, ow = _spatial(self, (h, w), self.window, self.stride, self.pad)
        images = reshape(x, (n * c, 1, h, w))
        rows = im2col(images, kernel=self.window, stride=self.stride, pad=self.pad, fill=fill)
        return rows, (n, c, oh, ow)

    def __repr__(self):
        if not all(isinstance(v, int) for v in self.window):
            return self._fields_repr()
        extra = "" if self.stride == self.window else f", stride={self.stride}"
        extra += "" if self.pad == (0, 0) else f", pad={self.pad}"
        return f"{type(self).__name__}({self.window}{extra})"


class MaxPool(_Pool):
    """The maximum of each window of NCHW input (`stride` defaults to the window; padding is
    ignored, as -inf). Ties send the gradient to the first maximum."""

    def __call__(self, x):
        rows, shape = self._windows(x, -math.inf)
        return reshape(_max(rows, axis=-1), shape)


class MeanPool(_Pool):
    """The mean of each window of NCHW input (`stride` defaults to the window; padding counts as
    zeros, as in Flux)."""

    def __call__(self, x):
        rows, shape = self._windows(x, 0.0)
        return reshape(mean(rows, axis=-1), shape)


@dataclass(repr=False)
class Flatten(Layer):
    """Every axis but the first (the batch) made one: `(n, c, h, w)` to `(n, c * h * w)`."""

    def __call__(self, x):
        self._expect(len(_shape(x)) >= 1, x, "a batch axis")
        return flatten(x)

    def __repr__(self):
        return "Flatten()"


@dataclass(init=False, repr=False)
class Dropout(Layer):
    """Zero each element with probability `p` and scale the rest by `1 / (1 - p)`, in training.

    The mask is drawn from the explicit generator `rng` (a NumPy Generator, or one of the data's
    library with a `.random(shape)` method, e.g. CuPy's). `active=None` (automatic) drops out
    when the input is tracked, that is inside `gradient`/`withgradient`, and is the identity on
    plain arrays (evaluation); `trainmode`/`testmode` (or `active=True/False`) force it, which
    dropout on the raw input of a model needs.
    """

    p: float
    rng: Any
    active: bool | None

    def __init__(self, p=0.5, *, rng=None, active=None):
        if not 0 <= p <= 1:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p, self.rng, self.active = p, _rng(rng), active

    def __call__(self, x):
        active = isinstance(x, TrackedArray) if self.active is None else self.active
        if not active or self.p == 0:
            return x
        plain = data(x)
        xp = namespace_of(plain)
        if self.p == 1:
            return multiply(x, xp.zeros_like(plain))
        u = self.rng.random(tuple(plain.shape))
        if namespace_of(u) is not xp:
            u = xp.asarray(u, device=device_of(plain))
        keep = xp.astype(u >= self.p, plain.dtype)
        return multiply(x, keep * (1.0 / (1.0 - self.p)))

    def __repr__(self):
        if not isinstance(self.p, (int, float)):
            return self._fields_repr()
        extra = "" if self.active is None else f", active={self.active}"
        return f"Dropout({self.p}{extra})"


@dataclass(init=False, repr=False)
class Embedding(Layer):
    """A lookup table: integer indices of any shape to vectors, `weight[indices]`, of shape
    `indices.shape + (dim,)`; one-hot inputs (`(..., vocab)`, floating or boolean) give
    `onehot @ weight`. `weight` is `(vocab, dim)`, drawn from the standard normal by default."""

    weight: Any

    def __init__(
        self,
        vocab=None,
        dim=None,
        *,
        weight=None,
        init=randn,
        rng=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if weight is None:
            if vocab is None or dim is None:
                raise TypeError("Embedding needs Embedding(vocab, dim) or weight=")
            weight = asarray(init(_rng(rng), (vocab, dim)), xp=xp, device=device, dtype=dtype)
        self.weight = weight

    def __call__(self, indices):
        vocab, dim = self.weight.shape
        plain = data(indices)
        xp = namespace_of(data(self.weight))
        if not is_array(plain) or not namespace_of(plain).isdtype(plain.dtype, "integral"):
            self._expect(_shape(indices)[-1:] == (vocab,), indices, "integer indices or one-hot")
            return matmul(_match_dtype(indices, self.weight), self.weight)
        if namespace_of(plain) is not xp:
            plain = xp.asarray(to_numpy(plain), device=device_of(data(self.weight)))
        if bool(xp.any((plain < 0) | (plain >= vocab))):
            raise ValueError(
                f"{self!r}: indices must lie in [0, {vocab - 1}], got indices from "
                f"{int(xp.min(plain))} to {int(xp.max(plain))}"
            )
        rows = take(self.weight, xp.reshape(plain, (-1,)), axis=0)
        return reshape(rows, tuple(plain.shape) + (dim,))

    def __repr__(self):
        if not _is_layer_field(self.weight):
            return self._fields_repr()
        vocab, dim = self.weight.shape
        return f"Embedding({vocab} => {dim})"


@dataclass(init=False, repr=False)
class LayerNorm(Layer):
    """Normalise the last `len(size)` axes to zero mean and unit variance, then scale and shift
    (`affine=True`, the default: `scale` ones and `bias` zeros, of shape `size`)."""

    scale: Any
    bias: Any
    activation: Callable | None
    eps: float
    size: tuple

    def __init__(
        self,
        size=None,
        activation=None,
        *,
        affine=True,
        eps=1e-5,
        scale=None,
        bias=None,
        dtype="float32",
        device=None,
        xp=None,
    ):
        if scale is not None:
            size = tuple(scale.shape)
        if size is None:
            raise TypeError("LayerNorm needs its size (an int or a tuple) or scale=")
        size = (size,) if isinstance(size, int) else tuple(size)
        if affine and scale is None:
            scale = asarray(np.ones(size), xp=xp, device=device, dtype=dtype)
            bias = asarray(np.zeros(size), xp=xp, device=device, dtype=dtype)
        self.scale, self.bias, self.activation, self.eps, self.size = (
            scale,
            bias,
            activation,
            eps,
            size,
        )

    def __call__(self, x):
        k = len(self.size)
        self._expect(_shape(x)[len(_shape(x)) - k :] == self.size, x, f"trailing axes {self.size}")
        axes = tuple(range(len(_shape(x)) - k, len(_shape(x))))
        centred = subtract(x, mean(x, axis=axes, keepdims=True))
        variance = mean(square(centred), axis=axes, keepdims=True)
        y = divide(centred, sqrt(add(variance, self.eps)))
        if self.scale is not None:
            y = add(multiply(y, self.scale), self.bias)
        return _activate(self.activation, y)

    def __repr__(self):
        if not all(isinstance(v, int) for v in self.size):
            return self._fields_repr()
        size = self.size[0] if len(self.size) == 1 else self.size
        extra = "" if self.activation is None else f", {_describe(self.activation)}"
        extra += "" if self.scale is not None else ", affine=False"
        return f"LayerNorm({size}{extra})"


@dataclass(init=False, repr=False)
class Chain(Layer):
    """Layers (or functions) applied in turn: `Chain(Dense(2, 3, relu), Dense(3, 1))(x)`."""

    layers: tuple

    def __init__(self, *layers, **fields):
        self.layers = tuple(fields.pop("layers", layers))
        if fields:
            raise TypeError(f"Chain got unexpected keyword arguments {sorted(fields)}")

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i):
        return Chain(*self.layers[i]) if isinstance(i, slice) else self.layers[i]

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __repr__(self):
        inner = (repr(x) if isinstance(x, Layer) else _describe(x) for x in self.layers)
        return f"Chain({', '.join(inner)})"


def _set_dropout(model, active):
    def set_active(path, x):
        if not isinstance(x, Dropout):
            return x
        out = copy.copy(x)
        out.active = active
        return out

    return tree_map_with_path(set_active, model, is_leaf=lambda x: isinstance(x, Dropout))


def trainmode(model, active=True):
    """A copy of `model` whose Dropout layers are active (Flux's `trainmode!`)."""
    return _set_dropout(model, active)


def testmode(model):
    """A copy of `model` whose Dropout layers are the identity (Flux's `testmode!`)."""
    return _set_dropout(model, False)
