"""The training loop of the text job: AdamW with a linear warm-up and a cosine decay, gradient
clipping by global norm, dropout, a progress bar with the loss and tokens per second, the
validation loss every `eval_every` steps, and checkpoints from which a stopped run resumes bit
for bit (the model, the optimiser state, both random generators and the curves are saved)."""

import math
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np

import tracker_gpu as tg
from tracker_gpu import optim
from tracker_gpu.api import quiet_withgradient
from tracker_gpu.backend import on_device_of
from tracker_gpu.optim.tree import tree_map_with_path

from .devices import one_thread
from .loop import Interrupted
from .mixed import DEFAULT, Mixed, restored, scaled, stepped
from .text_data import batch, windows
from .transformer import CharTransformer, text_loss

__all__ = ["TextConfig", "TextResult", "train_text", "text_step", "compiled_text_step",
           "mixed_text_step", "evaluate", "build"]  # fmt: skip

LOG_EVERY = 10  # steps whose mean training loss is one point of the curve
MAX_NORM = 1.0  # the global norm the gradient is clipped to


@dataclass
class TextConfig:
    """What makes a run: the model, the batches, the schedule and the seed."""

    layers: int = 2
    width: int = 64
    heads: int = 4
    context: int = 64
    batch_size: int = 32
    steps: int = 1000
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.1
    dropout: float = 0.0
    seed: int = 0
    eval_every: int = 250


@dataclass
class TextResult:
    """A finished run: the model, the curves, the last validation loss (nats per character),
    the training tokens per second and the wall time in seconds."""

    model: object
    history: dict
    valid_loss: float
    tokens_per_second: float
    seconds: float
    config: TextConfig = field(default_factory=TextConfig)


def build(config, vocab, *, xp=None, device=None, dtype="float32"):
    """The model of `config` over `vocab` characters, and the generator that drew its weights
    and that its dropout layers draw from."""
    rng = np.random.default_rng(config.seed)
    model = CharTransformer(vocab, config.context, config.width, config.heads, config.layers,
                            dropout=config.dropout, rng=rng, dtype=dtype, device=device,
                            xp=xp)  # fmt: skip
    return model, rng


def rule(config):
    """AdamW, its rate warmed up linearly then on a half cosine down to a tenth."""
    schedule = optim.Cosine(config.lr, steps=config.steps, warmup=min(config.warmup, config.steps),
                            eta_min=0.1 * config.lr)  # fmt: skip
    adamw = optim.AdamW(config.lr, (0.9, 0.99), weight_decay=config.weight_decay)
    return optim.Scheduled(adamw, schedule)


def _step(model, state, x, y):
    loss, (grads,) = tg.withgradient(lambda m: text_loss(m, x, y), model)
    clipped, _ = optim.clip_grad_norm(grads, MAX_NORM)
    state, model = optim.update(state, model, clipped)
    return loss, model, state


def text_step(model, state, x, y):
    """One training step: `(loss, model, state)`, the loss a plain 0-d array."""
    loss, model, state = _step(model, state, x, y)
    return tg.data(loss), model, state


def compiled_text_step():
    """A `text_step` recorded once by `tg.compile` and replayed after."""
    replay = tg.compile(_step, gradient=False)

    def step(model, state, x, y):
        loss, model, state = replay(model, state, x, y)
        return tg.data(loss), model, state

    step.compiled = replay
    return step


def _mixed_text_step(mixed, scaler, model, state, x, y):
    """`_step` under `mixed`: the loss scaled for the gradient, the gradients unscaled before
    they are clipped, and the step skipped where they are not finite."""

    def scaled_loss(m):
        loss = text_loss(m, x, y, mixed)
        return scaled(scaler, loss), loss

    with mixed.quiet():
        (_, loss), (grads,) = quiet_withgradient(scaled_loss, model)
        scaler, state, model = stepped(scaler, state, model, grads, _clipped)
    return loss, model, state, scaler


def _clipped(grads):
    return optim.clip_grad_norm(grads, MAX_NORM)[0]


def mixed_text_step(precision, compiled=False):
    """A `text_step` in `precision` ("32", "16" or "bf16"): float32 master weights, the model
    run in the half dtype, float16's loss scaled dynamically (`step.mixed.scaler`, saved in the
    checkpoints); `compiled` records it with `tg.compile` (the scaler then on the device).

    >>> mixed_text_step("bf16").mixed.policy.compute_dtype
    'bfloat16'
    """
    mixed = Mixed(precision)

    def run(model, state, x, y, scaler):
        return _mixed_text_step(mixed, scaler, model, state, x, y)

    replay = tg.compile(run, gradient=False) if compiled else run

    def step(model, state, x, y):
        scaler = mixed.carried(compiled, model)
        with mixed.quiet():  # a replay's overflows too
            loss, model, state, mixed.scaler = replay(model, state, x, y, scaler)
        return tg.data(loss), model, state

    step.mixed = mixed
    step.compiled = replay if compiled else None
    return step


def _mixed_of(step):
    return getattr(step, "mixed", None) or Mixed(DEFAULT)


