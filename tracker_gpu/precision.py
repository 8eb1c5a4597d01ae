"""Mixed precision: a `Policy` of dtypes (parameters, compute, outputs, as jmp's), reductions
that accumulate in float32, and `LossScale`, static or dynamic loss scaling.

A model keeps float32 parameters (the master weights); `policy(model, x)` runs it with its
parameters and `x` cast to the compute dtype (float16 or bfloat16) by tracked casts, whose
pullbacks give the gradients back in float32 to the optimiser, and casts the output to the
output dtype. Sums, means, softmax and the cross-entropies of half-precision values lose digits
or overflow: `sum`, `mean`, `logsumexp`, `softmax`, `logsoftmax`, `logitcrossentropy` and
`crossentropy` here compute in float32 (`IN_FLOAT32`, as PyTorch's autocast lists them). A
float16 loss's small gradients underflow: `LossScale` multiplies the loss before the backward
pass, divides the gradients after it, and skips a step whose gradients are not finite.

>>> import numpy as np, tracker_gpu as tg
>>> from tracker_gpu import nn, optim
>>> policy = tg.Policy(compute_dtype="float16")
>>> model = nn.Dense(3, 2, rng=np.random.default_rng(0))
>>> x = np.ones((4, 3), np.float32)
>>> loss = lambda m: tg.precision.mean(policy(m, x) ** 2)
>>> scaler, state = tg.LossScale(2.0**10), optim.setup(optim.Adam(), model)
>>> value, (grads,) = tg.withgradient(lambda m: scaler.scaled(loss(m)), model)
>>> grads.weight.dtype, str(policy(model, x).dtype)
(dtype('float32'), 'float32')
>>> scaler, state, model = scaler.update(state, model, grads)
>>> model.weight.dtype, scaler.good, scaler.skipped
(dtype('float32'), 1, 0)
"""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from . import namespace as _ns
from . import nn, optim
from .backend import HALF, device_of, half_dtype, is_array, is_floating_dtype, namespace_of
from .namespace import logsumexp as _logsumexp
from .namespace import mean as _mean
from .namespace import sum as _sum
from .optim.state import Leaf
from .optim.tree import structure, tree_map_with_path
from .primitive import no_gradient
from .pytree import tree_leaves, tree_map
from .rules.elementwise import astype
from .tracked import data

__all__ = ["Policy", "LossScale", "IN_FLOAT32", "in_float32", "all_finite"]

DTYPES = (*HALF, "float32", "float64")


def _dtype(name, xp):
    return half_dtype(name, xp) if name in HALF else getattr(xp, name)


def _name(dtype):
    """The name of a dtype of any library: "bfloat16", "float32", ..."""
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).rpartition(".")[2]


def _cast(tree, name, trained_only=False):
    """Every floating array of `tree` (tracked or not) cast to the dtype `name` of its own
    library by a tracked cast; other leaves and arrays already of that dtype as they are. With
    `trained_only`, the fields a layer declares not trainable (a BatchNorm's running statistics,
    which it updates in place) are left as they are."""

    def cast(x):
        plain = data(x)
        if not is_array(plain) or not is_floating_dtype(plain.dtype):
            return x
        if _name(plain.dtype) == name:
            return x
        return astype(x, _dtype(name, namespace_of(plain)))

    if not trained_only:
        return tree_map(cast, tree)
    return _map_trained(cast, tree)


def _map_trained(fn, tree):
    """`fn` over the leaves of `tree`, except those of fields declared not trainable."""
    found = structure(type(tree))
    if found is None or is_array(data(tree)):
        return fn(tree)
    keys = list(found.keys(tree))
    kept = found.trainable
    values = [
        v if kept is not None and k not in kept else _map_trained(fn, v)
        for k, v in zip(keys, found.values(tree, keys))
    ]
    return found.rebuild(tree, keys, values)


