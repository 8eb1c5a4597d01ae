"""The hottest rules as expressions, for generated code: a forward and a vjp per argument.

Each expression computes what the rule computes on plain arrays, operation for operation (so a
replay gives the eager values bit for bit): `forward(xp, *values)` and `vjp(xp, g, ans,
*values)` take the names of variables and return the source of an expression; `applies(kw)`
says whether the rule's keywords allow it. Rules without a template are called as they are.
"""

from dataclasses import dataclass

from ..rules import elementwise as ew
from ..rules import nn, reductions

__all__ = ["TEMPLATES"]


@dataclass(frozen=True)
class Template:
    forward: object
    vjps: tuple
    applies: object = lambda kw: not kw


def _unary(name, vjp):
    return Template(lambda xp, x: f"{xp}.{name}({x})", (vjp,))


def _full_sum(kw):
    return kw.get("axis") is None and not kw.get("keepdims") and kw.get("dtype") is None


TEMPLATES = {
    ew.add: Template(lambda xp, x, y: f"{x} + {y}", (lambda xp, g, a, x, y: g,) * 2),
    ew.subtract: Template(
        lambda xp, x, y: f"{x} - {y}", (lambda xp, g, a, x, y: g, lambda xp, g, a, x, y: f"-{g}")
    ),
    ew.multiply: Template(
        lambda xp, x, y: f"{x} * {y}",
        (lambda xp, g, a, x, y: f"{g} * {y}", lambda xp, g, a, x, y: f"{g} * {x}"),
    ),
    ew.divide: Template(
        lambda xp, x, y: f"{x} / {y}",
        (lambda xp, g, a, x, y: f"{g} / {y}", lambda xp, g, a, x, y: f"-{g} * {a} / {y}"),
    ),
    ew.negative: Template(lambda xp, x: f"-{x}", (lambda xp, g, a, x: f"-{g}",)),
    ew.exp: _unary("exp", lambda xp, g, a, x: f"{g} * {a}"),
    ew.log: _unary("log", lambda xp, g, a, x: f"{g} / {x}"),
    ew.sqrt: _unary("sqrt", lambda xp, g, a, x: f"{g} / ({a} * 2)"),
    ew.square: _unary("square", lambda xp, g, a, x: f"{g} * ({x} * 2)"),
    ew.sin: _unary("sin", lambda xp, g, a, x: f"{g} * {xp}.cos({x})"),
    ew.cos: _unary("cos", lambda xp, g, a, x: f"-{g} * {xp}.sin({x})"),
    ew.tanh: _unary("tanh", lambda xp, g, a, x: f"{g} * (1 - {a} * {a})"),
    nn.relu: Template(
        lambda xp, x: f"{xp}.where({x} < 0, {xp}.zeros_like({x}), {x})",
        (lambda xp, g, a, x: f"{xp}.where({a} <= 0, {xp}.zeros_like({g}), {g})",),
    ),
    reductions._sum: Template(
        lambda xp, x: f"{xp}.sum({x})",
        (lambda xp, g, a, x: f"{xp}.broadcast_to({g}, {x}.shape)",),
        _full_sum,
    ),
}
