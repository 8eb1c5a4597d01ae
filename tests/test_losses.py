"""Losses: values against NumPy, gradients by gradcheck (first and second order), labels as
class indices or targets, one primitive for mse and logitcrossentropy, and clear errors."""

import numpy as np
import pytest
from helpers import check, check_nested, numpy_of, uniform

import tracker_gpu as tg
from tracker_gpu.rules import losses
from tracker_gpu.rules.losses import (
    binarycrossentropy,
    crossentropy,
    logitbinarycrossentropy,
    logitcrossentropy,
    mse,
)

RNG = np.random.default_rng(0)
LOGITS = RNG.standard_normal((4, 3))
LABELS = np.array([0, 2, 1, 2])
ONEHOT = np.eye(3)[LABELS]


def reference_logitcrossentropy(z, onehot, axis=-1):
    z = z - z.max(axis=axis, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=axis, keepdims=True))
    return -np.mean(np.sum(onehot * logp, axis=axis))


def labels_on(backend, labels=LABELS):
    return backend.asarray(np.asarray(labels))


# --- values
def test_values_match_numpy(backend):
    z, y = backend.asarray(LOGITS), backend.asarray(RNG.uniform(size=(4, 3)))
    p = backend.asarray(RNG.uniform(0.1, 0.9, size=(4, 3)))
    assert np.isclose(float(mse(z, y)), np.mean((LOGITS - numpy_of(backend, y)) ** 2))
    assert np.isclose(float(mse(z, y, agg="sum")), np.sum((LOGITS - numpy_of(backend, y)) ** 2))
    expected = reference_logitcrossentropy(LOGITS, ONEHOT)
    assert np.isclose(float(logitcrossentropy(z, labels_on(backend))), expected)
    assert np.isclose(float(logitcrossentropy(z, backend.asarray(ONEHOT))), expected)
    assert np.isclose(float(logitcrossentropy(z, labels_on(backend), agg="sum")), 4 * expected)
    probabilities = np.exp(LOGITS) / np.exp(LOGITS).sum(axis=1, keepdims=True)
    assert np.isclose(
        float(crossentropy(backend.asarray(probabilities), labels_on(backend))), expected
    )
    pn, t = numpy_of(backend, p), ONEHOT
    bce = np.mean(-t * np.log(pn) - (1 - t) * np.log(1 - pn))
    assert np.isclose(float(binarycrossentropy(p, backend.asarray(t))), bce)
    logit = np.log(pn / (1 - pn))
    assert np.isclose(
        float(logitbinarycrossentropy(backend.asarray(logit), backend.asarray(t))), bce
    )


def test_logitcrossentropy_is_stable_for_huge_logits(backend):
    z = backend.asarray(np.array([[1e4, 0.0, -1e4], [0.0, 1e4, 0.0]]))
    value = float(logitcrossentropy(z, labels_on(backend, [0, 0])))
    assert np.isclose(value, 1e4 / 2)
    (g,) = tg.gradient(lambda z: logitcrossentropy(z, labels_on(backend, [0, 0])), z)
    assert np.all(np.isfinite(numpy_of(backend, g)))


