"""Peak memory of a gradient: tracker_gpu beside hand-written NumPy, HIPS autograd and MyGrad.

    python benchmarks/memory.py [--quick] [--json PATH]
    python benchmarks/memory.py --backend cupy     # on a GPU: CuPy's memory pool, PyTorch CUDA

Each workload runs once to warm up, then once under `tracemalloc` (which sees every NumPy
buffer): the figure is the peak of memory allocated during the call above what was allocated
before it, in MB, and its ratio to the same computation written by hand in NumPy (which keeps
only what its backward pass needs). Every library's gradients are checked against NumPy's.

- wide: `sum(x*w[0] + ... + x*w[n-1])`, 1,000 float64 used 10,000 times;
- chain: `y = y * c` 100,000 times on 16 float64;
- mlp step: the training step of `train_step.py` (784-128-10, tanh, batch 64, float32, the
  logit cross-entropy, Adam); the peers compute the gradient, then the same Adam by hand;
- residual: a 20-block residual MLP, each block `h + relu(h @ W1 + b1) @ W2 + b2` (width 64,
  hidden 256, batch 1,024, float64), loss `sum(h**2)`, gradients of every weight;
- residual, checkpoint: the same with each block in `tg.checkpoint` (autograd's `checkpoint`);
- writes: a 256-wide matrix filled row by row, each row from its own data or from the row
  before (see write_workloads.py);
- text step: the text job's training step (`text.py`: a 2-layer causal transformer, width 64,
  4 heads, context 64, batch 32, float32, AdamW, clipping), tracker_gpu eager and compiled
  beside the same model in PyTorch (`--quick`: batch 8).

Targets (a benchmark, not a test): wide at most autograd's peak; the MLP step and the residual
MLP at most 1.2x the hand-written NumPy; with a checkpoint per block, the residual MLP at most
half of its peak without; both writes at most 2.5x by hand (which keeps no copy of the rows it
reads; a copy of the whole matrix per write would be about 130x); the chain no worse than 40.8
MB (before the tape kept only what pullbacks need). PyTorch's CPU allocator is invisible to
tracemalloc: its column is measured on a GPU (`--backend cupy`, PyTorch's CUDA allocator,
where the tracker_gpu figures come from CuPy's memory pool), and for the text step on the CPU by
PyTorch's own `MemTracker` (which follows every tensor a dispatched operation makes): the peak
of the tensors alive during the step less the parameters, buffers and optimiser state that
exist before it. tracker_gpu's optimiser returns new parameters and state (the old ones are
freed when the caller drops them), so its peak includes one new copy of them; PyTorch's
updates in place. Not shown: time (see peers.py), and
memory outside the call (the parameters and optimiser state that exist before and after it).
"""

import argparse
import gc
import json
import sys

import numpy as np
from peer_measure import as_numpy, peak_tracemalloc
from peer_workloads import long_chain_builders, wide_builders
from write_workloads import write_builders

import tracker_gpu as tg

MB = 1e6
PEERS = ("numpy", "tracker_gpu", "autograd", "mygrad")
CHAIN_BEFORE_MB = 40.8  # tracker_gpu's chain peak before the graph was kept apart from values


# --- the residual MLP
def residual_problem(blocks=20, width=64, hidden=256, batch=1024, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, width)) * 0.5
    params = []
    for _ in range(blocks):
        params += [
            rng.standard_normal((width, hidden)) / np.sqrt(width) * 0.5,
            np.zeros(hidden),
            rng.standard_normal((hidden, width)) / np.sqrt(hidden) * 0.5,
            np.zeros(width),
        ]
    return x, params


def residual_block(relu, h, w1, b1, w2, b2):
    return h + relu(h @ w1 + b1) @ w2 + b2


def residual_by_hand(xp, x, params):
    """Forward keeping each block's input and activation, backward by hand."""
    kept, h = [], x
    for i in range(0, len(params), 4):
        w1, b1, w2, b2 = params[i : i + 4]
        r = xp.maximum(h @ w1 + b1, 0.0)
        kept.append((h, r))
        h = h + r @ w2 + b2
    loss, gh = xp.sum(h * h), 2 * h
    grads = [None] * len(params)
    for i in reversed(range(0, len(params), 4)):
        h_in, r = kept.pop()
        w1, w2 = params[i], params[i + 2]
        grads[i + 2], grads[i + 3] = r.T @ gh, xp.sum(gh, axis=0)
        gr = (gh @ w2.T) * (r > 0)
        grads[i], grads[i + 1] = h_in.T @ gr, xp.sum(gr, axis=0)
        gh = gh + gr @ w1.T
        del h_in, r, gr
    return loss, grads


