"""What the command lines of both jobs (digits and text) share: numbers checked as argparse
reads them, the plot's path, stopping on SIGINT and SIGTERM after the current step, and
reading and editing the arguments.

>>> at_least_one = number(int, 1, strict=False)
>>> at_least_one("3")
3
>>> without(["--epochs", "3", "--resume", "runs"], "--resume")
['--epochs', '3']
"""

import argparse
import contextlib
import importlib
import math
import os
import signal
import threading
from pathlib import Path

import numpy as np

from .loop import Interrupted

__all__ = [
    "number",
    "LEARNING_RATE",
    "check_plot",
    "check_folders",
    "check_modules",
    "Stop",
    "signals",
    "option",
    "without",
]


def number(kind, low, *, strict=True, high=math.inf):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if (value <= low if strict else value < low) or value >= high:
            bound = f"more than {low}" if strict else f"at least {low}"
            if high < math.inf:
                bound += (
                    f" and less than {high:g}" if type(high) is float else f" and less than {high}"
                )
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


# A learning rate: positive, and finite in float32, the dtype the jobs train in
LEARNING_RATE = number(float, 0, high=float(np.finfo(np.float32).max))


def check_plot(p, args):
    if not args.plot:
        return
    if os.path.isdir(args.plot) or args.plot.endswith(("/", os.sep)):
        p.error(f"--plot: {args.plot!r} is a folder; give the plot's file, such as "
                f"{os.path.join(args.plot, 'plot.png')!r}")  # fmt: skip
    path = Path(args.plot)
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        p.error(f"--plot: matplotlib cannot write {path.suffix!r} files; give a path ending "
                f"in one of {', '.join('.' + f for f in sorted(formats))}")  # fmt: skip
    if not path.parent.is_dir():
        p.error(f"--plot: the folder {str(path.parent)!r} does not exist; create it, or pass "
                "--plot ''")  # fmt: skip
    if not os.access(path.parent, os.W_OK):  # said before the training, not after it
        p.error(f"--plot: the folder {str(path.parent)!r} cannot be written; choose another, "
                "or pass --plot ''")  # fmt: skip
    args.plot = str(path)


def check_folders(p, args, files, resumed=()):
    """`--save DIR` and `--resume DIR` of a job writing the checkpoints `files` (names in DIR):
    neither an empty name (which would save or resume nothing, silently); DIR a folder that is
    made now if it is missing, where none of `files` is a folder or a checkpoint left by an
    earlier run (a stop of this run would leave it beside its own, and the resume line would go
    on from both), but for the checkpoints this run goes on from (`resumed`, paths)."""
    for flag in ("save", "resume"):
        if getattr(args, flag) is not None and not getattr(args, flag).strip():
            p.error(f"--{flag}: give a folder; an empty name would {flag} nothing")
    if not args.save:
        return
    if os.path.exists(args.save) and not os.path.isdir(args.save):
        p.error(f"--save: {args.save!r} is a file; give a folder for the checkpoints")
    try:
        os.makedirs(args.save, exist_ok=True)
    except OSError as error:
        p.error(f"--save: cannot make the folder {args.save!r} ({error.strerror}); give a "
                "folder that can be written")  # fmt: skip
    if not os.access(args.save, os.W_OK):
        p.error(f"--save: the folder {args.save!r} cannot be written; give another")
    ours = {os.path.realpath(path) for path in resumed}
    for name in files:
        path = os.path.join(args.save, name)
        if os.path.isdir(path):
            p.error(f"--save: {path!r} is a folder, where this run writes a checkpoint; move it "
                    "away or give another --save folder")  # fmt: skip
        if os.path.exists(path) and os.path.realpath(path) not in ours:
            p.error(f"--save: {path} holds a checkpoint of an earlier run, which this run would "
                    f"leave beside its own; pass --resume {args.save} to go on with that run, or "
                    "another --save folder (or delete that file) to start anew")  # fmt: skip


class Stop:
    """Asked after each step: the number of the signal that came (SIGINT, SIGTERM), else None.
    While `training` is false (connecting, loading), a signal stops the job at once."""

    def __init__(self):
        self.signum, self.training = None, False

    def __call__(self):
        return self.signum


@contextlib.contextmanager
def signals(before_training=None):
    """Within the block, SIGINT and SIGTERM ask the job to stop after the current step (the
    `Stop` yielded says so); before training starts, they stop it at once: `Interrupted` is
    raised, or `before_training(signum)` is called, which ends the process itself (an exception
    raised into whatever the main thread waits in, Dask's connecting client, may be caught
    there). A second signal acts as it would without this. Outside the main thread, nothing is
    caught."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        stop.signum = signum
        for s, old in previous.items():  # a second signal acts as it would have
            signal.signal(s, old)
        if not stop.training:
            if before_training is not None:
                before_training(signum)
            raise Interrupted(signum, "the job", 0, 0, None)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield stop
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def option(argv, option):
    """The value of `option` in `argv` (`--opt v` or `--opt=v`), the last one, or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
    return value


def without(argv, option):
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def check_modules(p, args, needs=()):
    """Refuse, as an argparse error, an option whose module is missing: the progress bar's
    tqdm, the plot's matplotlib, and `needs` (`(module, message)` pairs) of the job's own."""
    needs = list(needs)
    if not args.no_progress:
        needs.append(("tqdm", "the progress bar needs tqdm: pip install tqdm, or --no-progress"))
    if args.plot:
        needs.append(("matplotlib", "the plot needs matplotlib: pip install matplotlib, or "
                      "--plot ''"))  # fmt: skip
    for module, message in needs:
        try:
            importlib.import_module(module)
        except ImportError:
            p.error(message)