def test_logitcrossentropy_with_classes_masked_by_minus_inf(backend):
    """A -inf logit forbids a class (issue 30): the loss is the target's log-probability, not
    nan from 0 * -inf, and the gradient softmax - onehot is finite (0 on the masked class)."""
    z = LOGITS.copy()
    z[0, 1] = z[2, 0] = -np.inf  # never the target class
    finite = np.where(np.isinf(z), -1e300, z)  # the same softmax, computed without infinities
    p = np.exp(finite - finite.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    expected = -np.mean(np.log(p[np.arange(4), LABELS]))
    for labels in (labels_on(backend), backend.asarray(ONEHOT)):
        loss = lambda z, labels=labels: logitcrossentropy(z, labels)  # noqa: E731
        value, (g,) = tg.withgradient(loss, backend.asarray(z))
        assert np.isclose(float(value), expected)
        assert np.allclose(numpy_of(backend, g), (p - ONEHOT) / 4)


def test_logitbinarycrossentropy_is_stable_for_huge_logits(backend):
    x = backend.asarray(np.array([1e4, -1e4, 30.0]))
    y = backend.asarray(np.array([1.0, 0.0, 0.0]))
    assert np.isclose(float(logitbinarycrossentropy(x, y, agg="sum")), 30.0)


def test_float32_stays_float32(backend):
    z = backend.asarray(LOGITS.astype(np.float32))
    (g,) = tg.gradient(lambda z: logitcrossentropy(z, labels_on(backend)), z)
    assert g.dtype == z.dtype
    (g,) = tg.gradient(lambda z: mse(z, backend.asarray(ONEHOT.astype(np.float32))), z)
    assert g.dtype == z.dtype


# --- gradients
def test_mse_gradcheck(backend):
    yhat, y = (
        backend.asarray(uniform((3, 4), (-1, 1))),
        backend.asarray(uniform((3, 4), (-1, 1), 1)),
    )
    check(backend, lambda a, b: mse(a, b), yhat, y)
    check(backend, lambda a, b: mse(a, b, agg="sum"), yhat, y)


@pytest.mark.parametrize("agg", ["mean", "sum"])
def test_logitcrossentropy_gradcheck_with_class_indices(backend, agg):
    labels = labels_on(backend)
    check(backend, lambda z: logitcrossentropy(z, labels, agg=agg), backend.asarray(LOGITS))


def test_logitcrossentropy_gradcheck_with_targets(backend):
    # probabilities that do not sum to one: the gradient of both arguments is general
    targets = backend.asarray(RNG.uniform(0.1, 1.0, size=(4, 3)))
    check(backend, logitcrossentropy, backend.asarray(LOGITS), targets)


def test_logitcrossentropy_along_another_axis(backend):
    z, labels = backend.asarray(LOGITS.T), labels_on(backend)
    assert np.isclose(
        float(logitcrossentropy(z, labels, axis=0)),
        reference_logitcrossentropy(LOGITS, ONEHOT),
    )
    check(backend, lambda z: logitcrossentropy(z, labels, axis=0), z)


def test_class_indices_and_onehot_agree(backend):
    z = backend.asarray(LOGITS)
    (g1,) = tg.gradient(lambda z: logitcrossentropy(z, labels_on(backend)), z)
    (g2,) = tg.gradient(lambda z: logitcrossentropy(z, backend.asarray(ONEHOT)), z)
    assert np.allclose(numpy_of(backend, g1), numpy_of(backend, g2))
    # and the familiar closed form: (softmax - onehot) / batch
    p = np.exp(LOGITS) / np.exp(LOGITS).sum(axis=1, keepdims=True)
    assert np.allclose(numpy_of(backend, g1), (p - ONEHOT) / 4)


def test_crossentropy_gradcheck(backend):
    p = backend.asarray(RNG.uniform(0.1, 1.0, size=(4, 3)))
    check(backend, lambda p: crossentropy(p, labels_on(backend)), p)
    check(backend, crossentropy, p, backend.asarray(RNG.uniform(size=(4, 3))))


def test_binary_crossentropies_gradcheck(backend):
    p = backend.asarray(RNG.uniform(0.1, 0.9, size=(5,)))
    y = backend.asarray(RNG.uniform(size=(5,)))
    check(backend, binarycrossentropy, p, y)
    x = backend.asarray(RNG.standard_normal((2, 3)))
    check(backend, logitbinarycrossentropy, x, backend.asarray(RNG.uniform(size=(2, 3))))


def test_second_derivatives(backend):
    z, y = backend.asarray(LOGITS), backend.asarray(RNG.uniform(size=(4, 3)))
    check_nested(backend, lambda z: logitcrossentropy(z, labels_on(backend)), z)
    check_nested(backend, lambda z: logitcrossentropy(z, y), z)
    check_nested(backend, lambda a: mse(a, y), z)
    check_nested(backend, lambda x: logitbinarycrossentropy(x, y), z)


def test_composite_agg_function(backend):
    z = backend.asarray(LOGITS)
    per_sample = crossentropy(z * 0 + 0.5, labels_on(backend), agg=lambda v: v)
    assert tuple(per_sample.shape) == (4,)


# --- one primitive each, with a slot for a fused pullback
@pytest.mark.parametrize(
    "loss, primitive",
    [
        (lambda z, y: logitcrossentropy(z, y), losses.logitcrossentropy_primitive),
        (lambda z, y: mse(z, tg.data(y) * 1.0), losses.mse_primitive),
    ],
)
def test_mse_and_logitcrossentropy_are_one_primitive(backend, loss, primitive):
    z = tg.param(backend.asarray(LOGITS))
    y = backend.asarray(ONEHOT)
    out = loss(z, y)
    assert out._node.rule is primitive and out._node.args[0] is z._node
    assert primitive.fused is not None  # its fused CUDA pullback


# --- bad input
def test_labels_out_of_range(backend):
    z = backend.asarray(LOGITS)
    with tg.sync_checks(), pytest.raises(ValueError, match=r"labels must lie in \[0, 2\] for"):
        logitcrossentropy(z, labels_on(backend, [0, 1, 2, 3]))
    with tg.sync_checks(), pytest.raises(ValueError, match="from -1"):
        logitcrossentropy(z, labels_on(backend, [0, -1, 2, 1]))
    with tg.sync_checks(), pytest.raises(ValueError, match="labels must lie"):
        crossentropy(tg.softmax(z, axis=-1), labels_on(backend, [0, 1, 2, 7]))


@pytest.mark.filterwarnings("ignore:invalid value encountered in log:RuntimeWarning")  # meant
def test_without_sync_checks_bad_labels_and_losses_show_as_nan(backend):
    """As by default on a GPU, where reading a value back would stall the device every step."""
    z = backend.asarray(LOGITS)
    with tg.sync_checks(False):
        loss = logitcrossentropy(z, labels_on(backend, [0, 1, 2, 3]))
        assert np.isnan(float(loss))  # no error, but no silently wrong number either
        assert np.isnan(float(crossentropy(z, labels_on(backend, [0, 1, 2, 7]))))
        (g,) = tg.gradient(lambda z: logitcrossentropy(z, labels_on(backend, [0, 1, 2, 3])), z)
    assert np.isnan(backend.to_numpy(g)).any()
    on_gpu = tg.backend.on_accelerator(tg.data(z))
    lazy = tg.backend.is_lazy(tg.data(z))  # reading a dask array back computes it
    assert tg.checks.checking(tg.data(z)) is not (on_gpu or lazy)  # default: eager host memory


def test_labels_of_the_wrong_shape(backend):
    z = backend.asarray(LOGITS)
    with pytest.raises(ValueError, match=r"labels of shape \(3,\).*class indices of shape \(4,\)"):
        logitcrossentropy(z, labels_on(backend, [0, 1, 2]))
    with pytest.raises(ValueError, match=r"targets of shape \(4, 3\)"):
        logitcrossentropy(z, backend.asarray(np.ones((4, 2))))


def test_mismatched_prediction_and_target_shapes(backend):
    yhat, y = backend.asarray(np.ones((4, 1))), backend.asarray(np.ones(4))
    with pytest.raises(ValueError, match=r"mse: the prediction has shape \(4, 1\).*\(4,\)"):
        mse(yhat, y)
    with pytest.raises(ValueError, match="binarycrossentropy"):
        binarycrossentropy(yhat, y)


def test_bad_agg_and_axis(backend):
    z = backend.asarray(LOGITS)
    with pytest.raises(ValueError, match='agg must be "mean" or "sum"'):
        mse(z, z, agg="max")
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        logitcrossentropy(z, labels_on(backend), axis=2)


def test_nan_loss_is_a_clear_error(backend):
    z = backend.asarray(np.array([[np.nan, 0.0, 1.0]]))
    with tg.sync_checks(), pytest.raises(tg.BackError, match="not finite"):
        tg.gradient(lambda z: logitcrossentropy(z, labels_on(backend, [1])), z)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_the_target_gradient_at_targets_of_0_and_1_is_torchs(reduction):
    """A target that carries a gradient (distillation from a teacher being trained): its slope
    is log(p) at a target of 0 or 1 too, whatever the reduction (it was 0 there)."""
    torch = pytest.importorskip("torch")
    from tracker_gpu import nn

    p, y = np.array([0.3, 0.3, 0.7, 0.9]), np.array([0.0, 1.0, 0.0, 0.25])
    probs, soft = np.array([[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]]), np.array([[0, 0.4, 0.6], [1, 0, 0]])
    cases = [
        (lambda t: nn.binarycrossentropy(p, t, eps=0.0, reduction=reduction), y,
         lambda t: -(t * torch.log(torch.tensor(p)) + (1 - t) * torch.log(torch.tensor(1 - p)))),
        (lambda t: nn.crossentropy(probs, t, eps=0.0, reduction=reduction), soft,
         lambda t: -(t * torch.log(torch.tensor(probs))).sum(1)),
    ]  # fmt: skip
    for ours, target, theirs in cases:
        t = torch.tensor(target, requires_grad=True)
        per_item = theirs(t)
        (per_item.sum() if reduction == "sum" else per_item.mean()).backward()
        if reduction == "none":
            _, back = tg.forward(ours, target)
            (g,) = back(np.full(per_item.shape, 1 / per_item.numel()))
        else:
            (g,) = tg.gradient(ours, target)
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-13, atol=1e-15)


