"""SciPy's Array API support on tracked arrays: each function gives the value it gives on NumPy
arrays, as an array of the tracked namespace, and a gradient that agrees with finite differences
and with PyTorch (the same call on tensors).

SciPy reads SCIPY_ARRAY_API when it is first imported: the module skips where SciPy was
imported earlier without it (tests/clients.py)."""

import numpy as np
import pytest

import tracker_gpu as tg
from tests.clients import (
    check_like_torch,
    check_value,
    ns,
    require_scipy_array_api,
)
from tracker_gpu.testing import gradcheck

require_scipy_array_api()
special = pytest.importorskip("scipy.special")
stats = pytest.importorskip("scipy.stats")
fft = pytest.importorskip("scipy.fft")
signal = pytest.importorskip("scipy.signal")
integrate = pytest.importorskip("scipy.integrate")

pytestmark = pytest.mark.filterwarnings("ignore:torch.asarray:UserWarning")

RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 4))
B = RNG.standard_normal((2, 3))
V = RNG.standard_normal(5)
K = RNG.standard_normal(3)
POSITIVE = RNG.uniform(0.5, 1.5, size=4)
P = RNG.uniform(0.5, 2.0, size=(3, 4))
Q = RNG.uniform(0.5, 2.0, size=(3, 4))


# name: (function, its float64 arguments, whether PyTorch's autograd can take SciPy's code)
NO_TORCH = "PyTorch refuses: SciPy writes in place into a tensor its backward pass saved"
CASES = {
    "logsumexp": (lambda a: special.logsumexp(a), (A,), True),
    "logsumexp-axis": (lambda a: special.logsumexp(a, axis=1), (A,), True),
    "logsumexp-keepdims": (lambda a: special.logsumexp(a, axis=-1, keepdims=True), (A,), True),
    "logsumexp-b": (lambda a, b: special.logsumexp(a, axis=0, b=b), (A, POSITIVE), NO_TORCH),
    "softmax": (lambda a: special.softmax(a, axis=1), (A,), True),
    "softmax-all": (lambda a: special.softmax(a), (A,), True),
    "log_softmax": (lambda a: special.log_softmax(a, axis=0), (A,), NO_TORCH),
    "zscore": (lambda a: stats.zscore(a, axis=0), (A,), True),
    "zscore-ddof": (lambda a: stats.zscore(a, axis=1, ddof=1), (A,), True),
    "zscore-all": (lambda a: stats.zscore(a, axis=None), (A,), True),
    "zmap": (lambda a, b: stats.zmap(a, b), (A[:, :3], B), True),
    "moment-1": (lambda a: stats.moment(a, order=1), (A,), "zero: no gradient to compare"),
    "moment-2": (lambda a: stats.moment(a, order=2, axis=0), (A,), True),
    "moment-3": (lambda a: stats.moment(a, order=3, axis=1), (A,), True),
    "moment-orders": (lambda a: stats.moment(a, order=[2, 4], axis=0), (A,), True),
    "moment-center": (lambda a: stats.moment(a, order=2, center=0.5), (V,), True),
    "fft": (lambda a: fft.fft(a), (A,), True),
    "fft-n-ortho": (lambda a: fft.fft(a, n=6, axis=0, norm="ortho"), (A,), True),
    "ifft": (lambda a: fft.ifft(a), (A,), True),
    "rfft": (lambda a: fft.rfft(a, axis=0), (A,), True),
    "irfft": (lambda a: fft.irfft(a), (A,), True),
    "hfft": (lambda a: fft.hfft(a), (A,), True),
    "fft2": (lambda a: fft.fft2(a), (A,), True),
    "fftn": (lambda a: fft.fftn(a), (A,), True),
    "rfftn": (lambda a: fft.rfftn(a), (A,), True),
    "irfftn": (lambda a: fft.irfftn(a, s=(3, 6)), (A,), True),
    "fftshift": (lambda a: fft.fftshift(a), (A,), True),
    "fftconvolve": (lambda a, b: signal.fftconvolve(a, b), (A, B), True),
    "fftconvolve-same": (lambda a, b: signal.fftconvolve(a, b, mode="same"), (A, B), True),
    "fftconvolve-valid": (lambda a, b: signal.fftconvolve(a, b, mode="valid"), (A, B), True),
    "fftconvolve-axes": (lambda a, b: signal.fftconvolve(a, b[:1], axes=1), (A, B), True),
    "fftconvolve-1d": (lambda a, b: signal.fftconvolve(a, b), (V, K), True),
    "oaconvolve": (lambda a, b: signal.oaconvolve(a, b), (V, K), True),
    # more of SciPy's Array API support
    "logsumexp-complex": (lambda a, b: special.logsumexp(a + 1j * b), (A, P), True),
    "logsumexp-sign": (
        lambda a: special.logsumexp(a, b=-a, return_sign=True)[0],
        (P,),
        NO_TORCH,
    ),
    "xlogy": (lambda a, b: special.xlogy(a, b), (A, P), True),
    "rel_entr": (lambda a, b: special.rel_entr(a, b), (P, Q), True),
    "entropy": (lambda a, b: stats.entropy(a, b, axis=0), (P, Q), True),
    "gmean": (lambda a: stats.gmean(a, axis=0), (P,), True),
    "hmean": (lambda a: stats.hmean(a, axis=1), (P,), True),
    "pmean": (lambda a: stats.pmean(a, 2.5, axis=0), (P,), True),
    "sem": (lambda a: stats.sem(a, axis=0), (A,), True),
    "skew": (lambda a: stats.skew(a, axis=1), (A,), True),
    "kurtosis": (lambda a: stats.kurtosis(a, axis=0), (A,), True),
    "variation": (lambda a: stats.variation(a, axis=0), (P,), True),
    "trim_mean": (lambda a: stats.trim_mean(a, 0.25, axis=0), (A,), True),
    "iqr": (lambda a: stats.iqr(a, axis=0), (A,), True),
    "quantile": (lambda a: stats.quantile(a, 0.3, axis=0), (A,), True),
    "circmean": (lambda a: stats.circmean(a, axis=0), (A,), True),
    "lmoment": (lambda a: stats.lmoment(a[0]), (A,), NO_TORCH),
    "hilbert": (lambda a: signal.hilbert(a), (V,), True),
    "get_window": (lambda a: a * signal.get_window("hann", 5, xp=ns(a)), (V,), True),
    "fht": (lambda a: fft.fht(a, 1.0, 0.0), (V,), True),
    "trapezoid": (lambda a: integrate.trapezoid(a, axis=0), (A,), True),
    "cumulative_trapezoid": (lambda a: integrate.cumulative_trapezoid(a, axis=1), (A,), True),
}


