"""The fft extension: every transform's value against the array library's own, its gradient
against finite differences (float64 and complex128 inputs) on every backend, its second
derivative (finite differences of the nested gradient), and its gradient against PyTorch's
autograd as an independent reference."""

import numpy as np
import pytest
from helpers import check_like, lazy_options, numpy_of

import tracker_gpu as tg
from tracker_gpu.rules.elementwise import is_complex
from tracker_gpu.testing import gradcheck

REAL_ONLY = {"rfft", "rfftn", "ihfft"}  # the transforms of real input

# (function, keywords, input shape): lengths below and above the input's (crop and pad), odd
# and even lengths of the real transforms, every norm, axes in any order
CASES = [
    ("fft", {}, (3, 5)),
    ("fft", {"n": 3}, (3, 5)),
    ("fft", {"n": 8, "axis": 0, "norm": "ortho"}, (3, 5)),
    ("fft", {"norm": "forward"}, (3, 4)),
    ("ifft", {}, (3, 4)),
    ("ifft", {"n": 2, "norm": "ortho"}, (3, 5)),
    ("ifft", {"n": 7, "axis": 0, "norm": "forward"}, (3, 5)),
    ("fftn", {}, (3, 4)),
    ("fftn", {"s": (2, 6), "axes": (0, 1), "norm": "ortho"}, (3, 4)),
    ("fftn", {"s": (4, 2), "axes": (1, 0), "norm": "forward"}, (3, 5)),
    ("ifftn", {}, (3, 4)),
    ("ifftn", {"axes": (0,), "norm": "ortho"}, (3, 4)),
    ("ifftn", {"s": (5, 2), "axes": (-1, -2)}, (3, 4)),
    ("rfft", {}, (3, 5)),
    ("rfft", {}, (3, 4)),
    ("rfft", {"n": 4, "norm": "ortho"}, (3, 5)),
    ("rfft", {"n": 7, "axis": 0, "norm": "forward"}, (3, 5)),
    ("irfft", {}, (3, 4)),
    ("irfft", {"n": 5}, (3, 4)),
    ("irfft", {"n": 9, "norm": "ortho"}, (3, 4)),
    ("irfft", {"n": 2, "axis": 0, "norm": "forward"}, (3, 4)),
    ("rfftn", {}, (3, 4)),
    ("rfftn", {"s": (4, 3), "axes": (0, 1), "norm": "ortho"}, (3, 5)),
    ("rfftn", {"axes": (1, 0), "norm": "forward"}, (3, 4)),
    ("irfftn", {}, (3, 4)),
    ("irfftn", {"s": (2, 5), "axes": (0, 1), "norm": "ortho"}, (3, 4)),
    ("irfftn", {"s": (4, 4), "axes": (1, 0), "norm": "forward"}, (3, 4)),
    ("hfft", {}, (3, 4)),
    ("hfft", {"n": 5, "norm": "ortho"}, (3, 4)),
    ("hfft", {"n": 3, "axis": 0, "norm": "forward"}, (3, 4)),
    ("ihfft", {}, (3, 5)),
    ("ihfft", {"n": 6, "norm": "forward"}, (3, 5)),
    ("ihfft", {"n": 2, "axis": 0, "norm": "ortho"}, (3, 5)),
    ("fftshift", {}, (3, 4)),
    ("fftshift", {"axes": 0}, (3, 4)),
    ("ifftshift", {}, (3, 5)),
    ("ifftshift", {"axes": (1,)}, (3, 5)),
]
DTYPES = ["float64", "complex128"]
TYPED = [
    pytest.param(name, kw, shape, dtype, id=f"{name}-{dtype}-{kw}")
    for name, kw, shape in CASES
    for dtype in DTYPES
    if not (name in REAL_ONLY and dtype == "complex128")
]


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    return x + 1j * rng.standard_normal(shape) if dtype == "complex128" else x


def host(backend, y):
    """`y` as NumPy; a PyTorch tensor may carry a lazy conjugation (`tg.conj` is `torch.conj`)."""
    y = tg.data(y)
    return backend.to_numpy(y.resolve_conj() if hasattr(y, "resolve_conj") else y)


def tracked_transform(name, kw):
    return lambda x: getattr(tg.fft, name)(x, **kw)


