"""The training loop of the main job, reusable: `train` builds (or resumes) a model and its
optimiser state and runs `fit`, which runs epochs of `step(model, state, x, y)` over the batches
(the step is a parameter, so a recorded or data-parallel step can take its place), keeping the
curves, a progress bar and, after each epoch, a checkpoint from which a stopped run resumes bit
for bit."""

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.api import quiet_withgradient
from tracker_gpu.backend import namespace_of, on_device_of
from tracker_gpu.optim.state import Leaf
from tracker_gpu.optim.tree import tree_map_with_path

from .data import batches, digits
from .devices import one_thread
from .mixed import DEFAULT, Mixed, restored, scaled, stepped
from .models import RECIPES

__all__ = [
    "Result",
    "train",
    "fit",
    "train_step",
    "compiled_step",
    "mixed_step",
    "data_parallel_step",
    "accuracy",
    "schedule_for",
    "settings_of",
    "checkpoint_info",
    "Interrupted",
]

TEST_FRACTION = 0.25  # the share of the digits held out for testing (stratified)


def loss_function(model, x, y, mixed=None):
    """The training loss, and the logits (to count correct answers without a second pass);
    with `mixed` (a `mixed.Mixed`), the model runs under its policy, the loss in float32."""
    logits = model(x) if mixed is None else mixed.forward(model, x)
    return nn.logitcrossentropy(logits, y), logits


def _step(model, state, x, y):
    (loss, logits), (grads,) = tg.withgradient(lambda m: loss_function(m, x, y), model)
    state, model = optim.update(state, model, grads)
    return loss, logits, model, state


def train_step(model, state, x, y):
    """One step of training: `(loss, logits, model, state)`, the loss and logits as plain
    arrays on the data's device."""
    loss, logits, model, state = _step(model, state, x, y)
    return tg.data(loss), tg.data(logits), model, state


def compiled_step():
    """A `train_step` that `tg.compile` records once per batch shape and replays after (a
    CUDA graph on CuPy); pass it to `train` as `step`, a new one for each model."""
    replay = tg.compile(_step, gradient=False)

    def step(model, state, x, y):
        loss, logits, model, state = replay(model, state, x, y)
        return tg.data(loss), tg.data(logits), model, state

    return step


def _mixed_step(mixed, scaler, model, state, x, y):
    """`_step` under `mixed`: the loss scaled for the gradient, the gradients unscaled, and
    the step skipped where they are not finite (float16's scaler halves then)."""

    def scaled_loss(m):
        loss, logits = loss_function(m, x, y, mixed)
        return scaled(scaler, loss), (loss, logits)

    with mixed.quiet():
        (_, (loss, logits)), (grads,) = quiet_withgradient(scaled_loss, model)
        scaler, state, model = stepped(scaler, state, model, grads)
    return loss, logits, model, state, scaler


def mixed_step(precision, compiled=False):
    """A `train_step` in `precision` ("32", "16" or "bf16": `mixed.PRECISIONS`): float32
    master weights, the model run in the half dtype, float16's loss scaled dynamically (the
    step's `mixed.scaler`, saved in the checkpoints). `compiled` records it with `tg.compile`;
    the scaler then lives on the device and a skipped step is chosen there.

    >>> step = mixed_step("16")
    >>> step.mixed.scaler.scale
    32768.0
    """
    mixed = Mixed(precision)

    def run(model, state, x, y, scaler):
        return _mixed_step(mixed, scaler, model, state, x, y)

    replay = tg.compile(run, gradient=False) if compiled else run

    def step(model, state, x, y):
        scaler = mixed.carried(compiled, model)
        with mixed.quiet():  # a replay's overflows too
            loss, logits, model, state, mixed.scaler = replay(model, state, x, y, scaler)
        return tg.data(loss), tg.data(logits), model, state

    step.mixed = mixed
    return step


def _mixed_of(step):
    """The `Mixed` a step carries (`mixed_step`'s), else float32's."""
    return getattr(step, "mixed", None) or Mixed(DEFAULT)


def data_parallel_step(client, timeout=None):
    """A `train_step` whose gradient is computed on the Dask cluster of `client`, the batch split
    across its workers (`tracker_gpu.distributed.step`); pass it to `train` as `step`. The
    number of shards is fixed when the step is made (one per worker thread then): a worker lost
    and replaced during the run changes neither the shards nor the order of their sum. A step
    that waits longer than `timeout` seconds (None: `distributed.STEP_TIMEOUT`, 60) drops the
    workers that do not answer and goes on, or raises `distributed.StalledWorkers` when none
    answers."""
    from tracker_gpu.distributed import STEP_TIMEOUT
    from tracker_gpu.distributed import step as cluster_step

    shards = max(1, sum(client.nthreads().values()))
    timeout = STEP_TIMEOUT if timeout is None else timeout

    def step(model, state, x, y):
        (loss, logits), model, state = cluster_step(
            client, loss_function, model, state, x, y, shards=shards, timeout=timeout
        )
        return loss, logits, model, state

    return step


