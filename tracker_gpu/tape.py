"""The tape: nodes and the backward walk. It knows nothing of arrays.

The graph is kept apart from the values. A tracked array holds its data and its `Node`; a node
holds the rule that made it (`rule`), its arguments (`args`: the parents' nodes, and the
constants it was called with), the rule's context (`ctx`, its keywords), what the rule saved for
its pullback (`saved`, aligned with `(output, *args)`, `None` where nothing was saved) and its
shape and dtype. So an intermediate array that no pullback saved is freed as soon as the user
drops it. A leaf has no rule and keeps the gradient accumulated across passes (`grad`). There is
no global tape: the graph hangs off the values.

A node also stands in for its value where the value was not saved: it has the value's `shape`,
`dtype`, `ndim` and `size`, which is all a pullback may read of a value it did not save.

The walk pulls gradients back in the reverse of the order the nodes were made (each node has a
`serial`, its place in that order, so a child always comes after its parents): a heap holds the
nodes a gradient has reached, and the newest is pulled back next, when every child that sends it
a gradient has (PyTorch's engine orders its CPU work the same way; where one node alone waits,
as along a chain, it is taken next without the heap). So no pass counts the graph first, and a
node no gradient reaches is never visited. A node's gradient is pending on the node
(`_g`) during a walk (leaves, which graphs share, are never written), and with a single-use pass
its rule, arguments and saved values are dropped as soon as it has passed its gradient on, which
frees the graph as it goes. So one graph may not be walked by two threads at once; graphs that
share only leaves may.
"""

import contextlib
import itertools
import math
from heapq import heappop, heappush

from . import recording

__all__ = [
    "Node",
    "leaf_node",
    "SPENT",
    "BackError",
    "PullbackError",
    "Pending",
    "Total",
    "walk",
    "run",
    "noted_on_the_way",
]


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
    """A value's place in the graph (see the module's docstring)."""

    # _g (the gradient pending here) is used by a walk only, and is back to None when it ends,
    # even when it fails. `grad` is set on leaves only.
    __slots__ = ("rule", "args", "ctx", "saved", "shape", "dtype", "grad", "serial", "_g",
                 "__weakref__")  # fmt: skip

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))

    def __repr__(self):
        kind = "leaf" if self.rule is None else f"rule={getattr(self.rule, 'name', '?')}"
        return f"Node({kind}, shape={self.shape}, dtype={self.dtype})"


# Each node's place in the order nodes were made (in all threads): a pass that differentiates
# with respect to the inputs it made at `serial_now()` walks only nodes made since; an older
# one is a value it closes over, a constant to it (see `walk`).
next_serial = itertools.count().__next__


def serial_now():
    """The serial the next node will have: nodes made from now on are at least this."""
    return next_serial()


def leaf_node(shape, dtype):
    """A node with no rule: a leaf, whose gradient accumulates in `grad`."""
    node = Node()
    node.rule, node.args, node.ctx, node.saved = None, (), None, None
    node.serial = next_serial()
    node.shape, node.dtype, node.grad, node._g = shape, dtype, None, None
    return node


def interior_nodes(root, stop=()):
    """The interior nodes reachable from `root` through interior nodes (not through `stop`), in
    the order a walk from it pulls them back (the newest first): what tg.compile records of a
    walk. A heap by serial, as the walk's: a node reached twice pops twice in a row."""
    stop = _stop_ids(stop)
    if _terminal(root, stop):
        return []
    found, waiting, last = [], [(-root.serial, root)], None
    while waiting:
        node = heappop(waiting)[1]
        if node is last:
            continue
        found.append(node)
        last = node
        for parent in node.args:
            if type(parent) is Node and parent.rule is not None and id(parent) not in stop:
                heappush(waiting, (-parent.serial, parent))
    return found


def _terminal(node, stop, since=0):
    """A leaf, a stop node or a node older than `since`: it receives gradients and passes none
    on."""
    return node.rule is None or node.serial < since or (stop and id(node) in stop)


