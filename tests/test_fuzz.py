"""Differential testing against PyTorch autograd, with random programs.

Hypothesis draws programs: compositions of one to five tracker_gpu operations (elementwise
functions on safe domains, arithmetic with random broadcasting, reductions over random axes with
and without keepdims, reshapes and transposes, slices and integer index arrays with repeats,
matmul and einsum, softmax and logsumexp, where and maximum, concat and stack, indexed updates
`tg.at(x)[key].set/add/...` with repeated positions), over float64 inputs and
constants. Each program runs through tracker_gpu and, operation for operation, through PyTorch
autograd on the same data: the output, the gradients of a weighted sum of it, and for a subset
the Hessian-vector products (`tg.hvp` against torch's double backward) must agree to tight
tolerances. PyTorch computes slices and index arrays with `index_select`, a path independent of
ours; `tg.at` is checked against `index_put` and `scatter_reduce` at the positions of x[key].
Programs that come near a kink, a tie or an overflow (where the two are both right but
may differ) are rejected rather than compared.

On NumPy, a third of the programs (those whose seed is a multiple of 3) run tracker_gpu's side
with the fused path on (`on_host`: the host build of the CUDA kernels), so the fused kernels are
checked against PyTorch too; Hessian-vector products take nested passes, which never fuse.

CI runs a bounded, derandomized number of examples; set TRACKER_GPU_FUZZ_EXAMPLES=2000 to run
that many per test. A failure prints the shrunk `Program`; paste it into a regression test at the
end of this file.

The programs and their operations, in tracker_gpu and in PyTorch, are in `fuzz_operations.py`;
the Hypothesis strategy that draws them is in `fuzz_programs.py`.
"""

import contextlib
import dataclasses
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tracker_gpu as tg
from tracker_gpu.cuda import host, on_host, recording

pytest.importorskip("torch", reason="differential testing needs PyTorch (pip install torch)")

from fuzz_operations import (
    ALONG,
    AT,
    BINARY,
    REDUCTIONS,
    UNARY,
    Ints,
    Mask,
    Program,
    Step,
    _guard,
    _numpy,
    apply_tg,
    evaluate,
    run_torch,
)
from fuzz_programs import programs
from helpers import require_array_attribute

pytestmark = [
    # Dask's integer-array indexing makes its integer offsets' metadata from the indexed
    # array's (complex in some programs): a cast warning of Dask's own, meaningless here.
    pytest.mark.filterwarnings(
        "ignore:Casting complex values to real:numpy.exceptions.ComplexWarning:dask"
    ),
    # A program may read its constant inputs only: its loss is a plain array, as meant.
    pytest.mark.filterwarnings("ignore:the loss of .* is a plain:UserWarning"),
]

EXAMPLES = int(os.environ.get("TRACKER_GPU_FUZZ_EXAMPLES", "0"))
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
RTOL, ATOL = 1e-9, 1e-11  # ATOL is relative to the largest expected magnitude


@pytest.fixture(autouse=True)
def _fuzzed_backend(backend):
    if backend.name.startswith("strict"):
        pytest.skip(
            "programs index with slices next to integer arrays, which array-api-strict refuses; "
            "the fuzzer runs on numpy and torch"
        )


def _eager_only(backend):
    """Random programs by the hundred: on Dask, each a few lazy graphs computed element by
    element, which takes minutes; the operations themselves are checked once each below."""
    if backend.name == "dask":
        pytest.skip("the Hypothesis fuzzers run on the eager backends (numpy, torch)")


# --- comparing a program's run in tracker_gpu with PyTorch's
def assert_close(backend, actual, expected, what):
    """`actual` (of the backend) equals torch's `expected`; None stands for zeros."""
    if actual is not None:
        actual = backend.to_numpy(tg.data(actual))
    if expected is not None:
        expected = _numpy(expected)
    if actual is None or expected is None:
        like = expected if actual is None else actual
        if like is None:
            return
        actual, expected = (
            (np.zeros_like(like), like) if actual is None else (like, np.zeros_like(like))
        )
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL * scale, err_msg=what)


