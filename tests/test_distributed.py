"""Data-parallel training on a dask.distributed LocalCluster, and an out-of-core gradient on a
worker too small to hold its data. They run once, in the matrix's dask row."""

import os
import signal
from pathlib import Path

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed", reason='pip install "tracker-gpu[dask]"')
tgd = pytest.importorskip("tracker_gpu.distributed")


@pytest.fixture(autouse=True)
def once(request):
    if request.config.getoption("backend") != "dask":
        pytest.skip("the cluster tests run once, in the dask row (--backend dask)")


@pytest.fixture(scope="module")
def client(request):
    if request.config.getoption("backend") != "dask":
        pytest.skip("the cluster tests run once, in the dask row (--backend dask)")
    with tgd.cluster(workers=2) as client:
        yield client


def mlp(seed=0, sizes=(64, 32, 10)):
    rng = np.random.default_rng(seed)
    first, hidden, out = sizes
    return nn.Chain(
        nn.Dense(first, hidden, nn.relu, rng=rng, dtype="float64"),
        nn.Dense(hidden, out, rng=rng, dtype="float64"),
    )


def loss_and_logits(model, x, y):
    logits = model(x)
    return nn.logitcrossentropy(logits, y), logits


def batch(n=50, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 64)), rng.integers(0, 10, n)


def parameters(tree):
    return nn._parameters(tree)


def assert_trees_close(ours, theirs, rtol=1e-12):
    ours, theirs = parameters(ours), parameters(theirs)
    assert ours.keys() == theirs.keys() and ours
    for path in ours:
        assert np.allclose(ours[path], theirs[path], rtol=rtol, atol=1e-14), path


@pytest.mark.parametrize("shards", [1, 2, 3, 7])
def test_gradient_equals_the_single_process_gradient(client, shards):
    model, (x, y) = mlp(), batch()
    (val, logits), (grad,) = tgd.withgradient(client, loss_and_logits, model, x, y, shards=shards)
    (ref_val, ref_logits), (ref,) = tg.withgradient(lambda m: loss_and_logits(m, x, y), model)
    assert np.isclose(val, tg.data(ref_val), rtol=1e-13)
    assert np.allclose(logits, tg.data(ref_logits), rtol=1e-13)  # joined in batch order
    assert_trees_close(grad, ref)


def test_dask_batches_are_split_by_their_chunks_and_sums_add_up(client):
    model, (x, y) = mlp(), batch(40)
    xs, ys = da.from_array(x, chunks=(15, 64)), da.from_array(y, chunks=15)
    sum_loss = lambda m, x, y: nn.logitcrossentropy(m(x), y, agg="sum")
    val, (grad,) = tgd.withgradient(client, sum_loss, model, xs, ys, mean=False)
    ref_val, (ref,) = tg.withgradient(lambda m: sum_loss(m, x, y), model)
    assert np.isclose(val, tg.data(ref_val), rtol=1e-13)
    assert_trees_close(grad, ref)
    assert [len(c) for c in tgd.shard_arrays(client, (xs, y))[1].chunks] == [3]


def test_runs_are_reproducible(client):
    model, (x, y) = mlp(), batch(64)
    runs = [tgd.withgradient(client, loss_and_logits, model, x, y, shards=4) for _ in range(2)]
    for a, b in zip(parameters(runs[0].grad[0]).values(), parameters(runs[1].grad[0]).values()):
        assert np.array_equal(a, b)


def test_a_worker_error_is_the_users_error(client):
    def broken(model, x):
        raise ValueError("the loss found a bad shard")

    with pytest.raises(ValueError, match="the loss found a bad shard") as caught:
        tgd.withgradient(client, broken, mlp(), batch()[0])
    assert caught.type is ValueError  # the user's own exception, with their traceback
    assert any(entry.name == "broken" for entry in caught.traceback)


def test_bad_batches_are_refused_clearly(client):
    x, y = batch()
    with pytest.raises(ValueError, match="examples on their first axis, in the same number"):
        tgd.withgradient(client, loss_and_logits, mlp(), x, y[:-1])
    with pytest.raises(ValueError, match="at least one example"):
        tgd.withgradient(client, loss_and_logits, mlp(), x[:0], y[:0])


