"""Measuring on a CUDA GPU, for `kernels.py` and `train_step.py` (a module, not a script).

- `DeviceTimer.device`: the device time of a call, with CUDA events, the host queued ahead of
  the device so that Python's overhead is not counted; `DeviceTimer.block`: the time per call
  of a loop of calls, with CUDA events, host overhead included (what a training loop costs).
- `LaunchCounter`: the kernels, copies and fills the device runs during a call, seen by
  PyTorch's profiler (CUPTI), which records every kernel of the process, CuPy's included.
- `pool_peak` and `torch_peak`: the peak extra device memory of a call, from CuPy's memory pool
  and from PyTorch's allocator.

Importing this module imports neither CuPy nor PyTorch; nothing in it runs without a GPU.
"""

import gc
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "cupy_gpu",
    "torch_cuda",
    "Timing",
    "DeviceTimer",
    "LaunchCounter",
    "pool_peak",
    "torch_peak",
]

# One thread that keeps the device busy for `cycles` clock cycles: the calls queued behind it
# are issued by the host while it spins, so the events around them time the device alone.
SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""
MIN_SPIN_MS, MAX_SPIN_MS = 1.0, 100.0


def cupy_gpu():
    """`(cupy, None)` when CuPy can use a GPU, else `(None, why not)`."""
    try:
        import cupy
    except ImportError as error:
        return None, f"CuPy is not installed ({error})"
    try:
        if cupy.is_available():
            return cupy, None
    except Exception as error:  # a broken driver or toolkit: report it, do not crash
        return None, f"CuPy cannot use a GPU ({type(error).__name__}: {error})"
    return None, "CuPy finds no CUDA GPU"


def capture_of(compiled):
    """What a `tg.compile`d function's replay on CuPy launches, one entry per recorded
    signature: its CUDA graphs and the library calls run live between them, or None for a
    program replayed step by step."""
    return [p.graph.describe() if p.graph else None for p in compiled.programs()]


def describe_capture(captures):
    """One line for `capture_of`'s list."""
    return "; ".join("replayed step by step (no CUDA graph)" if c is None else
                     f"{c['graphs']} CUDA graphs, {c['library_calls']} library calls (cuBLAS, "
                     "cuSOLVER, joins) run live between them" for c in captures)  # fmt: skip


def torch_cuda():
    """PyTorch when it is installed with CUDA and sees a GPU, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@dataclass
class Timing:
    """A timed call: `ms`, the median over `repeats`; `host_us`, the median host time of one
    call; `starved`, the repeats in which the device may have
    waited for the host (issuing the call took longer than the spin ahead of it: the call
    synchronises with the device, or its host work is that long)."""

    ms: float
    host_us: float
    repeats: int
    starved: int = 0

    def as_dict(self):
        return asdict(self)


class DeviceTimer:
    """CUDA events on CuPy's current stream (PyTorch's default stream is the same one)."""

    def __init__(self, cp):
        self.cp = cp
        self._spin = cp.RawKernel(SPIN_SOURCE, "spin")
        self._events = [cp.cuda.Event() for _ in range(3)]
        self._launch_spin(10**8)  # compiles it, and brings the clocks up before calibrating
        self.cycles_per_ms = 10**7 / self._elapsed(lambda: self._launch_spin(10**7))

    def _launch_spin(self, cycles):
        self._spin((1,), (1,), (np.int64(cycles),))

    def _elapsed(self, fn):
        """Milliseconds between events recorded before and after `fn` (device idle before)."""
        start, stop = self._events[1:]
        start.record()
        out = fn()
        stop.record()
        stop.synchronize()
        del out
        return self.cp.cuda.get_elapsed_time(start, stop)

    def device(self, fn, repeats, warmup=3, reset=None):
        """The device time of `fn()`: each repeat runs `reset()` (untimed), then a spin kernel,
        then `fn()` between two events, issued while the device spins. A repeat in which
        issuing `fn()` outlasted the spin is run again with a spin twice as long (twice at
        most, and no more once a repeat still did: the call waits for the device); `starved`
        counts the repeats whose last try outlasted its spin."""
        reset = reset or _nothing
        for _ in range(warmup):
            reset()
            fn()
        spin_ms = max(MIN_SPIN_MS, 4e3 * _host_seconds(self.cp, fn, reset))
        times, hosts, starved, attempts = [], [], 0, 3
        with _gc_paused():
            for _ in range(repeats):
                for _attempt in range(attempts):
                    ms, host_ms, issuing_ms, spun_ms = self._behind_spin(fn, reset, spin_ms)
                    if issuing_ms < spun_ms:
                        break
                    spin_ms = min(2 * spin_ms, MAX_SPIN_MS)
                else:
                    starved, attempts = starved + 1, 1  # it waits for the device: no more tries
                times.append(ms)
                hosts.append(host_ms)
        return Timing(statistics.median(times), statistics.median(hosts) * 1e3, repeats, starved)

    def _behind_spin(self, fn, reset, spin_ms):
        """Milliseconds: `fn`'s on the device, `fn`'s on the host, the host's from the spin's
        launch to the last event, and the spin's on the device."""
        before, start, stop = self._events
        reset()
        before.record()
        issued = time.perf_counter()
        self._launch_spin(int(spin_ms * self.cycles_per_ms))
        called = time.perf_counter()
        start.record()
        out = fn()
        stop.record()
        done = time.perf_counter()
        stop.synchronize()
        del out
        elapsed = self.cp.cuda.get_elapsed_time
        host = ((done - called) * 1e3, (done - issued) * 1e3)
        return elapsed(start, stop), *host, elapsed(before, start)

    def block(self, fn, calls):
        """Milliseconds per call of `fn()` called `calls` times in a row between two events,
        the device idle before: the host's overhead is included, and calls overlap as in a
        loop (no warm-up here)."""
        with _gc_paused():
            return self._elapsed(lambda: _repeat(fn, calls)) / calls


