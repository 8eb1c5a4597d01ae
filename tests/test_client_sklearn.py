"""scikit-learn's Array API dispatch on tracked arrays: each estimator or function (fitted
inside the function differentiated) gives the value it gives on NumPy arrays, as an array of the
tracked namespace, and a gradient that agrees with finite differences and with PyTorch (the same
call on tensors) where PyTorch's autograd can take scikit-learn's code.

Dispatch needs SciPy's Array API support, which SciPy reads when it is first imported: the
module skips where SciPy was imported earlier without it (tests/clients.py)."""

import numpy as np
import pytest

import tracker_gpu as tg
from tests.clients import check_like_torch, check_value, ns, require_scipy_array_api
from tracker_gpu.testing import gradcheck

require_scipy_array_api()  # before scikit-learn imports SciPy
sklearn = pytest.importorskip("sklearn")
decomposition = pytest.importorskip("sklearn.decomposition")
discriminant = pytest.importorskip("sklearn.discriminant_analysis")
linear_model = pytest.importorskip("sklearn.linear_model")
metrics = pytest.importorskip("sklearn.metrics")
mixture = pytest.importorskip("sklearn.mixture")
pairwise = pytest.importorskip("sklearn.metrics.pairwise")
preprocessing = pytest.importorskip("sklearn.preprocessing")

pytestmark = pytest.mark.filterwarnings("ignore:torch.asarray:UserWarning")

RNG = np.random.default_rng(0)
X = RNG.standard_normal((12, 3))
Z = RNG.standard_normal((5, 3))
LABELS = np.arange(12) % 3
TARGET = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * RNG.standard_normal(12)
TARGETS = np.stack([TARGET, RNG.standard_normal(12)], axis=1)


@pytest.fixture(autouse=True)
def dispatch():
    with sklearn.config_context(array_api_dispatch=True):
        yield


def pca(a, **options):
    return decomposition.PCA(n_components=2, **options).fit(a)


def reconstruction_error(a):
    fitted = pca(a, svd_solver="full")
    xp = ns(a)
    return xp.sum((a - fitted.inverse_transform(fitted.transform(a))) ** 2)


def lda(a):
    return discriminant.LinearDiscriminantAnalysis().fit(a, ns(a).asarray(LABELS))


def gaussian_mixture(a):
    """Its full covariances are regularised through a slice, `covariances[k, :, :]`, written
    in place: a write that a tracked slice, a copy, once kept to itself."""
    return mixture.GaussianMixture(
        2, covariance_type="full", init_params="random", random_state=0, reg_covar=0.5, max_iter=3
    ).fit(a)


def ridge(a, t):
    return linear_model.Ridge(alpha=0.5, solver="svd").fit(a, t)


