"""Saving and loading a model's parameters, as `.npz` files of NumPy arrays.

`save` writes every array of a model keyed by its place in the model ("layers.0.weight"), so a
model trained on any library or device loads anywhere; `load` reads them back, into a model of
the same structure (each array placed like the model's, unless told otherwise) or as a dict.
"""

import numpy as np

from ..backend import device_of, is_array, namespace_of
from ..optim.tree import tree_map_with_path
from ..tracked import data
from .placement import asarray, to_numpy

__all__ = ["save", "load"]


def _parameters(model):
    """`{path: array}` for every array of `model`, paths like "layers.0.weight"."""
    found = {}

    def record(path, x):
        if is_array(data(x)):
            found[path or "_"] = data(x)
        return x

    tree_map_with_path(record, model)
    return found


def save(path, model):
    """Write every array of `model` to the `.npz` file `path`, as NumPy arrays (so a model
    trained on any library or device loads anywhere), keyed by its place in the model."""
    np.savez(path, **{key: to_numpy(a) for key, a in _parameters(model).items()})


def load(path, model=None, *, xp=None, device=None, dtype=None):
    """The arrays saved by `save`, put into `model` (a model of the same structure).

    Each array goes where the model's array is (same library, device and dtype), unless `xp`,
    `device` or `dtype` is given; an array the model holds in several places (tied weights) is
    loaded once, from its first place. Without a model, returns `{key: NumPy array}`.
    """
    with np.load(path) as file:
        saved = {key: file[key] for key in file.files}
    if model is None:
        return saved
    expected = _parameters(model)
    _check_same_keys(path, saved, expected)
    explicit = xp is not None or device is not None
    loaded = {}  # by the model's array: tied places get one array

    def fill(key, x):
        key = key or "_"
        if key not in expected:
            return x
        if id(expected[key]) not in loaded:
            loaded[id(expected[key])] = (expected[key], placed(key))
        return loaded[id(expected[key])][1]

    def placed(key):
        values, template = saved[key], expected[key]
        if tuple(values.shape) != tuple(template.shape):
            raise ValueError(
                f"load: {key} has shape {tuple(values.shape)} in {path} but "
                f"{tuple(template.shape)} in the model"
            )
        if explicit:
            return asarray(values, xp=xp, device=device, dtype=dtype or values.dtype)
        return asarray(
            values,
            xp=namespace_of(template),
            device=device_of(template),
            dtype=dtype or template.dtype,
        )

    return tree_map_with_path(fill, model)


def _check_same_keys(path, saved, expected):
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    if missing or extra:
        raise ValueError(
            f"load: {path} does not fit the model: missing {missing or 'nothing'}, "
            f"unexpected {extra or 'nothing'}; load it into a model built the same way"
        )
