"""The GPU run of `kernels.py` (a module, not a script): each workload's forward and backward
timed through the fused path, the generic CuPy path and PyTorch CUDA eager, their answers
compared, their peak memory and launches measured; then the tables and the targets.

All timing comes before any launch counting: PyTorch's profiler, once started, may slow later
launches."""

import contextlib
from dataclasses import dataclass

import numpy as np
from gpu_measure import DeviceTimer, LaunchCounter, pool_peak, torch_cuda, torch_peak

import tracker_gpu as tg
from tracker_gpu.cuda import generic_only, recording

OF_COPY_TARGET, SPEEDUP_TARGET = 0.85, 2.0
PATHS = ("fused", "generic", "torch")


@dataclass
class Runner:
    """One way of computing a workload: `forward()` returns the loss (its graph recorded),
    `backward(loss)` walks it, `reset()` drops the parameters' gradients, `grads()` returns
    them as NumPy arrays, `peak(fn)` measures memory, and the calls run inside `mode()`."""

    forward: object
    backward: object
    reset: object
    grads: object
    peak: object
    mode: object = contextlib.nullcontext


def ours(cp, w, params, constants, fused):
    tracked = [tg.param(a) for a in params]
    return Runner(
        forward=lambda: w.ours(*tracked, *constants),
        backward=lambda loss: tg.back(loss, once=False),
        reset=lambda: [tg.zero_grad(p) for p in tracked],
        grads=lambda: [cp.asnumpy(tg.grad(p)) for p in tracked],
        peak=lambda fn: pool_peak(cp, fn),
        mode=contextlib.nullcontext if fused else generic_only,
    )


def theirs(torch, w, params, constants):
    tensors = [torch.as_tensor(a, device="cuda").requires_grad_(True) for a in params]
    others = [torch.as_tensor(c, device="cuda") for c in constants]

    def reset():
        for t in tensors:
            t.grad = None

    return Runner(
        forward=lambda: w.theirs(torch, *tensors, *others),
        backward=lambda loss: loss.backward(retain_graph=True),
        reset=reset,
        grads=lambda: [t.grad.cpu().numpy() for t in tensors],
        peak=lambda fn: torch_peak(torch, fn),
    )


def runners(cp, torch, w, arrays):
    params, constants = arrays
    found = {
        "fused": ours(cp, w, params, constants, True),
        "generic": ours(cp, w, params, constants, False),
    }
    if torch is not None:
        found["torch"] = theirs(torch, w, params, constants)
    return found


def device_inputs(cp, w, size, dtype, seed=0):
    params, constants = w.inputs(np.random.default_rng(seed), size, dtype)
    return [cp.asarray(a) for a in params], [cp.asarray(c) for c in constants]


# --- one workload
def time_path(runner, timer, repeats):
    """Forward and backward device times, the backward's peak memory, recorded launches and
    gradients of one runner."""
    with runner.mode():
        forward = timer.device(runner.forward, repeats)
        loss = runner.forward()
        backward = timer.device(lambda: runner.backward(loss), repeats, reset=runner.reset)
        runner.reset()
        peak = runner.peak(lambda: runner.backward(loss))
        grads = runner.grads()
        runner.reset()
        with recording() as log:
            runner.backward(loss)
    launches = [name for kind, name in log if kind == "launch"]
    figures = {"forward": forward.as_dict(), "backward": backward.as_dict(), "peak_bytes": peak}
    return figures, grads, launches


def agree(a, b):
    """Gradients equal within 1e-3, relative to each value and to the largest of `b`'s."""
    return all(
        np.allclose(x, y, rtol=1e-3, atol=1e-3 * float(np.max(np.abs(y), initial=1.0)))
        for x, y in zip(a, b)
    )


