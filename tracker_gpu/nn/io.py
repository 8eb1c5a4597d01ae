"""Saving and loading a model's parameters, as `.npz` files of NumPy arrays.

`save` writes every array of a model keyed by its place in the model ("layers.0.weight"), so a
model trained on any library or device loads anywhere; `load` reads them back, into a model of
the same structure (each array placed like the model's, unless told otherwise) or as a dict.

The file is written atomically and durably (`tracker_gpu.files.atomic_file`): a kill or a full
disk leaves the previous file. It records its format (`FORMAT`) in a JSON member `__model__`;
files from before the format was recorded load as format 1. A bfloat16 array (which `.npy`
cannot name) is stored as its uint16 bits, its dtype recorded in `__model__` ("dtypes"), and
loads back bit for bit. `load` reads the zip's directory and
every array's header first and refuses, with one `BadFileError` naming the file, anything that
does not fit the model (names, shapes, dtypes, sizes) or is damaged, before any array is made.
"""

import json
import os

import numpy as np

from ..backend import device_of, isdtype, namespace_of
from ..files import Archive, BadFileError, as_bits, write_npz
from ..optim.tree import arrays_by_path, tree_map_with_path
from .placement import asarray, lossy_cast, to_numpy

__all__ = ["save", "load"]

FORMAT = 1
_META = "__model__"
_CHECKPOINT = "__checkpoint__"  # optim.save_checkpoint's description
UNBOUNDED_RATIO = 16  # without a model, arrays may declare this many times the file's size
UNBOUNDED_FLOOR = 2**20  # ... or this many bytes


_parameters = arrays_by_path  # `{path: array}`, paths like "layers.0.weight"


def save(path, model):
    """Write every array of `model` to the `.npz` file `path`, as NumPy arrays (so a model
    trained on any library or device loads anywhere), keyed by its place in the model."""
    if not isinstance(path, (str, os.PathLike)) and isinstance(model, (str, os.PathLike)):
        raise TypeError("nn.save takes the path first, then the model: nn.save(path, model)")
    arrays, dtypes = {}, {}
    for key, a in _parameters(model).items():
        arrays[key], dtype = as_bits(to_numpy(a))
        if dtype is not None:
            dtypes[key] = dtype
    arrays[_META] = np.array(json.dumps({"format": FORMAT, "dtypes": dtypes}))
    write_npz(path, arrays)


def load(path, model=None, *, xp=None, device=None, dtype=None):
    """The arrays saved by `save`, put into `model` (a model of the same structure).

    Each array goes where the model's array is (same library, device and dtype), unless `xp`,
    `device` or `dtype` is given; an array the model holds in several places (tied weights) is
    loaded once, from its first place, and the file's arrays for the others must equal it (a
    file of untied weights is refused, not loaded in part). Without a model, returns
    `{key: NumPy array}`.
    A file that does not fit the model or is damaged raises `BadFileError` before any array
    is read.
    """
    expected = None if model is None else _parameters(model)
    with Archive(path, "load") as archive:
        names, dtypes = _check(archive, expected)
        archive.verify(names)
        saved = {key: archive.read(key, dtypes.get(key)) for key in names}
    if model is None:
        return saved
    explicit = xp is not None or device is not None
    loaded = {}  # by the model's array: tied places get one array

    def fill(key, x):
        key = key or "_"
        if key not in expected:
            return x
        tied = loaded.get(id(expected[key]))
        if tied is None:
            loaded[id(expected[key])] = (expected[key], placed(key), key)
            return loaded[id(expected[key])][1]
        if not _same_values(saved[tied[2]], saved[key]):
            raise BadFileError(
                f"load: {path}: its arrays {tied[2]} and {key} differ, where the model holds one "
                "array (tied weights); load it into a model that does not tie them"
            )
        return tied[1]

    def placed(key):
        values, template = saved[key], expected[key]
        floating = isdtype(namespace_of(template), template.dtype, "real floating")
        cast = dtype if floating else None  # as `place`: a count of batches stays an integer
        into = cast or (values.dtype if explicit else template.dtype)
        why = lossy_cast(values, into)
        if why is not None:
            raise BadFileError(f"load: {path}: its array {key} does not fit the model: {why}")
        if explicit:
            return asarray(values, xp=xp, device=device, dtype=into)
        return asarray(values, xp=namespace_of(template), device=device_of(template), dtype=into)

    return tree_map_with_path(fill, model)


def _same_values(a, b):
    """Whether two saved arrays hold the same values (bit for bit: a nan equals itself)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _check(archive, expected):
    """The names of the arrays to read from `archive`, checked against the model's arrays
    `expected` (or, without a model, bounded by the file's size) before anything is read."""
    if _CHECKPOINT in archive.members:
        raise archive.error(
            "it is a checkpoint (written by optim.save_checkpoint): load it with "
            "optim.load_checkpoint"
        )
    dtypes = {}
    if _META in archive.members:
        meta = archive.read_json(_META)
        archive.check_format(meta, _META, FORMAT)
        dtypes = _dtypes(archive, meta)
    names = sorted(set(archive.members) - {_META})
    unknown = sorted(set(dtypes) - set(names))
    if unknown:
        raise archive.error(f"its description gives dtypes of arrays it lacks: {unknown}")
    if expected is None:
        for name in names:
            archive.check(name, dtype=dtypes.get(name))
        limit = max(UNBOUNDED_RATIO * os.path.getsize(archive.path), UNBOUNDED_FLOOR)
        why = f" ({UNBOUNDED_RATIO} times its size on disk); load it into a model to read it"
        archive.bound(names, limit, why)
        return names, dtypes
    missing, extra = sorted(set(expected) - set(names)), sorted(set(names) - set(expected))
    if missing or extra:
        raise archive.error(
            f"does not fit the model: missing {missing or 'nothing'}, "
            f"unexpected {extra or 'nothing'}; load it into a model built the same way"
        )
    for name in expected:  # in the model's order
        archive.check(name, shape=tuple(expected[name].shape), dtype=dtypes.get(name))
    return list(expected), dtypes


def _dtypes(archive, meta):
    """The description's `{array: dtype name}` of the arrays stored as bits (bfloat16)."""
    dtypes = meta.get("dtypes", {})
    if not isinstance(dtypes, dict) or not all(isinstance(v, str) for v in dtypes.values()):
        raise archive.error(f"its description's dtypes are {dtypes!r}, not names by array")
    return dtypes
