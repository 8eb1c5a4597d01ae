"""One MLP training step with tracker_gpu, next to the same step written by hand in NumPy.

    python benchmarks/train_step.py [--repeats 200] [--batch 64] [--threads 1]

The model is 784-128-10 with tanh, float32, the loss the logit cross-entropy of a batch of 64,
and the step forward + backward + Adam. tracker_gpu's step is what a user writes
(`nn.Chain`, `withgradient`, `optim.update`); the NumPy step computes the same forward pass,
its gradients by hand, and Adam's update in the textbook form (Kingma & Ba 2015), on the same
data and initial parameters. Both run in this process; the medians of `--repeats` timed steps
and their ratio are printed. BLAS runs on `--threads` threads (1 by default: these matrices are
small, and threads add noise), through threadpoolctl when it is installed.
"""

import argparse
import contextlib
import statistics
import time

import numpy as np

import tracker_gpu as tg
from tracker_gpu import nn, optim

SIZES = (784, 128, 10)
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8


def make_problem(batch, seed=0):
    """Random float32 inputs, integer labels, and the model (its arrays shared with NumPy's)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
    labels = rng.integers(0, SIZES[-1], size=batch)
    model = nn.Chain(
        nn.Dense(SIZES[0], SIZES[1], nn.tanh, rng=rng),
        nn.Dense(SIZES[1], SIZES[2], rng=rng),
    )
    return x, labels, model


# --- tracker_gpu: what a user writes
def tracker_setup(model):
    return optim.setup(optim.Adam(LR, (BETA1, BETA2), EPS), model)


def tracker_step(model, state, x, labels):
    loss, (grads,) = tg.withgradient(lambda m: nn.logitcrossentropy(m(x), labels), model)
    state, model = optim.update(state, model, grads)
    return model, state, loss


# --- NumPy by hand
def numpy_setup(model):
    params = [
        model.layers[0].weight,
        model.layers[0].bias,
        model.layers[1].weight,
        model.layers[1].bias,
    ]
    return [p.copy() for p in params], [(np.zeros_like(p), np.zeros_like(p)) for p in params], 0


def numpy_step(params, moments, t, x, onehot):
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1.T + b1)
    logits = h @ w2.T + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -np.mean(np.sum(onehot * logp, axis=1))
    dlogits = (np.exp(logp) - onehot) / x.shape[0]
    dz1 = (dlogits @ w2) * (1 - h * h)
    grads = [dz1.T @ x, dz1.sum(axis=0), dlogits.T @ h, dlogits.sum(axis=0)]
    t += 1
    new_params, new_moments = [], []
    for p, g, (m, v) in zip(params, grads, moments):
        m = BETA1 * m + (1 - BETA1) * g
        v = BETA2 * v + (1 - BETA2) * g * g
        m_hat = m / (1 - BETA1**t)
        v_hat = v / (1 - BETA2**t)
        new_params.append(p - LR * m_hat / (np.sqrt(v_hat) + EPS))
        new_moments.append((m, v))
    return new_params, new_moments, t, loss


def check_agreement(x, labels, model):
    """Both steps give the same loss and parameters from the same start (float32 tolerance)."""
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]
    params, moments, t = numpy_setup(model)
    state = tracker_setup(model)
    for _ in range(3):
        model, state, loss = tracker_step(model, state, x, labels)
        params, moments, t, np_loss = numpy_step(params, moments, t, x, onehot)
        assert np.allclose(float(tg.data(loss)), np_loss, rtol=1e-4), (float(loss), np_loss)
    ours = [model.layers[0].weight, model.layers[0].bias, model.layers[1].weight]
    for a, b in zip(ours, params):
        assert np.allclose(a, b, rtol=1e-4, atol=1e-6)


def median_seconds(step, repeats, warmup=20):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def blas_threads(n):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    x, labels, model = make_problem(args.batch)
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]
    with blas_threads(args.threads):
        check_agreement(x, labels, model)
        current = {"tracker": (model, tracker_setup(model)), "numpy": numpy_setup(model)}

        def ours():
            m, s = current["tracker"]
            m, s, _ = tracker_step(m, s, x, labels)
            current["tracker"] = (m, s)

        def by_hand():
            params, moments, t = current["numpy"]
            params, moments, t, _ = numpy_step(params, moments, t, x, onehot)
            current["numpy"] = (params, moments, t)

        # interleave the two, so that a slow spell of the machine hits both alike
        tracker_times, numpy_times = [], []
        rounds = min(5, args.repeats)
        for _ in range(rounds):
            tracker_times.append(median_seconds(ours, args.repeats // rounds))
            numpy_times.append(median_seconds(by_hand, args.repeats // rounds))
    ours_s, numpy_s = statistics.median(tracker_times), statistics.median(numpy_times)
    shape = "-".join(map(str, SIZES))
    print(f"MLP {shape}, batch {args.batch}, float32, tanh, logitcrossentropy, Adam")
    print(f"tracker_gpu step   {ours_s * 1e6:9.1f} us  (median of {args.repeats})")
    print(f"NumPy by hand      {numpy_s * 1e6:9.1f} us")
    print(f"ratio              {ours_s / numpy_s:9.2f}x")


if __name__ == "__main__":
    main()
