"""Checkpoints: a model, its optimiser state and a few facts about the run in one `.npz` file,
so that a stopped run resumes exactly where it stopped.

`save_checkpoint(path, model, state, **info)` writes every array as NumPy (a run on any library
and device resumes anywhere) and, as JSON, each parameter's rule with its hyperparameters, its
state's numbers (Adam's powers of beta, a schedule's step), whether it is frozen, the ties
between parameters and `info` (anything JSON can hold: the epoch, a random generator's state).
`load_checkpoint(path, model)` puts the arrays into a model built the same way, each placed like
the model's array there, and returns `(model, state, info)`: the values are bit for bit the
saved ones, so k steps, a checkpoint and m more steps give the model of k + m steps.

>>> import numpy as np, os, tempfile
>>> from tracker_gpu.optim import Adam, setup, update
>>> model = {"w": np.array([1.0, 2.0])}
>>> state = setup(Adam(0.1), model)
>>> state, model = update(state, model, {"w": np.array([0.5, -0.5])})
>>> path = os.path.join(tempfile.mkdtemp(), "run.npz")
>>> save_checkpoint(path, model, state, epoch=3)
>>> model2, state2, info = load_checkpoint(path, {"w": np.zeros(2)})
>>> bool(np.array_equal(model2["w"], model["w"])), state2["w"].state[2] == state["w"].state[2], info
(True, True, {'epoch': 3})
"""

import dataclasses
import json
import os
from collections import namedtuple

import numpy as np

from ..backend import device_of, is_array, namespace_of
from ..tracked import data
from . import adaptive, rules, schedules
from .state import Leaf
from .tree import tree_map_with_path

__all__ = ["save_checkpoint", "load_checkpoint", "Checkpoint"]

Checkpoint = namedtuple("Checkpoint", "model state info")

_FORMAT = 1
_META = "__checkpoint__"
_TYPES = {
    name: getattr(module, name)
    for module in (rules, adaptive, schedules)
    for name in module.__all__
    if name != "Rule"
}


def save_checkpoint(path, model, state, **info):
    """Write `model`, its optimiser `state` (from `setup`/`update`) and `info` to `path`."""
    arrays, meta = {}, {"format": _FORMAT, "model": {}, "state": {}, "info": info}
    _record_model(model, arrays, meta["model"])
    _record_state(state, arrays, meta["state"])
    try:
        text = json.dumps(meta)
    except TypeError as error:
        raise TypeError(
            f"save_checkpoint: info must be JSON data (numbers, strings, lists, dicts): {error}"
        ) from None
    arrays[_META] = np.array(text)
    scratch = f"{path}.{os.getpid()}.partial"
    with open(scratch, "wb") as file:  # written whole, then renamed: never half a checkpoint
        np.savez(file, **arrays)
    os.replace(scratch, path)


def _record_model(model, arrays, entries):
    first = {}

    def record(path, x):
        x, key = data(x), path or "_"
        if is_array(x):
            if id(x) in first:
                entries[key] = {"same_as": first[id(x)]}
            else:
                first[id(x)] = key
                entries[key] = _encode(x, f"model/{key}", arrays)
        return x

    tree_map_with_path(record, model)


def _record_state(state, arrays, entries):
    first = {}

    def record(path, leaf):
        key = path or "_"
        if isinstance(leaf, Leaf):
            if id(leaf) in first:
                entries[key] = {"same_as": first[id(leaf)]}
            else:
                first[id(leaf)] = key
                entries[key] = {
                    "rule": _encode(leaf.rule, None, arrays),
                    "frozen": leaf.frozen,
                    "state": _encode(leaf.state, f"state/{key}", arrays),
                }
        return leaf

    tree_map_with_path(record, state, is_leaf=lambda x: isinstance(x, Leaf))