# name: (function, its float64 arguments, whether PyTorch's autograd can take scikit-learn's code)
NO_TORCH = "PyTorch refuses: scikit-learn writes in place into a tensor its backward pass saved"
CASES = {
    "PCA-reconstruction-error": (reconstruction_error, (X,), NO_TORCH),
    "PCA-full": (lambda a: pca(a, svd_solver="full").transform(a), (X,), NO_TORCH),
    "PCA-fit_transform": (lambda a: pca(a, svd_solver="full").fit_transform(a), (X,), NO_TORCH),
    "PCA-other-data": (lambda a, b: pca(a, svd_solver="full").transform(b), (X, Z), NO_TORCH),
    "PCA-whiten": (lambda a: pca(a, whiten=True, svd_solver="full").transform(a), (X,), NO_TORCH),
    "PCA-covariance_eigh": (
        lambda a: pca(a, svd_solver="covariance_eigh").transform(a),
        (X,),
        True,
    ),
    "PCA-randomized": (
        lambda a: pca(
            a, svd_solver="randomized", power_iteration_normalizer="QR", random_state=0
        ).transform(a),
        (X,),
        NO_TORCH,
    ),
    "PCA-get_covariance": (lambda a: pca(a, svd_solver="full").get_covariance(), (X,), NO_TORCH),
    "GaussianMixture-full-covariances": (
        lambda a: gaussian_mixture(a).covariances_,
        (X,),
        NO_TORCH,
    ),
    "GaussianMixture-full-means": (lambda a: gaussian_mixture(a).means_, (X,), NO_TORCH),
    "StandardScaler-mean": (
        lambda a, b: preprocessing.StandardScaler(with_std=False).fit(a).transform(b),
        (X, Z),
        True,
    ),
    "MinMaxScaler": (lambda a: preprocessing.MinMaxScaler().fit_transform(a), (X,), True),
    "MinMaxScaler-range": (
        lambda a, b: preprocessing.MinMaxScaler(feature_range=(-1, 2)).fit(a).transform(b),
        (X, Z),
        True,
    ),
    "MaxAbsScaler": (lambda a: preprocessing.MaxAbsScaler().fit_transform(a), (X,), True),
    "Normalizer": (lambda a: preprocessing.Normalizer().fit_transform(a), (X,), NO_TORCH),
    "LDA-predict_proba": (lambda a: lda(a).predict_proba(a), (X,), NO_TORCH),
    "LDA-transform": (lambda a: lda(a).transform(a), (X,), NO_TORCH),
    "LDA-decision_function": (lambda a, b: lda(a).decision_function(b), (X, Z), NO_TORCH),
    "Ridge-predict": (lambda a, t: ridge(a, t).predict(a), (X, TARGET), True),
    "Ridge-predict-other": (lambda a, t, b: ridge(a, t).predict(b), (X, TARGET, Z), True),
    "Ridge-coef": (lambda a, t: ridge(a, t).coef_, (X, TARGET), True),
    "Ridge-two-targets": (lambda a, t: ridge(a, t).predict(a), (X, TARGETS), True),
    "pairwise_distances": (lambda a, b: metrics.pairwise_distances(a, b), (X, Z), True),
    "pairwise_distances-manhattan": (
        lambda a, b: metrics.pairwise_distances(a, b, metric="manhattan"),
        (X, Z),
        True,
    ),
    "pairwise_distances-cosine": (
        lambda a, b: metrics.pairwise_distances(a, b, metric="cosine"),
        (X, Z),
        NO_TORCH,
    ),
    "euclidean_distances": (lambda a, b: pairwise.euclidean_distances(a, b), (X, Z), True),
    "euclidean_distances-squared": (
        lambda a, b: pairwise.euclidean_distances(a, b, squared=True),
        (X, Z),
        True,
    ),
    "rbf_kernel": (lambda a, b: pairwise.rbf_kernel(a, b, gamma=0.3), (X, Z), True),
    "rbf_kernel-self": (lambda a: pairwise.rbf_kernel(a), (X,), True),
    "linear_kernel": (lambda a, b: pairwise.linear_kernel(a, b), (X, Z), True),
    "polynomial_kernel": (lambda a, b: pairwise.polynomial_kernel(a, b, degree=2), (X, Z), True),
    "cosine_similarity": (lambda a, b: pairwise.cosine_similarity(a, b), (X, Z), NO_TORCH),
    "r2_score-raw_values": (
        lambda t, p: metrics.r2_score(t, p, multioutput="raw_values"),
        (TARGETS, TARGETS[::-1].copy()),
        True,
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_value(name):
    f, xs, _ = CASES[name]
    assert tg.istracked(check_value(f, xs, rtol=1e-9))


@pytest.mark.parametrize("name", CASES)
def test_gradient(name):
    f, xs, _ = CASES[name]
    assert gradcheck(f, *(x.copy() for x in xs))


@pytest.mark.parametrize("name", CASES)
def test_gradient_like_torch(name):
    check_like_torch(*CASES[name], rtol=1e-8)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("transform", ["transform", "inverse_transform"])
def test_standard_scaler_value(transform):
    # Its gradient is NaN in any reverse-mode AD (PyTorch too): scikit-learn's variance update
    # computes 0/0 for the samples seen before (none) and then overwrites that NaN.
    def f(a):
        scaler = preprocessing.StandardScaler().fit(a)
        return getattr(scaler, transform)(a)

    check_value(f, (X,), rtol=1e-9)


def test_r2_score_scalar_value():
    # scikit-learn returns a Python float here: the value, with no gradient.
    got = metrics.r2_score(tg.param(TARGET), tg.param(X[:, 0]))
    assert got == pytest.approx(metrics.r2_score(TARGET, X[:, 0]), rel=1e-12)


def test_fit_through_numpy_gives_no_wrong_gradient():
    # LogisticRegression fits with scipy.optimize on a NumPy copy of X, made through DLPack: no
    # gradient can flow through that fit. The conversion must be refused (as np.asarray of an
    # array on the tape is, and as PyTorch refuses to export a tensor that requires grad), not
    # give a gradient that silently lacks the fit's part.
    def f(a):
        model = linear_model.LogisticRegression().fit(a, ns(a).asarray(LABELS))
        return model.predict_proba(a)

    try:
        gradcheck(f, X.copy())
    except (TypeError, BufferError):
        pass  # refused: the right answer where the gradient cannot be had
