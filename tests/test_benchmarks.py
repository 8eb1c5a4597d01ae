"""The benchmark scripts run to the end and write what they promise (no timing is asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
WORKLOADS = {"per-op", "sum-of-squares", "mlp-step", "graphs", "hessian"}
PEERS = ("torch", "autograd", "mygrad")
ALLOWED = {"ok", "n/a", "not installed", "not supported"}

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def once(request):
    if request.config.getoption("backend") != "numpy":
        pytest.skip("the benchmarks make their own arrays: they run once, with --backend numpy")


def run(script, *args):
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def check_row(row):
    results = row["results"]
    for lib in ("numpy", "tracker_gpu"):
        assert results[lib]["status"] == "ok", (row["case"], lib, results[lib])
        assert results[lib]["value"] > 0 or row["kind"] == "memory", (row["case"], lib)
    for lib in PEERS:
        assert results[lib]["status"] in ALLOWED, (row["case"], lib, results[lib])


def test_peers_quick(tmp_path):
    out = run("peers.py", "--quick", "--out", str(tmp_path))
    document = json.loads((tmp_path / "peers.json").read_text())
    assert set(document["workloads"]) == WORKLOADS
    for rows in document["workloads"].values():
        assert rows
        for row in rows:
            check_row(row)
    assert document["targets"] and all("met" in t for t in document["targets"])
    markdown = (tmp_path / "peers.md").read_text()
    for text in (markdown, out):
        assert "tracker_gpu" in text and "NumPy by hand" in text


def test_peers_only(tmp_path):
    run("peers.py", "--quick", "--only", "hessian", "--out", str(tmp_path))
    document = json.loads((tmp_path / "peers.json").read_text())
    assert set(document["workloads"]) == {"hessian"}


def test_overhead():
    assert "tracker_gpu" in run("overhead.py", "--ops", "100", "--repeats", "3")


def test_kernels():
    run("kernels.py", "--size", str(1 << 20), "--repeats", "3")