def assert_same(backend, tracked, plain, what):
    """The value computed on tracked arrays is the value of the same program on plain arrays,
    bit for bit (nan where it is nan)."""
    a, b = (backend.to_numpy(tg.data(v)) for v in (tracked, plain))
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert np.array_equal(a, b, equal_nan=True), f"{what}: {a} != {b}"


def _negative_steps(program):
    keys = [step.params["key"] for step in program.steps if "key" in step.params]
    parts = [p for key in keys for p in (key if type(key) is tuple else (key,))]
    return any(isinstance(p, slice) and (p.step or 1) < 0 for p in parts)


def _supported(backend, program):
    # PyTorch tensors refuse slices with negative steps (a known gap of array-api-compat).
    _guard(backend.name != "torch" or not _negative_steps(program))


def fused_share(backend, program):
    """`on_host()` for a third of the programs on NumPy (the fused path through the host build
    of the kernels), else nothing."""
    if backend.xp is np and program.seed % 3 == 0 and host.available():
        return on_host()
    return contextlib.nullcontext()


def check_program(backend, program):
    _supported(backend, program)
    out_t, loss_t, grads_t, _ = run_torch(program)
    with fused_share(backend, program):
        check_tracker_side(backend, program, out_t, loss_t, grads_t)


def check_tracker_side(backend, program, out_t, loss_t, grads_t):
    arrays = [backend.asarray(a) for a in program.arrays()]
    apply = apply_tg(backend.asarray)
    w = backend.asarray(program.weights(tuple(out_t.shape)))
    plain_out = evaluate(program, arrays, apply)
    assert_close(backend, plain_out, out_t, "output of the untracked path")
    variable = [i for i, (_, const) in enumerate(program.inputs) if not const]

    def loss(*xs):
        inputs = list(arrays)
        for i, x in zip(variable, xs):
            inputs[i] = x
        out = evaluate(program, inputs, apply)
        loss = tg.sum(out * w)
        return (tg.real(loss) if program.dtype == "complex128" else loss), out

    inputs = [arrays[i] for i in variable]
    results = [("", tg.withgradient(loss, *inputs))]
    if program.seed % 4 == 3:  # a share (and every program of EACH_OPERATION) replayed too
        others = dataclasses.replace(program, seed=program.seed + 1009).arrays()
        results += _compiled(loss, inputs, [backend.asarray(others[i]) for i in variable])
    for how, ((val, out), grads) in results:
        assert_close(backend, out, out_t, "output" + how)
        assert_same(backend, out, plain_out, "output, tracked and untracked" + how)
        assert_close(backend, val, loss_t, "loss" + how)
        for i, g, gt in zip(variable, grads, grads_t):
            if g is not None:
                assert tuple(g.shape) == tuple(arrays[i].shape) and g.dtype == arrays[i].dtype
            assert_close(backend, g, gt, f"gradient of input {i}" + how)


def _compiled(loss, inputs, others):
    """The replay of `loss` by tg.compile on `inputs`, recorded on `others` (other values of
    the same shapes: a value frozen at the recording, or two values that one recording mixed
    up, shows), or nothing where the recording refuses the program (a boolean mask, say: a
    shape that depends on the data)."""
    step = tg.compile(loss)
    try:
        step(*others)
    except tg.RecordingError:
        return []
    replayed = step(*inputs)
    assert step.cache_info().hits == 1
    return [(", recorded on other values and replayed by tg.compile", replayed)]


def check_hvp(backend, program):
    _supported(backend, program)
    const = [c for _, c in program.inputs]
    if const[0]:
        program = Program(
            [(program.inputs[0][0], False)] + program.inputs[1:], program.steps, program.seed
        )
    direction = np.random.default_rng(program.seed + 2).standard_normal(program.inputs[0][0])
    out_t, _, grads_t, hv_t = run_torch(program, hvp_direction=direction)
    arrays = [backend.asarray(a) for a in program.arrays()]
    apply = apply_tg(backend.asarray)
    w = backend.asarray(program.weights(tuple(out_t.shape)))

    def f(x):
        return tg.sum(evaluate(program, [x] + arrays[1:], apply) * w)

    (g,) = tg.gradient(f, arrays[0], nest=True)
    assert g is None or tg.istracked(g)
    assert_close(backend, g, grads_t[0], "nested gradient of input 0")
    hv = tg.hvp(f, arrays[0], backend.asarray(direction))
    assert_close(backend, hv, hv_t, "Hessian-vector product")


