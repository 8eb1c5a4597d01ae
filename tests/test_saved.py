"""What the tape keeps: each rule saves what its pullback reads and nothing more.

A value a rule does not save reaches its pullback as a stand-in with only the shape and dtype,
so a pullback that reads more fails. Per family of rules, gradients (first and second order)
computed with the declared saves must equal those computed with everything saved. And with
weak references: an intermediate no rule saved is freed as soon as the user drops it, and one a
rule saved lives until that rule's pullback has run, no longer.
"""

import gc
import weakref

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import primitive

RNG = np.random.default_rng(0)
X = RNG.uniform(0.5, 1.5, (3, 4))
Y = RNG.uniform(0.5, 1.5, (3, 4))
M = RNG.uniform(0.5, 1.5, (4, 4)) + 4 * np.eye(4)
B = RNG.uniform(0.5, 1.5, (4,))

FAMILIES = {
    "elementwise": {
        **{
            name: (lambda f: lambda x, y: getattr(tg, f)(x))(name)
            for name in "exp expm1 log log1p sqrt square reciprocal sin cos tan atan sinh cosh "
            "tanh asinh abs negative".split()
        },
        "add": lambda x, y: x + y,
        "subtract": lambda x, y: x - y,
        "multiply": lambda x, y: x * y,
        "divide": lambda x, y: x / y,
        "pow": lambda x, y: x**y,
        "pow by a number": lambda x, y: x**3.0,
        "maximum": lambda x, y: tg.maximum(x, y),
        "hypot": lambda x, y: tg.hypot(x, y),
        "logaddexp": lambda x, y: tg.logaddexp(x, y),
        "atan2": lambda x, y: tg.atan2(x, y),
        "where": lambda x, y: tg.where(X > 1.0, x, y),
        "clip": lambda x, y: tg.clip(x, 0.8, 1.2),
    },
    "reductions": {
        "sum": lambda x, y: tg.sum(x * y, axis=1),
        "mean": lambda x, y: tg.mean(x, axis=0) * tg.mean(y),
        "prod": lambda x, y: tg.prod(x * y, axis=0),
        "max": lambda x, y: tg.max(x - y, axis=1),
        "sumabs2": lambda x, y: tg.sum(x**2) + tg.sum(y * y),
    },
    "shape": {
        "reshape and permute": lambda x, y: tg.permute_dims(tg.reshape(x, (4, 3)), (1, 0)) * y,
        "concat and stack": lambda x, y: tg.stack([tg.concat([x, y], axis=0)[1:4], y]),
        "getitem": lambda x, y: x[np.array([0, 2, 2])] * y[1],
        "expand, squeeze, flip": lambda x, y: (
            tg.flip(tg.squeeze(tg.expand_dims(x, axis=0), axis=0), axis=1) * y
        ),
        "broadcast_to": lambda x, y: tg.broadcast_to(x[:1], (3, 4)) * y,
        "cumulative": lambda x, y: tg.cumulative_sum(x, axis=1) * tg.cumulative_prod(y, axis=0),
    },
    "linalg": {
        "matmul": lambda x, y: tg.matmul(x, tg.matrix_transpose(y)),
        "solve": lambda x, y: tg.linalg.solve(M + tg.matmul(tg.matrix_transpose(x), y), B),
        "inv and det": lambda x, y: (
            tg.linalg.inv(M + tg.matrix_transpose(x) @ y) * tg.linalg.det(M)
        ),
        "vecdot and norms": lambda x, y: tg.vecdot(x, y) * tg.linalg.vector_norm(x, axis=1),
    },
    "nn": {
        "activations": lambda x, y: tg.nn.sigmoid(x) * tg.nn.relu(y - 1.0),
        "softmax": lambda x, y: tg.softmax(x, axis=1) * tg.logsoftmax(y, axis=0),
        "logsumexp": lambda x, y: tg.logsumexp(x * y, axis=1),
        "losses": lambda x, y: tg.nn.mse(x, y) + tg.nn.logitcrossentropy(x, tg.softmax(y, axis=1)),
        "dense": lambda x, y: tg.nn.primitives.linear(x, y[:, :4].T @ y[:, :4], y[0]),
    },
}
CASES = [(family, name) for family, table in FAMILIES.items() for name in table]


