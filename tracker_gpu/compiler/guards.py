"""What a recording read besides its arguments, checked before every replay: its guards.

A recording fixes every value `f` reads from outside its arguments: a global `scale = 2.0`
multiplied in is a constant of the program. So, once a recording is made, `guards_of` lists
what the function's code reads from its globals and closure cells, its default arguments and
a partial's, what the user functions it reads there read (to a depth of `DEPTH`), and the
attributes that code reads from a bound method's `self`, from objects and user classes found
there or passed as arguments keyed by identity in the signature, the methods and properties it
names on them looked into as functions, and what the user functions and objects inside the
containers and dataclasses found read (`_Collector.look_into`). Where the code reads
attributes by name (`getattr`, `vars`), its string constants count as names read. Each is
guarded by what decides the program:

- a Python number, string, `None`, NumPy scalar, or tuple of those: its value (by its bits: a
  float's `-0.0` is not `0.0`);
- an array (any library's): its identity, shape and dtype;
- a dict, list or tuple of at most 256 items, nested ones counted (`{"lr": 0.1}`,
  `{"optimiser": {"lr": 0.1}}`): its identity and its items (numbers and strings by value,
  nested containers item by item, dataclasses by their fields, anything else by identity); a
  larger one by its identity alone, with a warning (a tuple of numbers is a value, above);
- a dataclass (a layer, a model, a config): its identity and its fields all the way down (numbers
  by value, arrays by identity, shape and dtype);
- anything else (a function, a dict): its identity.

The library's own modules and functions, and those of installed packages and the standard
library, are not looked into: what they read is theirs. `Guards.holds()` is the check a replay
runs first; a failing guard makes the compiled function record anew (`__init__.py`).

>>> import numpy as np
>>> scale = 2.0
>>> def f(x):
...     return x * scale
>>> guards = guards_of(f, (np.ones(2),))
>>> guards.names, guards.holds()
(['scale'], True)
>>> scale = 5.0
>>> guards.holds(), guards.failing()
(False, 'scale')
"""

import argparse
import dataclasses
import dis
import functools
import os
import random as _random
import sys
import sysconfig
import types

import numpy as np

from .. import backend
from .signature import VALUES, signature_and_arrays

__all__ = ["Guards", "guards_of", "DEPTH", "ITEMS_MAX"]

DEPTH = 3  # how deep functions read from globals and closures are looked into
_MISSING = object()  # a name no longer bound
# by identity, value, array, identity and items, identity and fields all the way down
_SAME, _VALUE, _ARRAY, _ITEMS, _FIELDS = range(5)
ITEMS_MAX = 256  # a container of more items, nested ones' counted, is guarded by identity
_CONTAINERS = (dict, list, tuple)  # guarded item by item
_GLOBAL_READS = frozenset(("LOAD_GLOBAL", "LOAD_NAME"))
_ATTRIBUTE_READS = frozenset(("LOAD_ATTR", "LOAD_METHOD"))


