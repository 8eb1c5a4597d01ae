"""Fused pullback kernels on a GPU against the generic CuPy path and PyTorch CUDA eager; without a
GPU, the launch plan, measured on the host build of the kernels.

    python benchmarks/kernels.py [--size 16777216] [--dtype float32] [--repeats 50] [--json PATH]

On a GPU (CuPy and CUDA), for each workload of WORKLOADS (x of --size elements: a vector, or
rows of 4096 for the bias, of 256 for softmax and cross-entropy), in one run, on the same inputs:
- forward: the loss computed from tracked parameters (the graph recorded);
- backward: `tg.back(loss, once=False)` on that graph (the seed, each node's pullback, the
  leaves' gradients; the gradients are reset between repeats, outside the timed window);
each through the fused path, the generic CuPy path (`generic_only()`) and PyTorch CUDA eager
written the same way (its `loss.backward(retain_graph=True)`). The gradients are compared, fused
against generic and PyTorch against fused; if they differ, the exit status is 1.
Times are device times: CUDA events around the call, issued while a spin kernel keeps the
device busy, so the device's work is timed and Python's overhead is not (median of --repeats
after a warm-up). The host time of each call is reported beside them ("host us"), and a time is
starred where the device may have waited for the host (the call waited for the device, or
issuing it outlasted the spin): there the device time includes host time.

"of copy" is the backward's bandwidth, the bytes our fused pullbacks must read and write (the
"traffic" column: arrays of x's size) over its time, as a fraction of a device-to-device copy
of x measured in this run (2 * x.nbytes over the copy's time). For a function applied
elementwise to x, the pullback reads one array of x's size and writes one (the gradient): a
copy's traffic, so the figure is copy time / backward time. It shows speed only: not memory
(each backward's peak extra memory, in x's size, is reported beside it), not host overhead.

Launches: ours recorded with `tracker_gpu.cuda.recording()` (the fused path's kernels); the
generic CuPy path's and PyTorch's counted by PyTorch's profiler (every kernel, copy and fill
the device ran during the call, CuPy's included) where PyTorch with CUDA is installed, else
"n/a". Targets, printed as met or missed (a benchmark, not a test): each fused backward at least
85% of the copy's bandwidth and at least 2x faster than the generic CuPy path.

Without a GPU it says so and prints the plan: each workload run once on small NumPy arrays
through the host build of the kernels (`on_host()`), its fused launches and buffers recorded.
"""

import argparse
import json
import sys
from dataclasses import dataclass

import numpy as np
from gpu_measure import cupy_gpu
from kernel_runs import OF_COPY_TARGET, SPEEDUP_TARGET, measure

import tracker_gpu as tg
from tracker_gpu.cuda import on_host, recording

BIAS, CLASSES = 4096, 256  # the bias's length; the rows' length for softmax and cross-entropy


@dataclass(frozen=True)
class Workload:
    """A loss of x (and more parameters): ours with tracker_gpu, theirs with PyTorch.

    `inputs(rng, size, dtype)` gives `(parameters, constants)` as NumPy arrays, x first;
    `traffic` is the arrays of x's size our fused backward reads and writes; `plan_size` the
    elements of x for the plan without a GPU."""

    name: str
    formula: str
    ours: object
    theirs: object
    traffic: int = 2
    inputs: object = None
    plan_size: int = 4096


def flat(rng, size, dtype):
    return [rng.standard_normal(size).astype(dtype)], []