@pytest.fixture
def everything_saved(monkeypatch):
    """Every primitive saving its output and all its tracked arguments."""
    for prim in [o for o in gc.get_objects() if type(o) is primitive.Primitive]:
        monkeypatch.setattr(prim, "_reads", primitive.EVERYTHING)
        monkeypatch.setattr(prim, "_plans", {})


def gradients(f):
    w = np.random.default_rng(1).uniform(0.5, 1.5, np.shape(tg.data(f(X, Y))))
    first = tg.gradient(lambda x, y: tg.sum(f(x, y) * w), X, Y)

    def nested(x, y):
        gx, gy = tg.gradient(lambda x, y: tg.sum(f(x, y) * w), x, y, nest=True)
        return sum(tg.sum(tg.sin(g)) for g in (gx, gy) if g is not None)

    return first, tg.gradient(nested, X, Y)


def assert_same(a, b):
    for u, v in zip(a, b):
        assert (u is None) == (v is None)
        if u is not None:
            np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family, name", CASES)
def test_what_each_rule_saves_is_all_its_pullback_reads(family, name, request):
    f = FAMILIES[family][name]
    declared = gradients(f)  # raises where a pullback reads a value its rule did not save
    request.getfixturevalue("everything_saved")
    reference = gradients(f)
    for got, expected in zip(declared, reference):
        assert_same(got, expected)


def test_the_check_can_fail(monkeypatch):
    """A rule that declares too little is caught: its pullback meets a stand-in."""
    monkeypatch.setattr(tg.sin, "_reads", primitive._reads("", tg.sin.forward, tg.sin.vjps))
    monkeypatch.setattr(tg.sin, "_plans", {})
    with pytest.raises(tg.PullbackError, match="sin"):
        gradients(lambda x, y: tg.sin(x) * y)


# --- what lives and what is freed
def test_an_intermediate_no_rule_saves_is_freed_when_dropped(backend):
    x = tg.param(backend.asarray(X))
    y = x * 2.0  # the product saves nothing of x; the sum below saves nothing of y
    watched = weakref.ref(y.data)
    loss = tg.sum(y + 1.0)
    del y
    gc.collect()
    assert watched() is None
    tg.back(loss)
    assert np.allclose(backend.to_numpy(tg.grad(x)), 2.0)


def test_a_saved_value_lives_until_its_pullback_has_run():
    x = tg.param(X)
    y = x * 2.0
    watched = weakref.ref(y.data)
    seen = {}

    def before(g):  # runs before sin's pullback
        seen["before"] = watched() is not None
        return g

    def after(g):  # runs after sin's pullback, which read y
        gc.collect()
        seen["after"] = watched() is not None
        return g

    loss = tg.sum(tg.hook(before, tg.sin(tg.hook(after, y))))
    del y
    gc.collect()
    assert watched() is not None  # sin saved its input
    tg.back(loss)
    assert seen == {"before": True, "after": False}
    assert np.allclose(tg.grad(x), 2 * np.cos(2 * X))


def test_an_output_saved_by_its_own_rule_lives_with_the_graph():
    x = tg.param(X)
    y = tg.exp(x)  # exp saves its output
    watched = weakref.ref(y.data)
    loss = tg.sum(y * 3.0)
    del y
    gc.collect()
    assert watched() is not None
    tg.back(loss)
    del loss
    gc.collect()
    assert watched() is None


def test_a_checkpointed_block_keeps_only_its_inputs():
    x = tg.param(X)
    inside = []

    def block(x):
        h = tg.tanh(x * 2.0)
        inside.append(weakref.ref(h.data))
        return tg.sin(h) * x

    loss = tg.sum(tg.checkpoint(block, x))
    gc.collect()
    assert inside[0]() is None  # the block's intermediate is gone after its forward
    tg.back(loss)
    t = np.tanh(2 * X)
    assert np.allclose(tg.grad(x), np.cos(t) * (1 - t**2) * 2 * X + np.sin(t))