class Guards:
    """The reads of one recording, and their values then: `holds()` while all are the same.
    `names` says what each guard reads (`scale`, `cfg.scale`); `random` names the NumPy
    generators (or `np.random`) the recorded code reads, whose draws a replay repeats;
    `by_identity` the dicts, lists and tuples too large to compare item by item."""

    __slots__ = ("entries", "names", "random", "by_identity", "aliases", "_seen")

    def __init__(self):
        self.entries = []  # (source: a dict or a cell, name or None for a cell, value, kind, key)
        self.names = []
        self.random = []
        self.by_identity = []
        self.aliases = []  # (position among the arguments' arrays, the array, its guard's name)
        self._seen = set()

    def holds(self, arrays=None):
        """Whether every value guarded is still the one the recording read, and, given the
        call's `arrays`, each argument that was a guarded array then is that array again."""
        for source, name, value, kind, key in self.entries:
            now = source.get(name, _MISSING) if name is not None else _contents(source)
            if now is value:
                if kind == _ARRAY and (now.shape != key[0] or now.dtype != key[1]):
                    return False
                if kind == _ITEMS and _items_key(now) != key:
                    return False
                if kind == _FIELDS and _fields_key(now) != key:
                    return False
            elif kind != _VALUE or _value_key(now) != key:
                return False
        if arrays is not None:
            for position, array, _ in self.aliases:
                if arrays[position] is not array:
                    return False
        return True

    def note_aliases(self, arrays):
        """Note the arguments' `arrays` (by position) that are arrays a guarded value holds
        (`x0` read as a global and given as the argument): the recording cannot tell the two
        apart, and reads both as the argument, so it holds only where that argument is
        that array again (`holds`)."""
        given = {id(a): k for k, a in enumerate(arrays)}
        for (_, _, value, _, _), label in zip(self.entries, self.names):
            for array in _arrays_in(value):
                position = given.get(id(array))
                if position is not None:
                    self.aliases.append((position, array, label))

    def failing(self, arrays=None):
        """The name of the first guard that does not hold (None when all do)."""
        return next(iter(self.changed(arrays)), None)

    def changed(self, arrays=None):
        """The names of the guards that do not hold (an aliased argument's, given `arrays`)."""
        found = []
        for entry, name in zip(self.entries, self.names):
            probe = Guards()
            probe.entries = [entry]
            if not probe.holds():
                found.append(name)
        if arrays is not None:
            found += [f"{label} (given as an argument when recorded)"
                      for position, array, label in self.aliases
                      if arrays[position] is not array]  # fmt: skip
        return found

    def add(self, source, name, value, label):
        """Guard `source[name]` (a cell's contents when `name` is None), now `value`."""
        if (id(source), name) in self._seen:
            return False
        self._seen.add((id(source), name))
        kind, key = _kind(value)
        if kind == _SAME and type(value) in _CONTAINERS:
            self.by_identity.append(label)
        self.entries.append((source, name, value, kind, key))
        self.names.append(label)
        return True

    def __len__(self):
        return len(self.entries)

    def __repr__(self):
        return f"<Guards on {', '.join(self.names) or 'nothing'}>"


def guards_of(f, args=(), kwargs=None):
    """The guards of a recording of `f(*args, **kwargs)` (see the module's docstring): what `f`
    reads from its globals and closure, and the attributes its code reads from the hashable
    objects among the arguments."""
    collector = _Collector()
    collector.function(f, 0)
    collector.look_into((args, kwargs or {}), "an argument", 0)
    return collector.guards