def test_a_dask_batch_with_an_empty_chunk_is_the_whole_batchs(client):
    """An empty chunk was a shard of no examples: its mean was nan, and the step raised that
    the loss was not finite."""
    model, (x, y) = mlp(), batch(11)
    xs, ys = da.from_array(x, chunks=((5, 0, 6), (64,))), da.from_array(y, chunks=((5, 0, 6),))
    val, (grad,) = tgd.withgradient(client, lambda m, x, y: loss_and_logits(m, x, y)[0],
                                    model, xs, ys)  # fmt: skip
    ref_val, (ref,) = tg.withgradient(lambda m: loss_and_logits(m, x, y)[0], model)
    assert np.isclose(val, tg.data(ref_val), rtol=1e-13)
    assert_trees_close(grad, ref)


def test_a_dask_batch_of_unknown_chunk_sizes_is_refused(client):
    """A boolean mask's result has chunks of unknown size: each shard's weight was nan, and
    the loss, the gradient and the stepped model nan, silently."""
    x, y = batch(11)
    xs = da.from_array(x, chunks=(4, 64))
    masked = xs[xs[:, 0] > -np.inf]  # every row, in chunks of unknown size
    with pytest.raises(ValueError, match=r"unknown size .*compute_chunk_sizes\(\)"):
        tgd.withgradient(client, lambda m, x: tg.sum(m(x)), mlp(), masked)


def test_a_batch_norm_in_training_is_refused_naming_it(client):
    """Each shard normalised by its own statistics, and the running ones were updated in the
    workers' copies: a step unlike one process's, without a word."""
    model = nn.Chain(nn.Dense(64, 4, dtype="float64"), nn.BatchNorm(4, dtype="float64"))
    x, _ = batch(8)
    with pytest.raises(ValueError, match=r"batch statistics in training \(layers.1\).*testmode"):
        tgd.withgradient(client, lambda m, x: tg.mean(m(x)), model, x, shards=2)
    val, _ = tgd.withgradient(client, lambda m, x: tg.mean(m(x)), nn.testmode(model), x, shards=2)
    assert np.isclose(val, tg.data(tg.mean(nn.testmode(model)(x))), rtol=1e-12)


def _kept(model, x):
    h = model(x)
    return tg.mean(h**2), (tg.data(h) != 0).astype(float)  # each example's Dropout mask


def _dropped_out():
    return nn.Chain(nn.Dense(8, 8, rng=np.random.default_rng(1), dtype="float64"),
                    nn.Dropout(0.5, rng=np.random.default_rng(0)))  # fmt: skip


def test_a_dropout_draws_anew_in_each_shard_and_step_and_runs_reproduce(client):
    """The workers' copies of the model's generator drew the same numbers at every step and
    in every shard, in an order the scheduling chose, and the model's own never moved: two
    shards got one mask, and two runs ended with different models."""
    x = np.ones((4, 8))
    runs = []
    for _ in range(2):
        model, masks = _dropped_out(), []
        state = optim.setup(optim.Descent(1e-3), model)
        before = model.layers[1].rng.bit_generator.state["state"]["state"]
        for _ in range(3):
            (_, kept), model, state = tgd.step(client, _kept, model, state, x, shards=2)
            masks.append(kept)
        assert model.layers[1].rng.bit_generator.state["state"]["state"] != before
        runs.append((model, masks))
    (model, masks), (again, masks_again) = runs
    assert all(not np.array_equal(k[:2], k[2:]) for k in masks)  # the shards' masks differ
    assert not any(np.array_equal(a, b) for a, b in zip(masks, masks[1:]))  # and the steps'
    assert all(np.array_equal(a, b) for a, b in zip(masks, masks_again))
    assert_trees_close(model, again, rtol=0)


def test_a_gradient_is_the_same_bits_whatever_its_arrays_offsets_in_a_message(client):
    """Arrays arrive at any offset of a message's frame; an unaligned one took NumPy's other
    matmul loop, so the same step gave other last bits from one call to the next."""
    model, (x, y) = mlp(), batch(48, 0)
    first = None
    for _ in range(6):
        _, (grad,) = tgd.withgradient(client, loss_and_logits, model, x, y, shards=2)
        found = parameters(grad)
        first = first or found
        assert all(np.array_equal(found[k], first[k]) for k in first)


def train(client, steps, kill=None, stop=None, **options):
    """`steps` Adam steps of the MLP on fixed batches; `kill` (`stop`) is a trigger file: the
    shard task that finds it kills (stops) its own worker process, once. `options` go to
    `tgd.step`."""
    model = mlp()
    state = optim.setup(optim.Adam(1e-2), model)
    data = [batch(48, seed) for seed in range(steps)]

    trigger, sig = (kill, signal.SIGKILL) if kill is not None else (stop, signal.SIGSTOP)

    def loss(m, x, y):
        if trigger is not None:
            try:
                os.rename(trigger, str(trigger) + ".done")  # atomic: exactly one task takes it
            except FileNotFoundError:
                pass
            else:
                os.kill(os.getpid(), sig)
        return nn.logitcrossentropy(m(x), y)

    for i, (x, y) in enumerate(data):
        if trigger is not None and i == steps // 2:
            Path(trigger).touch()
        _, model, state = tgd.step(client, loss, model, state, x, y, shards=2, **options)
    return model


