"""tracker_gpu against its peers: PyTorch CPU autograd, HIPS autograd, MyGrad, NumPy by hand.

    python benchmarks/peers.py [--quick] [--only WORKLOAD] [--out DIR] [--threads 1]

Every workload runs for each library in this one process, on the same inputs: a warm-up, then
the median of repeats, the libraries interleaved so that a slow spell of the machine hits them
alike. Every figure is a ratio to the hand-written NumPy gradient measured in the same run, with
the absolute time beside it. Each library's answer is checked against the hand-written one
before it is timed (that first call is the warm-up). While a row is timed, the objects that
existed before it are frozen out of the garbage collector's sight (gc.freeze), so a collection
costs what the graph being built costs, not the four libraries imported here. A peer that is not
installed is reported, not an error. The table is printed
and written to `benchmarks/out/peers.json` and `peers.md`, followed by the targets of issue 7
marked met or missed.

Peak extra memory is what a call allocates above what it started with, its results (the
gradient) included: NumPy by hand therefore scores 1 array of x's size. It is measured with
tracemalloc for the NumPy-based libraries; tracemalloc does not see PyTorch's allocator, so
PyTorch's is read from the process's resident high-water mark (Linux only, and only for large
arrays, which are mapped and unmapped whole; n/a elsewhere).

Workloads (`--only` takes these names):
  per-op          forward+backward of a 1,000-op elementwise chain on a 1-element float64 array
  sum-of-squares  value and gradient of sum(x**2) and of sumabs2(x) (peers: dot(x, x)) for
                  10^7 float64, time and peak extra memory in units of x's size
  mlp-step        one training step of benchmarks/train_step.py's MLP (784-128-10, batch 64,
                  float32, tanh, logit cross-entropy, Adam)
  graphs          a 100,000-op chain on a 16-element array, and a wide graph (one 1,000-element
                  input used 10,000 times, summed): time and peak memory
  hessian         hessian and hvp of the Rosenbrock function in 100 dimensions
"""

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
import tracemalloc
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import train_step

import tracker_gpu as tg

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


# --- settings
FULL = {
    "chain_ops": 1000,
    "chain_repeats": 31,
    "sumsq_size": 10**7,
    "sumsq_repeats": 11,
    "mlp_repeats": 200,
    "long_ops": 100_000,
    "wide_uses": 10_000,
    "graph_repeats": 3,
    "hessian_dim": 100,
    "hessian_repeats": 11,
}
QUICK = {
    "chain_ops": 1000,
    "chain_repeats": 5,
    "sumsq_size": 10**6,
    "sumsq_repeats": 3,
    "mlp_repeats": 20,
    "long_ops": 10_000,
    "wide_uses": 1_000,
    "graph_repeats": 1,
    "hessian_dim": 20,
    "hessian_repeats": 3,
}


def installed():
    """{library: version, or None where it cannot be imported}."""
    found = {"numpy": np.__version__, "tracker_gpu": _version("tracker-gpu")}
    for name in PEERS:
        try:
            import_module(name)
        except ImportError:
            found[name] = None
        else:
            found[name] = _version(name)
    return found


def _version(dist):
    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


# --- measurement
def interleaved_times(calls, repeats):
    """{library: seconds of each of `repeats` calls}, timed in rounds over the libraries (the
    calls are warm: each has run once, to check its answer).

    What exists before is frozen out of the garbage collector's sight (`gc.freeze`), so that a
    collection during a call costs what the call's own objects cost, not the rest of this
    process (four libraries imported); garbage left by one call is collected before the next."""
    times = {lib: [] for lib in calls}
    with frozen_gc():
        for _ in range(repeats):
            for lib, call in calls.items():
                gc.collect()
                start = time.perf_counter()
                call()
                times[lib].append(time.perf_counter() - start)
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

    def value(self, lib):
        return self.results.get(lib, {}).get("value")

    def ratio(self, lib, to="numpy"):
        """`lib`'s figure over `to`'s (for times, the ratio of the medians)."""
        mine, ref = self.value(lib), self.value(to)
        return None if mine is None or not ref else mine / ref

    def as_dict(self):
        out = {"case": self.case, "unit": self.unit, "kind": self.kind, "results": {}}
        for lib, r in self.results.items():
            entry = dict(r)
            if r["value"] is not None:
                entry["display"] = r["value"] * self.scale
                entry["ratio"] = self.ratio(lib)
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
    if large is None:
        return None
    mem = Row(row.workload, row.case + ", peak extra memory", "", kind="memory")
    for lib, r in row.results.items():
        if lib in calls:
            mem.set(lib, peaks[lib], "ok" if peaks[lib] is not None else "n/a")
        else:
            mem.set(lib, status=r["status"])
    return mem