def accuracy(model, x, y):
    """The fraction of `x` that `model` classifies as `y` (a float; one sync)."""
    return int(_hits(model(x), y)) / x.shape[0]


def _hits(logits, y):
    """How many rows of `logits` pick their label, as a 0-d array on the data's device."""
    xp = namespace_of(logits)
    return xp.sum(xp.astype(xp.argmax(logits, axis=-1) == y, xp.int64))


@dataclass
class Result:
    """What training a model gives: the model, its test accuracy, the wall time in seconds and
    the curves (one value per epoch)."""

    name: str
    model: object
    test_accuracy: float
    seconds: float
    history: dict = field(default_factory=dict)


def schedule_for(lr, epochs, steps_per_epoch):
    """Adam whose rate follows a half cosine over the whole run, from `lr` to `lr / 20`."""
    total = epochs * steps_per_epoch
    return optim.Scheduled(optim.Adam(lr), optim.Cosine(lr, steps=total, eta_min=0.05 * lr))


def settings_of(name, *, epochs=None, batch_size=32, lr=None, seed=0, data=None, step="eager",
                precision=DEFAULT):  # fmt: skip
    """What a checkpoint records of the run that made it (JSON): the model, the data split, the
    schedule, the batch size, the precision, the dtype, the backend and the library's version
    (`train` adds the model's parameters and their shapes)."""
    recipe = RECIPES[name]
    lr = recipe.lr if lr is None else lr
    epochs = recipe.epochs if epochs is None else epochs
    settings = dict(model=name, seed=seed, test_fraction=TEST_FRACTION, batch_size=batch_size,
                    lr=lr, epochs=epochs, schedule=f"cosine from {lr:g} to {0.05 * lr:g} over "
                    f"{epochs} epochs", step=step, precision=precision,
                    version=tg.__version__)  # fmt: skip
    if data is not None:
        settings |= dict(split=[int(data.train_x.shape[0]), int(data.test_x.shape[0])],
                         dtype=str(data.train_x.dtype).rsplit(".", 1)[-1],
                         backend=namespace_of(data.train_x).__name__.rsplit(".", 1)[-1],
                         device=str(tg.backend.device_of(data.train_x)))  # fmt: skip
    return settings


def checkpoint_info(path, name=None):
    """The `info` that the job saved in the checkpoint at `path` (its settings and progress).
    With the model's `name`, the whole checkpoint is checked against that model's recipe too
    (every array, by loading it and letting it go), so that a run checks all its checkpoints
    before it trains. Raises `optim.BadFileError` (a ValueError) naming the file."""
    if name is None or name not in RECIPES:
        return dict(optim.read_checkpoint_info(path))
    model = RECIPES[name].build(rng=np.random.default_rng(0))
    return dict(optim.read_checkpoint_info(path, model))


class Interrupted(Exception):
    """Training stopped by a signal after a whole step. `signum`, the model's `name`, where it
    stopped (`epoch` whole epochs and `step` steps of the next) and the checkpoint written there
    (`saved`, or None without `save`)."""

    def __init__(self, signum, name, epoch, step, saved):
        super().__init__(f"{name} stopped by signal {signum} after {epoch} epochs and {step} steps")
        self.signum, self.name, self.epoch, self.step, self.saved = signum, name, epoch, step, saved


