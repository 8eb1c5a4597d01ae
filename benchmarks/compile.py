"""`tg.compile` on the host: recorded gradients and training steps beside eager tracker_gpu,
NumPy by hand, PyTorch's autograd and `jax.jit`, all measured in this run.

    python benchmarks/compile.py [--ops 1000] [--repeats 15] [--batch 64] [--json PATH]
                                 [--record-ops 100000]
    python benchmarks/compile.py --backend cupy [--batch 64] [--json PATH]   (on a GPU)

Workloads (float64 chains on a 1-element array, where the cost is all per-operation overhead;
a float32 MLP step where it is not):
- chain y*c: `y = y * 1.0001`, `--ops` times, then the gradient of `sum(y)`.
- chain mixed: the same length cycling through `y * c`, `sin(y)`, `y + c`, `tanh(y)`.
- MLP step: 784-128-10, tanh, logit cross-entropy of a batch, forward + backward + Adam (the
  textbook form, Kingma & Ba 2015, in every peer), from the same initial parameters.

Every peer computes the same formulation: NumPy by hand keeps each chain's inputs in the
forward pass and multiplies the derivatives in the backward pass (what a tape does, written
out); PyTorch runs eager autograd; JAX runs `jax.jit(jax.value_and_grad(f))` (compiled once,
before timing, with its result blocked on). tracker_gpu's compiled step is
`tg.compile(f)` after its first (recording) call: by default each region of correctly rounded
elementwise operations one generated C++ loop (`fuse="exact"`, built before timing); "unfused"
is `tg.compile(f, fuse=False)`, "fused" `tg.compile(f, fuse=True)` (the C library's functions
fused too). Each figure is the
median wall time of `--repeats` calls, peers interleaved round by round; BLAS on one thread
where threadpoolctl is installed. Not measured: memory of a replay (see memory.py), JAX's
tracing and compilation.

Recording: the first call of `tg.compile` (recording, generating, compiling) of a long chain
(`y = y * c`, `--record-ops` times, on a 4-element float64 array, then the gradient of `sum(y)`)
against the same `tg.withgradient` run eagerly: wall time (the best of three) and peak memory
(tracemalloc, a run of its own), as ratios in this run. `--record-ops 1000000` for a million.

`--backend cupy` (a GPU; a step of `ci/gpu`): the MLP step on CuPy, eager and compiled (replayed
as a CUDA graph), beside PyTorch CUDA eager with `torch.optim.Adam`, each checked against NumPy by
hand first; timed with CUDA events over blocks of consecutive steps (host overhead included),
the steppers interleaved block by block. Targets: the compiled step at least 3x faster than the
eager one, and faster than PyTorch's.
"""

import argparse
import contextlib
import gc
import json
import math
import statistics
import sys
import time
import tracemalloc

import numpy as np
from train_step import BETA1, BETA2, EPS, LR, SIZES, make_problem
from train_step import numpy_step as by_hand_step

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.compiler.guards import guards_of

C = 1.0001


# --- the chains
def tracker_chain(kinds):
    def f(x):
        y = x
        for kind in kinds:
            y = {"mul": lambda y: y * C, "sin": tg.sin, "add": lambda y: y + C,
                 "tanh": tg.tanh}[kind](y)  # fmt: skip
        return tg.sum(y)

    return f


def numpy_chain(kinds):
    """Forward keeping each op's input, backward multiplying the derivatives: by hand."""

    def step(x):
        inputs, y = [], x
        for kind in kinds:
            inputs.append(y)
            y = y * C if kind == "mul" else np.sin(y) if kind == "sin" else (
                y + C if kind == "add" else np.tanh(y))  # fmt: skip
        g = np.ones_like(y)
        for kind, u in zip(reversed(kinds), reversed(inputs)):
            if kind == "mul":
                g = g * C
            elif kind == "sin":
                g = g * np.cos(u)
            elif kind == "tanh":
                t = np.tanh(u)
                g = g * (1 - t * t)
        return np.sum(y), g

    return step


