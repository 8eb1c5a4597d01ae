"""The programs of tests/test_fuzz.py, and how each runs in tracker_gpu and in PyTorch.

A `Program` is input shapes and a list of `Step`s; `evaluate` runs it with a step function:
`apply_tg(convert)` for tracker_gpu, `apply_torch` for PyTorch, which rejects the program
(Hypothesis's `reject`) where a step meets a kink or a tie. Every operation is written once for
each library in the tables (`UNARY`, `BINARY`, `REDUCTIONS`, `ALONG`, `SHAPE_OPS`, `AT`;
`einsum` takes its subscripts as a parameter). `run_torch`
gives PyTorch's output, gradients and Hessian-vector product, which the tests compare with
tracker_gpu's, and rejects an output that is not finite or over `BIG`. A helper, not a test
module: test_fuzz.py imports it once PyTorch is known to be installed.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from hypothesis import reject

import tracker_gpu as tg

GAP = 1e-6  # how far inputs of a kink or a tie must stay from it
BIG = 1e6  # larger intermediate values are rejected (overflow is not what we compare)


# --- programs
class Ints(tuple):
    """An integer index array (a nested tuple), made an array of the backend when applied."""

    def __repr__(self):
        return f"Ints({list(self)!r})"


class Mask(tuple):
    """A boolean array (a nested tuple), made an array of the backend when applied."""

    def __repr__(self):
        return f"Mask({list(self)!r})"


@dataclass
class Step:
    """`op` applied to the values at positions `args` (an "input" step reads input `index`)."""

    op: str
    args: tuple = ()
    params: dict = field(default_factory=dict)


@dataclass
class Program:
    """Input shapes (`const` inputs are plain arrays, not differentiated), the steps, and the
    seed of the data and of the loss weights; the output is the last step's value. Complex
    programs (`dtype="complex128"`) take complex inputs and weights, and the loss is the real
    part of the weighted sum."""

    inputs: list
    steps: list
    seed: int = 0
    dtype: str = "float64"

    def arrays(self):
        rng = np.random.default_rng(self.seed)
        out = []
        for shape, _const in self.inputs:
            magnitude = rng.uniform(0.3, 2.0, size=shape)
            out.append(np.where(rng.random(shape) < 0.5, -magnitude, magnitude))
        if self.dtype == "complex128":
            imaginary = np.random.default_rng(self.seed + 3)
            out = [a + 1j * imaginary.uniform(-1.0, 1.0, size=a.shape) for a in out]
        return out

    def weights(self, shape):
        rng = np.random.default_rng(self.seed + 1)
        w = rng.uniform(0.5, 1.5, size=shape)
        return w + 1j * rng.uniform(-1.0, 1.0, size=shape) if self.dtype == "complex128" else w


def evaluate(program, inputs, apply):
    values = []
    for step in program.steps:
        if step.op == "input":
            values.append(inputs[step.params["index"]])
        else:
            values.append(apply(step, [values[i] for i in step.args]))
    return values[-1]


# --- the operations, as tracker_gpu and as torch
def _dims(axis, ndim):
    axes = range(ndim) if axis is None else axis if isinstance(axis, tuple) else (axis,)
    return tuple(sorted(a % ndim for a in axes))


def _numpy(t):
    t = t.detach()
    if t._is_zerotensor():  # what torch's double backward may give for a zero Hessian
        return np.zeros(tuple(t.shape))
    return t.resolve_neg().resolve_conj().numpy()


def _distinct_along(x, dims, gap=GAP):
    """No two values closer than `gap` within a slice reduced over `dims` (no ties)."""
    x = _numpy(x)
    if x.ndim == 0:
        return True
    rest = [d for d in range(x.ndim) if d not in dims]
    rows = np.transpose(x, rest + list(dims)).reshape(-1, math.prod(x.shape[d] for d in dims))
    return rows.shape[1] < 2 or bool(np.min(np.diff(np.sort(rows, axis=1), axis=1)) >= gap)


def _away_from_zero(t, gap=GAP):
    return bool(np.all(np.abs(_numpy(t)) >= gap))


UNARY = {
    "sin": lambda m, x: m.sin(x),
    "cos": lambda m, x: m.cos(x),
    "tanh": lambda m, x: m.tanh(x),
    "exp": lambda m, x: m.exp(x),
    "expm1": lambda m, x: m.expm1(x),
    "sigmoid": lambda m, x: m.sigmoid(x),
    "atan": lambda m, x: m.atan(x),
    "asinh": lambda m, x: m.asinh(x),
    "sinh": lambda m, x: m.sinh(x),
    "square": lambda m, x: m.square(x),
    "negative": lambda m, x: m.negative(x),
    "abs": lambda m, x: m.abs(x),
    "relu": lambda m, x: m.relu(x),
    "log": lambda m, x: m.log(x * x + 0.5),
    "log1p": lambda m, x: m.log1p(x * x),
    "sqrt": lambda m, x: m.sqrt(x * x + 0.1),
    "reciprocal": lambda m, x: m.reciprocal(x * x + 0.5),
    "asin": lambda m, x: m.asin(m.tanh(x) * 0.9),
    "acos": lambda m, x: m.acos(m.tanh(x) * 0.9),
    "atanh": lambda m, x: m.atanh(m.tanh(x) * 0.9),
    "acosh": lambda m, x: m.acosh(x * x + 1.5),
    "tan": lambda m, x: m.tan(m.tanh(x)),
    "cube": lambda m, x: x**3,
    "pow_frac": lambda m, x: (x * x + 0.5) ** 1.5,
    "scale": lambda m, x: 2.5 * x,
    "rsub": lambda m, x: 1.0 - x,
    "rdiv": lambda m, x: 1.0 / (x * x + 1.0),
    "clip": lambda m, x: m.clip(x, -0.5, 0.8) if m is tg else m.clamp(x, -0.5, 0.8),
}
UNARY_GUARDS = {
    "abs": _away_from_zero,
    "relu": _away_from_zero,
    "clip": lambda x: _away_from_zero(x + 0.5) and _away_from_zero(x - 0.8),
}

BINARY = {
    "add": lambda m, x, y: m.add(x, y),
    "subtract": lambda m, x, y: m.subtract(x, y),
    "multiply": lambda m, x, y: m.multiply(x, y),
    "divide": lambda m, x, y: m.divide(x, y),
    "+": lambda m, x, y: x + y,
    "-": lambda m, x, y: x - y,
    "*": lambda m, x, y: x * y,
    "/": lambda m, x, y: x / y,
    "pow": lambda m, x, y: m.pow(x * x + 0.5, y),
    "maximum": lambda m, x, y: m.maximum(x, y),
    "minimum": lambda m, x, y: m.minimum(x, y),
    "hypot": lambda m, x, y: m.hypot(x, y),
    "logaddexp": lambda m, x, y: m.logaddexp(x, y),
    "atan2": lambda m, x, y: m.atan2(x, y),
}
BINARY_GUARDS = {
    "divide": lambda x, y: _away_from_zero(y, 0.25),
    "/": lambda x, y: _away_from_zero(y, 0.25),
    "pow": lambda x, y: bool(np.all(np.abs(_numpy(y)) <= 3)),
    "maximum": lambda x, y: _away_from_zero(x - y),
    "minimum": lambda x, y: _away_from_zero(x - y),
    "hypot": lambda x, y: _away_from_zero(x * x + y * y, 1e-4),
    "atan2": lambda x, y: _away_from_zero(x * x + y * y, 1e-4),
}

REDUCTIONS = ("sum", "mean", "prod", "max", "min", "var", "std", "logsumexp")
TORCH_REDUCTIONS = {
    "sum": torch.sum,
    "mean": torch.mean,
    "max": torch.amax,
    "min": torch.amin,
    "logsumexp": torch.logsumexp,
    "var": lambda x, dim, keepdim: torch.var(x, dim=dim, keepdim=keepdim, correction=0),
    "std": lambda x, dim, keepdim: torch.std(x, dim=dim, keepdim=keepdim, correction=0),
}


def _torch_reduce(name, x, axis, keepdims):
    if x.ndim == 0:
        x, axis, keepdims = x.reshape(1), None, False
    dims = _dims(axis, x.ndim)
    if name == "prod":  # torch's prod takes one dim at a time
        for d in reversed(dims):
            x = torch.prod(x, dim=d, keepdim=True)
        return x if keepdims else x.squeeze(dims)
    return TORCH_REDUCTIONS[name](x, dim=dims, keepdim=keepdims)


def _reduction_guard(name, x, axis):
    if x.ndim == 0:
        return True  # std of one number is 0, its gradient 0 (PyTorch's, ours)
    dims = _dims(axis, x.ndim)
    if name in ("max", "min"):
        return _distinct_along(x, dims)
    if name == "std" and all(x.shape[d] == 1 for d in dims):
        return True  # exactly 0 both ways: gradient 0
    if name == "std":
        variance = torch.var(x, dim=dims, correction=0)
        return _away_from_zero(variance, 1e-4)
    return True


def _tg_along(name, x, axis, convert, **kw):
    if name == "roll":
        return tg.roll(x, kw["shift"], axis=axis)
    if name == "take":
        return tg.take(x, convert(np.array(kw["indices"], dtype=np.int64)), axis=axis)
    return getattr(tg, name)(x, axis=axis, **kw)


def _torch_along(name, x, axis, **kw):
    if name == "take":
        index = torch.as_tensor(np.asarray(kw["indices"]) % x.shape[axis])
        return torch.index_select(x, axis, index)
    return {
        "softmax": lambda: torch.softmax(x, dim=axis),
        "logsoftmax": lambda: torch.log_softmax(x, dim=axis),
        "cumulative_sum": lambda: torch.cumsum(x, dim=axis),
        "cumulative_prod": lambda: torch.cumprod(x, dim=axis),
        "flip": lambda: torch.flip(x, dims=(axis,)),
        "sort": lambda: torch.sort(x, dim=axis, descending=kw.get("descending", False)).values,
        "roll": lambda: torch.roll(x, kw.get("shift", 0), dims=axis),
        "diff": lambda: torch.diff(x, dim=axis),
    }[name]()


ALONG = ("softmax", "logsoftmax", "cumulative_sum", "cumulative_prod", "flip", "sort", "roll")
ALONG += ("take", "diff")


def _torch_getitem(x, key):
    """`x[key]` by NumPy's rules, computed with select, index_select and unsqueeze."""
    if isinstance(key, Mask):
        return x[torch.as_tensor(np.array(key, dtype=bool))]
    parts = key if type(key) is tuple else (key,)
    if Ellipsis in parts:
        at = parts.index(Ellipsis)
        used = sum(p is not None for p in parts) - 1
        parts = parts[:at] + (slice(None),) * (x.ndim - used) + parts[at + 1 :]
    axis = 0
    for p in parts:
        if p is None:
            x = x.unsqueeze(axis)
            axis += 1
        elif isinstance(p, int):
            x = x.select(axis, p)
        elif isinstance(p, slice):
            index = torch.as_tensor(list(range(x.shape[axis])[p]), dtype=torch.int64)
            x = torch.index_select(x, axis, index)
            axis += 1
        else:  # an integer array: its shape replaces the axis
            ints = np.asarray(p) % x.shape[axis]
            x = torch.index_select(x, axis, torch.as_tensor(ints.reshape(-1)))
            x = x.unflatten(axis, ints.shape) if ints.ndim != 1 else x
            axis += ints.ndim
    return x


