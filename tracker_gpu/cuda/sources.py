"""The CUDA sources (`kernels/*.cu`, shipped inside the wheel) and the kernels they declare.

Every kernel is a `template <typename T> __global__ void name(params)` instantiated for float
and double; its parameter list is read from the source, so launchers convert arguments from the
source itself and a kernel cannot be added without being seen by the checks.
"""

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = ["Kernel", "kernels", "source", "families", "C_TYPES"]

C_TYPES = {"float32": "float", "float64": "double"}
_KERNEL = re.compile(
    r"template\s*<\s*typename\s+T\s*>\s*__global__\s+void\s+(\w+)\s*\(([^)]*)\)", re.S
)
_MACRO_KERNEL = re.compile(r"__global__\s+void\s+name##(\w+)\s*\(([^)]*)\)", re.S)
_MACRO_USE = r"^{macro}\((\w+)"


@dataclass(frozen=True)
class Kernel:
    name: str
    family: str  # the .cu file it lives in, without the suffix
    params: tuple  # ((c_type, name), ...) with "T" for the float type

    def param_names(self):
        return [name for _, name in self.params]


def _directory():
    packaged = resources.files("tracker_gpu") / "kernels"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "kernels"


def families():
    """The names of the kernel source files."""
    return sorted(p.stem for p in _directory().glob("*.cu"))


def source(family):
    return (_directory() / f"{family}.cu").read_text()


def _params(text):
    params = []
    for part in " ".join(text.split()).split(","):
        part = part.replace("\\", " ").strip()
        ctype, name = part.rsplit(" ", 1)
        params.append((ctype.replace("const ", "").strip(), name))
    return tuple(params)


def _declared(family, text):
    """Kernels written out, and kernels stamped out by a macro (`#define X(name, ...)`)."""
    found = [(name, params) for name, params in _KERNEL.findall(text)]
    for macro in re.finditer(r"#define\s+(\w+)\(name[^)]*\)(.*?)(?:\n\n|\Z)", text, re.S):
        body = macro.group(2)
        inner = _MACRO_KERNEL.search(body)
        if inner is None:
            continue
        suffix, params = inner.groups()
        for prefix in re.findall(_MACRO_USE.format(macro=macro.group(1)), text, re.M):
            found.append((prefix + suffix, params))
    return [Kernel(name, family, _params(params)) for name, params in found]


def kernels():
    """Every kernel of every source file, by name."""
    table = {}
    for family in families():
        for kernel in _declared(family, source(family)):
            table[kernel.name] = kernel
    return table
