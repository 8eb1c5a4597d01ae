"""One MLP training step with tracker_gpu, next to the same step written by hand in NumPy, or on
a GPU next to PyTorch CUDA eager.

    python benchmarks/train_step.py [--backend numpy|cupy] [--repeats 200] [--batch 64]
                                    [--threads 1] [--json PATH]

The model is 784-128-10 with tanh, float32, the loss the logit cross-entropy of a batch of 64,
and the step forward + backward + Adam. tracker_gpu's step is what a user writes
(`nn.Chain`, `withgradient`, `optim.update`).

`--backend numpy` (the default): the NumPy step computes the same forward pass, its gradients by
hand, and Adam's update in the textbook form (Kingma & Ba 2015), on the same data and initial
parameters. Both run in this process; the medians of `--repeats` timed steps (wall clock) and
their ratio are printed. BLAS runs on `--threads` threads (1 by default: these matrices are
small, and threads add noise), through threadpoolctl when it is installed.

`--backend cupy` (a GPU): tracker_gpu's step on CuPy, and PyTorch CUDA eager with the same model,
initial parameters, batch and optimiser (`torch.optim.Adam`, same learning rate, betas and
epsilon), each first checked against the NumPy step by hand. Each is timed with CUDA events
over blocks of consecutive steps (the host's overhead included, as in a training loop: at this
size a step costs more on the host than on the device), the two interleaved block by block; the
median per step and the ratio are printed, with the target (the CuPy step no slower than
PyTorch's) met or missed. Also measured: the peak bytes of CuPy's memory pool during one step
(above what is in use before it) and the same for PyTorch's allocator. Not measured: the
device time alone (see kernels.py), or any other model size.
"""

import argparse
import contextlib
import json
import statistics
import sys
import time

import numpy as np
from gpu_measure import DeviceTimer, cupy_gpu, pool_peak, torch_cuda, torch_peak

import tracker_gpu as tg
from tracker_gpu import nn, optim

SIZES = (784, 128, 10)
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8
SHAPE = "-".join(map(str, SIZES))
KIB = 1 << 10
MEMORY = {"cupy_pool": "CuPy memory pool", "torch_allocator": "PyTorch allocator"}


def make_problem(batch, seed=0):
    """Random float32 inputs, integer labels, and the model (its arrays shared with NumPy's)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
    labels = rng.integers(0, SIZES[-1], size=batch)
    model = nn.Chain(
        nn.Dense(SIZES[0], SIZES[1], nn.tanh, rng=rng),
        nn.Dense(SIZES[1], SIZES[2], rng=rng),
    )
    return x, labels, model


# --- tracker_gpu: what a user writes
def tracker_setup(model):
    return optim.setup(optim.Adam(LR, (BETA1, BETA2), EPS), model)


def tracker_step(model, state, x, labels):
    loss, (grads,) = tg.withgradient(lambda m: nn.logitcrossentropy(m(x), labels), model)
    state, model = optim.update(state, model, grads)
    return model, state, loss


# --- NumPy by hand
def numpy_setup(model):
    params = [
        model.layers[0].weight,
        model.layers[0].bias,
        model.layers[1].weight,
        model.layers[1].bias,
    ]
    return [p.copy() for p in params], [(np.zeros_like(p), np.zeros_like(p)) for p in params], 0


def numpy_step(params, moments, t, x, onehot):
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1.T + b1)
    logits = h @ w2.T + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -np.mean(np.sum(onehot * logp, axis=1))
    dlogits = (np.exp(logp) - onehot) / x.shape[0]
    dz1 = (dlogits @ w2) * (1 - h * h)
    grads = [dz1.T @ x, dz1.sum(axis=0), dlogits.T @ h, dlogits.sum(axis=0)]
    t += 1
    new_params, new_moments = [], []
    for p, g, (m, v) in zip(params, grads, moments):
        m = BETA1 * m + (1 - BETA1) * g
        v = BETA2 * v + (1 - BETA2) * g * g
        m_hat = m / (1 - BETA1**t)
        v_hat = v / (1 - BETA2**t)
        new_params.append(p - LR * m_hat / (np.sqrt(v_hat) + EPS))
        new_moments.append((m, v))
    return new_params, new_moments, t, loss


def check_agreement(x, labels, model):
    """Both steps give the same loss and parameters from the same start (float32 tolerance)."""
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]
    params, moments, t = numpy_setup(model)
    state = tracker_setup(model)
    for _ in range(3):
        model, state, loss = tracker_step(model, state, x, labels)
        params, moments, t, np_loss = numpy_step(params, moments, t, x, onehot)
        assert np.allclose(float(tg.data(loss)), np_loss, rtol=1e-4), (float(loss), np_loss)
    ours = [model.layers[0].weight, model.layers[0].bias, model.layers[1].weight]
    for a, b in zip(ours, params):
        assert np.allclose(a, b, rtol=1e-4, atol=1e-6)


def median_seconds(step, repeats, warmup=20):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def blas_kernels():
    """NumPy's BLAS as the reports name it: "OpenBLAS 0.3.31, Haswell kernels". OpenBLAS picks
    its kernels by the CPU it recognises, or as OPENBLAS_CORETYPE names them; the products'
    speed depends on it (AVX2 or AVX-512 kernels), while PyTorch and JAX bring their own."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "BLAS unknown (threadpoolctl not installed)"
    found = [b for b in threadpool_info() if b.get("user_api") == "blas"]
    if not found:
        return "BLAS unknown"
    b = found[0]
    api = b["internal_api"]
    name = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS"}.get(api, api)
    kernels = f", {b['architecture']} kernels" if b.get("architecture") else ""
    return f"{name} {b.get('version', '')}{kernels}"