@settings(max_examples=EXAMPLES or 100, **SETTINGS)
@given(program=programs())
def test_values_and_gradients_agree_with_torch(backend, program):
    _eager_only(backend)
    check_program(backend, program)


@settings(max_examples=EXAMPLES or 50, **SETTINGS)
@given(program=programs(max_steps=4))
def test_hessian_vector_products_agree_with_torch(backend, program):
    _eager_only(backend)
    check_hvp(backend, program)


def _single(op, params=None, shapes=((2, 3),), dtype="float64"):
    """A program applying `op` once to inputs of `shapes`."""
    steps = [Step("input", (), {"index": i}) for i in range(len(shapes))]
    steps.append(Step(op, tuple(range(len(shapes))), params or {}))
    return Program([(shape, False) for shape in shapes], steps, seed=3, dtype=dtype)


AT_SHAPES = ((2, 3), (3, 2))  # x, and v for x[[1, 0, 1], 1:]: row 1 named twice
ALONG_KW = {
    "sort": {"descending": True},
    "roll": {"shift": 1},
    "take": {"indices": Ints([1, 1, 0])},
}
EACH_OPERATION = {
    **{op: _single(op) for op in UNARY},
    **{op: _single(op, {"swap": False}, ((2, 3), (3,))) for op in BINARY},
    **{f"{op}-scalar": _single(op, {"scalar": 0.75, "swap": True}) for op in ("pow", "-", "/")},
    **{f"{op}-axis": _single(op, {"axis": 0, "keepdims": False}) for op in REDUCTIONS},
    **{f"{op}-all": _single(op, {"axis": None, "keepdims": True}) for op in REDUCTIONS},
    **{op: _single(op, {"axis": 0, "kw": ALONG_KW.get(op, {})}) for op in ALONG},
    "where": _single("where", {"mask": Mask([[True, False, True]])}, ((2, 3), (2, 1))),
    **{
        f"select-{how}": _single("select", {"how": how}, ((2, 3), (3,)))
        for how in ("each", "flags")
    },
    "getitem": _single("getitem", {"key": (slice(None, None, -1), Ints([2, 0, 2]))}),
    "getitem-mask": _single("getitem", {"key": Mask([[True, False, True], [False, True, True]])}),
    "getitem-basic": _single("getitem", {"key": (None, 1, slice(0, 3, 2))}),
    "matmul": _single("matmul", {}, ((2, 3), (3, 4))),
    "concat": _single("concat", {"axis": 1}, ((2, 3), (2, 1))),
    "stack": _single("stack", {"axis": -1}, ((2, 3), (2, 3))),
    "reshape": _single("reshape", {"shape": (3, -1)}),
    "permute_dims": _single("permute_dims", {"axes": (1, 0)}),
    "mT": _single("mT"),
    "expand_dims": _single("expand_dims", {"axis": 1}),
    "squeeze": _single("squeeze", {"axis": 1}, ((2, 1, 3),)),
    "broadcast_to": _single("broadcast_to", {"shape": (4, 2, 3)}),
    "moveaxis": _single("moveaxis", {"source": 0, "destination": -1}),
    "einsum-matmul": _single("einsum", {"subscripts": "ij,jk->ik"}, ((2, 3), (3, 4))),
    "einsum-batch": _single("einsum", {"subscripts": "bij,bjk->bik"}, ((2, 2, 3), (2, 3, 2))),
    "einsum-trace": _single("einsum", {"subscripts": "ii->"}, ((3, 3),)),
    "einsum-outer": _single("einsum", {"subscripts": "i,j->ij"}, ((2,), (3,))),
    "einsum-sum": _single("einsum", {"subscripts": "ij->j"}),
    **{
        f"at-{how}": _single(
            "at", {"key": (Ints([1, 0, 1]), slice(1, None)), "how": how}, AT_SHAPES
        )
        for how in AT
    },
    "at-mask": _single(
        "at",
        {"key": Mask([[True, False, True], [False, True, True]]), "how": "max"},
        ((2, 3), (1,)),
    ),
}


