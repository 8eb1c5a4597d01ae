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


# Examples that show what a bad value does: NumPy's own floating-point warnings are expected.
SHOW_BAD_VALUES = {
    "tracker_gpu.checks": [
        pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
        pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    ]
}


@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=SHOW_BAD_VALUES.get(m, ())) for m in MODULES]
)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
