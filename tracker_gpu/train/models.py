"""The models the main job trains, and their recipes (epochs and learning rate): an MLP, a small
CNN and an LSTM that reads each image row by row."""

from dataclasses import dataclass

from tracker_gpu import nn
from tracker_gpu.rules.shape import getitem, reshape

__all__ = ["CLASSES", "mlp", "cnn", "lstm", "Recipe", "RECIPES"]

CLASSES = 10


def mlp(*, rng, **placement):
    """64-128-10 with ReLU, on flattened images."""
    return nn.Chain(
        nn.Flatten(),
        nn.Dense(64, 128, nn.relu, rng=rng, **placement),
        nn.Dense(128, CLASSES, rng=rng, **placement),
    )


def cnn(*, rng, **placement):
    """Two 3x3 convolutions with max pooling, then a dense layer: 8x8 -> 4x4 -> 2x2."""
    return nn.Chain(
        nn.Conv((3, 3), 1, 16, nn.relu, pad=1, rng=rng, **placement),
        nn.MaxPool(2),
        nn.Conv((3, 3), 16, 32, nn.relu, pad=1, rng=rng, **placement),
        nn.MaxPool(2),
        nn.Flatten(),
        nn.Dense(32 * 2 * 2, CLASSES, rng=rng, **placement),
    )


def rows(images):
    """Images `(n, 1, 8, 8)` as sequences of their rows `(n, 8, 8)`: 8 steps of 8 pixels."""
    return reshape(images, (images.shape[0], images.shape[2], images.shape[3]))


def last(sequence):
    """The last step of each sequence `(n, time, features)`."""
    return getitem(sequence, (slice(None), sequence.shape[1] - 1, slice(None)))


def lstm(*, rng, **placement):
    """An LSTM of 64 units reading the image row by row, then a dense layer on its last
    output."""
    return nn.Chain(
        rows,
        nn.LSTM(8, 64, rng=rng, **placement),
        last,
        nn.Dense(64, CLASSES, rng=rng, **placement),
    )


@dataclass(frozen=True)
class Recipe:
    build: object
    epochs: int
    lr: float


RECIPES = {
    "mlp": Recipe(mlp, epochs=20, lr=3e-3),
    "cnn": Recipe(cnn, epochs=15, lr=3e-3),
    "lstm": Recipe(lstm, epochs=15, lr=1e-2),
}
