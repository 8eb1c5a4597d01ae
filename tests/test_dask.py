"""Dask arrays as a backend: lazy gradients, NumPy operands, one pass over the data.

These run once, in the matrix's dask row (`--backend dask`); the rest of the suite runs there
too, on dask arrays."""

import threading

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.distributed import compute

da = pytest.importorskip("dask.array", reason='pip install "tracker-gpu[dask]"')
dask = pytest.importorskip("dask")
Callback = pytest.importorskip("dask.callbacks").Callback


@pytest.fixture(autouse=True)
def once(request):
    if request.config.getoption("backend") != "dask":
        pytest.skip("Dask's own tests run once, in the dask row (--backend dask)")


class Counted:
    """A chunked data matrix whose chunks are made on request, counting how many were made."""

    def __init__(self, rows, cols, chunk, seed=0):
        self.made = 0
        self.lock = threading.Lock()
        self.seed = seed
        starts = range(0, rows, chunk)
        self.rows = [(s, min(chunk, rows - s)) for s in starts]
        blocks = [
            da.from_delayed(dask.delayed(self.block)(s, n), (n, cols), dtype=np.float64)
            for s, n in self.rows
        ]
        self.array = da.concatenate(blocks, axis=0)
        self.cols = cols

    def block(self, start, n):
        with self.lock:
            self.made += 1
        return np.random.default_rng([self.seed, start]).standard_normal((n, self.cols))

    def numpy(self):
        return np.concatenate([self.block(s, n) for s, n in self.rows])


class Computations(Callback):
    """Counts the computations Dask runs while it is active."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def _start(self, dsk):
        self.count += 1


def logistic_loss(w, x, y):
    """Mean logistic loss of labels y in {-1, 1}."""
    return tg.mean(tg.log1p(tg.exp(-y * (x @ w))))


def logistic_gradient_by_hand(w, x, y):
    """The same gradient written out in NumPy: -mean(y * sigmoid(-y x.w) x)."""
    s = 1.0 / (1.0 + np.exp(y * (x @ w)))
    return -(x * (y * s)[:, None]).mean(axis=0)


def data(rows=600, cols=5, chunk=128):
    x = Counted(rows, cols, chunk)
    w_true = np.linspace(-1.0, 1.0, cols)
    y = da.where(x.array @ w_true > 0, 1.0, -1.0)
    return x, y, np.full(cols, 0.1)


def test_gradient_is_lazy_and_computes_in_one_pass():
    x, y, w = data()
    with Computations() as computations:
        val, (g,) = tg.withgradient(lambda w: logistic_loss(w, x.array, y), w)
        assert computations.count == 0 and x.made == 0
        assert tg.backend.is_lazy(tg.data(val)) and tg.backend.is_lazy(g)
        value, grad = dask.compute(tg.data(val), g)
    assert computations.count == 1
    assert x.made == len(x.rows)  # every chunk made once, shared by the forward and the backward
    xn, yn = x.numpy(), np.where(x.numpy() @ np.linspace(-1, 1, 5) > 0, 1.0, -1.0)
    assert np.allclose(grad, logistic_gradient_by_hand(w, xn, yn), rtol=1e-12, atol=0)
    assert np.isclose(value, np.mean(np.log1p(np.exp(-yn * (xn @ w)))), rtol=1e-12)


def test_back_does_not_compute_a_lazy_loss():
    x, y, w = data()
    p = tg.param(w)
    with Computations() as computations:
        tg.back(logistic_loss(p, x.array, y))
    assert computations.count == 0 and tg.backend.is_lazy(tg.grad(p))


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")  # log(0), meant
def test_a_non_finite_lazy_loss_is_caught_on_request():
    x = da.from_array(np.array([0.0, 1.0]), chunks=1)
    (g,) = tg.gradient(lambda x: tg.sum(tg.log(x)), x)  # no check: it would compute the loss
    assert np.isinf(g.compute()[0])
    with tg.sync_checks(), pytest.raises(tg.BackError, match="not finite"):
        tg.gradient(lambda x: tg.sum(tg.log(x)), x)


def test_numpy_weights_with_dask_data_match_numpy():
    """A NumPy model over dask data, with a penalty on the weights alone (NumPy) added to the
    data term (Dask): the gradient is a dask array equal to the NumPy run's."""
    rng = np.random.default_rng(3)
    dense = lambda n, m, *act: nn.Dense(n, m, *act, rng=rng, dtype="float64")
    model = nn.Chain(dense(5, 8, nn.tanh), dense(8, 3))
    xn = rng.standard_normal((40, 5))
    labels = rng.integers(0, 3, 40)
    x = da.from_array(xn, chunks=10)

    def loss(m, x, labels):
        w = m.layers[0].weight
        return nn.logitcrossentropy(m(x), labels) + 0.01 * tg.sum(w * w)

    (g_dask,) = tg.gradient(lambda m: loss(m, x, da.from_array(labels, chunks=10)), model)
    (g_numpy,) = tg.gradient(lambda m: loss(m, xn, labels), model)
    assert tg.backend.is_lazy(g_dask.layers[0].weight)
    (computed,) = compute(g_dask)
    ours, theirs = nn._parameters(computed), nn._parameters(g_numpy)
    assert ours.keys() == theirs.keys() and len(ours) == 4
    for path in ours:
        assert isinstance(ours[path], np.ndarray)
        assert np.allclose(ours[path], theirs[path], rtol=1e-12, atol=1e-15)


