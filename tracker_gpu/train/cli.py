"""The command line of the main job: every argument checked before any work, with argparse's
own errors (the checkpoints of `--resume` and the cluster of `--scheduler` included), then each
model trained, its test accuracy printed and the plot written. SIGINT and SIGTERM stop the job
after the current step, with a checkpoint under `--save` and the command that resumes."""

import argparse
import contextlib
import importlib
import os
import shlex
import signal
import sys
import warnings

import numpy as np

from tracker_gpu.distributed import STEP_TIMEOUT, StalledWorkers, StalledWorkerWarning
from tracker_gpu.files import SaveError

from .arguments import (
    LEARNING_RATE,
    check_folders,
    check_modules,
    check_plot,
    number,
    option,
    signals,
    without,
)
from .data import SKLEARN_MISSING, digits
from .devices import keep_freed_memory, select_backend
from .loop import (
    TEST_FRACTION,
    Interrupted,
    checkpoint_info,
    compiled_step,
    data_parallel_step,
    mixed_step,
    train,
    train_step,
)
from .mixed import DEFAULT, PRECISIONS, described
from .models import RECIPES
from .plots import plot

__all__ = ["main", "run", "parser"]

PROG = "python -m tracker_gpu.train"
DESCRIPTION = "Train small models on scikit-learn's handwritten digits with tracker_gpu."
BATCH_SIZE, SEED = 32, 0  # the defaults, when neither the command line nor a checkpoint says
CONNECT_TIMEOUT = 10  # seconds to reach the scheduler of --scheduler


def parser():
    """The argument parser of `python -m tracker_gpu.train`."""
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, allow_abbrev=False,
                                epilog=f"The text job, a character-level transformer: {PROG} "
                                "text --help")  # fmt: skip
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "torch", "cupy"])
    p.add_argument("--device", default="auto", help="auto (default), cpu, gpu or gpu:N")
    p.add_argument("--models", default="mlp,cnn,lstm",
                   help=f"comma-separated, from {', '.join(RECIPES)} (default: all)")  # fmt: skip
    p.add_argument("--epochs", type=number(int, 0, high=2**31),
                   help="the total number of epochs per model, a resumed run included "
                        "(default: 20 mlp, 15 cnn, 15 lstm, or the checkpoint's)")  # fmt: skip
    p.add_argument("--batch-size", type=number(int, 0),
                   help=f"default {BATCH_SIZE}, or the checkpoint's")  # fmt: skip
    p.add_argument(
        "--lr",
        type=LEARNING_RATE,
        help="Adam's learning rate (default per model, or the checkpoint's)",
    )
    p.add_argument("--seed", type=number(int, 0, strict=False, high=2**32),
                   help=f"the data split and initial weights (default {SEED}, or the "
                        "checkpoint's)")  # fmt: skip
    p.add_argument("--plot", default="training.png",
                   help="the plot's path; its suffix says the format (none: .png; '' for no "
                        "plot)")  # fmt: skip
    p.add_argument(
        "--save",
        metavar="DIR",
        help="write a checkpoint of each model to DIR/<model>.npz after every epoch",
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="go on from the checkpoints DIR/<model>.npz (as --save wrote them); models "
        "without one start from scratch",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")  # fmt: skip
    p.add_argument(
        "--compile",
        action="store_true",
        help="record each model's training step once with tg.compile and replay it",
    )
    p.add_argument("--precision", choices=list(PRECISIONS),
                   help="32 (float32), 16 (float16, the loss scaled dynamically) or bf16 "
                        "(bfloat16): the dtype the models compute in, their weights kept in "
                        "float32 (default 32, or the checkpoint's)")  # fmt: skip
    p.add_argument(
        "--workers",
        type=number(int, 0),
        help="train data-parallel on a local Dask cluster of N worker processes",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="train data-parallel on the running Dask cluster at ADDRESS (tcp://host:8786)",
    )
    p.add_argument(
        "--step-timeout",
        metavar="SECONDS",
        type=number(float, 0),
        help="with --workers or --scheduler: a step that waits longer drops the workers that do "
        "not answer (named; their shards recomputed by the others), or stops the job when none "
        f"answers (default {STEP_TIMEOUT:g})",
    )
    return p


def _checked(p, argv):
    """The parsed arguments, every one checked before any work (argparse's errors exit 2)."""
    args = p.parse_args(argv)
    args.argv = list(argv)
    args.names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.names if m not in RECIPES]
    if unknown or not args.names:
        given = f"unknown {unknown}" if unknown else "no model named"
        p.error(f"--models: {given}; choose from {', '.join(RECIPES)}")
    twice = sorted({m for m in args.names if args.names.count(m) > 1})
    if twice:  # each would train again, and save over the other's checkpoint
        p.error(f"--models: {', '.join(twice)} named twice; name each model once")
    check_modules(p, args, [("sklearn.datasets", SKLEARN_MISSING)])
    check_plot(p, args)
    try:
        args.where = select_backend(args.backend, args.device)
    except ValueError as error:
        p.error(str(error))
    _check_cluster(p, args)
    _plan(p, args)
    check_folders(p, args, [f"{name}.npz" for name in args.names], args.resumes.values())
    return args


