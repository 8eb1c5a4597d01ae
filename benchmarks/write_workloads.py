"""The writes of memory.py: a matrix filled row by row, `out[i, :] = ...`, then `sum(out**2)`.

- rows: each row from its own data, `out[i, :] = tanh(x[i, :] * w)`;
- recurrent rows: each row from the one before, `out[i, :] = tanh(out[i - 1, :] * w + x[i, :])`.

Nothing holds `out`'s buffer but `out` (a row read from it is a copy, which the product saves),
so tracker_gpu writes into it in place. Were the row a view, the product would save the view,
every write would go to a copy of `out`, and each copy would live as long as that pullback:
about 130x the memory by hand at 512 rows.

For each: NumPy by hand (the forward keeps what its backward needs), tracker_gpu, and MyGrad
(which writes in place); HIPS autograd refuses assignment. The gradients are those of `x` and
`w`.
"""

import numpy as np

import tracker_gpu as tg


def _problem(rows, width, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, width)) * 0.5, rng.uniform(0.5, 1.5, width)


def _filled(xp, x, w, recurrent, create):
    out = create(x.shape)
    for i in range(x.shape[0]):
        before = out[i - 1, :] * w if recurrent and i else 0.0
        out[i, :] = xp.tanh(before + x[i, :] * (1.0 if recurrent else w))
    return out


def _by_hand(x, w, recurrent):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        before = out[i - 1] * w if recurrent and i else 0.0
        out[i] = np.tanh(before + x[i] * (1.0 if recurrent else w))
    g_out, gx, gw = 2.0 * out, np.zeros_like(x), np.zeros_like(w)
    for i in range(x.shape[0] - 1, -1, -1):
        g_pre = g_out[i] * (1.0 - out[i] ** 2)
        if recurrent:
            gx[i] = g_pre
            if i:
                gw += g_pre * out[i - 1]
                g_out[i - 1] += g_pre * w
        else:
            gx[i], gw = g_pre * w, gw + g_pre * x[i]
    return np.sum(out * out), gx, gw


def write_builders(recurrent, rows, width=256):
    x, w = _problem(rows, width)

    def tracker():
        def loss(x, w):
            xp = x.__array_namespace__()
            out = _filled(xp, x, w, recurrent, lambda shape: xp.zeros(shape, dtype=x.dtype))
            return xp.sum(out * out)

        return lambda: (lambda r: (r.val, *r.grad))(tg.withgradient(loss, x, w))

    def mygrad_():
        import mygrad as mg

        def run():
            tx, tw = mg.tensor(x), mg.tensor(w)
            out = _filled(mg, tx, tw, recurrent, lambda shape: mg.zeros(shape, dtype=x.dtype))
            total = mg.sum(out * out)
            total.backward()
            return total, tx.grad, tw.grad

        return run

    def autograd_():
        raise NotImplementedError("autograd refuses assignment")

    return {
        "numpy": lambda: lambda: _by_hand(x, w, recurrent),
        "tracker_gpu": tracker,
        "autograd": autograd_,
        "mygrad": mygrad_,
    }