class Total:
    """What a fused pullback returns for an argument: the argument's whole pending gradient, with
    this contribution already added (in a buffer the tape may own and add into in place)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class Pending:
    """The gradients pending during one walk: on interior nodes (`_g`), and for leaves and stop
    nodes in this walk's own table (they may be shared with other walks); and which buffers the
    walk owns (made by an addition or a fused kernel, so it may add into them in place)."""

    __slots__ = ("owned", "terminal", "arrived", "stop", "since")

    def __init__(self, stop, since=0):
        self.owned = set()
        self.terminal = {}  # id -> [node, gradient]
        self.arrived = []  # interior nodes given their first gradient here (the walk takes them)
        self.stop, self.since = stop, since

    def current(self, node):
        """`(gradient, owned)` waiting at `node` so far (`(None, False)` if none)."""
        if _terminal(node, self.stop, self.since):
            entry = self.terminal.get(id(node))
            return (None if entry is None else entry[1]), id(node) in self.owned
        return node._g, id(node) in self.owned

    def replace(self, node, total):
        """Make `total`, a buffer this walk owns, the gradient pending at `node`."""
        self._set(node, total)
        self.owned.add(id(node))

    def add(self, node, gp, nested):
        """Add the contribution `gp` (or a fused kernel's `Total`) to `node`'s gradient."""
        if type(gp) is Total:
            return self.replace(node, gp.value)
        prev, _ = self.current(node)
        if prev is None:
            self._set(node, gp)  # a first contribution: not ours to add into
        else:
            self._set(node, self._sum(prev, gp, id(node), nested))

    def add_interior(self, node, gp, nested):
        """`add` for an interior node that holds a gradient already."""
        node._g = self._sum(node._g, gp, id(node), nested)

    def _sum(self, prev, gp, key, nested):
        """`prev + gp`, the gradient pending at the node of id `key`, which this walk owns after."""
        if key in self.owned and not nested and type(prev) is type(gp):
            # in place for arrays of one type (a NumPy buffer cannot take a dask array in
            # place); NumPy's 0-d scalars rebind, so the sum is stored back
            prev += gp
            return prev
        self.owned.add(key)
        return _add(prev, gp)

    def add_terminal(self, node, gp, nested):
        """`add` for a leaf or a stop node (`_terminal`), whose first contribution is stored
        without further tests."""
        if type(gp) is not Total and id(node) not in self.terminal:
            self.terminal[id(node)] = [node, gp]  # a first contribution: not ours to add into
        else:
            self.add(node, gp, nested)

    def _set(self, node, value):
        if _terminal(node, self.stop, self.since):
            self.terminal[id(node)] = [node, value]
        else:
            if node._g is None:
                self.arrived.append(node)
            node._g = value


def walk(root, seed, *, once=True, nested=False, stop=(), since=0):
    """Pull `seed` back from `root`; return `[(node, gradient)]` for each leaf or stop node reached.

    Nodes in `stop`, and nodes made before the serial `since` (values a nested pass closes
    over, which belong to an outer pass), receive their gradient but do not pass it on. Leaves
    and stop nodes reached by no gradient are left out. With `once`, each interior node frees
    its rule and arguments as soon as it has passed its gradient on.
    """
    if not nested:
        recorder = recording.current()
        if recorder is not None:  # tg.compile records this pass, to replay it
            return recorder.walk(root, seed, _with_older(stop, root, since), once=once)
    return run(root, seed, once=once, nested=nested, stop=stop, since=since)


def _with_older(stop, root, since):
    """`stop` and the interior nodes older than `since` that `root` reaches: a recorded walk
    stops at the values the pass closed over, as `run` does (leaves stop every walk)."""
    if not since:
        return stop
    return [*stop, *(n for n in older_nodes(root, since, stop) if n.rule is not None)]


def run(root, seed, *, once=True, nested=False, stop=(), since=0):
    """`walk` itself, unseen by a recording."""
    stop = _stop_ids(stop)
    if _terminal(root, stop, since):
        return [(root, seed)]
    return _pull_back(root, seed, once, nested, stop, since=since)


def _stop_ids(stop):
    """The ids of the interior nodes among `stop`: a leaf stops a walk as a leaf does, and
    leaving it out spares the walk a lookup per edge (a gradient's inputs are leaves)."""
    return {id(node) for node in stop if node.rule is not None}


def older_nodes(root, since, stop=()):
    """The nodes made before the serial `since` that `root` depends on through nodes made
    since (and not through `stop`): the tracked values a function that began at `since`
    closed over."""
    seen, found, stack = {id(node) for node in stop}, [], [root]
    while stack:
        for parent in stack.pop().args:
            if isinstance(parent, Node) and id(parent) not in seen:
                seen.add(id(parent))
                if parent.serial < since:
                    found.append(parent)
                elif parent.rule is not None:
                    stack.append(parent)
    return found


class _Noted:
    """A node's rule that notes the node's whole gradient as the walk passes it on."""

    def __init__(self, rule, found):
        self.rule, self.found, self.name = rule, found, rule.name

    def pullback(self, node, args, ctx, saved, g, *rest):
        self.found[id(node)] = g
        return self.rule.pullback(node, args, ctx, saved, g, *rest)


@contextlib.contextmanager
def noted_on_the_way(nodes):
    """`{id(node): gradient}` of the interior `nodes` a walk inside the block goes through
    (their whole gradients, passed on: a parameter that another one is made of gets its
    share through it too, as Tracker's and PyTorch's)."""
    found, noted = {}, {}
    for node in nodes:
        if node.rule is SPENT:
            raise BackError(
                "a value differentiated with respect to (a Params entry made by an operation, "
                "W[0:1] or a rebound W) is on a graph that an earlier pass freed; make it "
                "inside the function, or keep leaves (tg.param) in Params"
            )
        if node.rule is not None and id(node) not in noted:
            noted[id(node)] = node, node.rule
            node.rule = _Noted(node.rule, found)
    try:
        yield found
    finally:
        for node, rule in noted.values():
            if type(node.rule) is _Noted:  # not spent by the walk
                node.rule = rule


def replay(root, seed, stop, release=True):
    """A walk that keeps the graph (as by once=False), and with `release` releases each node's
    saved values as soon as its pullback has run: tg.compile's replay of a recorded pass."""
    stop = _stop_ids(stop)
    return _pull_back(root, seed, False, False, stop, release=release)


def _pull_back(root, seed, once, nested, stop, release=False, since=0):
    pending = Pending(stop, since)
    owned, arrived = pending.owned, pending.arrived
    waiting = []  # a heap: the newest node with a gradient pops first
    following = root  # the next node, where it is the only one waiting (a chain): no heap
    root._g = seed
    try:
        while following is not None or waiting:
            if following is None:
                node = heappop(waiting)[1]
            else:
                node, following = following, None
            g, node._g = node._g, None
            if owned:
                owned.discard(id(node))
            rule = node.rule  # one attribute a statement: four at once build a tuple
            if rule is SPENT:
                raise BackError(SPENT_MESSAGE)
            args = node.args
            ctx = node.ctx
            saved = node.saved
            if once:
                node.rule = SPENT
                node.args = node.ctx = node.saved = None
            elif release:
                node.saved = None
            try:
                grads = rule.pullback(node, args, ctx, saved, g, nested, pending)
            except Exception as error:
                raise _pullback_error(rule, error, once) from error
            if len(grads) < len(args):  # a fused pullback may leave trailing arguments out
                args = args[: len(grads)]
            k = -1
            for parent in args:  # by position: a zip would be one more object a node
                k += 1
                gp = grads[k]
                if gp is None or type(parent) is not Node:  # exact type tests: the hot loop
                    continue
                if parent.rule is None or parent.serial < since or (stop and id(parent) in stop):
                    pending.add_terminal(parent, gp, nested)
                elif type(gp) is Total:
                    pending.replace(parent, gp.value)
                elif parent._g is None:
                    parent._g = gp  # a first contribution (not ours to add into): it waits
                    if following is None and not waiting:
                        following = parent
                    else:
                        if following is not None:
                            heappush(waiting, (-following.serial, following))
                            following = None
                        heappush(waiting, (-parent.serial, parent))
                else:
                    pending.add_interior(parent, gp, nested)
            if arrived:  # first gradients a fused pullback stored itself (`Total`)
                if following is not None:
                    arrived.append(following)
                    following = None
                for parent in arrived:
                    heappush(waiting, (-parent.serial, parent))
                arrived.clear()
    except BaseException:
        for _, node in waiting:
            node._g = None
        for node in (*arrived, following):
            if node is not None:
                node._g = None
        raise
    return [(node, g) for node, g in pending.terminal.values()]


SPENT_MESSAGE = (
    "back was already used on this graph: a single-use pass (once=True) frees it. Recompute "
    "the forward pass, or pass once=False to keep the graph for another pass."
)


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