def _check_cluster(p, args):
    if not (args.workers or args.scheduler):
        if args.step_timeout is not None:
            p.error("--step-timeout bounds a data-parallel step: pass it with --workers or "
                    "--scheduler")  # fmt: skip
        return
    if args.workers and args.scheduler:
        p.error("--workers starts a cluster, --scheduler joins one: pass one of them")
    if args.compile:
        p.error("--compile records a step on this machine; it cannot be combined with "
                "--workers or --scheduler")  # fmt: skip
    if args.where[0] != "numpy":
        p.error("--workers and --scheduler train on NumPy arrays: pass --backend numpy")
    if args.precision not in (None, DEFAULT):
        p.error("--workers and --scheduler train in float32: leave --precision out")
    try:
        importlib.import_module("distributed")
    except ImportError:
        p.error('data-parallel training needs dask.distributed: pip install "tracker-gpu[dask]"')


def _checkpoint(folder, name):
    return os.path.join(folder, f"{name}.npz")


def _step_kind(args):
    if args.workers or args.scheduler:
        return "data-parallel"
    return "compiled" if args.compile else "eager"


# --- what each model does: its settings, and whether it resumes ---------------------------


def _plan(p, args):
    """Each model's settings (`args.settings[name]`) and checkpoint to resume (`args.resumes`),
    every checkpoint of `--resume` read and checked before any work. Settings that would change
    the run (seed, batch size, learning rate, the model) are refused; `--epochs` (the total) and
    the place of the run (backend, device, step) are applied and said (`args.notes`)."""
    args.resumes, args.notes = {}, []
    infos = _resume_infos(p, args) if args.resume else {}
    saved = {name: info.get("settings") or {} for name, info in infos.items()}
    seeds = {name: s["seed"] for name, s in saved.items() if "seed" in s}
    args.seed = _common(p, args, "--seed", args.seed, seeds, SEED)
    batches = {name: info["batch_size"] for name, info in infos.items() if "batch_size" in info}
    common_batch = _common(p, args, "--batch-size", args.batch_size, batches, BATCH_SIZE)
    args.options = _run_options(p, args, saved)
    args.settings = {}
    for name in args.names:
        if name not in infos:  # not started yet: the run's options (the resumed run's too)
            settings = dict(epochs=args.options["epochs"], lr=args.options["lr"], seed=args.seed,
                            batch_size=args.batch_size or common_batch)  # fmt: skip
            settings["precision"] = _precision(args, {"precision": args.options["precision"]})
        else:
            settings = _resumed_settings(p, args, name, infos[name], saved[name])
            args.resumes[name] = _checkpoint(args.resume, name)
            settings["precision"] = _precision(args, saved[name])
        settings["options"] = args.options
        args.settings[name] = settings
    missing = [name for name in args.names if name not in infos]
    if args.resume and missing:
        args.notes.append(f"no checkpoint in {args.resume} for {', '.join(missing)}: "
                          "trained from scratch")  # fmt: skip