def _nothing():
    return None


def _repeat(fn, n):
    for _ in range(n):
        fn()


def _host_seconds(cp, fn, reset, calls=3):
    """The median host time of issuing `fn()` (the device drained after each)."""
    times = []
    for _ in range(calls):
        reset()
        cp.cuda.get_current_stream().synchronize()
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
        del out
    cp.cuda.Device().synchronize()
    return statistics.median(times)


class _gc_paused:
    """No garbage collection inside (a collection would land in one repeat at random)."""

    def __enter__(self):
        gc.collect()
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.enabled:
            gc.enable()


class LaunchCounter:
    """The device's work items during a call, by PyTorch's profiler: kernels (CuPy's too),
    copies and fills, by name. `usable` is False (and `why` says why) when a trial call could
    not be seen."""

    def __init__(self, torch):
        self.torch, self.usable, self.why = torch, False, None
        trial = lambda: torch.ones(4, device="cuda") * 2  # noqa: E731
        try:
            self.names(trial)  # the first session may start CUPTI late and miss work
            self.usable = bool(self.names(trial))
            self.why = None if self.usable else "the profiler saw no kernel of a trial call"
        except Exception as error:  # no CUPTI, or a profiler that cannot start
            self.why = f"the profiler failed: {type(error).__name__}: {error}"

    def names(self, fn):
        torch = self.torch
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out = fn()
            torch.cuda.synchronize()
        del out
        return [
            e.name
            for e in prof.events()
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
        ]

    def count(self, fn):
        """`{"count": n, "names": [...]}`, or None when the profiler cannot count them."""
        if not self.usable:
            return None
        names = self.names(fn)
        return {"count": len(names), "names": names} if names else None


def pool_peak(cp, fn):
    """The peak bytes in use in CuPy's memory pool during `fn()` above what was in use before
    it (its results included), by a memory hook on the pool's allocations and frees."""

    class Peak(cp.cuda.MemoryHook):
        name = "benchmark_pool_peak"

        def __init__(self):
            self.now = self.peak = 0

        def malloc_postprocess(self, **kw):
            self.now += kw["mem_size"]
            self.peak = max(self.peak, self.now)

        def free_postprocess(self, **kw):
            self.now -= kw["mem_size"]

    cp.cuda.Device().synchronize()
    hook = Peak()
    with hook:
        out = fn()
        cp.cuda.Device().synchronize()
    del out
    return hook.peak


def torch_peak(torch, fn):
    """The peak bytes PyTorch's allocator holds for tensors during `fn()`, above before."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - before
