"""No silent no-op training (issue 29): a loss that depends on no argument warns once, naming
the function, and `optim.update` with no gradient for any trainable parameter raises."""

import warnings

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import optim
from tracker_gpu.api import quiet_gradient


def _cut_loss(x):
    return tg.sum(tg.data(x) * 2.0)  # computed from the plain value: cut from the graph


def _warnings(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in caught]


# --- gradient and withgradient
def test_a_loss_cut_from_the_graph_warns_once_naming_the_function(backend):
    x = backend.asarray([1.0, 2.0])
    (g,), messages = _warnings(lambda: tg.gradient(_cut_loss, x))
    assert g is None
    assert len(messages) == 1 and "_cut_loss" in messages[0], messages
    assert "does not depend on" in messages[0] and "tg.data" in messages[0]


def test_the_warning_points_at_the_callers_line():
    with pytest.warns(UserWarning, match="does not depend on") as caught:
        tg.withgradient(_cut_loss, np.ones(2))
    assert caught[0].filename == __file__


def test_a_loss_of_zero_derivative_does_not_warn(backend):
    """A tracked constant loss (floor, sign, a comparison, the derivative of a linear function)
    is a function whose derivative is zero, where PyTorch gives zeros without a word."""
    x = backend.asarray([1.0, 2.0])
    for f in (lambda x: tg.sum(tg.floor(x)), lambda x: tg.sum(tg.stop_gradient(x)) * 3.0):
        (g,), messages = _warnings(lambda f=f: tg.gradient(f, x))
        assert g is None and messages == [], messages
    linear = lambda x: tg.gradient(lambda x: tg.sum(x * 2.0), x, nest=True)[0]  # noqa: E731
    (g,), messages = _warnings(lambda: tg.gradient(lambda x: tg.sum(linear(x)), x))
    assert g is None and messages == [], messages


def test_a_loss_of_another_parameter_warns():
    W = tg.param(np.ones(2))
    (g,), messages = _warnings(lambda: tg.gradient(lambda x: tg.sum(W * 2.0), np.ones(2)))
    assert g is None and len(messages) == 1 and "other tracked arrays" in messages[0], messages


def test_a_python_number_warns_once_not_twice():
    (g,), messages = _warnings(lambda: tg.gradient(lambda x: float(tg.sum(x)), np.ones(2)))
    assert g is None and len(messages) == 1 and "Python float" in messages[0], messages


def test_no_warning_when_one_argument_is_reached(backend):
    x, y = backend.asarray([1.0, 2.0]), backend.asarray([3.0, 4.0])
    (gx, gy), messages = _warnings(lambda: tg.gradient(lambda x, y: tg.sum(x * 2.0), x, y))
    assert gy is None and gx is not None and messages == []


def test_no_warning_without_float_arguments():
    labels = np.array([0, 1])
    (g,), messages = _warnings(lambda: tg.gradient(lambda y: tg.sum(y * 1.0), labels))
    assert g is None and messages == []


def test_implicit_params_warn_too():
    W = tg.param(np.ones(2))
    gs, messages = _warnings(lambda: tg.gradient(lambda: tg.sum(tg.data(W)), tg.Params([W])))
    assert gs[W] is None and len(messages) == 1 and "<lambda>" in messages[0], messages


def test_quiet_gradient_stays_quiet():
    (g,), messages = _warnings(lambda: quiet_gradient(_cut_loss, np.ones(2)))
    assert g is None and messages == []


def test_the_library_own_transforms_do_not_warn():
    x, v = np.array([1.0, 2.0]), np.array([1.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tg.hvp(lambda x: tg.sum(x * 2.0), x, v)  # linear: a Hessian of zeros, no warning
        tg.hessian(lambda x: tg.sum(x * 2.0), x)
        tg.jvp(lambda x: x * 2.0, (x,), (v,))
        tg.jacfwd(lambda x: tg.sum(x * x), x)
        tg.gradient(lambda x: tg.sum(x**2), x, nest=True)


# --- optim.update
def _model():
    return {"w": np.array([1.0, 2.0]), "b": np.array([0.5])}


def test_update_without_any_gradient_raises():
    model = _model()
    state = optim.setup(optim.Adam(), model)
    with pytest.raises(ValueError, match="no gradient for any trainable parameter"):
        optim.update(state, model, {"w": None, "b": None})
    with pytest.raises(ValueError, match="no gradient for any trainable parameter"):
        optim.update(state, model, None)


def test_update_of_a_cut_loss_raises():
    model = _model()
    state = optim.setup(optim.Descent(0.1), model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (grads,) = tg.gradient(lambda m: tg.sum(tg.data(m["w"])), model)
    with pytest.raises(ValueError, match="allow_no_gradient=True"):
        optim.update(state, model, grads)


def test_update_without_gradient_allowed_when_asked():
    model = _model()
    state = optim.setup(optim.Descent(0.1), model)
    new_state, new_model = optim.update(state, model, None, allow_no_gradient=True)
    assert new_model["w"] is model["w"]


def test_update_with_some_gradients_or_all_frozen_passes():
    model = _model()
    state = optim.setup(optim.Descent(0.1), model)
    _, new_model = optim.update(state, model, {"w": np.ones(2), "b": None})
    assert np.allclose(new_model["w"], [0.9, 1.9]) and new_model["b"] is model["b"]
    optim.update(optim.freeze(state), model, {"w": None, "b": None})  # nothing to train


def test_update_of_a_model_without_parameters_passes():
    model = {"labels": np.array([1, 2])}
    state = optim.setup(optim.Descent(0.1), model)
    optim.update(state, model, {"labels": None})
