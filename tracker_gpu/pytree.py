"""Nested structures: tuples, lists, dicts, named tuples and dataclasses, mapped leaf by leaf.

>>> tree_map(lambda x: x * 2, {"a": (1, 2), "b": [3]})
{'a': (2, 4), 'b': [6]}
"""

import copy
import dataclasses
import sys

__all__ = ["tree_map", "tree_leaves", "is_container"]


def is_container(x):
    return isinstance(x, (tuple, list, dict)) or (
        dataclasses.is_dataclass(x) and not isinstance(x, type)
    )


def tree_map(fn, tree, *rest):
    """Apply `fn` to each leaf of `tree` (and the matching leaves of `rest`), keeping the shape.

    A structure that contains itself, or is nested deeper than Python's recursion allows,
    raises a ValueError that says where."""
    try:
        return _map(fn, tree, *rest)
    except RecursionError:
        problem = _cycle_or_depth(tree)
        if problem is None:  # the recursion was fn's own
            raise
        raise ValueError(problem) from None


def _map(fn, tree, *rest):
    if not rest:
        return _map_one(fn, tree)
    for other in rest:
        _check_same_structure(tree, other)
    if isinstance(tree, dict):
        return _rebuilt(tree, [(k, _map(fn, v, *(r[k] for r in rest))) for k, v in tree.items()])
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(_map(fn, *items) for items in zip(tree, *rest)))
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map(fn, *items) for items in zip(tree, *rest))
    names = _dataclass_fields(type(tree))
    if names is not None:
        out = _shallow_copy(tree)
        for name in names:
            values = [getattr(t, name) for t in (tree, *rest)]
            object.__setattr__(out, name, _map(fn, *values))
        return out
    return fn(tree, *rest)


def _map_one(fn, tree):
    """`_map` of one tree, each type's kind of container looked up once: the common case
    (every gradient pass maps the model's parameters in and its gradients out)."""
    kind = type(tree)
    how = _KINDS.get(kind)
    if how is None:
        how = _KINDS[kind] = _kind_of(kind)
    if how is _LEAF:
        return fn(tree)
    if how is _DICT:
        return {k: _map_one(fn, v) for k, v in tree.items()}
    if how is _DICT_SUBCLASS:
        return _rebuilt(tree, [(k, _map_one(fn, v)) for k, v in tree.items()])
    if how is _NAMED:
        return kind(*[_map_one(fn, v) for v in tree])
    if how is _SEQUENCE:
        return kind([_map_one(fn, v) for v in tree])
    out = _shallow_copy(tree)
    for name in how:  # a dataclass: its field names
        object.__setattr__(out, name, _map_one(fn, getattr(tree, name)))
    return out


class TypeTable(dict):
    """A table of what was found once per type (how to map, describe or copy its instances).
    A class made at run time, a named tuple or dataclass defined inside a function called at
    every step, would be kept alive by such a table forever: past `MAX` types it starts again.

    >>> table = TypeTable()
    >>> table[int] = "leaf"; table.get(int)
    'leaf'
    """

    MAX = 1024

    def __setitem__(self, kind, found):
        if len(self) >= self.MAX:
            self.clear()
        super().__setitem__(kind, found)


_LEAF, _DICT, _DICT_SUBCLASS = "leaf", "dict", "dict subclass"
_NAMED, _SEQUENCE = "named tuple", "sequence"
_KINDS = TypeTable()  # type -> one of the above, or a dataclass's field names


def _kind_of(kind):
    if kind is dict:
        return _DICT
    if issubclass(kind, dict):
        return _DICT_SUBCLASS
    if issubclass(kind, tuple) and hasattr(kind, "_fields"):
        return _NAMED
    if issubclass(kind, (tuple, list)):
        return _SEQUENCE
    names = _dataclass_fields(kind)
    return _LEAF if names is None else names