# --- 1. per-operation overhead
C, D = 1.0001, 0.1


def chain_builders(n, mixed):
    """Forward+backward of `n` ops y*c (or sin, *c, +d in turn) from a 1-element array."""

    def ops(sin, y):
        for i in range(n):
            k = i % 3 if mixed else 1
            y = sin(y) if k == 0 else y * C if k == 1 else y + D
        return y

    def numpy_():
        def run():
            y, saved = np.array([0.5]), []
            for i in range(n):
                k = i % 3 if mixed else 1
                if k == 0:
                    saved.append(y)
                    y = np.sin(y)
                else:
                    y = y * C if k == 1 else y + D
            g = np.ones_like(y)
            for i in reversed(range(n)):
                k = i % 3 if mixed else 1
                if k == 0:
                    g = g * np.cos(saved.pop())
                elif k == 1:
                    g = g * C
            return y.sum(), g

        return run

    def tracker():
        f = lambda x: tg.sum(ops(tg.sin, x))
        return lambda: _flatten(tg.withgradient(f, np.array([0.5])))

    def torch_():
        import torch

        def run():
            x = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
            y = ops(torch.sin, x).sum()
            y.backward()
            return y, x.grad

        return run

    def autograd_():
        import autograd
        import autograd.numpy as anp

        f = autograd.value_and_grad(lambda x: anp.sum(ops(anp.sin, x)))
        return lambda: f(np.array([0.5]))

    def mygrad_():
        import mygrad as mg

        def run():
            x = mg.tensor([0.5])
            y = mg.sum(ops(mg.sin, x))
            y.backward()
            return y, x.grad

        return run

    return _builders(numpy_, tracker, torch_, autograd_, mygrad_)


def _builders(numpy_, tracker, torch_, autograd_, mygrad_):
    return {
        "numpy": numpy_,
        "tracker_gpu": tracker,
        "torch": torch_,
        "autograd": autograd_,
        "mygrad": mygrad_,
    }


def per_op(settings, available):
    n = settings["chain_ops"]
    rows = []
    for mixed, name in [(False, "y * c"), (True, "sin(y), y * c, y + d in turn")]:
        row = Row("per-op", f"{n:,} ops {name}", "us/op", scale=1e6 / n)
        run_row(row, chain_builders(n, mixed), available, settings["chain_repeats"])
        rows.append(row)
    return rows


# --- 2. sum of squares
def sumsq_builders(x, fused):
    """Value and gradient of sum(x**2), or of each library's fastest spelling of it."""

    def numpy_():
        return lambda: (x @ x, 2 * x)

    def tracker():
        f = tg.sumabs2 if fused else (lambda x: tg.sum(x**2))
        return lambda: _flatten(tg.withgradient(f, x))

    def torch_():
        import torch

        t = torch.from_numpy(x).requires_grad_(True)
        f = (lambda t: torch.dot(t, t)) if fused else (lambda t: (t**2).sum())

        def run():
            t.grad = None
            y = f(t)
            y.backward()
            return y, t.grad

        return run

    def autograd_():
        import autograd
        import autograd.numpy as anp

        f = (lambda x: anp.dot(x, x)) if fused else (lambda x: anp.sum(x**2))
        return lambda: autograd.value_and_grad(f)(x)

    def mygrad_():
        import mygrad as mg

        f = (lambda t: mg.matmul(t, t)) if fused else (lambda t: mg.sum(t**2))

        def run():
            t = mg.tensor(x, copy=False)
            y = f(t)
            y.backward()
            return y, t.grad

        return run

    return _builders(numpy_, tracker, torch_, autograd_, mygrad_)


def _power_of_ten(n):
    exponent = len(str(n)) - 1
    return f"10^{exponent}" if n == 10**exponent else f"{n:,}"


def _flatten(val_grad):
    val, (g,) = val_grad
    return val, g


