"""PyTorch's own OpInfo samples (the inputs PyTorch tests its operators with), run through every
operator that has a counterpart here, on PyTorch tensors: float64 values and gradients compared.

At most `SAMPLES` samples an operator, drawn in the order PyTorch yields them with a fixed seed.
A sample outside what the counterpart takes (a keyword with no equivalent) is not compared; a
sample where we follow NumPy and the standard, not PyTorch, is matched by `CONVENTIONS` (the
README's table) and is checked to be refused or to differ, so that the table stays true.
"""

import numpy as np
import pytest

import tracker_gpu as tg

torch = pytest.importorskip("torch", reason="PyTorch's OpInfo samples need PyTorch")
pytest.importorskip("expecttest", reason="PyTorch's OpInfo database imports expecttest")
common = pytest.importorskip("torch.testing._internal.common_methods_invocations")

SAMPLES = 8
S = tg.special


class Unmapped(Exception):
    """The sample uses an argument with no counterpart here."""


def _plain(f):
    """A counterpart taking the sample's input and no other argument."""

    def call(x, *args, **kw):
        if args or kw:
            raise Unmapped
        return f(x)

    return call


def _binary(f):
    def call(x, y, *args, **kw):
        if args or kw:
            raise Unmapped
        return f(x, y)

    return call


def _reduction(f, dim_name="dim"):
    def call(x, dim=None, keepdim=False, *args, **kw):
        dim = kw.pop(dim_name, dim)
        keepdim = kw.pop("keepdim", keepdim)
        if args or kw or (isinstance(dim, (list, tuple)) and not dim):
            raise Unmapped
        axis = tuple(dim) if isinstance(dim, (list, tuple)) else dim
        return f(x, axis=axis, keepdims=keepdim)

    return call


def _softmax(f):
    def call(x, dim, *args, dtype=None, **kw):
        if args or kw or dtype is not None:
            raise Unmapped
        return f(x, axis=dim)

    return call


def _clamp(x, lo=None, hi=None, **kw):
    if kw:
        raise Unmapped
    return tg.clip(x, lo, hi)


def _logit(x, eps=None, **kw):
    if eps is not None or kw:
        raise Unmapped
    return S.logit(x)


def _gelu(x, approximate="none", **kw):
    if kw:
        raise Unmapped
    return tg.nn.gelu(x, approximate=approximate)


def _constant_first(f):
    """A function differentiable in its second argument only (igamma, zeta)."""

    def call(x, y, *args, **kw):
        if args or kw:
            raise Unmapped
        return f(tg.stop_gradient(x) if tg.istracked(x) else x, y)

    return call


UNARY = (
    "abs acos acosh asin asinh atan atanh cos cosh exp expm1 log log10 log1p log2 sin sinh sqrt "
    "square tan tanh sigmoid reciprocal"
).split()
COUNTERPARTS = {name: _plain(getattr(tg, name)) for name in UNARY}
COUNTERPARTS.update(
    {
        "neg": _plain(tg.negative),
        "deg2rad": _plain(S.deg2rad),
        "rad2deg": _plain(S.rad2deg),
        "exp2": _plain(S.exp2),
        "erf": _plain(S.erf),
        "erfc": _plain(S.erfc),
        "erfinv": _plain(S.erfinv),
        "digamma": _plain(S.digamma),
        "lgamma": _plain(S.gammaln),
        "i0": _plain(S.i0),
        "sinc": _plain(S.sinc),
        "logit": _logit,
        "special.erfcx": _plain(S.erfcx),
        "special.i0e": _plain(S.i0e),
        "special.i1": _plain(S.i1),
        "special.i1e": _plain(S.i1e),
        "special.ndtr": _plain(S.ndtr),
        "special.ndtri": _plain(S.ndtri),
        "special.log_ndtr": _plain(S.log_ndtr),
        "special.entr": _plain(S.entr),
        "special.bessel_j0": _plain(S.j0),
        "special.bessel_j1": _plain(S.j1),
        "special.bessel_y0": _plain(S.y0),
        "special.bessel_y1": _plain(S.y1),
        "polygamma": lambda x, n: S.polygamma(n, x),
        "special.polygamma": lambda x, n: S.polygamma(n, x),
        "mvlgamma": lambda x, p: S.multigammaln(x, p),
        "xlogy": _binary(S.xlogy),
        "special.xlog1py": _binary(S.xlog1py),
        "igamma": _constant_first(S.gammainc),
        "igammac": _constant_first(S.gammaincc),
        "special.zeta": _constant_first(S.zeta),
        "add": _binary(tg.add),
        "sub": _binary(tg.subtract),
        "mul": _binary(tg.multiply),
        "div": _binary(tg.divide),
        "true_divide": _binary(tg.divide),
        "pow": _binary(tg.pow),
        "atan2": _binary(tg.atan2),
        "hypot": _binary(tg.hypot),
        "maximum": _binary(tg.maximum),
        "minimum": _binary(tg.minimum),
        "logaddexp": _binary(tg.logaddexp),
        "copysign": _binary(tg.copysign),
        "nextafter": _binary(tg.nextafter),
        "clamp": _clamp,
        "sum": _reduction(tg.sum),
        "prod": _reduction(tg.prod),
        "mean": _reduction(tg.mean),
        "amax": _reduction(tg.max),
        "amin": _reduction(tg.min),
        "logsumexp": _reduction(tg.logsumexp),
        "softmax": _softmax(tg.softmax),
        "log_softmax": _softmax(tg.logsoftmax),
        "nn.functional.gelu": _gelu,
        "nn.functional.relu": _plain(tg.relu),
    }
)


