"""The training loop of the main job, reusable: `train` builds (or resumes) a model and its
optimiser state and runs `fit`, which runs epochs of `step(model, state, x, y)` over the batches
(the step is a parameter, so a recorded or data-parallel step can take its place), keeping the
curves, a progress bar and, after each epoch, a checkpoint from which a stopped run resumes bit
for bit."""

import math
import time
from dataclasses import dataclass, field

import numpy as np

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.backend import namespace_of, on_device_of

from .data import batches, digits
from .devices import one_thread
from .models import RECIPES

__all__ = [
    "Result",
    "train",
    "fit",
    "train_step",
    "compiled_step",
    "data_parallel_step",
    "accuracy",
    "schedule_for",
]


def loss_function(model, x, y):
    """The training loss, and the logits (to count correct answers without a second pass)."""
    logits = model(x)
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
    replay = tg.compile(_step)

    def step(model, state, x, y):
        loss, logits, model, state = replay(model, state, x, y)
        return tg.data(loss), tg.data(logits), model, state

    return step


def data_parallel_step(client):
    """A `train_step` whose gradient is computed on the Dask cluster of `client`, the batch split
    across its workers (`tracker_gpu.distributed.step`); pass it to `train` as `step`."""
    from tracker_gpu.distributed import step as cluster_step

    def step(model, state, x, y):
        (loss, logits), model, state = cluster_step(client, loss_function, model, state, x, y)
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


def train(name="mlp", *, epochs=None, batch_size=32, lr=None, seed=0, xp=None, device=None,
          data=None, progress=False, save=None, resume=None, on_epoch=None,
          step=train_step):  # fmt: skip
    """Train model `name` ("mlp", "cnn" or "lstm") on the digits and return a `Result`.

    `xp` (a namespace or "numpy", "torch", "cupy", "strict") and `device` say where the model and
    data live; `epochs` and `lr` default to the model's recipe; `data` reuses a `digits()` split.
    `save` is a checkpoint file written after each epoch, `resume` one to go on from (its model,
    optimiser state, random generator and curves); `on_epoch(epoch, history)` is called after
    each epoch's checkpoint, and `step` runs one training step.
    """
    recipe = RECIPES[name]
    epochs = recipe.epochs if epochs is None else epochs
    start = time.perf_counter()
    data = data if data is not None else digits(xp=xp, device=device, seed=seed)
    rng = np.random.default_rng(seed)
    model = recipe.build(rng=rng, xp=xp, device=device)
    steps = math.ceil(data.train_x.shape[0] / batch_size)
    state = optim.setup(schedule_for(recipe.lr if lr is None else lr, epochs, steps), model)
    history, done = {"loss": [], "train_accuracy": [], "test_accuracy": []}, 0
    if resume is not None:
        model, state, info = optim.load_checkpoint(resume, model)
        _check_resumable(resume, info, name, batch_size)
        rng.bit_generator.state, history, done = info["rng"], info["history"], info["epoch"]
    # on CuPy every new array and kernel goes to the data's GPU, not the current one
    with one_thread(data.train_x), on_device_of(data.train_x):
        run = _Run(name, data, batch_size, rng, step, save, on_epoch)
        model, state = fit(run, model, state, history, range(done + 1, epochs + 1), progress)
    test = history["test_accuracy"][-1] if history["test_accuracy"] else math.nan
    return Result(name, model, test, time.perf_counter() - start, history)


def _check_resumable(path, info, name, batch_size):
    if info.get("name") != name or info.get("batch_size") != batch_size:
        raise ValueError(
            f"{path} is a checkpoint of {info.get('name')} with batch size "
            f"{info.get('batch_size')}, not of {name} with batch size {batch_size}; resume it "
            "with the settings it was saved with"
        )


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


def fit(run, model, state, history, epochs, progress=False):
    """Train `model` for each epoch of `epochs` (numbers), appending to `history`; return the
    model and state."""
    steps = math.ceil(run.data.train_x.shape[0] / run.batch_size)
    bar = _progress(run.name, len(epochs) * steps, progress)
    for epoch in epochs:
        model, state = _epoch(run, model, state, history, epoch, bar)
        if run.save is not None:
            info = dict(name=run.name, batch_size=run.batch_size, epoch=epoch,
                        rng=run.rng.bit_generator.state, history=history)  # fmt: skip
            optim.save_checkpoint(run.save, model, state, **info)
        if run.on_epoch is not None:
            run.on_epoch(epoch, history)
    bar.close()
    return model, state


def _epoch(run, model, state, history, epoch, bar):
    data, n = run.data, run.data.train_x.shape[0]
    total_loss, correct = 0.0, 0  # summed on the device: no wait for it in a step
    for x, y in batches(data, run.batch_size, run.rng):
        loss, logits, model, state = run.step(model, state, x, y)
        total_loss = loss * x.shape[0] + total_loss
        correct = _hits(logits, y) + correct
        bar.update(1)
    total_loss, correct = float(total_loss), int(correct)
    _check_finite(run.name, epoch, total_loss)
    history["loss"].append(total_loss / n)
    history["train_accuracy"].append(correct / n)
    history["test_accuracy"].append(accuracy(model, data.test_x, data.test_y))
    bar.set_postfix(loss=f"{history['loss'][-1]:.4f}", acc=f"{history['train_accuracy'][-1]:.3f}",
                    test=f"{history['test_accuracy'][-1]:.3f}")  # fmt: skip
    return model, state


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
