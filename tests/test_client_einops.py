"""einops.array_api on tracked arrays: each pattern gives the value it gives on NumPy arrays, as
an array of the tracked namespace, and a gradient that agrees with finite differences and with
PyTorch. PyTorch tensors have no `__array_namespace__`, so einops.array_api cannot take them: the
PyTorch gradient comes from the same pattern through einops' own PyTorch backend."""

import numpy as np
import pytest

import tracker_gpu as tg
from tests.clients import ns, torch
from tracker_gpu.testing import gradcheck

einops = pytest.importorskip("einops")
ea = pytest.importorskip("einops.array_api")

pytestmark = pytest.mark.filterwarnings("ignore:torch.asarray:UserWarning")

A = np.random.default_rng(0).standard_normal((2, 3, 4))


def sum_of_squares(t, axes):
    """A custom reduction, written for any Array API namespace and for PyTorch."""
    if torch is not None and isinstance(t, torch.Tensor):
        return (t**2).sum(dim=axes)
    return ns(t).sum(t**2, axis=axes)


# name: (pattern call, taking the einops module to use: einops.array_api, or einops for PyTorch)
CASES = {
    "rearrange-transpose": lambda e, a: e.rearrange(a, "b h w -> w h b"),
    "rearrange-merge": lambda e, a: e.rearrange(a, "b h w -> w (b h)"),
    "rearrange-split": lambda e, a: e.rearrange(a, "b h (w1 w2) -> (b w1) h w2", w1=2),
    "rearrange-list": lambda e, a: e.rearrange([a[0], a[1]], "n h w -> h (n w)"),
    "rearrange-new-axis": lambda e, a: e.rearrange(a, "b h w -> b 1 h w"),
    "repeat-new-axis": lambda e, a: e.repeat(a, "b h w -> b h w r", r=3),
    "repeat-merged": lambda e, a: e.repeat(a, "b h w -> (b 2) h (w r)", r=2),
    "reduce-sum": lambda e, a: e.reduce(a, "b h w -> h", "sum"),
    "reduce-mean": lambda e, a: e.reduce(a, "b h w -> b w", "mean"),
    "reduce-max": lambda e, a: e.reduce(a, "b h w -> h", "max"),
    "reduce-min": lambda e, a: e.reduce(a, "b h w -> w", "min"),
    "reduce-prod": lambda e, a: e.reduce(a, "b h w -> b", "prod"),
    "reduce-pool": lambda e, a: e.reduce(a, "b h (w w2) -> b h w", "max", w2=2),
    "reduce-keep-axis": lambda e, a: e.reduce(a, "b h w -> b () w", "mean"),
    "reduce-callable": lambda e, a: e.reduce(a, "b h w -> b", sum_of_squares),
    "pack": lambda e, a: e.pack([a, a[:, :, 0]], "b h *")[0],
    "unpack": lambda e, a: e.unpack(e.pack([a, a[:, :, 0]], "b h *")[0], [(4,), ()], "b h *")[0],
}


@pytest.mark.parametrize("name", CASES)
def test_value(name):
    x = tg.param(A)
    got = CASES[name](ea, x)
    assert tg.istracked(got)
    assert ns(got) is ns(x)
    np.testing.assert_allclose(tg.data(got), CASES[name](ea, A.copy()), rtol=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_gradient(name):
    assert gradcheck(lambda a: CASES[name](ea, a), A.copy())


@pytest.mark.parametrize("name", CASES)
def test_gradient_like_torch(name):
    if torch is None:
        pytest.skip("PyTorch is not installed")
    w = np.random.default_rng(1).uniform(0.5, 1.5, size=CASES[name](ea, A).shape)
    (g,) = tg.gradient(lambda a: ns(a).sum(CASES[name](ea, a) * w), A)
    t = torch.tensor(A, requires_grad=True)
    (CASES[name](einops, t) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", ["any", "all"])
def test_boolean_reduction_is_constant(reduction):
    x = tg.param(A)
    got = ea.reduce(x > 0, "b h w -> h", reduction)
    assert not tg.istracked(got)
    assert ns(got) is ns(x)
    np.testing.assert_array_equal(np.asarray(got), ea.reduce(A > 0, "b h w -> h", reduction))


def test_asnumpy_of_constant():
    x = tg.param(A)
    np.testing.assert_array_equal(
        ea.asnumpy(ea.rearrange(x > 0, "b h w -> (b h) w")), (A > 0).reshape(6, 4)
    )


def test_pack_shapes_and_unpack_round_trip():
    x = tg.param(A)
    packed, shapes = ea.pack([x, x[:, :, 0]], "b h *")
    assert shapes == [(4,), ()]
    back, column = ea.unpack(packed, shapes, "b h *")
    assert ns(back) is ns(x) and ns(column) is ns(x)
    np.testing.assert_array_equal(tg.data(back), A)
    np.testing.assert_array_equal(tg.data(column), A[:, :, 0])
