"""Bad input gets a clear exception that names the problem and the fix; nothing is corrupted."""

import numpy as np
import pytest

import tracker_gpu as tg


def test_non_scalar_back_without_a_seed():
    x = tg.param(np.ones(3))
    with pytest.raises(tg.BackError, match=r"not scalar.*back\(sum\(y\)\)"):
        tg.back(x * 2.0)


@pytest.mark.parametrize("value, word", [(np.inf, "inf"), (np.nan, "nan")])
def test_non_finite_loss(value, word):
    x = tg.param(np.array([value]))
    with pytest.raises(tg.BackError, match=f"loss is {word}.*finite"):
        tg.back(tg.sum(x))
    with pytest.raises(tg.BackError, match="finite"):
        tg.gradient(lambda x: tg.sum(x), np.array([value]))


def test_seed_of_the_wrong_shape():
    x = tg.param(np.ones(3))
    with pytest.raises(ValueError, match=r"seed of shape \(2,\).*\(3,\)"):
        tg.back(x * 2.0, np.ones(2))


def test_seed_on_another_device():
    xs = pytest.importorskip("array_api_strict")
    devices = xs.__array_namespace_info__().devices()
    x = tg.param(xs.ones(2, device=devices[1]))
    with pytest.raises(ValueError, match="device"):
        tg.back(x * 2.0, xs.ones(2, device=devices[0]))


def test_seed_of_another_library():
    torch = pytest.importorskip("torch")
    x = tg.param(np.ones(2))
    with pytest.raises(TypeError, match="cannot mix arrays"):
        tg.back(x * 2.0, torch.ones(2, dtype=torch.float64))


def test_setitem_explains_what_to_do():
    x = tg.param(np.zeros(3))
    with pytest.raises(TypeError, match="where"):
        x[0] = 1.0
    assert np.array_equal(tg.data(x), np.zeros(3))


def test_converting_to_numpy_would_drop_the_tape():
    x = tg.param(np.zeros(3))
    with pytest.raises(TypeError, match=r"tg.data\(x\)"):
        np.asarray(x)
    with pytest.raises(TypeError):
        np.exp(x)


def test_complex_input_is_refused():
    with pytest.raises(TypeError, match="complex"):
        tg.param(np.ones(2, dtype=complex))
    with pytest.raises(TypeError, match="complex"):
        tg.gradient(lambda x: tg.sum(x), np.ones(2, dtype=complex))


def test_mixed_libraries_in_one_operation():
    torch = pytest.importorskip("torch")
    x = tg.param(np.ones(2))
    with pytest.raises(TypeError, match="cannot mix arrays of numpy and torch"):
        tg.add(x, torch.ones(2, dtype=torch.float64))


def test_mixed_devices_in_one_operation():
    xs = pytest.importorskip("array_api_strict")
    devices = xs.__array_namespace_info__().devices()
    a = tg.param(xs.ones(2, device=devices[0]))
    b = tg.param(xs.ones(2, device=devices[1]))
    with pytest.raises(ValueError, match="different devices.*to_device"):
        a + b


def test_grad_of_an_interior_node_or_plain_value():
    x = tg.param(np.ones(2))
    with pytest.raises(ValueError, match="only for leaves"):
        tg.grad(x * 2.0)
    with pytest.raises(TypeError, match="tracked"):
        tg.grad(np.ones(2))


def test_custom_rule_returning_the_wrong_number_of_gradients():
    @tg.rule
    def bad(x, y):
        return x * y, lambda g: (g * y,)

    with pytest.raises(tg.PullbackError, match="one gradient.*per positional argument"):
        tg.gradient(lambda x: tg.sum(bad(x, 2.0)), np.ones(2))


def test_custom_rule_returning_the_wrong_shape():
    @tg.rule
    def bad(x):
        return x, lambda g: (g[:1],)

    with pytest.raises(tg.PullbackError, match=r"shape \(1,\).*shape \(3,\)"):
        tg.gradient(lambda x: tg.sum(bad(x)), np.ones(3))


def test_a_loss_that_is_not_scalar():
    with pytest.raises(tg.BackError, match="scalar"):
        tg.gradient(lambda x: x * 2.0, np.ones(2))


def test_update_with_a_step_of_the_wrong_shape():
    x = tg.param(np.ones(2))
    with pytest.raises(ValueError, match="shape"):
        tg.update(x, np.ones(3))
    assert np.array_equal(tg.data(x), np.ones(2))


def test_a_tracked_index_is_refused():
    x = tg.param(np.ones(3))
    with pytest.raises(TypeError, match="index"):
        x[tg.param(np.array([0.0]))]
