"""The Array API `fft` extension (standard 2024.12), differentiable to any order.

Four primitives do the work, each calling the data's own library (`xp.fft`): the complex
transforms `fft` and `ifft`, and the real ones `rfft` (real to half spectrum) and `irfft`
(half spectrum to real), each over one axis or several (`fftn`, ...). Their vjps are these
same transforms, so a nested pass (`nest=True`) differentiates them again. For a real loss L
of z = a + ib the gradient is dL/da + i dL/db (PyTorch's convention), and so:

- the adjoint of `fft` with norm N is `ifft` with the dual norm (backward <-> forward, ortho
  stays), and the other way round;
- `rfft`'s adjoint is `irfft` (dual norm) of the gradient with its interior bins halved
  (`irfft` counts them twice: once for each half of the Hermitian spectrum);
- `irfft`'s adjoint is `rfft` (dual norm) with its interior bins doubled;
- a length `n` (or sizes `s`) that crops the input gives it a zero gradient where it was cut,
  one that pads it drops the gradient of the padding;
- `hfft` and `ihfft` are `irfft` and `rfft` of the conjugate (as NumPy defines them), and the
  shifts are permutations whose adjoints are the opposite shifts.

Real input to the complex transforms is taken as complex (its gradient is the real part);
`rfft`, `rfftn` and `ihfft` take real input only. Dask computes a transform along an axis of
one chunk: the transformed axes are rechunked to one chunk first.

>>> import numpy as np, tracker_gpu as tg
>>> x = np.array([1.0, 2.0, 0.0, -1.0])
>>> tg.fft.fft(x)
array([2.+0.j, 1.-3.j, 0.+0.j, 1.+3.j])
>>> tg.gradient(lambda x: tg.sum(tg.abs(tg.fft.rfft(x)) ** 2), x)[0]
array([ 6., 10.,  2., -2.])
"""

import importlib

import numpy as np
from array_api_compat import is_torch_array

from ..backend import (
    device_of,
    dtype_in,
    is_array,
    is_cupy_device,
    is_lazy,
    isdtype,
    library_of_device,
    namespace_of,
)
from ..primitive import Primitive, no_gradient
from ..tracked import TrackedArray, constant, data
from .elementwise import astype, complex_dtype, conj, is_complex, multiply, real_dtype
from .shape import concat

__all__ = [
    "fft",
    "ifft",
    "fftn",
    "ifftn",
    "rfft",
    "irfft",
    "rfftn",
    "irfftn",
    "hfft",
    "ihfft",
    "fftfreq",
    "rfftfreq",
    "fftshift",
    "ifftshift",
]

NORMS = ("backward", "ortho", "forward")
DUAL = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


# --- the forward: the library's own transform
def _native(kind):
    def forward(xp, x, *, s, axes, norm):
        if is_lazy(x):  # Dask transforms along axes of one chunk only
            x = x.rechunk({a: -1 for a in axes})
        if len(axes) == 1:
            return getattr(xp.fft, kind)(x, n=s[0], axis=axes[0], norm=norm)
        return getattr(xp.fft, kind + "n")(x, s=s, axes=axes, norm=norm)

    forward.__name__ = f"_{kind}_forward"
    return forward


# --- the pullbacks, written with the primitives themselves
def _fit(g, shape, axes):
    """`g` cropped or zero-padded along `axes` to `shape` (the input's): undoes `s`."""
    for a in axes:
        size, m = g.shape[a], shape[a]
        if size > m:
            g = g[(slice(None),) * a + (slice(0, m), Ellipsis)]
        elif size < m:
            plain = data(g)
            xp = namespace_of(plain)
            pad = tuple(g.shape[:a]) + (m - size,) + tuple(g.shape[a + 1 :])
            zeros = xp.zeros(pad, dtype=plain.dtype, device=device_of(plain))
            g = concat([g, zeros], axis=a)
    return g


def _half_spectrum_weights(g, n, axis, interior):
    """Weights of a half spectrum of a length-`n` real signal along `axis`: 1 for the DC bin
    and (even n) the Nyquist bin, `interior` for the bins that stand for two."""
    plain = data(g)
    xp = namespace_of(plain)
    bins = n // 2 + 1
    weights = [1.0] + [interior] * (bins - 1)
    if n % 2 == 0 and bins > 1:
        weights[-1] = 1.0
    w = xp.asarray(weights, dtype=real_dtype(xp, plain.dtype), device=device_of(plain))
    return xp.reshape(w, (bins,) + (1,) * (g.ndim - 1 - axis))


def _fft_vjp(g, ans, x, *, s, axes, norm):
    return _fit(_ifft(g, s=s, axes=axes, norm=DUAL[norm]), x.shape, axes)


