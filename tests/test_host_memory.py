"""The training jobs keep the host memory a step frees for the next step
(`train.devices.keep_freed_memory`): measured as page faults of a step that makes and frees
8 MB arrays, in a process of its own, with and without it; and both jobs call it."""

import platform
import subprocess
import sys

import pytest

from tracker_gpu.train import cli, text_cli

CHILD = """
import resource, sys
import numpy as np
from tracker_gpu.train.devices import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():
    a = np.ones(1 << 20)  # 8 MB, over glibc's first mmap threshold
    return float((a * 2.0)[-1])
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode):
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="not glibc's malloc")
def test_a_step_reuses_the_memory_it_freed():
    kept, default = _faults("keep"), _faults("default")
    # 20 steps of two 8 MB arrays (4,096 pages): about 1,000 faulted in anew each step by
    # default (glibc raises its threshold after the first free, and trims the heap's top)
    assert default > 5_000, default
    assert kept < default / 20, (kept, default)


@pytest.mark.parametrize("argv", [["--epochs", "0"], ["text", "--heads", "0"]])
def test_both_jobs_keep_freed_memory(argv, monkeypatch):
    calls = []
    for module in (cli, text_cli):
        monkeypatch.setattr(module, "keep_freed_memory", lambda: calls.append(True))
    with pytest.raises(SystemExit):  # argparse refuses the argument, after the call
        cli.main(argv)
    assert calls
