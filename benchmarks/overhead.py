"""Per-operation overhead: forward + backward of a chain of elementwise ops on a 1-element array.

    python benchmarks/overhead.py [--ops 1000] [--repeats 21]

Prints microseconds per operation for tracker_gpu, NumPy's forward alone (no tape), and PyTorch's
autograd and HIPS autograd when installed, each measured in this run, with ratios.
"""

import argparse
import statistics
import time

import numpy as np

import tracker_gpu as tg


def tracker_chain(n):
    x = tg.param(np.array([0.5]))
    y = x
    for _ in range(n):
        y = y * 1.0001
    tg.back(tg.sum(y))


def numpy_forward(n):
    y = np.array([0.5])
    for _ in range(n):
        y = y * 1.0001


def torch_chain(n):
    import torch

    x = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    y = x
    for _ in range(n):
        y = y * 1.0001
    y.sum().backward()


def autograd_chain(n):
    import autograd
    import autograd.numpy as anp

    def f(x):
        for _ in range(n):
            x = x * 1.0001
        return anp.sum(x)

    autograd.grad(f)(np.array([0.5]))


def per_op_microseconds(fn, ops, repeats):
    fn(ops)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(ops)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / ops * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    rows = [("tracker_gpu forward+backward", tracker_chain), ("numpy forward only", numpy_forward)]
    rows += [("torch autograd forward+backward", torch_chain)]
    rows += [("HIPS autograd forward+backward", autograd_chain)]
    results = {}
    for name, fn in rows:
        try:
            results[name] = per_op_microseconds(fn, args.ops, args.repeats)
        except ImportError as error:
            print(f"{name:34s} not installed ({error.name})")
    ours = results["tracker_gpu forward+backward"]
    print(f"\n{'workload':34s} {'us/op':>8s} {'ours / this':>12s}")
    for name, us in results.items():
        print(f"{name:34s} {us:8.2f} {ours / us:12.2f}")


if __name__ == "__main__":
    main()
