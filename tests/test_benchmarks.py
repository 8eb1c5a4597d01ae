"""The benchmark scripts run to the end and write what they promise (no timing is asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
CI_GPU = ROOT / "ci" / "gpu"
WORKLOADS = {"per-op", "sum-of-squares", "mlp-step", "graphs", "hessian"}
PEERS = ("torch", "autograd", "mygrad")
ALLOWED = {"ok", "n/a", "not installed", "not supported"}

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def once(request):
    if request.config.getoption("backend") != "numpy":
        pytest.skip("the benchmarks make their own arrays: they run once, with --backend numpy")


def run(script, *args, expect=0):
    path = script if isinstance(script, Path) else BENCHMARKS / script
    proc = subprocess.run(
        [sys.executable, str(path), *args], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == expect, f"{script} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def check_row(row):
    results = row["results"]
    for lib in ("numpy", "tracker_gpu"):
        assert results[lib]["status"] == "ok", (row["case"], lib, results[lib])
        assert results[lib]["value"] > 0 or row["kind"] == "memory", (row["case"], lib)
        if row["kind"] == "time":  # timed in warm blocks too
            assert results[lib]["warm"] > 0 and results[lib]["warm_ratio"] > 0, row["case"]
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
        assert "tracker_gpu" in text and "NumPy by hand" in text and "warm blocks" in text


def test_peers_only(tmp_path):
    run("peers.py", "--quick", "--only", "hessian", "--out", str(tmp_path))
    document = json.loads((tmp_path / "peers.json").read_text())
    assert set(document["workloads"]) == {"hessian"}


def test_overhead():
    assert "tracker_gpu" in run("overhead.py", "--ops", "100", "--repeats", "3")


def test_higher_order():
    """The Hessian two ways (the script asserts that they agree before it times them)."""
    out = run("higher_order.py", "--repeats", "1", "--sizes", "3")
    assert "hvp" in out
    for name in ("tanh-layer", "logsumexp", "mlp-input"):
        assert name in out


def has_gpu():
    try:
        import cupy
    except ImportError:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:
        return False


def test_kernels(tmp_path):
    out = run("kernels.py", "--size", str(1 << 20), "--repeats", "3", "--json", str(tmp_path / "k"))
    document = json.loads((tmp_path / "k").read_text())
    names = {"sumabs2", "sum(x**2)", "tanh", "sigmoid", "relu", "exp", "sin", "bias", "softmax",
             "crossentropy"}  # fmt: skip
    if document["gpu"]:
        assert {r["name"] for r in document["workloads"]} == names
        assert all(r["paths"]["fused"]["backward"]["ms"] > 0 for r in document["workloads"])
        return
    # without a GPU: the plan, with launch counts measured on the host build
    assert "No GPU available" in out
    plan = {row["name"]: row for row in document["plan"]}
    assert set(plan) == names
    for name in ("tanh", "sigmoid", "relu", "exp", "sin"):
        assert plan[name]["backward_launches"] == [f"{name}_bwd_acc"]
        assert f"{name}_bwd_acc" in out
    assert plan["sumabs2"]["backward_launches"] == plan["sum(x**2)"]["backward_launches"]
    assert plan["softmax"]["forward_launches"] == ["softmax_fwd"]
    assert "add_bwd_reduce" in plan["bias"]["backward_launches"]
    assert plan["crossentropy"]["backward_launches"] == ["logitcrossentropy_bwd_acc"]


def test_train_step(tmp_path):
    out = run("train_step.py", "--repeats", "10", "--json", str(tmp_path / "t"))
    document = json.loads((tmp_path / "t").read_text())
    assert document["backend"] == "numpy" and document["ratio"] > 0
    assert "tracker_gpu step" in out and "NumPy by hand" in out


@pytest.mark.parametrize("script", ["train_step.py", "text.py"])
def test_a_gpu_benchmark_on_cupy_without_a_gpu_says_so(script):
    if has_gpu():
        pytest.skip(f"a GPU is present: {script} --backend cupy would time it")
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--backend", "cupy"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 3 and "no GPU available" in proc.stderr


def test_ci_gpu_dry_run_lists_the_steps(tmp_path):
    out = run(CI_GPU, "--dry-run", "--report", str(tmp_path / "r.md"))
    for text in ("--system-site-packages", "--no-index", "--find-links", "ci/matrix cupy",
                 "tests/test_fused_fuzz.py", "TRACKER_GPU_FUZZ_EXAMPLES=", "benchmarks/kernels.py",
                 "train_step.py --backend cupy", "tracker_gpu.train --backend cupy",
                 "text.py --backend cupy --json", "text.py --backend cupy --precision 16",
                 "text.py --backend cupy --precision bf16",
                 "--device gpu:1", "device-check"):  # fmt: skip
        assert text in out, text
    assert not (tmp_path / "r.md").exists()


def test_ci_gpu_quick_shortens_each_benchmark_and_the_fuzzer():
    ci_gpu = _ci_gpu_module()
    out = run(CI_GPU, "--dry-run", "--quick")
    lines = {line.split(":")[0]: line for line in out.splitlines() if ": " in line}
    for step, extra in ci_gpu.QUICK.items():
        assert lines[step].split("#")[0].rstrip().endswith(" ".join(extra)), lines[step]
    assert f"TRACKER_GPU_FUZZ_EXAMPLES={ci_gpu.QUICK_FUZZ_EXAMPLES} " in lines["fuzz"]
    assert "TRACKER_GPU_FUZZ_EXAMPLES=2000 " in run(CI_GPU, "--dry-run")


@pytest.mark.parametrize("precision", ["32", "bf16", "16"])
def test_text(tmp_path, precision):
    """The text job's step, each contender on a tiny model: the same first loss (checked by the
    script), rates and issue 25's targets written, in each precision."""
    tiny = "--layers 1 --width 16 --heads 2 --context 8 --batch 4 --steps 2 --rounds 1".split()
    out = run("text.py", *tiny, "--precision", precision, "--json", str(tmp_path / "t"))
    document = json.loads((tmp_path / "t").read_text())
    names = {"torch eager", "tracker_gpu eager", "tracker_gpu compiled"}
    assert set(document["rates"]) == set(document["first"]) == names
    assert all(rate > 0 for rate in document["rates"].values())
    assert len(document["targets"]) == 3 and all("met" in t for t in document["targets"])
    assert "tokens/s" in out and document["precision"] == precision


