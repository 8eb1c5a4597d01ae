"""`python -m tracker_gpu.train text`: a character-level transformer on CPython's documentation
text. Every argument is checked before any work, with argparse's own errors; then the model is
trained, its validation loss printed beside the unigram and bigram baselines, a sample
generated from `--prompt`, and the curves plotted. SIGINT and SIGTERM stop the job after the
current step, with a checkpoint under `--save` and the command that resumes."""

import argparse
import math
import os
import shlex
import signal
import sys

import numpy as np

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
from .devices import keep_freed_memory, memory_of, select_backend
from .loop import Interrupted
from .mixed import DEFAULT, PRECISIONS, described
from .plots import plot_text
from .text_data import Text, baselines, corpus
from .text_loop import (
    TextConfig,
    build,
    compiled_text_step,
    mixed_text_step,
    other_text,
    text_step,
    train_text,
)
from .transformer import generate, parameter_count

__all__ = ["main", "run", "parser"]

PROG = "python -m tracker_gpu.train text"
DESCRIPTION = (
    "Train a character-level transformer on CPython's documentation text (pydoc_data.topics) "
    "with tracker_gpu."
)
ARCHITECTURE = ("layers", "width", "heads", "context")
RUN = (*ARCHITECTURE, "batch_size", "steps", "lr", "dropout", "seed")  # what makes a run
CPU = dict(layers=2, width=64, heads=4, context=64, batch_size=32, steps=1000, lr=3e-3,
           dropout=0.0)  # fmt: skip
GPU = dict(layers=4, width=256, heads=8, context=128, batch_size=64, steps=3000, lr=1e-3,
           dropout=0.1)  # fmt: skip
WARMUP = 100  # steps of the learning rate's linear warm-up (a tenth of a shorter run)
EVAL_EVERY = 250


