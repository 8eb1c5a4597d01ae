"""The package list in pyproject.toml covers every subpackage, and the kernels are found."""

from pathlib import Path

import pytest

import tracker_gpu
from tracker_gpu.cuda.sources import families, kernels

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_packaged():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_root = Path(tracker_gpu.__file__).parent
    found = {
        ".".join(("tracker_gpu",) + p.parent.relative_to(package_root).parts)
        for p in package_root.rglob("__init__.py")
    }
    assert found | {"tracker_gpu.kernels"} == set(config["packages"])


def test_the_kernel_sources_are_found():
    assert set(families()) == {p.stem for p in (ROOT / "kernels").glob("*.cu")}
    assert len(kernels()) >= 20


def test_every_file_of_the_kernels_directory_is_package_data():
    """A header the generated sources include (special.cuh) ships with the sources."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["tracker_gpu.kernels"]
    files = [p.name for p in (ROOT / "kernels").iterdir() if p.is_file()]
    assert files and all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in files), files
