"""The command line of the main job: every argument checked before any work, with argparse's
own errors, then each model trained, its test accuracy printed and the plot written."""

import argparse
import contextlib
import importlib
import os
import sys
from pathlib import Path

from .data import SKLEARN_MISSING, digits
from .devices import select_backend
from .loop import compiled_step, data_parallel_step, train, train_step
from .models import RECIPES
from .plots import plot

__all__ = ["main", "run", "parser"]

DESCRIPTION = "Train small models on scikit-learn's handwritten digits with tracker_gpu."


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def parser():
    """The argument parser of `python -m tracker_gpu.train`."""
    p = argparse.ArgumentParser(prog="python -m tracker_gpu.train", description=DESCRIPTION)
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "torch", "cupy"])
    p.add_argument("--device", default="auto", help="auto (default), cpu, gpu or gpu:N")
    p.add_argument("--models", default="mlp,cnn,lstm",
                   help=f"comma-separated, from {', '.join(RECIPES)} (default: all)")  # fmt: skip
    p.add_argument("--epochs", type=_positive(int),
                   help="epochs per model (default: 20 mlp, 15 cnn, 15 lstm)")  # fmt: skip
    p.add_argument("--batch-size", type=_positive(int), default=32)
    p.add_argument("--lr", type=_positive(float), help="Adam's learning rate (default per model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="training.png", help="PNG path ('' for no plot)")
    p.add_argument(
        "--save",
        metavar="DIR",
        help="write a checkpoint of each model to DIR/<model>.npz after every epoch",
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="go on from the checkpoints DIR/<model>.npz (as --save wrote them)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")  # fmt: skip
    p.add_argument(
        "--compile",
        action="store_true",
        help="record each model's training step once with tg.compile and replay it",
    )
    p.add_argument(
        "--workers",
        type=_positive(int),
        help="train data-parallel on a local Dask cluster of N worker processes",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="train data-parallel on the running Dask cluster at ADDRESS (tcp://host:8786)",
    )
    return p


def _checked(p, argv):
    """The parsed arguments, every one checked before any work (argparse's errors exit 2)."""
    args = p.parse_args(argv)
    args.names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.names if m not in RECIPES]
    if unknown or not args.names:
        p.error(f"--models: unknown {unknown}; choose from {', '.join(RECIPES)}")
    _check_modules(p, args)
    folder = Path(args.plot).parent if args.plot else None
    if folder is not None and not folder.is_dir():
        p.error(f"--plot: the folder {str(folder)!r} does not exist; create it, or pass --plot ''")
    if args.save and os.path.exists(args.save) and not os.path.isdir(args.save):
        p.error(f"--save: {args.save!r} is a file; give a folder for the checkpoints")
    for name in args.names if args.resume else ():
        if not os.path.isfile(_checkpoint(args.resume, name)):
            p.error(f"--resume: no checkpoint {_checkpoint(args.resume, name)!r}; train with "
                    f"--save {args.resume} first, or leave {name} out of --models")  # fmt: skip
    try:
        args.where = select_backend(args.backend, args.device)
    except ValueError as error:
        p.error(str(error))
    _check_cluster(p, args)
    return args


def _check_cluster(p, args):
    if not (args.workers or args.scheduler):
        return
    if args.workers and args.scheduler:
        p.error("--workers starts a cluster, --scheduler joins one: pass one of them")
    if args.compile:
        p.error("--compile records a step on this machine; it cannot be combined with "
                "--workers or --scheduler")  # fmt: skip
    if args.where[0] != "numpy":
        p.error("--workers and --scheduler train on NumPy arrays: pass --backend numpy")
    try:
        importlib.import_module("distributed")
    except ImportError:
        p.error('data-parallel training needs dask.distributed: pip install "tracker-gpu[dask]"')


def _check_modules(p, args):
    needs = [("sklearn.datasets", SKLEARN_MISSING)]
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


def _checkpoint(folder, name):
    return os.path.join(folder, f"{name}.npz")


def main(argv=None):
    """The console script: train, print the test accuracies, write the plot."""
    run(sys.argv[1:] if argv is None else argv)


def run(argv):
    """`main`, returning the results."""
    args = _checked(parser(), argv)
    xp, device, where = args.where
    if args.save:
        os.makedirs(args.save, exist_ok=True)
    data = digits(xp=xp, device=device, seed=args.seed)
    print(
        f"digits: {data.train_x.shape[0]} training and {data.test_x.shape[0]} test images "
        f"of 8x8 pixels; {where}",
        flush=True,
    )
    results = []
    with _cluster(args) as client:
        for name in args.names:
            step = _step_for(args, client)
            results.append(_train_one(args, name, data, step))
    if args.plot:
        plot(results, args.plot)
        print(f"plot written to {args.plot}")
    return results


def _step_for(args, client):
    if client is not None:
        return data_parallel_step(client)
    return compiled_step() if args.compile else train_step


def _cluster(args):
    """The Dask client of `--workers` or `--scheduler`, for the whole run; else None."""
    if not (args.workers or args.scheduler):
        return contextlib.nullcontext()
    from tracker_gpu.distributed import cluster

    return cluster(workers=args.workers, scheduler=args.scheduler)


def _train_one(args, name, data, step):
    """Train model `name`, print its test accuracy, and return its `Result`."""
    xp, device, _ = args.where
    result = train(
        name,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        xp=xp,
        device=device,
        data=data,
        progress=not args.no_progress,
        save=_checkpoint(args.save, name) if args.save else None,
        resume=_checkpoint(args.resume, name) if args.resume else None,
        step=step,
    )
    print(f"{name}: test accuracy {result.test_accuracy:.3f} ({result.seconds:.1f} s)",
          flush=True)  # fmt: skip
    return result
