"""The cost of second-order derivatives relative to one gradient, measured in one run.

    python benchmarks/higher_order.py [--repeats 21]

For the loss of a small MLP (float64, 123 parameters, batch 32): the time of one `gradient`,
one Hessian-vector product `hvp` (which never builds the Hessian) and one full `hessian`, each as
a ratio to the gradient.
"""

import argparse
import statistics
import time

import numpy as np

import tracker_gpu as tg

SIZES = [(12, 6), (12,), (3, 12), (3,)]


def mlp_loss(inputs, labels):
    def loss(theta):
        parts, start = [], 0
        for shape in SIZES:
            size = int(np.prod(shape))
            parts.append(tg.reshape(theta[start : start + size], shape))
            start += size
        w1, b1, w2, b2 = parts
        hidden = tg.tanh(tg.matmul(inputs, w1.mT) + b1)
        logits = tg.matmul(hidden, w2.mT) + b2
        return -tg.mean(tg.sum(tg.logsoftmax(logits, axis=-1) * labels, axis=-1))

    return loss


def median_seconds(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    loss = mlp_loss(rng.standard_normal((32, 6)), np.eye(3)[rng.integers(0, 3, 32)])
    n = sum(int(np.prod(s)) for s in SIZES)
    theta, v = rng.standard_normal(n) * 0.3, rng.standard_normal(n)
    gradient = median_seconds(lambda: tg.gradient(loss, theta), args.repeats)
    hvp = median_seconds(lambda: tg.hvp(loss, theta, v), args.repeats)
    hessian = median_seconds(lambda: tg.hessian(loss, theta), max(3, args.repeats // 7))
    print(f"{'':10s} {'ms':>8s} {'/ gradient':>11s}   ({n} parameters)")
    for name, seconds in (("gradient", gradient), ("hvp", hvp), ("hessian", hessian)):
        print(f"{name:10s} {seconds * 1e3:8.2f} {seconds / gradient:11.2f}")


if __name__ == "__main__":
    main()