# In the numpy-fused row, 170,000 rows through the host build's simulated CUDA threads took two
# minutes; the fused kernel takes the count as an integer and divides in float32.
@pytest.mark.numpy_row
def test_a_half_logitcrossentropy_averages_past_float16s_largest_count():
    """70,000 samples, more than float16 holds: the mean's count was inf, the loss and its
    gradient 0; the sum of 100,000 losses overflowed float16. PyTorch's in float32 is the
    reference."""
    torch = pytest.importorskip("torch")
    from tracker_gpu import nn

    rng = np.random.default_rng(0)
    for n, spread in ((70_000, 1.0), (100_000, 5.0)):
        z = (rng.standard_normal((n, 2)) * spread).astype(np.float16)
        y = rng.integers(0, 2, n)
        value, (g,) = tg.withgradient(lambda z, y=y: nn.logitcrossentropy(z, y), z)
        t = torch.tensor(z.astype(np.float32), requires_grad=True)
        expected = torch.nn.functional.cross_entropy(t, torch.tensor(y))
        expected.backward()
        assert value.dtype == g.dtype == np.float16
        np.testing.assert_allclose(float(value), expected.item(), rtol=1e-3)
        np.testing.assert_allclose(g.astype(np.float32), t.grad.numpy(), atol=1e-7)


