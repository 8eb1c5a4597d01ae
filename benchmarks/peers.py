"""tracker_gpu against its peers: PyTorch CPU autograd, HIPS autograd, MyGrad, NumPy by hand.

    python benchmarks/peers.py [--quick] [--only WORKLOAD] [--out DIR] [--threads 1]

Every workload runs for each library in this one process, on the same inputs: a warm-up, then
the median of repeats, the libraries interleaved so that a slow spell of the machine hits them
alike (the figures the targets use), and again in warm blocks (each library's calls back to
back, as a training loop makes them: a second table). Every figure is a ratio to the
hand-written NumPy gradient measured in the same run, with the absolute time beside it. Each
library's answer is checked against the hand-written one before it is timed (that first call is
the warm-up). While a row is timed, the objects that existed before it are frozen out of the
garbage collector's sight (gc.freeze), so a collection costs what the graph being built costs,
not the four libraries imported here. A peer that is not installed is reported, not an error.
The tables are printed and written to `benchmarks/out/peers.json` and `peers.md`, followed by
the targets of issues 7 and 32 marked met or missed.

This file is the command line, the run and the report (table, JSON, Markdown, targets); the
workloads are in `peer_workloads.py`, and how they are timed and checked in `peer_measure.py`.

Peak extra memory is what a call allocates above what it started with, its results (the
gradient) included: NumPy by hand therefore scores 1 array of x's size. It is measured with
tracemalloc for the NumPy-based libraries; tracemalloc does not see PyTorch's allocator, so
PyTorch's is read from the process's resident high-water mark (Linux only, and only for large
arrays, which are mapped and unmapped whole; n/a elsewhere).

Workloads (`--only` takes these names):
  per-op          forward+backward of a 1,000-op elementwise chain on a 1-element float64 array
  sum-of-squares  value and gradient of sum(x**2) and of sumabs2(x) (peers: dot(x, x)) for
                  10^7 float64, time and peak extra memory in units of x's size
  mlp-step        one training step of benchmarks/train_step.py's MLP (784-128-10, batch 64,
                  float32, tanh, logit cross-entropy, Adam)
  graphs          a 100,000-op chain on a 16-element array, and a wide graph (one 1,000-element
                  input used 10,000 times, summed): time and peak memory
  hessian         hessian and hvp of the Rosenbrock function in 100 dimensions
"""

import argparse
import json
import os
import platform
import sys
import time
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import train_step
from peer_measure import LIBS, NOT_INSTALLED, PEERS
from peer_workloads import WORKLOADS

# --- settings
FULL = {
    "chain_ops": 1000,
    "chain_repeats": 31,
    "sumsq_size": 10**7,
    "sumsq_repeats": 11,
    "mlp_repeats": 200,
    "long_ops": 100_000,
    "wide_uses": 10_000,
    "graph_repeats": 3,
    "hessian_dim": 100,
    "hessian_repeats": 11,
}
QUICK = {
    "chain_ops": 1000,
    "chain_repeats": 5,
    "sumsq_size": 10**6,
    "sumsq_repeats": 3,
    "mlp_repeats": 20,
    "long_ops": 10_000,
    "wide_uses": 1_000,
    "graph_repeats": 1,
    "hessian_dim": 20,
    "hessian_repeats": 3,
}


def installed():
    """{library: version, or None where it cannot be imported}."""
    found = {"numpy": np.__version__, "tracker_gpu": _version("tracker-gpu")}
    for name in PEERS:
        try:
            import_module(name)
        except ImportError:
            found[name] = None
        else:
            found[name] = _version(name)
    return found


def _version(dist):
    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


# --- targets
def targets(rows):
    """The targets of issues 7 and 32, each `{"target", "measured", "met"}` (`met` None where
    unmeasured). Issue 32's are measured warm (each library's calls in blocks), the interleaved
    figure shown beside."""
    out = []

    def add(target, measured, met):
        out.append({"target": target, "measured": measured, "met": met})

    def against_torch(target, row, limit):
        warm, interleaved = (row.ratio("tracker_gpu", to="torch", warm=w) for w in (True, False))
        if warm is None:
            return add(target, "n/a", None)
        measured = f"{warm:.2f}x PyTorch warm ({interleaved:.2f}x interleaved)"
        add(target, measured, warm <= limit)

    for row in rows:
        ratio = row.ratio("tracker_gpu")
        if row.workload == "per-op":
            against_torch(f"{row.name}: at most 0.4x PyTorch", row, 0.4)
        if row.workload == "hessian" and row.case.startswith("hvp"):
            against_torch(f"{row.name}: at most 1.0x PyTorch's double backward", row, 1.0)
        if row.workload == "sum-of-squares" and ratio is not None:
            if row.kind == "memory":
                add(f"{row.name}: at most 2 arrays of x", f"{ratio:.2f} arrays", ratio <= 2.0)
            else:
                limit = 1.1 if row.case.startswith("sumabs2") else 2.0
                add(f"{row.name}: at most {limit}x by hand", f"{ratio:.2f}x", ratio <= limit)
        if row.workload == "mlp-step" and ratio is not None:
            add(f"{row.name}: at most 1.15x by hand", f"{ratio:.2f}x", ratio <= 1.15)
    for row in rows:
        if row.kind != "time":
            continue
        against = {lib: row.ratio("tracker_gpu", to=lib) for lib in PEERS}
        against = {lib: r for lib, r in against.items() if r is not None}
        if not against:
            add(f"{row.name}: not slower than any peer", "n/a", None)
            continue
        fastest = max(against, key=against.get)
        measured = f"{against[fastest]:.2f}x {LIBS[fastest]}, the fastest peer"
        add(f"{row.name}: not slower than any peer", measured, against[fastest] <= 1.0)
    return out