def _tg_key(key, convert):
    if isinstance(key, Mask):
        return convert(np.array(key, dtype=bool))
    if isinstance(key, Ints):
        return convert(np.array(key, dtype=np.int64))
    if isinstance(key, tuple):
        return tuple(_tg_key(k, convert) for k in key)
    return key


# --- indexed updates, tg.at(x)[key].how(v): in PyTorch on the flattened x, at the flat
# positions of x[key] (read off a grid of positions by `_torch_getitem`)
AT = ("set", "add", "subtract", "multiply", "min", "max")
SCATTER_REDUCE = {"multiply": "prod", "min": "amin", "max": "amax"}


def _torch_at(x, v, how, key):
    positions = _torch_getitem(torch.arange(x.numel()).reshape(x.shape), key)
    v = torch.broadcast_to(v, positions.shape).reshape(-1)
    positions, flat = positions.reshape(-1), x.reshape(-1)
    if how in SCATTER_REDUCE:
        if how in ("min", "max"):
            _guard(_no_tie_at(flat, v, positions, how))
        out = flat.scatter_reduce(0, positions, v, reduce=SCATTER_REDUCE[how], include_self=True)
    elif how == "set":  # where a position is named twice, the last value written stays
        last = {p: k for k, p in enumerate(positions.tolist())}
        keep = torch.as_tensor(list(last.values()), dtype=torch.int64)
        out = flat.index_put((positions[keep],), v[keep])
    else:
        out = flat.index_put((positions,), v if how == "add" else -v, accumulate=True)
    return out.reshape(x.shape)