def train(name="mlp", *, epochs=None, batch_size=32, lr=None, seed=0, xp=None, device=None,
          data=None, progress=False, save=None, resume=None, on_epoch=None,
          step=train_step, stop=None, step_kind="eager", options=None):  # fmt: skip
    """Train model `name` ("mlp", "cnn" or "lstm") on the digits and return a `Result`.

    `xp` (a namespace or "numpy", "torch", "cupy", "strict") and `device` say where the model and
    data live; `epochs` (the total, a resumed run included) and `lr` default to the checkpoint's
    when resuming, else to the model's recipe; `data` reuses a `digits()` split. `save` is a
    checkpoint file written after each epoch, `resume` one to go on from (its model, optimiser
    state, random generator, curves and the place in the epoch), refused (ValueError) where the
    model, batch size, seed, learning rate or data split differ from its own.
    `on_epoch(epoch, history)` is called after each epoch's checkpoint, and `step` runs one
    training step (`mixed_step(precision)` for mixed precision: its loss scale is saved and
    resumed with the rest). `stop()`, asked after each step, returns a signal number to stop
    there: the checkpoint is written (mid-epoch) and `Interrupted` raised. A resumed run whose
    checkpoint has `epochs` epochs already is evaluated, not trained. `options` (JSON), the
    job's options as given, are saved with the settings.
    """
    recipe = RECIPES[name]
    saved = {}
    if resume is not None:  # checked before any work: the settings that make the run
        info = optim.read_checkpoint_info(resume)
        _check_resumable(resume, info, name, batch_size)
        saved = info.get("settings") or {}
    epochs = saved.get("epochs", recipe.epochs) if epochs is None else epochs
    lr = saved.get("lr", recipe.lr) if lr is None else lr
    start = time.perf_counter()
    data = data if data is not None else digits(xp=xp, device=device, seed=seed)
    if resume is not None:
        split = [int(data.train_x.shape[0]), int(data.test_x.shape[0])]
        _check_settings(resume, saved, dict(seed=seed, lr=lr, split=split))
    rng = np.random.default_rng(seed)
    model = recipe.build(rng=rng, xp=xp, device=device)
    steps = math.ceil(data.train_x.shape[0] / batch_size)
    state = optim.setup(schedule_for(lr, epochs, steps), model)
    history, done, within = {"loss": [], "train_accuracy": [], "test_accuracy": []}, 0, None
    if resume is not None:
        model, state, info = optim.load_checkpoint(resume, model)
        rng.bit_generator.state, history, done = info["rng"], info["history"], info["epoch"]
        restored(_mixed_of(step), info.get("loss_scale"))
        within = (info["step"], info["partial"]) if info.get("step") else None
        if info.get("settings", {}).get("epochs", epochs) != epochs:
            state = _rescheduled(state, model, schedule_for(lr, epochs, steps))
    settings = settings_of(name, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed,
                           data=data, step=step_kind,
                           precision=_mixed_of(step).precision)  # fmt: skip
    settings["parameters"] = {k: list(v.shape) for k, v in nn._parameters(model).items()}
    if options is not None:
        settings["options"] = options
    # on CuPy every new array and kernel goes to the data's GPU, not the current one
    with one_thread(data.train_x), on_device_of(data.train_x):
        run = _Run(name, data, batch_size, rng, step, save, on_epoch, stop, settings, within)
        todo = range(done + 1, epochs + 1)
        model, state = fit(run, model, state, history, todo, progress)
        if todo or not history["test_accuracy"]:
            test = history["test_accuracy"][-1] if history["test_accuracy"] else math.nan
        else:  # nothing left to train: evaluate the model as it is
            test = accuracy(model, data.test_x, data.test_y)
    return Result(name, model, test, time.perf_counter() - start, history)


def _rescheduled(state, model, rule):
    """`state` with each parameter's rule replaced by `rule` (a schedule over a new number of
    epochs), its moments and step counts kept."""
    fresh = optim.setup(rule, model)

    def swap(path, old, new):
        return Leaf(new.rule, old.state, old.frozen) if isinstance(old, Leaf) else old

    return tree_map_with_path(swap, state, fresh, is_leaf=lambda x: isinstance(x, Leaf))


def _check_resumable(path, info, name, batch_size):
    if info.get("name") != name or info.get("batch_size") != batch_size:
        raise ValueError(
            f"{path} is a checkpoint of {info.get('name')} with batch size "
            f"{info.get('batch_size')}, not of {name} with batch size {batch_size}; resume it "
            "with the settings it was saved with"
        )


def _check_settings(path, saved, given):
    """Refuse a resume whose settings (`given`: the seed, the learning rate, the data split)
    differ from those the checkpoint's run recorded (`saved`), as the command line does: each
    would make another run (another split, another schedule) under the old run's name. The
    epochs (the total) are applied; where and how the run steps may change (the same run up to
    rounding)."""
    for key, value in given.items():
        if key in saved and saved[key] != value:
            raise ValueError(
                f"{path} was saved with {key} {saved[key]}, and this call gives {key} {value}, "
                f"which would make another run; give {_keyword(key, saved[key])} to go on as "
                "saved, or start a new run without resume"
            )


def _keyword(key, value):
    """How to give the setting `key` its saved `value` in a call to `train`."""
    if key == "split":
        return f"the data of that split ({value[0]} training and {value[1]} test images)"
    return f"{key}={value!r}"