def test_a_killed_worker_does_not_lose_the_run(client, tmp_path):
    reference = train(client, 6)
    trigger = tmp_path / "kill"
    pids = set(client.run(os.getpid).values())
    model = train(client, 6, kill=trigger)
    assert Path(str(trigger) + ".done").exists(), "no worker was killed"
    client.wait_for_workers(2, timeout=60)
    assert set(client.run(os.getpid).values()) != pids  # a new process took the killed one's place
    for a, b in zip(parameters(model).values(), parameters(reference).values()):
        assert np.array_equal(a, b)


# A second cluster beside the module's: its dashboard takes another port than 8787, and says so.
@pytest.mark.filterwarnings("ignore:Port 8787 is already in use:UserWarning")
def test_a_stopped_worker_is_named_and_the_run_goes_on_without_it(tmp_path):
    """One of two workers stopped (SIGSTOP) in the middle of a step: after the step's timeout it
    is named and removed, its shard computed by the other, and the weights are those of the
    undisturbed run, bit for bit. The stopped process is killed at the end."""
    import warnings

    trigger = tmp_path / "stop"

    def stopping_train(client):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", tgd.StalledWorkerWarning)
            model = train(client, 4, stop=trigger, timeout=3)
        return model, [w for w in caught if issubclass(w.category, tgd.StalledWorkerWarning)]

    with tgd.cluster(workers=2) as client:
        reference = train(client, 4)
        (model, stalled), stopped = _with_stopped_workers(client, stopping_train)
    assert Path(str(trigger) + ".done").exists(), "no worker was stopped"
    assert len(stopped) == 1
    assert len(stalled) == 1 and stopped[0] in str(stalled[0].message)
    assert "did not answer within 3 s and was removed" in str(stalled[0].message)
    for a, b in zip(parameters(model).values(), parameters(reference).values()):
        assert np.array_equal(a, b)


# A second cluster beside the module's: its dashboard takes another port than 8787, and says so.
@pytest.mark.filterwarnings("ignore:Port 8787 is already in use:UserWarning")
def test_a_step_no_worker_answers_stops_naming_them(tmp_path):
    """The only worker stopped in the middle of a step: after the timeout the step raises
    `StalledWorkers` naming it, instead of waiting for ever."""

    def stopping_train(client):
        with pytest.raises(tgd.StalledWorkers, match="no worker answered within 1 s") as caught:
            train(client, 2, stop=tmp_path / "stop", timeout=1)
        return caught.value

    with tgd.cluster(workers=1) as client:
        error, stopped = _with_stopped_workers(client, stopping_train)
    assert len(stopped) == 1 and error.workers == stopped and stopped[0] in str(error)


def _with_stopped_workers(client, run, seconds=30):
    """`run(client)` in a thread, at most `seconds` (today's step would wait for ever on a
    stopped worker), and the addresses of the workers stopped then; stopped workers are
    killed at the end, which lets a step that waits for them finish."""
    import concurrent.futures

    psutil = pytest.importorskip("psutil")
    pids = client.run(os.getpid)  # address: pid
    stopped = []
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(run, client)
            try:
                return running.result(timeout=seconds), stopped
            finally:
                stopped += [a for a, pid in pids.items() if _is_stopped(psutil, pid)]
                _kill_stopped(psutil, pids.values())
    finally:
        _kill_stopped(psutil, pids.values())


