"""Nested structures for the optimisers: tuples, lists, dicts, named tuples and dataclasses.

`tree_map_with_path(fn, tree, *rest)` maps the leaves with their place in the tree
("layers.0.weight") and checks that the other trees have the same structure, naming the place
where they differ.
A dataclass field declared with `metadata={"trainable": False}` (a layer's running statistics,
say) holds arrays that are part of the model but not optimised: `trainable(cls)` lists the others.

>>> tree_map_with_path(lambda path, x: f"{path}={x}", {"a": [1, 2], "b": 3})
{'a': ['a.0=1', 'a.1=2'], 'b': 'b=3'}
"""

import copy
import dataclasses

from ..backend import is_array
from ..pytree import TypeTable
from ..tracked import data

__all__ = ["tree_map_with_path", "structure", "trainable", "name", "SEQUENCE", "DICT"]


class Structure:
    """How to list and rebuild the children of one container type."""

    def __init__(self, keys, values, rebuild, trainable=None):
        self.keys, self.values, self.rebuild = keys, values, rebuild
        self.trainable = trainable  # the keys an optimiser updates (None: all)


def _rebuild_dataclass(tree, keys, values):
    if hasattr(tree, "__dict__") and not hasattr(type(tree), "__slots__"):
        out = object.__new__(type(tree))  # a shallow copy, faster than copy.copy
        fields = out.__dict__
        fields.update(tree.__dict__)
        fields.update(zip(keys, values))  # as object.__setattr__ would, frozen or not
        return out
    out = copy.copy(tree)
    for key, value in zip(keys, values):
        object.__setattr__(out, key, value)
    return out


DICT = Structure(
    lambda t: list(t),
    lambda t, keys: [t[k] for k in keys],
    lambda t, keys, values: type(t)(zip(keys, values)),
)
SEQUENCE = Structure(
    lambda t: range(len(t)),
    lambda t, keys: list(t),
    lambda t, keys, values: type(t)(values),
)
_NAMEDTUPLE = Structure(
    lambda t: range(len(t)),
    lambda t, keys: list(t),
    lambda t, keys, values: type(t)(*values),
)
_STRUCTURES = TypeTable()


def _dataclass_structure(cls):
    fields = dataclasses.fields(cls)
    names = tuple(f.name for f in fields)
    frozen = {f.name for f in fields if f.metadata.get("trainable", True) is False}
    return Structure(
        lambda t: names,
        lambda t, keys: [getattr(t, k) for k in keys],
        _rebuild_dataclass,
        frozenset(names) - frozen if frozen else None,
    )


def structure(cls):
    """The `Structure` of a container type, or None for a leaf (cached by type)."""
    try:
        return _STRUCTURES[cls]
    except KeyError:
        pass
    if issubclass(cls, dict):
        found = DICT
    elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
        found = _NAMEDTUPLE
    elif issubclass(cls, (tuple, list)):
        found = SEQUENCE
    elif dataclasses.is_dataclass(cls):
        found = _dataclass_structure(cls)
    else:
        found = None
    _STRUCTURES[cls] = found
    return found


def trainable(cls):
    """The fields of dataclass `cls` that an optimiser updates (None: every field)."""
    found = structure(cls)
    return None if found is None else found.trainable


def tree_map_with_path(fn, tree, *rest, is_leaf=None, names=None):
    """`fn(path, leaf, *matching leaves of rest)` over the leaves of `tree`, keeping its shape.

    Containers are tuples, lists, dicts, named tuples and dataclasses; paths join field names,
    keys and positions with dots ("layers.0.weight"; "" for `tree` itself). A None in `rest`
    where `tree` has a container stands for None at each of its leaves. A structure of `rest`
    that does not match raises ValueError naming the place (`names` names the trees).
    """
    return _map(fn, tree, rest, is_leaf, names, ())


def _map(fn, tree, rest, is_leaf, names, path):
    found = None if is_leaf is not None and is_leaf(tree) else structure(type(tree))
    if found is None:
        return fn(name(path, ""), tree, *rest)
    keys = found.keys(tree)
    matched = [matching(tree, o, keys, found, path, names, i + 1) for i, o in enumerate(rest)]
    values = [
        _map(fn, child, [m[k] for m in matched], is_leaf, names, (path, key))
        for k, (key, child) in enumerate(zip(keys, found.values(tree, keys)))
    ]
    return found.rebuild(tree, keys, values)


def matching(tree, other, keys, found, path, names, index):
    """The children of `other` in the order of `tree`'s (Nones for a None), checking that the
    two structures match."""
    if other is None:
        return [None] * len(keys)
    same = type(other) is type(tree) or (found is SEQUENCE and structure(type(other)) is SEQUENCE)
    if same and found is DICT:
        same = other.keys() == tree.keys()
    elif same and found in (SEQUENCE, _NAMEDTUPLE):
        same = len(other) == len(tree)
    if not same:
        first, second = (names[0], names[index]) if names else ("tree", f"tree {index + 1}")
        raise ValueError(
            f"mismatched structures at {name(path)}: the {first} has {_kind(tree)}, the "
            f"{second} has {_kind(other)}; pass a {second} made for this {first}"
        )
    return found.values(other, keys)


def name(path, top="the top level"):
    """ "layers.0.weight" from the chain `((((), "layers"), 0), "weight")`."""
    parts = []
    while path:
        path, key = path
        parts.append(str(key))
    return ".".join(reversed(parts)) or top


def arrays_by_path(model):
    """`{path: array}` for every array of `model` (a tracked one's value), paths like
    "layers.0.weight" ("_" for `model` itself); two places of one path are refused."""
    found = {}

    def record(path, x):
        if is_array(data(x)):
            put_once(found, path or "_", data(x))
        return x

    tree_map_with_path(record, model)
    return found


def put_once(found, key, value):
    """`found[key] = value` for a file's member named by a path: refused where two places of a
    model have one path (`{"a.b": x, "a": {"b": y}}`, or the keys 0 and "0"), which a file
    would keep one array of."""
    if key in found:
        raise ValueError(
            f"two places of the model have the path {key!r} (a key with a dot in it, or keys "
            "that differ only in type): a file names its arrays by path and would keep one of "
            "them; rename one of the keys"
        )
    found[key] = value


def _kind(x):
    if isinstance(x, dict):
        return f"a {type(x).__name__} with keys {sorted(map(str, x))}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    if is_array(data(x)):
        return f"an array of shape {tuple(data(x).shape)}"
    return f"a {type(x).__name__}"
