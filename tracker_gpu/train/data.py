"""The data of the main job: scikit-learn's handwritten digits (1,797 images of 8x8 pixels,
shipped with scikit-learn: no download), split into training and test sets and placed where
the model trains, and the batches of an epoch."""

from dataclasses import dataclass

from tracker_gpu import nn
from tracker_gpu.backend import device_of, namespace_of

__all__ = ["Data", "digits", "batches", "SKLEARN_MISSING"]

SKLEARN_MISSING = (
    "the digits come with scikit-learn, which is not installed; install it with "
    "pip install 'tracker-gpu[train]' (or pip install scikit-learn)"
)


@dataclass
class Data:
    """Images `(n, 1, 8, 8)` scaled to [0, 1] and integer labels, on the training device."""

    train_x: object
    train_y: object
    test_x: object
    test_y: object


def digits(*, xp=None, device=None, dtype="float32", test_fraction=0.25, seed=0):
    """scikit-learn's digits, split (stratified) into training and test sets, as arrays of
    library `xp` on `device`."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        raise ImportError(SKLEARN_MISSING) from None

    bunch = load_digits()
    images = (bunch.images / 16.0)[:, None, :, :]
    split = train_test_split(
        images, bunch.target, test_size=test_fraction, stratify=bunch.target, random_state=seed
    )
    train_x, test_x, train_y, test_y = split

    def put(values, dtype):
        return nn.asarray(values, xp=xp, device=device, dtype=dtype)

    return Data(
        put(train_x, dtype), put(train_y, "int64"), put(test_x, dtype), put(test_y, "int64")
    )


def batches(data, batch_size, rng):
    """The batches `(x, y)` of one epoch, in an order drawn from `rng` (a NumPy generator)."""
    lib, where = namespace_of(data.train_x), device_of(data.train_x)
    n = data.train_x.shape[0]
    order = lib.asarray(rng.permutation(n), device=where)
    for start in range(0, n, batch_size):
        batch = order[start : min(start + batch_size, n)]
        yield lib.take(data.train_x, batch, axis=0), lib.take(data.train_y, batch, axis=0)
