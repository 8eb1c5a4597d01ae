"""The workloads of peers.py, each written for NumPy by hand, tracker_gpu and the peers.

A workload is a function `(settings, available) -> rows`: it builds, for each library, a
zero-argument call whose answer `run_row` checks against NumPy by hand before timing it. The
peers are imported only inside their builders, so a library that is not installed costs nothing.
`WORKLOADS` maps the names `--only` takes to these functions.
"""

import traceback

import numpy as np
import train_step
from peer_measure import NOT_INSTALLED, NotSupported, Row, check, frozen_gc, run_row

import tracker_gpu as tg

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
        row.set_warm(lib, medians)  # timed in blocks already: the same figure in both tables
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
