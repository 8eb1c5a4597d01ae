"""The tape: nodes and the backward walk. It knows nothing of arrays.

Every tracked value is a `Node`. An interior node keeps the rule that made it (`_rule`), the
arguments it was called with (`_args`, tracked parents among them) and the rule's saved context
(`_ctx`). A leaf has no rule and keeps the gradient accumulated across passes (`_grad`). There is
no global tape: the graph hangs off the values.

The walk is Kahn's algorithm over reference counts (Tracker's scheme, made iterative): a first
pass counts, for each node reachable from the root, how many of its children will send it a
gradient; the second pass pulls a node back only when all of them have, then drops its gradient
(and, for a single-use pass, its rule and arguments, which frees the graph as it goes).
"""

__all__ = ["Node", "SPENT", "BackError", "PullbackError", "walk"]


class BackError(RuntimeError):
    """A backward pass that cannot run: a spent graph, or a bad seed or loss."""


class PullbackError(RuntimeError):
    """A rule's pullback raised; the message says whether the graph is still usable."""


class _Spent:
    """Marks an interior node whose single-use pullback has already run."""

    name = "spent"

    def __repr__(self):
        return "SPENT"


SPENT = _Spent()


class Node:
    __slots__ = ("_rule", "_args", "_ctx", "_grad", "__weakref__")


def _count_references(root, stop):
    """How many gradients each node reachable from `root` will receive."""
    counts = {id(root): 0}
    stack = [root]
    while stack:
        node = stack.pop()
        rule = node._rule
        if rule is None or id(node) in stop:
            continue
        if rule is SPENT:
            raise BackError(
                "back was already used on this graph: a single-use pass (once=True) frees it. "
                "Recompute the forward pass, or pass once=False to keep the graph for another pass."
            )
        for parent in node._args:
            if isinstance(parent, Node):
                key = id(parent)
                if key in counts:
                    counts[key] += 1
                else:
                    counts[key] = 1
                    stack.append(parent)
    return counts


def walk(root, seed, *, once=True, nested=False, stop=()):
    """Pull `seed` back from `root`; return `[(node, gradient)]` for each leaf or stop node reached.

    Nodes in `stop` receive their gradient but do not pass it on. Leaves and stop nodes reached
    by no gradient are left out. With `once`, each interior node frees its rule and arguments as
    soon as it has passed its gradient on.
    """
    stop = {id(node) for node in stop}
    counts = _count_references(root, stop)
    pending = {id(root): seed}
    ready = [root]
    reached = []
    while ready:
        node = ready.pop()
        g = pending.pop(id(node), None)
        rule = node._rule
        if rule is None or (stop and id(node) in stop):
            if g is not None:
                reached.append((node, g))
            continue
        args, ctx = node._args, node._ctx
        if once:
            node._rule, node._args, node._ctx = SPENT, None, None
        grads = (None,) * len(args)
        if g is not None:
            try:
                grads = rule.pullback(node, args, ctx, g, nested)
            except Exception as error:
                raise _pullback_error(rule, error, once) from error
        for parent, gp in zip(args, grads):
            if isinstance(parent, Node):
                key = id(parent)
                if gp is not None:
                    prev = pending.get(key)
                    pending[key] = gp if prev is None else _add(prev, gp)
                left = counts[key] - 1
                counts[key] = left
                if not left:
                    ready.append(parent)
    return reached


def _add(a, b):
    # A possibly-tracked value goes on the left: some array libraries refuse foreign operands.
    return b + a if isinstance(b, Node) and not isinstance(a, Node) else a + b


def _pullback_error(rule, error, once):
    state = (
        "the graph is spent (once=True); recompute the forward pass"
        if once
        else "the graph is unchanged and may be used again"
    )
    return PullbackError(
        f"the pullback of {rule.name!r} raised {type(error).__name__}: {error}; {state}"
    )
