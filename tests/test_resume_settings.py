"""A resumed run is the run its checkpoint started, or it is refused, through the library as on
the command line: `train.train(..., resume=...)` (the digits) and `train_text(config, text,
resume=...)` refuse a setting that would make another run with a ValueError naming the setting,
the saved value and the given one; a setting left out (`lr`, `epochs`) is the checkpoint's.
A resumed text run's checkpoints are those of the run straight through, bit for bit, the
state of the generator its dropout layers draw from included. The module runs in the numpy row
alone (`NUMPY_ROW_ONLY` in tests/conftest.py)."""

import dataclasses
import json
import signal

import numpy as np
import pytest

from tracker_gpu import nn, optim
from tracker_gpu.train.loop import Interrupted
from tracker_gpu.train.text_data import Text, corpus
from tracker_gpu.train.text_loop import TextConfig, train_text

TINY = dict(layers=1, width=16, heads=2, context=16, batch_size=8, lr=1e-2, warmup=1, dropout=0.1)


class Stopped(Exception):
    pass


def stop_after_one(epoch, history):
    raise Stopped


# --- the digits (train.train) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """The digits, and a checkpoint of an MLP (lr 0.01, seed 0) saved after 1 of 2 epochs."""
    pytest.importorskip("sklearn")
    from tracker_gpu.train import loop

    folder = tmp_path_factory.mktemp("digits")
    data = loop.digits()
    with pytest.raises(Stopped):
        loop.train("mlp", epochs=2, batch_size=256, lr=0.01, data=data,
                   save=folder / "mlp.npz", on_epoch=stop_after_one)  # fmt: skip
    return loop, data, folder / "mlp.npz"


@pytest.mark.parametrize(
    "key, given, saved",
    [("lr", 0.5, 0.01), ("seed", 5, 0), ("split", "half", [1347, 450])],
)
def test_a_digits_resume_with_another_setting_is_refused(digits_run, tmp_path, key, given, saved):
    loop, data, checkpoint = digits_run
    kwargs = {key: given} if key != "split" else {}
    if key == "split":  # another data split: half the images held out
        data = loop.digits(test_fraction=0.5)
        given = [int(data.train_x.shape[0]), int(data.test_x.shape[0])]
    elif key == "seed":
        data = None  # the split of seed 5, as the call makes it
    out = tmp_path / "resumed.npz"
    with pytest.raises(ValueError) as refused:
        loop.train("mlp", epochs=2, batch_size=256, data=data, resume=checkpoint, save=out,
                   **kwargs)  # fmt: skip
    message, said = str(refused.value), f"was saved with {key} {saved}, and this call gives"
    assert f"{checkpoint} {said} {key} {given}" in message
    assert "which would make another run" in message
    assert not out.exists()  # refused before any training


def test_a_digits_resume_without_lr_or_epochs_goes_on_as_saved(digits_run, tmp_path):
    """`lr` and `epochs` left out are the checkpoint's (0.01, 2), not the recipe's (0.003, 20):
    the run and its record are the run straight through."""
    loop, data, checkpoint = digits_run
    straight = loop.train("mlp", epochs=2, batch_size=256, lr=0.01, data=data)
    out = tmp_path / "resumed.npz"
    resumed = loop.train("mlp", batch_size=256, data=data, resume=checkpoint, save=out)
    assert resumed.history == straight.history
    ours, theirs = nn._parameters(resumed.model), nn._parameters(straight.model)
    assert all(np.array_equal(ours[k], theirs[k]) for k in theirs)
    settings = optim.read_checkpoint_info(out)["settings"]
    assert settings["lr"] == 0.01 and settings["epochs"] == 2


# --- the text job (train_text) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def text():
    return Text.of(corpus())


def stop_at(step):
    asked = iter(range(1, 10**6))
    return lambda: signal.SIGINT if next(asked) == step else None


CHANGED = dict(layers=2, width=32, heads=4, context=8, batch_size=4, steps=6, lr=0.5, warmup=2,
               weight_decay=0.0, dropout=0.3, seed=1)  # fmt: skip


def test_a_text_resume_refuses_every_setting_but_eval_every_that_differs(text,
                                                                         tmp_path):  # fmt: skip
    config = TextConfig(**TINY, steps=4, eval_every=1000)
    checkpoint = tmp_path / "text.npz"
    with pytest.raises(Interrupted):
        train_text(config, text, save=checkpoint, stop=stop_at(2))
    keys = [f.name for f in dataclasses.fields(TextConfig) if f.name != "eval_every"]
    assert sorted(CHANGED) == sorted(keys)  # a new setting is tested here too
    for key, value in CHANGED.items():
        saved = getattr(config, key)
        with pytest.raises(ValueError) as refused:
            train_text(dataclasses.replace(config, **{key: value}), text, resume=checkpoint)
        message = str(refused.value)
        assert f"was saved with {key} {saved}, and this config gives {key} {value}" in message
        assert "which would make another run" in message and str(checkpoint) in message
    # when the validation loss is taken is not a setting of the run
    out = tmp_path / "resumed.npz"
    resumed = train_text(dataclasses.replace(config, eval_every=3), text, resume=checkpoint,
                         save=out)  # fmt: skip
    assert resumed.history["valid_step"] == [3, 4]
    assert optim.read_checkpoint_info(out)["settings"]["eval_every"] == 3


def contents(path):
    """Every array of the checkpoint at `path`, and its JSON description, parsed."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    return arrays, json.loads(str(arrays.pop("__checkpoint__")))


@pytest.mark.parametrize("stopped_at", [3, 6])
def test_a_resumed_text_runs_next_checkpoint_is_the_straight_runs(text, tmp_path,
                                                                  stopped_at):  # fmt: skip
    """Stopped after `stopped_at` steps and resumed, the run writes at step 8 (the end) the
    checkpoint the run straight through writes there: every array, and every field of the
    description, the generators' states (`info["rngs"]`: the data's and the dropout's) too.
    The dropout's was the generator built before the load, never drawn from, so a second
    resume from that checkpoint would have drawn another dropout."""
    config = TextConfig(**TINY, steps=8, eval_every=1000)
    straight = tmp_path / "straight.npz"
    train_text(config, text, save=straight)
    stopped, resumed = tmp_path / "stopped.npz", tmp_path / "resumed.npz"
    with pytest.raises(Interrupted):
        train_text(config, text, save=stopped, stop=stop_at(stopped_at))
    train_text(config, text, resume=stopped, save=resumed)
    (ours, our_meta), (theirs, their_meta) = contents(resumed), contents(straight)
    assert our_meta["info"]["rngs"] == their_meta["info"]["rngs"]
    assert our_meta == their_meta
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype and np.array_equal(ours[name], theirs[name])
    # what the dropout layers draw from, as the checkpoint records it twice
    generators = [g for g in their_meta["generators"].values() if "same_as" not in g]
    assert generators == [their_meta["info"]["rngs"][1]]


def test_the_command_line_resumes_a_library_run_with_its_own_warmup_and_decay(
    text, tmp_path, capsys
):
    """The command line made its warm-up from the steps and took the default weight decay, so
    a library run's checkpoint with others was refused with a traceback."""
    from tracker_gpu.train import text_cli

    config = TextConfig(**{**TINY, "warmup": 3}, steps=4, weight_decay=0.05, eval_every=1000)
    train_text(config, text, save=str(tmp_path / "text.npz"))
    text_cli.main(["--resume", str(tmp_path), "--no-progress", "--plot", "", "--sample-length",
                   "0"])  # fmt: skip
    assert "warm-up 3" in capsys.readouterr().out
