"""Generated kernels for traced broadcast expressions (`tg.broadcast`): one forward and one
backward kernel per expression.

`family(compiled, scalars, needed)` writes ONE source text, a `Family` like the shipped ones:
it is what CuPy compiles (a module per text and device), what NVRTC compiles in the tests, and
what the host build runs. Generated code is keyed by that text (so by the expression itself),
never by the identity of a Python object. Every sub-expression becomes one local (shared ones are
computed once) and the backward body computes every partial derivative together. The kernels
are written for a storage type S (`kernels/half.cuh`, which every text starts with): float16 and
bfloat16 arguments are loaded into float32, the expression is computed in float32 and each
result is rounded to the storage type once.

Arguments are broadcast by strides: `dims` gives, for each axis of the result (merged where
memory allows), its length and each array argument's stride in elements (0 where that argument
is broadcast), so inputs of any strides are read in place. Python numbers are passed by value.
Arrays of float16, bfloat16, float32 and float64 are promoted as the library promotes them
(`result_type`) before the launch.
"""

import math

import numpy as np

from ..backend import SCALARS
from ..expr import COMPARISONS, SPECIAL, narrow_nodes, topological
from .dispatch import note, takes
from .fused import STORAGE, merge_axes, tracked
from .launch import device_int64, empty, grid_for, launch, library, on_device
from .sources import Family, compute_dtype, header

__all__ = ["C", "body", "family", "forward", "backward"]

C = {
    "add": "({0} + {1})",
    "subtract": "({0} - {1})",
    "multiply": "({0} * {1})",
    "divide": "({0} / {1})",
    "pow": "pow({0}, {1})",
    "negative": "(-{0})",
    "exp": "exp({0})",
    "expm1": "expm1({0})",
    "log": "log({0})",
    "log1p": "log1p({0})",
    "sqrt": "sqrt({0})",
    "square": "({0} * {0})",
    "reciprocal": "(T(1) / {0})",
    "sin": "sin({0})",
    "cos": "cos({0})",
    "tan": "tan({0})",
    "sinh": "sinh({0})",
    "cosh": "cosh({0})",
    "tanh": "tanh({0})",
    "abs": "fabs({0})",
    # Comparisons, maximum and minimum take a float subnormal and a tie of +0 and -0 as the
    # arrays' library does (the NVRTC build CuPy's, the host build NumPy's: kernels/compare.cuh);
    # sign, maximum and minimum keep nan
    "sign": "({0} != {0} ? {0} : T((TG_DAZ({0}) > T(0)) - (TG_DAZ({0}) < T(0))))",
    "maximum": "TG_MAXIMUM({0}, {1})",
    "minimum": "TG_MINIMUM({0}, {1})",
    "where": "({0} ? {1} : {2})",
    "ruled": "{0}",  # a rule's forward (its arguments follow, for its derivatives)
    "gt": "(TG_DAZ({0}) > TG_DAZ({1}))",
    "ge": "(TG_DAZ({0}) >= TG_DAZ({1}))",
    "lt": "(TG_DAZ({0}) < TG_DAZ({1}))",
    "le": "(TG_DAZ({0}) <= TG_DAZ({1}))",
    "eq": "(TG_DAZ({0}) == TG_DAZ({1}))",
    "ne": "(TG_DAZ({0}) != TG_DAZ({1}))",
    "zeros_like": "T(0)",
    "narrow": "{0}",  # a gradient cast to its node's (narrower) type: the operand's cast
}
# NumPy computes `array ** number` (a Python number, a NumPy scalar, a 0-d array) with these
# functions for these exponents (its `fast_scalar_power`), else with `pow`: sqrt(-inf) is nan
# where pow(-inf, 0.5) is inf, sqrt(-0.0) is -0.0 where pow's is +0. On the host alone
# (`TG_FAST_POWERS`, kernels/compare.cuh): CuPy's power is `pow` for every exponent.
POWERS = {
    0.5: "(TG_FAST_POWERS ? sqrt({0}) : pow({0}, {1}))",
    2.0: "(TG_FAST_POWERS ? ({0} * {0}) : pow({0}, {1}))",
    -1.0: "(TG_FAST_POWERS ? (T(1) / {0}) : pow({0}, {1}))",
}
POW_OF_NUMBER = (
    "(!TG_FAST_POWERS ? pow({0}, {1}) : {1} == T(0.5) ? sqrt({0}) : {1} == T(2) ? ({0} * {0}) "
    ": {1} == T(-1) ? (T(1) / {0}) : pow({0}, {1}))"
)
# tg.special's functions: `tg_<name>` of kernels/special.cuh (CUDA's math library on the device,
# the header's own definitions where CUDA has none and on the host), which a text using one of
# them starts with.
C.update({name: f"tg_{name}({{0}})" for name in SPECIAL})
C.update({name: f"tg_{name}({{0}}, {{1}})" for name in ("polygamma", "xlogy", "xlog1py")})
# inf and nan have no literal in C: they are written by their IEEE 754 bits (double), which
# NVRTC and the host build both read.
_SPECIAL = {math.inf: "0x7ff0000000000000LL", -math.inf: "0xfff0000000000000LL"}
_NAN = "0x7ff8000000000000LL"


