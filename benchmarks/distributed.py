"""Out-of-core gradients and data-parallel training steps on Dask.

    python benchmarks/distributed.py [--quick] [--json PATH]

- out of core: the gradient of a logistic regression's mean loss over a chunked float64 data
  matrix of `--values` values (default 2^28, 2 GiB), made chunk by chunk with `da.map_blocks`
  and never held whole. tracker_gpu's gradient (`tg.withgradient` on the dask array, then one
  `dask.compute`) beside the same gradient written by hand with dask.array. Each runs in a fresh
  process on Dask's threaded scheduler; the figures are its wall time and its peak resident
  memory above what the process held before (the high-water mark of `getrusage`). The two
  gradients are compared.
- data parallel: training steps per second of `tracker_gpu.distributed.step` on a LocalCluster
  of 1 and of 2 worker processes (one thread each), on a compute-bound wide MLP (a large batch
  held on the workers); and the per-step overhead of the cluster on a small model, against the
  same step run here with `tg.withgradient` and `optim.update`.

Targets (a benchmark, not a test): the out-of-core peak under a quarter of the data's size;
2 workers at least 1.4x the steps per second of 1 worker.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

# This file's folder leaves the path: its name would hide the `distributed` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

MIB = 1 << 20
TARGET_MEMORY = 0.25  # peak memory over the data's size
TARGET_SPEEDUP = 1.4  # steps/s of 2 workers over 1


# --- out of core: a logistic regression over a chunked data matrix
def data_matrix(values, cols, chunk_rows):
    """The lazy data matrix (`values` float64, `cols` columns) and its labels: each chunk made
    on request from its own seed, the labels from the chunk's first two columns."""
    import dask.array as da

    rows = values // cols
    chunks = ((chunk_rows,) * (rows // chunk_rows), (cols,))

    def make(block_id=None):
        rng = np.random.default_rng([11, block_id[0]])
        return rng.standard_normal((chunk_rows, cols))

    x = da.map_blocks(make, chunks=chunks, dtype=np.float64)
    y = da.sign(x[:, 0] + 0.5 * x[:, 1])
    return x, y


def tracker_gradient(x, y, w):
    """The loss and its gradient by tracker_gpu, lazily; computed together below."""
    import tracker_gpu as tg

    def loss(w):
        return tg.mean(tg.logaddexp(0.0, -y * (x @ w)))

    val, (g,) = tg.withgradient(loss, w)
    return tg.data(val), g


def hand_gradient(x, y, w):
    """The same loss and gradient written by hand with dask.array."""
    import dask.array as da

    margin = -y * (x @ w)
    val = da.mean(da.logaddexp(0.0, margin))
    weight = -y / (1.0 + da.exp(-margin)) / x.shape[0]  # d loss / d (x @ w)
    return val, x.T @ weight


def out_of_core_child(kind, values, cols, chunk_rows, threads):
    """Run in a fresh process: one gradient, its time and its peak memory as JSON."""
    import dask

    x, y = data_matrix(values, cols, chunk_rows)
    w = np.linspace(-0.5, 0.5, cols)
    before = _resident()
    start = time.perf_counter()
    lazy = tracker_gradient(x, y, w) if kind == "tracker_gpu" else hand_gradient(x, y, w)
    val, g = dask.compute(*lazy, scheduler="threads", num_workers=threads)
    seconds = time.perf_counter() - start
    peak = _peak_resident() - before
    print(json.dumps({"seconds": seconds, "peak": peak, "loss": float(val), "grad": list(g)}))


def _resident():
    """This process's resident memory now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_resident():
    """This process's highest resident memory so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def out_of_core(values, cols, chunk_rows, threads):
    """Both gradients, each in its own process; their figures and the difference of results."""
    results = {}
    for kind in ("tracker_gpu", "dask.array by hand"):
        args = [kind, str(values), str(cols), str(chunk_rows), str(threads)]
        proc = subprocess.run(
            [sys.executable, __file__, "--child", *args], capture_output=True, text=True
        )
        if proc.returncode:
            raise RuntimeError(f"the {kind} gradient failed:\n{proc.stderr[-3000:]}")
        results[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    ours, hand = results["tracker_gpu"], results["dask.array by hand"]
    difference = float(np.max(np.abs(np.subtract(ours["grad"], hand["grad"]))))
    scale = float(np.max(np.abs(hand["grad"])))
    return {
        "values": values,
        "data_bytes": values * 8,
        "chunk_bytes": chunk_rows * cols * 8,
        "threads": threads,
        "runs": {k: {"seconds": r["seconds"], "peak": r["peak"]} for k, r in results.items()},
        "relative_difference": difference / scale,
        "loss_difference": abs(ours["loss"] - hand["loss"]),
    }


# --- data parallel: steps per second on 1 and 2 workers
def wide_mlp(width, inputs, seed=0):
    from tracker_gpu import nn

    rng = np.random.default_rng(seed)
    return nn.Chain(
        nn.Dense(inputs, width, nn.relu, rng=rng, dtype="float32"),
        nn.Dense(width, width, nn.relu, rng=rng, dtype="float32"),
        nn.Dense(width, 10, rng=rng, dtype="float32"),
    )


def mlp_loss(model, x, y):
    from tracker_gpu import nn

    return nn.logitcrossentropy(model(x), y)


def batch_on(client, rows, inputs, shards):
    """A batch made on the workers (chunk by chunk) and kept there: one chunk per shard."""
    import dask.array as da

    def make(block_id=None):
        rng = np.random.default_rng([5, block_id[0]])
        return rng.standard_normal((rows // shards, inputs)).astype(np.float32)

    x = da.map_blocks(make, chunks=((rows // shards,) * shards, (inputs,)), dtype=np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0).astype(np.int64)
    x, y = client.persist([x, y])
    return x, y


def steps_per_second(client, model, x, y, steps):
    """Steps per second of `tracker_gpu.distributed.step` with Descent, after one warm-up."""
    from tracker_gpu import optim
    from tracker_gpu.distributed import step

    state = optim.setup(optim.Descent(1e-3), model)
    _, model, state = step(client, mlp_loss, model, state, x, y)
    start = time.perf_counter()
    for _ in range(steps):
        _, model, state = step(client, mlp_loss, model, state, x, y)
    return steps / (time.perf_counter() - start)


def local_steps_per_second(model, x, y, steps):
    """The same steps run here, without a cluster."""
    import tracker_gpu as tg
    from tracker_gpu import optim

    state = optim.setup(optim.Descent(1e-3), model)
    start = None
    for i in range(steps + 1):
        if i == 1:
            start = time.perf_counter()
        _, (grad,) = tg.withgradient(lambda m: mlp_loss(m, x, y), model)
        state, model = optim.update(state, model, grad)
    return steps / (time.perf_counter() - start)


def data_parallel(width, inputs, rows, steps, small_steps):
    """Steps/s of the wide MLP on 1 and on 2 workers (each step's batch split in two shards);
    on the 1-worker cluster, also the per-step overhead of a small model."""
    from tracker_gpu.distributed import cluster

    rates, small = {}, None
    for workers in (1, 2):
        with cluster(workers=workers) as client:
            x, y = batch_on(client, rows, inputs, shards=2)
            rates[workers] = steps_per_second(client, wide_mlp(width, inputs), x, y, steps)
            if workers == 1:
                small = overhead(client, small_steps)
    return {"width": width, "inputs": inputs, "batch": rows, "steps": steps, "rates": rates}, small


def overhead(client, steps):
    """Seconds per step of a small MLP (64-32-32-10, batch 64) on the cluster and here."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    model = wide_mlp(32, 64)
    local = 1 / local_steps_per_second(model, x, y, steps)
    remote = 1 / steps_per_second(client, model, x, y, steps)
    return {"local": local, "cluster": remote, "overhead": remote - local}


# --- the report
def targets(figures):
    ooc = figures["out_of_core"]["runs"]["tracker_gpu"]
    share = ooc["peak"] / figures["out_of_core"]["data_bytes"]
    rates = figures["data_parallel"]["rates"]
    speedup = rates[2] / rates[1]
    return [
        {
            "name": "out-of-core peak memory under a quarter of the data",
            "value": share,
            "met": share < TARGET_MEMORY,
        },
        {
            "name": f"2 workers at least {TARGET_SPEEDUP}x the steps/s of 1",
            "value": speedup,
            "met": speedup >= TARGET_SPEEDUP,
        },
    ]


def report(figures):
    ooc = figures["out_of_core"]
    print(
        f"out of core: {ooc['values']} float64 values ({ooc['data_bytes'] / MIB:.0f} MiB), "
        f"chunks of {ooc['chunk_bytes'] / MIB:.1f} MiB, {ooc['threads']} threads"
    )
    print(f"  {'gradient':<22}{'seconds':>10}{'peak MiB':>12}{'peak/data':>11}")
    for kind, run in ooc["runs"].items():
        share = run["peak"] / ooc["data_bytes"]
        print(f"  {kind:<22}{run['seconds']:>10.2f}{run['peak'] / MIB:>12.1f}{share:>11.3f}")
    print(f"  largest difference of the gradients (relative): {ooc['relative_difference']:.2e}")
    dp = figures["data_parallel"]
    print(
        f"data parallel: MLP {dp['inputs']}-{dp['width']}-{dp['width']}-10 float32, "
        f"batch {dp['batch']} in 2 shards, {dp['steps']} steps"
    )
    for workers, rate in dp["rates"].items():
        print(f"  {workers} worker{'s' if workers > 1 else ' '}  {rate:8.2f} steps/s")
    oh = figures["overhead"]
    print(
        f"small model (64-32-32-10, batch 64): {oh['local'] * 1e3:.2f} ms/step here, "
        f"{oh['cluster'] * 1e3:.2f} ms/step on a 1-worker cluster: overhead "
        f"{oh['overhead'] * 1e3:.2f} ms/step"
    )
    print("targets:")
    for target in figures["targets"]:
        status = "met" if target["met"] else "MISSED"
        print(f"  {target['name']}: {target['value']:.3f} ({status})")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, values, cols, chunk_rows, threads = sys.argv[2:]
        out_of_core_child(kind, int(values), int(cols), int(chunk_rows), int(threads))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--values", type=int, help="values in the data matrix (default 2^28)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    quick = args.quick
    values = args.values or (1 << 20 if quick else 1 << 28)
    cols = 64 if quick else 256
    chunk_rows = min(values // cols, 1 << 10 if quick else 1 << 13)  # 16 MiB chunks at full size
    dp, small = data_parallel(
        width=64 if quick else 1024,
        inputs=32 if quick else 512,
        rows=256 if quick else 16384,
        steps=2 if quick else 10,
        small_steps=3 if quick else 30,
    )
    ooc = out_of_core(values, cols, chunk_rows, threads=2)
    figures = {"out_of_core": ooc, "data_parallel": dp, "overhead": small}
    figures["targets"] = targets(figures)
    report(figures)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
