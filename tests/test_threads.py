"""Threads: independent gradients computed at once in 8 threads equal sequential runs exactly.

There is no global tape, so graphs built in different threads never meet. What may not be
shared is listed in docs/threads.md; the tests here run every part of the API that keeps state
(leaves and `back`, `Params`, `forward`'s reusable pullback, `notrack`, nested gradients,
checkpoints and custom rules) in parallel, with a tiny switch interval so that the threads
interleave inside the backward walks.
"""

import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tracker_gpu as tg

THREADS = 8
JOBS = 16


def _jobs(backend):
    """Jobs per test: on Dask, where every operation builds a graph in Python (slow with the
    tiny switch interval), one per thread rather than two."""
    return THREADS if backend.name == "dask" else JOBS


@pytest.fixture(autouse=True)
def _switch_often():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@tg.rule
def _cube(a):
    return a * a * a, lambda g: (g * 3.0 * a * a,)


def _work(backend, k):
    """Every kind of gradient, for inputs that depend on `k`; plain NumPy results."""
    x = backend.asarray(np.linspace(-1.0, 1.0, 12).reshape(3, 4) * (1.0 + k / 8))
    w = backend.asarray(np.cos(np.arange(8.0) + k).reshape(4, 2))

    def f(x, w):
        h = tg.tanh(tg.matmul(x, w))
        return tg.sum(_cube(h)) + tg.logsumexp(x) + tg.sum(tg.softmax(h, axis=0)[:, 0])

    out = {}
    out["gradient"] = tg.gradient(f, x, w)
    out["nested"] = tg.gradient(lambda x: tg.sum(tg.gradient(f, x, w, nest=True)[0] ** 2), x)
    out["hvp"] = tg.hvp(lambda x: f(x, w), x, backend.asarray(np.ones((3, 4))))
    out["checkpoint"] = tg.gradient(lambda x: tg.sum(tg.checkpoint(lambda a: f(a, w), x)), x)
    x_leaf, w_leaf = tg.param(x), tg.param(w)
    tg.back(f(x_leaf, w_leaf))
    tg.back(f(x_leaf, w_leaf))  # accumulates
    out["back"] = (tg.grad(x_leaf), tg.grad(w_leaf))
    y, pullback = tg.forward(lambda x: tg.tanh(tg.matmul(x, w)), x)
    out["forward"] = [pullback(backend.asarray(np.full((3, 2), s))) for s in (1.0, -2.0)]
    return _to_numpy(backend, out)


def _to_numpy(backend, tree):
    return tg.pytree.tree_map(lambda a: backend.to_numpy(tg.data(a)), tree)


def _same(a, b):
    la, lb = tg.pytree.tree_leaves(a), tg.pytree.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(p, q) for p, q in zip(la, lb))


def _in_threads(job, jobs):
    """`job(k)` for each k, in THREADS threads released together."""
    start = threading.Barrier(THREADS)

    def run(k):
        if k < THREADS:
            start.wait()
        return job(k)

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(run, range(jobs)))


def test_independent_gradients_in_threads_equal_sequential_runs(backend):
    sequential = [_work(backend, k) for k in range(_jobs(backend))]
    parallel = _in_threads(lambda k: _work(backend, k), _jobs(backend))
    for k in range(_jobs(backend)):
        assert _same(parallel[k], sequential[k]), f"job {k} differs when run in threads"
    assert not _same(sequential[0], sequential[1])  # the jobs really are different


def test_a_plain_array_shared_by_every_thread(backend):
    """The safe way to share weights: plain arrays, wrapped in new leaves by every call."""
    W = backend.asarray(np.linspace(-1.0, 1.0, 8).reshape(4, 2))

    def job(k):
        x = backend.asarray(np.linspace(0.0, 1.0, 4) + k)
        loss = lambda W: tg.sum(tg.tanh(tg.matmul(x, W)) ** 2)
        return [backend.to_numpy(tg.gradient(loss, W)[0]) for _ in range(20)]

    sequential = [job(k) for k in range(_jobs(backend))]
    parallel = _in_threads(job, _jobs(backend))
    for p, s in zip(parallel, sequential):
        assert all(np.array_equal(a, b) for a, b in zip(p, s))