def constant(value):
    """A C expression of type T for the float `value`."""
    if math.isnan(value):
        return f"T(__longlong_as_double({_NAN}))"
    if math.isinf(value):
        return f"T(__longlong_as_double({_SPECIAL[value]}))"
    return f"T({value!r})"


# by the storage type's rules (kernels/compare.cuh): NumPy's float16 extrema keep the first
# operand on a tie of +0 and -0, its float32's the second; ml_dtypes' bfloat16 sign keeps -0
_OF_STORAGE = {
    "maximum": "TG_MAXIMUM_OF(S, {0}, {1})",
    "minimum": "TG_MINIMUM_OF(S, {0}, {1})",
    "sign": "TG_ZERO_OF_SIGN(S, {0}, " + C["sign"] + ")",
}


def body(outputs, narrow=frozenset(), numbers=frozenset()):
    """C statements computing each `(target, expression)` of `outputs` from `a0..a{n-1}`, every
    value of type T but those of the nodes `narrow` (ids: `expr.narrow_nodes`), computed in
    float where float32 arguments meet float64 ones, as NumPy computes them. `numbers`: the
    positions of the arguments that are Python numbers (an exponent that is one: `POWERS`)."""
    lines, local = [], {}
    for expr in topological([e for _, e in outputs]):
        if expr.op == "arg":
            local[id(expr)] = f"a{expr.value}"
            if id(expr) in narrow:  # widened to T for the launch (exact), taken back here
                lines.append(f"const float n{expr.value} = static_cast<float>(a{expr.value});")
                local[id(expr)] = f"n{expr.value}"
        elif expr.op == "const":
            local[id(expr)] = constant(expr.value)
        else:
            name = f"t{len(lines)}"
            lines.append(_statement(expr, name, local, narrow, numbers))
            local[id(expr)] = name
    lines += [f"{target} = {local[id(expr)]};" for target, expr in outputs]
    return "\n        ".join(lines)


def _template(expr, numbers):
    if expr.op == "pow":
        exponent = expr.args[1]
        if exponent.op == "const":
            return POWERS.get(exponent.value, C["pow"])
        if exponent.op == "arg" and exponent.value in numbers:
            return POW_OF_NUMBER
    return _OF_STORAGE.get(expr.op, C[expr.op])


def _statement(expr, name, local, narrow, numbers):
    """The statement giving `expr`'s local `name` its value."""
    template = _template(expr, numbers)
    if not narrow:
        ctype = "bool" if expr.op in COMPARISONS else "T"
        return f"const {ctype} {name} = {template.format(*(local[id(a)] for a in expr.args))};"
    computed = "float" if id(expr) in narrow else "T"
    operands = [_operand(a, local, narrow, computed) for a in expr.args]
    if expr.op == "where":
        operands[0] = local[id(expr.args[0])]
    code = template.format(*operands)
    ctype = "bool" if expr.op in COMPARISONS else computed
    if computed == "T":
        return f"const {ctype} {name} = {code};"
    return f"{ctype} {name}; {{ typedef float T; {name} = {code}; }}"


