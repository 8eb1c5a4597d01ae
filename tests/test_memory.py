"""Memory is returned: no array of a graph outlives the backward pass, training loops are flat,
and the backward walk of a long chain frees the graph as it goes.

Liveness is checked with weak references (after `gc.collect()`); sizes with `tracemalloc`,
which sees NumPy's buffers (PyTorch's storage is invisible to it, its Python objects are not).
"""

import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import tracker_gpu as tg


def alive(refs):
    gc.collect()
    return [name for name, ref in refs if ref() is not None]


def watched_graph(backend, x, refs):
    """A loss of `x` through broadcasting, matmul, indexing, reductions and a custom rule; every
    interior node and its data is recorded in `refs` (weakly)."""

    @tg.rule
    def double(a):
        return a * 2.0, lambda g: (g * 2.0,)

    w = backend.asarray(np.linspace(-1.0, 1.0, 12).reshape(4, 3))
    steps = {}
    steps["matmul"] = x @ w
    steps["tanh"] = tg.tanh(steps["matmul"] + 0.5)
    steps["take"] = tg.take(steps["tanh"], backend.asarray(np.array([0, 2, 2])), axis=0)
    steps["index"] = steps["take"][:, 1:]
    steps["custom"] = double(steps["index"])
    steps["softmax"] = tg.softmax(steps["custom"], axis=0)
    steps["sum"] = tg.sum(steps["softmax"] * steps["tanh"][:3, :2], axis=1)
    loss = tg.logsumexp(steps["sum"])
    for name, node in steps.items():
        refs.append((name, weakref.ref(node)))
        refs.append((f"{name}.data", weakref.ref(tg.data(node))))
    return loss


def inputs(backend):
    return backend.asarray(np.linspace(0.1, 1.2, 12).reshape(3, 4))


def test_back_frees_every_interior_node(backend):
    refs = []
    x = tg.param(inputs(backend))
    loss = watched_graph(backend, x, refs)
    assert alive(refs)  # the graph holds them until the pass
    tg.back(loss)
    assert alive(refs) == []
    assert tg.isleaf(x) and tg.grad(x).shape == x.shape  # the loss and the leaf are the user's


def test_gradient_keeps_nothing_of_the_graph(backend):
    refs, leaves = [], []

    def f(x):
        leaves.append(weakref.ref(x))  # the tracked input gradient() made
        return watched_graph(backend, x, refs)

    (g,) = tg.gradient(f, inputs(backend))
    assert g is not None
    assert alive(refs) == [] and alive([("input", leaves[0])]) == []


def test_withgradient_keeps_only_the_value(backend):
    refs = []
    val, (g,) = tg.withgradient(lambda x: watched_graph(backend, x, refs), inputs(backend))
    assert alive(refs) == []
    assert not tg.istracked(val) and float(val) == float(tg.data(val))


def test_a_nested_gradient_is_freed_with_its_result(backend):
    refs = []
    (g,) = tg.gradient(lambda x: watched_graph(backend, x, refs), inputs(backend), nest=True)
    assert tg.istracked(g) and alive(refs)  # a nested gradient is a graph over the forward one
    watched = weakref.ref(g)
    del g
    assert alive(refs) == [] and watched() is None


def test_second_derivatives_keep_nothing(backend):
    refs = []
    x = inputs(backend)
    v = backend.asarray(np.ones((3, 4)))
    hv = tg.hvp(lambda x: watched_graph(backend, x, refs), x, v)
    assert hv is not None and not tg.istracked(hv)
    assert alive(refs) == []


def test_forward_keeps_the_graph_until_its_pullback_goes(backend):
    refs = []
    y, back = tg.forward(lambda x: watched_graph(backend, x, refs), inputs(backend))
    back(1.0)
    back(1.0)  # reusable
    assert alive(refs)
    del back
    assert alive(refs) == []


def test_a_failing_pullback_leaves_nothing_behind(backend):
    @tg.rule
    def fails(a):
        def pullback(g):
            raise ArithmeticError("no")

        return a * 1.0, pullback

    refs = []
    x = tg.param(inputs(backend))
    loss = tg.sum(fails(watched_graph(backend, x, refs)))
    with pytest.raises(tg.PullbackError):
        tg.back(loss)
    del loss
    assert alive(refs) == []


def test_checkpoint_recomputes_without_keeping_the_inner_graph(backend):
    refs = []
    x = tg.param(inputs(backend))
    y = tg.checkpoint(lambda a: watched_graph(backend, a, refs), x)
    assert alive(refs) == []  # only the value is kept
    tg.back(y)
    assert alive(refs) == []


# --- training loops have flat memory
def _mlp(backend):
    rng = np.random.default_rng(0)
    X = backend.asarray(rng.standard_normal((32, 4)))
    Y = backend.asarray(np.sin(rng.standard_normal((32, 1))))
    params = {
        "W1": backend.asarray(rng.standard_normal((4, 16)) * 0.5),
        "b1": backend.asarray(np.zeros(16)),
        "W2": backend.asarray(rng.standard_normal((16, 1)) * 0.5),
        "b2": backend.asarray(np.zeros(1)),
    }

    def loss(p):
        h = tg.tanh(tg.matmul(X, p["W1"]) + p["b1"])  # tg.matmul: a plain array on the left
        return tg.mean((h @ p["W2"] + p["b2"] - Y) ** 2)

    return params, loss