def time_workload(cp, torch, timer, w, args):
    arrays = device_inputs(cp, w, args.size, args.dtype)
    x_bytes = arrays[0][0].nbytes
    row = {
        "name": w.name,
        "formula": w.formula,
        "shape": list(arrays[0][0].shape),
        "x_bytes": x_bytes,
        "traffic": w.traffic,
        "paths": {},
    }
    grads = {}
    for path, runner in runners(cp, torch, w, arrays).items():
        figures, grads[path], launches = time_path(runner, timer, args.repeats)
        figures["peak_x"] = figures["peak_bytes"] / x_bytes
        if path == "fused":
            figures["recorded_launches"] = launches
        row["paths"][path] = figures
    row["fused_agrees_with_generic"] = agree(grads["fused"], grads["generic"])
    if "torch" in grads:
        row["torch_agrees"] = agree(grads["torch"], grads["fused"])
    return row


def derive(row, copy_gbps):
    """Bandwidth, fraction of the copy's, speed-up over the generic path, and the targets."""
    paths = row["paths"]
    fused_ms = paths["fused"]["backward"]["ms"]
    gbps = row["traffic"] * row["x_bytes"] / (fused_ms * 1e-3) / 1e9
    row["gbps"], row["of_copy"] = gbps, gbps / copy_gbps
    row["generic_over_fused"] = paths["generic"]["backward"]["ms"] / fused_ms
    if "torch" in paths:
        row["torch_over_fused"] = paths["torch"]["backward"]["ms"] / fused_ms
    row["targets"] = [
        {
            "target": f"backward >= {OF_COPY_TARGET:.0%} of copy bandwidth",
            "value": row["of_copy"],
            "met": row["of_copy"] >= OF_COPY_TARGET,
        },
        {
            "target": f"backward >= {SPEEDUP_TARGET:g}x the generic CuPy path",
            "value": row["generic_over_fused"],
            "met": row["generic_over_fused"] >= SPEEDUP_TARGET,
        },
    ]


# --- launches, counted after all timing
def count_launches(cp, torch, counter, w, args):
    counts = {}
    for path, runner in runners(cp, torch, w, device_inputs(cp, w, args.size, args.dtype)).items():
        with runner.mode():
            forward = counter.count(runner.forward)
            loss = runner.forward()
            runner.reset()
            backward = counter.count(lambda r=runner, loss=loss: r.backward(loss))
        counts[path] = {"forward": forward, "backward": backward}
    return counts


# --- the run
def measure(cp, workloads, args):
    torch = torch_cuda()
    if torch is not None and torch.cuda.current_stream().cuda_stream != _stream(cp):
        print("note: PyTorch's current stream is not CuPy's; PyTorch is not timed")
        torch = None
    timer = DeviceTimer(cp)
    device = device_description(cp)
    copy = copy_figures(cp, timer, args)
    print(
        f"{device['name']}: device-to-device copy of {args.size} {args.dtype}: "
        f"{copy['ms']:.3f} ms, {copy['gbps']:.0f} GB/s (bytes read + written)\n"
    )
    rows = []
    for w in workloads:
        print(f"timing {w.name} ...", flush=True)
        row = time_workload(cp, torch, timer, w, args)
        derive(row, copy["gbps"])
        rows.append(row)
    counter = LaunchCounter(torch) if torch is not None else None
    usable = counter is not None and counter.usable
    counting = (
        "PyTorch's profiler" if usable else counter.why if counter else "no PyTorch with CUDA"
    )
    for row, w in zip(rows, workloads):
        print(f"counting the launches of {w.name} ...", flush=True)
        row["profiled_launches"] = count_launches(cp, torch, counter, w, args) if usable else None
    report(rows, copy, counting)
    return {
        "gpu": True,
        "device": device,
        "copy": copy,
        "launches_counted_by": counting,
        "workloads": rows,
        "torch": None if torch is None else torch.__version__,
    }


def _stream(cp):
    return cp.cuda.get_current_stream().ptr


def device_description(cp):
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    return {
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "id": cp.cuda.Device().id,
        "cupy": cp.__version__,
    }