def bias_inputs(rng, size, dtype):
    rows = max(1, size // BIAS)
    x, w = (rng.standard_normal((rows, BIAS)).astype(dtype) for _ in range(2))
    return [x, rng.standard_normal(BIAS).astype(dtype)], [w]


def softmax_inputs(rng, size, dtype):
    rows = max(1, size // CLASSES)
    return [rng.standard_normal((rows, CLASSES)).astype(dtype)], [
        rng.standard_normal((rows, CLASSES)).astype(dtype)
    ]


def crossentropy_inputs(rng, size, dtype):
    rows = max(1, size // CLASSES)
    logits = rng.standard_normal((rows, CLASSES)).astype(dtype)
    return [logits], [rng.integers(0, CLASSES, rows)]


def _unary(name):
    f = getattr(tg, name)
    return Workload(
        name,
        f"sum({name}(x))",
        lambda x: tg.sum(f(x)),
        lambda t, x: getattr(t, name)(x).sum(),
        inputs=flat,
    )


WORKLOADS = (
    Workload(
        "sumabs2",
        "sumabs2(x); PyTorch dot(x, x)",
        tg.sumabs2,
        lambda t, x: t.dot(x, x),
        inputs=flat,
    ),
    Workload(
        "sum(x**2)", "sum(x**2)", lambda x: tg.sum(x**2), lambda t, x: (x**2).sum(), inputs=flat
    ),
    *(_unary(name) for name in ("tanh", "sigmoid", "relu", "exp", "sin")),
    Workload(
        "bias",
        f"sum((x + b) * w), b ({BIAS},)",
        lambda x, b, w: tg.sum((x + b) * w),
        lambda t, x, b, w: ((x + b) * w).sum(),
        traffic=3,  # g * w: read w, write; b's gradient: read that (x's is that, no copy)
        inputs=bias_inputs,
        plan_size=256 * BIAS,  # its reduction split across blocks, as at the default size
    ),
    Workload(
        "softmax",
        f"sum(softmax(x) * w), rows of {CLASSES}",
        lambda x, w: tg.sum(tg.softmax(x) * w),
        lambda t, x, w: (t.softmax(x, -1) * w).sum(),
        traffic=5,  # g * w: read w, write; softmax: read y and that, write
        inputs=softmax_inputs,
        plan_size=64 * CLASSES,
    ),
    Workload(
        "crossentropy",
        f"logitcrossentropy(x, labels), rows of {CLASSES}",
        lambda x, labels: tg.nn.logitcrossentropy(x, labels),
        lambda t, x, labels: t.nn.functional.cross_entropy(x, labels),
        traffic=3,  # read the logits and the one-hot targets, write
        inputs=crossentropy_inputs,
        plan_size=64 * CLASSES,
    ),
)


# --- without a GPU: the plan, measured on the host build
def plan(args, why):
    print(f"No GPU available ({why}): the plan, not timings.")
    print("Each workload ran once on small NumPy arrays through the host build of the kernels")
    print("(tracker_gpu.cuda.on_host()); its fused launches and buffers were recorded.\n")
    rows = [plan_row(w, np.dtype(args.dtype)) for w in WORKLOADS]
    print(
        f"{'workload':13s} {'x shape':>12s} {'fwd':>4s} {'bwd':>4s} {'buffers':>8s} "
        f"{'traffic':>8s}  backward kernels"
    )
    for r in rows:
        print(
            f"{r['name']:13s} {'x'.join(map(str, r['shape'])):>12s} "
            f"{len(r['forward_launches']):4d} {len(r['backward_launches']):4d} "
            f"{r['backward_buffers']:7.2f}x {r['traffic']:7d}x  "
            f"{', '.join(r['backward_launches'])}"
        )
    print("\nfwd, bwd: launches of the fused path in the forward and the backward pass (the")
    print("forward's other work is plain array operations); buffers: the memory the backward's")
    print("fused pullbacks allocate, and traffic: the arrays they must read and write, both in")
    print("x's size. The generic path's and PyTorch's launches are counted on a GPU, by")
    print("PyTorch's profiler. On a GPU this script times each backward against a device copy")
    print(
        f"(targets: {OF_COPY_TARGET:.0%} of copy bandwidth, {SPEEDUP_TARGET:g}x the generic "
        "CuPy path):"
    )
    print(f"  python benchmarks/kernels.py --size {args.size} --dtype {args.dtype}")
    return {"gpu": False, "why": why, "plan": rows}


def plan_row(w, dtype):
    rng = np.random.default_rng(0)
    params, constants = w.inputs(rng, w.plan_size, dtype)
    with on_host():
        tracked = [tg.param(a) for a in params]
        with recording() as forward:
            loss = w.ours(*tracked, *constants)
        with recording() as backward:
            tg.back(loss, once=False)
    nbytes = params[0].nbytes
    return {
        "name": w.name,
        "formula": w.formula,
        "shape": list(params[0].shape),
        "forward_launches": _launches(forward),
        "backward_launches": _launches(backward),
        "backward_buffers": sum(n for kind, n in backward if kind == "alloc") / nbytes,
        "traffic": w.traffic,
    }


def _launches(log):
    return [name for kind, name in log if kind == "launch"]


# --- the command line
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 24, help="elements of x")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", metavar="PATH", help="write every figure here")
    args = parser.parse_args(argv)
    cp, why = cupy_gpu()
    if cp is None:
        document = plan(args, why)
    else:
        document = measure(cp, WORKLOADS, args)
    document.update(size=args.size, dtype=args.dtype, repeats=args.repeats)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
        print(f"figures written to {args.json}")
    return 1 if wrong_answers(document) else 0


def wrong_answers(document):
    """The workloads whose gradients differ between paths (a failure, unlike a missed target)."""
    wrong = [
        r["name"]
        for r in document.get("workloads", [])
        if not r["fused_agrees_with_generic"] or r.get("torch_agrees") is False
    ]
    if wrong:
        print(f"FAIL: the gradients differ between paths for {', '.join(wrong)}")
    return wrong


if __name__ == "__main__":
    sys.exit(main())