def _rebuilt(tree, pairs):
    """A dict like `tree` holding `pairs`. A subclass (OrderedDict, defaultdict, Counter, a
    user's) is not built from the pairs, which its constructor may read otherwise (a Counter
    counts them, a defaultdict takes a default factory first) or not take at all: it is a copy
    of `tree` (its type, its attributes, a defaultdict's factory) emptied, each pair then set
    as an item."""
    if type(tree) is dict:
        return dict(pairs)
    try:
        out = copy.copy(tree)
        out.clear()
        for k, v in pairs:
            out[k] = v
    except Exception as e:
        raise TypeError(
            f"cannot rebuild a {type(tree).__name__} (a dict subclass) with new values: copying "
            f"it, emptying it and setting its items failed ({type(e).__name__}: {e}); pass a "
            "plain dict"
        ) from e
    return out


def _children(x):
    """`[(label, child)]` of a container, the label as it would be written after its path."""
    if isinstance(x, dict):
        return [(f"[{k!r}]", v) for k, v in x.items()]
    if isinstance(x, (tuple, list)):
        return [(f"[{i}]", v) for i, v in enumerate(x)]
    return [(f".{name}", getattr(x, name)) for name in _dataclass_fields(type(x)) or ()]


def _cycle_or_depth(tree):
    """What makes `tree` too deep to map (a cycle, and where; or its depth), else None. An
    iterative walk: it must not recurse itself."""
    ancestors = {}  # id -> path, for the containers on the current path
    deepest = (0, "")
    stack = [(tree, "x", 0, False)]
    while stack:
        node, path, depth, leaving = stack.pop()
        if leaving:
            del ancestors[id(node)]
            continue
        if not is_container(node):
            continue
        if id(node) in ancestors:
            return (
                f"the structure contains itself: {path} is {ancestors[id(node)]} (a cycle); "
                "pass a structure without cycles (tracker_gpu maps every array inside it)"
            )
        ancestors[id(node)] = path
        deepest = max(deepest, (depth, path))
        stack.append((node, path, depth, True))
        stack.extend((child, path + label, depth + 1, False) for label, child in _children(node))
    depth, path = deepest
    if depth < sys.getrecursionlimit() // 4:
        return None
    where = path if len(path) <= 60 else path[:57] + "..."
    return (
        f"the structure is nested {depth + 1} levels deep (at {where}), too deep to map "
        "without exceeding Python's recursion limit; flatten it, e.g. hold the layers in one "
        "list instead of each inside the next"
    )


_FIELDS = TypeTable()


def _dataclass_fields(cls):
    """The field names of a dataclass type (cached: this runs for every node), else None."""
    if cls not in _FIELDS:
        is_dataclass = dataclasses.is_dataclass(cls)
        _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls)) if is_dataclass else None
    return _FIELDS[cls]


def _shallow_copy(obj):
    kind = type(obj)
    plain = _PLAIN.get(kind)
    if plain is None:
        plain = _PLAIN[kind] = hasattr(obj, "__dict__") and not hasattr(kind, "__slots__")
    if plain:
        out = object.__new__(kind)
        out.__dict__.update(obj.__dict__)
        return out
    return copy.copy(obj)


_PLAIN = TypeTable()  # type -> whether a copy of its __dict__ copies an instance


def tree_leaves(tree):
    """The leaves of `tree`, in order."""
    leaves = []
    tree_map(leaves.append, tree)
    return leaves


def _check_same_structure(a, b):
    if is_container(a) or is_container(b):
        same = type(a) is type(b) or (
            isinstance(a, (tuple, list))
            and isinstance(b, (tuple, list))
            and not hasattr(a, "_fields")
        )
        if not same or (isinstance(a, (tuple, list, dict)) and len(a) != len(b)):
            raise ValueError(
                f"mismatched structures: {type(a).__name__} of {_length(a)} and "
                f"{type(b).__name__} of {_length(b)}; pass a gradient shaped like the model"
            )
        if isinstance(a, dict) and a.keys() != b.keys():
            raise ValueError(f"mismatched dict keys: {_keys(a)} and {_keys(b)}")


def _keys(d):
    """The keys of the dict `d`, written with repr: sorted where they can be compared, else in
    their order (keys of mixed types)."""
    try:
        keys = sorted(d)
    except Exception:  # keys of types that do not compare
        keys = list(d)
    return "[" + ", ".join(repr(k) for k in keys) + "]"


def _length(x):
    return len(x) if isinstance(x, (tuple, list, dict)) else "fields"