def _zero_d_axis(x, args, kw):
    dims = list(args[:1]) + [kw.get("dim")]
    return x.ndim == 0 and any(d is not None and d != [] and d != () for d in dims)


# Where we follow NumPy and the standard rather than PyTorch (the README's table), by sample.
CONVENTIONS = {
    "an axis of a 0-d array is refused (the standard's range is [-ndim, ndim))": _zero_d_axis,
}


def _ops():
    """Every OpInfo of an operator with a counterpart (its variants of order, for polygamma and
    mvlgamma; the one without a rounding mode, for div)."""
    return [op for op in common.op_db if op.name in COUNTERPARTS and (
        not op.variant_test_name or op.name in ORDERED or op.variant_test_name == "no_rounding_mode"
    )]  # fmt: skip


ORDERED = {"polygamma", "special.polygamma", "mvlgamma"}


def _samples(op):
    torch.manual_seed(0)
    samples = op.sample_inputs("cpu", torch.float64, requires_grad=True)
    out = []
    for sample in samples:
        out.append(sample)
        if len(out) == SAMPLES:
            break
    return out


# PyTorch differentiates these in their second argument only (as we do): the first is a constant.
CONSTANT_FIRST = {"igamma", "igammac", "special.zeta"}


def _tensors(op, items):
    return [i for i, a in enumerate(items) if isinstance(a, torch.Tensor) and a.requires_grad
            and not (i == 0 and op.name in CONSTANT_FIRST)]  # fmt: skip


def _compare(op, sample):
    """'agree', 'unmapped' or the name of the convention; raises where they disagree."""
    ours = COUNTERPARTS[op.name]
    items = [sample.input, *sample.args]
    if op.name in CONSTANT_FIRST:
        items[0] = items[0].detach()
    grad_at = _tensors(op, items)
    convention = next((c for c, hit in CONVENTIONS.items() if
                       hit(sample.input, sample.args, sample.kwargs)), None)  # fmt: skip
    expected = op(items[0], *items[1:], **sample.kwargs)
    if not isinstance(expected, torch.Tensor) or not expected.dtype.is_floating_point:
        return "unmapped"
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in items]

    def f(*tracked):
        values = list(plain)
        for i, t in zip(grad_at, tracked):
            values[i] = t
        return ours(values[0], *values[1:], **sample.kwargs)

    try:
        got = f(*[tg.param(plain[i]) for i in grad_at])
    except Unmapped:
        return "unmapped"
    except (ValueError, TypeError):
        if convention is None:
            raise
        return convention
    np.testing.assert_allclose(
        tg.data(got).detach().numpy(), expected.detach().numpy(), rtol=1e-7, atol=1e-10,
        equal_nan=True, err_msg=f"{op.name} value",
    )  # fmt: skip
    _compare_gradients(op, f, expected, items, grad_at, plain)
    return "agree"


def _compare_gradients(op, f, expected, items, grad_at, plain):
    if not grad_at or not expected.requires_grad:
        return
    w = torch.rand(expected.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    theirs = torch.autograd.grad((expected * w).sum(), [items[i] for i in grad_at],
                                 allow_unused=True)  # fmt: skip
    _, back = tg.forward(f, *[plain[i] for i in grad_at])  # a pullback: nan values allowed
    ours = back(w)
    for i, a, b in zip(grad_at, ours, theirs):
        a = np.zeros(items[i].shape) if a is None else tg.data(a).numpy()
        b = np.zeros(items[i].shape) if b is None else b.numpy()
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8, equal_nan=True,
                                   err_msg=f"{op.name} gradient {i}")  # fmt: skip


RESULTS = {}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("op", _ops(), ids=lambda op: f"{op.name}.{op.variant_test_name}")
def test_opinfo_samples_agree(op):
    outcomes = [_compare(op, sample) for sample in _samples(op)]
    RESULTS[f"{op.name}.{op.variant_test_name}"] = outcomes
    assert outcomes, f"no OpInfo sample for {op.name}"


def test_every_counterpart_has_samples():
    assert {op.name for op in _ops()} == set(COUNTERPARTS)