def tracker_residual(x, params, checkpointed):
    """`withgradient` of the residual MLP's loss with respect to every weight."""
    block = lambda h, *b: residual_block(tg.nn.relu, h, *b)  # noqa: E731

    def loss(*ps):
        h = x
        for i in range(0, len(ps), 4):
            h = (
                tg.checkpoint(block, h, *ps[i : i + 4])
                if checkpointed
                else block(h, *ps[i : i + 4])
            )
        return tg.sum(h * h)

    return lambda: _as_pair(tg.withgradient(loss, *params))


def _as_pair(result):
    return result.val, list(result.grad)


def residual_builders(checkpointed, batch):
    x, params = residual_problem(batch=batch)

    def autograd_():
        import autograd
        import autograd.numpy as anp
        from autograd import checkpoint as ag_checkpoint

        step = lambda h, *b: residual_block(lambda a: anp.maximum(a, 0.0), h, *b)  # noqa: E731
        block = ag_checkpoint(step) if checkpointed else step

        def loss(ps):
            h = x
            for i in range(0, len(ps), 4):
                h = block(h, *ps[i : i + 4])
            return anp.sum(h * h)

        f = autograd.value_and_grad(loss)
        return lambda: f(list(params))

    def mygrad_():
        if checkpointed:
            raise NotImplementedError("MyGrad has no checkpoint")
        import mygrad as mg

        def run():
            ps = [mg.tensor(p) for p in params]
            h = mg.tensor(x, constant=True)
            for i in range(0, len(ps), 4):
                h = residual_block(lambda a: mg.maximum(a, 0.0), h, *ps[i : i + 4])
            loss = mg.sum(h * h)
            loss.backward()
            return loss, [p.grad for p in ps]

        return run

    return {
        "numpy": lambda: lambda: residual_by_hand(np, x, params),
        "tracker_gpu": lambda: tracker_residual(x, params, checkpointed),
        "autograd": autograd_,
        "mygrad": mygrad_,
    }


# --- the MLP training step of train_step.py
def mlp_builders():
    from train_step import (
        BETA1,
        BETA2,
        EPS,
        LR,
        make_problem,
        numpy_setup,
        numpy_step,
        tracker_setup,
        tracker_step,
    )

    x, labels, model = make_problem(64)
    onehot = np.eye(10, dtype=np.float32)[labels]
    params, moments, _ = numpy_setup(model)

    def adam_by_hand(grads):  # the peers' update: the textbook Adam, as the NumPy step's
        out = []
        for p, g, (m, v) in zip(params, grads, moments):
            m = BETA1 * m + (1 - BETA1) * g
            v = BETA2 * v + (1 - BETA2) * g * g
            out.append(p - LR * (m / (1 - BETA1)) / (np.sqrt(v / (1 - BETA2)) + EPS))
        return out

    def loss_of(xp, p):
        w1, b1, w2, b2 = p
        logits = xp.tanh(x @ w1.T + b1) @ w2.T + b2
        shifted = logits - xp.max(logits, axis=1, keepdims=True)
        logp = shifted - xp.log(xp.sum(xp.exp(shifted), axis=1, keepdims=True))
        return -xp.mean(xp.sum(onehot * logp, axis=1))

    def tracker():
        state = tracker_setup(model)

        def run():
            stepped, _, loss = tracker_step(model, state, x, labels)
            dense = stepped.layers
            return loss, [dense[0].weight, dense[0].bias, dense[1].weight, dense[1].bias]

        return run

    def autograd_():
        import autograd
        import autograd.numpy as anp

        f = autograd.value_and_grad(lambda p: loss_of(anp, p))

        def run():
            loss, grads = f(list(params))
            return loss, adam_by_hand(grads)

        return run

    def mygrad_():
        import mygrad as mg

        def run():
            ps = [mg.tensor(p) for p in params]
            loss = loss_of(mg, ps)
            loss.backward()
            return loss, adam_by_hand([p.grad for p in ps])

        return run

    def by_hand():
        new_params, _, _, loss = numpy_step(params, moments, 0, x, onehot)
        return loss, new_params

    return {
        "numpy": lambda: by_hand,
        "tracker_gpu": tracker,
        "autograd": autograd_,
        "mygrad": mygrad_,
    }


# --- measuring
def installed(lib):
    if lib in ("numpy", "tracker_gpu"):
        return True
    try:
        __import__(lib)
        return True
    except ImportError:
        return False