def evaluate(model, ids, context, size, *, limit=None, xp=None, device=None, mixed=None):
    """The mean loss (nats per character) of `model` over consecutive windows of `ids`, the
    forward only (plain arrays: dropout off, no tape), under `mixed`'s policy if given."""
    total, count = 0.0, 0
    for x, y, new in windows(ids, context, size, limit=limit, xp=xp, device=device):
        total += float(text_loss(model, x, y, mixed, last=new)) * x.shape[0] * new
        count += x.shape[0] * new
    return total / count


@dataclass
class _Run:
    config: TextConfig
    text: object
    data_rng: object
    model_rng: object
    step: object
    place: dict
    save: object = None
    stop: object = None
    settings: dict = None

    def checkpoint(self, model, state, history, done, partial=()):
        """Write the checkpoint after `done` steps; `partial`, the losses of the steps since
        the last point of the curve."""
        if self.save is None:
            return None
        info = dict(name="text", step=done, history=history, settings=self.settings,
                    partial=[float(v) for v in partial],
                    loss_scale=_mixed_of(self.step).state_dict(),
                    rngs=[self.data_rng.bit_generator.state,
                          self._model_rng(model).bit_generator.state])  # fmt: skip
        optim.save_checkpoint(self.save, model, state, **info)
        return self.save

    def _model_rng(self, model):
        """The generator `model`'s dropout layers draw from (the one its checkpoint saves with
        it): `model_rng`, unless a step gave the model another."""
        found = _generator_of(model)
        return self.model_rng if found is None else found

    def valid_loss(self, model, limit=8):
        c = self.config
        return evaluate(model, self.text.valid, c.context, c.batch_size, limit=limit,
                        mixed=_mixed_of(self.step), **self.place)  # fmt: skip


def settings_of(config, backend, step_kind, precision=DEFAULT, text=None):
    """What a checkpoint of the text job records of its run (JSON): `text`, the fingerprint
    of the text it trains on (`Text.fingerprint`)."""
    return dict(asdict(config), job="text", backend=backend, step=step_kind,
                precision=precision, version=tg.__version__, text=text)  # fmt: skip


def train_text(config, text, *, xp=None, device=None, step=text_step, progress=False, save=None,
               resume=None, stop=None, step_kind="eager"):  # fmt: skip
    """Train a `CharTransformer` of `config` on `text` (a `text_data.Text`) and return a
    `TextResult`. `save` is a checkpoint file written at every evaluation and at the end,
    `resume` one to go on from, refused (ValueError) where a setting of `config` but
    `eval_every` differs from the one its run recorded; `stop()`, asked after each step,
    returns a signal number to stop there (the checkpoint written, `Interrupted` raised)."""
    start = time.perf_counter()
    if resume is not None:  # checked before any work
        _check_settings(resume, optim.read_checkpoint_info(resume), config, text)
    model, model_rng = build(config, len(text.vocab), xp=xp, device=device)
    state = optim.setup(rule(config), model)
    history, done, partial = {"step": [], "loss": [], "valid_step": [], "valid_loss": []}, 0, []
    data_rng = np.random.default_rng([config.seed, 1])
    if resume is not None:
        model, state, info = optim.load_checkpoint(resume, model)
        data_rng.bit_generator.state, model_state = info["rngs"]
        model_rng = _drawn(model, model_rng, model_state)
        history, done, partial = info["history"], info["step"], info["partial"]
        restored(_mixed_of(step), info.get("loss_scale"))
    settings = settings_of(config, _library_name(model), step_kind, _mixed_of(step).precision,
                           text.fingerprint())  # fmt: skip
    run = _Run(config, text, data_rng, model_rng, step, dict(xp=xp, device=device), save, stop,
               settings)  # fmt: skip
    with one_thread(model.position), on_device_of(model.position):
        model, state, rate = _fit(run, model, state, history, (done, partial), progress)
        valid = evaluate(model, text.valid, config.context, config.batch_size,
                         mixed=_mixed_of(step), **run.place)  # fmt: skip
    _check_valid(valid, config.steps)
    if config.steps not in history["valid_step"]:  # the whole validation text, at the end
        history["valid_step"].append(config.steps)
        history["valid_loss"].append(valid)
    return TextResult(model, history, valid, rate, time.perf_counter() - start, config)


_RUN = tuple(f.name for f in fields(TextConfig) if f.name != "eval_every")  # make a run


def _check_settings(path, info, config, text):
    """Refuse to resume the checkpoint at `path` (its `info`) with a `config` whose settings
    differ from those its run recorded, or on another `text`, as the command line does: each
    would make another run (the loaded optimiser keeps the saved schedule) under the old run's
    name. `eval_every` (when the validation loss is taken) may change."""
    saved = info.get("settings") or {}
    if saved and saved.get("job") != "text":
        raise ValueError(f"{path} is not a checkpoint of the text job (train_text)")
    message = other_text(path, saved, text)
    if message:
        raise ValueError(message)
    for key in _RUN:
        value = getattr(config, key)
        if key in saved and saved[key] != value:
            raise ValueError(
                f"{path} was saved with {key} {saved[key]}, and this config gives {key} "
                f"{value}, which would make another run; give TextConfig({key}="
                f"{saved[key]!r}) to go on as saved, or start a new run without resume"
            )


