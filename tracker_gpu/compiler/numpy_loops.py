"""NumPy's own inner loops, called from the generated host loops: a fused `exp`, `sin`, `tanh`
computes with the very function NumPy's ufunc calls, so that a region holding them is eager's
bit for bit (NumPy's float32 functions are its own vector code, and so are most of its float64
ones on AVX-512: on 20,000 float64 values, its `exp`, `expm1`, `log1p`, `sinh`, `cosh`, `tanh`
give another result than the C library's for 4% to 27% of them; `sin` and `cos` agree).

A ufunc keeps, for each of its signatures, the address of its inner loop and of the data the
loop takes (`PyUFuncObject.functions` and `.data` in NumPy's C API, the loop chosen for the
CPU when NumPy loads). They are read here through ctypes, once per process, where the struct's
fields agree with what NumPy says of the ufunc (its name, its number of loops, each loop's
types), and a loop is taken only if, called on a probe of the whole domain, it gives NumPy's
own results bit for bit. A loop computes each element from that element alone, wherever it
lies in the array (`tests/test_numpy_loops.py`), so a generated loop calls it on blocks of
`BLOCK` elements: the region's arithmetic before the function is one vectorised loop over the
block, storing its operand; the function's loop makes its values; the arithmetic after reads
them (`staged`). Where a loop cannot be had (another NumPy, another layout) the function is
not fused with `fuse="exact"`, and is the C library's with `fuse=True`, as before.

>>> import numpy as np
>>> from tracker_gpu.compiler import numpy_loops
>>> numpy_loops.available("sin", np.float64) in (True, False)  # False: another NumPy's layout
True
>>> numpy_loops.available("sigmoid", np.float32)  # not one of NumPy's functions
False
"""

import ctypes
import functools

import numpy as np

__all__ = ["BLOCK", "FUNCTIONS", "available", "calls", "pointers", "prelude", "read_directly",
           "staged", "table"]  # fmt: skip

FUNCTIONS = frozenset("exp expm1 log log1p sin cos tan sinh cosh tanh".split())
DTYPES = frozenset({"float32", "float64"})
BLOCK = 256  # elements: the buffers of a block stay in the first-level cache


class _UFunc(ctypes.Structure):
    """The head of NumPy's `PyUFuncObject` (numpy/ufuncobject.h), up to its types."""

    _fields_ = [
        ("refcount", ctypes.c_ssize_t),
        ("type", ctypes.c_void_p),
        ("nin", ctypes.c_int),
        ("nout", ctypes.c_int),
        ("nargs", ctypes.c_int),
        ("identity", ctypes.c_int),
        ("functions", ctypes.POINTER(ctypes.c_void_p)),
        ("data", ctypes.POINTER(ctypes.c_void_p)),
        ("ntypes", ctypes.c_int),
        ("reserved1", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("types", ctypes.POINTER(ctypes.c_char)),
    ]


_LOOP = ctypes.CFUNCTYPE(
    None,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_ssize_t),
    ctypes.POINTER(ctypes.c_ssize_t),
    ctypes.c_void_p,
)


def available(op, dtype):
    """Whether a fused `op` of `dtype` can call NumPy's own loop."""
    if op not in FUNCTIONS:
        return False
    name = str(np.dtype(dtype))
    return name in DTYPES and _loop(op, name) is not None


@functools.cache
def _loop(op, dtype):
    """`(function, data)`: the addresses of the ufunc's loop for `dtype -> dtype`, or None."""
    ufunc, code = getattr(np, op, None), np.dtype(dtype)
    if type(ufunc) is not np.ufunc or (ufunc.nin, ufunc.nout) != (1, 1):
        return None  # not NumPy's own object: its memory is read as a ufunc's only below
    found = _UFunc.from_address(id(ufunc))
    if (found.nin, found.nout, found.ntypes) != (1, 1, ufunc.ntypes):
        return None  # another layout: its pointers are not followed
    try:
        if found.name.decode() != op:
            return None
    except (AttributeError, UnicodeDecodeError):
        return None
    signature = f"{code.char}->{code.char}"
    for k in range(found.ntypes):
        numbers = (found.types[2 * k][0], found.types[2 * k + 1][0])
        if numbers == (code.num, code.num) and ufunc.types[k] == signature:
            pair = (found.functions[k], found.data[k])
            return pair if pair[0] and _agrees(ufunc, pair, code) else None
    return None


def _probe(dtype):
    """Values over the whole domain: zeros of both signs, subnormals, huge, inf, nan."""
    info = np.finfo(dtype)
    special = [0.0, -0.0, 1.0, -1.0, 0.5, np.pi, info.tiny, -info.tiny, info.smallest_subnormal,
               info.max, -info.max, np.inf, -np.inf, np.nan, 88.7, 709.8, -745.2, 1e-8]  # fmt: skip
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(4093) * 10.0 ** rng.uniform(-40, 40, 4093)
    with np.errstate(all="ignore"):
        return np.concatenate([np.array(special, dtype), spread.astype(dtype)])


