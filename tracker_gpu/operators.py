"""Python's operators on tracked arrays, bound to `TrackedArray` once the rules exist.

With a Python number on the other side there is nothing to check (no other array, library or
device), so `x * 2.0` records directly: the hottest path. The in-place operators (`x += y`)
rebind the tracked array `x` itself (every reference to it sees the new value), as NumPy's
in-place operators change the array.

>>> import numpy as np, tracker_gpu as tg
>>> x = tg.param(np.array([1.0, 2.0]))
>>> x += 1.0
>>> (x * 2.0).data
array([4., 6.])
"""

import operator as python_operator

import numpy as np

from .backend import SCALARS
from .cuda import dispatch
from .primitive import NOT_TRACKING, record, saved_values
from .recording import ACTIVE, is_data
from .rules.elementwise import (
    PLAIN_FUNCTIONS,
    add,
    divide,
    multiply,
    pow,
    pow_in_place,
    subtract,
)
from .rules.indexed import in_place_operator
from .tracked import TrackedArray, as_operand

__all__ = []

_NO_KEYWORDS = {}


def _operators(prim, plain=None):
    """`x op y` and `y op x` for tracked `x`; `plain`, Python's operator, where it is the rule's
    own forward (`x op y`, no namespace read) and no fused forward stands before it: called
    directly on the hot path (the rule's forward is one more Python call)."""
    left, right = prim.keeps(0b01), prim.keeps(0b10)  # what x op 2.0 and 2.0 op x keep
    both = prim.keeps(0b11)
    direct = plain is not None and prim.name not in dispatch.FORWARDS

    def operator(self, other):
        node = self._node
        if not NOT_TRACKING and node is not None and not (ACTIVE and is_data(node)):
            kind = type(other)  # recorded as eagerly while tg.compile records (`record`)
            if kind in SCALARS:
                x = self.data
                value = plain(x, other) if direct else prim.forward(self._xp, x, other)
                args = (node, other)
                saved = saved_values(left, value, (x, other), args) if left else None
                return record(value, self._xp, prim, args, _NO_KEYWORDS, saved)
            if (
                kind is TrackedArray
                and self._xp is other._xp is np
                and other._node is not None
                and not (ACTIVE and is_data(other._node))
            ):
                x, y = self.data, other.data  # two NumPy arrays: no library or device to check
                value = plain(x, y) if direct else prim.forward(np, x, y)
                args = (node, other._node)
                saved = saved_values(both, value, (x, y), args) if both else None
                return record(value, np, prim, args, _NO_KEYWORDS, saved)
        return prim(self, as_operand(self, other))  # a list: off the fast paths above

    def reflected(self, other):
        node = self._node
        if (
            type(other) in SCALARS
            and not NOT_TRACKING
            and node is not None
            and not (ACTIVE and is_data(node))
        ):
            x = self.data
            value = plain(other, x) if direct else prim.forward(self._xp, other, x)
            if type(value) is complex:  # `1j * x` of a NumPy float scalar: Python's complex
                value = np.complex128(value)
            args = (other, node)
            saved = saved_values(right, value, (other, x), args) if right else None
            return record(value, self._xp, prim, args, _NO_KEYWORDS, saved)
        return prim(as_operand(self, other), self)

    return operator, reflected


# each rule's forward is `x op y`, as Python's operator computes it
for _name, _prim in (("add", add), ("sub", subtract), ("mul", multiply), ("truediv", divide),
                     ("pow", pow)):  # fmt: skip
    _forward, _reflected = _operators(_prim, getattr(python_operator, _name))
    setattr(TrackedArray, f"__{_name}__", _forward)
    setattr(TrackedArray, f"__r{_name}__", _reflected)


def _bitwise(function):
    return (
        lambda self, other: PLAIN_FUNCTIONS[function](self, other),
        lambda self, other: PLAIN_FUNCTIONS[function](other, self),
    )


_BITWISE_OPERATORS = {
    "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor",
    "lshift": "bitwise_left_shift", "rshift": "bitwise_right_shift",
}  # fmt: skip

for _name, _function in _BITWISE_OPERATORS.items():
    _forward, _reflected = _bitwise(_function)
    setattr(TrackedArray, f"__{_name}__", _forward)
    setattr(TrackedArray, f"__r{_name}__", _reflected)

_IN_PLACE = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "pow": "**", "floordiv": "//",
    "mod": "%", "matmul": "@", "and": "&", "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>",
}  # fmt: skip
_AS_WRITTEN_IN_PLACE = {"pow": _operators(pow_in_place)[0]}  # where the library's value differs
for _name, _symbol in _IN_PLACE.items():
    _method = _AS_WRITTEN_IN_PLACE.get(_name) or getattr(TrackedArray, f"__{_name}__")
    setattr(TrackedArray, f"__i{_name}__", in_place_operator(_symbol, _method))