def blas_threads(n):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def cpu_run(args):
    """tracker_gpu on NumPy against the NumPy step by hand, interleaved; wall-clock medians."""
    x, labels, model = make_problem(args.batch)
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]
    with blas_threads(args.threads):
        check_agreement(x, labels, model)
        current = {"tracker": (model, tracker_setup(model)), "numpy": numpy_setup(model)}

        def ours():
            m, s = current["tracker"]
            m, s, _ = tracker_step(m, s, x, labels)
            current["tracker"] = (m, s)

        def by_hand():
            params, moments, t = current["numpy"]
            params, moments, t, _ = numpy_step(params, moments, t, x, onehot)
            current["numpy"] = (params, moments, t)

        # interleave the two, so that a slow spell of the machine hits both alike
        tracker_times, numpy_times = [], []
        rounds = min(5, args.repeats)
        for _ in range(rounds):
            tracker_times.append(median_seconds(ours, args.repeats // rounds))
            numpy_times.append(median_seconds(by_hand, args.repeats // rounds))
    ours_s, numpy_s = statistics.median(tracker_times), statistics.median(numpy_times)
    print(f"MLP {SHAPE}, batch {args.batch}, float32, tanh, logitcrossentropy, Adam")
    print(f"tracker_gpu step   {ours_s * 1e6:9.1f} us  (median of {args.repeats})")
    print(f"NumPy by hand      {numpy_s * 1e6:9.1f} us")
    print(f"ratio              {ours_s / numpy_s:9.2f}x")
    return {
        "backend": "numpy",
        "tracker_us": ours_s * 1e6,
        "numpy_us": numpy_s * 1e6,
        "ratio": ours_s / numpy_s,
    }


# --- on a GPU: tracker_gpu on CuPy against PyTorch CUDA eager
def gpu_run(args):
    """Both steps checked, timed interleaved, and their memory measured; None without a GPU."""
    cp, why = cupy_gpu()
    if cp is None:
        print(f"--backend cupy: no GPU available ({why})", file=sys.stderr)
        return None
    torch = torch_cuda()
    x, labels, model = make_problem(args.batch)
    steps = {"tracker_gpu": cupy_stepper(cp, x, labels, model)}
    if torch is not None:
        steps["torch"] = torch_stepper(torch, x, labels, model)
    expected = numpy_losses(x, labels, model)
    agree = {
        name: np.allclose([float(step()) for _ in expected], expected, rtol=1e-3)
        for name, step in steps.items()
    }
    per_block = 20
    rounds = max(3, args.repeats // per_block)
    times = interleaved(DeviceTimer(cp), steps, rounds, per_block)
    document = {
        "backend": "cupy",
        "device": device_name(cp),
        "agree": agree,
        "us": {name: ms * 1e3 for name, ms in times.items()},
        "rounds": rounds,
        "steps_per_round": per_block,
        "memory": memory_figures(cp, torch, steps),
    }
    if "torch" in times:
        ratio = times["tracker_gpu"] / times["torch"]
        document["ratio"] = ratio
        document["target"] = {
            "target": "the CuPy step no slower than PyTorch CUDA eager",
            "value": ratio,
            "met": ratio <= 1.0,
        }
    print_gpu(document, args)
    return document


def cupy_stepper(cp, x, labels, model):
    """tracker_gpu's step on CuPy arrays (the model moved with nn.place), from `model`."""
    x, labels = cp.asarray(x), cp.asarray(labels)
    model = nn.place(model, xp="cupy")
    current = [model, tracker_setup(model)]

    def step():
        m, s, loss = tracker_step(*current, x, labels)
        current[:] = [m, s]
        return loss

    return step


def torch_stepper(torch, x, labels, model):
    """The same step in PyTorch CUDA eager (as benchmarks/peers.py writes it on the CPU)."""
    net = torch.nn.Sequential(
        torch.nn.Linear(*SIZES[:2]), torch.nn.Tanh(), torch.nn.Linear(*SIZES[1:])
    ).to("cuda")
    with torch.no_grad():
        for p, value in zip(net.parameters(), numpy_setup(model)[0]):
            p.copy_(torch.as_tensor(value))
    opt = torch.optim.Adam(net.parameters(), lr=LR, betas=(BETA1, BETA2), eps=EPS)
    x, labels = torch.as_tensor(x, device="cuda"), torch.as_tensor(labels, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(x), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def numpy_losses(x, labels, model, steps=3):
    """The losses of the first `steps` steps by hand, from `model`."""
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]
    params, moments, t = numpy_setup(model)
    losses = []
    for _ in range(steps):
        params, moments, t, loss = numpy_step(params, moments, t, x, onehot)
        losses.append(float(loss))
    return losses


def interleaved(timer, steps, rounds, per_block, warmup=20):
    """Milliseconds per step of each stepper: the median over `rounds` of a block of
    `per_block` steps each, the steppers taking turns block by block."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    blocks = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            blocks[name].append(timer.block(step, per_block))
    return {name: statistics.median(times) for name, times in blocks.items()}


def memory_figures(cp, torch, steps):
    """Bytes in use before a step, the peak extra bytes during one, and the bytes held from the
    device: CuPy's memory pool for tracker_gpu, PyTorch's allocator for PyTorch."""
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    before = pool.used_bytes()
    peak = pool_peak(cp, steps["tracker_gpu"])
    figures = {
        "cupy_pool": {"in_use_before": before, "peak_extra": peak, "held": pool.total_bytes()}
    }
    if "torch" in steps:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        peak = torch_peak(torch, steps["torch"])
        figures["torch_allocator"] = {
            "in_use_before": before,
            "peak_extra": peak,
            "held": torch.cuda.memory_reserved(),
        }
    return figures


def device_name(cp):
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def print_gpu(doc, args):
    us, agree = doc["us"], doc["agree"]
    print(
        f"MLP {SHAPE}, batch {args.batch}, float32, tanh, logitcrossentropy, Adam; {doc['device']}"
    )
    for name, ok in agree.items():
        print(f"{name}: first 3 losses {'agree' if ok else 'DIFFER'} with the NumPy step by hand")
    print(
        f"tracker_gpu on CuPy  {us['tracker_gpu']:9.1f} us per step (CUDA events, median of "
        f"{doc['rounds']} blocks of {doc['steps_per_round']} steps, host overhead included)"
    )
    if "torch" not in us:
        print("PyTorch CUDA eager   n/a (PyTorch with CUDA is not installed)")
    else:
        target = doc["target"]
        print(f"PyTorch CUDA eager   {us['torch']:9.1f} us per step")
        print(
            f"ratio                {doc['ratio']:9.2f}x   target: {target['target']}: "
            f"{'met' if target['met'] else 'MISSED'}"
        )
    for name, m in doc["memory"].items():
        print(
            f"{MEMORY[name]}: {m['in_use_before'] / KIB:.1f} KiB in use before a step, "
            f"{m['peak_extra'] / KIB:.1f} KiB more at its peak during one, "
            f"{m['held'] / KIB:.1f} KiB held from the device"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", metavar="PATH", help="write the figures here")
    args = parser.parse_args(argv)
    if args.backend == "cupy":
        document = gpu_run(args)
        if document is None:
            return 3  # no GPU: said why
    else:
        document = cpu_run(args)
    document.update(model=SHAPE, batch=args.batch, repeats=args.repeats)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
        print(f"figures written to {args.json}")
    return 0 if all(document.get("agree", {}).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