def _agrees(ufunc, pair, dtype):
    """Whether the loop at `pair` computes what `ufunc` computes on the probe, bit for bit."""
    x = _probe(dtype)
    y = np.empty_like(x)
    args = (ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data)
    steps = (ctypes.c_ssize_t * 2)(x.itemsize, x.itemsize)
    with np.errstate(all="ignore"):
        _LOOP(pair[0])(args, (ctypes.c_ssize_t * 1)(x.size), steps, pair[1])
        expected = ufunc(x)
    bits = np.dtype(f"u{x.itemsize}")
    return bool(np.array_equal(y.view(bits), expected.view(bits)))


def table(regions):
    """`{(op, dtype name): index}`: the loops the regions' functions call, in order of use."""
    found = {}
    for region in regions:
        for op, dtype, _ in region.ops:
            if available(op, dtype):
                found.setdefault((op, str(dtype)), len(found))
    return found


def calls(region, table):
    """`{j: index in table}` of the region's ops that call a loop of `table`."""
    return {j: table[op, str(dtype)] for j, (op, dtype, _) in enumerate(region.ops)
            if (op, str(dtype)) in table}  # fmt: skip


def read_directly(region):
    """The inputs of `region` that a NumPy loop reads as they are (an operand of a function)."""
    return {what for op, dtype, operands in region.ops if available(op, dtype)
            for kind, what in operands if kind == "in"}  # fmt: skip


def pointers(used):
    """The addresses `tg_set_numpy_loops` takes: each `(op, dtype)` of `used`, its loop then its
    data."""
    flat = [address for op, dtype in used for address in _loop(op, dtype)]
    return (ctypes.c_void_p * max(len(flat), 1))(*flat)


def prelude(count):
    """The C++ of a table of `count` loops, set once the library is loaded, and the call of one
    on `n` contiguous elements."""
    return f"""typedef __INTPTR_TYPE__ tg_intp;  /* npy_intp */
typedef void (*tg_ufunc_loop)(char**, const tg_intp*, const tg_intp*, void*);
static void* tg_numpy_loops[{2 * count}];
extern "C" void tg_set_numpy_loops(void** p) {{
    for (int k = 0; k < {2 * count}; ++k) tg_numpy_loops[k] = p[k];
}}
static inline void tg_numpy_loop(int k, void* x, void* y, tg_intp n, tg_intp size) {{
    char* args[2] = {{(char*)x, (char*)y}};
    const tg_intp dims[1] = {{n}};
    const tg_intp steps[2] = {{size, size}};
    ((tg_ufunc_loop)tg_numpy_loops[2 * k])(args, dims, steps, tg_numpy_loops[2 * k + 1]);
}}
#define TG_BLOCK {BLOCK}
"""


def staged(ops, calls, hoisted, types, lines, loads, stores, span):
    """The innermost loop of a region whose ops `calls` (`{j: table index}`) are NumPy's loops,
    over blocks of `TG_BLOCK` elements, one loop over the block per stage (a call ends one):
    `ops` the region's `(op, dtype, operands)`, `hoisted` the ops computed before the loops,
    `types[j]` each value's C type, `lines[j]` the statement computing `t<j>` (for a call: its
    operand), `loads[k]` the statement reading input `k` at element `i` (None: read before the
    loops), `stores` `{j: statements writing t<j> out}`, `span` the loop's first and last index.
    Returns `(declarations, lines)`: a value read in a later stage than its own goes through a
    buffer `v<j>` of the block (a call's operand through `u<j>`, its result `v<j>`)."""
    stage, count = {}, 0
    for j in range(len(ops)):
        stage[j] = count
        count += j in calls
    live = [j for j in range(len(ops)) if j not in hoisted]
    ready = {j: stage[j] + (j in calls) for j in live}  # the stage where t<j> is a value

    def read(s, members):
        wanted = {w for j in members for kind, w in ops[j][2] if kind == "op"}
        wanted |= {j for j in stores if ready.get(j, 0) == s}
        return {j for j in wanted if j in ready and (j in calls or stage[j] < s)}

    stages = [[j for j in live if stage[j] == s] for s in range(count + 1)]
    imports = [read(s, members) for s, members in enumerate(stages)]
    buffered = set(calls).union(*imports)
    declared = [f"alignas(64) {types[j]} v{j}[TG_BLOCK];" for j in sorted(buffered)]
    declared += [f"alignas(64) {types[j]} u{j}[TG_BLOCK];" for j in sorted(calls)]
    first, last = span
    out = [
        f"for (long long b0 = {first}; b0 < {last}; b0 += TG_BLOCK) {{",
        f"    const long long b1 = b0 + TG_BLOCK < {last} ? b0 + TG_BLOCK : {last};",
    ]
    for s, members in enumerate(stages):
        inputs = sorted({w for j in members for kind, w in ops[j][2] if kind == "in"})
        body = [loads[k] for k in inputs if loads[k]]
        body += [f"const {types[j]} t{j} = v{j}[i - b0];" for j in sorted(imports[s])]
        body += [lines[j] for j in members]
        body += [f"{'u' if j in calls else 'v'}{j}[i - b0] = t{j};"
                 for j in members if j in buffered]  # fmt: skip
        body += [line for j in stores if ready.get(j, 0) == s for line in stores[j]]
        out.append("    for (long long i = b0; i < b1; ++i) {")
        out += [f"        {line}" for line in body]
        out.append("    }")
        out += [f"    tg_numpy_loop({calls[j]}, u{j}, v{j}, b1 - b0, sizeof({types[j]}));"
                for j in members if j in calls]  # fmt: skip
    out.append("}")
    return declared, out
