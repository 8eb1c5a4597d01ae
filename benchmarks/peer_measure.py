"""How peers.py measures: timing round by round, peak extra memory, answer checks, and the rows.

`run_row` builds each library's call, checks its answer against NumPy by hand (that first call is
the warm-up, and where asked its peak extra memory is measured: tracemalloc for the NumPy-based
libraries, the resident high-water mark for PyTorch), then times the calls interleaved, and
again in warm blocks (each library's calls back to back), with the objects that existed before
frozen out of the garbage collector's sight. A `Row` holds a figure
per library and its ratio to NumPy by hand.
"""

import contextlib
import gc
import statistics
import time
import traceback
import tracemalloc

import numpy as np

LIBS = {
    "numpy": "NumPy by hand",
    "tracker_gpu": "tracker_gpu",
    "torch": "PyTorch",
    "autograd": "autograd",
    "mygrad": "MyGrad",
}
PEERS = ("torch", "autograd", "mygrad")
NOT_INSTALLED, NOT_SUPPORTED = "not installed", "not supported"


class NotSupported(Exception):
    """The library cannot do this workload (MyGrad has no higher derivatives)."""


# --- measurement
def interleaved_times(calls, repeats):
    """{library: seconds of each of `repeats` calls}, timed in rounds over the libraries (the
    calls are warm: each has run once, to check its answer).

    What exists before is frozen out of the garbage collector's sight (`gc.freeze`), so that a
    collection during a call costs what the call's own objects cost, not the rest of this
    process (four libraries imported); garbage left by one call is collected before the next."""
    return _rounds(calls, repeats, dict.fromkeys(calls, 1))


def warm_block_times(calls, rounds, block_seconds=0.02):
    """{library: seconds per call of each of `rounds` blocks}: each library's calls back to back
    in a block of about `block_seconds` (at least one call), the libraries in turn block by
    block. A library's own calls then follow each other, as in a training loop; the interleaved
    times alternate the libraries call by call, which can slow a library's call that comes after
    another's (PyTorch's, measured in issue 32: 230 µs alone, 400 to 590 µs between JAX's)."""
    sizes = {}
    for lib, call in calls.items():
        start = time.perf_counter()
        call()
        sizes[lib] = max(1, min(200, round(block_seconds / (time.perf_counter() - start))))
    return _rounds(calls, rounds, sizes)


def _rounds(calls, rounds, sizes):
    """{library: seconds per call of each round}: in each round, each library's `sizes[lib]`
    calls back to back, the garbage of the one before collected first."""
    times = {lib: [] for lib in calls}
    with frozen_gc():
        for _ in range(rounds):
            for lib, call in calls.items():
                gc.collect()
                start = time.perf_counter()
                for _ in range(sizes[lib]):
                    call()
                times[lib].append((time.perf_counter() - start) / sizes[lib])
    return times


@contextlib.contextmanager
def frozen_gc():
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def peak_tracemalloc(call):
    """`(call(), bytes allocated above the starting point at the peak of the call)`."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = call()
        return result, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def peak_rss(call):
    """`(call(), the resident high-water mark above the starting point during it)`; the peak is
    None where the mark cannot be reset (it can on Linux)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark to the current resident size
        base = _status_kb("VmRSS")
    except OSError:
        return call(), None
    result = call()
    return result, (_status_kb("VmHWM") - base) * 1024


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"{field} not in the process status")


def first_call(lib, call, large):
    """`(call(), its peak extra bytes)`: None for the peak where `large` is None (not asked) or
    it cannot be measured for `lib`."""
    if large is None:
        return call(), None
    if lib != "torch":
        return peak_tracemalloc(call)
    return peak_rss(call) if large else (call(), None)