def test_ci_gpu_without_wheels_fails_with_a_report(tmp_path):
    report = tmp_path / "report.md"
    wheels = tmp_path / "no-wheels"
    run(CI_GPU, "--wheels", str(wheels), "--report", str(report), expect=1)
    text = report.read_text()
    assert "FAILED: setup" in text and "ci/gpu prepare" in text
    assert "## Machine" in text and "## A second GPU" in text


def _ci_gpu_module():
    import importlib.machinery
    import importlib.util

    sys.path.insert(0, str(CI_GPU.parent))
    try:
        loader = importlib.machinery.SourceFileLoader("ci_gpu", str(CI_GPU))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader("ci_gpu", loader))
        loader.exec_module(module)
    finally:
        sys.path.remove(str(CI_GPU.parent))
    return module


def test_ci_gpu_times_bfloat16_only_where_cupy_has_it():
    ci_gpu = _ci_gpu_module()
    args = SimpleNamespace(only=["text-16", "text-bf16"])
    run_steps, skipped = ci_gpu.plan_steps(args, {"gpus": 1, "cupy": "14.2.0"})
    assert run_steps == ["text-16"] and "no bfloat16" in skipped["text-bf16"]
    run_steps, skipped = ci_gpu.plan_steps(args, {"gpus": 1, "cupy_bfloat16": True})
    assert run_steps == ["text-16", "text-bf16"] and not skipped