def _no_tie_at(flat, v, positions, how):
    """At each updated position, the winner of x's value and the values written there stands
    `GAP` apart from the others."""
    flat, v = _numpy(flat), _numpy(v)
    candidates = {}
    for p, value in zip(positions.tolist(), v.tolist()):
        candidates.setdefault(p, [float(flat[p])]).append(value)
    pick = max if how == "max" else min
    return all(sum(abs(c - pick(cs)) < GAP for c in cs) == 1 for cs in candidates.values())


def select(xp, a, b, how):
    """A choice made by the data, in `xp` (tracker_gpu or torch): elementwise by the sign of
    `a` ("each"), or by two flags reduced from `a` and `b` ("flags": at a recording they may
    be equal and differ at a replay)."""
    if how == "each":
        return xp.where(a > 0, a, b)
    first = xp.any(a > 0.5)
    both = xp.logical_and(first, xp.all(b < 1.5))
    return xp.where(first, xp.where(both, a, b), b * 0.5)


def apply_tg(convert):
    """How a step runs in tracker_gpu; `convert` makes a NumPy constant an array of the backend."""

    def apply(step, args):
        op, p = step.op, step.params
        if op in UNARY:
            return UNARY[op](tg, args[0])
        if op in BINARY:
            x, y = (args[0], p["scalar"]) if "scalar" in p else args
            return BINARY[op](tg, *((y, x) if p.get("swap") else (x, y)))
        if op in REDUCTIONS:
            return getattr(tg, op)(args[0], axis=p["axis"], keepdims=p["keepdims"])
        if op in ALONG:
            return _tg_along(op, args[0], p["axis"], convert, **p.get("kw", {}))
        if op == "where":
            other = p["scalar"] if "scalar" in p else args[1]
            return tg.where(convert(np.array(p["mask"], dtype=bool)), args[0], other)
        if op == "select":
            return select(tg, *args, p["how"])
        if op == "getitem":
            return args[0][_tg_key(p["key"], convert)]
        if op == "matmul":
            return args[0] @ args[1]
        if op == "einsum":
            return tg.einsum(p["subscripts"], *args)
        if op == "at":
            v = p["scalar"] if "scalar" in p else args[1]
            return getattr(tg.at(args[0])[_tg_key(p["key"], convert)], p["how"])(v)
        if op in ("concat", "stack"):
            return getattr(tg, op)(list(args), axis=p["axis"])
        return SHAPE_OPS[op][0](args[0], p)

    return apply