def torch_chain(kinds):
    import torch

    ops = {"mul": lambda y: y * C, "sin": torch.sin, "add": lambda y: y + C, "tanh": torch.tanh}

    def step(x):
        x = torch.tensor(x, requires_grad=True)
        y = x
        for kind in kinds:
            y = ops[kind](y)
        loss = y.sum()
        loss.backward()
        return loss, x.grad

    return step


def jax_chain(kinds):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    ops = {"mul": lambda y: y * C, "sin": jnp.sin, "add": lambda y: y + C, "tanh": jnp.tanh}

    def f(x):
        y = x
        for kind in kinds:
            y = ops[kind](y)
        return jnp.sum(y)

    compiled = jax.jit(jax.value_and_grad(f))
    return lambda x: jax.block_until_ready(compiled(x))


def chain_steppers(kinds):
    f = tracker_chain(kinds)
    compiled, fused = tg.compile(f), tg.compile(f, fuse=True)
    unfused = tg.compile(f, fuse=False)
    x = np.array([0.5])
    steppers = {
        "tracker_gpu eager": lambda: tg.withgradient(f, x),
        "tracker_gpu unfused": lambda: unfused(x),
        "tracker_gpu compiled": lambda: compiled(x),
        "tracker_gpu fused": lambda: fused(x),
        "NumPy by hand": lambda: numpy_chain(kinds)(x),
    }
    for name, make in (("PyTorch eager", torch_chain), ("jax.jit", jax_chain)):
        with contextlib.suppress(ImportError):
            run = make(kinds)
            steppers[name] = lambda run=run: run(x)
    expected = steppers["NumPy by hand"]()[1]
    for name, step in steppers.items():
        grad = step()[1]
        grad = grad[0] if isinstance(grad, tuple) else grad
        assert np.allclose(np.asarray(grad), expected, rtol=1e-9), name
    name = "chain mixed" if "sin" in kinds else "chain y*c"
    FUSED[name] = {k: _kernels(s) for k, s in (("default", compiled), ("fuse=True", fused))}
    return steppers


FUSED = {}  # the generated kernels by default and with fuse=True, by workload


def _kernels(step):
    """`(forward regions, backward chains)` of a compiled step's program."""
    program = step.programs()[0]
    return program.fused, len(program.chains)


# --- the MLP step
def tracker_step(model, state, x, labels):
    loss, (grads,) = tg.withgradient(lambda m: nn.logitcrossentropy(m(x), labels), model)
    state, model = optim.update(state, model, grads)
    return loss, state, model


def params_of(model):
    return [model.layers[0].weight, model.layers[0].bias,
            model.layers[1].weight, model.layers[1].bias]  # fmt: skip


def adam_by_hand(xp, params, moments, t, grads):
    """Adam's update as the paper writes it, for JAX; `t` the step count before this step."""
    t = t + 1
    new_params, new_moments = [], []
    for p, g, (m, v) in zip(params, grads, moments):
        m = BETA1 * m + (1 - BETA1) * g
        v = BETA2 * v + (1 - BETA2) * g * g
        m_hat, v_hat = m / (1 - BETA1**t), v / (1 - BETA2**t)
        new_params.append(p - LR * m_hat / (xp.sqrt(v_hat) + EPS))
        new_moments.append((m, v))
    return new_params, new_moments, t


def numpy_step(params, moments, t, x, onehot):
    """train_step.py's step by hand (the forward, the gradients, Adam), the loss first."""
    params, moments, t, loss = by_hand_step(params, moments, t, x, onehot)
    return loss, params, moments, t


