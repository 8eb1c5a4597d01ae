"""The backward walk: long chains, wide graphs, single use, freeing, and failing pullbacks."""

import gc
import sys
import weakref

import numpy as np
import pytest

import tracker_gpu as tg

LONG = 20_000  # operations: twenty times Python's default recursion limit


def test_a_long_chain_needs_no_recursion(backend):
    if backend.name == "dask":
        pytest.skip(
            "20,000 operations are a lazy graph of 20,000 layers on Dask (milliseconds each "
            "to build): the walk without recursion is checked on the eager backends"
        )
    x = tg.param(backend.asarray([0.5]))
    y = x
    assert sys.getrecursionlimit() < LONG  # a walk that recursed would fail
    for _ in range(LONG):
        y = y * 1.0
    tg.back(tg.sum(y))
    assert np.allclose(backend.to_numpy(tg.grad(x)), [1.0])


def test_a_wide_graph_sums_every_use(backend):
    uses = 200 if backend.name == "dask" else 1000  # each a lazy graph of its own on Dask
    x = tg.param(backend.asarray([2.0]))
    total = x * 0.0
    for k in range(1, uses + 1):
        total = total + x * float(k)
    tg.back(tg.sum(total))
    assert np.allclose(backend.to_numpy(tg.grad(x)), [sum(range(1, uses + 1))])


def test_diamond_graph_gets_both_paths(backend):
    x = tg.param(backend.asarray([3.0]))
    a = tg.exp(x)
    y = tg.sum(a * a + a)  # d/dx = 2 e^{2x} + e^x
    tg.back(y)
    expected = 2 * np.exp(6.0) + np.exp(3.0)
    assert np.allclose(backend.to_numpy(tg.grad(x)), [expected])


def test_second_pass_of_a_single_use_graph_raises():
    x = tg.param(np.array([1.0]))
    y = tg.sum(x * 2.0)
    tg.back(y)
    with pytest.raises(tg.BackError, match="already used"):
        tg.back(y)
    assert np.allclose(tg.grad(x), [2.0])  # the refused pass changed nothing


def test_once_false_keeps_the_graph_for_another_pass():
    x = tg.param(np.array([1.0, 2.0]))
    y = tg.sum(x * x)
    tg.back(y, once=False)
    tg.back(y, once=False)
    assert np.allclose(tg.grad(x), [4.0, 8.0])


def test_the_walk_frees_interior_nodes_as_it_goes():
    x = tg.param(np.ones(1000))
    h = tg.exp(x)
    ref = weakref.ref(h.data)
    y = tg.sum(h * 2.0)
    del h
    gc.collect()
    assert ref() is not None  # held by the graph
    tg.back(y)
    gc.collect()
    assert ref() is None  # released by the single-use walk


def test_gradient_keeps_no_array_of_the_graph_alive():
    x = np.ones(100)
    refs = []

    def f(x):
        h = tg.tanh(x)
        refs.append(weakref.ref(h.data))
        return tg.sum(h * h)

    tg.gradient(f, x)
    gc.collect()
    assert refs and refs[0]() is None


def test_independent_gradients_in_threads():
    from concurrent.futures import ThreadPoolExecutor

    def job(k):
        x = np.linspace(0.1, 1.0, 50) * k
        return tg.gradient(lambda x: tg.sum(tg.sin(x) * x), x)[0]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(job, range(1, 17)))
    for k, g in enumerate(results, start=1):
        x = np.linspace(0.1, 1.0, 50) * k
        assert np.allclose(g, np.cos(x) * x + np.sin(x))


class _Logged:
    """A node's rule that notes the node's serial when the walk pulls it back."""

    def __init__(self, rule, log):
        self.rule, self.log, self.name = rule, log, rule.name

    def pullback(self, node, *rest):
        self.log.append(node.serial)
        return self.rule.pullback(node, *rest)


def test_the_walk_pulls_back_newest_first_in_any_graph():
    """Random graphs (chains, diamonds, values used many times, parents of every age): every
    node a gradient reaches is pulled back once, after every node made after it, whether it
    waited in the walk's heap or came next as the only node waiting."""
    from tracker_gpu import tape

    rng = np.random.default_rng(7)
    for _ in range(60):
        values = [tg.param(rng.standard_normal(3))]
        for _ in range(int(rng.integers(1, 40))):
            a, b = (values[int(i)] for i in rng.integers(max(0, len(values) - 4), len(values), 2))
            kind = rng.integers(0, 3)
            values.append(tg.sin(a) if kind == 0 else a * b if kind == 1 else a + b)
        loss = tg.sum(values[-1]) + tg.sum(values[len(values) // 2])
        nodes = tape.interior_nodes(loss._node)
        log = []
        for node in nodes:
            node.rule = _Logged(node.rule, log)
        tg.back(loss)
        assert log == sorted(log, reverse=True)
        assert sorted(log) == sorted(node.serial for node in nodes)