def test_a_parameter_shared_read_only_through_params(backend):
    """Params and gradient() never write into the leaves, so threads may share them."""
    W = tg.param(backend.asarray(np.linspace(-1.0, 1.0, 8).reshape(4, 2)))

    def job(k):
        x = backend.asarray(np.linspace(0.0, 1.0, 4) + k)
        results = []
        for _ in range(20):
            gs = tg.gradient(lambda: tg.sum(tg.tanh(tg.matmul(x, W)) ** 2), tg.Params([W]))
            results.append(backend.to_numpy(gs[W]))
        return results

    sequential = [job(k) for k in range(_jobs(backend))]
    parallel = _in_threads(job, _jobs(backend))
    for p, s in zip(parallel, sequential):
        assert all(np.array_equal(a, b) for a, b in zip(p, s))
    assert np.array_equal(backend.to_numpy(tg.grad(W)), np.zeros((4, 2)))  # untouched


def test_one_reusable_graph_walked_by_threads_in_turn(backend):
    """A graph kept with once=False may serve several threads, one walk at a time."""
    x = backend.asarray(np.linspace(-1.0, 1.0, 6))
    y, pullback = tg.forward(lambda x: tg.sin(x) * x, x)
    lock = threading.Lock()

    def job(k):
        seed = backend.asarray(np.full(6, float(k)))
        with lock:
            return backend.to_numpy(pullback(seed)[0])

    sequential = [job(k) for k in range(_jobs(backend))]
    parallel = _in_threads(job, _jobs(backend))
    assert all(np.array_equal(p, s) for p, s in zip(parallel, sequential))
    x = backend.to_numpy(x)
    assert np.allclose(sequential[2], 2 * (np.cos(x) * x + np.sin(x)))


def test_notrack_is_per_thread(backend):
    x = backend.asarray(np.array([1.0, 2.0, 3.0]))
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def untracked():
        with tg.notrack():
            inside.set()
            p = tg.param(x)
            seen["untracked"] = tg.istracked(p * 2.0)
            done.wait(10)

    thread = threading.Thread(target=untracked)
    thread.start()
    inside.wait(10)
    try:
        p = tg.param(x)
        seen["tracked"] = tg.istracked(p * 2.0)
        (g,) = tg.gradient(lambda x: tg.sum(x * x), x)
    finally:
        done.set()
        thread.join()
    assert seen == {"untracked": False, "tracked": True}
    assert np.array_equal(backend.to_numpy(g), [2.0, 4.0, 6.0])


def test_notrack_blocks_nest_and_exit_in_any_order_across_threads(backend):
    x = backend.asarray(np.array([0.5, 1.5]))

    def job(k):
        with tg.notrack():
            with tg.notrack():
                plain = tg.param(x) * 3.0
            still = tg.param(x) * 3.0
        tracked = tg.param(x) * 3.0
        return tg.istracked(plain), tg.istracked(still), tg.istracked(tracked)

    assert _in_threads(job, JOBS) == [(False, False, True)] * JOBS
    assert tg.istracked(tg.param(x) * 1.0)  # and nothing leaked into this thread


def test_sync_checks_is_per_thread_and_blocks_exit_in_any_order():
    """Thread A turns the checks off, thread B on; A leaves, then B: both threads, and this
    one, are back to the default (a log of zero refused), and inside A's block only A skips
    (the gradient of log at 0, 1 / 0)."""
    x = np.array([0.0, 1.0])
    loss = lambda x: tg.sum(tg.log(x))  # noqa: E731
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def run(name):
        try:
            seen[name] = tg.gradient(loss, x)[0][0]
        except tg.BackError:
            seen[name] = "refused"

    def a():
        with tg.sync_checks(False):
            a_in.set()
            b_in.wait(10)
            run("a inside")
        a_out.set()
        run("a after")

    def b():
        a_in.wait(10)
        with tg.sync_checks(True):
            b_in.set()
            a_out.wait(10)
            run("b inside")
        run("b after")

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    run("main")
    assert seen == {"a inside": np.inf, "a after": "refused", "b inside": "refused",
                    "b after": "refused", "main": "refused"}  # fmt: skip


def test_a_thread_that_ends_inside_notrack_leaves_no_later_thread_inside_it():
    """A generator suspended inside `notrack()` outlives its thread; Python gives a later
    thread the same ident, which started untracked."""
    from tracker_gpu.primitive import NOT_TRACKING

    w, kept, later = tg.param(np.array([1.0, 2.0])), [], []

    def producer():
        def batches():
            with tg.notrack():
                yield w * 1.0

        suspended = batches()
        next(suspended)
        kept.append(suspended)

    thread = threading.Thread(target=producer)
    thread.start()
    thread.join()
    assert thread.ident not in NOT_TRACKING
    for _ in range(8):  # the ident is reused at once on Linux: each must track
        t = threading.Thread(target=lambda: later.append(tg.istracked(w * 2.0)))
        t.start()
        t.join()
    assert later == [True] * 8


