"""A call that raises changes nothing: every transform, and `tg.compile` recording or replaying,
that raises after a layer's forward has written its buffers (a BatchNorm's running statistics,
its count) leaves them as they were, as PyTorch's `torch.func` transforms do not; one that ends
well writes them once, as one plain forward of the same layer does."""

import copy
import warnings

import numpy as np
import pytest
from helpers import numpy_of

import tracker_gpu as tg
from tracker_gpu import nn


def _layers(backend=None):
    """Every kind of layer whose forward writes buffers in training mode."""
    f64 = {"dtype": "float64"}
    if backend is not None:
        f64.update(xp=backend.xp, device=backend.device)
    return {
        "BatchNorm": nn.BatchNorm(3, active=True, **f64),
        "BatchNorm cumulative": nn.BatchNorm(3, momentum=None, active=True, **f64),
        "InstanceNorm": nn.InstanceNorm(3, track_stats=True, active=True, **f64),
    }


def _input(name, backend=None):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 5) if name == "InstanceNorm" else (6, 3))
    return x if backend is None else backend.asarray(x)


def _buffers(layer, backend=None):
    names = ("running_mean", "running_var", "count")
    convert = np.asarray if backend is None else lambda v: numpy_of(backend, v)
    return {k: convert(v) for k, v in vars(layer).items() if k in names and v is not None}


class Refused(Exception):
    pass


def _loss(layer, fail):
    def f(x):
        y = tg.sum(layer(x) ** 3)
        if fail:
            raise Refused("after the forward")
        return y

    return f


def _vector(layer, fail):
    def f(x):
        y = tg.reshape(layer(x), (-1,)) ** 3
        if fail:
            raise Refused("after the forward")
        return y

    return f


TRANSFORMS = {
    "gradient": lambda layer, x, fail: tg.gradient(_loss(layer, fail), x),
    "withgradient": lambda layer, x, fail: tg.withgradient(_loss(layer, fail), x),
    "jacobian": lambda layer, x, fail: tg.jacobian(_vector(layer, fail), x),
    "hessian": lambda layer, x, fail: tg.hessian(_loss(layer, fail), x),
    "hvp": lambda layer, x, fail: tg.hvp(_loss(layer, fail), x, tg.ones_like(x)),
    "jvp": lambda layer, x, fail: tg.jvp(_loss(layer, fail), (x,), (tg.ones_like(x),)),
    "jacfwd": lambda layer, x, fail: tg.jacfwd(_vector(layer, fail), x),
    "forward": lambda layer, x, fail: tg.forward(_loss(layer, fail), x),
    "compile": lambda layer, x, fail: tg.compile(_loss(layer, fail))(x),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("name", list(_layers()))
def test_a_transform_that_raises_leaves_the_buffers_and_one_that_ends_writes_them_once(
    transform, name, backend
):
    layer, x = _layers(backend)[name], _input(name, backend)
    layer(x)  # statistics that are not the initial ones
    before = _buffers(layer, backend)
    with pytest.raises(Refused):
        TRANSFORMS[transform](layer, x, True)
    for key, value in _buffers(layer, backend).items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)
    twin = copy.deepcopy(layer)
    TRANSFORMS[transform](layer, x, False)
    twin(x)  # one plain forward
    for key, value in _buffers(layer, backend).items():
        np.testing.assert_array_equal(value, _buffers(twin, backend)[key], err_msg=key)


def test_a_nan_loss_refused_by_the_backward_pass_leaves_the_statistics():
    layer = _layers()["BatchNorm"]
    x = _input("BatchNorm")
    before = _buffers(layer)
    bad = x.copy()
    bad[0, 0] = np.nan
    for step in (tg.withgradient, tg.compile(lambda x: tg.sum(layer(x) ** 2))):
        f = (lambda x: tg.sum(layer(x) ** 2)) if step is tg.withgradient else None
        with pytest.raises(tg.BackError):
            step(f, bad) if f else step(bad)
        for key, value in _buffers(layer).items():
            np.testing.assert_array_equal(value, before[key], err_msg=key)


def test_an_inner_transform_that_raises_restores_its_own_writes_only():
    outer_layer, inner_layer = _layers()["BatchNorm"], _layers()["BatchNorm cumulative"]
    x = _input("BatchNorm")
    twin = copy.deepcopy(outer_layer)
    inner_before = _buffers(inner_layer)

    def f(x):
        y = tg.sum(outer_layer(x) ** 2)
        try:
            tg.gradient(_loss(inner_layer, True), x)
        except Refused:
            pass
        return y

    tg.gradient(f, x)
    twin(x)
    for key, value in _buffers(outer_layer).items():
        np.testing.assert_array_equal(value, _buffers(twin)[key], err_msg=key)
    for key, value in _buffers(inner_layer).items():
        np.testing.assert_array_equal(value, inner_before[key], err_msg=key)


def test_a_recording_refused_and_run_again_eagerly_updates_the_statistics_once():
    layer, x = _layers()["BatchNorm"], _input("BatchNorm")
    labels = np.array([0, 1, 2, 0, 1, 2])
    twin = copy.deepcopy(layer)

    def loss(model, x, y):
        z = model(x)
        return nn.logitcrossentropy(z, y.astype(np.int64))  # NumPy's astype: refused recording

    compiled = tg.compile(loss, fallback=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refusal, named
        compiled(layer, x, labels)
    assert compiled.programs() == []  # run again eagerly
    twin(x)
    for key, value in _buffers(layer).items():
        np.testing.assert_array_equal(value, _buffers(twin)[key], err_msg=key)