def _live_tracked_arrays():
    return sum(type(o) is tg.TrackedArray for o in gc.get_objects())


def _eager_loop(backend):
    if backend.name == "dask":
        pytest.skip(
            "a dask parameter updated in a loop is a lazy graph of every step so far, by design: "
            "flat memory over 400 steps is checked on the eager backends"
        )


def _flat(train_step, steps=400, early=100):
    """Run `train_step()` `steps` times; return (memory, peak, live tracked arrays) after step
    `early` and after the last, each peak over the ten steps before it. Each window starts
    after a full collection, which also empties Python's free lists (they fill as it runs)."""
    marks = {}
    tracemalloc.start()
    try:
        for step in range(1, steps + 1):
            if step in (early - 9, steps - 9):
                gc.collect()
                tracemalloc.reset_peak()
            train_step()
            if step in (early, steps):
                gc.collect()
                current, peak = tracemalloc.get_traced_memory()
                marks[step] = (current, peak, _live_tracked_arrays())
    finally:
        tracemalloc.stop()
    return marks[early], marks[steps]


SLACK = 32 * 1024  # bytes: caches warming up, allocator noise; a leak of one graph is more


def test_a_gradient_training_loop_has_flat_memory(backend):
    _eager_loop(backend)
    params, loss = _mlp(backend)
    state = {"params": params, "first": None}

    def step():
        p = state["params"]
        val, (g,) = tg.withgradient(loss, p)
        state["params"] = {k: p[k] - 0.05 * g[k] for k in p}
        state["first"] = state["first"] or float(val)
        state["last"] = float(val)

    (mem, peak, live), (mem_last, peak_last, live_last) = _flat(step)
    assert mem_last <= mem + SLACK and peak_last <= peak + SLACK
    assert live == live_last == 0
    assert state["last"] < 0.5 * state["first"]  # and it did train


def test_a_back_and_update_training_loop_has_flat_memory(backend):
    _eager_loop(backend)
    arrays, loss = _mlp(backend)
    params = {k: tg.param(v) for k, v in arrays.items()}

    def step():
        tg.back(loss(params))
        for p in params.values():
            tg.update(p, -0.05 * tg.grad(p))

    (mem, peak, live), (mem_last, peak_last, live_last) = _flat(step)
    assert mem_last <= mem + SLACK and peak_last <= peak + SLACK
    assert live == live_last == len(params)  # the leaves, nothing else


# --- the backward pass of a long chain frees as it goes
CHAIN = 20_000
FREE_TUPLES = 2_000 * (48 + 56)


def test_the_backward_pass_of_a_long_chain_frees_as_it_goes(backend):
    if backend.xp is not np:
        pytest.skip("tracemalloc sees NumPy's buffers; this measures the walk, not the library")
    x = tg.param(np.linspace(0.1, 0.4, 4))

    def chain(length):
        y = x
        for i in range(length):
            y = tg.sin(y) if i % 2 else y * 1.0001
        return tg.sum(y)

    tg.back(chain(100))  # what a first pass makes once (caches, plans) is not the graph
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        y = chain(CHAIN)
        graph = tracemalloc.get_traced_memory()[0] - start
        tracemalloc.reset_peak()
        tg.back(y)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert graph > CHAIN * 100  # the graph is what we think it is: ~350 bytes a node
    # The walk's own bookkeeping (a count per node) is a fraction of the graph; keeping every
    # node's gradient, or the nodes already walked, would add more than half of it again.
    assert peak - (start + graph) < 0.5 * graph
    # the walk freed the graph, but for CPython's free lists: up to 2,000 tuples of each length
    # stay allocated (a pullback's one and two gradients: 48 and 56 bytes)
    assert after - start < 0.02 * graph + FREE_TUPLES
    assert np.all(np.isfinite(tg.grad(x)))


def test_classes_made_at_every_step_are_not_kept_by_the_tables_of_types(monkeypatch):
    """A named tuple returned as `(loss, aux)` or a dataclass model defined inside the step
    function: each call makes a new class, and every table that remembers what it found per
    type (pytrees, optimiser structures, compile's signatures and copies) kept each forever."""
    import collections
    import dataclasses

    from tracker_gpu import optim
    from tracker_gpu.pytree import TypeTable

    bound = 8
    monkeypatch.setattr(TypeTable, "MAX", bound)
    made = []
    for _ in range(150):
        out = collections.namedtuple("Out", "loss aux")

        @dataclasses.dataclass
        class Model:
            w: object

        made += [weakref.ref(out), weakref.ref(Model)]
        model = Model(np.ones(2))
        tg.withgradient(lambda m, out=out: out(tg.sum(m.w * m.w), m.w), model)
        optim.update(optim.setup(optim.Adam(), model), model, Model(np.ones(2)))
        tg.compile(lambda m: tg.sum(m.w))(model)
    gc.collect()
    # 300 classes made; array-api-compat's own cache of subclass tests keeps up to 100 entries
    assert sum(r() is not None for r in made) <= 4 * bound + 100