def test_one_compiled_function_called_by_threads_that_evict_each_others_signatures():
    """Its cache is shared: recordings, lookups and evictions by several threads at once."""
    step = tg.compile(lambda x: tg.sum(tg.tanh(x) ** 2), maxsize=2)
    sizes = [1 + k % 4 for k in range(200)]
    expected = {n: tg.withgradient(lambda x: tg.sum(tg.tanh(x) ** 2), np.ones(n)) for n in sizes}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the churn of a small cache, warned
        with ThreadPoolExecutor(THREADS) as pool:
            found = list(pool.map(lambda n: step(np.ones(n)), sizes))
    for n, result in zip(sizes, found):
        assert result.val == expected[n].val
        np.testing.assert_array_equal(result.grad[0], expected[n].grad[0])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_dropout_shared_by_threads_inside_checkpoint_replays_its_own_mask(compiled):
    """The backward pass re-runs the block with the draws it made, though other threads draw
    from the same generator meanwhile: f is linear, so f(x) equals its gradient times x."""
    dropout = tg.nn.Dropout(0.5, rng=np.random.default_rng(0))

    def f(x):
        return tg.sum(tg.checkpoint(dropout, x))

    step = tg.compile(f) if compiled else (lambda x: tg.withgradient(f, x))

    def job(k):
        x = np.random.default_rng(k).uniform(1.0, 2.0, 64)
        val, (g,) = step(x)
        return float(val), float(g @ x)

    with ThreadPoolExecutor(THREADS) as pool:
        found = list(pool.map(job, range(200)))
    assert all(np.isclose(val, along, rtol=1e-12) for val, along in found)


def test_a_refused_recording_run_again_does_not_wind_a_shared_generator_back():
    """A recording refused inside NumPy's code runs f again eagerly with the draws it made; it
    used to wind the generator back to before them, over another thread's draw in between,
    which the next draw then repeated."""
    from tracker_gpu import nn

    drop = nn.trainmode(nn.Dropout(0.5, rng=np.random.default_rng(0)))
    x, drawn, proceed, first = np.ones(64), threading.Event(), threading.Event(), [True]

    def f(x, labels):
        y = tg.sum(drop(x))
        if first[0]:
            first[0] = False
            drawn.set()
            proceed.wait(10)
        return y + float(labels.astype(np.float64).sum()) * 0.0  # refused while recording

    step = tg.compile(f, fallback=True)
    worker = threading.Thread(target=lambda: step(x, np.arange(3)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        worker.start()
        drawn.wait(10)
        between = np.asarray(drop(x)) != 0  # another thread's draw
        proceed.set()
        worker.join(10)
    after = np.asarray(drop(x)) != 0
    assert not np.array_equal(after, between)


def test_tg_broadcast_shared_by_threads_past_its_cache(monkeypatch):
    """Its cache of traced functions evicted a function between another thread's lookup and
    its move to the front: a KeyError, three times in every run of this at a cache of four."""
    import importlib

    monkeypatch.setattr(importlib.import_module("tracker_gpu.broadcast"), "_CACHE_SIZE", 4)
    functions = [eval(f"lambda a: a * {k}.0 + 1.0") for k in range(7)]  # noqa: S307
    x, errors = np.linspace(0.0, 1.0, 4), []

    def job(seed):
        rng = np.random.default_rng(seed)
        try:
            for k in rng.integers(0, len(functions), 1500):
                assert np.array_equal(tg.broadcast(functions[k], x), x * float(k) + 1.0)
        except Exception as error:  # noqa: BLE001
            errors.append(repr(error))

    threads = [threading.Thread(target=job, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_threads_making_the_first_call_at_once_keep_one_recording():
    """Each recorded the signature and kept its own: past eight, a warning blamed a value
    that changed from call to call ("None")."""
    step = tg.compile(lambda x: tg.sum(tg.tanh(x) * x))
    again = threading.Barrier(THREADS)  # released twice: the threads meet the call closer

    def first_call(_):
        again.wait(10)
        return float(step(np.ones(5)).val)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results = _in_threads(first_call, THREADS)
    assert len(set(results)) == 1 and len(step.programs()) == 1