def _ifft_vjp(g, ans, x, *, s, axes, norm):
    return _fit(_fft(g, s=s, axes=axes, norm=DUAL[norm]), x.shape, axes)


def _rfft_vjp(g, ans, x, *, s, axes, norm):
    halved = multiply(g, _half_spectrum_weights(g, s[-1], axes[-1], 0.5))
    return _fit(_irfft(halved, s=s, axes=axes, norm=DUAL[norm]), x.shape, axes)


def _irfft_vjp(g, ans, x, *, s, axes, norm):
    spectrum = _rfft(g, s=s, axes=axes, norm=DUAL[norm])
    doubled = multiply(spectrum, _half_spectrum_weights(g, s[-1], axes[-1], 2.0))
    return _fit(doubled, x.shape, axes)


_fft = Primitive("fft", _native("fft"), (_fft_vjp,), saves="")
_ifft = Primitive("ifft", _native("ifft"), (_ifft_vjp,), saves="")
_rfft = Primitive("rfft", _native("rfft"), (_rfft_vjp,), saves="")
_irfft = Primitive("irfft", _native("irfft"), (_irfft_vjp,), saves="")


# --- checking and resolving the arguments
def _norm(norm, name):
    if norm not in NORMS:
        raise ValueError(f"{name}: norm must be one of {NORMS}, got {norm!r}")
    return norm


def _ndim(x, name):
    if not is_array(data(x)):
        raise TypeError(
            f"{name} takes an array, got {type(x).__name__}; convert it with asarray first"
        )
    return x.ndim


def _axis(axis, ndim, name):
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{name}: an axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"{name}: axis {axis} is out of range for an array of {ndim} dimensions; "
            f"use an axis in [{-ndim}, {ndim - 1}]"
        )
    return axis % ndim


def _axes(x, s, axes, name):
    """The transformed axes (non-negative) of the n-dimensional transforms, as the standard
    says: all of them by default, the last `len(s)` when only `s` is given."""
    _ndim(x, name)
    if axes is None:
        count = x.ndim if s is None else len(s)
        if count > x.ndim:
            raise ValueError(f"{name}: s has {count} sizes for an array of {x.ndim} dimensions")
        axes = tuple(range(x.ndim - count, x.ndim))
    else:
        axes = (axes,) if isinstance(axes, int) else tuple(axes)
        axes = tuple(_axis(a, x.ndim, name) for a in axes)
    if not axes:
        raise ValueError(f"{name}: no axis to transform; pass at least one in axes")
    if len(set(axes)) < len(axes):
        raise ValueError(f"{name}: axes {axes} repeat an axis; name each axis once")
    if s is not None and len(s) != len(axes):
        raise ValueError(f"{name}: s has {len(s)} sizes for {len(axes)} axes; give one per axis")
    return axes


def _length(n, default, name, what="n"):
    if n is None or n == -1:
        n = default
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"{name}: {what} must be a positive int (or -1 for the default), got {n!r}"
        )
    return n


def _sizes(x, s, axes, name, real_output=False):
    """`s` resolved: each transform length, the input's size by default (for a real output
    along the last axis, `2 * (m - 1)` from `m` bins)."""
    s = (None,) * len(axes) if s is None else tuple(s)
    sizes = [_length(n, x.shape[a], name, "each size in s") for n, a in zip(s[:-1], axes)]
    last = x.shape[axes[-1]]
    default = 2 * (last - 1) if real_output else last
    if real_output and s[-1] in (None, -1) and default < 1:
        raise ValueError(
            f"{name}: an axis of {last} bins gives no output length by default; pass its "
            f"length ({'n' if len(axes) == 1 else 's'})"
        )
    return tuple(sizes) + (_length(s[-1], default, name, "n" if len(axes) == 1 else "s[-1]"),)


def _floating(x, name, complex_ok=True):
    plain = data(x)
    xp = namespace_of(plain)
    kinds = ("real floating", "complex floating") if complex_ok else "real floating"
    if not isdtype(xp, plain.dtype, kinds):
        wanted = "floating-point" if complex_ok else "real floating-point"
        hint = "use fft (or fftn) for complex input" if is_complex(plain) else "use astype"
        raise TypeError(f"{name} takes {wanted} input, got {plain.dtype}; {hint}")
    return xp


def _as_complex(x, name):
    xp = _floating(x, name)
    if is_complex(x) or (name in _TORCH_TAKES_REAL and is_torch_array(data(x))):
        return x  # PyTorch's transform of a real tensor: its own value, in the last bits too
    return astype(x, complex_dtype(xp, data(x).dtype))


_TORCH_TAKES_REAL = {"fft", "ifft", "fftn", "ifftn"}


