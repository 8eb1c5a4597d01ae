"""Fused pullback kernels: time and achieved bandwidth on a GPU, or the plan without one.

    python benchmarks/kernels.py [--size 16777216] [--dtype float32] [--repeats 50]

With CuPy and a GPU, the gradient through each fused pullback is timed with CUDA events
(warm-up, median), its achieved bandwidth is compared with the device's measured copy bandwidth,
and it is compared with the same gradient through the generic (unfused) CuPy path and through
PyTorch CUDA autograd when available, all in this run. Without a GPU it says so and prints the
plan: launches and bytes moved per element, fused against generic.
"""

import argparse
import statistics
import sys

import numpy as np

import tracker_gpu as tg

# name: (loss of x, launches of the generic pullback, bytes moved per element by the fused one in
#        units of the itemsize: the input it reads and the gradient it writes; the incoming
#        gradient of a summed loss is one scalar)
WORKLOADS = {
    "sumabs2": (lambda x: tg.sumabs2(x), 2, 2),
    "sum(x**2)": (lambda x: tg.sum(x**2), 2, 2),
    "tanh": (lambda x: tg.sum(tg.tanh(x)), 3, 2),
    "sigmoid": (lambda x: tg.sum(tg.sigmoid(x)), 3, 2),
    "relu": (lambda x: tg.sum(tg.relu(x)), 3, 2),
    "exp": (lambda x: tg.sum(tg.exp(x)), 1, 2),
    "sin": (lambda x: tg.sum(tg.sin(x)), 2, 2),
}


def plan(size):
    print("No GPU available (CuPy cannot use one): the plan, not timings.\n")
    print(f"{'pullback':12s} {'fused launches':>15s} {'generic launches':>17s} {'bytes/elem':>11s}")
    for name, (_, generic, moved) in WORKLOADS.items():
        print(f"{name:12s} {1:15d} {generic:17d} {moved:>11d}x")
    print("\nsoftmax/logsoftmax rows: 1 forward and 1 backward launch (generic: 5 and 4);")
    print("logitcrossentropy: 1 forward launch + a mean, 1 backward launch;")
    print("broadcast + - * / **: 1 launch per tracked operand, reducing its broadcast axes inside.")
    print(f"Reproduce on a GPU: python benchmarks/kernels.py --size {size}")


def cuda_time(cp, fn, repeats):
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    fn()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


TORCH = {
    "sumabs2": lambda t, x: (x * x).sum(),
    "sum(x**2)": lambda t, x: (x**2).sum(),
    "tanh": lambda t, x: t.tanh(x).sum(),
    "sigmoid": lambda t, x: t.sigmoid(x).sum(),
    "relu": lambda t, x: t.relu(x).sum(),
    "exp": lambda t, x: t.exp(x).sum(),
    "sin": lambda t, x: t.sin(x).sum(),
}


def measure(cp, size, dtype, repeats):
    from tracker_gpu.cuda import generic_only

    x = cp.random.standard_normal(size).astype(dtype)
    copy_bandwidth = 2 * x.nbytes / cuda_time(cp, lambda: x.copy(), repeats)
    torch = _torch_cuda()
    print(f"device copy bandwidth: {copy_bandwidth / 1e9:.0f} GB/s ({dtype}, {size} elements)\n")
    header = (
        f"{'pullback':12s} {'fused ms':>9s} {'GB/s':>7s} {'of copy':>8s} {'generic/fused':>14s}"
    )
    print(header + (f" {'torch/fused':>12s}" if torch else ""))
    for name, (f, _, moved) in WORKLOADS.items():
        fused = cuda_time(cp, lambda f=f: tg.gradient(f, x), repeats)
        with generic_only():
            generic = cuda_time(cp, lambda f=f: tg.gradient(f, x), repeats)
        bandwidth = moved * x.nbytes / fused
        row = (
            f"{name:12s} {fused * 1e3:9.3f} {bandwidth / 1e9:7.0f} "
            f"{bandwidth / copy_bandwidth:8.0%} {generic / fused:14.2f}"
        )
        if torch:
            row += f" {_torch_time(cp, torch, TORCH[name], x, repeats) / fused:12.2f}"
        print(row)


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _torch_time(cp, torch, f, x, repeats):
    t = torch.as_tensor(x, device="cuda").requires_grad_(True)

    def step():
        t.grad = None
        f(torch, t).backward()

    return cuda_time(cp, step, repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 24)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    try:
        import cupy as cp

        available = cp.is_available()
    except ImportError:
        available = False
    if not available:
        plan(args.size)
        return 0
    measure(cp, args.size, np.dtype(args.dtype), args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