def test_the_probability_losses_take_numpys_bfloat16():
    """NumPy's finfo and isdtype refuse ml_dtypes' bfloat16: the losses raised ValueError."""
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from tracker_gpu import nn

    p, t = np.array([[0.2, 0.8]]), np.array([[0.0, 1.0]])
    for loss in (nn.crossentropy, nn.binarycrossentropy):
        ours = loss(p.astype(ml_dtypes.bfloat16), t.astype(ml_dtypes.bfloat16))
        theirs = loss(*(torch.tensor(a, dtype=torch.bfloat16) for a in (p, t)))
        np.testing.assert_allclose(float(ours), float(theirs), rtol=1e-2)


# the losses whose targets are shaped like the predictions (regression, binary, distributions)
SHAPED_TARGETS = ["mse", "mae", "huber_loss", "smoothl1", "binarycrossentropy",
                  "logitbinarycrossentropy", "kldivergence"]  # fmt: skip


@pytest.mark.parametrize("target_dtype", ["int64", "bool"])
@pytest.mark.parametrize("name", SHAPED_TARGETS)
def test_integer_and_boolean_targets_are_the_predictions_dtype(backend, name, target_dtype):
    """0/1 targets of integers or booleans give the loss of the same targets as floats of the
    predictions' dtype: NumPy's promotion made a float32 model's loss float64, PyTorch and
    array-api-strict refused booleans (Flux's promotion, the same on every library)."""
    loss = getattr(tg.nn, name)
    predicted = uniform((4, 3), (0.05, 0.95), seed=3).astype(np.float32)
    if name in ("mse", "mae", "huber_loss", "smoothl1", "logitbinarycrossentropy"):
        predicted = (predicted * 4.0 - 2.0).astype(np.float32)
    y = (np.arange(12).reshape(4, 3) % 3 == 0).astype(target_dtype)
    yhat = backend.asarray(predicted)
    try:
        expected = loss(yhat, backend.asarray(y.astype(np.float32)), reduction="none")
    except NotImplementedError:  # kldivergence's xlogy: array-api-strict has no special ones
        pytest.skip(f"{name} is not available on {backend.name}")
    got = loss(yhat, backend.asarray(y), reduction="none")
    assert got.dtype == expected.dtype == yhat.dtype, (got.dtype, expected.dtype)
    np.testing.assert_array_equal(numpy_of(backend, got), numpy_of(backend, expected))