@dataclass(frozen=True)
class Policy:
    """The dtypes of mixed precision, as jmp's `Policy`: `param_dtype` the parameters are kept
    in (the master weights, float32), `compute_dtype` the model runs in (float16 or bfloat16),
    `output_dtype` its outputs are given in (the parameters' dtype unless given).
    `policy(model, *args)` is `model(*args)` with the model's parameters and the floating
    arguments cast to the compute dtype (tracked: the gradients come back to the parameters in
    their own dtype) and the output cast to the output dtype. A library without the compute
    dtype (bfloat16 on array-api-strict or Dask) raises at the first cast, naming it.

    >>> import numpy as np, tracker_gpu as tg
    >>> half = tg.Policy(compute_dtype="bfloat16", output_dtype="bfloat16")
    >>> str(half.cast_to_compute(np.ones(2, np.float32)).dtype)
    'bfloat16'
    """

    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    output_dtype: str = None

    def __post_init__(self):
        if self.output_dtype is None:
            object.__setattr__(self, "output_dtype", self.param_dtype)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value not in DTYPES:
                raise ValueError(
                    f"Policy: {field.name} must be one of {', '.join(DTYPES)} (a name), got "
                    f"{value!r}"
                )

    def cast_to_param(self, tree):
        """`tree` with its floating arrays in the parameters' dtype (a model made in another)."""
        return _cast(tree, self.param_dtype)

    def cast_to_compute(self, tree):
        """`tree` with its floating arrays in the compute dtype, but for the fields a layer
        declares not trainable (a BatchNorm's running statistics stay in their dtype, updated
        in place from float32 statistics)."""
        return _cast(tree, self.compute_dtype, trained_only=True)

    def cast_to_output(self, tree):
        return _cast(tree, self.output_dtype)

    def __call__(self, model, *args, **kwargs):
        compute = self.cast_to_compute
        return self.cast_to_output(compute(model)(*compute(args), **kwargs))


# --- reductions in float32
def in_float32(f, cast_back=False):
    """`f` with its float16 and bfloat16 array arguments cast to float32 (tracked casts), as
    PyTorch's autocast runs its float32 list: a sum of float16 values overflows at 65504 and a
    bfloat16 one keeps 8 bits. With `cast_back` the result is cast back to the dtype of the
    first half-precision argument (softmax: a value the model goes on with); without, it stays
    float32 (a loss, a statistic).

    >>> import numpy as np, tracker_gpu as tg
    >>> big = np.full(4, 60000.0, np.float16)
    >>> total = in_float32(tg.sum)(big)  # tg.sum(big) is inf
    >>> str(total.dtype), float(total)
    ('float32', 240000.0)
    """

    def wide(*args, **kwargs):
        found = [data(a).dtype for a in args if is_array(data(a)) and _name(data(a).dtype) in HALF]
        if not found:
            return f(*args, **kwargs)
        out = f(*_cast(args, "float32"), **kwargs)
        return _cast(out, _name(found[0])) if cast_back else out

    wide.__name__ = wide.__qualname__ = getattr(f, "__name__", "f")
    wide.__doc__ = f"`{wide.__name__}` computed in float32 for half-precision inputs."
    return wide


# name: (function, cast back to the input's dtype)
IN_FLOAT32 = {
    "sum": (_sum, False),
    "mean": (_mean, False),
    "logsumexp": (_logsumexp, False),
    "softmax": (nn.softmax, True),
    "logsoftmax": (nn.logsoftmax, True),
    "logitcrossentropy": (nn.logitcrossentropy, False),
    "crossentropy": (nn.crossentropy, False),
}
sum = in_float32(*IN_FLOAT32["sum"])  # noqa: A001
mean = in_float32(*IN_FLOAT32["mean"])
logsumexp = in_float32(*IN_FLOAT32["logsumexp"])
softmax = in_float32(*IN_FLOAT32["softmax"])
logsoftmax = in_float32(*IN_FLOAT32["logsoftmax"])
logitcrossentropy = in_float32(*IN_FLOAT32["logitcrossentropy"])
crossentropy = in_float32(*IN_FLOAT32["crossentropy"])


# --- loss scaling
def all_finite(tree):
    """Whether every floating array of `tree` is finite, read back as a Python bool: one
    reduction per array, combined on the device, and one read."""
    found = finite_flag(tree)
    return True if found is None else bool(found)


def finite_flag(tree):
    """Whether every floating array of `tree` is finite, as a 0-d boolean array where the
    arrays are (None without one): nothing read back, traced under `tg.compile`. On the fused
    path (CuPy), one launch per eight arrays and one reduction (`cuda/steps.py`)."""
    arrays = [x for x in tree_leaves(tree)
              if is_array(data(x)) and is_floating_dtype(data(x).dtype)]  # fmt: skip
    return _all_finite(*arrays) if arrays else None