# --- the text job's step, beside PyTorch's (MemTracker: PyTorch's CPU allocator is not traced)
def torch_cpu_peak(call):
    """The peak bytes of the tensors made during `call()` that were not there before it."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        call()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    there = {"Parameter", "Buffer", "Optstate"}
    return peak["Total"] - sum(v for k, v in peak.items() if getattr(k, "value", k) in there)


def text_peaks(quick):
    """`{step: peak bytes}` of the text step, tracker_gpu eager and compiled, PyTorch eager."""
    from text import VOCAB, contenders

    from tracker_gpu.train.text_loop import TextConfig

    config, rng = TextConfig(batch_size=8 if quick else 32), np.random.default_rng(1)
    shape = (config.batch_size, config.context)
    x, y = rng.integers(0, VOCAB, shape), rng.integers(0, VOCAB, shape)
    peaks = {}
    for name, run in contenders(config, x, y).items():
        run()  # the warm-up (and the recording)
        gc.collect()
        if name.startswith("torch"):
            peaks[name] = torch_cpu_peak(run)
        else:
            _, peaks[name] = peak_tracemalloc(run)
    return peaks


def measure(builders, rtol):
    """{library: peak extra bytes, or a reason it was not measured}; each library's value and
    gradients are checked against NumPy's by hand."""
    peaks, reference = {}, None
    for lib in PEERS:
        if not installed(lib):
            peaks[lib] = "not installed"
            continue
        try:
            call = builders[lib]()
        except NotImplementedError as why:
            peaks[lib] = f"not supported ({why})"
            continue
        result = flat(call())  # the warm-up: one-time caches are not the gradient's memory
        if reference is None:
            reference = result
        for a, b in zip(result, reference, strict=True):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol, err_msg=f"{lib} disagrees")
        del result
        gc.collect()
        _, peaks[lib] = peak_tracemalloc(call)
    return peaks


def flat(value):
    """A result (value and gradients, nested) as a flat list of NumPy arrays."""
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in flat(v)]
    return [as_numpy(value)]


def workloads(quick):
    uses, ops, batch = (1_000, 10_000, 256) if quick else (10_000, 100_000, 1024)
    rows = 64 if quick else 512
    return {  # name: (title, builders, the tolerance of the check against NumPy)
        "wide": (f"wide, 1,000 float64 used {uses:,} times", wide_builders(uses, 1000), 1e-9),
        "chain": (f"chain, {ops:,} ops y * c on 16 float64", long_chain_builders(ops, 16), 1e-9),
        "mlp step": ("MLP step 784-128-10, batch 64, f32, Adam", mlp_builders(), 1e-4),
        "residual": (
            f"residual MLP, 20 blocks 64-256-64, batch {batch:,}",
            residual_builders(False, batch),
            1e-9,
        ),
        "residual, checkpoint": (
            "the same, a checkpoint per block",
            residual_builders(True, batch),
            1e-9,
        ),
        "writes": (f"{rows} rows written, each from its data", write_builders(False, rows), 1e-9),
        "writes, recurrent": (
            f"{rows} rows written, each from the row before",
            write_builders(True, rows),
            1e-9,
        ),
    }


def targets(rows, quick):
    """Each target: what it compares, the ratio, and whether it is met."""

    def mb(name, lib="tracker_gpu"):
        value = rows[name]["peaks"].get(lib)
        return value / MB if isinstance(value, (int, float)) else None

    found = []

    def add(text, ours, reference, bound):
        if ours is not None and reference:
            found.append(_target(text, ours, reference, bound))

    add("wide: at most autograd's peak", mb("wide"), mb("wide", "autograd"), 1.0)
    add("MLP step: at most 1.2x by hand", mb("mlp step"), mb("mlp step", "numpy"), 1.2)
    add("residual: at most 1.2x by hand", mb("residual"), mb("residual", "numpy"), 1.2)
    add("checkpoint: at most half without", mb("residual, checkpoint"), mb("residual"), 0.5)
    for name in ("writes", "writes, recurrent"):  # by hand saves no copy of the rows it reads
        add(f"{name}: at most 2.5x by hand", mb(name), mb(name, "numpy"), 2.5)
    if not quick:
        add("chain: no worse than 40.8 MB", mb("chain"), CHAIN_BEFORE_MB, 1.0)
    return found