def _operand(a, local, narrow, computed):
    """An operand's local, cast to the type its operation computes in where it is another."""
    name = local[id(a)]
    if a.op in COMPARISONS or a.op == "const" or (id(a) in narrow) == (computed == "float"):
        return name
    return f"static_cast<T>({name})"


# --- the source text
_LOOP = (
    "for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; "
    "i += (long long)blockDim.x * gridDim.x)"
)


def family(compiled, scalars, needed=None):
    """The generated source of `compiled` for arguments that are Python numbers where `scalars`
    is true: the forward alone (`needed` None), or the backward writing the gradients of the
    arguments where `needed` is true."""
    key = (scalars, needed)
    cache = compiled.__dict__.setdefault("_families", {})
    if key not in cache:
        text = (
            _backward_text(compiled, scalars, needed)
            if needed
            else _forward_text(compiled, scalars)
        )
        cache[key] = Family.from_text("broadcast", _headers(compiled, needed) + text)
    return cache[key]


def _headers(compiled, needed):
    """The headers the text needs: kernels/special.cuh where it calls a special function, and
    kernels/half.cuh and kernels/compare.cuh."""
    roots = [compiled.out]
    if needed:
        roots += [p for p, need in zip(compiled.pullbacks, needed) if need]
    special = any(node.op in SPECIAL for node in topological(roots))
    texts = ([header("special")] if special else []) + [header("half"), header("compare")]
    return "".join(text + "\n" for text in texts)


def _inputs(scalars):
    return ", ".join(f"compute_t<S> x{i}" if s else f"const S* x{i}" for i, s in enumerate(scalars))


def _prologue(scalars):
    """Offsets of the array arguments for element i, and every argument's value as a{k}."""
    arrays = [i for i, s in enumerate(scalars) if not s]
    width = 1 + len(arrays)
    sums = "".join(f" o{i} += index * d[{k + 1}];" for k, i in enumerate(arrays))
    offsets = ", ".join(["rest = i"] + [f"o{i} = 0" for i in arrays])
    loads = " ".join(
        f"const T a{i} = x{i};" if s else f"const T a{i} = load(x{i}[o{i}]);"
        for i, s in enumerate(scalars)
    )
    return f"""long long {offsets};
        for (int a = ndim - 1; a >= 0; --a) {{
            const long long* d = dims + {width} * a;
            const long long index = a ? rest % d[0] : rest;
            rest = a ? rest / d[0] : 0;{sums}
        }}
        {loads}"""


def _typing(compiled, roots, scalars):
    """`body`'s `narrow` and `numbers` for these expressions of `compiled`."""
    numbers = frozenset(i for i, s in enumerate(scalars) if s)
    narrow_args = getattr(compiled, "narrow_args", ())
    narrow = narrow_nodes(roots, narrow_args, numbers) if narrow_args else frozenset()
    return narrow, numbers


def _forward_text(compiled, scalars):
    narrow, numbers = _typing(compiled, [compiled.out], scalars)
    return f"""// tg.broadcast forward: {compiled.out!r}
template <typename S>
__global__ void broadcast_fwd({_inputs(scalars)}, const long long* dims, int ndim, S* out,
                              long long n) {{
    typedef compute_t<S> T;
    {_LOOP} {{
        {_prologue(scalars)}
        T y;
        {body([("y", compiled.out)], narrow, numbers)}
        out[i] = store<S>(y);
    }}
}}
"""


def _backward_text(compiled, scalars, needed):
    """Each needed argument's gradient: its pullback (`expr.pullbacks`), which reads the
    output's gradient as the argument after the others."""
    wanted = [i for i, need in enumerate(needed) if need]
    outputs = ", ".join(f"compute_t<S>* gx{i}" for i in wanted)  # summed, then rounded once
    gradients = [(f"gx{i}[i]", compiled.pullbacks[i]) for i in wanted]
    narrow, numbers = _typing(compiled, [p for _, p in gradients], scalars)
    return f"""// tg.broadcast backward: {compiled.out!r}
template <typename S>
__global__ void broadcast_bwd({_inputs(scalars)}, const long long* dims, int ndim, const S* g,
                              long long g_step, {outputs}, long long n) {{
    typedef compute_t<S> T;
    {_LOOP} {{
        {_prologue(scalars)}
        const T a{len(scalars)} = load(g[i * g_step]);
        {body(gradients, narrow, numbers)}
    }}
}}
"""


