"""C code for traced broadcast expressions (`tg.broadcast`): one forward and one backward kernel.

The body is generated once per traced expression: every sub-expression becomes one local (so
shared ones are computed once), and the backward body computes every partial derivative together.
On CuPy the bodies run as elementwise kernels (CuPy broadcasts the arguments); the same bodies
are compiled by NVRTC and built for the host in the tests.
"""

import sys

from ..backend import is_cupy
from ..broadcast import _topological
from .launch import _note, active

__all__ = ["body", "forward", "backward", "kernel_source", "host_source"]

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
    "sign": "T(({0} > T(0)) - ({0} < T(0)))",
    "maximum": "({0} > {1} ? {0} : {1})",
    "minimum": "({0} < {1} ? {0} : {1})",
    "where": "({0} ? {1} : {2})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
}
_BOOLEAN = {"gt", "ge", "lt", "le"}


def body(outputs):
    """C statements computing each `(target, expression)` of `outputs` from `x0..x{n-1}`."""
    lines, local = [], {}
    for expr in _topological_all([e for _, e in outputs]):
        if expr.op == "arg":
            local[id(expr)] = f"x{expr.value}"
        elif expr.op == "const":
            local[id(expr)] = f"T({expr.value!r})"
        else:
            name = f"t{len(lines)}"
            ctype = "bool" if expr.op in _BOOLEAN else "T"
            code = C[expr.op].format(*(local[id(a)] for a in expr.args))
            lines.append(f"{ctype} {name} = {code};")
            local[id(expr)] = name
    lines += [f"{target} = {local[id(expr)]};" for target, expr in outputs]
    return "\n".join(lines)


def _topological_all(roots):
    order, seen = [], set()
    for root in roots:
        for node in _topological(root):
            if id(node) not in seen:
                seen.add(id(node))
                order.append(node)
    return order


def _bodies(compiled):
    if not hasattr(compiled, "_c"):
        n = len(compiled.partials)
        forward = body([("y", compiled.out)])
        partials = [(f"gx{i}", e) for i, e in enumerate(compiled.partials)]
        declared = " ".join(f"T dgx{i};" for i in range(n))
        backward = declared + "\n" + body(partials).replace("gx", "dgx")
        backward += "\n" + "\n".join(f"gx{i} = g * dgx{i};" for i in range(n))
        compiled._c = (forward, backward)
    return compiled._c


def kernel_source(compiled, ctype):
    """Both bodies as stand-alone CUDA kernels over contiguous same-shaped arrays (for NVRTC)."""
    forward, backward = _bodies(compiled)
    n = len(compiled.partials)
    inputs = ", ".join(f"const T* in{i}" for i in range(n))
    grads = ", ".join(f"T* out_gx{i}" for i in range(n))
    loads = " ".join(f"const T x{i} = in{i}[i];" for i in range(n))
    stores = " ".join(f"out_gx{i}[i] = gx{i};" for i in range(n))
    decls = " ".join(f"T gx{i};" for i in range(n))
    loop = (
        "for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; "
        "i += (long long)blockDim.x * gridDim.x)"
    )
    return f"""typedef {ctype} T;
extern "C" __global__ void broadcast_fwd({inputs}, T* out, long long n) {{
    {loop} {{ {loads} T y; {forward} out[i] = y; }}
}}
extern "C" __global__ void broadcast_bwd({inputs}, const T* gin, {grads}, long long n) {{
    {loop} {{ {loads} const T g = gin[i]; {decls} {backward} {stores} }}
}}
"""


def host_source(compiled, ctype):
    """The same kernels for the host build (after `host.SHIM`), with `host_broadcast_fwd` and
    `host_broadcast_bwd` running them over a whole grid, one thread after another."""
    n = len(compiled.partials)
    inputs = [f"const T* in{i}" for i in range(n)]
    forward = inputs + ["T* out"]
    backward = inputs + ["const T* gin"] + [f"T* out_gx{i}" for i in range(n)]
    wrappers = "".join(_host_wrapper(name, params) for name, params in
                       (("broadcast_fwd", forward), ("broadcast_bwd", backward)))  # fmt: skip
    return kernel_source(compiled, ctype).replace('extern "C" __global__ ', "") + wrappers


def _host_wrapper(name, params):
    names = ", ".join(p.rsplit(" ", 1)[1] for p in params)
    return f"""
extern "C" void host_{name}({", ".join(params)}, long long n) {{
    blockDim.x = 64; gridDim.x = (unsigned int)((n + 63) / 64);
    for (unsigned int b = 0; b < gridDim.x; ++b)
        for (unsigned int t = 0; t < blockDim.x; ++t) {{
            blockIdx.x = b; threadIdx.x = t;
            {name}({names}, n);
        }}
}}
"""


# --- on CuPy: one elementwise kernel each way
_kernels = {}


def _cupy_arrays(args):
    arrays = [a for a in args if not isinstance(a, (int, float))]
    return arrays and all(is_cupy(a) for a in arrays) and active(*arrays)


def _elementwise(compiled, which, n, extra_in, outputs):
    cupy = sys.modules["cupy"]
    key = (id(compiled), which)
    if key not in _kernels:
        forward, backward = _bodies(compiled)
        inputs = ", ".join([f"T x{i}" for i in range(n)] + extra_in)
        _kernels[key] = cupy.ElementwiseKernel(
            inputs,
            ", ".join(outputs),
            forward if which == "fwd" else backward,
            f"broadcast_{which}",
        )
    return _kernels[key]


def forward(compiled, args):
    """The traced expression in one CuPy kernel, or None off CuPy."""
    if not _cupy_arrays(args):
        return None
    _note(("launch", "broadcast_fwd"))
    return _elementwise(compiled, "fwd", len(args), [], ["T y"])(*args)


def backward(compiled, node, args, g):
    """Every argument's gradient from one CuPy kernel (then summed over broadcast axes)."""
    values = [a.data if hasattr(a, "_rule") else a for a in args]
    if not _cupy_arrays(values + [g]):
        return None
    n = len(values)
    outputs = [f"T gx{i}" for i in range(n)]
    _note(("launch", "broadcast_bwd"))
    grads = _elementwise(compiled, "bwd", n, ["T g"], outputs)(*values, g)
    grads = grads if isinstance(grads, tuple) else (grads,)
    from ..rules.shape import unbroadcast

    return [
        unbroadcast(ga, tuple(a.shape), compiled.name) if hasattr(a, "_rule") else None
        for a, ga in zip(args, grads)
    ]
