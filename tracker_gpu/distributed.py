"""Data-parallel training on a dask.distributed cluster.

The batch is split across the workers by the chunks of its first axis; each worker computes
`withgradient` of the loss on its shard with tracker_gpu, the shards' gradients are summed on
the cluster by a binary tree in a fixed order (so a run is reproducible), and the optimiser
updates the model once, here. The model travels to the cluster once per step, as a value in the
step's graph: a worker lost in the middle of a step is recovered by Dask, which recomputes what
it held from that graph.

    with cluster(workers=2) as client:           # an embedded LocalCluster, stopped on exit
        for x, y in batches:
            loss, model, state = step(client, loss_fn, model, state, x, y)

A step that waits longer than `timeout` seconds (default 60) asks every worker whether it
answers: those that do not (stopped, hung, cut off) are named in a `StalledWorkerWarning` and
removed from the cluster, and Dask recomputes their shards on the others, so the result is the
one an undisturbed step gives (bit for bit with `shards=` given); when no worker answers, the
step raises `StalledWorkers`. A step whose workers all answer is slow, not stalled: it waits on.

`cluster(scheduler="tcp://host:8786")` connects to a running cluster instead, and
`cluster(cuda=True)` starts dask-cuda's `LocalCUDACluster` (one worker per GPU; give it a model
of CuPy arrays and data as dask arrays with CuPy chunks).

>>> import numpy as np, tracker_gpu as tg
>>> loss = lambda w, x: tg.mean((x @ w) ** 2)
>>> x = np.arange(12.0).reshape(6, 2)
>>> with cluster(workers=1, processes=False) as client:
...     val, (g,) = withgradient(client, loss, np.array([1.0, -1.0]), x, shards=3)
>>> float(val), g
(1.0, array([-10., -12.]))
"""

import contextlib
import logging
import math
import os
import time
import uuid
import warnings

import numpy as np

from . import backend, optim
from .api import WithGradient
from .api import withgradient as _withgradient
from .optim.checkpoint import GENERATORS
from .optim.tree import tree_map_with_path
from .pytree import tree_leaves, tree_map
from .tracked import data

__all__ = [
    "cluster",
    "describe",
    "withgradient",
    "step",
    "shard_arrays",
    "compute",
    "StalledWorkers",
    "StalledWorkerWarning",
    "STEP_TIMEOUT",
]

STEP_TIMEOUT = 60.0  # seconds a step waits before it asks whether its workers answer

# One thread for each worker's BLAS and PyTorch: a worker is one core.
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def cluster(workers=None, *, scheduler=None, cuda=False, timeout=None, **options):
    """A `distributed.Client` for the block: of a new `LocalCluster` (processes, `workers` of
    them, default one per core, each with one thread), started here and stopped on exit; or of
    the running cluster at `scheduler`, reached within `timeout` seconds (else `OSError`); or,
    with `cuda=True`, of dask-cuda's `LocalCUDACluster`. Other keywords go to the cluster's
    constructor (e.g. `memory_limit`). A local cluster has a dashboard on a free port when
    bokeh is installed."""
    distributed = _import("distributed", "dask.distributed")
    if scheduler is not None:
        if timeout is not None:
            _check_answers(scheduler, timeout)
        with distributed.Client(scheduler, **_timeout(timeout)) as client:
            yield client
        return
    if cuda:
        dask_cuda = _import("dask_cuda", "dask-cuda (and a CUDA GPU)")
        made = dask_cuda.LocalCUDACluster(**options)
    else:
        settings = {"n_workers": workers or os.cpu_count() or 1, "threads_per_worker": 1}
        settings |= {"dashboard_address": ":0" if _has("bokeh") else None,
                     "silence_logs": logging.ERROR}  # fmt: skip
        if options.get("processes", True):
            settings["env"] = dict(_ONE_THREAD)
        with _deaf_to_ctrl_c():  # the workers inherit it: Ctrl-C is for this process
            made = distributed.LocalCluster(**(settings | options))
    with made, distributed.Client(made) as client:
        yield client