def _run_options(p, args, saved):
    """The options the run was given that each model applies on its own (`--epochs`, `--lr`,
    `--precision`; None where not given): this run's, else the resumed checkpoints' (where
    they record them), so that a model that had not started when the run stopped trains as
    the run would have trained it."""
    options = {}
    for key in ("epochs", "lr", "precision"):
        values = {name: s["options"][key] for name, s in saved.items() if "options" in s}
        given = getattr(args, key)
        if given is None and len(set(values.values())) > 1:
            p.error(f"--resume: the checkpoints in {args.resume} were saved with different "
                    f"--{key} {values}; give --{key} to go on")  # fmt: skip
        options[key] = given if given is not None else next(iter(values.values()), None)
    return options


def _precision(args, saved):
    """The precision a model trains in: the one given, else its checkpoint's (`saved`
    settings), else 32; data-parallel steps train in float32."""
    if args.workers or args.scheduler:
        return DEFAULT
    return args.precision or saved.get("precision") or DEFAULT


def _resume_infos(p, args):
    if not os.path.isdir(args.resume):
        p.error(f"--resume: no folder {args.resume!r}; train with --save {args.resume} first")
    infos = {}
    for name in args.names:
        path = _checkpoint(args.resume, name)
        if os.path.isdir(path):
            p.error(f"--resume: {path!r} is a folder, not a checkpoint")
        if os.path.exists(path):
            try:
                infos[name] = checkpoint_info(path, name)
            except ValueError as error:
                p.error(f"--resume: {error}")
            if infos[name].get("name") != name:
                p.error(f"--resume: {path} is a checkpoint of {infos[name].get('name')!r}, "
                        f"not of {name}")  # fmt: skip
    if not infos:
        p.error(f"--resume: no checkpoint of {', '.join(args.names)} in {args.resume!r}; "
                f"train with --save {args.resume} first")  # fmt: skip
    return infos


def _common(p, args, option, given, values, default):
    """The value of a setting shared by all models (the data split, the batch size): the one
    given, which must be the checkpoints' own (`values`, by model), else theirs, else the
    default."""
    for name, value in values.items():
        if given is not None and value != given:
            _refuse(p, args, name, option, value, given)
    if len(set(values.values())) > 1:
        p.error(f"--resume: the checkpoints in {args.resume} were saved with different "
                f"{option}: {values}; resume them one at a time with --models")  # fmt: skip
    if given is not None:
        return given
    return next(iter(values.values()), default)


def _resumed_settings(p, args, name, info, saved):
    batch = info.get("batch_size", saved.get("batch_size"))
    if args.batch_size is not None and batch is not None and batch != args.batch_size:
        _refuse(p, args, name, "--batch-size", batch, args.batch_size)
    lr = saved.get("lr")
    if args.lr is not None and lr is not None and lr != args.lr:
        _refuse(p, args, name, "--lr", lr, args.lr)
    recipe = RECIPES[name]
    epochs = saved.get("epochs", recipe.epochs)
    done = info.get("epoch", 0)
    step = info.get("step") or 0
    target = epochs if args.epochs is None else args.epochs
    if target <= done:
        if args.epochs is not None:
            has, more = f"{done} epochs, --epochs {target} asks for no more", ""
        else:
            has, more = f"all {done} epochs of its run", " (--epochs N trains to N in all)"
        args.notes.append(f"{name}: the checkpoint has {has}: evaluated, not trained{more}")
    else:
        if target != epochs:
            args.notes.append(f"{name}: --epochs {target} applied: {target} epochs in all, not "
                              f"{epochs}, the cosine schedule stretched to end there")  # fmt: skip
        where = f" and {step} steps" if step else ""
        args.notes.append(f"{name}: resumed after {done} epochs{where} of {target}")
    epochs = target
    _note_changes(args, name, saved)
    batch = batch if batch is not None else (args.batch_size or BATCH_SIZE)
    lr = lr if lr is not None else args.lr
    return dict(epochs=epochs, lr=lr, seed=args.seed, batch_size=batch)