def sum_of_squares(settings, available):
    n = settings["sumsq_size"]
    x = np.random.default_rng(0).standard_normal(n)
    rows = []
    for fused, name in [
        (False, f"sum(x**2), {_power_of_ten(n)} float64"),
        (True, f"sumabs2(x), peers dot(x, x), {_power_of_ten(n)}"),
    ]:
        row = Row("sum-of-squares", name, "ms", scale=1e3)
        # PyTorch's memory is read from the resident high-water mark: exact only for blocks
        # above glibc's largest mmap threshold (32 MiB), which malloc maps and unmaps whole
        large = x.nbytes >= 32 * 2**20
        mem = run_row(
            row, sumsq_builders(x, fused), available, settings["sumsq_repeats"], 1e-8, large
        )
        mem.unit, mem.scale = "x's size", 1 / x.nbytes
        rows += [row, mem]
    return rows


# --- 3. the MLP training step
def mlp_builders(batch):
    """One step (forward, backward, Adam) of train_step.py's MLP; each returns the loss and the
    parameters after the first step."""
    x, labels, model = train_step.make_problem(batch)
    onehot = np.eye(train_step.SIZES[-1], dtype=np.float32)[labels]
    start = train_step.numpy_setup(model)[0]  # w1, b1, w2, b2 as NumPy arrays

    def stepper(step, state):
        def run():
            state[:] = step(*state)
            return state[-1]

        return run

    def numpy_():
        params, moments, t = train_step.numpy_setup(model)

        def step(params, moments, t, _):
            params, moments, t, loss = train_step.numpy_step(params, moments, t, x, onehot)
            return params, moments, t, (loss, *params)

        return stepper(step, [params, moments, t, None])

    def tracker():
        def step(m, s, _):
            m, s, loss = train_step.tracker_step(m, s, x, labels)
            first, second = m.layers
            return m, s, (loss, first.weight, first.bias, second.weight, second.bias)

        return stepper(step, [model, train_step.tracker_setup(model), None])

    def torch_():
        import torch

        net = torch.nn.Sequential(
            torch.nn.Linear(*train_step.SIZES[:2]),
            torch.nn.Tanh(),
            torch.nn.Linear(*train_step.SIZES[1:]),
        )
        with torch.no_grad():
            for p, value in zip(net.parameters(), start):
                p.copy_(torch.from_numpy(value))
        opt = torch.optim.Adam(
            net.parameters(),
            lr=train_step.LR,
            betas=(train_step.BETA1, train_step.BETA2),
            eps=train_step.EPS,
        )
        tx, tlabels = torch.from_numpy(x), torch.from_numpy(labels)

        def run():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(net(tx), tlabels)
            loss.backward()
            opt.step()
            return (loss, *net.parameters())

        return run

    def autograd_():
        import autograd
        import autograd.numpy as anp

        def loss(params):
            w1, b1, w2, b2 = params
            h = anp.tanh(anp.dot(x, w1.T) + b1)
            logits = anp.dot(h, w2.T) + b2
            shifted = logits - anp.max(logits, axis=1, keepdims=True)
            logp = shifted - anp.log(anp.sum(anp.exp(shifted), axis=1, keepdims=True))
            return -anp.mean(anp.sum(onehot * logp, axis=1))

        value_and_grad = autograd.value_and_grad(loss)

        def step(params, moments, t, _):
            value, grads = value_and_grad(params)
            params, moments, t = adam(params, grads, moments, t)
            return params, moments, t, (value, *params)

        return stepper(step, [list(start), _zero_moments(start), 0, None])

    def mygrad_():
        import mygrad as mg
        from mygrad.nnet.losses import softmax_crossentropy

        def step(params, moments, t, _):
            w1, b1, w2, b2 = tensors = [mg.tensor(p, copy=False) for p in params]
            h = mg.tanh(mg.matmul(x, w1.T) + b1)
            loss = softmax_crossentropy(mg.matmul(h, w2.T) + b2, labels)
            loss.backward()
            params, moments, t = adam(params, [p.grad for p in tensors], moments, t)
            return params, moments, t, (loss, *params)

        return stepper(step, [list(start), _zero_moments(start), 0, None])

    return _builders(numpy_, tracker, torch_, autograd_, mygrad_)


def _zero_moments(params):
    return [(np.zeros_like(p), np.zeros_like(p)) for p in params]