# --- the standard's functions
def fft(x, /, *, n=None, axis=-1, norm="backward"):
    """The one-dimensional discrete Fourier transform along `axis`, of length `n` (the input
    is cropped or zero-padded to it).

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.fft(np.array([1.0, 0.0, 0.0, 0.0]), n=2)
    array([1.+0.j, 1.+0.j])
    """
    axis = _axis(axis, _ndim(x, "fft"), "fft")
    s = (_length(n, x.shape[axis], "fft"),)
    return _fft(_as_complex(x, "fft"), s=s, axes=(axis,), norm=_norm(norm, "fft"))


def ifft(x, /, *, n=None, axis=-1, norm="backward"):
    """The one-dimensional inverse discrete Fourier transform along `axis`.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.ifft(np.array([4.0, 0.0, 0.0, 0.0]))
    array([1.+0.j, 1.+0.j, 1.+0.j, 1.+0.j])
    """
    axis = _axis(axis, _ndim(x, "ifft"), "ifft")
    s = (_length(n, x.shape[axis], "ifft"),)
    return _ifft(_as_complex(x, "ifft"), s=s, axes=(axis,), norm=_norm(norm, "ifft"))


def fftn(x, /, *, s=None, axes=None, norm="backward"):
    """The n-dimensional discrete Fourier transform over `axes`, of sizes `s`.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.fftn(np.ones((2, 2)))
    array([[4.+0.j, 0.+0.j],
           [0.+0.j, 0.+0.j]])
    """
    axes = _axes(x, s, axes, "fftn")
    s = _sizes(x, s, axes, "fftn")
    return _fft(_as_complex(x, "fftn"), s=s, axes=axes, norm=_norm(norm, "fftn"))


def ifftn(x, /, *, s=None, axes=None, norm="backward"):
    """The n-dimensional inverse discrete Fourier transform over `axes`, of sizes `s`.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.ifftn(np.array([[4.0, 0.0], [0.0, 0.0]]))
    array([[1.+0.j, 1.+0.j],
           [1.+0.j, 1.+0.j]])
    """
    axes = _axes(x, s, axes, "ifftn")
    s = _sizes(x, s, axes, "ifftn")
    return _ifft(_as_complex(x, "ifftn"), s=s, axes=axes, norm=_norm(norm, "ifftn"))


def rfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The discrete Fourier transform of real `x` along `axis`: its `n // 2 + 1` bins of
    non-negative frequency.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.rfft(np.array([1.0, 2.0, 3.0]))
    array([ 6. +0.j       , -1.5+0.8660254j])
    """
    _floating(x, "rfft", complex_ok=False)
    axis = _axis(axis, _ndim(x, "rfft"), "rfft")
    s = (_length(n, x.shape[axis], "rfft"),)
    return _rfft(x, s=s, axes=(axis,), norm=_norm(norm, "rfft"))


def irfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The inverse of `rfft`: the real signal of length `n` (`2 * (m - 1)` for `m` bins by
    default) whose half spectrum along `axis` is `x`.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.irfft(np.array([6.0, -1.5 + 0.8660254j]), n=3)
    array([1., 2., 3.])
    """
    axis = _axis(axis, _ndim(x, "irfft"), "irfft")
    s = _sizes(x, None if n is None else (n,), (axis,), "irfft", real_output=True)
    return _irfft(_as_complex(x, "irfft"), s=s, axes=(axis,), norm=_norm(norm, "irfft"))


def rfftn(x, /, *, s=None, axes=None, norm="backward"):
    """The n-dimensional transform of real `x`: half spectrum along the last of `axes`.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.rfftn(np.ones((2, 4))).shape
    (2, 3)
    """
    _floating(x, "rfftn", complex_ok=False)
    axes = _axes(x, s, axes, "rfftn")
    s = _sizes(x, s, axes, "rfftn")
    return _rfft(x, s=s, axes=axes, norm=_norm(norm, "rfftn"))


def irfftn(x, /, *, s=None, axes=None, norm="backward"):
    """The inverse of `rfftn`: a real output of sizes `s` (the last `2 * (m - 1)` by default).

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.irfftn(tg.fft.rfftn(np.ones((2, 3))), s=(2, 3))
    array([[1., 1., 1.],
           [1., 1., 1.]])
    """
    axes = _axes(x, s, axes, "irfftn")
    s = _sizes(x, s, axes, "irfftn", real_output=True)
    return _irfft(_as_complex(x, "irfftn"), s=s, axes=axes, norm=_norm(norm, "irfftn"))


def hfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The transform of a signal with Hermitian symmetry, given by its first half `x`: a
    real output of length `n` (`2 * (m - 1)` by default); `irfft` of `conj(x)`.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.hfft(np.array([1.0, 2.0, 3.0]))
    array([ 8., -2.,  0., -2.])
    """
    norm = _norm(norm, "hfft")
    axis = _axis(axis, _ndim(x, "hfft"), "hfft")
    s = _sizes(x, None if n is None else (n,), (axis,), "hfft", real_output=True)
    return _irfft(conj(_as_complex(x, "hfft")), s=s, axes=(axis,), norm=DUAL[norm])


def ihfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The inverse of `hfft`, for real `x`: `conj(rfft(x))` with the dual norm.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.ihfft(np.array([8.0, -2.0, 0.0, -2.0]))
    array([1.-0.j, 2.-0.j, 3.-0.j])
    """
    norm = _norm(norm, "ihfft")
    _floating(x, "ihfft", complex_ok=False)
    axis = _axis(axis, _ndim(x, "ihfft"), "ihfft")
    s = (_length(n, x.shape[axis], "ihfft"),)
    return conj(_rfft(x, s=s, axes=(axis,), norm=DUAL[norm]))


# --- shifts: permutations, whose adjoint is the opposite shift
def _shift_axes(x, axes, name):
    _ndim(x, name)
    if axes is None:
        return tuple(range(x.ndim))
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    return tuple(_axis(a, x.ndim, name) for a in axes)


def _shift_forward(kind):
    def forward(xp, x, *, axes):
        return getattr(xp.fft, kind)(x, axes=axes)

    return forward


_fftshift = Primitive(
    "fftshift",
    _shift_forward("fftshift"),
    (lambda g, ans, x, *, axes: _ifftshift(g, axes=axes),),
    saves="",
)
_ifftshift = Primitive(
    "ifftshift",
    _shift_forward("ifftshift"),
    (lambda g, ans, x, *, axes: _fftshift(g, axes=axes),),
    saves="",
)


def fftshift(x, /, *, axes=None):
    """`x` with the zero frequency moved to the middle of each of `axes` (all by default).

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.fftshift(np.array([0.0, 1.0, 2.0, -2.0, -1.0]))
    array([-2., -1.,  0.,  1.,  2.])
    """
    return _fftshift(x, axes=_shift_axes(x, axes, "fftshift"))


def ifftshift(x, /, *, axes=None):
    """The inverse of `fftshift`: the zero frequency moved back to the start.

    >>> import numpy as np, tracker_gpu as tg
    >>> tg.fft.ifftshift(np.array([-2.0, -1.0, 0.0, 1.0, 2.0]))
    array([ 0.,  1.,  2., -2., -1.])
    """
    return _ifftshift(x, axes=_shift_axes(x, axes, "ifftshift"))


# --- frequencies: constants (no gradient), made by the library the namespace is bound to
def bound_functions(default):
    """`fftfreq` and `rfftfreq` creating arrays of library `default` (or of `device`'s)."""

    def frequencies(kind, n, d, dtype, device):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{kind}: n must be a positive int, got {n!r}")
        xp = library_of_device(device, default)
        if xp is np:  # NumPy's own takes no dtype; array-api-compat's wrapper does
            xp = importlib.import_module("array_api_compat.numpy")
        dtype = dtype_in(xp, dtype)
        make = lambda _, d: _made_on(device, getattr(xp.fft, kind), n, d=d, dtype=dtype)
        if isinstance(d, TrackedArray):  # a constant of the spacing's value (read by a replay)
            return no_gradient(kind, make)(d)
        made = make(xp, d)
        return constant(made, namespace_of(made))

    def fftfreq(n, /, *, d=1.0, dtype=None, device=None):
        """The frequencies of the bins of a transform of length `n`, sample spacing `d`.

        >>> import tracker_gpu as tg
        >>> tg.data(tg.fft.fftfreq(4, d=0.5))
        array([ 0. ,  0.5, -1. , -0.5])
        """
        return frequencies("fftfreq", n, d, dtype, device)

    def rfftfreq(n, /, *, d=1.0, dtype=None, device=None):
        """The frequencies of the `n // 2 + 1` bins of `rfft` of length `n`.

        >>> import tracker_gpu as tg
        >>> tg.data(tg.fft.rfftfreq(4))
        array([0.  , 0.25, 0.5 ])
        """
        return frequencies("rfftfreq", n, d, dtype, device)

    return {"fftfreq": fftfreq, "rfftfreq": rfftfreq}


def _made_on(device, make, *args, **kwargs):
    """`make(*args, **kwargs)` on `device`. array-api-compat's CuPy frequencies take no CUDA
    device ("cpu" or None only), so there `device` is made CuPy's current one for the call."""
    if is_cupy_device(device):
        with device:
            return make(*args, **kwargs)
    return make(*args, **kwargs, device=device)


_numpy_frequencies = bound_functions(np)
fftfreq = _numpy_frequencies["fftfreq"]
rfftfreq = _numpy_frequencies["rfftfreq"]