def copy_figures(cp, timer, args):
    x = cp.asarray(np.random.default_rng(1).standard_normal(args.size).astype(args.dtype))
    out = cp.empty_like(x)
    rt = cp.cuda.runtime
    kind = rt.memcpyDeviceToDevice

    def copy():
        rt.memcpyAsync(out.data.ptr, x.data.ptr, x.nbytes, kind, _stream(cp))

    timing = timer.device(copy, args.repeats)
    return {**timing.as_dict(), "gbps": 2 * x.nbytes / (timing.ms * 1e-3) / 1e9}


# --- the tables
def _ms(row, path, phase):
    figures = row["paths"].get(path)
    if figures is None:
        return "n/a"
    t = figures[phase]
    return f"{t['ms']:.3f}" + ("*" if t["starved"] else "")


def _count(row, path):
    if path == "fused":
        return str(len(row["paths"]["fused"]["recorded_launches"]))
    counted = (row.get("profiled_launches") or {}).get(path) or {}
    found = counted.get("backward")
    return "n/a" if found is None else str(found["count"])


def _each(row, figure, spec):
    return " ".join(
        format(figure(row["paths"][path]), spec) if path in row["paths"] else f"{'n/a':>7s}"
        for path in PATHS
    )


def report(rows, copy, counting):
    print(
        "\nbackward, device time in ms (median; * where the device may have waited for the host)"
        f"\n{'workload':13s} {'traffic':>7s} {'fused':>9s} {'GB/s':>6s} {'of copy':>7s} "
        f"{'generic':>9s} {'generic/fused':>13s} {'torch':>9s} {'torch/fused':>11s}"
    )
    for r in rows:
        torch_ratio = f"{r['torch_over_fused']:.2f}" if "torch_over_fused" in r else "n/a"
        print(
            f"{r['name']:13s} {r['traffic']:6d}x {_ms(r, 'fused', 'backward'):>9s} "
            f"{r['gbps']:6.0f} {r['of_copy']:7.0%} {_ms(r, 'generic', 'backward'):>9s} "
            f"{r['generic_over_fused']:13.2f} {_ms(r, 'torch', 'backward'):>9s} {torch_ratio:>11s}"
        )
    print(
        f"\nforward, device time in ms\n{'workload':13s} {'fused':>9s} {'generic':>9s} "
        f"{'torch':>9s}"
    )
    for r in rows:
        cells = " ".join(f"{_ms(r, path, 'forward'):>9s}" for path in PATHS)
        print(f"{r['name']:13s} {cells}")
    print(
        "\nbackward: launches, peak extra memory (x's size), host us per call; each for "
        f"{', '.join(PATHS)}\n{'workload':13s} {'launches':>20s} | {'memory':>23s} | "
        f"{'host us':>23s} | answers"
    )
    for r in rows:
        launches = " ".join(f"{_count(r, path):>6s}" for path in PATHS)
        memory = _each(r, lambda p: p["peak_x"], "7.2f")
        host = _each(r, lambda p: p["backward"]["host_us"], "7.0f")
        answers = "agree" if r["fused_agrees_with_generic"] else "DIFFER (fused vs generic)"
        if r.get("torch_agrees") is False:
            answers += ", DIFFER from torch"
        print(f"{r['name']:13s} {launches} | {memory} | {host} | {answers}")
    print(f"(launches: ours recorded by tracker_gpu; the others counted by: {counting})")
    print(
        f"\n\"of copy\": traffic x x's bytes / backward time, over the copy's "
        f"{copy['gbps']:.0f} GB/s.\nA speed figure: it does not show memory (the peak memory "
        "column does) nor the host's overhead (host us)."
    )
    print("targets (a benchmark, not a test):")
    for r in rows:
        for t in r["targets"]:
            met = "met" if t["met"] else "MISSED"
            print(f"  {r['name']:13s} {t['target']:42s} {t['value']:7.2f}  {met}")