def as_numpy(v):
    """A result (a tracked, torch, MyGrad or NumPy value, or a tuple of them) as NumPy."""
    if isinstance(v, (tuple, list)):
        return tuple(as_numpy(a) for a in v)
    if isinstance(v, (np.ndarray, np.generic, float)):
        return np.asarray(v)
    if hasattr(v, "detach"):  # PyTorch
        return v.detach().numpy()
    return np.asarray(v.data)  # tracker_gpu's TrackedArray, MyGrad's Tensor


def check(lib, result, reference, rtol):
    got, want = as_numpy(result), as_numpy(reference)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol, err_msg=f"{lib} disagrees")


class Row:
    """One line of the table: a figure per library, and its ratio to NumPy by hand."""

    def __init__(self, workload, case, unit, kind="time", scale=1.0):
        self.workload, self.case, self.unit, self.kind, self.scale = (
            workload,
            case,
            unit,
            kind,
            scale,
        )
        self.results = {}

    @property
    def name(self):
        return f"{self.workload}: {self.case}"

    def set(self, lib, value=None, status="ok", times=None):
        """A figure (`value`, or the median of `times` timed round by round), or a status."""
        self.results[lib] = {"status": status, "value": value}
        if times:
            self.results[lib].update(value=statistics.median(times), best=min(times), times=times)

    def set_warm(self, lib, times):
        """The median seconds of a call in warm blocks (`warm_block_times`), beside the figure."""
        self.results[lib].update(warm=statistics.median(times), warm_times=times)

    def value(self, lib, warm=False):
        return self.results.get(lib, {}).get("warm" if warm else "value")

    def ratio(self, lib, to="numpy", warm=False):
        """`lib`'s figure over `to`'s (for times, the ratio of the medians); `warm`: of the
        warm blocks' figures."""
        mine, ref = self.value(lib, warm), self.value(to, warm)
        return None if mine is None or not ref else mine / ref

    def as_dict(self):
        out = {"case": self.case, "unit": self.unit, "kind": self.kind, "results": {}}
        for lib, r in self.results.items():
            entry = dict(r)
            if r["value"] is not None:
                entry["display"] = r["value"] * self.scale
                entry["ratio"] = self.ratio(lib)
            if r.get("warm") is not None:
                entry["warm_display"] = r["warm"] * self.scale
                entry["warm_ratio"] = self.ratio(lib, warm=True)
            out["results"][lib] = entry
        return out


def run_row(row, builders, available, repeats, rtol=1e-9, large=None):
    """Build each library's call, check its answer against NumPy's, time it, and fill `row`.

    `builders[lib]()` returns a zero-argument call whose result is checked. Unless `large` is
    None, the peak extra memory of that first call is measured too, into a second row that is
    returned; `large` says whether the arrays are large enough for PyTorch's to be read from the
    resident size."""
    calls, reference, peaks = {}, None, {}
    for lib in LIBS:
        if lib not in builders:
            continue
        if not available.get(lib):
            row.set(lib, status=NOT_INSTALLED)
            continue
        try:
            call = builders[lib]()
            result, peaks[lib] = first_call(lib, call, large)
            if lib == "numpy":
                reference = result
            else:
                check(lib, result, reference, rtol)
        except NotSupported:
            row.set(lib, status=NOT_SUPPORTED)
            continue
        except Exception as error:  # a peer's failure is reported, the run goes on
            traceback.print_exc()
            row.set(lib, status=f"failed ({type(error).__name__})")
            continue
        calls[lib] = call
    for lib, seconds in interleaved_times(calls, repeats).items():
        row.set(lib, times=seconds)
    for lib, seconds in warm_block_times(calls, max(3, min(repeats, 7))).items():
        row.set_warm(lib, seconds)
    if large is None:
        return None
    mem = Row(row.workload, row.case + ", peak extra memory", "", kind="memory")
    for lib, r in row.results.items():
        if lib in calls:
            mem.set(lib, peaks[lib], "ok" if peaks[lib] is not None else "n/a")
        else:
            mem.set(lib, status=r["status"])
    return mem