def adam(params, grads, moments, t):
    """Adam in the textbook form, as train_step.numpy_step writes it."""
    b1, b2, lr, eps = train_step.BETA1, train_step.BETA2, train_step.LR, train_step.EPS
    t += 1
    new_params, new_moments = [], []
    for p, g, (m, v) in zip(params, grads, moments):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        new_params.append(p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps))
        new_moments.append((m, v))
    return new_params, new_moments, t


def mlp_step(settings, available, batch=64):
    """Timed with train_step.median_seconds, in 5 interleaved blocks (as train_step.py does)."""
    shape = "-".join(map(str, train_step.SIZES))
    row = Row("mlp-step", f"{shape}, batch {batch}, float32, Adam", "ms", scale=1e3)
    builders, calls, reference = mlp_builders(batch), {}, None
    for lib, build in builders.items():
        if not available.get(lib):
            row.set(lib, status=NOT_INSTALLED)
            continue
        try:
            call = build()
            result = call()  # the first step, from the same parameters everywhere
            if lib == "numpy":
                reference = result
            else:
                check(lib, result, reference, 1e-4)
        except Exception as error:
            traceback.print_exc()
            row.set(lib, status=f"failed ({type(error).__name__})")
            continue
        calls[lib] = call
    repeats = settings["mlp_repeats"]
    blocks = {lib: [] for lib in calls}
    with frozen_gc():
        for _ in range(5):
            for lib, call in calls.items():
                blocks[lib].append(train_step.median_seconds(call, max(repeats // 5, 1), 5))
    for lib, medians in blocks.items():
        row.set(lib, times=medians)
    return [row]


# --- 4. a long chain and a wide graph
def long_chain_builders(n, size):
    """Forward+backward of y = y * c, `n` times, from a `size`-element array."""

    def chain(x):
        for _ in range(n):
            x = x * C
        return x

    x0 = np.linspace(0.1, 1.0, size)

    def numpy_():
        def run():
            y = chain(x0)
            g = np.ones_like(y)
            for _ in range(n):
                g = g * C
            return y.sum(), g

        return run

    return _graph_builders(numpy_, chain, x0)


def wide_builders(n, size):
    """Forward+backward of sum(x*w[0] + x*w[1] + ... + x*w[n-1]): one input used `n` times."""
    weights = [1.0 + i / n for i in range(n)]

    def wide(x):
        acc = x * weights[0]
        for w in weights[1:]:
            acc = acc + x * w
        return acc

    x0 = np.linspace(0.1, 1.0, size)

    def numpy_():
        def run():
            y = wide(x0)
            g, gx = np.ones_like(y), np.zeros_like(x0)
            for w in reversed(weights):
                gx += g * w
            return y.sum(), gx

        return run

    return _graph_builders(numpy_, wide, x0)


def _graph_builders(numpy_, build, x0):
    """tracker_gpu and the peers differentiating sum(build(x)) at `x0`."""

    def tracker():
        f = lambda x: tg.sum(build(x))
        return lambda: _flatten(tg.withgradient(f, x0))

    def torch_():
        import torch

        def run():
            x = torch.from_numpy(x0.copy()).requires_grad_(True)
            y = build(x).sum()
            y.backward()
            return y, x.grad

        return run

    def autograd_():
        import autograd
        import autograd.numpy as anp

        f = autograd.value_and_grad(lambda x: anp.sum(build(x)))
        return lambda: f(x0)

    def mygrad_():
        import mygrad as mg

        def run():
            x = mg.tensor(x0)
            y = mg.sum(build(x))
            y.backward()
            return y, x.grad

        return run

    return _builders(numpy_, tracker, torch_, autograd_, mygrad_)


def graphs(settings, available):
    n, uses, repeats = settings["long_ops"], settings["wide_uses"], settings["graph_repeats"]
    rows = []
    for builders, name in [
        (long_chain_builders(n, 16), f"long chain, {n:,} ops y * c on 16 float64"),
        (wide_builders(uses, 1000), f"wide, 1,000 float64 used {uses:,} times"),
    ]:
        row = Row("graphs", name, "ms", scale=1e3)
        mem = run_row(row, builders, available, repeats, 1e-9, large=False)
        mem.unit, mem.scale = "MB", 1e-6
        rows += [row, mem]
    return rows


# --- 5. hessian and hvp
def rosenbrock(x):
    """The Rosenbrock function, written once for every library (slicing and arithmetic)."""
    head, tail = x[:-1], x[1:]
    return 100.0 * (tail - head * head) ** 2 + (1.0 - head) ** 2


def rosenbrock_hessian(x):
    """The Rosenbrock function's Hessian, tridiagonal, by hand."""
    n = x.shape[0]
    diag = np.zeros(n)
    diag[:-1] += 1200.0 * x[:-1] ** 2 - 400.0 * x[1:] + 2.0
    diag[1:] += 200.0
    off = -400.0 * x[:-1]
    return np.diag(diag) + np.diag(off, 1) + np.diag(off, -1)


def rosenbrock_hvp(x, v):
    hv = (1200.0 * x[:-1] ** 2 - 400.0 * x[1:] + 2.0) * v[:-1] - 400.0 * x[:-1] * v[1:]
    hv = np.append(hv, 0.0)
    hv[1:] += 200.0 * v[1:] - 400.0 * x[:-1] * v[:-1]
    return hv


def hessian_builders(x, v, kind):
    """The Hessian of sum(rosenbrock(x)) (kind "hessian") or its product with v ("hvp")."""
    hessian = kind == "hessian"

    def numpy_():
        return (lambda: (rosenbrock_hessian(x),)) if hessian else (lambda: (rosenbrock_hvp(x, v),))

    def tracker():
        f = lambda x: tg.sum(rosenbrock(x))
        return (lambda: (tg.hessian(f, x),)) if hessian else (lambda: (tg.hvp(f, x, v),))

    def torch_():
        import torch

        tx, tv = torch.from_numpy(x), torch.from_numpy(v)
        f = lambda t: rosenbrock(t).sum()
        if hessian:
            return lambda: (torch.autograd.functional.hessian(f, tx),)

        def run():  # the double-backward idiom, faster than torch.autograd.functional.hvp
            t = tx.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(f(t), t, create_graph=True)
            return torch.autograd.grad(g @ tv, t)

        return run

    def autograd_():
        import autograd
        import autograd.numpy as anp

        f = lambda x: anp.sum(rosenbrock(x))
        if hessian:
            h = autograd.hessian(f)
            return lambda: (h(x),)
        hv = autograd.grad(lambda x: anp.dot(autograd.grad(f)(x), v))
        return lambda: (hv(x),)

    def mygrad_():
        raise NotSupported("MyGrad has no higher-order derivatives")

    return _builders(numpy_, tracker, torch_, autograd_, mygrad_)


def hessians(settings, available):
    n = settings["hessian_dim"]
    rng = np.random.default_rng(1)
    x, v = rng.uniform(-1.0, 1.0, n), rng.standard_normal(n)
    rows = []
    for kind in ("hessian", "hvp"):
        row = Row("hessian", f"{kind}, Rosenbrock in {n} dims", "ms", scale=1e3)
        run_row(row, hessian_builders(x, v, kind), available, settings["hessian_repeats"])
        rows.append(row)
    return rows


WORKLOADS = {
    "per-op": per_op,
    "sum-of-squares": sum_of_squares,
    "mlp-step": mlp_step,
    "graphs": graphs,
    "hessian": hessians,
}


# --- targets
def targets(rows):
    """Issue 7's targets, each `{"target", "measured", "met"}` (`met` None where unmeasured)."""
    out = []

    def add(target, measured, met):
        out.append({"target": target, "measured": measured, "met": met})

    for row in rows:
        ratio = row.ratio("tracker_gpu")
        if row.workload == "per-op":
            to_torch = row.ratio("tracker_gpu", to="torch")
            measured = "n/a" if to_torch is None else f"{to_torch:.2f}x PyTorch"
            met = None if to_torch is None else to_torch <= 0.4
            add(f"{row.name}: at most 0.4x PyTorch", measured, met)
        if row.workload == "sum-of-squares" and ratio is not None:
            if row.kind == "memory":
                add(f"{row.name}: at most 2 arrays of x", f"{ratio:.2f} arrays", ratio <= 2.0)
            else:
                limit = 1.1 if row.case.startswith("sumabs2") else 2.0
                add(f"{row.name}: at most {limit}x by hand", f"{ratio:.2f}x", ratio <= limit)
        if row.workload == "mlp-step" and ratio is not None:
            add(f"{row.name}: at most 1.25x by hand", f"{ratio:.2f}x", ratio <= 1.25)
    for row in rows:
        if row.kind != "time":
            continue
        against = {lib: row.ratio("tracker_gpu", to=lib) for lib in PEERS}
        against = {lib: r for lib, r in against.items() if r is not None}
        if not against:
            add(f"{row.name}: not slower than any peer", "n/a", None)
            continue
        fastest = max(against, key=against.get)
        measured = f"{against[fastest]:.2f}x {LIBS[fastest]}, the fastest peer"
        add(f"{row.name}: not slower than any peer", measured, against[fastest] <= 1.0)
    return out


# --- output
def cell(row, lib):
    r = row.results.get(lib)
    if r is None:
        return ""
    if r["value"] is None:
        return r["status"]
    value = r["value"] * row.scale
    shown = f"{value:.3g}" if value < 100 else f"{value:.0f}"
    ratio = row.ratio(lib)
    if lib == "numpy" or ratio is None or row.kind == "memory":
        return shown
    return f"{shown} ({ratio:.2f}x)"


def table(rows):
    header = ["workload", "case", "unit"] + list(LIBS.values())
    body, last = [], None
    for row in rows:
        first = row.workload if row.workload != last else ""
        body.append([first, row.case, row.unit] + [cell(row, lib) for lib in LIBS])
        last = row.workload
    return header, body


def text_table(header, body):
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


def markdown_table(header, body):
    line = lambda r: "| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |"
    return "\n".join([line(header), line(["---"] * len(header)), *map(line, body)])


def mark(met):
    return "n/a" if met is None else "MET" if met else "MISSED"


def machine(threads):
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "threads": threads,
        "system": platform.platform(),
        "python": platform.python_version(),
    }


LEGEND = (
    "workloads[name] is a list of rows; results[library] has status ('ok', 'not installed', "
    "'not supported', 'n/a', 'failed (...)') and value: the median seconds of one call (time "
    "rows; times: every repeat, best: the fastest) or the peak extra bytes (memory rows); "
    "display is value in the row's unit, ratio is value / NumPy by hand's value in this run"
)


def report(rows, goals, info, versions, settings, out_dir):
    header, body = table(rows)
    goal_rows = [[g["target"], g["measured"], mark(g["met"])] for g in goals]
    goal_header = ["target (issue 7)", "measured", "met?"]
    ratios = "Each figure: absolute, then its ratio to NumPy by hand measured in this run."
    versions_line = ", ".join(f"{LIBS[k]} {v or NOT_INSTALLED}" for k, v in versions.items())
    about = (
        f"{info['cpu']}, {info['cores']} cores, BLAS and PyTorch on {info['threads']} thread(s); "
        f"Python {info['python']}; {versions_line}"
    )
    print(f"\n{about}\n{ratios}\n")
    print(text_table(header, body))
    print()
    print(text_table(goal_header, goal_rows))
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "legend": LEGEND,
        "machine": info,
        "versions": versions,
        "settings": settings,
        "workloads": {},
        "targets": goals,
    }
    for row in rows:
        document["workloads"].setdefault(row.workload, []).append(row.as_dict())
    (out_dir / "peers.json").write_text(json.dumps(document, indent=2) + "\n")
    md = [
        "# tracker_gpu against its peers",
        "",
        f"{about}. {ratios}",
        "",
        markdown_table(header, body),
        "",
        markdown_table(goal_header, goal_rows),
        "",
        "Reproduce: `pip install '.[bench]' && python benchmarks/peers.py`",
        "",
    ]
    (out_dir / "peers.md").write_text("\n".join(md))
    print(f"\nwritten: {out_dir / 'peers.json'}, {out_dir / 'peers.md'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller sizes")
    parser.add_argument("--only", choices=list(WORKLOADS), action="append", help="repeatable")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    parser.add_argument("--threads", type=int, default=1, help="BLAS and PyTorch threads")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    versions = installed()
    available = {lib: v is not None for lib, v in versions.items()}
    if available["torch"]:
        import torch

        torch.set_num_threads(args.threads)
    rows = []
    started = time.perf_counter()
    with train_step.blas_threads(args.threads):
        for name in args.only or WORKLOADS:
            print(f"{name} ...", end=" ", file=sys.stderr, flush=True)
            start = time.perf_counter()
            rows += WORKLOADS[name](settings, available)
            print(f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(f"measured in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    report(rows, targets(rows), machine(args.threads), versions, settings, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
