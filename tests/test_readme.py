"""The README's Python examples run, in order, in one namespace (their asserts are the checks)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(python_blocks()) >= 5


def test_readme_examples_run():
    pytest.importorskip("array_api_strict")
    namespace = {}
    for number, block in enumerate(python_blocks(), start=1):
        try:
            exec(compile(block, f"README.md block {number}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"README block {number} failed: {error!r}\n{block}") from error


def test_readme_shows_the_two_setup_commands():
    commands = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    assert any("tracker_gpu.train" in c for c in commands)
    assert any("ci/matrix" in c for c in commands)