def test_numpy_and_dask_operands_combine_both_ways():
    xn = np.array([0.5, -1.0, 2.0])
    x = da.from_array(xn, chunks=2)
    wn = np.array([1.5, 2.0, -0.5])

    def f(w):
        return tg.sum(x * w) + tg.sum(w * x) + tg.sum(wn * x * w)

    (g,) = tg.gradient(f, wn)
    assert tg.backend.is_lazy(g)
    assert np.allclose(g.compute(), 2 * xn + wn * xn, rtol=1e-14)
    assert tg.testing.gradcheck(lambda w: x * w + w * w, wn)


WRITES_ACROSS = {  # a write between a NumPy and a Dask tracked array, either way
    "dask into numpy zeros": lambda x, d: (lambda y: (y.__setitem__(slice(1, 3), d[0:2]), y)[1])(
        x * 0.0),
    "numpy into dask": lambda x, d: (lambda y: (y.__setitem__(0, x[1] * 10.0), y)[1])(d * 1.0),
    "dask added, then written": lambda x, d: (
        lambda y: (y.__iadd__(d), y.__setitem__(0, d[2] * x[0]), y)[2])(x * 0.0),
}  # fmt: skip


@pytest.mark.parametrize("name", WRITES_ACROSS)
def test_a_write_between_numpy_and_dask_keeps_every_gradient(name):
    """The value was made a plain array of the other library: its gradient was lost, and the
    Dask graph computed at once. Against the same program on NumPy alone."""
    program = WRITES_ACROSS[name]
    xn, dn = np.arange(1.0, 7.0).reshape(3, 2), np.linspace(-1.0, 2.0, 6).reshape(3, 2)
    loss = lambda x, d: tg.sum(program(x, d) ** 2)  # noqa: E731
    expected = tg.withgradient(loss, xn, dn)
    got = tg.withgradient(loss, xn, da.from_array(dn, chunks=1))
    assert float(np.asarray(got.val)) == pytest.approx(float(expected.val), rel=1e-14)
    for g, e in zip(got.grad, expected.grad):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-14)  # np.asarray computes


def test_a_dask_gradient_checks_against_finite_differences():
    x = da.from_array(np.random.default_rng(1).uniform(0.5, 2.0, (6, 4)), chunks=(3, 2))
    assert tg.testing.gradcheck(lambda x: tg.sum(tg.log(x) * x, axis=0) @ x.T, x)