def other_text(path, saved, text):
    """Why the checkpoint at `path` (its `saved` settings) cannot go on with `text` (a `Text`):
    it trained on another one; None where it is the same, or the file does not say."""
    was, now = saved.get("text"), text.fingerprint()
    if not was or was == now:
        return None
    return (
        f"{path} was trained on a text of {was['characters']:,} characters ({was['distinct']} "
        f"distinct), and this run's has {now['characters']:,} ({now['distinct']} distinct): "
        "it would go on training, and validating, on another text (CPython's documentation "
        "differs between versions); resume with the Python that made it, or start a new run"
    )


def _drawn(model, built, saved):
    """The generator the loaded `model`'s dropout layers draw from: the one the checkpoint
    restored with them (`load_checkpoint`), else (a file without generators, or a model
    without one) `built`, the template's, put in the `saved` state (`info["rngs"][1]`)."""
    found = _generator_of(model)
    if found is None or found is built:
        built.bit_generator.state = saved
        return built
    return found


def _generator_of(model):
    """The NumPy generator `model` holds (its layers share one: `build`), or None."""
    found = []

    def record(path, x):
        if isinstance(x, np.random.Generator) and not found:
            found.append(x)
        return x

    tree_map_with_path(record, model)
    return found[0] if found else None


def _library_name(model):
    return tg.backend.namespace_of(model.position).__name__.rsplit(".", 1)[-1]


def _fit(run, model, state, history, start, progress):
    """Steps `done + 1` to `config.steps` (`start` is `done` and the losses of the steps
    since the last point of the curve); returns the model, the state and the training tokens
    per second (the batches and the steps, not the evaluations)."""
    c, (done, window) = run.config, start
    bar = _progress(c.steps, done, progress)
    tokens, seconds, window_seconds, timed = c.batch_size * c.context, 0.0, 0.0, 0
    try:
        for i in range(done + 1, c.steps + 1):
            began = time.perf_counter()
            x, y = batch(run.text.train, c.batch_size, c.context, run.data_rng, **run.place)
            loss, model, state = _guarded(run, i, model, state, x, y)
            window.append(loss)
            mean = _log(history, i, window) if i % LOG_EVERY == 0 or i == c.steps else None
            took = time.perf_counter() - began
            seconds, window_seconds, timed = seconds + took, window_seconds + took, timed + 1
            if mean is not None:
                rate = tokens * timed / window_seconds
                bar.set_postfix(loss=f"{mean:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
                window, window_seconds, timed = [], 0.0, 0
            bar.update(1)
            if i % c.eval_every == 0 and i < c.steps:
                _evaluated(run, (model, state, window), history, i, bar)
            signum = run.stop() if run.stop is not None else None
            if signum and i < c.steps:
                saved = run.checkpoint(model, state, history, i, window)
                raise Interrupted(signum, "text", 0, i, saved)
    finally:
        bar.close()
    if done < c.steps:
        run.checkpoint(model, state, history, c.steps)
    return model, state, tokens * (c.steps - done) / seconds if seconds else math.nan


def _log(history, i, window):
    """One point of the training curve, the mean loss of the last steps (one sync)."""
    mean = sum(float(v) for v in window) / len(window)
    if not math.isfinite(mean):
        raise FloatingPointError(f"text: the loss became {mean} by step {i}; lower the "
                                 "learning rate")  # fmt: skip
    history["step"].append(i)
    history["loss"].append(mean)
    return mean


def _check_valid(loss, i):
    """A validation loss that is not finite: the last updates left weights that are not (the
    training losses, taken before each update, were finite)."""
    if not math.isfinite(loss):
        raise FloatingPointError(f"text: the validation loss became {loss} after step {i}; "
                                 "lower the learning rate")  # fmt: skip


def _evaluated(run, trained, history, i, bar):
    """The validation loss after step `i`, on part of the validation text; then a
    checkpoint."""
    model, state, window = trained
    loss = run.valid_loss(model)
    _check_valid(loss, i)
    history["valid_step"].append(i)
    history["valid_loss"].append(loss)
    bar.write(f"step {i}: validation loss {loss:.3f} nats/char")
    run.checkpoint(model, state, history, i, window)


def _guarded(run, i, model, state, x, y):
    """One step; a loss that is not finite is a FloatingPointError, with its advice."""
    try:
        return run.step(model, state, x, y)
    except (tg.BackError, FloatingPointError) as error:
        raise FloatingPointError(
            f"text: the loss or its gradient stopped being finite at step {i} ({error}); lower "
            "the learning rate"
        ) from None


class _NoBar:
    def update(self, n):
        pass

    def set_postfix(self, **kw):
        pass

    def write(self, line):
        print(line, flush=True)

    def close(self):
        pass


def _progress(total, done, enabled):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="text", unit="step", dynamic_ncols=True)