# --- output
def cell(row, lib, warm=False):
    r = row.results.get(lib)
    if r is None:
        return ""
    if row.value(lib, warm) is None:
        return r["status"] if r["value"] is None else "n/a"
    value = row.value(lib, warm) * row.scale
    shown = f"{value:.3g}" if value < 100 else f"{value:.0f}"
    ratio = row.ratio(lib, warm=warm)
    if lib == "numpy" or ratio is None or row.kind == "memory":
        return shown
    return f"{shown} ({ratio:.2f}x)"


def table(rows, warm=False):
    """The table of the figures (`warm`: the time rows, timed in warm blocks)."""
    header = ["workload", "case", "unit"] + list(LIBS.values())
    body, last = [], None
    for row in rows:
        if warm and row.kind != "time":
            continue
        first = row.workload if row.workload != last else ""
        body.append([first, row.case, row.unit] + [cell(row, lib, warm) for lib in LIBS])
        last = row.workload
    return header, body


def text_table(header, body):
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


def markdown_table(header, body):
    line = lambda r: "| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |"
    return "\n".join([line(header), line(["---"] * len(header)), *map(line, body)])


def mark(met):
    return "n/a" if met is None else "MET" if met else "MISSED"


def machine(threads):
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "threads": threads,
        "blas": train_step.blas_kernels(),
        "system": platform.platform(),
        "python": platform.python_version(),
    }


LEGEND = (
    "workloads[name] is a list of rows; results[library] has status ('ok', 'not installed', "
    "'not supported', 'n/a', 'failed (...)') and value: the median seconds of one call (time "
    "rows; times: every repeat, best: the fastest) or the peak extra bytes (memory rows); "
    "display is value in the row's unit, ratio is value / NumPy by hand's value in this run; "
    "warm, warm_display and warm_ratio: the same for the calls timed in warm blocks (time rows; "
    "warm_times: every block's seconds per call); the targets use the interleaved figures"
)


WARM = (
    "The same calls timed in warm blocks (each library's calls back to back, about 20 ms a "
    "block, the libraries in turn block by block), the median of a call; the table above and "
    "the targets alternate the libraries call by call."
)


def report(rows, goals, info, versions, settings, out_dir):
    header, body = table(rows)
    _, warm_body = table(rows, warm=True)
    goal_rows = [[g["target"], g["measured"], mark(g["met"])] for g in goals]
    goal_header = ["target (issues 7 and 32)", "measured", "met?"]
    ratios = "Each figure: absolute, then its ratio to NumPy by hand measured in this run."
    versions_line = ", ".join(f"{LIBS[k]} {v or NOT_INSTALLED}" for k, v in versions.items())
    about = (
        f"{info['cpu']}, {info['cores']} cores, BLAS and PyTorch on {info['threads']} thread(s), "
        f"{info['blas']}; "
        f"Python {info['python']}; {versions_line}"
    )
    print(f"\n{about}\n{ratios}\n")
    print(text_table(header, body))
    print(f"\n{WARM}\n")
    print(text_table(header, warm_body))
    print()
    print(text_table(goal_header, goal_rows))
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "legend": LEGEND,
        "machine": info,
        "versions": versions,
        "settings": settings,
        "workloads": {},
        "targets": goals,
    }
    for row in rows:
        document["workloads"].setdefault(row.workload, []).append(row.as_dict())
    (out_dir / "peers.json").write_text(json.dumps(document, indent=2) + "\n")
    md = [
        "# tracker_gpu against its peers",
        "",
        f"{about}. {ratios}",
        "",
        markdown_table(header, body),
        "",
        WARM,
        "",
        markdown_table(header, warm_body),
        "",
        markdown_table(goal_header, goal_rows),
        "",
        "Reproduce: `pip install '.[bench]' && python benchmarks/peers.py`",
        "",
    ]
    (out_dir / "peers.md").write_text("\n".join(md))
    print(f"\nwritten: {out_dir / 'peers.json'}, {out_dir / 'peers.md'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller sizes")
    parser.add_argument("--only", choices=list(WORKLOADS), action="append", help="repeatable")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    parser.add_argument("--threads", type=int, default=1, help="BLAS and PyTorch threads")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    versions = installed()
    available = {lib: v is not None for lib, v in versions.items()}
    if available["torch"]:
        import torch

        torch.set_num_threads(args.threads)
    rows = []
    started = time.perf_counter()
    with train_step.blas_threads(args.threads):
        for name in args.only or WORKLOADS:
            print(f"{name} ...", end=" ", file=sys.stderr, flush=True)
            start = time.perf_counter()
            rows += WORKLOADS[name](settings, available)
            print(f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(f"measured in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    report(rows, targets(rows), machine(args.threads), versions, settings, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
