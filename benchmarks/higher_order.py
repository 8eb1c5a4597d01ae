"""The cost of second-order derivatives relative to one gradient, measured in one run.

    python benchmarks/higher_order.py [--repeats 21] [--sizes 4 16 64]

For the loss of a small MLP (float64, 123 parameters, batch 32): the time of one `gradient`,
one Hessian-vector product `hvp` (which never builds the Hessian) and one full `hessian`, each as
a ratio to the gradient.

Then the Hessian two ways, for three functions of a vector of n elements (`tanh-layer`,
sum(tanh(W x)); `logsumexp`, of A x; `mlp-input`, a small MLP's loss with respect to its
input): reverse over reverse (`tg.hessian`: one nested gradient recorded, then one reverse walk
of it per row) and forward over reverse (`tg.jacfwd` of the nested gradient: one `jvp` per
column, each a forward-mode product built from a nested reverse pass). Both are timed
interleaved in the same process; the ratio is forward over reverse to reverse over reverse
(above 1: reverse over reverse is cheaper). Time only: peak memory is not measured.
"""

import argparse
import statistics
import time
from functools import partial

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


def hessian_functions(n, rng):
    """Scalar functions of a vector of `n` elements, by name."""
    W = rng.standard_normal((n, n)) / np.sqrt(n)
    A = rng.standard_normal((2 * n, n)) / np.sqrt(n)
    W1, W2 = rng.standard_normal((16, n)) / np.sqrt(n), rng.standard_normal((3, 16)) / 4
    labels = np.eye(3)[1]
    return {
        "tanh-layer": lambda x: tg.sum(tg.tanh(tg.matmul(W, x))),
        "logsumexp": lambda x: tg.logsumexp(tg.matmul(A, x)),
        "mlp-input": lambda x: (
            -tg.sum(tg.logsoftmax(tg.matmul(W2, tg.tanh(tg.matmul(W1, x)))) * labels)
        ),
    }


def forward_over_reverse(f, x):
    """The Hessian as the forward-mode Jacobian of the nested gradient."""
    return tg.jacfwd(lambda x: tg.gradient(f, x, nest=True)[0], x)


def interleaved_medians(fns, repeats):
    """The median seconds of each of `fns`, timed round by round."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            start = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - start)
    return [statistics.median(ts) for ts in times]


def compare_hessians(sizes, repeats):
    rng = np.random.default_rng(1)
    print(f"\n{'hessian':12s} {'n':>4s} {'rev-rev ms':>11s} {'fwd-rev ms':>11s} {'fwd/rev':>8s}")
    for n in sizes:
        x = rng.standard_normal(n)
        for name, f in hessian_functions(n, rng).items():
            reverse, forward = tg.hessian(f, x), forward_over_reverse(f, x)
            assert np.allclose(reverse, forward, rtol=1e-10, atol=1e-12), name
            rev, fwd = interleaved_medians(
                [partial(tg.hessian, f, x), partial(forward_over_reverse, f, x)], repeats
            )
            print(f"{name:12s} {n:4d} {rev * 1e3:11.2f} {fwd * 1e3:11.2f} {fwd / rev:8.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 64])
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
    compare_hessians(args.sizes, max(3, args.repeats // 3))


if __name__ == "__main__":
    main()