@dataclass
class _Run:
    """What stays the same through the epochs of one run."""

    name: str
    data: object
    batch_size: int
    rng: object
    step: object
    save: object
    on_epoch: object
    stop: object = None
    settings: dict = None
    within: tuple = None  # (steps done, [loss sum, correct]) of the first epoch, when resumed

    def checkpoint(self, model, state, history, epoch, rng_state, step=0, partial=None):
        """Write the checkpoint of `epoch` whole epochs (and `step` steps of the next)."""
        if self.save is None:
            return None
        info = dict(name=self.name, batch_size=self.batch_size, epoch=epoch, step=step,
                    rng=rng_state, partial=partial, history=history, settings=self.settings,
                    loss_scale=_mixed_of(self.step).state_dict())  # fmt: skip
        optim.save_checkpoint(self.save, model, state, **info)
        return self.save


def fit(run, model, state, history, epochs, progress=False):
    """Train `model` for each epoch of `epochs` (numbers), appending to `history`; return the
    model and state."""
    steps = math.ceil(run.data.train_x.shape[0] / run.batch_size)
    skipped = run.within[0] if run.within and len(epochs) else 0
    bar = _progress(run.name, len(epochs) * steps - skipped, progress)
    try:
        for epoch in epochs:
            within, run.within = run.within, None
            model, state = _epoch(run, model, state, history, epoch, bar, within)
            run.checkpoint(model, state, history, epoch, run.rng.bit_generator.state)
            if run.on_epoch is not None:
                run.on_epoch(epoch, history)
            signum = run.stop() if run.stop is not None else None
            if signum and epoch < epochs[-1]:
                raise Interrupted(signum, run.name, epoch, 0, run.save)
    finally:
        bar.close()
    return model, state


def _epoch(run, model, state, history, epoch, bar, within=None):
    data, n = run.data, run.data.train_x.shape[0]
    skip, (total_loss, correct) = within or (0, (0.0, 0))  # summed on the device: no wait
    rng_state = run.rng.bit_generator.state  # the order of this epoch is drawn from it
    steps = math.ceil(n / run.batch_size)
    for i, (x, y) in enumerate(itertools.islice(batches(data, run.batch_size, run.rng), skip, None),
                               start=skip + 1):  # fmt: skip
        loss, logits, model, state = _guarded(run, epoch, model, state, x, y)
        total_loss = loss * x.shape[0] + total_loss
        correct = _hits(logits, y) + correct
        bar.update(1)
        signum = run.stop() if run.stop is not None else None
        if signum and i < steps:
            partial = [float(total_loss), int(correct)]
            saved = run.checkpoint(model, state, history, epoch - 1, rng_state, i, partial)
            raise Interrupted(signum, run.name, epoch - 1, i, saved)
    total_loss, correct = float(total_loss), int(correct)
    _check_finite(run.name, epoch, total_loss)
    history["loss"].append(total_loss / n)
    history["train_accuracy"].append(correct / n)
    history["test_accuracy"].append(_tested(run.name, epoch, model, data))
    bar.set_postfix(loss=f"{history['loss'][-1]:.4f}", acc=f"{history['train_accuracy'][-1]:.3f}",
                    test=f"{history['test_accuracy'][-1]:.3f}")  # fmt: skip
    return model, state


def _guarded(run, epoch, model, state, x, y):
    """One step; a loss that is not finite is the loop's FloatingPointError, with its advice."""
    try:
        return run.step(model, state, x, y)
    except tg.BackError as error:
        if not str(error).startswith("loss is "):
            raise
        value = str(error).split()[2]
        raise FloatingPointError(
            f"{run.name}: the loss became {value} in epoch {epoch}; lower the learning rate"
        ) from None


def _tested(name, epoch, model, data):
    """The test accuracy after an epoch; outputs that are not finite (the last updates left
    weights that are not, after finite training losses) are the loop's FloatingPointError."""
    logits = model(data.test_x)
    xp = namespace_of(logits)
    if not bool(xp.all(xp.isfinite(logits))):
        raise FloatingPointError(
            f"{name}: the model's outputs became not finite in epoch {epoch}; lower the "
            "learning rate"
        )
    return int(_hits(logits, data.test_y)) / data.test_x.shape[0]


def _check_finite(name, epoch, total_loss):
    if not math.isfinite(total_loss):
        raise FloatingPointError(
            f"{name}: the loss became {total_loss} in epoch {epoch}; lower the learning rate"
        )


class _NoBar:
    def update(self, n):
        pass

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def _progress(name, total, enabled):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=name, unit="step", leave=True, dynamic_ncols=True)