def parser():
    """The argument parser of `python -m tracker_gpu.train text`."""
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, allow_abbrev=False)
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "torch", "cupy"])
    p.add_argument("--device", default="auto", help="auto (default), cpu, gpu or gpu:N")
    positive = number(int, 0)
    for name, help in [("layers", "transformer blocks"), ("width", "features per character"),
                       ("heads", "attention heads (they must divide the width)"),
                       ("context", "characters the model sees"),
                       ("batch-size", "windows per step"),
                       ("steps", "training steps in all, a resumed run included (which "
                                 "keeps its checkpoint's)")]:  # fmt: skip
        key = name.replace("-", "_")
        p.add_argument(f"--{name}", type=positive,
                       help=f"{help} (default {CPU[key]}; {GPU[key]} on cupy)")  # fmt: skip
    p.add_argument("--lr", type=LEARNING_RATE, help="AdamW's peak learning rate "
                   f"(default {CPU['lr']:g}; {GPU['lr']:g} on cupy)")  # fmt: skip
    dropout = f"dropout (default {CPU['dropout']}; {GPU['dropout']} on cupy)"
    p.add_argument("--dropout", type=number(float, 0, strict=False, high=1), help=dropout)
    p.add_argument("--seed", type=number(int, 0, strict=False, high=2**32),
                   help="initial weights, batches and dropout (default 0)")  # fmt: skip
    p.add_argument("--eval-every", type=positive,
                   help=f"steps between validation losses (default {EVAL_EVERY}, or the "
                   "checkpoint's)")  # fmt: skip
    p.add_argument("--prompt", default="The ", help="the start of the sample (default 'The ')")
    p.add_argument("--temperature", type=number(float, 0), default=0.8,
                   help="the sample's temperature (default 0.8)")  # fmt: skip
    p.add_argument("--sample-length", type=number(int, 0, strict=False), default=300,
                   help="characters to generate (default 300; 0 for no sample)")  # fmt: skip
    p.add_argument(
        "--plot",
        default="text.png",
        help="the plot's path; its suffix says the format ('' for no plot)",
    )
    p.add_argument("--save", metavar="DIR", help="write a checkpoint to DIR/text.npz at every "
                   "validation and at the end")  # fmt: skip
    p.add_argument("--resume", metavar="DIR", help="go on from DIR/text.npz")
    p.add_argument("--compile", action="store_true",
                   help="record the training step once with tg.compile and replay it")  # fmt: skip
    p.add_argument("--precision", choices=list(PRECISIONS),
                   help="32 (float32), 16 (float16, the loss scaled dynamically) or bf16 "
                        "(bfloat16): the dtype the model computes in, its weights kept in "
                        "float32 (default 32, or the checkpoint's)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _checked(p, argv):
    """The parsed arguments, every one checked before any work (argparse's errors exit 2)."""
    args = p.parse_args(argv)
    args.argv = list(argv)
    check_modules(p, args)
    check_plot(p, args)
    try:
        args.where = select_backend(args.backend, args.device)
    except ValueError as error:
        p.error(str(error))
    args.text = Text.of(corpus())
    args.config = _config(p, args)
    if args.resume:
        _check_checkpoint(p, args)
    _check_sample(p, args)
    check_folders(p, args, ["text.npz"], [_path(args.resume)] if args.resume else [])  # last:
    return args  # it makes the --save folder


def _config(p, args):
    """The run's `TextConfig`: the options given, else the checkpoint's (`--resume`), else the
    defaults of the backend; a setting that differs from the checkpoint's is refused."""
    defaults = GPU if args.where[0] == "cupy" else CPU
    given = {k: getattr(args, k) for k in RUN if getattr(args, k) is not None}
    saved = _saved_settings(p, args) if args.resume else {}
    for key, value in given.items():
        if key in saved and saved[key] != value:
            option = "--" + key.replace("_", "-")
            p.error(f"--resume: {_path(args.resume)} was saved with {option} {saved[key]}, and "
                    f"this run gives {option} {value}, which would make another run; leave "
                    f"{option} out to go on as saved")  # fmt: skip
    values = {**defaults, "seed": 0, **{k: saved[k] for k in RUN if k in saved}, **given}
    if values["width"] % values["heads"]:
        p.error(f"--width {values['width']} is not divisible by --heads {values['heads']}: each "
                "head takes width / heads features; choose a divisor")  # fmt: skip
    longest = len(args.text.valid) - 1
    if values["context"] > longest:
        p.error(f"--context {values['context']} is longer than the validation text allows "
                f"({longest} characters); choose a shorter context")  # fmt: skip
    _precision(p, args, saved)
    _check_attention_memory(p, values, args)
    warmup = saved.get("warmup", min(WARMUP, values["steps"] // 10))  # a library run's own
    decay = {k: saved[k] for k in ("weight_decay",) if k in saved}
    every = args.eval_every or saved.get("eval_every", EVAL_EVERY)  # not a setting of the run
    return TextConfig(**{k: values[k] for k in RUN}, warmup=warmup, eval_every=every, **decay)


def _check_attention_memory(p, values, args):
    """Refuse a run whose parameters with their gradients and AdamW's two moments, or whose
    attention weights alone, `(batch, heads, context, context)` kept by every layer for the
    backward pass, would not fit in the memory it computes in."""
    memory = memory_of(args.where)
    width, layers = values["width"], values["layers"]
    parameters = layers * 12 * width**2 + (len(args.text.vocab) + values["context"]) * width
    if memory is not None and 4 * 4 * parameters > memory:  # float32, four copies
        p.error(f"--width {width}, --layers {layers}: the parameters, their gradients and "
                f"AdamW's moments would take {16 * parameters / 2**30:,.1f} GiB, more than the "
                f"{memory / 2**30:,.1f} GiB of memory here; choose a smaller --width or fewer "
                "--layers")  # fmt: skip
    itemsize = 4 if args.precision == DEFAULT else 2
    weights = (values["layers"] * values["batch_size"] * values["heads"] * values["context"] ** 2
               * itemsize)  # fmt: skip
    if memory is not None and weights > memory:
        p.error(f"--context {values['context']}: the attention weights alone would take "
                f"{weights / 2**30:,.1f} GiB, more than the {memory / 2**30:,.1f} GiB of "
                "memory here (they grow with the square of the context); choose a shorter "
                "context, a smaller --batch-size or fewer --heads or --layers")  # fmt: skip


def _precision(p, args, saved):
    """`args.precision`: the one given, else the checkpoint's, else 32; and the settings a
    resumed run may change, said (`args.notes`): where it runs, how it steps, the library's
    version (the same run up to rounding), and its precision."""
    import tracker_gpu

    args.notes = []
    here = dict(backend=args.where[0], step="compiled" if args.compile else "eager",
                version=tracker_gpu.__version__)  # fmt: skip
    for key, value in here.items():
        if key in saved and saved[key] != value:
            args.notes.append(f"saved with {key} {saved[key]}, going on with {value} (the same "
                              "run up to rounding)")  # fmt: skip
    if "precision" in saved and args.precision and args.precision != saved["precision"]:
        args.notes.append(f"saved with precision {saved['precision']}, going on with "
                          f"{args.precision}")  # fmt: skip
    args.precision = args.precision or saved.get("precision", DEFAULT)


def _saved_settings(p, args):
    from tracker_gpu import optim

    path = _path(args.resume)
    if os.path.isdir(path):
        p.error(f"--resume: {path!r} is a folder, not a checkpoint")
    if not os.path.isfile(path):
        p.error(f"--resume: no checkpoint {path!r}; train with --save {args.resume} first")
    try:
        info = optim.read_checkpoint_info(path)
    except ValueError as error:
        p.error(f"--resume: {error}")
    settings = info.get("settings") or {}
    if settings.get("job") != "text":
        p.error(f"--resume: {path} is not a checkpoint of the text job")
    message = other_text(path, settings, args.text)
    if message:
        p.error(f"--resume: {message}")
    args.done = info.get("step", 0)
    return settings


def _check_checkpoint(p, args):
    """The whole checkpoint (every array: its checksum, shape and dtype) read against the
    model of this run, before any work: a file damaged past the header, or saved from
    another vocabulary, is an error here, not a traceback after the job has started."""
    from tracker_gpu import optim

    model, _ = build(args.config, len(args.text.vocab))
    try:
        optim.read_checkpoint_info(_path(args.resume), model)
    except ValueError as error:
        p.error(f"--resume: {error}")


def _check_sample(p, args):
    if args.sample_length and not args.prompt:
        p.error("--prompt: give at least one character to start the sample")
    try:
        args.prompt_codes = args.text.encode(args.prompt)
    except ValueError as error:
        p.error(f"--prompt: {error}")


def _path(folder):
    return os.path.join(folder, "text.npz")


def main(argv=None):
    """The console script: train, print the validation loss beside the baselines and a sample,
    write the plot. A loss that is not finite, a checkpoint that cannot be written (the one
    before is kept) and a stop by SIGINT or SIGTERM are one line each, no traceback (exit 1,
    1, 130 or 143)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    keep_freed_memory()
    with signals() as stop:
        try:
            run(argv, stop=stop)
        except Interrupted as stopped:
            print(_stopped_line(stopped, argv), file=sys.stderr, flush=True)
            sys.exit(128 + stopped.signum)
        except (FloatingPointError, SaveError) as error:  # a save's: the one before is kept
            print(f"{PROG}: error: {error}", file=sys.stderr, flush=True)
            sys.exit(1)


def run(argv, stop=None):
    """`main`, returning the `TextResult` (with its `sample`, `baselines` and `text`)."""
    args = _checked(parser(), argv)
    xp, device, where = args.where
    text, config = args.text, args.config
    _describe(text, config, where, args)
    if stop is not None and hasattr(stop, "training"):
        stop.training = True
    with np.errstate(over="ignore", invalid="ignore"):  # the loop checks the loss itself
        result = train_text(
            config, text, xp=xp, device=device,
            step=_step(args),
            progress=not args.no_progress, save=_path(args.save) if args.save else None,
            resume=_path(args.resume) if args.resume else None, stop=stop,
            step_kind="compiled" if args.compile else "eager",
        )  # fmt: skip
    result.baselines, result.text = baselines(text.train, text.valid, len(text.vocab)), text
    _report(result)
    result.sample = _sample(result, args)
    if args.plot:
        plot_text(result.history, args.plot, result.baselines)
        print(f"plot written to {args.plot}")
    return result


def _step(args):
    if args.precision != DEFAULT:
        return mixed_text_step(args.precision, compiled=args.compile)
    return compiled_text_step() if args.compile else text_step


def _describe(text, config, where, args):
    from .text_loop import build

    size = len(text.train) + len(text.valid)
    print(f"text: CPython's documentation (pydoc_data.topics), {size:,} characters, "
          f"{len(text.vocab)} distinct: {len(text.train):,} for training, {len(text.valid):,} "
          f"for validation; {where}")  # fmt: skip
    model, _ = build(config, len(text.vocab))
    print(f"model: {config.layers} layers, width {config.width}, {config.heads} heads, context "
          f"{config.context}, {parameter_count(model):,} parameters; batch {config.batch_size}, "
          f"{config.steps} steps, AdamW {config.lr:g} (warm-up {config.warmup}, cosine), "
          f"dropout {config.dropout:g}{', compiled' if args.compile else ''}"
          f"{described(args.precision)}",
          flush=True)  # fmt: skip
    if args.resume:
        print(f"resumed after {args.done} of {config.steps} steps", flush=True)
    for note in args.notes:
        print(note, flush=True)


def _report(result):
    b, rate = result.baselines, result.tokens_per_second
    speed = f"{rate:,.0f} tokens/s" if math.isfinite(rate) else "evaluated, not trained"
    print(f"validation loss {result.valid_loss:.3f} nats/char (unigram {b['unigram']:.3f}, "
          f"bigram {b['bigram']:.3f}: {result.valid_loss / b['bigram']:.2f}x the bigram's); "
          f"{speed}, {result.seconds:.1f} s", flush=True)  # fmt: skip


def _sample(result, args):
    if not args.sample_length:
        return ""
    rng = np.random.default_rng(result.config.seed)
    codes = generate(result.model, args.prompt_codes, args.sample_length,
                     temperature=args.temperature, rng=rng)  # fmt: skip
    sample = args.prompt + result.text.decode(codes)
    print(f"sample (temperature {args.temperature:g}):\n{sample}", flush=True)
    return sample


def _stopped_line(stopped, argv):
    name = signal.Signals(stopped.signum).name
    folder = option(argv, "--save")
    if folder is None:
        return (f"stopped by {name} after {stopped.step} steps; nothing was saved (no --save): "
                "rerun with --save DIR to be able to resume")  # fmt: skip
    if stopped.saved is None:  # stopped before the run's first checkpoint
        command = shlex.join([*PROG.split(), *argv])
        return (f"stopped by {name} after {stopped.step} steps, before any checkpoint was "
                f"written; start again with: {command}")  # fmt: skip
    command = shlex.join([*PROG.split(), *without(argv, "--resume"), "--resume", folder])
    return f"stopped by {name} (saved after {stopped.step} steps); resume with: {command}"