@pytest.mark.parametrize("name", sorted(EACH_OPERATION))
def test_each_operation_agrees_with_torch(backend, name):
    """Every operation the fuzzer knows, once, on a matrix: a quick first line of defence."""
    program = EACH_OPERATION[name]
    if name == "mT":  # the plain run of the program takes the attribute of a plain array
        require_array_attribute(backend, backend.asarray([[1.0]]), "mT")
    if backend.name == "torch" and _negative_steps(program):
        pytest.skip("PyTorch tensors refuse slices with negative steps")
    check_program(backend, program)
    check_hvp(backend, program)


# The operations PyTorch and the Array API standard define for complex numbers, on complex
# data: once each (PyTorch's gradient of a real loss of z = a + ib is dL/da + i dL/db, ours too).
REAL_ONLY = set(
    "sigmoid relu clip maximum minimum hypot logaddexp atan2 max min var std logsumexp softmax "
    "logsoftmax sort matmul select".split()
)
# min and max compare; PyTorch's scatter_reduce (the reference of "multiply") has no complex
# gradient
AT_REAL_ONLY = {"at-min", "at-max", "at-mask", "at-multiply"}
EACH_COMPLEX_OPERATION = {
    name: Program(program.inputs, program.steps, program.seed, dtype="complex128")
    for name, program in EACH_OPERATION.items()
    if program.steps[-1].op not in REAL_ONLY and name not in AT_REAL_ONLY
}


@pytest.mark.parametrize("name", sorted(EACH_COMPLEX_OPERATION))
def test_each_operation_agrees_with_torch_on_complex_data(backend, name):
    program = EACH_COMPLEX_OPERATION[name]
    if name == "mT":
        require_array_attribute(backend, backend.asarray([[1.0]]), "mT")
    if backend.name == "torch" and _negative_steps(program):
        pytest.skip("PyTorch tensors refuse slices with negative steps")
    check_program(backend, program)


def test_a_share_of_the_programs_takes_the_fused_path(backend):
    if backend.xp is not np or not host.available():
        pytest.skip("the fused path takes NumPy arrays through the host build of the kernels")
    program = EACH_OPERATION["tanh"]
    assert program.seed % 3 == 0
    with recording() as log:
        check_program(backend, program)
    assert ("launch", "tanh_bwd_acc") in log


def test_a_share_of_the_programs_is_replayed_by_tg_compile(backend, monkeypatch):
    program = EACH_OPERATION["tanh"]
    assert program.seed % 4 == 3
    replays = []
    monkeypatch.setattr(sys.modules[__name__], "_compiled", _counted(_compiled, replays))
    check_program(backend, program)
    assert len(replays) == 1 and replays[0]


def _counted(fn, calls):
    def counted(*args):
        calls.append(fn(*args))
        return calls[-1]

    return counted


# --- shrunk failures, kept as regression tests
def test_hvp_of_a_loss_that_reads_only_a_constant(backend):
    """Shrunk: `tg.hvp` multiplied a `None` gradient by `v` when the loss did not depend on x."""
    program = Program(
        inputs=[((1,), False), ((1,), True)],
        steps=[
            Step("input", (), {"index": 0}),
            Step("input", (), {"index": 1}),
            Step("matmul", (1, 0)),
            Step("abs", (1,)),
        ],
        seed=0,
    )
    check_program(backend, program)
    check_hvp(backend, program)
    x = backend.asarray([1.0, 2.0])
    assert tg.hvp(lambda x: tg.sum(x * 2.0), x, x) is None  # a zero Hessian, as gradient's None


def test_a_value_used_twice_through_broadcasting_and_repeated_indices(backend):
    """The paths the fuzzer exercises most, pinned: a diamond, broadcasting both ways, and an
    integer index with repeats feeding a reduction over two axes."""
    program = Program(
        inputs=[((3, 1), False), ((1, 4), False)],
        steps=[
            Step("input", (), {"index": 0}),
            Step("input", (), {"index": 1}),
            Step("*", (0, 1), {"swap": False}),
            Step("getitem", (2,), {"key": (Ints([2, 0, 2, 2]), slice(1, None, None))}),
            Step("*", (3, 3), {"swap": False}),
            Step("logsumexp", (4,), {"axis": (0, -1), "keepdims": True}),
        ],
        seed=5,
    )
    check_program(backend, program)
    check_hvp(backend, program)