# --- launching
def _layout(values):
    """`(scalars, arrays, dtype, shape)` for the fused path, or None where it does not apply."""
    scalars = tuple(type(v) in SCALARS for v in values)
    arrays = [v for v, s in zip(values, scalars) if not s]
    if not arrays or not takes(*arrays) or any(str(a.dtype) not in STORAGE for a in arrays):
        return None
    dtype = np.result_type(*(a.dtype for a in arrays))
    if str(dtype) not in STORAGE:  # float16 with bfloat16 (ml_dtypes: float32) and the like
        return None
    shape = np.broadcast_shapes(*(tuple(a.shape) for a in arrays))
    return scalars, arrays, dtype, shape


def _arguments(values, scalars, dtype, shape, like):
    """The kernel's leading arguments (arrays promoted to `dtype`) and its `dims` metadata."""
    promoted = [v if s or v.dtype == dtype else _cast(v, dtype) for v, s in zip(values, scalars)]
    strides = [_strides(v, shape) for v, s in zip(promoted, scalars) if not s]
    axes = [[n] + [st[a] for st in strides] for a, n in enumerate(shape) if n != 1]
    axes = merge_axes(axes)
    dims = [v for axis in axes for v in axis]
    return promoted, device_int64(dims or [0], like), len(axes)


def _strides(array, shape):
    view = library(array).broadcast_to(array, shape)
    return [s // view.itemsize for s in view.strides]


def _cast(array, dtype):
    note(("alloc", array.size * np.dtype(dtype).itemsize))
    with on_device(array):
        return array.astype(dtype)  # a method on NumPy and CuPy arrays alike


def forward(compiled, args):
    """The traced expression in one generated kernel, or None where the fused path does not
    take the arguments."""
    layout = _layout(args)
    if layout is None or compiled.out.op in COMPARISONS:  # a bool result: the generic path
        return None
    scalars, arrays, dtype, shape = layout
    like = arrays[0]
    out = empty(shape, like, dtype)
    n = out.size
    values, dims, ndim = _arguments(args, scalars, dtype, shape, like)
    source = family(compiled, scalars)
    launch("broadcast_fwd", dtype, grid_for(n), *values, dims, ndim, out, n, source=source)
    return out


def backward(compiled, ans, args, values, g):
    """Every tracked argument's gradient from one generated kernel (then summed over its
    broadcast axes by the backend), or None where the fused path does not take the arrays. The
    kernel writes the gradients in the compute type (float32 for float16 and bfloat16), so that
    a half argument's gradient is summed in float32 and rounded once."""
    layout = _layout(values)
    if layout is None or not takes(g) or g.dtype != ans.dtype:
        return None
    scalars, arrays, dtype, shape = layout
    step = _step(g, shape)
    if step is None:
        return None
    needed = tuple(tracked(a) for a in args)
    like = arrays[0]
    operands, dims, ndim = _arguments(values, scalars, dtype, shape, like)
    wide = compute_dtype(str(dtype))
    grads = {i: empty(shape, like, wide) for i, need in enumerate(needed) if need}
    size = int(np.prod(shape))
    source = family(compiled, scalars, needed)
    launch("broadcast_bwd", dtype, grid_for(size), *operands, dims, ndim, g, step,
           *grads.values(), size, source=source)  # fmt: skip
    return [_fit(grads[i], values[i]) if i in grads else None for i in range(len(args))]


def _step(g, shape):
    if tuple(g.shape) != shape:
        return None
    if g.flags.c_contiguous:
        return 1
    return 0 if all(s == 0 for s in g.strides) else None


def _fit(grad, value):
    """`grad` (of the result's shape and dtype) summed over the axes `value` was broadcast along,
    in `value`'s dtype."""
    shape = tuple(value.shape)
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + a for a, n in enumerate(shape) if n == 1 and grad.shape[lead + a] != 1
    )
    xp = library(grad)
    with on_device(grad):
        if axes:
            grad = xp.reshape(xp.sum(grad, axis=axes), shape)
            note(("alloc", grad.nbytes))
        if grad.dtype != value.dtype:
            grad = _cast(grad, value.dtype)
    return grad