def apply_torch(step, args):
    """How a step runs in PyTorch; rejects the program where the step meets a kink or a tie."""
    op, p = step.op, step.params
    if op in UNARY:
        _guard(UNARY_GUARDS.get(op, lambda x: True)(args[0]))
        return UNARY[op](torch, args[0])
    if op in BINARY:
        x, y = (args[0], torch.tensor(p["scalar"], dtype=torch.float64)) if "scalar" in p else args
        x, y = (y, x) if p.get("swap") else (x, y)
        _guard(BINARY_GUARDS.get(op, lambda x, y: True)(x, y))
        return BINARY[op](torch, x, y)
    if op in REDUCTIONS:
        _guard(_reduction_guard(op, args[0], p["axis"]))
        return _torch_reduce(op, args[0], p["axis"], p["keepdims"])
    if op in ALONG:
        if op == "sort":
            _guard(_distinct_along(args[0], _dims(p["axis"], args[0].ndim)))
        return _torch_along(op, args[0], p["axis"], **p.get("kw", {}))
    if op == "where":
        other = torch.tensor(p["scalar"], dtype=torch.float64) if "scalar" in p else args[1]
        return torch.where(torch.as_tensor(np.array(p["mask"], dtype=bool)), args[0], other)
    if op == "select":  # no value at a threshold: a tie there
        a, b = args
        _guard(bool((a.abs() > 1e-6).all() and ((a - 0.5).abs() > 1e-6).all()))
        _guard(bool(((b - 1.5).abs() > 1e-6).all()))
        return select(torch, a, b, p["how"])
    if op == "getitem":
        return _torch_getitem(args[0], p["key"])
    if op == "matmul":
        return args[0] @ args[1]
    if op == "einsum":
        return torch.einsum(p["subscripts"], *args)
    if op == "at":
        v = torch.tensor(p["scalar"], dtype=torch.float64) if "scalar" in p else args[1]
        return _torch_at(args[0], v, p["how"], p["key"])
    if op == "concat":
        return torch.cat(list(args), dim=p["axis"])
    if op == "stack":
        return torch.stack(list(args), dim=p["axis"])
    return SHAPE_OPS[op][1](args[0], p)


