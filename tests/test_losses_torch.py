"""Every loss `nn` exports (`nn.LOSSES`) against `torch.nn.functional`, in float64: every
reduction, the PyTorch options (class `weight`, `ignore_index`, `label_smoothing`, `pos_weight`,
`delta`/`beta`, `log_target`), on inputs with classes masked by `-inf` logits and ignored
targets; value and gradient with respect to the inputs. PyTorch's is the reference: nothing
expected here is copied from our own output. The new options' gradients (the class weights'
too, which PyTorch does not differentiate) are also checked against finite differences.

Our class axis is the last (PyTorch's: 1): the 3-d cases move it for PyTorch. Where we differ
on purpose (README, "Coming from PyTorch", "Losses"): a batch whose every target is ignored
gives a mean of 0 (PyTorch: nan); `kldivergence` reduces the class axis first ("mean" is
PyTorch's "batchmean").
"""

from collections import namedtuple

import numpy as np
import pytest
from helpers import check, numpy_of

import tracker_gpu as tg
from tracker_gpu import nn

torch = pytest.importorskip("torch", reason="the reference losses are PyTorch's")
F = torch.nn.functional

RNG = np.random.default_rng(7)
N, C = 6, 4
MASKED = ((0, 2), (3, 0))  # classes forbidden with a -inf logit (never the target)


def masked(z):
    z = z.copy()
    for i, c in MASKED:
        z[i, c] = -np.inf
    return z


Z = RNG.standard_normal((N, C))
ZINF = masked(Z)
LABELS = np.array([1, 0, 3, 2, 1, 0])
IGNORED = np.array([1, -100, 3, 2, -100, 0])
ALL_IGNORED = np.full(N, -100)
WEIGHT = np.array([0.5, 2.0, 1.0, 1.5])
SOFT = RNG.dirichlet(np.ones(C), size=N)  # targets that are 0 on the masked classes
for _i, _c in MASKED:
    SOFT[_i, _c] = 0.0
SOFT /= SOFT.sum(axis=1, keepdims=True)
PROBS = np.exp(Z) / np.exp(Z).sum(axis=1, keepdims=True)
Z3 = RNG.standard_normal((2, 3, C))
Z3[0, 1, 3] = -np.inf
LABELS3 = np.array([[0, 2, -100], [3, 1, 1]])
X, Y = RNG.standard_normal((N, C)) * 2, RNG.standard_normal((N, C))
P, T01 = RNG.uniform(0.05, 0.95, (N, C)), RNG.uniform(0, 1, (N, C))
Q2, P2 = RNG.dirichlet(np.ones(C), size=N), RNG.dirichlet(np.ones(C), size=N)

# `ours(reduction)` and `theirs(reduction)` are functions of `inputs` (NumPy arrays, tensors);
# `wrt`: the inputs whose gradients are compared with PyTorch's.
Case = namedtuple("Case", "loss name ours theirs inputs wrt")


def no_inf(z):
    """-inf made -1e30 (exp gives 0 all the same): PyTorch's cross_entropy with targets shaped
    like the scores multiplies 0 * -inf (nan), where ours adds nothing for a masked class."""
    return torch.where(torch.isinf(z), torch.full_like(z, -1e30), z)


def t(a):
    return torch.as_tensor(a)


def to_axis1(z):
    return z.permute(0, 2, 1)


def kl_reduction(reduction, pointwise):
    if reduction == "none":
        return pointwise.sum(-1)
    return pointwise.sum() / (pointwise.shape[0] if reduction == "mean" else 1)


def cross_entropy_of_logp(logp, y, weight=None, ignore_index=-100, label_smoothing=0.0,
                          reduction="mean"):  # fmt: skip
    """PyTorch's cross_entropy as a function of the log-probabilities themselves (its own
    takes logits and normalises them again, which changes the gradient): F.nll_loss, plus
    PyTorch's label smoothing (aten's cross_entropy_loss_label_smoothing) written out.
    `test_the_reference_is_pytorchs_cross_entropy` checks it against F.cross_entropy."""
    c, eps = logp.shape[-1], label_smoothing
    w = torch.ones(c, dtype=logp.dtype) if weight is None else weight
    logp = no_inf(logp)
    if y.is_floating_point():  # targets shaped like the scores: the mean is over samples
        per = -(w * (y * (1 - eps) + eps / c) * logp).sum(-1)
        return {"none": per, "sum": per.sum(), "mean": per.mean()}[reduction]
    nll = F.nll_loss(logp, y, weight=weight, ignore_index=ignore_index, reduction=reduction)
    if not eps:
        return nll
    kept = y != ignore_index
    smooth = -(w * logp).sum(-1) * kept
    total = {"none": smooth, "sum": smooth.sum(), "mean": smooth.sum() / w[y[kept]].sum()}
    return (1 - eps) * nll + eps / c * total[reduction]


