"""The Markdown report of ci/gpu: the machine, the steps, every figure with its target."""

import json
import subprocess
from datetime import datetime, timezone

from gpu_probe import MISSING_THERE, PROJECT, ROOT

TAIL_LINES = 60
BENCHMARKS = {  # the steps whose tables the report shows, with their titles
    "kernels": "Kernels: `benchmarks/kernels.py`",
    "memory": "Peak memory: `benchmarks/memory.py --backend cupy`",
    "train-step": "MLP training step: `benchmarks/train_step.py --backend cupy`",
    "compile": "MLP step replayed as a CUDA graph: `benchmarks/compile.py --backend cupy`",
    "text": "The text job's step: `benchmarks/text.py --backend cupy`",
    "text-16": "The text job's step in float16: `benchmarks/text.py --backend cupy --precision 16`",
    "text-bf16": "The text job's step in bfloat16: `benchmarks/text.py --backend cupy "
    "--precision bf16`",
}


def render(facts, steps, status):
    lines = ["# tracker_gpu on a GPU", "", f"**{status}**", ""]
    targets = _targets(steps)
    if targets:
        met = sum(t["met"] for t in targets)
        lines += [
            f"Performance targets: {met} met, {len(targets) - met} missed (a missed "
            "target is not a failure).",
            "",
        ]
    lines += [
        f"Written by `ci/gpu` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC{_commit()}.",
        "",
    ]
    lines += _machine(facts) + _steps(steps)
    by_name = {s.name: s for s in steps}
    lines += _tests(by_name) + _benchmarks(by_name) + _main_job(by_name)
    lines += _second_gpu(by_name, facts) + _failures(steps) + _raw(steps)
    return "\n".join(lines) + "\n"


def _commit():
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    )
    return f", commit {done.stdout.strip()}" if done.returncode == 0 else ""


def _table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows] + [""]


def _machine(facts):
    gpus = facts.get("gpus", 0)
    names = ", ".join(facts.get("names", [])) or f"none ({facts.get('why', 'unknown')})"
    torch = facts.get("torch", "n/a")
    if facts.get("torch_cuda"):
        torch += f" (CUDA {facts['torch_cuda']}, sees the GPU: {facts.get('torch_sees_gpu')})"
    rows = [
        ("device", f"{gpus}: {names}" if gpus else names),
        (
            "driver",
            f"{facts.get('driver') or 'n/a'} (CUDA driver API "
            f"{facts.get('cuda_driver_api', 'n/a')})",
        ),
        ("CUDA runtime", facts.get("cuda_runtime", "n/a")),
        ("CuPy", facts.get("cupy")),
        ("PyTorch", torch),
        ("NumPy", facts.get("numpy")),
        ("Python", facts.get("python")),
        ("tracker_gpu", f"{facts.get(PROJECT)} ({facts.get('tracker_gpu_file')})"),
        ("versions read by", facts.get("probed_with")),
        *((name, facts.get(name)) for name in MISSING_THERE),
    ]
    return ["## Machine", ""] + _table(("", ""), rows)


def _steps(steps):
    rows = [
        (s.name, s.result, f"{s.seconds:.0f}", s.note, f"`{s.command}`" if s.command else "")
        for s in steps
    ]
    return ["## Steps", ""] + _table(("step", "result", "seconds", "note", "command"), rows)


def _tests(by_name):
    rows = [
        (title, f["passed"], f["failed"], f["skipped"], f"{s.seconds:.0f}")
        for name, title in (
            ("matrix", "the CuPy row of the test matrix"),
            ("fuzz", "the fused-vs-generic fuzzer on CuPy"),
        )
        if (s := by_name.get(name)) and (f := s.figures)
    ]
    if not rows:
        return []
    return ["## Tests", ""] + _table(("suite", "passed", "failed", "skipped", "seconds"), rows)


def _benchmarks(by_name):
    """Each benchmark's tables as it printed them, then its targets, met or missed."""
    lines = []
    for name, title in BENCHMARKS.items():
        step = by_name.get(name)
        if step is not None and step.output:
            lines += [f"## {title}", "", "```", step.output.rstrip(), "```", ""]
            lines += _target_table(step.figures)
    return lines


def _verdict(target):
    return f"{target['value']:.2f} {'met' if target['met'] else 'MISSED'}"


def _target_table(doc):
    if doc.get("workloads"):
        rows = [
            (r["name"], t["target"], _verdict(t)) for r in doc["workloads"] for t in r["targets"]
        ]
        return _table(("workload", "target", "ratio"), rows)
    if isinstance(doc.get("targets"), list):
        return _table(("target", "ratio"), [(t["target"], _verdict(t)) for t in doc["targets"]])
    target = doc.get("target")
    return _table(("target", "ratio"), [(target["target"], _verdict(target))]) if target else []


def _main_job(by_name):
    runs = [
        (device, by_name[name].figures)
        for device, name in (("GPU 0", "train"), ("GPU 1", "train-gpu1"))
        if name in by_name and by_name[name].figures
    ]
    if not runs:
        return []
    models = list(dict.fromkeys(m for _, figures in runs for m in figures))
    rows = [
        (
            m,
            *(
                f"{f[m]['test_accuracy']:.3f} ({f[m]['seconds']:.1f} s)" if m in f else "n/a"
                for _, f in runs
            ),
        )
        for m in models
    ]
    header = ("model", *(f"test accuracy, {device}" for device, _ in runs))
    return ["## Main job: `python -m tracker_gpu.train --backend cupy`", ""] + _table(header, rows)


def _second_gpu(by_name, facts):
    lines = ["## A second GPU", ""]
    check = by_name.get("device1")
    gpus = facts.get("gpus", 0)
    if gpus < 2:
        return lines + [
            f"{'Only one GPU' if gpus else 'No GPU'}: the main job on `--device gpu:1` and the "
            "check of a gradient on GPU 1 were NOT run.",
            "",
        ]
    if check is None or not check.figures:
        return lines + ["The check of a gradient on GPU 1 did not report (see Steps).", ""]
    f = check.figures
    return lines + [
        f"Gradients of `sum(tanh(x + b) * w)` for data on GPU 1, issued with GPU 0 "
        f"current: {'on GPU 1 and equal to GPU 0' if f['ok'] else 'WRONG'} (bitwise "
        f"equal: {f['bitwise_equal']}, max difference {f['max_abs_difference']:.3g}); "
        f"fused launches on GPU 1: {', '.join(f['launches']['1'])}.",
        "",
    ]


def _failures(steps):
    failed = [s for s in steps if s.result == "failed"]
    if not failed:
        return []
    lines = ["## Failures", ""]
    for s in failed:
        lines += [f"### {s.name}: {s.note}", ""]
        if s.tail:
            lines += [
                f"The last {TAIL_LINES} lines of its output:",
                "",
                "```",
                s.tail.rstrip(),
                "```",
                "",
            ]
    return lines


def _raw(steps):
    lines = []
    for s in steps:
        if s.name in BENCHMARKS and s.figures:
            lines += [
                "<details><summary>raw figures of " + s.name + " (JSON)</summary>",
                "",
                "```json",
                json.dumps(s.figures, indent=1),
                "```",
                "",
                "</details>",
                "",
            ]
    return lines


def _targets(steps):
    found = []
    for s in steps:
        for r in s.figures.get("workloads", []):
            found += [{"workload": r["name"], **t} for t in r.get("targets", [])]
        if s.figures.get("target"):
            found.append(s.figures["target"])
        if isinstance(s.figures.get("targets"), list) and not s.figures.get("workloads"):
            found += s.figures["targets"]  # as `_target_table` shows them
    return found