class _Collector:
    """The walk of `guards_of`: each function once."""

    def __init__(self):
        self.guards = Guards()
        self.attribute_names = set()
        self._functions = set()

    def function(self, fn, depth):
        """Guard what `fn` reads from its globals and closure (a user function, a bound
        method of one, an object whose class defines `__call__` in user code, a partial of
        one: its arguments too), and its default arguments."""
        if isinstance(fn, functools.partial):
            self.given(dict(enumerate(fn.args)), "partial", depth)
            self.given(fn.keywords, "partial", depth)
        fn, owner = _unwrapped(fn)
        if fn is None or id(fn) in self._functions or _in_library(fn.__code__.co_filename):
            return
        self._functions.add(id(fn))
        names, attributes = _reads(fn.__code__)
        self.attribute_names |= attributes
        self.given(dict(enumerate(fn.__defaults__ or ())), f"{fn.__name__}'s default", depth)
        self.given(fn.__kwdefaults__ or {}, f"{fn.__name__}'s default", depth)
        for name in names:
            if name in fn.__globals__:
                self.value(fn.__globals__, name, fn.__globals__[name], name, attributes, depth)
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            value = _contents(cell)
            if value is not _MISSING:
                self.value(cell, None, value, name, attributes, depth)
        if owner is not None:
            self.attributes(owner, attributes, "self", depth + 1)

    def class_functions(self, cls):
        """Guard what the methods of a user's class read from their globals and closures: its
        `__call__`, and those that the code looked into names (`model.loss(x)`), until no new
        name comes up. The instance's own attributes are not guarded here: its signature
        describes them (a dataclass argument), and the next call's instance is another object."""
        members = {}
        for klass in reversed(cls.__mro__):  # a subclass's own member wins
            if _users_class(klass):
                members.update(vars(klass))
        followed = set()
        while True:
            names = [
                name
                for name in members
                if name not in followed and (name == "__call__" or name in self.attribute_names)
            ]
            if not names:
                return
            for name in names:
                followed.add(name)
                member = members[name]
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                if isinstance(member, types.FunctionType):
                    self.function(member, 1)

    def look_into(self, tree, label, depth):
        """Guard what the user code inside `tree` reads (the arguments, or a container or a
        dataclass read from outside them, a model whose layers are the user's): the functions
        and objects there keyed by identity, and the classes of its dataclasses; note the
        generators there, whose draws a replay repeats."""
        objects, classes, generators = _identity_keyed(tree)
        self.guards.random.extend(f"{label}'s generator ({type(g).__name__})" for g in generators)
        for cls in classes:  # first: the attribute names their methods read count below
            self.class_functions(cls)
        for x in objects:
            self.function(x, depth)  # a function, or the `__call__` of an object's class
        for x in objects:
            if _plain_object(x):
                self.attributes(x, self.attribute_names, type(x).__name__, depth)

    def given(self, values, label, depth):
        """Guard the arguments a function is given besides the call's (defaults, a partial's):
        a dict of them, read as they were then (their items, where they are containers)."""
        for name, value in values.items():
            if _kind(value)[0] != _SAME:
                self.guards.add(values, name, value, f"{label} {name}")

    def value(self, source, name, value, label, attributes, depth):
        """Guard one value read, and look into it: a function's reads, an object's attributes
        that the reading code names."""
        if isinstance(value, types.ModuleType):  # not rebound in practice: its attributes
            if not _in_library(getattr(value, "__file__", None)):
                self.attributes(value, attributes, label, depth + 1, leaves_only=True)
            elif value is np.random or value is _random:
                self.guards.random.append(label)
            elif value is np and "random" in attributes:
                self.guards.random.append(f"{label}.random")
            return
        if not self.guards.add(source, name, value, label):
            return
        if _is_generator(value):
            self.guards.random.append(label)
        elif _structure(value):
            self.look_into(value, label, depth + 1)
        elif depth < DEPTH and callable(value) and not isinstance(value, type):
            self.function(value, depth + 1)
        elif depth < DEPTH and (_plain_object(value) or _users_class(value)):
            self.attributes(value, attributes, label, depth + 1)

    def attributes(self, x, attributes, label, depth, leaves_only=False):
        """Guard the attributes of `x` that the reading code names (a module's: only numbers,
        strings and arrays, the settings a config module holds)."""
        found = getattr(x, "__dict__", None)
        if type(found) is not dict and not isinstance(x, type):  # a class's: a mappingproxy
            return
        for name in sorted(attributes & found.keys()):
            value = found[name]
            if isinstance(value, (staticmethod, classmethod)):  # `Helper.act(x)`: its reads
                value = value.__func__
            if isinstance(value, types.FunctionType) and depth < DEPTH:
                self.function(value, depth + 1)  # a module's or a class's function
            if leaves_only and _kind(value)[0] == _SAME and not _settings(value):
                continue  # a module's functions, classes and modules are guarded where read
            if not self.guards.add(found, name, value, f"{label}.{name}"):
                continue
            if _is_generator(value):
                self.guards.random.append(f"{label}.{name}")
            elif depth < DEPTH and _plain_object(value):
                self.attributes(value, attributes, f"{label}.{name}", depth + 1)  # `self.cfg.lr`
            elif depth < DEPTH and _structure(value):
                self.look_into(value, f"{label}.{name}", depth + 1)  # `self.layers[0].s`
        if not leaves_only and depth < DEPTH and not isinstance(x, type):
            self.methods(x, attributes - found.keys(), depth)

    def methods(self, x, names, depth):
        """Look into the methods and properties of `x`'s class (user code) that the reading
        code names (`self.forward(x)`, `config.scale` as a property): what they read."""
        for name in sorted(names):
            member = getattr(type(x), name, None)
            if isinstance(member, property) and member.fget is not None:
                self.function(types.MethodType(member.fget, x), depth + 1)
            elif isinstance(member, types.FunctionType):
                self.function(types.MethodType(member, x), depth + 1)
            elif _kind(member)[0] != _SAME and _users_class(_holder(type(x), name)):
                # a class attribute read through an instance (`self.scale`): guarded where it
                # lives, and against one of the instance's own shadowing it later
                label = f"{type(x).__name__}.{name}"
                self.guards.add(vars(_holder(type(x), name)), name, member, label)
                self.guards.add(vars(x), name, _MISSING, f"{label} (on the instance)")


def _holder(cls, name):
    """The class of `cls`'s order of resolution that holds the attribute `name` itself."""
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name bound later)
        return _MISSING