def test_ci_gpu_runs_the_pytest_steps_on_workers_when_asked(tmp_path):
    out = run(CI_GPU, "--dry-run", "--workers", "6", "--only", "matrix", "--only", "fuzz")
    assert "ci/matrix cupy -- -n 6" in out
    assert "test_fused_fuzz.py --backend cupy -q -p no:cacheprovider -n 6" in out
    assert " -n " not in run(CI_GPU, "--dry-run", "--workers", "1", "--only", "matrix")
    ci_gpu = _ci_gpu_module()  # by default, as many as the machine has cores to spare
    assert ci_gpu.workers_for({"cpus": 16, "xdist": True}) == 14
    assert ci_gpu.workers_for({"cpus": 64, "xdist": True}) == ci_gpu.MAX_WORKERS
    assert ci_gpu.workers_for({"cpus": 2, "xdist": True}) == 1
    assert ci_gpu.workers_for({"cpus": 16, "xdist": False}) == 1


def test_a_ci_gpu_step_out_of_time_is_interrupted_and_still_reports(monkeypatch):
    """A step past its limit gets SIGINT first (pytest then writes its summary), also where the
    shell that started ci/gpu made SIGINT ignored, and is killed only after the grace period."""
    import signal

    ci_gpu = _ci_gpu_module()
    monkeypatch.setattr(ci_gpu, "GRACE", 20)
    child = (
        "import time\n"
        "try:\n    print('started', flush=True); time.sleep(60)\n"
        "except KeyboardInterrupt:\n    print('interrupted: the summary', flush=True)\n"
    )
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a shell
    try:
        rc, output = ci_gpu.run([sys.executable, "-c", child], ROOT, dict(os.environ), 2)
    finally:
        signal.signal(signal.SIGINT, before)
    assert rc == 124 and "interrupted: the summary" in output and "stopped after 2 s" in output