def class_cases(loss, scores, logp_of):
    """The options of a loss over classes; `logp_of(scores)`: their log-probabilities."""
    smoothing = loss != "nll"
    lce = loss == "logitcrossentropy"
    if lce:
        ref = lambda z, *a, **k: F.cross_entropy(no_inf(z), *a, **k)  # noqa: E731
    else:
        ref = lambda z, *a, **k: cross_entropy_of_logp(logp_of(z), *a, **k)  # noqa: E731
    ce = ref
    f = getattr(nn, loss)
    eps = {} if loss != "crossentropy" else {"eps": 0.0}
    cases = [
        Case(loss, "indices", lambda r: lambda z, y: f(z, y, reduction=r, **eps),
             lambda r: lambda z, y: ref(z, y, reduction=r), (scores, LABELS), (0,)),
        Case(loss, "weight", lambda r: lambda z, y, w: f(z, y, weight=w, reduction=r, **eps),
             lambda r: lambda z, y, w: ref(z, y, weight=w, reduction=r),
             (scores, LABELS, WEIGHT), (0,)),
        Case(loss, "ignore_index", lambda r: lambda z, y: f(z, y, ignore_index=-100,
                                                            reduction=r, **eps),
             lambda r: lambda z, y: ref(z, y, ignore_index=-100, reduction=r),
             (scores, IGNORED), (0,)),
        Case(loss, "ignore_index+weight",
             lambda r: lambda z, y, w: f(z, y, weight=w, ignore_index=-100, reduction=r, **eps),
             lambda r: lambda z, y, w: ref(z, y, weight=w, ignore_index=-100, reduction=r),
             (scores, IGNORED, WEIGHT), (0,)),
        Case(loss, "targets shaped like the scores",
             lambda r: lambda z, y: f(z, y, reduction=r, **eps),
             lambda r: lambda z, y: ce(z, y, reduction=r), (scores, SOFT), (0,)),
    ]  # fmt: skip
    if smoothing:  # finite scores: smoothing puts mass on every class, so -inf gives inf
        finite = Z if lce else PROBS
        cases += [
            Case(loss, "label_smoothing+weight+ignore_index",
                 lambda r: lambda z, y, w: f(z, y, weight=w, ignore_index=-100,
                                             label_smoothing=0.2, reduction=r, **eps),
                 lambda r: lambda z, y, w: ce(z, y, weight=w, ignore_index=-100,
                                              label_smoothing=0.2, reduction=r),
                 (finite, IGNORED, WEIGHT), (0,)),
            Case(loss, "label_smoothing with targets and weight",
                 lambda r: lambda z, y, w: f(z, y, weight=w, label_smoothing=0.3, reduction=r,
                                             **eps),
                 lambda r: lambda z, y, w: ce(z, y, weight=w, label_smoothing=0.3, reduction=r),
                 (finite, SOFT, WEIGHT), (0,)),
        ]  # fmt: skip
    if lce:
        cases.append(
            Case(loss, "3-d, classes last (PyTorch: axis 1)",
                 lambda r: lambda z, y: f(z, y, ignore_index=-100, reduction=r),
                 lambda r: lambda z, y: F.cross_entropy(to_axis1(z), y, ignore_index=-100,
                                                        reduction=r), (Z3, LABELS3), (0,))
        )  # fmt: skip
    cases.append(  # sum and none only: the mean of nothing is ours to decide (see below)
        Case(loss, "every target ignored",
             lambda r: lambda z, y: f(z, y, ignore_index=-100, reduction=r, **eps),
             lambda r: lambda z, y: ref(z, y, ignore_index=-100, reduction=r),
             (scores, ALL_IGNORED), (0,))
    )  # fmt: skip
    return cases


def elementwise(loss, torch_loss, inputs, **options):
    f = getattr(nn, loss)
    return Case(loss, repr(options) if options else "plain",
                lambda r: lambda a, b: f(a, b, reduction=r, **options),
                lambda r: lambda a, b: torch_loss(a, b, reduction=r, **options),
                inputs, (0, 1))  # fmt: skip


