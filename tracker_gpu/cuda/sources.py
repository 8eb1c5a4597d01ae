"""CUDA source texts and the kernels they declare: the files in `kernels/` (shipped inside the
wheel) and the sources generated for `tg.broadcast`, handled alike.

Every kernel is a `template <typename T> __global__ void name(params)` instantiated for float
and double, or a `template <typename S>` one, instantiated for a storage type S (float, double,
and the half types of `kernels/half.cuh`, tg_half for float16 and tg_bfloat16 for bfloat16),
which computes in `compute_t<S>` (float for the half types) and takes its scalars in it. A source
is instantiated for the half types when all its kernels are written for a storage type. A
kernel's parameter list is read from the source, so launchers convert (and count) arguments from
the source itself and a kernel cannot be added without being seen by the checks.
A `Family` is one source text: the unit that NVRTC compiles, that CuPy loads as one module and
that the host build compiles, always from the same text.
"""

import hashlib
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

__all__ = [
    "Kernel",
    "Family",
    "family",
    "families",
    "header",
    "kernels",
    "source",
    "C_TYPES",
    "HALF_C_TYPES",
    "STORAGE_TYPES",
    "SCALAR_TYPES",
    "compute_dtype",
    "c_type",
    "OPTIONS",
    "EXACT_OPTIONS",
]

C_TYPES = {"float32": "float", "float64": "double"}
HALF_C_TYPES = {"float16": "tg_half", "bfloat16": "tg_bfloat16"}  # kernels/half.cuh
STORAGE_TYPES = {**C_TYPES, **HALF_C_TYPES}
_COMPUTE = {"float16": "float32", "bfloat16": "float32"}
SCALAR_TYPES = ("T", "compute_t<S>")  # by-value floats, in the compute type
# Every operation rounded as the library's own operation rounds it: no contraction of a * b + c
# into one rounding (NVRTC contracts by default), so a fused kernel whose formula is the generic
# rule's gives its bits: an eager step (a fused Adam) and its compiled replay (the rule) agree.
OPTIONS = ("-std=c++14", "--fmad=false")
EXACT_OPTIONS = ("-std=c++17", "--fmad=false")  # the generated fusion kernels
_KERNEL = re.compile(
    r"template\s*<\s*typename\s+([TS])\s*>\s*__global__\s+void\s+(\w+)\s*\(([^)]*)\)", re.S
)
_INCLUDE = re.compile(r'^#include "(\w+)\.cuh"$', re.M)
_MACRO_KERNEL = re.compile(r"__global__\s+void\s+name##(\w+)\s*\(([^)]*)\)", re.S)
_MACRO_USE = r"^{macro}\((\w+)"


@dataclass(frozen=True)
class Kernel:
    name: str
    family: str  # the name of the Family it lives in
    params: tuple  # ((c_type, name), ...) with "T" for the float type
    cooperative: bool = False  # its threads synchronise within a block (`__syncthreads`)
    storage: bool = False  # written for a storage type S (`template <typename S>`)

    def param_names(self):
        return [name for _, name in self.params]


def compute_dtype(dtype):
    """The dtype a kernel for storage `dtype` computes in (float32 for the half types)."""
    return _COMPUTE.get(dtype, dtype)


def c_type(param_type, dtype):
    """A parameter's C type in the instance for `dtype`: T is the compute type, S the storage
    type."""
    param_type = re.sub(r"\bS\b", STORAGE_TYPES[dtype], param_type)
    return re.sub(r"\bT\b", C_TYPES[compute_dtype(dtype)], param_type)