@pytest.mark.parametrize("name", CASES)
def test_value(name):
    f, xs, _ = CASES[name]
    check_value(f, xs, rtol=1e-10)


@pytest.mark.parametrize("name", CASES)
def test_gradient(name):
    f, xs, _ = CASES[name]
    assert gradcheck(f, *(x.copy() for x in xs))


@pytest.mark.parametrize("name", CASES)
def test_gradient_like_torch(name):
    check_like_torch(*CASES[name], rtol=1e-9)


@pytest.mark.parametrize("library", ["torch", "array_api_strict"])
@pytest.mark.parametrize("name", ["xlogy", "rel_entr", "entropy"])
def test_special_functions_on_a_library_without_them(library, name):
    """The tracked namespace of PyTorch or array-api-strict lists none of tg.special's
    functions that the library lacks, so SciPy takes its own generic way, as it does for the
    plain library (it raised NotImplementedError). Values against the plain call, gradients
    against PyTorch's autograd of it."""
    torch = pytest.importorskip("torch")
    lib = pytest.importorskip(library)
    f, xs, _ = CASES[name]
    plain = [lib.asarray(x) for x in xs]
    got = f(*(tg.param(a) for a in plain))
    np.testing.assert_allclose(tg.nn.to_numpy(got), tg.nn.to_numpy(f(*plain)), rtol=1e-12)
    grads = tg.gradient(lambda *a: tg.sum(f(*a)), *plain)
    tensors = [torch.tensor(x, requires_grad=True) for x in xs]
    torch.sum(f(*tensors)).backward()
    for g, t in zip(grads, tensors):
        np.testing.assert_allclose(tg.nn.to_numpy(g), t.grad.numpy(), rtol=1e-10)


def test_moment_1_is_a_constant():
    x = tg.param(A)
    got = stats.moment(x, order=1)
    assert not tg.istracked(got)
    assert ns(got) is ns(x)