def binary_cases():
    lbce = nn.logitbinarycrossentropy
    return [
        Case("binarycrossentropy", "plain",
             lambda r: lambda p, y: nn.binarycrossentropy(p, y, eps=0.0, reduction=r),
             lambda r: lambda p, y: F.binary_cross_entropy(p, y, reduction=r), (P, T01), (0, 1)),
        Case("binarycrossentropy", "weight",
             lambda r: lambda p, y, w: nn.binarycrossentropy(p, y, eps=0.0, weight=w,
                                                             reduction=r),
             lambda r: lambda p, y, w: F.binary_cross_entropy(p, y, weight=w, reduction=r),
             (P, T01, WEIGHT), (0, 1)),
        Case("logitbinarycrossentropy", "plain",
             lambda r: lambda x, y: lbce(x, y, reduction=r),
             lambda r: lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=r),
             (X, T01), (0, 1)),
        Case("logitbinarycrossentropy", "weight+pos_weight",
             lambda r: lambda x, y, w, pw: lbce(x, y, weight=w, pos_weight=pw, reduction=r),
             lambda r: lambda x, y, w, pw: F.binary_cross_entropy_with_logits(
                 x, y, weight=w, pos_weight=pw, reduction=r),
             (X, T01, WEIGHT[::-1].copy(), 1 + WEIGHT), (0, 1)),
    ]  # fmt: skip


def kl_cases():
    kl = nn.kldivergence
    return [
        Case("kldivergence", "probabilities (Flux's)",
             lambda r: lambda q, p: kl(q, p, eps=0.0, reduction=r),
             lambda r: lambda q, p: kl_reduction(r, F.kl_div(q.log(), p, reduction="none")),
             (Q2, P2), (0, 1)),
        Case("kldivergence", "a target with zeros (its gradient there: inf)",
             lambda r: lambda q, p: kl(q, p, eps=0.0, reduction=r),
             lambda r: lambda q, p: kl_reduction(r, F.kl_div(q.log(), p, reduction="none")),
             (Q2, SOFT), (0,)),
        Case("kldivergence", "log_input (PyTorch's input)",
             lambda r: lambda lq, p: kl(lq, p, log_input=True, reduction=r),
             lambda r: lambda lq, p: kl_reduction(r, F.kl_div(lq, p, reduction="none")),
             (np.log(Q2), P2), (0, 1)),
        Case("kldivergence", "log_input, log_target",
             lambda r: lambda lq, lp: kl(lq, lp, log_input=True, log_target=True, reduction=r),
             lambda r: lambda lq, lp: kl_reduction(r, F.kl_div(lq, lp, reduction="none",
                                                               log_target=True)),
             (np.log(Q2), np.log(P2)), (0, 1)),
    ]  # fmt: skip


with np.errstate(divide="ignore"):
    LOGP_INF = np.log(np.where(ZINF == -np.inf, 0.0, PROBS))  # log-probabilities, some -inf


def logsoftmax_torch(z):
    return torch.log_softmax(z, dim=-1)


CASES = [
    *class_cases("logitcrossentropy", ZINF, logsoftmax_torch),
    *class_cases("crossentropy", PROBS, torch.log),
    *class_cases("nll", LOGP_INF, lambda z: z),
    elementwise("mse", F.mse_loss, (X, Y)),
    elementwise("mae", F.l1_loss, (X, Y)),
    elementwise("huber_loss", F.huber_loss, (X, Y)),
    elementwise("huber_loss", F.huber_loss, (X, Y), delta=0.7),
    elementwise("smoothl1", F.smooth_l1_loss, (X, Y)),
    elementwise("smoothl1", F.smooth_l1_loss, (X, Y), beta=0.6),
    elementwise("smoothl1", F.smooth_l1_loss, (X, Y), beta=0.0),
    *binary_cases(),
    *kl_cases(),
]
REDUCTIONS = ("none", "mean", "sum")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("labels", [IGNORED, SOFT], ids=["indices", "targets"])
def test_the_reference_is_pytorchs_cross_entropy(labels, reduction):
    options = dict(weight=t(WEIGHT), label_smoothing=0.2, reduction=reduction)
    options |= dict(ignore_index=-100) if labels is IGNORED else {}
    z1, z2 = t(Z).requires_grad_(True), t(Z).requires_grad_(True)
    a = F.cross_entropy(z1, t(labels), **options)
    b = cross_entropy_of_logp(torch.log_softmax(z2, -1), t(labels), **options)
    a.sum().backward(), b.sum().backward()
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(z1.grad.numpy(), z2.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_every_exported_loss_is_checked_here():
    assert set(nn.LOSSES) <= set(nn.__all__)
    assert {case.loss for case in CASES} == set(nn.LOSSES)
    assert nn.REDUCTIONS == REDUCTIONS


def ours_and_theirs(case, reduction):
    """(value, gradients) of `sum(v * loss)` (v fixed, random) by us and by PyTorch."""
    f, g = case.ours(reduction), case.theirs(reduction)
    tensors = [t(a) for a in case.inputs]
    for i in case.wrt:
        tensors[i].requires_grad_(True)
    expected = g(*tensors)
    v = RNG.uniform(0.5, 1.5, tuple(expected.shape))
    (expected * t(v)).sum().backward()

    def weighted(*wrt):
        args = list(case.inputs)
        for i, a in zip(case.wrt, wrt):
            args[i] = a
        return tg.sum(f(*args) * v)

    got = f(*case.inputs)
    grads = tg.gradient(weighted, *(case.inputs[i] for i in case.wrt))
    theirs = [tensors[i].grad.numpy() for i in case.wrt]
    return (np.asarray(tg.data(got)), grads), (expected.detach().numpy(), theirs)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.loss}-{c.name}")