def _is_stopped(psutil, pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def _kill_stopped(psutil, pids):
    for pid in pids:
        if _is_stopped(psutil, pid):
            os.kill(pid, signal.SIGKILL)  # SIGKILL reaches a stopped process


def test_the_digits_mlp_learns_as_well_data_parallel(client):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    split = train_test_split(bunch.data / 16.0, bunch.target, test_size=0.25, random_state=0)
    train_x, test_x, train_y, test_y = split
    batches = [(train_x[i : i + 128], train_y[i : i + 128]) for i in range(0, len(train_x), 128)]
    loss = lambda m, x, y: nn.logitcrossentropy(m(x), y)

    def fit(one_step):
        model = mlp(seed=3)
        state = optim.setup(optim.Adam(1e-2), model)
        for _ in range(3):
            for x, y in batches:
                model, state = one_step(model, state, x, y)
        return model, np.mean(np.argmax(tg.data(model(test_x)), axis=1) == test_y)

    def local(model, state, x, y):
        _, (grad,) = tg.withgradient(lambda m: loss(m, x, y), model)
        return optim.update(state, model, grad)[::-1]

    def parallel(model, state, x, y):
        return tgd.step(client, loss, model, state, x, y)[1:]

    (model, accuracy), (ref_model, ref_accuracy) = fit(parallel), fit(local)
    assert ref_accuracy > 0.85  # three epochs; the point is the equality below
    assert accuracy == ref_accuracy
    assert_trees_close(model, ref_model, rtol=1e-9)


# A second cluster beside the module's: its dashboard takes another port than 8787, and says so.
@pytest.mark.filterwarnings("ignore:Port 8787 is already in use:UserWarning")
def test_out_of_core_gradient_on_a_worker_smaller_than_the_data():
    """A 256 MiB data matrix, made chunk by chunk on a worker limited to 320 MiB: holding the
    matrix whole kills the worker, its logistic-regression gradient computes."""
    rows, cols, chunk = 1 << 21, 16, 1 << 16  # 2^25 float64 values; chunks of 8 MiB
    w = np.linspace(-0.5, 0.5, cols)

    def make(block_id):
        rng = np.random.default_rng([7, block_id[0]])
        return rng.standard_normal((chunk, cols))

    def loss(w, x):
        y = tg.sign(x[:, 0] + 0.5 * x[:, 1])
        return tg.mean(tg.log1p(tg.exp(-y * (x @ w))))

    memory = {"target": False, "spill": False, "pause": False, "terminate": 0.95}
    config = {f"distributed.worker.memory.{key}": value for key, value in memory.items()}
    config["distributed.scheduler.allowed-failures"] = 0
    with dask.config.set(config), tgd.cluster(workers=1, memory_limit="320MiB") as client:
        x = da.map_blocks(make, chunks=((chunk,) * (rows // chunk), (cols,)), dtype=np.float64)
        _, (g,) = tg.withgradient(lambda w: loss(w, x), w)
        grad = client.compute(g).result()
        with pytest.raises(distributed.KilledWorker):
            client.compute((x + 0.0).persist()).result()  # hold all of it: more than the limit
    expected = np.zeros(cols)
    for i in range(rows // chunk):  # the same gradient in NumPy, one chunk at a time
        xi = make((i, 0))
        yi = np.sign(xi[:, 0] + 0.5 * xi[:, 1])
        expected -= (xi * (yi / (1 + np.exp(yi * (xi @ w))))[:, None]).sum(axis=0) / rows
    assert np.allclose(grad, expected, rtol=1e-10)


# A second cluster beside the module's: its dashboard takes another port than 8787, and says so.
@pytest.mark.filterwarnings("ignore:Port 8787 is already in use:UserWarning")
def test_the_main_job_trains_data_parallel(client, tmp_path, capsys):
    """`--scheduler` joins a running cluster, `--workers` starts one: both train the MLP as the
    single process does (up to the order of the shards' sums)."""
    train = pytest.importorskip("tracker_gpu.train")
    common = ["--backend", "numpy", "--models", "mlp", "--epochs", "2", "--batch-size", "256"]
    common += ["--plot", "", "--no-progress"]
    (local,) = train.run(common)
    (joined,) = train.run([*common, "--scheduler", client.scheduler.address])
    (started,) = train.run([*common, "--workers", "1"])
    for result in (joined, started):
        assert np.allclose(result.history["loss"], local.history["loss"], rtol=1e-6)
        assert result.history["test_accuracy"] == local.history["test_accuracy"]
        ours, theirs = parameters(result.model), parameters(local.model)
        assert ours.keys() == theirs.keys() and ours
        for path in ours:  # float32 weights
            assert np.allclose(ours[path], theirs[path], rtol=1e-5, atol=1e-6), path
    assert local.history["loss"][1] < local.history["loss"][0]
    assert "mlp: test accuracy" in capsys.readouterr().out


def test_the_main_job_refuses_bad_cluster_arguments(capsys):
    train = pytest.importorskip("tracker_gpu.train")
    with pytest.raises(SystemExit):
        train.main(["--workers", "2", "--scheduler", "tcp://127.0.0.1:8786"])
    assert "pass one of them" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--backend", "torch", "--workers", "2", "--no-progress", "--plot", ""])
    assert "pass --backend numpy" in capsys.readouterr().err