def torch_mlp(model, x, labels, device="cpu"):
    import torch

    params = [torch.tensor(np.array(p), device=device, requires_grad=True)
              for p in params_of(model)]  # fmt: skip
    opt = torch.optim.Adam(params, lr=LR, betas=(BETA1, BETA2), eps=EPS)
    tx, ty = torch.from_numpy(x).to(device), torch.from_numpy(labels).to(device)

    def step():
        w1, b1, w2, b2 = params
        logits = torch.tanh(tx @ w1.T + b1) @ w2.T + b2
        loss = torch.nn.functional.cross_entropy(logits, ty)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def jax_mlp(model, x, labels):
    import jax
    import jax.numpy as jnp

    def loss_of(params, x, onehot):
        w1, b1, w2, b2 = params
        logits = jnp.tanh(x @ w1.T + b1) @ w2.T + b2
        return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=1))

    @jax.jit
    def step(params, moments, t, x, onehot):
        loss, grads = jax.value_and_grad(loss_of)(params, x, onehot)
        return (loss, *adam_by_hand(jnp, params, moments, t, grads))

    onehot = jnp.asarray(np.eye(SIZES[-1], dtype=np.float32)[labels])
    params = [jnp.asarray(p) for p in params_of(model)]
    current = [params, [(jnp.zeros_like(p), jnp.zeros_like(p)) for p in params], jnp.float32(0)]
    jx = jnp.asarray(x)

    def run():
        loss, *state = step(*current, jx, onehot)
        current[:] = state
        return jax.block_until_ready(loss)

    return run


def mlp_steppers(batch):
    x, labels, model = make_problem(batch)
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]
    rule = optim.Adam(LR, (BETA1, BETA2), EPS)
    compiled = tg.compile(tracker_step, gradient=False)
    fused = tg.compile(tracker_step, gradient=False, fuse=True)
    unfused = tg.compile(tracker_step, gradient=False, fuse=False)
    current = {
        "eager": (model, optim.setup(rule, model)),
        "unfused": (model, optim.setup(rule, model)),
        "compiled": (model, optim.setup(rule, model)),
        "fused": (model, optim.setup(rule, model)),
        "numpy": (params_of(model), [(np.zeros_like(p),) * 2 for p in params_of(model)], 0),
    }

    def tracker(kind, step):
        def run():
            loss, state, new_model = step(*current[kind], x, labels)
            current[kind] = (new_model, state)
            return loss

        return run

    def by_hand():
        loss, *state = numpy_step(*current["numpy"], x, onehot)
        current["numpy"] = state
        return loss

    steppers = {
        "tracker_gpu eager": tracker("eager", tracker_step),
        "tracker_gpu unfused": tracker("unfused", unfused),
        "tracker_gpu compiled": tracker("compiled", compiled),
        "tracker_gpu fused": tracker("fused", fused),
        "NumPy by hand": by_hand,
    }
    for name, make in (("PyTorch eager", torch_mlp), ("jax.jit", jax_mlp)):
        with contextlib.suppress(ImportError):
            steppers[name] = make(model, x, labels)
    losses = {
        name: [float(np.asarray(step())) for _ in range(3)] for name, step in steppers.items()
    }
    for name, seen in losses.items():
        assert np.allclose(seen, losses["NumPy by hand"], rtol=1e-4), (name, seen)
    assert compiled.cache_info().hits >= 2, compiled.cache_info()  # replayed, not re-recorded
    FUSED["MLP step"] = {k: _kernels(s) for k, s in (("default", compiled), ("fuse=True", fused))}
    return steppers


# --- timing
# --- the guards: what f reads from its globals, checked before every replay
SCALE, SHIFT, MODE, WEIGHTS = 2.0, 1, "tanh", np.ones(4)


def _guarded(x):
    y = tg.tanh(x) if MODE == "tanh" else tg.sin(x)
    return tg.sum((y * SCALE + SHIFT) * WEIGHTS)