def test_value_and_gradient_are_pytorchs(case, reduction):
    (value, grads), (expected, theirs) = ours_and_theirs(case, reduction)
    if case.name == "every target ignored" and reduction == "mean":  # ours, on purpose
        assert np.isnan(expected) and value == 0.0 and not any(np.any(g) for g in grads)
        return
    assert value.shape == expected.shape
    np.testing.assert_allclose(value, expected, rtol=1e-12, atol=1e-13)
    for g, e in zip(grads, theirs):
        np.testing.assert_allclose(np.zeros_like(e) if g is None else g, e, rtol=1e-10,
                                   atol=1e-13)  # fmt: skip


@pytest.mark.parametrize("loss", ["logitcrossentropy", "crossentropy", "nll"])
@pytest.mark.parametrize("weight", [None, WEIGHT])
def test_an_all_ignored_batch_has_mean_0(loss, weight):
    """PyTorch's mean divides 0 by 0 (nan): a batch of padding would poison the weights."""
    scores = ZINF if loss != "crossentropy" else PROBS
    f = lambda z: getattr(nn, loss)(z, ALL_IGNORED, ignore_index=-100, weight=weight)  # noqa: E731
    w = None if weight is None else t(weight)
    assert torch.isnan(F.cross_entropy(t(Z), t(ALL_IGNORED), weight=w, ignore_index=-100))
    val, (g,) = tg.withgradient(f, scores)
    assert float(val) == 0.0 and not np.any(g)