def _encode(value, prefix, arrays):
    """JSON for a rule, a schedule or a state; its arrays go into `arrays` under `prefix`."""
    from ..nn.placement import to_numpy

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return {"tuple": [_encode(v, f"{prefix}/{i}", arrays) for i, v in enumerate(value)]}
    if is_array(data(value)) and prefix is not None:
        arrays[prefix] = to_numpy(value)
        return {"array": prefix}
    if isinstance(value, rules.OptimiserChain):
        return {"type": "OptimiserChain", "rules": [_encode(r, None, arrays) for r in value.rules]}
    if _TYPES.get(type(value).__name__) is type(value):
        fields = {
            f.name: _encode(getattr(value, f.name), None, arrays) for f in dataclasses.fields(value)
        }
        return {"type": type(value).__name__, "fields": fields}
    raise TypeError(
        f"save_checkpoint: cannot save a {type(value).__name__}: a checkpoint holds the rules and "
        f"schedules of tracker_gpu.optim, numbers and arrays; save a model alone with nn.save"
    )


def load_checkpoint(path, model):
    """`(model, state, info)` from the checkpoint at `path`: its arrays put into `model` (a model
    built the same way, whose arrays say where each goes: library, device, dtype), the
    optimiser state shaped like it (ties and frozen parts included) and the saved `info`."""
    with np.load(path) as file:
        arrays = {key: file[key] for key in file.files}
    if _META not in arrays:
        raise ValueError(
            f"load_checkpoint: {path} is not a checkpoint (written by save_checkpoint); "
            "load a model saved by nn.save with nn.load"
        )
    meta = json.loads(str(arrays.pop(_META)))
    new_model = _fill_model(path, model, meta["model"], arrays)
    return Checkpoint(new_model, _fill_state(path, new_model, meta["state"], arrays), meta["info"])


def _fill_model(path, model, entries, arrays):
    from ..nn.placement import asarray

    expected = []
    tree_map_with_path(lambda p, x: expected.append(p or "_") if is_array(data(x)) else None, model)
    _check_fits(path, "arrays", sorted(entries), sorted(expected))
    loaded = {}

    def fill(p, x):
        key, template = p or "_", data(x)
        if not is_array(template):
            return x
        entry = entries[key]
        if "same_as" in entry:
            return loaded[entry["same_as"]]
        values = arrays[entry["array"]]
        if tuple(values.shape) != tuple(template.shape):
            raise ValueError(
                f"load_checkpoint: {key} has shape {tuple(values.shape)} in {path} "
                f"but {tuple(template.shape)} in the model"
            )
        loaded[key] = asarray(
            values, xp=namespace_of(template), device=device_of(template), dtype=template.dtype
        )
        return loaded[key]

    return tree_map_with_path(fill, model)


def _fill_state(path, model, entries, arrays):
    parameters = []
    tree_map_with_path(lambda p, x: parameters.append(p or "_") if is_array(x) else None, model)
    unknown = sorted(set(entries) - set(parameters))
    if unknown:
        _check_fits(path, "optimiser states", unknown, [])
    leaves = {}

    def make(p, x):
        key = p or "_"
        entry = entries.get(key)
        if entry is None:
            return None
        if "same_as" not in entry:
            decoded = [_decode(entry[k], arrays, x) for k in ("rule", "state")]
            leaves[key] = Leaf(*decoded, entry["frozen"])
        return leaves[entry.get("same_as", key)]

    return tree_map_with_path(make, model)


def _decode(value, arrays, like):
    from ..nn.placement import asarray

    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(_decode(v, arrays, like) for v in value["tuple"])
    if "array" in value:
        values = arrays[value["array"]]
        return asarray(values, xp=namespace_of(like), device=device_of(like), dtype=values.dtype)
    if value["type"] == "OptimiserChain":
        return rules.OptimiserChain(*(_decode(r, arrays, like) for r in value["rules"]))
    fields = {k: _decode(v, arrays, like) for k, v in value["fields"].items()}
    return _TYPES[value["type"]](**fields)


def _check_fits(path, what, saved, expected):
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    if missing or extra:
        raise ValueError(
            f"load_checkpoint: {path} does not fit the model: its {what} miss "
            f"{missing or 'nothing'} and have {extra or 'nothing'} more; build the model the "
            "way the saved one was built"
        )