@pytest.mark.parametrize(("name", "kw", "shape", "dtype"), TYPED)
def test_value_is_the_library_value(backend, name, kw, shape, dtype):
    x = backend.asarray(sample(shape, dtype))
    y = getattr(tg.fft, name)(tg.param(x), **kw)
    if name not in REAL_ONLY | {"fftshift", "ifftshift"} and dtype == "float64":
        x = backend.xp.astype(x, backend.xp.complex128)  # the standard's take complex input
    expected = getattr(backend.xp.fft, name)(x, **kw)
    assert tg.data(y).dtype == expected.dtype
    assert np.allclose(host(backend, y), host(backend, expected), rtol=1e-12, atol=1e-12)
    numpy_value = getattr(np.fft, name)(sample(shape, dtype), **kw)
    assert np.allclose(host(backend, y), numpy_value, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("name", "kw", "shape", "dtype"), TYPED)
def test_gradient_matches_finite_differences(backend, name, kw, shape, dtype):
    x = backend.asarray(sample(shape, dtype))
    f = tracked_transform(name, kw)
    (g,) = tg.gradient(lambda x: real_loss(f(x)), x)
    check_like(backend, g, x)
    assert gradcheck(f, x, **lazy_options(backend, {}))


def real_loss(y):
    """A real loss, not linear in `y`, so that its second derivative is not zero; it reads the
    imaginary part of a complex `y` through a rotation (a complex constant array)."""
    if not is_complex(y):
        return tg.sum(y**3 * 0.3 + y**2)
    rotation = np.exp(1j * np.linspace(0.3, 2.5, y.shape[-1]))
    turned = tg.real(y * tg.asarray(rotation, device=y.device))
    return tg.sum(tg.real(y) ** 2 * 0.7) + tg.sum(turned**3 * 0.3 + turned)


SECOND_ORDER = [
    ("fft", {"n": 3}, "complex128"),
    ("ifft", {"n": 7, "norm": "ortho"}, "float64"),
    ("fftn", {"s": (2, 6), "axes": (1, 0), "norm": "forward"}, "complex128"),
    ("rfft", {"n": 4}, "float64"),
    ("rfft", {"n": 7, "norm": "ortho"}, "float64"),
    ("irfft", {"n": 5}, "complex128"),
    ("irfft", {"n": 8, "norm": "forward"}, "complex128"),
    ("rfftn", {"s": (4, 3)}, "float64"),
    ("irfftn", {"s": (2, 5), "norm": "ortho"}, "complex128"),
    ("hfft", {"n": 5}, "complex128"),
    ("ihfft", {"n": 6, "norm": "forward"}, "float64"),
    ("fftshift", {"axes": 1}, "complex128"),
]


@pytest.mark.parametrize(
    ("name", "kw", "dtype"), SECOND_ORDER, ids=[f"{n}-{kw}-{d}" for n, kw, d in SECOND_ORDER]
)
def test_second_derivative_matches_finite_differences(backend, name, kw, dtype):
    x = backend.asarray(sample((3, 4), dtype, seed=3))
    f = tracked_transform(name, kw)

    def first(x):
        return tg.gradient(lambda x: real_loss(f(x)), x, nest=True)[0]

    assert tg.istracked(first(x))
    assert gradcheck(first, x, **lazy_options(backend, {}))


@pytest.mark.parametrize(
    ("name", "kw"), [("fft", {"n": 6}), ("rfft", {}), ("irfft", {"n": 5}), ("ihfft", {})]
)
def test_float32_stays_float32(backend, name, kw):
    x64 = sample((3, 4), "float64", seed=4)
    x = backend.asarray(x64.astype(np.float32))
    f = tracked_transform(name, kw)
    y = f(tg.param(x))
    assert tg.data(y).dtype in (backend.xp.float32, backend.xp.complex64)
    (g,) = tg.gradient(lambda x: real_loss(f(x)), x)
    check_like(backend, g, x)
    (g64,) = tg.gradient(lambda x: real_loss(f(x)), backend.asarray(x64))
    assert np.allclose(numpy_of(backend, g), numpy_of(backend, g64), rtol=1e-4, atol=1e-4)


def test_compiled_step_equals_the_eager_one():
    def loss(x):
        spectrum = tg.fft.fftshift(tg.fft.rfftn(x, s=(3, 6), axes=(0, 1)))
        return tg.sum(tg.real(tg.fft.ifftn(spectrum, s=(2, 3), axes=(0, 1))) ** 2)

    x = sample((2, 4), "float64", seed=6)
    step = tg.compile(loss)
    for _ in range(3):
        compiled = step(x)
    eager = tg.withgradient(loss, x)
    assert np.isclose(float(compiled.val), float(eager.val))
    assert np.allclose(compiled.grad[0], eager.grad[0])


