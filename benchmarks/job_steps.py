"""The main job's training steps, eager and compiled (`--compile`), for each of its models, and
what the compiled step's first call costs (recording, generating, building), in one run.

    python benchmarks/job_steps.py [--models mlp,cnn,lstm] [--steps 20] [--rounds 5]
                                   [--batch-size 32] [--json PATH]

Each model is the job's (`tracker_gpu.train.models`), with its recipe's optimiser and schedule
(`train.loop.schedule_for`), on the job's first training batch of the digits; the eager step is
`train.loop.train_step`, the compiled one `train.loop.compiled_step()`, both from the same
weights. They are timed in turn, `--steps` steps each, for `--rounds` rounds (interleaved, so
load from other processes falls on both alike): the median time per step and the ratio.
Target (issue 24): the compiled step faster than the eager one for every model.

The first calls are measured in two fresh processes sharing an empty kernel cache (a temporary
`TRACKER_GPU_CACHE`): the first process records and builds the fused kernels with the C++
compiler, the second finds them on disk; each reports its compiled step's first call (recording
and building), its second (the first replay, which generates the replay's Python) and one
eager step, in seconds. BLAS on one thread. Not measured: memory (memory.py), the GPU.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from threadpoolctl import threadpool_limits

from tracker_gpu import optim
from tracker_gpu.train.data import digits
from tracker_gpu.train.loop import compiled_step, schedule_for, train_step
from tracker_gpu.train.models import RECIPES


def contenders(name, batch_size, data):
    """`{kind: run()}`: one training step each, eager and compiled, from the same weights."""
    recipe = RECIPES[name]
    x, y = data.train_x[:batch_size], data.train_y[:batch_size]
    steps = -(-data.train_x.shape[0] // batch_size)
    runs = {}
    for kind, step in (("eager", train_step), ("compiled", compiled_step())):
        model = recipe.build(rng=np.random.default_rng(0))
        held = {"model": model, "state": optim.setup(schedule_for(recipe.lr, recipe.epochs,
                                                                  steps), model)}  # fmt: skip

        def run(step=step, held=held):
            loss, _, held["model"], held["state"] = step(held["model"], held["state"], x, y)
            return loss

        runs[kind] = run
    return runs


def per_step(runs, steps, rounds):
    """The median seconds per step of each run, interleaved round by round."""
    for run in runs.values():
        run()  # the compiled step records here
        run()  # and generates its replay here
    times = {kind: [] for kind in runs}
    for _ in range(rounds):
        for kind, run in runs.items():
            began = time.perf_counter()
            for _ in range(steps):
                run()
            times[kind].append((time.perf_counter() - began) / steps)
    return {kind: statistics.median(t) for kind, t in times.items()}


def first_calls(names, batch_size):
    """In this process: each model's compiled first and second call and one eager step, in s."""
    data, found = digits(), {}
    for name in names:
        runs = contenders(name, batch_size, data)
        found[name] = {}
        for label, kind in (("first", "compiled"), ("second", "compiled"), ("eager", "eager")):
            began = time.perf_counter()
            runs[kind]()
            found[name][label] = time.perf_counter() - began
    return found


def in_fresh_processes(names, batch_size):
    """`first_calls` in two new processes sharing a kernel cache that starts empty."""
    out = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TRACKER_GPU_CACHE=cache)
        for _ in range(2):
            command = [sys.executable, __file__, "--first-calls", "--models", ",".join(names),
                       "--batch-size", str(batch_size)]  # fmt: skip
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            out.append(json.loads(done.stdout.splitlines()[-1]))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,lstm")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--first-calls", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = args.models.split(",")
    with threadpool_limits(limits=1, user_api="blas"):
        if args.first_calls:  # one of the fresh processes of `in_fresh_processes`
            print(json.dumps(first_calls(names, args.batch_size)))
            return None
        data = digits()
        steps = {name: per_step(contenders(name, args.batch_size, data), args.steps,
                                args.rounds) for name in names}  # fmt: skip
    print(f"the job's steps, batch {args.batch_size}, median of {args.rounds} rounds of "
          f"{args.steps} steps, ms per step:")  # fmt: skip
    for name, t in steps.items():
        ratio = t["compiled"] / t["eager"]
        print(
            f"  {name:5s} eager {t['eager'] * 1e3:7.2f}  compiled {t['compiled'] * 1e3:7.2f} "
            f"({ratio:.2f}x)  target compiled faster: {'met' if ratio < 1 else 'MISSED'}"
        )
    cold, warm = in_fresh_processes(names, args.batch_size)
    print("first calls, s (a fresh process with an empty kernel cache; then another process):")
    for name in names:
        a, b = cold[name], warm[name]
        print(
            f"  {name:5s} first {a['first']:.2f} / {b['first']:.2f}, second "
            f"{a['second']:.3f} / {b['second']:.3f}, one eager step {a['eager']:.4f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps_s": steps, "first_calls_s": {"cold": cold, "warm": warm}}, f)
    return steps


if __name__ == "__main__":
    main()