def test_ci_gpu_gives_each_step_what_its_total_limit_leaves(monkeypatch, tmp_path):
    """With --total-limit a step gets at most what is left, a step that finds under MIN_STEP
    left is skipped and named so, and the report is rewritten after each step (a run stopped
    from outside still leaves one)."""
    ci_gpu = _ci_gpu_module()
    clock, limits, reports = [0.0], [], []
    report = tmp_path / "report.md"
    monkeypatch.setattr(ci_gpu.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(ci_gpu, "setup", lambda args, step: sys.executable)
    monkeypatch.setattr(ci_gpu, "probe", lambda python: {"gpus": 1, "cpus": 4})
    monkeypatch.setattr(ci_gpu, "imports_from", lambda facts, venv: True)

    def step_of_50_seconds(step, command, env, work, limit):
        limits.append((step.name, limit))
        clock[0] += 50
        step.result = "passed"
        reports.append(report.read_text() if report.exists() else "")

    monkeypatch.setattr(ci_gpu, "run_step", step_of_50_seconds)
    only = ["--only", "memory", "--only", "train-step", "--only", "compile"]
    ci_gpu.main([*only, "--total-limit", "110", "--step-limit", "100", "--report", str(report)])
    assert limits == [("memory", 100), ("train-step", 60)]
    assert reports[1].count("Running: 1 of 3 steps done") == 1
    text = report.read_text()
    assert "out of time: --total-limit 110 s was spent" in text and "Running" not in text


def test_ci_gpu_machine_facts():
    facts = json.loads(run(CI_GPU, "machine").strip().splitlines()[-1])
    assert facts["python"] and "gpus" in facts and facts["numpy"]


def test_memory(tmp_path):
    out = run("memory.py", "--quick", "--json", str(tmp_path / "m"))
    document = json.loads((tmp_path / "m").read_text())
    rows = document["workloads"]
    assert set(rows) == {
        "wide", "chain", "mlp step", "residual", "residual, checkpoint", "writes",
        "writes, recurrent",
    }  # fmt: skip
    for row in rows.values():
        assert row["peaks"]["numpy"] > 0 and row["peaks"]["tracker_gpu"] > 0
    expected = {"MLP step", "residual", "checkpoint", "writes", "writes, recurrent"}
    if isinstance(rows["wide"]["peaks"].get("autograd"), (int, float)):
        expected.add("wide")  # compared with autograd only where autograd is installed
    assert {t["target"].split(":")[0] for t in document["targets"]} >= expected
    assert "peak extra memory in MB" in out
    text = document["text step"]
    if _installed("torch"):
        assert set(text) == {"torch eager", "tracker_gpu eager", "tracker_gpu compiled"}
        assert all(peak > 0 for peak in text.values()), text
        assert "x PyTorch eager" in out


def _installed(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_compile(tmp_path):
    out = run("compile.py", "--ops", "40", "--repeats", "2", "--batch", "8", "--record-ops",
              "2000", "--json", str(tmp_path / "c"))  # fmt: skip
    document = json.loads((tmp_path / "c").read_text())
    rows = document["rows"]
    assert set(rows) == {"chain y*c", "chain mixed", "MLP step"}
    assert set(document["half regions"]) == {"float16", "bfloat16", "float32"}
    assert all(ms > 0 for row in document["half regions"].values() for ms in row.values())
    for row in rows.values():
        assert {"tracker_gpu eager", "tracker_gpu compiled", "NumPy by hand"} <= set(row)
        assert all(us > 0 for us in row.values())
    assert "target MLP step: compiled at most 1.0x NumPy by hand" in out


def test_distributed_quick(tmp_path):
    pytest.importorskip("distributed", reason='pip install "tracker-gpu[dask]"')
    out = run("distributed.py", "--quick", "--json", str(tmp_path / "d"))
    document = json.loads((tmp_path / "d").read_text())
    ooc = document["out_of_core"]
    assert ooc["relative_difference"] < 1e-10  # tracker_gpu's gradient is the hand-written one
    assert all(r["seconds"] > 0 and r["peak"] > 0 for r in ooc["runs"].values())
    assert set(document["data_parallel"]["rates"]) == {"1", "2"}
    assert document["overhead"]["cluster"] > 0
    assert len(document["targets"]) == 2
    for target in document["targets"]:
        assert isinstance(target["met"], bool)
        assert f"({'met' if target['met'] else 'MISSED'})" in out


def test_job_steps(tmp_path):
    out = run("job_steps.py", "--models", "mlp,lstm", "--steps", "1", "--rounds", "1",
              "--json", str(tmp_path / "j"))  # fmt: skip
    document = json.loads((tmp_path / "j").read_text())
    assert set(document["steps_s"]) == {"mlp", "lstm"}
    for times in document["steps_s"].values():
        assert times["eager"] > 0 and times["compiled"] > 0
    for process in ("cold", "warm"):
        calls = document["first_calls_s"][process]
        assert all(c["first"] > 0 and c["second"] > 0 for c in calls.values()), calls
    assert "target compiled faster" in out and "first calls" in out


def test_the_gpu_report_shows_and_counts_a_steps_list_of_targets():
    """A step whose figures hold a list of targets (the text job's, compile's) is counted in
    the report's summary and shown in its table."""
    sys.path.insert(0, str(ROOT / "ci"))
    from gpu_report import render

    targets = [
        {"target": "eager at least 0.8x", "value": 0.9, "met": True},
        {"target": "compiled faster", "value": 0.7, "met": False},
    ]
    step = SimpleNamespace(name="text", result="passed", note="", command="text.py", seconds=1.0,
                           tail="", output="text step", figures={"targets": targets})  # fmt: skip
    report = render({}, [step], "passed")
    assert "Performance targets: 1 met, 1 missed" in report
    assert "compiled faster" in report and "0.70 MISSED" in report


def test_a_gpu_benchmark_says_whether_a_compiled_step_was_captured():
    """`capture_of` reads each recorded program's graphs (None where it is replayed step by
    step, as every host program is) and `describe_capture` says it in words."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from gpu_measure import capture_of, describe_capture
    finally:
        sys.path.remove(str(BENCHMARKS))
    import numpy as np

    import tracker_gpu as tg

    step = tg.compile(lambda x: tg.sum(x @ x))
    step(np.eye(2))
    assert capture_of(step) == [None]
    assert describe_capture([None]) == "replayed step by step (no CUDA graph)"
    captured = describe_capture([{"graphs": 6, "library_calls": 5}])
    assert captured.startswith("6 CUDA graphs, 5 library calls")