@contextlib.contextmanager
def _deaf_to_ctrl_c():
    """SIGINT ignored while the block starts processes, so that they ignore it: a Ctrl-C in a
    terminal goes to the whole process group, and workers that died of it would leave the step
    that waits for them hanging; this process stops them when it leaves `cluster`."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _timeout(seconds):
    return {} if seconds is None else {"timeout": f"{seconds}s"}


def _check_answers(address, seconds):
    """Raise OSError unless a Dask server at `address` answers within `seconds`: a port that
    refuses, or one that accepts and never answers (an HTTP server), on which Client would
    wait forever."""
    import asyncio

    from distributed.comm import connect

    try:
        asyncio.get_running_loop()
        return  # inside a running loop (a notebook): only Client's own timeout
    except RuntimeError:
        pass

    async def identity():
        comm = await connect(address, timeout=seconds)
        try:
            await comm.write({"op": "identity"})
            return await comm.read()
        finally:
            comm.abort()

    try:
        asyncio.run(asyncio.wait_for(identity(), seconds))
    except (TimeoutError, asyncio.TimeoutError):
        raise OSError(f"no Dask scheduler answered at {address} within {seconds} s") from None


def _has(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


def describe(client):
    """One line on the cluster of `client`: the scheduler's address, the dashboard's link and
    the workers (address and threads)."""
    info = client.scheduler_info()
    workers = info.get("workers", {})
    listed = ", ".join(f"{address} ({w.get('nthreads', '?')} threads)"
                       for address, w in sorted(workers.items()))  # fmt: skip
    has_dashboard = "dashboard" in info.get("services", {}) and _has("bokeh")
    dashboard = client.dashboard_link if has_dashboard else "none (pip install bokeh for one)"
    return (f"dask: scheduler {client.scheduler.address}, dashboard {dashboard}, "
            f"{len(workers)} workers: {listed}")  # fmt: skip


def compute(*trees, **options):
    """The lazy arrays inside `trees` (values, gradients shaped like a model) computed in one
    pass of Dask, in structures of the same shape. `dask.compute` takes arrays and plain
    containers, but rebuilds a dataclass by calling its constructor, which layers do not take.

    >>> import dask.array as da, numpy as np, tracker_gpu as tg
    >>> x = da.from_array(np.arange(4.0), chunks=2)
    >>> val, (g,) = tg.withgradient(lambda p: tg.sum(x * p["w"]), {"w": np.ones(4)})
    >>> compute(tg.data(val), g)
    (np.float64(6.0), {'w': array([0., 1., 2., 3.])})
    """
    import dask

    leaves = tree_leaves(trees)
    found = iter(dask.compute(*leaves, **options))
    return tree_map(lambda _: next(found), trees)


def _import(module, what):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f'tracker_gpu.distributed needs {what}: pip install "tracker-gpu[dask]"'
        ) from None


class StalledWorkers(TimeoutError):
    """A data-parallel step waited longer than its timeout and no worker that answers was left
    to finish it. `workers`: the addresses of those that did not answer."""

    def __init__(self, message, workers=()):
        super().__init__(message)
        self.workers = list(workers)


class StalledWorkerWarning(RuntimeWarning):
    """Workers that did not answer during a step were removed from the cluster; the step went
    on without them."""


def withgradient(client, f, model, *batch, shards=None, mean=True, timeout=STEP_TIMEOUT):
    """`(val, (grad,))` of `f(model, *batch)` over the whole batch, computed on the cluster.

    `batch` holds arrays with the examples on the first axis: dask arrays are split by their
    chunks along it, other arrays into `shards` pieces (default: one per worker thread alive
    now; give `shards` for a result that does not depend on which workers are alive: the
    shards are then fixed by the batch, and their sum's order by shard index).
    With `mean` (the default) `f` returns the mean of its examples' losses, and each shard is
    weighted by its share of the batch, so `val` and `grad` are those of `f` on the whole batch;
    with `mean=False`, `f` returns a sum and the shards add up. `f` may return `(loss, aux...)`
    where each `aux` has the examples on its first axis: they come back joined in batch order.

    A step that waits longer than `timeout` seconds (None: no limit) asks each worker whether
    it answers; those that do not are named (`StalledWorkerWarning`) and removed from the
    cluster, their shards recomputed by the others, and the step goes on; when none answers, it
    raises `StalledWorkers` naming them. Workers that answer but compute longer are waited for.
    """
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a number of seconds more than 0, or None; got "
                         f"{timeout!r}")  # fmt: skip
    _refuse_statistics_in_training(model)
    blocks = shard_arrays(client, batch, shards)
    total = sum(blocks[0].chunks[0])
    part = _shard_gradient_task(f, mean, total)
    model_node = _as_node(model)
    columns = [b.to_delayed().ravel() for b in blocks]
    seeds = _shard_seeds(model, len(columns[0]))
    parts = [part(model_node, shard_seeds, *row) for shard_seeds, row in zip(seeds, zip(*columns))]
    loss, grad, aux = _result(client, client.compute(_tree_sum(parts)), timeout)
    return WithGradient((loss, *aux) if aux is not None else loss, (grad,))


def _refuse_statistics_in_training(model):
    """A layer that updates running statistics in training (a BatchNorm not in test mode)
    would normalise each shard by its own batch's statistics, and update its running ones in
    each worker's copy (or once a shard): not the single-process step. Refused, naming it."""
    found = []

    def look(path, x):
        if getattr(x, "running_mean", None) is not None and getattr(x, "active", None) is not False:
            found.append(path or type(x).__name__)
        return x

    tree_map_with_path(look, model, is_leaf=lambda x: hasattr(x, "running_mean"))
    if found:
        raise ValueError(
            f"a data-parallel step of a model with batch statistics in training ({', '.join(found)}"
            "): each shard would normalise by its own examples and the running statistics "
            "would not be updated as in one process; put those layers in test mode "
            "(nn.testmode(model)) or use a LayerNorm or GroupNorm"
        )


def step(client, f, model, state, *batch, **options):
    """One data-parallel training step: `(val, model, state)` after the optimiser's update
    (`state` from `optim.setup`). Options as for `withgradient`."""
    val, (grad,) = withgradient(client, f, model, *batch, **options)
    state, model = optim.update(state, model, grad)
    return val, model, state


def _result(client, future, timeout):
    """The result of `future`; every `timeout` seconds it waits, the workers that do not answer
    are removed (and named), or `StalledWorkers` raised when none answers."""
    waited = 0.0
    try:
        while True:
            began = time.monotonic()
            try:
                return future.result(timeout=timeout)
            except TimeoutError:
                if future.done():  # the user's own TimeoutError, or a slow gather
                    return future.result()
            waited += time.monotonic() - began
            _drop_stalled(client, waited, min(timeout, 5.0))
    except BaseException:
        future.cancel()
        raise


def _drop_stalled(client, waited, seconds):
    """Ask every worker whether it answers within `seconds`; remove those that do not, naming
    them, or raise `StalledWorkers` when none does."""
    try:  # `callback_timeout` bounds the call itself (Client.sync's keyword)
        workers, silent = client.run_on_scheduler(
            _stalled_task(), seconds, callback_timeout=2 * seconds + 10
        )
    except TimeoutError:
        raise StalledWorkers(
            f"a data-parallel step waited {waited:.0f} s and the scheduler at "
            f"{client.scheduler.address} did not answer either; check or restart it"
        ) from None
    if not silent:
        if workers:
            return  # all answer: the step is slow, not stalled
        raise StalledWorkers(f"a data-parallel step waited {waited:.0f} s and the cluster has no "
                             "worker left; start workers, or restart the job")  # fmt: skip
    named = ", ".join(silent)
    if len(silent) == len(workers):
        raise StalledWorkers(
            f"a data-parallel step waited {waited:.0f} s and no worker answered within "
            f"{seconds:g} s ({named}); check or restart them",
            silent,
        )
    plural = len(silent) > 1
    warnings.warn(
        f"a data-parallel step waited {waited:.0f} s: worker{'s' if plural else ''} {named} "
        f"did not answer within {seconds:g} s and {'were' if plural else 'was'} removed from "
        f"the cluster; {len(workers) - len(silent)} of {len(workers)} workers go on, "
        f"recomputing {'their' if plural else 'its'} shards",
        StalledWorkerWarning,
        stacklevel=4,
    )


def _stalled_task():
    """A function for `run_on_scheduler` (pickled by value: the scheduler needs no
    tracker_gpu), which reaches every worker even where this process cannot: it asks each
    worker for its identity, at most `seconds`, and removes those that do not answer from the
    cluster, unless none answers (their tasks go to the others, what they held is recomputed
    from the graph). Returns the workers and the silent ones."""

    async def stalled(seconds, dask_scheduler=None):
        import asyncio

        from distributed.comm import connect

        async def answers(address):
            comm = None
            try:
                comm = await connect(address, timeout=seconds)
                await comm.write({"op": "identity"})
                await comm.read()
            finally:
                if comm is not None:
                    comm.abort()

        async def is_silent(address):
            try:
                await asyncio.wait_for(answers(address), seconds)
                return False
            except (OSError, asyncio.TimeoutError, TimeoutError):
                return True

        workers = sorted(dask_scheduler.workers)
        found = await asyncio.gather(*(is_silent(a) for a in workers))
        silent = [a for a, s in zip(workers, found) if s]
        if len(silent) < len(workers):
            for address in silent:
                await dask_scheduler.remove_worker(
                    address, stimulus_id=f"tracker-gpu-stalled-{address}", close=True
                )
        return workers, silent

    return stalled


def shard_arrays(client, arrays, shards=None):
    """`arrays` as dask arrays with the same chunks along the first axis (the shards) and one
    chunk along every other axis. Plain arrays are cut into `shards` pieces (default: one per
    worker thread); dask arrays keep their chunks, and give them to the plain ones."""
    import dask.array as da

    arrays = [data(a) for a in arrays]
    lengths = {a.shape[0] if getattr(a, "ndim", 0) else None for a in arrays}
    if None in lengths or len(lengths) > 1:
        shapes = ", ".join(str(tuple(getattr(a, "shape", ()))) for a in arrays)
        raise ValueError(
            f"the batch's arrays must all have the examples on their first axis, in the same "
            f"number; got shapes {shapes}"
        )
    if not arrays or not arrays[0].shape[0]:
        raise ValueError(
            "a data-parallel step needs a batch of at least one example: pass its arrays "
            "after the model, with the examples on the first axis"
        )
    lazy = [a for a in arrays if backend.is_lazy(a)]
    for a in lazy:
        if any(math.isnan(n) for sizes in a.chunks for n in sizes):
            raise ValueError(
                "a batch array's chunks are of unknown size (a boolean mask's result): the "
                "shards could not be weighted by their share; call .compute_chunk_sizes() on "
                "it first"
            )
    if lazy:
        rows = tuple(n for n in lazy[0].chunks[0] if n)  # an empty chunk is no shard
    else:
        n = arrays[0].shape[0]
        count = max(1, min(n, shards or sum(client.nthreads().values())))
        rows = (math.ceil(n / count),) * (n // math.ceil(n / count))
        rows = rows + ((n - sum(rows),) if n - sum(rows) else ())
    return [_rechunked(da, a, rows) for a in arrays]


def _rechunked(da, a, rows):
    chunks = (rows, *((s,) for s in a.shape[1:]))
    if backend.is_lazy(a):
        return a if a.chunks == chunks else a.rechunk(chunks)
    return da.from_array(a, chunks=chunks, name=f"batch-{uuid.uuid4().hex}")


def _as_node(model):
    """The model as one value of the step's graph (not traversed, hashed or copied)."""
    import dask

    return dask.delayed(model, name=f"model-{uuid.uuid4().hex}", traverse=False)


def _shard_seeds(model, shards):
    """`[{path: seed}]`, one per shard: for each NumPy generator of the model (a Dropout's), a
    seed per shard drawn from it, here, in a fixed order. Each shard then draws from its own
    generator (the workers' copies of the model's drew the same numbers at every step and in
    every shard, in an order that depended on the scheduling), a run is reproducible, and the
    model's generators move on, as they do in one process (whose masks are other numbers)."""
    drawn, seeds = {}, [{} for _ in range(shards)]

    def note(path, x):
        if isinstance(x, GENERATORS):
            if id(x) not in drawn:
                draw = x.integers if isinstance(x, np.random.Generator) else x.randint
                drawn[id(x)] = draw(0, 2**62, size=shards, dtype=np.int64).tolist()
            for shard, seed in zip(seeds, drawn[id(x)]):
                shard[path or "_"] = seed
        return x

    tree_map_with_path(note, model)
    return seeds


def _reseeded(model, seeds):
    """`model` with each generator a new one from its shard's seed (`_shard_seeds`); the
    places of one generator share the new one."""
    made = {}

    def fill(path, x):
        if not isinstance(x, GENERATORS):
            return x
        seed = seeds[path or "_"]
        if seed not in made:
            made[seed] = np.random.default_rng(seed)
        return made[seed]

    return tree_map_with_path(fill, model) if seeds else model


def _shard_gradient_task(f, mean, total):
    import dask

    def shard_gradient(model, seeds, *arrays):
        """`(loss, grad, aux)` of one shard, weighted by its share of the batch."""
        weight = arrays[0].shape[0] / total if mean else 1.0
        model = _reseeded(model, seeds)
        model, arrays = tree_map(_aligned, model), [_aligned(a) for a in arrays]
        val, (grad,) = _withgradient(lambda m: f(m, *arrays), model)
        loss, aux = (val[0], val[1:]) if isinstance(val, tuple) else (val, None)
        grad = tree_map(lambda g: g if g is None else g * weight, grad)
        return data(loss) * weight, grad, None if aux is None else [[data(a)] for a in aux]

    return dask.delayed(shard_gradient, pure=True)


def _aligned(x):
    """`x`, copied where it is a NumPy array whose data is not aligned for its dtype: arrays
    that arrive in a message may sit at any offset of its frame, and NumPy's matmul takes
    another loop (another order of additions, other last bits) on unaligned data, so a shard's
    gradient would depend on where its arrays happened to land."""
    if isinstance(x, np.ndarray) and not x.flags.aligned:
        return x.copy()
    return x


def _tree_sum(parts):
    """The sum of `parts` by a binary tree, neighbours first: always the same additions in the
    same order, wherever and whenever they run."""
    import dask

    add = dask.delayed(_add_parts, pure=True)
    while len(parts) > 1:
        pairs = [add(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        parts = pairs + parts[len(parts) - len(parts) % 2 :]
    return dask.delayed(_joined)(parts[0])


def _add_parts(a, b):
    (loss_a, grad_a, aux_a), (loss_b, grad_b, aux_b) = a, b
    grad = tree_map(_add_or_none, grad_a, grad_b)
    aux = None if aux_a is None else [x + y for x, y in zip(aux_a, aux_b)]
    return loss_a + loss_b, grad, aux


def _add_or_none(a, b):
    if a is None:
        return b
    return a if b is None else a + b


def _joined(part):
    """The summed part, its auxiliary outputs joined along the batch."""
    loss, grad, aux = part
    if aux is not None:
        aux = [_concat(pieces) for pieces in aux]
    return loss, grad, aux


def _concat(pieces):
    xp = backend.namespace_of(pieces[0]) if backend.is_array(pieces[0]) else np
    if pieces[0].ndim == 0:
        raise ValueError(
            "an auxiliary output of the loss is a scalar: only outputs with the examples on "
            "their first axis (logits, say) can be joined across shards; return those"
        )
    return xp.concat(pieces, axis=0)