def _all_finite_forward(xp, *arrays):
    found = None
    for x in arrays:
        ok = xp.all(xp.isfinite(x))
        found = ok if found is None else xp.logical_and(found, ok)
    return found


_all_finite = no_gradient("all_finite", _all_finite_forward)


@dataclass(frozen=True)
class LossScale:
    """Loss scaling: `scaled(loss)` is `loss * scale`, so that the small gradients of a
    float16 loss do not underflow; `update(state, model, grads)` divides the gradients by the
    scale and steps the optimiser, or skips the step where a gradient is not finite. With
    `dynamic=True` (PyTorch's GradScaler, jmp's DynamicLossScale) the scale halves (by
    `factor`, not below `minimum`) at each skipped step and doubles after `period` finite steps
    in a row; with `dynamic=False` it stays. A new `LossScale` is returned, never changed in
    place: `good` counts the finite steps since the scale last changed, `skipped` the steps
    skipped. `state_dict()` is JSON data for a checkpoint's `info`, `LossScale(**saved)` the
    scaler again.

    >>> import numpy as np
    >>> scaler = LossScale(8.0, period=2)
    >>> scaler.after(True).after(True).scale, scaler.after(False).scale
    (16.0, 4.0)
    """

    scale: float = 2.0**15
    dynamic: bool = True
    period: int = 2000
    factor: float = 2.0
    minimum: float = 1.0
    good: int = 0
    skipped: int = 0

    def __post_init__(self):
        if self.on_device:  # made by `placed` from numbers checked here
            for name in ("scale", "good", "skipped"):
                value = data(getattr(self, name))
                if not is_array(value) or tuple(value.shape) != ():
                    raise TypeError(
                        f"LossScale: {name} must be a Python number (placed on a device by "
                        f"LossScale.placed, a 0-d array), got {value!r}"
                    )
            return
        for name in ("scale", "factor", "minimum"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"LossScale: {name} must be a Python number, got {value!r}")
            if not (0 < value < math.inf):
                raise ValueError(f"LossScale: {name} must be > 0 and finite, got {value!r}")
        if self.factor <= 1:
            raise ValueError(f"LossScale: factor must be > 1, got {self.factor!r}")
        for name in ("period", "good", "skipped"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"LossScale: {name} must be an int >= 0, got {value!r}")
        if self.period == 0:
            raise ValueError("LossScale: period must be at least 1 step")

    @property
    def on_device(self):
        """Whether the scale and the counts are 0-d arrays (`placed` made them so)."""
        return not isinstance(self.scale, (int, float))

    def placed(self, like):
        """This scaler with its scale (float32) and counts (int64) as 0-d arrays of `like`'s
        library and device: `update` then decides on the device whether a step is taken,
        with nothing read back (a step under `tg.compile`, a GPU's)."""
        if self.on_device:
            return self
        like = data(like)
        xp, device = namespace_of(like), device_of(like)
        made = lambda v, dtype: xp.asarray(v, dtype=dtype, device=device)  # noqa: E731
        return dataclasses.replace(
            self,
            scale=made(self.scale, xp.float32),
            good=made(self.good, xp.int64),
            skipped=made(self.skipped, xp.int64),
        )

    def scaled(self, loss):
        """`loss * scale`; a float16 or bfloat16 loss in float32, as PyTorch's scaler makes it
        (a float16 loss of 2 times 2^15 is inf, and the scale 2^16 is float16's inf: the
        backward pass would refuse the loss before the scaler could skip the step)."""
        if self.on_device:
            times = lambda loss: loss * astype(self.scale, data(loss).dtype)  # noqa: E731
        else:
            scale = float(self.scale)
            times = lambda loss: loss * scale  # noqa: E731
        return in_float32(times)(loss)

    def unscaled(self, grads):
        """The gradients divided by the scale, each in its own dtype (None stays None); a half
        one through float32 (the inverse of a scale over 2^24 is 0 in float16)."""
        if self.on_device:
            inverse = 1.0 / self.scale
            times = lambda g: g * astype(inverse, data(g).dtype)  # noqa: E731
        else:
            inverse = 1.0 / float(self.scale)
            times = lambda g: g * inverse  # noqa: E731
        at = in_float32(times, cast_back=True)
        return tree_map(lambda g: at(g) if is_array(data(g)) else g, grads)

    def after(self, finite):
        """The scaler after a step whose gradients were finite (`finite`) or not."""
        if self.on_device:
            return self._after_on_device(finite)
        if not finite:
            scale = max(self.scale / self.factor, self.minimum) if self.dynamic else self.scale
            return dataclasses.replace(self, scale=float(scale), good=0, skipped=self.skipped + 1)
        if self.dynamic and self.good + 1 >= self.period:
            grown = float(self.scale * self.factor)  # not to infinity (as PyTorch's)
            return dataclasses.replace(
                self, scale=grown if grown < math.inf else self.scale, good=0
            )
        return dataclasses.replace(self, good=self.good + 1)

    def _after_on_device(self, finite):
        """`after` with the scale and counts as arrays and `finite` a 0-d boolean array."""
        good = _ns.where(finite, self.good + 1, 0)
        skipped = self.skipped + _ns.where(finite, 0, 1)
        if not self.dynamic:
            return dataclasses.replace(self, good=good, skipped=skipped)
        with np.errstate(over="ignore"):  # a scale grown to inf is not taken (below)
            grown = self.scale * self.factor
        grow = _ns.logical_and(finite, good >= self.period)
        shrunk = _ns.maximum(self.scale / self.factor, float(self.minimum))
        grown = _ns.where(_ns.isfinite(grown), grown, self.scale)  # not to infinity
        scale = _ns.where(finite, _ns.where(grow, grown, self.scale), shrunk)
        return dataclasses.replace(
            self, scale=scale, good=_ns.where(grow, 0, good), skipped=skipped
        )

    def update(self, state, model, grads, before_step=None, **options):
        """`(scaler, state, model)` after one step along the gradients of the scaled loss: the
        optimiser's `update` with the unscaled gradients if they are all finite, else the
        state and model as they were (the step skipped). `before_step`, a function of the
        unscaled gradients, runs before the optimiser (clipping by global norm, as PyTorch's
        `unscale_` then `clip_grad_norm_`); `options` go to `optim.update`.
        On the device (`placed`), the step is computed whatever the gradients and each array
        of the state and the model chosen by the finite flag: no value is read back."""
        grads = self.unscaled(grads)
        along = lambda g: g if before_step is None else before_step(g)  # noqa: E731
        if self.on_device:
            finite, state = finite_flag(grads), _counts_as_arrays(state)
            # a step not taken still runs: along zeros, where a clipping rule that refuses a
            # non-finite norm (`ClipNorm`) would raise instead of the step being skipped
            grads = tree_map(lambda g: _ns.where(finite, g, 0.0) if is_array(data(g)) else g, grads)
            stepped_state, stepped = optim.update(state, model, along(grads), **options)
            chosen = lambda new, old: (  # noqa: E731
                _ns.where(finite, new, old) if is_array(data(new)) else new
            )
            state = tree_map(chosen, stepped_state, state)
            return self.after(finite), state, tree_map(chosen, stepped, model)
        if not all_finite(grads):
            return self.after(False), state, model
        state, model = optim.update(state, model, along(grads), **options)  # clipped if stepped
        return self.after(True), state, model

    def state_dict(self):
        """The scaler as JSON data, for `save_checkpoint(..., loss_scale=scaler.state_dict())`;
        `LossScale(**info["loss_scale"])` makes it again (`placed` puts it back on a device)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.on_device:  # read back here, once per checkpoint
            out.update(scale=float(data(self.scale)), good=int(data(self.good)),
                       skipped=int(data(self.skipped)))  # fmt: skip
        return out


def _counts_as_arrays(state):
    """`state` with each `Leaf`'s Python counts (Adam's `beta**t`) as 0-d arrays, as
    `tg.compile` hands them to a recording: a skipped step then keeps them by choice on the
    device, as it keeps the arrays."""
    return tree_map_with_path(
        lambda _, x: x.__tracker_compile__() if type(x) is Leaf else x,
        state,
        is_leaf=lambda x: type(x) is Leaf,
    )
