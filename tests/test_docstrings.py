"""The runnable examples in the package's docstrings."""

import doctest
import importlib
import pkgutil

import pytest

import tracker_gpu

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(tracker_gpu.__path__, "tracker_gpu.")
    if "train" not in m.name
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