def report(rows, found):
    print(f"{'workload':<48}" + "".join(f"{lib:>16}" for lib in PEERS))
    for row in rows.values():
        by_hand = row["peaks"]["numpy"]
        cells = []
        for lib in PEERS:
            value = row["peaks"][lib]
            if isinstance(value, str):
                cells.append(f"{value[:15]:>16}")
            else:
                ratio = f" ({value / by_hand:.2f}x)" if by_hand else ""
                cells.append(f"{value / MB:>8.2f}{ratio:>8}")
        print(f"{row['title']:<48}" + "".join(cells))
    print("\npeak extra memory in MB (ratio to NumPy by hand); PyTorch: n/a on the CPU")
    for t in found:
        print(f"target {t['target']}: {t['value']:.2f} {'met' if t['met'] else 'MISSED'}")


def cpu_run(args):
    rows = {}
    for name, (title, builders, rtol) in workloads(args.quick).items():
        print(f"measuring {name}", file=sys.stderr, flush=True)
        rows[name] = {"title": title, "peaks": measure(builders, rtol)}
    found = targets(rows, args.quick)
    report(rows, found)
    print("measuring the text step", file=sys.stderr, flush=True)
    text = text_peaks(args.quick) if installed("torch") else {}
    for name, peak in text.items():
        ratio = peak / text["torch eager"]
        print(f"text step, {name:22s} {peak / MB:8.2f} MB ({ratio:.2f}x PyTorch eager)")
    return {"backend": "numpy", "unit": "bytes", "workloads": rows, "targets": found,
            "text step": text}  # fmt: skip


# --- on a GPU: CuPy's memory pool, PyTorch's CUDA allocator
def torch_residual(torch, x, params, checkpointed):
    from torch.utils.checkpoint import checkpoint

    xt = torch.as_tensor(x, device="cuda")
    ps = [torch.as_tensor(p, device="cuda").requires_grad_(True) for p in params]
    block = lambda h, *b: residual_block(torch.relu, h, *b)  # noqa: E731

    def run():
        h = xt
        for i in range(0, len(ps), 4):
            b = ps[i : i + 4]
            h = checkpoint(block, h, *b, use_reentrant=False) if checkpointed else block(h, *b)
        loss = (h * h).sum()
        return loss, torch.autograd.grad(loss, ps)

    return run


def gpu_run(args):
    """The residual MLP, with and without checkpoints, on CuPy (tracker_gpu, and by hand) and
    PyTorch CUDA eager; None without a GPU."""
    from gpu_measure import cupy_gpu, pool_peak, torch_cuda, torch_peak

    cp, why = cupy_gpu()
    if cp is None:
        print(f"--backend cupy: no GPU available ({why})", file=sys.stderr)
        return None
    torch = torch_cuda()
    x, params = residual_problem()
    xd, pd = cp.asarray(x), [cp.asarray(p) for p in params]
    rows = []
    for name, checkpointed in (("residual", False), ("residual, checkpoint", True)):
        calls = {
            "cupy by hand": lambda: residual_by_hand(cp, xd, pd),
            "tracker_gpu": tracker_residual(xd, pd, checkpointed),
        }
        if torch is not None:
            calls["torch"] = torch_residual(torch, x, params, checkpointed)
        peaks = {}
        for lib, call in calls.items():
            call()  # warm-up
            peak = torch_peak(torch, call) if lib == "torch" else pool_peak(cp, call)
            peaks[lib] = peak / MB
        rows.append({"name": name, "peaks_mb": peaks})
    plain, ckpt = rows[0]["peaks_mb"], rows[1]["peaks_mb"]
    by_hand = _target("at most 1.2x by hand", plain["tracker_gpu"], plain["cupy by hand"], 1.2)
    half = _target("at most half without", ckpt["tracker_gpu"], plain["tracker_gpu"], 0.5)
    rows[0]["targets"], rows[1]["targets"] = [by_hand], [half]
    for row in rows:
        cells = ", ".join(f"{lib} {mb:.2f} MB" for lib, mb in row["peaks_mb"].items())
        print(f"{row['name']}: {cells}")
        for t in row["targets"]:
            print(f"  target {t['target']}: {t['value']:.2f} {'met' if t['met'] else 'MISSED'}")
    return {"backend": "cupy", "unit": "MB", "workloads": rows}


def _target(text, ours, reference, bound):
    return {"target": text, "value": ours / reference, "met": ours <= bound * reference}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("numpy", "cupy"), default="numpy")
    parser.add_argument("--quick", action="store_true", help="smaller graphs and batches")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    if args.backend == "cupy":
        document = gpu_run(args)
        if document is None:
            return 3
    else:
        document = cpu_run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