def guard_cost(calls=20000):
    """`(guards, us per call of their check, us per compiled call)` for a small function
    reading four globals (a float, an int, a string, an array)."""
    step, x = tg.compile(_guarded), np.ones(4)
    step(x)  # records
    guards = guards_of(_guarded, (x,))  # what that recording checks
    start = time.perf_counter()
    for _ in range(calls):
        guards.holds()
    check = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for _ in range(calls // 10):
        step(x)
    return len(guards), check, (time.perf_counter() - start) / (calls // 10) * 1e6


# --- recording a long chain
def recording(ops, runs=3):
    """`{"eager"|"recording": {"s": seconds, "MB": peak}}` of the chain of `ops` operations."""
    f = tracker_chain(["mul"] * ops)
    x = np.full(4, 0.5)
    # recording alone: fusion's build (a C++ compiler's run, cached on disk) is not recording
    passes = {
        "eager": lambda: tg.withgradient(f, x),
        "recording": lambda: tg.compile(f, fuse=False)(x),
    }
    found = {name: {"s": math.inf} for name in passes}
    for _ in range(runs):
        for name, run in passes.items():
            gc.collect()
            start = time.perf_counter()
            run()
            found[name]["s"] = min(found[name]["s"], time.perf_counter() - start)
    for name, run in passes.items():
        gc.collect()
        tracemalloc.start()
        run()
        found[name]["MB"] = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
    return found


def report_recording(found, ops):
    eager, ours = found["eager"], found["recording"]
    print(
        f"recording a chain of {ops:,} ops (4 elements): eager {eager['s']:.2f} s, "
        f"{eager['MB']:.1f} MB peak; first call of tg.compile(fuse=False) {ours['s']:.2f} s "
        f"({ours['s'] / eager['s']:.2f}x), {ours['MB']:.1f} MB ({ours['MB'] / eager['MB']:.2f}x)"
    )
    for what, unit in (("time", "s"), ("peak memory", "MB")):
        ratio = ours[unit] / eager[unit]
        print(f"target recording {what}: at most 2x eager: {ratio:.2f} "
              f"{'met' if ratio <= 2 else 'MISSED'}")  # fmt: skip


def interleaved(steppers, repeats, rounds=5):
    """Median seconds per call of each stepper, measured round by round in turn."""
    times = {name: [] for name in steppers}
    per_round = max(1, repeats // rounds)
    for _ in range(rounds):
        for name, step in steppers.items():
            step()  # warm
            for _ in range(per_round):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(seen) for name, seen in times.items()}


def blas_threads(n):
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


# --- on a GPU
def gpu_run(args):
    """The MLP step on CuPy, eager and compiled, beside PyTorch CUDA eager; None without a GPU."""
    from gpu_measure import DeviceTimer, cupy_gpu, torch_cuda

    cp, why = cupy_gpu()
    if cp is None:
        print(f"--backend cupy: no GPU available ({why})", file=sys.stderr)
        return None
    x, labels, model = make_problem(args.batch)
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]
    state = (params_of(model), [(np.zeros_like(p),) * 2 for p in params_of(model)], 0)
    expected = []
    for _ in range(3):
        loss, *state = numpy_step(*state, x, onehot)
        expected.append(float(loss))
    steps = {name: cupy_mlp(cp, x, labels, model, compiled)
             for name, compiled in (("eager", False), ("compiled", True))}  # fmt: skip
    torch = torch_cuda()
    if torch is not None:
        steps["PyTorch eager"] = torch_mlp(model, x, labels, device="cuda")
    agree = {name: np.allclose([float(step()) for _ in expected], expected, rtol=1e-3)
             for name, step in steps.items()}  # fmt: skip
    timer = DeviceTimer(cp)
    blocks = {name: [] for name in steps}
    for _ in range(7):
        for name, step in steps.items():
            blocks[name].append(timer.block(step, 50) * 1e3)
    us = {name: statistics.median(seen) for name, seen in blocks.items()}
    targets = [_target("compiled at least 3x faster than eager", us["compiled"] * 3, us["eager"])]
    if "PyTorch eager" in us:
        targets.append(_target("compiled faster than PyTorch eager", us["compiled"],
                               us["PyTorch eager"]))  # fmt: skip
    document = {"backend": "cupy", "device": cp.cuda.runtime.getDeviceProperties(0)["name"]
                .decode(), "agree": agree, "us": us, "targets": targets}  # fmt: skip
    print(f"MLP step on {document['device']}, batch {args.batch}, us per step (host included):")
    for name, value in us.items():
        print(f"  {name:14s} {value:9.1f}  agrees with NumPy by hand: {agree[name]}")
    for t in targets:
        print(f"target {t['target']}: {t['value']:.2f} {'met' if t['met'] else 'MISSED'}")
    return document


def _target(text, ours, reference):
    return {"target": text, "value": ours / reference, "met": ours < reference}


def cupy_mlp(cp, x, labels, model, compiled):
    x, labels = cp.asarray(x), cp.asarray(labels)
    model = nn.place(model, xp="cupy")
    step = tg.compile(tracker_step, gradient=False) if compiled else tracker_step
    current = [model, optim.setup(optim.Adam(LR, (BETA1, BETA2), EPS), model)]

    def run():
        loss, state, new_model = step(*current, x, labels)
        current[:] = [new_model, state]
        return loss

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--backend", choices=("numpy", "cupy"), default="numpy")
    parser.add_argument("--record-ops", type=int, default=100_000,
                        help="the long chain recorded against eager (0: not measured)")  # fmt: skip
    args = parser.parse_args()
    if args.backend == "cupy":
        document = gpu_run(args)
        if document is None:
            raise SystemExit(1)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(document, f, indent=1)
        return
    mixed = ["mul", "sin", "add", "tanh"] * math.ceil(args.ops / 4)
    kinds = {"chain y*c": ["mul"] * args.ops, "chain mixed": mixed[: args.ops]}
    rows = {}
    with blas_threads(1):
        for name, chain in kinds.items():
            seconds = interleaved(chain_steppers(chain), args.repeats)
            rows[name] = {peer: s / args.ops * 1e6 for peer, s in seconds.items()}
        seconds = interleaved(mlp_steppers(args.batch), args.repeats * 10)
        rows["MLP step"] = {peer: s * 1e6 for peer, s in seconds.items()}
    report(rows, args)
    print(f"generated kernels (forward regions, backward chains) per program: {FUSED}")
    found = recording(args.record_ops) if args.record_ops else None
    if found:
        report_recording(found, args.record_ops)
    count, check, call = guard_cost()
    print(f"guards: {count} globals checked before each replay, {check:.2f} us per call "
          f"(the whole compiled call of that function: {call:.1f} us)")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            units = {"chains": "us per op", "MLP step": "us", "guards": "us per call"}
            guards = {"count": count, "check": check, "call": call}
            units["recording"] = "s, MB peak"
            document = {"unit": units, "rows": rows, "guards": guards, "recording": found}
            json.dump(document, f, indent=1)


def report(rows, args):
    print(f"chains: {args.ops} ops, us per op; MLP {'-'.join(map(str, SIZES))}, batch "
          f"{args.batch}, us per step; ratio to NumPy by hand in brackets")  # fmt: skip
    for name, row in rows.items():
        by_hand = row["NumPy by hand"]
        cells = "  ".join(f"{peer} {us:.2f} ({us / by_hand:.2f}x)" for peer, us in row.items())
        print(f"{name:12s} {cells}")
    for name, row in rows.items():
        ours = row["tracker_gpu compiled"]
        met = ours <= 1.1 * row["NumPy by hand"]
        print(f"target {name}: compiled within 10% of NumPy by hand: "
              f"{ours / row['NumPy by hand']:.2f} {'met' if met else 'MISSED'}")  # fmt: skip
        if "jax.jit" in row:
            faster = ours < row["jax.jit"]
            print(f"target {name}: compiled faster than jax.jit: {ours / row['jax.jit']:.2f} "
                  f"{'met' if faster else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    main()