def _note_changes(args, name, saved):
    """The settings that may change on a resumed run, said: where it runs, how it steps and
    in which precision (the same run up to rounding), and the library's version."""
    import tracker_gpu

    here = dict(backend=args.where[0], step=_step_kind(args), version=tracker_gpu.__version__,
                precision=_precision(args, saved))  # fmt: skip
    for key, value in here.items():
        if key in saved and saved[key] != value:
            args.notes.append(f"{name}: saved with {key} {saved[key]}, going on with {value} "
                              "(the same run up to rounding)")  # fmt: skip


def _refuse(p, args, name, option, saved, given):
    p.error(f"--resume: {_checkpoint(args.resume, name)} was saved with {option} {saved}, "
            f"and this run gives {option} {given}, which would make another run; leave "
            f"{option} out to go on as saved, or start a new run without --resume")  # fmt: skip


# --- running it ----------------------------------------------------------------------------


def main(argv=None):
    """The console script: train, print the test accuracies, write the plot. A loss that is
    not finite, an unreachable scheduler, a step that no worker answers within --step-timeout,
    a checkpoint that cannot be written (the one before is kept) and a stop by SIGINT or
    SIGTERM are one line each, no traceback (exit 1, 1, 1, 1, 130 or 143)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["text"]:  # the text job: a character-level transformer (it keeps memory)
        from .text_cli import main as text_main

        return text_main(argv[1:])
    keep_freed_memory()
    with signals(before_training=_stopping_at_once(argv)) as stop, _one_line_warnings():
        try:
            run(argv, stop=stop)
        except Interrupted as stopped:
            print(_stopped_line(stopped, argv), file=sys.stderr, flush=True)
            sys.exit(128 + stopped.signum)
        except (FloatingPointError, ConnectionError, SaveError) as error:
            print(f"{PROG}: error: {error}", file=sys.stderr, flush=True)
            sys.exit(1)
        except StalledWorkers as error:
            print(f"{PROG}: error: {error}; {_kept(argv)}", file=sys.stderr, flush=True)
            sys.exit(1)


def run(argv, stop=None):
    """`main`, returning the results. `stop()`, asked after each step, returns a signal number
    to stop the job there (`Interrupted`)."""
    p = parser()
    args = _checked(p, argv)
    xp, device, where = args.where
    with contextlib.ExitStack() as stack:
        client = _connect(stack, args)
        # the loop checks the loss itself, and says what to do when it is not finite
        stack.enter_context(np.errstate(over="ignore", invalid="ignore"))
        for note in args.notes:
            print(note, flush=True)
        data = digits(xp=xp, device=device, seed=args.seed, test_fraction=TEST_FRACTION)
        print(
            f"digits: {data.train_x.shape[0]} training and {data.test_x.shape[0]} test images "
            f"of 8x8 pixels; {where}{_precision_of(args)}",
            flush=True,
        )
        results = []
        if stop is not None and hasattr(stop, "training"):
            stop.training = True
        for name in args.names:
            signum = stop() if stop is not None else None
            if signum:
                raise Interrupted(signum, name, 0, 0, None)
            step = _step_for(args, client, name)
            results.append(_train_one(args, name, data, step, stop))
    if args.plot:
        plot(results, args.plot)
        print(f"plot written to {args.plot}")
    return results


def _precision_of(args):
    """The precision the models train in, for the first line (each model's, if they differ)."""
    found = {name: settings["precision"] for name, settings in args.settings.items()}
    if len(set(found.values())) == 1:
        return described(next(iter(found.values())))
    return ", precision " + ", ".join(f"{p} ({name})" for name, p in found.items())


def _connect(stack, args):
    """The Dask client of `--workers` or `--scheduler`, for the whole run (else None), with
    the cluster's address, dashboard and workers printed. An unreachable scheduler is a
    ConnectionError naming it, after about CONNECT_TIMEOUT seconds."""
    if not (args.workers or args.scheduler):
        return None
    from tracker_gpu.distributed import cluster, describe

    try:
        client = stack.enter_context(
            cluster(workers=args.workers, scheduler=args.scheduler, timeout=CONNECT_TIMEOUT)
        )
    except (OSError, TimeoutError) as error:
        if args.scheduler is None:
            raise
        raise ConnectionError(
            f"--scheduler: no Dask scheduler answered at {args.scheduler} within "
            f"{CONNECT_TIMEOUT} s ({type(error).__name__}); start one with dask scheduler, "
            "or check the address"
        ) from None
    print(describe(client), flush=True)
    return client


def _step_for(args, client, name):
    if client is not None:
        return data_parallel_step(client, timeout=args.step_timeout)
    precision = args.settings[name]["precision"]
    if precision != DEFAULT:
        return mixed_step(precision, compiled=args.compile)
    return compiled_step() if args.compile else train_step


def _train_one(args, name, data, step, stop):
    """Train model `name`, print its test accuracy, and return its `Result`."""
    xp, device, _ = args.where
    settings = args.settings[name]
    result = train(
        name,
        epochs=settings["epochs"],
        batch_size=settings["batch_size"],
        lr=settings["lr"],
        seed=settings["seed"],
        xp=xp,
        device=device,
        data=data,
        progress=not args.no_progress,
        save=_checkpoint(args.save, name) if args.save else None,
        resume=args.resumes.get(name),
        options=settings["options"],
        step=step,
        stop=stop,
        step_kind=_step_kind(args),
    )
    print(f"{name}: test accuracy {result.test_accuracy:.3f} ({result.seconds:.1f} s)",
          flush=True)  # fmt: skip
    return result


# --- signals -------------------------------------------------------------------------------


def _stopping_at_once(argv):
    """What a signal before training does: the one line, and the process ends there. Nothing
    is left to write; Dask's exit handlers would wait for a half-made client to give up
    connecting (up to 10 s), and an exception raised while it connects may be caught inside."""

    def stop_now(signum):
        line = _stopped_line(Interrupted(signum, "the job", 0, 0, None), argv)
        with contextlib.suppress(RuntimeError, OSError):  # stdout may be mid-write
            sys.stdout.flush()
        os.write(2, (line + "\n").encode())
        os._exit(128 + signum)

    return stop_now


def _stopped_line(stopped, argv):
    """The one line printed on a stop: what was kept, and the command that resumes."""
    name = signal.Signals(stopped.signum).name
    folder = option(argv, "--save")
    if folder is None:
        return (f"stopped by {name} in {stopped.name}; nothing was saved (no --save): rerun "
                f"with --save DIR to be able to resume")  # fmt: skip
    if not any(os.path.exists(_checkpoint(folder, name)) for name in RECIPES):
        command = shlex.join([*PROG.split(), *argv])
        return f"stopped by {name} before any checkpoint was written; start again with: {command}"
    if stopped.saved is None:
        kept = f"{stopped.name} not started"
    elif stopped.step:
        kept = f"{stopped.name} saved after {stopped.epoch} epochs and {stopped.step} steps"
    else:
        kept = f"{stopped.name} saved after {stopped.epoch} epochs"
    command = shlex.join([*PROG.split(), *without(argv, "--resume"), "--resume", folder])
    return f"stopped by {name} ({kept}); resume with: {command}"


@contextlib.contextmanager
def _one_line_warnings():
    """Within the block, a worker dropped for not answering (`StalledWorkerWarning`) is said in
    one line, as the job's warning; other warnings as Python shows them."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, StalledWorkerWarning):
            print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)
        else:
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def _kept(argv):
    """What a job stopped by an error mid-epoch keeps: the checkpoints of `--save` hold each
    model's last finished epoch (or nothing was saved), and the command that resumes."""
    folder = option(argv, "--save")
    if folder is None:
        return "nothing was saved (no --save)"
    if not any(os.path.exists(_checkpoint(folder, name)) for name in RECIPES):
        return "no checkpoint had been written yet"
    command = shlex.join([*PROG.split(), *without(argv, "--resume"), "--resume", folder])
    return f"the checkpoints in {folder} keep the last finished epoch; resume with: {command}"