@dataclass(frozen=True, eq=False)
class Family:
    """One CUDA source text and the kernels it declares."""

    name: str
    text: str
    kernels: dict = field(repr=False)
    digest: str = field(repr=False)
    options: tuple = ()  # NVRTC's options, where not the default (`OPTIONS`)

    @classmethod
    def from_text(cls, name, text, options=()):
        kernels = {k.name: k for k in _declared(name, text)}
        digest = hashlib.sha256("\0".join([text, *options]).encode()).hexdigest()[:16]
        return cls(name, text, kernels, digest, tuple(options))

    def nvrtc_options(self):
        """What NVRTC is given besides the architecture: `options`, else `OPTIONS`."""
        return self.options or OPTIONS

    @property
    def dtypes(self):
        """The dtypes its kernels are instantiated for: every storage type where all of them are
        written for one, else float32 and float64."""
        kernels = self.kernels.values()
        halves = kernels and all(k.storage for k in kernels)
        return tuple(STORAGE_TYPES if halves else C_TYPES)

    def name_expressions(self):
        """The template instances to compile: every kernel for every dtype it takes."""
        return [f"{k}<{STORAGE_TYPES[d]}>" for k in self.kernels for d in self.dtypes]


def _directory():
    packaged = resources.files("tracker_gpu") / "kernels"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "kernels"


def families():
    """The names of the kernel source files."""
    return sorted(p.stem for p in _directory().glob("*.cu"))


def source(name):
    """The text of `kernels/<name>.cu`, each `#include "<header>.cuh"` replaced by the header's
    text (so CuPy, NVRTC and the host build need no include path)."""
    text = (_directory() / f"{name}.cu").read_text()
    return _INCLUDE.sub(lambda m: header(m.group(1)), text)


@cache
def header(name):
    """The text of `kernels/<name>.cuh`, a header that generated sources start with (written
    out in them, so CuPy, NVRTC and the host build need no include path)."""
    return (_directory() / f"{name}.cuh").read_text()


@cache
def family(name):
    """The `Family` of `kernels/<name>.cu`."""
    return Family.from_text(name, source(name))


def _params(text):
    params = []
    for part in " ".join(text.split()).split(","):
        part = part.replace("\\", " ").strip()
        ctype, name = part.rsplit(" ", 1)
        params.append((ctype.replace("const ", "").replace("__restrict__", "").strip(), name))
    return tuple(params)


def _declared(name, text):
    """Kernels written out, and kernels stamped out by a macro (`#define X(name, ...)`)."""
    bodies = _bodies(text)
    syncing = _synchronising(bodies)
    found = [(kernel, params, kernel, t == "S") for t, kernel, params in _KERNEL.findall(text)]
    for macro in re.finditer(r"#define\s+(\w+)\(name[^)]*\)(.*?)(?:\n\n|\Z)", text, re.S):
        body = macro.group(2)
        inner = _MACRO_KERNEL.search(body)
        if inner is None:
            continue
        suffix, params = inner.groups()
        storage = re.search(r"typename\s+S\b", body[: inner.start()]) is not None
        for prefix in re.findall(_MACRO_USE.format(macro=macro.group(1)), text, re.M):
            found.append((prefix + suffix, params, suffix, storage))
    return [
        Kernel(kernel, name, _params(params), body_name in syncing, storage)
        for kernel, params, body_name, storage in found
    ]


_FUNCTION = re.compile(r"(\w+)\s*\(([^()]|\([^()]*\))*\)\s*\{")
_NOT_FUNCTIONS = {"for", "if", "while", "switch", "return"}


def _bodies(text):
    """The body of every function defined in `text`, by name (a macro's kernels by the part of
    their name the macro writes out)."""
    bodies = {}
    for match in _FUNCTION.finditer(text):
        if match.group(1) in _NOT_FUNCTIONS:
            continue
        depth, start = 0, match.end() - 1
        for end in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        bodies.setdefault(match.group(1), text[start : end + 1])
    return bodies


def _synchronising(bodies):
    """The functions that reach `__syncthreads`, directly or through the functions they call."""
    syncing = {name for name, body in bodies.items() if "__syncthreads" in body}
    while True:
        more = {
            name
            for name, body in bodies.items()
            if name not in syncing and any(re.search(rf"\b{s}\s*\(", body) for s in syncing)
        }
        if not more:
            return syncing
        syncing |= more


def kernels():
    """Every kernel of every source file, by name."""
    table = {}
    for name in families():
        table.update(family(name).kernels)
    return table