def _guard(ok):
    if not ok:
        reject()


SHAPE_OPS = {
    "reshape": (lambda x, p: tg.reshape(x, p["shape"]), lambda x, p: x.reshape(p["shape"])),
    "permute_dims": (
        lambda x, p: tg.permute_dims(x, p["axes"]),
        lambda x, p: x.permute(p["axes"]),
    ),
    "mT": (lambda x, p: x.mT, lambda x, p: x.mT),
    "expand_dims": (
        lambda x, p: tg.expand_dims(x, axis=p["axis"]),
        lambda x, p: x.unsqueeze(p["axis"]),
    ),
    "squeeze": (lambda x, p: tg.squeeze(x, axis=p["axis"]), lambda x, p: x.squeeze(p["axis"])),
    "broadcast_to": (
        lambda x, p: tg.broadcast_to(x, p["shape"]),
        lambda x, p: torch.broadcast_to(x, p["shape"]),
    ),
    "moveaxis": (
        lambda x, p: tg.moveaxis(x, p["source"], p["destination"]),
        lambda x, p: torch.movedim(x, p["source"], p["destination"]),
    ),
}


# --- a program's output, gradients and Hessian-vector product in PyTorch
def run_torch(program, hvp_direction=None):
    """`(output, loss, grads, hv)` from PyTorch: `grads` for the inputs that are not constants
    (None where unused), and with `hvp_direction` the Hessian of the loss with respect to input 0
    times it (else None)."""
    arrays = program.arrays()
    inputs = [
        torch.tensor(a, dtype=getattr(torch, program.dtype), requires_grad=not const)
        for a, (_, const) in zip(arrays, program.inputs)
    ]
    out = evaluate(program, inputs, apply_torch)
    if not torch.all(torch.isfinite(out)) or out.numel() and torch.max(torch.abs(out)) > BIG:
        reject()
    w = torch.as_tensor(program.weights(tuple(out.shape)))
    loss = torch.sum(out * w)
    loss = torch.real(loss) if loss.is_complex() else loss
    tracked = [x for x, (_, const) in zip(inputs, program.inputs) if not const]
    create = hvp_direction is not None
    if not loss.requires_grad:  # the output depends on constants only
        return out, loss, [None] * len(tracked), None if not create else torch.zeros_like(inputs[0])
    grads = torch.autograd.grad(loss, tracked, allow_unused=True, create_graph=create)
    if not create:
        return out, loss, grads, None
    g0 = grads[0]
    if g0 is None or not g0.requires_grad:
        return out, loss, grads, torch.zeros_like(inputs[0])
    v = torch.as_tensor(hvp_direction)
    (hv,) = torch.autograd.grad(torch.sum(g0 * v), inputs[0], allow_unused=True)
    return out, loss, grads, torch.zeros_like(inputs[0]) if hv is None else hv
