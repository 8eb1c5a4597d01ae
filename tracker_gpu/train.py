"""The main job: train a small MLP classifier with tracker_gpu and report its accuracy.

    python -m tracker_gpu.train [--steps 1000] [--seed 0]

It classifies two interleaved spirals (generated, no download), with a 2-32-32-2 tanh network,
softmax cross-entropy and gradient descent with momentum, written with `withgradient`.
"""

import argparse
import time
from dataclasses import dataclass

import numpy as np

import tracker_gpu as tg
from tracker_gpu.pytree import tree_map


@dataclass
class Dense:
    weight: np.ndarray
    bias: np.ndarray

    def __call__(self, x):
        return x @ self.weight + self.bias


def glorot(rng, fan_in, fan_out):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return Dense(rng.uniform(-limit, limit, (fan_in, fan_out)), np.zeros(fan_out))


def spirals(rng, n):
    """Two interleaved spirals in the plane, `n` points each, with their labels."""
    t = np.sqrt(rng.uniform(0.05, 1.0, n)) * 3 * np.pi
    arm = np.stack([t * np.cos(t), t * np.sin(t)], axis=1) / (3 * np.pi)
    x = np.concatenate([arm, -arm]) + rng.normal(0.0, 0.02, (2 * n, 2))
    y = np.concatenate([np.zeros(n, dtype=int), np.ones(n, dtype=int)])
    return x, y


def forward(model, x):
    for layer in model[:-1]:
        x = tg.tanh(layer(x))
    return model[-1](x)


def loss(model, x, onehot):
    return -tg.mean(tg.sum(tg.logsoftmax(forward(model, x), axis=-1) * onehot, axis=-1))


def accuracy(model, x, y):
    return float(np.mean(np.argmax(tg.data(forward(model, x)), axis=-1) == y))


def train(steps=1000, seed=0, lr=0.05, momentum=0.9, log=print):
    rng = np.random.default_rng(seed)
    x, y = spirals(rng, 500)
    test = rng.random(len(y)) < 0.2
    onehot = np.eye(2)[y]
    model = [glorot(rng, 2, 32), glorot(rng, 32, 32), glorot(rng, 32, 2)]
    train_x, train_onehot = x[~test], onehot[~test]
    velocity = tree_map(np.zeros_like, model)
    for step in range(1, steps + 1):
        value, (grads,) = tg.withgradient(lambda m: loss(m, train_x, train_onehot), model)
        velocity = tree_map(lambda v, g: momentum * v + g, velocity, grads)
        model = tree_map(lambda p, v: p - lr * v, model, velocity)
        if step % max(steps // 10, 1) == 0 or step == 1:
            log(f"step {step:4d}  loss {float(tg.data(value)):.4f}")
    return model, accuracy(model, x[test], y[test])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    _, test_accuracy = train(args.steps, args.seed)
    print(f"test accuracy {test_accuracy:.3f} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