# --- PyTorch's autograd as an independent reference
def torch_transform(torch, name, kw):
    kw = dict(kw)
    if "axis" in kw:
        kw["dim"] = kw.pop("axis")
    if "axes" in kw:
        kw["dim"] = kw.pop("axes")
    return lambda x: getattr(torch.fft, name)(x, **kw)


def torch_loss(torch, y):
    if not y.is_complex():
        return torch.sum(y**3 * 0.3 + y**2)
    turned = (y * torch.exp(1j * torch.linspace(0.3, 2.5, y.shape[-1], dtype=y.real.dtype))).real
    return torch.sum(y.real**2 * 0.7) + torch.sum(turned**3 * 0.3 + turned)


@pytest.mark.parametrize(("name", "kw", "shape", "dtype"), TYPED)
def test_gradient_matches_pytorch(backend, name, kw, shape, dtype):
    torch = pytest.importorskip("torch")
    x_np = sample(shape, dtype, seed=5)
    x_torch = torch.tensor(x_np, requires_grad=True)
    torch_loss(torch, torch_transform(torch, name, kw)(x_torch)).backward()
    (g,) = tg.gradient(lambda x: real_loss(tracked_transform(name, kw)(x)), backend.asarray(x_np))
    assert np.allclose(
        numpy_of(backend, g), x_torch.grad.resolve_conj().numpy(), rtol=1e-10, atol=1e-10
    )


# --- the namespace, frequencies, bad input
def test_the_namespace_of_a_tracked_array_has_fft(backend):
    x = tg.param(backend.asarray(sample((4,), "float64")))
    xp = x.__array_namespace__()
    y = xp.fft.fft(x)
    assert tg.istracked(y)
    assert np.allclose(numpy_of(backend, y), np.fft.fft(numpy_of(backend, x)))
    assert tg.fft.fft is xp.fft.fft


@pytest.mark.parametrize("name", ["fftfreq", "rfftfreq"])
@pytest.mark.parametrize("n", [1, 4, 5])
def test_frequencies_are_created_by_the_bound_library(backend, name, n):
    xp = tg.param(backend.asarray([1.0])).__array_namespace__()
    f = getattr(xp.fft, name)(n, d=0.25, device=backend.device)
    assert type(tg.data(f)) is type(backend.asarray([1.0])) and not tg.istracked(f)
    assert f.__array_namespace__() is xp and tg.backend.device_of(f) == backend.device
    assert np.allclose(backend.to_numpy(f), getattr(np.fft, name)(n, d=0.25))
    f32 = getattr(xp.fft, name)(n, dtype=backend.xp.float32)
    assert f32.dtype == backend.xp.float32
    assert np.allclose(backend.to_numpy(f32), getattr(np.fft, name)(n))


def test_top_level_frequencies_are_numpy():
    assert isinstance(tg.data(tg.fft.fftfreq(3)), np.ndarray)
    assert tg.fft.rfftfreq(6, dtype=tg.float32).dtype == np.float32


BAD = [
    (lambda x: tg.fft.fft(x, norm="bogus"), ValueError, "norm must be one of"),
    (lambda x: tg.fft.ifft(x, axis=2), ValueError, "axis 2 is out of range"),
    (lambda x: tg.fft.fftn(x, axes=(0, -2)), ValueError, "repeat an axis"),
    (lambda x: tg.fft.fftn(x, s=(2, 2), axes=(0,)), ValueError, "one per axis"),
    (lambda x: tg.fft.fftn(x, s=(1, 2, 3)), ValueError, "3 sizes for an array of 2"),
    (lambda x: tg.fft.fft(x, n=0), ValueError, "n must be a positive int"),
    (lambda x: tg.fft.rfft(x + 1j), TypeError, "use fft"),
    (lambda x: tg.fft.fft(tg.astype(x, tg.int64)), TypeError, "floating-point input"),
    (lambda x: tg.fft.irfft(x[:, :1]), ValueError, "pass its length"),
    (lambda x: tg.fft.fftshift(x, axes=3), ValueError, "axis 3 is out of range"),
    (lambda x: tg.fft.fftfreq(0), ValueError, "n must be a positive int"),
    (lambda x: tg.fft.rfft([1.0, 2.0]), TypeError, "array.*, got list; convert it"),
    (lambda x: tg.fft.fftshift(2.0), TypeError, "takes an array, got float"),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD, ids=[b[2] for b in BAD])
def test_bad_input_is_refused_clearly(call, error, message):
    with pytest.raises(error, match=message):
        call(tg.param(np.ones((3, 4))))
