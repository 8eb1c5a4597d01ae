"""Checkpoints: a model, its optimiser state and a few facts about the run in one `.npz` file,
so that a stopped run resumes exactly where it stopped.

`save_checkpoint(path, model, state, **info)` writes every array as NumPy (a run on any library
and device resumes anywhere) and, as JSON, each parameter's rule with its hyperparameters, its
state's numbers (Adam's powers of beta, a schedule's step), whether it is frozen, the ties
between parameters, the state of each NumPy generator of the model (a Dropout's, so that the
resumed run draws what the run straight through drew) and `info` (anything JSON can hold: the
epoch, the data's generator's state).
`load_checkpoint(path, model)` puts the arrays into a model built the same way, each placed like
the model's array there, and returns `(model, state, info)`: the values are bit for bit the
saved ones (bfloat16 arrays too, stored as their uint16 bits with the dtype's name), so k
steps, a checkpoint and m more steps give the model of k + m steps. Placed means in the model's
library, device and dtype: a float64 run loaded into a float32 model is rounded to float32, and
the optimiser's arrays that had their parameter's dtype take the new one.

The file is written atomically and durably (`tracker_gpu.files.atomic_file`): a kill or a full
disk leaves the previous checkpoint, and a write that fails raises `SaveError` (an `OSError`)
naming the path. Loading reads the zip's directory, its JSON description and every array's
header first, and refuses anything that does not fit the model (names, shapes, dtypes, sizes),
a format other than `FORMAT`, or a damaged file with one `BadFileError` (a `ValueError`) naming
the file, before any array is made. `read_checkpoint_info(path)` returns the saved `info`
without reading the arrays; `read_checkpoint_info(path, model)` also checks that the whole
file loads into `model`.

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
from collections import namedtuple

import numpy as np

from ..backend import device_of, dtype_name, is_array, namespace_of
from ..files import Archive, BadFileError, as_bits, write_npz
from ..tracked import data
from . import adaptive, rules, schedules, variants
from .lbfgs import LBFGSState
from .state import Leaf, fresh_state
from .tree import arrays_by_path, put_once, tree_map_with_path

__all__ = ["save_checkpoint", "load_checkpoint", "read_checkpoint_info", "Checkpoint"]

Checkpoint = namedtuple("Checkpoint", "model state info")

FORMAT = 1
_FORMAT = FORMAT
_META = "__checkpoint__"
_TYPES = {
    name: getattr(module, name)
    for module in (rules, adaptive, variants, schedules)
    for name in module.__all__
    if name != "Rule"
}


def save_checkpoint(path, model, state, **info):
    """Write `model`, its optimiser `state` (from `setup`/`update`) and `info` to `path`."""
    if isinstance(state, LBFGSState):
        raise TypeError(
            "save_checkpoint: the state of LBFGS is not saved (its history is rebuilt in a few "
            "steps): save the model with nn.save, or save_checkpoint(path, model, None), and "
            "setup(LBFGS(...), model) again after loading"
        )
    arrays, meta = {}, {"format": _FORMAT, "model": {}, "state": {}, "info": info}
    _record_model(model, arrays, meta["model"])
    _record_state(state, arrays, meta["state"])
    meta["generators"] = _generator_states(model)
    try:
        text = json.dumps(meta)
    except TypeError as error:
        raise TypeError(
            f"save_checkpoint: info must be JSON data (numbers, strings, lists, dicts): {error}"
        ) from None
    arrays[_META] = np.array(text)
    write_npz(path, arrays)  # written whole, then renamed: never half a checkpoint


def _record_model(model, arrays, entries):
    first = {}

    def record(path, x):
        x, key = data(x), path or "_"
        if is_array(x):
            if id(x) in first:
                put_once(entries, key, {"same_as": first[id(x)]})
            else:
                first[id(x)] = key
                put_once(entries, key, _encode(x, f"model/{key}", arrays))
        return x

    tree_map_with_path(record, model)


GENERATORS = (np.random.Generator, np.random.RandomState)  # what a layer draws from


def _generator_states(model):
    """`{path: state}` of each NumPy generator of `model` (a Dropout's), so that a resumed run
    draws what the run straight through drew; `{path: {"same_as": path}}` where one generator
    is found again (several layers drawing from one). A generator of another kind is refused:
    left out, a resumed run would draw other numbers without a word."""
    found, first = {}, {}

    def record(path, x):
        key = path or "_"
        if isinstance(x, GENERATORS):
            if id(x) in first:
                found[key] = {"same_as": first[id(x)]}
            else:
                first[id(x)] = key
                state = json.dumps(_generator_state(x), default=lambda a: a.tolist())
                found[key] = json.loads(state)  # MT19937's key, an array, as a list
        elif callable(getattr(x, "random", None)) and not is_array(x):
            raise TypeError(
                f"save_checkpoint: the random generator at {key} ({type(x).__name__}) cannot be "
                "saved, so a resumed run would draw other numbers; give the layer a NumPy "
                "Generator (rng=np.random.default_rng(seed))"
            )
        return x

    tree_map_with_path(record, model)
    return found


def _generator_state(rng):
    if isinstance(rng, np.random.RandomState):
        return rng.get_state(legacy=False)  # its bit generator's state, and a cached normal
    return rng.bit_generator.state


def _fill_generators(model, states):
    """`model` with a new generator in the saved state where one was saved (a checkpoint
    written before generators were saved keeps the template's)."""
    made = {}

    def fill(path, x):
        key = path or "_"
        saved = states.get(key)
        if saved is None or not isinstance(x, GENERATORS):
            return x
        if "same_as" in saved:
            return made[saved["same_as"]]
        kind = getattr(np.random, saved["bit_generator"])
        if not (isinstance(kind, type) and issubclass(kind, np.random.BitGenerator)):
            raise TypeError(f"{saved['bit_generator']!r} is not a NumPy bit generator")
        if "has_gauss" in saved:  # a RandomState's
            made[key] = np.random.RandomState(kind())
            made[key].set_state(saved)
        else:
            made[key] = np.random.Generator(kind())
            made[key].bit_generator.state = saved
        return made[key]

    return tree_map_with_path(fill, model)


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

    if isinstance(value, np.generic) and prefix is not None:
        value = np.asarray(value)  # NumPy's float64 is a Python float too: kept an array
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return {"tuple": [_encode(v, f"{prefix}/{i}", arrays) for i, v in enumerate(value)]}
    if is_array(data(value)) and prefix is not None:
        arrays[prefix], dtype = as_bits(to_numpy(value))
        return {"array": prefix} if dtype is None else {"array": prefix, "dtype": dtype}
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
    optimiser state shaped like it (ties and frozen parts included) and the saved `info`.
    A checkpoint that does not fit `model` or is damaged raises `BadFileError`, naming the file,
    before any array is read."""
    with Archive(path, "load_checkpoint") as archive:
        meta, bits = _check(archive, model)
        archive.verify()
        names = [name for name in archive.members if name != _META]
        arrays = {name: archive.read(name, bits.get(name)) for name in names}
        try:
            new_model = _fill_model(archive, model, meta["model"], arrays)
            new_model = _fill_generators(new_model, meta.get("generators", {}))
            saved_dtypes = {k: arrays[e["array"]].dtype for k, e in meta["model"].items()
                            if "array" in e}  # fmt: skip
            state = _fill_state(archive, new_model, meta["state"], arrays, saved_dtypes)
        except BadFileError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
            what = f"{type(error).__name__}: {error}"
            raise archive.error(f"its description is malformed ({what})") from None
    return Checkpoint(new_model, state, meta["info"])


def read_checkpoint_info(path, model=None):
    """The `info` saved in the checkpoint at `path`, read without its arrays. With a `model`,
    also checks that the checkpoint loads into it (names, shapes, dtypes, sizes, checksums, the
    optimiser's rules), by loading it and letting it go, so that a run can check all its
    checkpoints before it starts. Raises `BadFileError` naming the file for whatever is wrong."""
    if model is not None:
        return load_checkpoint(path, model).info
    with Archive(path, "read_checkpoint_info") as archive:
        return _read_meta(archive)["info"]


def _read_meta(archive):
    if _META not in archive.members:
        raise archive.error(
            "it is not a checkpoint (written by save_checkpoint); load a model saved by "
            "nn.save with nn.load"
        )
    meta = archive.read_json(_META)
    archive.check_format(meta, _META, FORMAT)
    for key, kind in (("model", dict), ("state", dict), ("info", dict)):
        if not isinstance(meta.get(key), kind):
            raise archive.error(f"its description has no {key!r} {kind.__name__}")
    return meta


def _check(archive, model):
    """The checkpoint's description and `{member: dtype}` of the arrays stored as bits, once
    every array of `archive` is known to fit `model`: the model's arrays have its shapes, an
    optimiser state's arrays at most its parameter's size, and no array is missing or more."""
    meta = _read_meta(archive)
    templates = arrays_by_path(model)
    _check_fits(archive.path, "arrays", sorted(meta["model"]), sorted(templates), archive)
    _check_ties(archive, meta["model"], templates)
    unknown = sorted(set(meta["state"]) - set(templates))
    if unknown:
        _check_fits(archive.path, "optimiser states", unknown, [], archive)
    wanted, bits = {}, {}  # member: (shape or None, most elements); member: dtype
    for key, entry in meta["model"].items():
        for name, dtype in _array_names(archive, entry):
            wanted[name], bits[name] = (tuple(templates[key].shape), None), dtype
    for key, entry in meta["state"].items():
        size = max(int(np.prod(templates[key].shape)), 1)
        state = entry.get("state") if isinstance(entry, dict) else None
        for name, dtype in _array_names(archive, state):
            wanted[name], bits[name] = (None, size), dtype
    names = set(archive.members) - {_META}
    if set(wanted) != names:
        raise archive.error(
            f"its arrays do not match its description: missing {sorted(set(wanted) - names)}, "
            f"unexpected {sorted(names - set(wanted))}"
        )
    for name, (shape, most) in wanted.items():
        archive.check(name, shape=shape, most=most, what="the model", dtype=bits[name])
    return meta, {name: dtype for name, dtype in bits.items() if dtype is not None}


def _check_ties(archive, entries, templates):
    """Refuse a checkpoint whose arrays held in several places (one array, one optimiser
    state) are not the model's: loaded, a tie would be made or broken without a word."""
    first, model_ties = {}, {}
    for key, x in templates.items():
        if id(x) in first:
            model_ties[key] = first[id(x)]
        first.setdefault(id(x), key)
    saved_ties = {
        k: e["same_as"] for k, e in entries.items() if isinstance(e, dict) and "same_as" in e
    }
    if saved_ties != model_ties:
        raise archive.error(
            f"its arrays held in several places ({_ties_text(saved_ties)}) are not the model's "
            f"({_ties_text(model_ties)}); load it into a model built as the saved one was"
        )


def _ties_text(ties):
    return ", ".join(f"{k} is {v}" for k, v in sorted(ties.items())) or "none"


def _array_names(archive, value):
    """`(member, dtype)` for each array an encoded value (`_encode`) refers to; the dtype's
    name where it is stored as bits (bfloat16), else None."""
    if isinstance(value, dict) and "array" in value:
        dtype = value.get("dtype")
        if not isinstance(value["array"], str) or not isinstance(dtype, (str, type(None))):
            raise archive.error(f"its description names an array {value!r}")
        yield value["array"], dtype
    elif isinstance(value, dict) and "tuple" in value and isinstance(value["tuple"], list):
        for v in value["tuple"]:
            yield from _array_names(archive, v)


def _fill_model(archive, model, entries, arrays):
    from ..nn.placement import asarray, lossy_cast

    loaded = {}

    def fill(p, x):
        key, template = p or "_", data(x)
        if not is_array(template):
            return x
        entry = entries[key]
        if "same_as" in entry:
            return loaded[entry["same_as"]]
        values = arrays[entry["array"]]
        why = lossy_cast(values, template.dtype)
        if why is not None:
            raise archive.error(f"its array {key} does not fit the model: {why}")
        loaded[key] = asarray(
            values, xp=namespace_of(template), device=device_of(template), dtype=template.dtype
        )
        return loaded[key]

    return tree_map_with_path(fill, model)


def _fill_state(archive, model, entries, arrays, saved_dtypes):
    leaves = {}

    def make(p, x):
        key = p or "_"
        entry = entries.get(key)
        if entry is None:
            return None
        if "same_as" not in entry:
            rule, state = (_decode(entry[k], arrays, x) for k in ("rule", "state"))
            kept = _check_leaf(key, rule, state, entry["frozen"], data(x))
            state = _following(state, kept, saved_dtypes.get(key), archive, key)
            leaves[key] = Leaf(rule, state, entry["frozen"])
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
    kind = _TYPES[value["type"]]
    fields = {k: _decode(v, arrays, like) for k, v in value["fields"].items()}
    expected = {f.name: f.default for f in dataclasses.fields(kind) if f.init}
    # a field added since the checkpoint was written takes its default
    added = {k: v for k, v in expected.items() if k not in fields}
    fields.update({k: v for k, v in added.items() if v is not dataclasses.MISSING})
    if set(fields) != set(expected):
        raise ValueError(f"{kind.__name__} has the fields {sorted(expected)}, not {sorted(fields)}")
    for name, default in expected.items():
        if default is not dataclasses.MISSING and not _alike(fields[name], default):
            raise ValueError(f"{kind.__name__}.{name} is {fields[name]!r}, not like {default!r}")
    return kind(**fields)


def _check_leaf(key, rule, state, frozen, template):
    """Refuse a parameter's decoded optimiser state unless it is what its rule makes: the
    structure, numbers and array shapes of `rule.init` for the parameter."""
    if not isinstance(rule, rules.Rule) or not isinstance(frozen, bool):
        raise ValueError(f"the state of {key} has the rule {rule!r} (frozen {frozen!r})")
    kept = fresh_state(rule, template)  # float32 moments for a half-precision parameter
    if not _alike(state, kept, shapes=True):
        raise ValueError(f"the state of {key} is not what {type(rule).__name__} keeps")
    return kept


def _following(state, kept, saved, archive, key):
    """The state's arrays of the saved parameter's dtype `saved` in the dtypes of `kept`, the
    rule's fresh state for the model's parameter: a float64 run loaded into a float32 model
    keeps its moments in float32, as its parameters (a float64 step count, or float32 moments
    of half-precision parameters, stay as saved). A cast that would change more than the
    rounding (a moment beyond float32's range become inf) is refused, as the model's is."""
    from ..nn.placement import lossy_cast, to_numpy

    if isinstance(state, tuple):
        return tuple(_following(v, k, saved, archive, key) for v, k in zip(state, kept))
    if is_array(state) and is_array(kept):  # dtypes by name: `saved` is NumPy's
        name = dtype_name(state.dtype)
        if name == dtype_name(saved) != dtype_name(kept.dtype):
            why = lossy_cast(to_numpy(state), kept.dtype)
            if why is not None:
                raise archive.error(f"the optimiser state of {key} does not fit the model: {why}")
            return namespace_of(state).astype(state, kept.dtype)
    return state


def _alike(value, like, shapes=False):
    """Whether `value` has the kind of `like`: both None, bools, numbers, strings, rules, or
    tuples of alike items; arrays (of the same shape with `shapes`)."""
    if like is None:
        return value is None or not shapes  # a field that defaults to None takes anything
    if isinstance(like, (bool, str)):
        return type(value) is type(like)
    if isinstance(like, (int, float)):  # a count: a number, or a 0-d array (a step that
        # chose it on the device without reading it back: LossScale.placed)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number or (is_array(value) and tuple(value.shape) == ())
    if isinstance(like, tuple):
        return (
            isinstance(value, tuple)
            and len(value) == len(like)
            and all(_alike(v, w, shapes) for v, w in zip(value, like))
        )
    if is_array(like) and tuple(like.shape) == () and type(value) in (int, float):
        return True  # a step count, saved as a number before counts were kept in arrays
    if is_array(like):
        return is_array(value) and (not shapes or tuple(value.shape) == tuple(like.shape))
    return not isinstance(value, (type(None), bool, int, float, str, tuple))  # a rule, a schedule


def _check_fits(path, what, saved, expected, archive):
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    if missing or extra:
        raise archive.error(
            f"does not fit the model: its {what} miss {missing or 'nothing'} and have "
            f"{extra or 'nothing'} more; build the model the way the saved one was built"
        )