def _kind(value):
    """`(kind, key)`: how `value` is guarded, and what is compared."""
    key = _value_key(value)
    if key is not None:
        return _VALUE, key
    if type(value) in _CONTAINERS:  # a tuple of numbers is a value, above
        key = _items_key(value)
        return (_SAME, None) if key is None else (_ITEMS, key)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        key = _fields_key(value)
        return (_SAME, None) if key is None else (_FIELDS, key)
    if not backend.is_array(value):
        return _SAME, None
    return _ARRAY, (value.shape, value.dtype)


def _arrays_in(value):
    """The arrays a guarded value is or holds (in containers and dataclasses)."""
    if backend.is_array(value):
        return [value]
    if type(value) not in _CONTAINERS and not (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        return []
    try:
        return signature_and_arrays(value)[1]
    except (TypeError, RecursionError):  # a tracked array inside, a cycle
        return []


def _fields_key(x):
    """What decides a dataclass read from outside the arguments (a global model, its layers
    changed in place: `model.layers[1].active = False`): its fields all the way down, as the
    signature describes arguments, and its arrays by identity; None where it cannot say."""
    try:
        key, arrays = signature_and_arrays(x)
    except (TypeError, RecursionError):  # a tracked array inside (a parameter), a cycle
        return None
    return key, tuple(_Same(a) for a in arrays)


def _items_key(items):
    """What decides a dict, list or tuple of numbers, strings, arrays, dataclasses and such
    containers (`{"lr": 0.1}`, `{"optimiser": {"lr": 0.1}}`): its keys, and each item as
    `_kind` guards it, nested containers item by item; None past `ITEMS_MAX` items in all."""
    try:
        return _items_within(items, [ITEMS_MAX], 0)
    except _TooLarge:
        return None


class _TooLarge(Exception):
    """A container with more items than a guard compares (or nested deeper)."""


def _items_within(items, budget, depth):
    budget[0] -= len(items)
    if budget[0] < 0 or depth > DEPTH:
        raise _TooLarge
    pairs = items.items() if type(items) is dict else enumerate(items)
    found = []
    for name, value in pairs:
        key = _value_key(value)
        if key is None:  # an array, a nested container, or another object (a function)
            if type(value) in _CONTAINERS:
                key = (type(value), _items_within(value, budget, depth + 1))
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                key = (_Same(value), _fields_key(value))  # a config in a list: its fields
            elif backend.is_array(value):
                key = (_Same(value), value.shape, value.dtype)
            else:
                key = _Same(value)
        found.append((name, key))
    return tuple(found)


class _Same:
    """An array in a guard's key, compared by identity (and held)."""

    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is _Same and other.x is self.x

    __hash__ = None


def _value_key(x):
    """What decides a value guarded by value (None for what is not): its type and its bits."""
    kind = type(x)
    if kind is float:
        return kind, x.hex()
    if kind is complex:
        return kind, x.real.hex(), x.imag.hex()
    if kind in VALUES:
        return kind, x
    if isinstance(x, np.generic):
        return kind, x.dtype.str, x.tobytes()
    if kind is tuple and len(x) <= 16:
        keys = tuple(_value_key(v) for v in x)
        return None if None in keys else (kind, keys)
    return None


@functools.lru_cache(maxsize=1024)
def _reads(code):
    """`(global names, attribute names)` that `code` (and the code nested in it) reads; where
    it reads attributes by name (`getattr(self, "w1")`, `vars(cfg)["k"]`), the names among its
    string constants count too."""
    names, attributes, strings = set(), set(), set()
    stack = [code]
    while stack:
        top = stack.pop()
        for instruction in dis.get_instructions(top):
            if instruction.opname in _GLOBAL_READS:
                names.add(instruction.argval)
            elif instruction.opname in _ATTRIBUTE_READS:
                attributes.add(instruction.argval)
        stack.extend(c for c in top.co_consts if isinstance(c, types.CodeType))
        strings.update(_identifiers(top.co_consts))
    if names & _BY_NAME or "__dict__" in attributes:
        attributes |= strings
    return tuple(sorted(names)), frozenset(attributes)


_BY_NAME = frozenset(("getattr", "vars", "hasattr", "attrgetter"))  # reads of attributes by name


def _identifiers(constants):
    """The strings among `constants` (and the tuples and frozensets there) that could name an
    attribute."""
    for c in constants:
        if type(c) is str and c.isidentifier():
            yield c
        elif type(c) in (tuple, frozenset):
            yield from _identifiers(c)


def _unwrapped(fn):
    """`(function, its self or None)` for a function, a bound method, an object with a
    `__call__` of its own, a `functools.partial` of one, a decorator's wrapper that names what
    it wraps (`__wrapped__`: `functools.lru_cache`); `(None, None)` for anything else."""
    if isinstance(fn, functools.partial):
        fn = fn.func
    while not isinstance(fn, types.FunctionType) and callable(getattr(fn, "__wrapped__", None)):
        fn = fn.__wrapped__  # a decorator's wrapper (`functools.lru_cache`)
    owner = None
    if isinstance(fn, types.MethodType):
        fn, owner = fn.__func__, fn.__self__
    elif not isinstance(fn, types.FunctionType):
        # a class of the user's own, or a base's
        call = next((vars(k)["__call__"] for k in type(fn).__mro__ if "__call__" in vars(k)), None)
        fn, owner = (call, fn) if isinstance(call, types.FunctionType) else (None, None)
    if not isinstance(fn, types.FunctionType):
        return None, None
    return fn, owner


def _plain_object(x):
    """An instance of a user class whose attributes the reading code may name."""
    return type(getattr(x, "__dict__", None)) is dict and not isinstance(
        x, (type, types.FunctionType, types.MethodType)
    )


def _users_class(x):
    """A class defined in the user's code (its attributes are settings: `Config.scale`)."""
    if not isinstance(x, type):
        return False
    module = sys.modules.get(x.__module__)
    return module is not None and not _in_library(getattr(module, "__file__", None))


def _structure(x):
    """A container or a dataclass instance: what `_Collector.look_into` looks into."""
    return type(x) in _CONTAINERS or (dataclasses.is_dataclass(x) and not isinstance(x, type))


def _settings(x):
    """An object whose attributes are settings (a user class's instance, or a namespace:
    `argparse.Namespace`, `types.SimpleNamespace`)."""
    return _plain_object(x) and (_users_class(type(x)) or type(x) in _NAMESPACES)


_NAMESPACES = (argparse.Namespace, types.SimpleNamespace)


def _is_generator(x):
    """A NumPy generator or Python's, or one's bound method (`from numpy.random import
    normal`, `random.random`)."""
    kinds = (np.random.Generator, np.random.RandomState, _random.Random)
    return isinstance(x, kinds) or isinstance(getattr(x, "__self__", None), kinds)


def _identity_keyed(tree):
    """`(objects, classes, generators)`: the objects in `tree` that a signature keys by
    identity (functions, bound methods, plain objects whose hash is the default one or none:
    a namespace), guarded through what their code reads; the classes of the dataclasses
    among them, whose functions are looked into; and the generators there, but those of the
    library's layers (which draw anew)."""
    found, classes, generators, stack = [], {}, [], [tree]
    while stack:
        x = stack.pop()
        kind = type(x)
        if kind in VALUES or backend.is_array(x) or isinstance(x, type):
            continue
        if _is_generator(x):
            generators.append(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (tuple, list)):
            stack.extend(x)
        elif dataclasses.is_dataclass(x):
            classes[kind] = None
            fields = [getattr(x, f.name) for f in dataclasses.fields(x)]
            own = getattr(x, "__dict__", {}).items()  # attributes that are not fields too
            fields += [v for k, v in own if k not in x.__dataclass_fields__]
            users = _users_class(kind)
            stack.extend(v for v in fields if users or not _is_generator(v))
        elif isinstance(x, types.MethodType) or (
            kind.__hash__ in (object.__hash__, None)
            and (isinstance(x, types.FunctionType) or _plain_object(x))
        ):
            found.append(x)
    return found, list(classes), generators


_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# read once here: sysconfig fills its tables lazily, which threads recording at once for the
# first time raced ("dictionary changed size during iteration")
_PATHS = sysconfig.get_paths()
_ROOTS = [_OWN] + [
    _PATHS[k].rstrip(os.sep) + os.sep
    for k in ("stdlib", "platstdlib", "purelib", "platlib")
    if k in _PATHS
]


@functools.cache
def _in_library(path):
    """Whether the source file `path` is tracker_gpu's, the standard library's or an installed
    package's (None: a built-in module): code that `f` does not own, not looked into."""
    if path is None:
        return True
    if path.startswith("<"):  # typed in, or made by exec
        return False
    path = os.path.abspath(path)
    return any(path.startswith(root) for root in _ROOTS)