# --- finite differences, float64: the new options, and the weights PyTorch leaves alone
def class_option_functions():
    lce, ce, nll = nn.logitcrossentropy, nn.crossentropy, nn.nll
    common = dict(ignore_index=-100)
    return {
        "logit, weight+ignore+smoothing": (
            lambda z, w, r: lce(z, IGNORED, weight=w, label_smoothing=0.2, reduction=r, **common),
            Z),
        "logit, -inf, weight+ignore": (
            lambda z, w, r: lce(z, IGNORED, weight=w, reduction=r, **common), ZINF),
        "probabilities, weight+ignore+smoothing": (
            lambda p, w, r: ce(p, IGNORED, weight=w, label_smoothing=0.1, reduction=r,
                               eps=0.0, **common), PROBS),
        "nll, weight+ignore": (
            lambda lp, w, r: nll(lp, IGNORED, weight=w, reduction=r, **common), np.log(PROBS)),
    }  # fmt: skip


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", sorted(class_option_functions()))
def test_class_options_match_finite_differences(name, reduction):
    f, scores = class_option_functions()[name]
    if np.isinf(scores).any():  # finite differences of the finite logits only
        finite = np.isfinite(scores)
        g = lambda z, w: f(tg.where(finite, z, -np.inf), w, reduction)  # noqa: E731
        scores = np.where(finite, scores, 0.0)
    else:
        g = lambda z, w: f(z, w, reduction)  # noqa: E731
    assert tg.testing.gradcheck(g, scores, WEIGHT, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("loss", ["logitcrossentropy", "crossentropy", "nll"])
def test_targets_shaped_like_the_scores_match_finite_differences(loss, reduction):
    """Scores, targets and class weights all differentiated, with label smoothing."""
    f = getattr(nn, loss)
    smoothing = {} if loss == "nll" else {"label_smoothing": 0.3}
    scores = {"logitcrossentropy": Z, "crossentropy": PROBS, "nll": np.log(PROBS)}[loss]
    g = lambda z, y, w: f(z, y, weight=w, reduction=reduction, **smoothing)  # noqa: E731
    assert tg.testing.gradcheck(g, scores, SOFT, WEIGHT, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_elementwise_options_match_finite_differences(reduction):
    options = [
        lambda a, b: nn.huber_loss(a, b, delta=0.7, reduction=reduction),
        lambda a, b: nn.smoothl1(a, b, beta=0.6, reduction=reduction),
        lambda a, b: nn.mae(a, b, reduction=reduction),
        lambda a, b: nn.kldivergence(a, b, log_input=True, log_target=True, reduction=reduction),
    ]
    for f in options:
        assert tg.testing.gradcheck(f, X, Y, rtol=1e-6, atol=1e-8)
    lbce = lambda x, y, w, pw: nn.logitbinarycrossentropy(  # noqa: E731
        x, y, weight=w, pos_weight=pw, reduction=reduction
    )
    assert tg.testing.gradcheck(lbce, X, T01, WEIGHT, 1 + WEIGHT, rtol=1e-6, atol=1e-8)
    bce = lambda p, y, w: nn.binarycrossentropy(p, y, weight=w, reduction=reduction)  # noqa: E731
    assert tg.testing.gradcheck(bce, P, T01, WEIGHT, rtol=1e-6, atol=1e-8)


# --- on the backend under test: the options build their targets in its library
def test_options_on_the_backend(backend):
    z, w = backend.asarray(ZINF), backend.asarray(WEIGHT)
    labels = backend.asarray(IGNORED)

    def f(z, w):
        return nn.logitcrossentropy(z, labels, weight=w, ignore_index=-100, reduction="none")

    expected = F.cross_entropy(t(ZINF), t(IGNORED), weight=t(WEIGHT), ignore_index=-100,
                               reduction="none")  # fmt: skip
    np.testing.assert_allclose(numpy_of(backend, f(z, w)), expected.numpy(), rtol=1e-12)
    finite = backend.asarray(Z)
    check(backend, lambda z, w: nn.logitcrossentropy(z, labels, weight=w, ignore_index=-100,
                                                     label_smoothing=0.1), finite, w)  # fmt: skip


# --- bad options
FIRST = {}
for _case in CASES:
    FIRST.setdefault(_case.loss, _case)


@pytest.mark.parametrize("loss", sorted(FIRST))
def test_an_unknown_reduction_is_refused(loss):
    case = FIRST[loss]
    with pytest.raises(ValueError, match='reduction must be "none", "mean" or "sum"'):
        case.ours("batchmean")(*case.inputs)
    with pytest.raises(ValueError, match="not both"):
        getattr(nn, loss)(*case.inputs[:2], reduction="sum", agg="sum")


@pytest.mark.parametrize("smoothing", [-0.1, 1.5, "0.1"])
def test_label_smoothing_outside_0_1_is_refused(smoothing):
    with pytest.raises(ValueError, match=r"label_smoothing must be a number in \[0, 1\]"):
        nn.logitcrossentropy(Z, LABELS, label_smoothing=smoothing)


@pytest.mark.parametrize("loss", ["logitcrossentropy", "crossentropy", "nll"])
def test_a_weight_of_the_wrong_length_is_refused(loss):
    with pytest.raises(ValueError, match=r"one value per class, shape \(4,\)"):
        getattr(nn, loss)(PROBS, LABELS, weight=np.ones(3))


def test_other_bad_options_are_refused():
    with pytest.raises(ValueError, match="ignore_index applies to class indices"):
        nn.logitcrossentropy(Z, SOFT, ignore_index=-100)
    with pytest.raises(TypeError, match="ignore_index must be an integer"):
        nn.logitcrossentropy(Z, LABELS, ignore_index=0.5)
    with pytest.raises(ValueError, match="pos_weight of shape"):
        nn.logitbinarycrossentropy(X, T01, pos_weight=np.ones(3))
    with pytest.raises(ValueError, match="delta must be a positive number"):
        nn.huber_loss(X, Y, delta=0.0)
    with pytest.raises(ValueError, match="beta must be a number >= 0"):
        nn.smoothl1(X, Y, beta=-1.0)
    with pytest.raises(ValueError, match=r"class labels must lie in \[0, 3\]"):
        nn.logitcrossentropy(Z, IGNORED, ignore_index=-1)  # -100 is not ignored: out of range


@pytest.mark.parametrize("loss", sorted(FIRST))
def test_fluxs_agg_still_works(loss):
    """`agg` (Flux's keyword, today's) is `reduction` by another name, or a function of the
    unreduced loss."""
    case = FIRST[loss]
    f = getattr(nn, loss)
    extra = {"eps": 0.0} if loss in ("crossentropy", "binarycrossentropy", "kldivergence") else {}
    unreduced = np.asarray(f(*case.inputs[:2], reduction="none", **extra))
    for agg, expected in (("sum", unreduced.sum()), (np.max, unreduced.max())):
        got = f(*case.inputs[:2], agg=agg, **extra)
        np.testing.assert_allclose(float(got), expected, rtol=1e-13)
    assert float(f(*case.inputs[:2], **extra)) == float(f(*case.inputs[:2], agg="mean", **extra))


# --- probabilities of exactly 0 and 1 that the targets rule out: 0 * log(0) is 0
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_a_zero_probability_a_target_rules_out_adds_nothing(reduction):
    """crossentropy(p, y, eps=0.0) was nan where a class other than the target had
    probability 0 (0 * -inf), and binarycrossentropy where p = y = 0 or 1. PyTorch's nll_loss
    and binary_cross_entropy give the values; the gradient of such a term is 0 (PyTorch's
    nll_loss gives nan there), the others' are by hand."""
    p, labels = np.array([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]), np.array([1, 0])
    q, y = np.array([0.0, 1.0, 0.3]), np.array([0.0, 1.0, 0.0])
    f = {"ce": lambda p: nn.crossentropy(p, labels, eps=0.0, reduction=reduction),
         "bce": lambda q: nn.binarycrossentropy(q, y, eps=0.0, reduction=reduction)}  # fmt: skip
    expected = {
        "ce": torch.nn.functional.nll_loss(torch.log(torch.tensor(p)), torch.tensor(labels),
                                           reduction=reduction),
        "bce": torch.nn.functional.binary_cross_entropy(torch.tensor(q), torch.tensor(y),
                                                        reduction=reduction),
    }  # fmt: skip
    by_hand = {
        "ce": np.array([[0, -1 / 0.5, 0], [-1 / 0.2, 0, 0]]),  # -t / p, 0 where t is 0
        "bce": np.array([1.0, -1.0, 1 / 0.7]),
    }  # -(y / q - (1 - y) / (1 - q)), likewise
    for name, x in (("ce", p), ("bce", q)):
        value, (g,) = tg.withgradient(lambda x, name=name: tg.sum(f[name](x)), x)
        np.testing.assert_allclose(f[name](x), expected[name].numpy(), rtol=1e-15)
        n = {"mean": len(by_hand[name]), "sum": 1, "none": 1}[reduction]
        np.testing.assert_allclose(g, by_hand[name] / n, rtol=1e-15, err_msg=name)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.loss}-{c.name}")
def test_a_half_precision_batch_of_thousands_is_reduced_in_float32(case, reduction, half):
    """NumPy's bfloat16 sum adds in bfloat16 (it stops at 256): the mean of 4,200 samples'
    losses was 16 times too small, nll's count of labels too. Summed in float32 and rounded
    once, as PyTorch sums half precision: the loss of the same inputs in float64, to within
    the half dtype's precision."""
    import ml_dtypes

    if half == "bfloat16" and case.loss == "kldivergence":
        pytest.skip("SciPy's xlogy takes no bfloat16")
    dtype = ml_dtypes.bfloat16 if half == "bfloat16" else np.float16
    tiled = [np.concatenate([a] * 700) if a.shape[:1] == (N,) else a for a in case.inputs]
    wide = case.ours(reduction)(*tiled)
    narrow = case.ours(reduction)(*(a.astype(dtype) if a.dtype.kind == "f" else a for a in tiled))
    got, expected = np.asarray(tg.data(narrow)), np.asarray(tg.data(wide))
    # NumPy's bfloat16 (ml_dtypes) mixed with a Python float is float32, as the README says
    assert got.dtype == dtype or (half == "bfloat16" and got.dtype == np.float32)
    tolerance = 2e-2 if half == "bfloat16" else 4e-3
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tolerance, atol=tolerance)
