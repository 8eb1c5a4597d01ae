"""The main job's `--resume` (issues 23 and 29): a checkpoint records the run that made it; a
resume with a setting that would change the run refuses, naming the saved value and the given
one; `--epochs` is the total and is applied and said; every checkpoint is checked before any
training; the whole job resumes with one command, models without a checkpoint from scratch and
finished ones evaluated."""

import numpy as np
import pytest

pytest.importorskip("sklearn")
train_module = pytest.importorskip("tracker_gpu.train")

from tracker_gpu import nn  # noqa: E402

COMMON = ["--backend", "numpy", "--plot", "", "--no-progress", "--batch-size", "128"]


class Stopped(Exception):
    pass


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder with the checkpoint of an MLP saved after 2 of 3 epochs, as a stopped run left
    it, and the model of the 3 epochs straight through."""
    folder = tmp_path_factory.mktemp("runs")

    def stop(epoch, history):
        if epoch == 2:
            raise Stopped

    where = dict(epochs=3, batch_size=128, seed=0)
    with pytest.raises(Stopped):
        train_module.train("mlp", save=folder / "mlp.npz", on_epoch=stop, **where)
    return folder, train_module.train("mlp", **where)


def _run(capsys, argv):
    results = train_module.run([*COMMON, *argv])
    return results, capsys.readouterr().out


def _refused(capsys, argv):
    with pytest.raises(SystemExit) as stopped:
        train_module.main([*COMMON, *argv])
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and "digits:" not in out and "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_a_checkpoint_records_the_run_that_made_it(saved):
    folder, _ = saved
    settings = train_module.loop.checkpoint_info(folder / "mlp.npz")["settings"]
    assert settings["model"] == "mlp" and settings["seed"] == 0
    assert settings["split"] == [1347, 450] and settings["test_fraction"] == 0.25
    assert settings["lr"] == 3e-3 and settings["epochs"] == 3 and "cosine" in settings["schedule"]
    assert settings["batch_size"] == 128 and settings["dtype"] == "float32"
    assert settings["backend"] == "numpy" and settings["step"] == "eager"
    assert settings["version"] == __import__("tracker_gpu").__version__
    assert settings["parameters"]["layers.1.weight"] == [128, 64]


def test_a_bare_resume_goes_on_as_saved_to_the_same_weights(saved, capsys):
    folder, straight = saved
    (result,), out = _run(capsys, ["--models", "mlp", "--resume", str(folder)])
    assert "mlp: resumed after 2 epochs of 3" in out
    assert result.history == straight.history
    ours, theirs = nn._parameters(result.model), nn._parameters(straight.model)
    assert all(np.array_equal(ours[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize(
    "option, value, saved_value",
    [("--seed", "1", "0"), ("--lr", "0.01", "0.003"), ("--batch-size", "64", "128")],
)
def test_a_setting_that_would_change_the_run_is_refused(saved, capsys, option, value, saved_value):
    folder, _ = saved
    argv = ["--models", "mlp", "--resume", str(folder), option, value]
    line = _refused(capsys, argv)  # the last --batch-size counts: COMMON's 128 is overridden
    assert f"saved with {option} {saved_value}, and this run gives {option} {value}" in line
    assert str(folder / "mlp.npz") in line


def test_the_same_settings_given_again_are_accepted(saved, capsys):
    folder, straight = saved
    argv = ["--models", "mlp", "--resume", str(folder), "--seed", "0", "--lr", "0.003"]
    (result,), _ = _run(capsys, [*argv, "--epochs", "3"])
    assert result.history == straight.history


def test_epochs_is_the_total_and_a_change_is_applied_and_said(saved, capsys):
    folder, _ = saved
    (result,), out = _run(capsys, ["--models", "mlp", "--resume", str(folder), "--epochs", "4"])
    assert "mlp: --epochs 4 applied: 4 epochs in all, not 3" in out
    assert len(result.history["loss"]) == 4


def test_a_checkpoint_with_the_epochs_asked_is_evaluated_not_trained(saved, capsys):
    folder, _ = saved
    (result,), out = _run(capsys, ["--models", "mlp", "--resume", str(folder), "--epochs", "2"])
    assert "mlp: the checkpoint has 2 epochs, --epochs 2 asks for no more: evaluated" in out
    assert len(result.history["loss"]) == 2
    assert result.test_accuracy == result.history["test_accuracy"][-1]


def test_the_whole_job_resumes_models_without_a_checkpoint_from_scratch(saved, capsys):
    folder, straight = saved
    argv = ["--models", "mlp,lstm", "--resume", str(folder), "--epochs", "3"]
    (mlp, lstm), out = _run(capsys, argv)
    assert f"no checkpoint in {folder} for lstm: trained from scratch" in out
    assert mlp.history == straight.history and len(lstm.history["loss"]) == 3


def test_every_checkpoint_is_checked_before_any_training(saved, capsys, tmp_path):
    folder, _ = saved
    (tmp_path / "mlp.npz").write_bytes((folder / "mlp.npz").read_bytes())
    (tmp_path / "cnn.npz").write_bytes(b"not a checkpoint")
    line = _refused(capsys, ["--models", "mlp,cnn", "--resume", str(tmp_path)])
    assert str(tmp_path / "cnn.npz") in line and "damaged or truncated" in line
    # a whole checkpoint of another model: its arrays are checked against the recipe's too
    (tmp_path / "cnn.npz").write_bytes((folder / "mlp.npz").read_bytes())
    line = _refused(capsys, ["--models", "mlp,cnn", "--resume", str(tmp_path)])
    assert str(tmp_path / "cnn.npz") in line


def test_a_resume_from_nothing_is_refused(capsys, tmp_path):
    line = _refused(capsys, ["--models", "mlp", "--resume", str(tmp_path)])
    assert f"no checkpoint of mlp in {str(tmp_path)!r}" in line
    line = _refused(capsys, ["--models", "mlp", "--resume", str(tmp_path / "missing")])
    assert "no folder" in line


def test_a_finished_run_resumed_as_it_was_started_is_evaluated(capsys, tmp_path):
    _run(capsys, ["--models", "mlp", "--epochs", "1", "--save", str(tmp_path)])
    (result,), out = _run(capsys, ["--models", "mlp", "--resume", str(tmp_path)])
    assert "mlp: the checkpoint has all 1 epochs of its run: evaluated, not trained" in out
    assert len(result.history["loss"]) == 1 and result.test_accuracy > 0.5


def test_a_fresh_run_refuses_a_save_folder_holding_an_earlier_runs_checkpoint(capsys, tmp_path):
    """A stop would leave the earlier checkpoint beside this run's, and the command it prints
    would go on from both: the earlier run's CNN with this run's MLP."""
    (tmp_path / "cnn.npz").write_bytes(b"an earlier run's checkpoint")
    line = _refused(capsys, ["--models", "mlp,cnn", "--epochs", "1", "--save", str(tmp_path)])
    assert f"{tmp_path / 'cnn.npz'} holds a checkpoint of an earlier run" in line
    assert f"--resume {tmp_path}" in line


def test_a_model_not_started_when_the_run_stopped_trains_with_the_runs_options(capsys, tmp_path):
    """Stopped during the MLP, the run resumed with the bare command trains the CNN with the
    options the run was given (its epochs, rate and precision), not the CNN's defaults."""
    argv = ["--models", "mlp,cnn", "--epochs", "1", "--lr", "0.01", "--precision", "bf16"]
    asked = []
    stop = lambda: asked.append(1) or (2 if len(asked) == 3 else None)  # noqa: E731
    with pytest.raises(train_module.loop.Interrupted):
        train_module.run([*COMMON, *argv, "--save", str(tmp_path)], stop=stop)
    capsys.readouterr()
    _run(capsys, ["--models", "mlp,cnn", "--save", str(tmp_path), "--resume", str(tmp_path)])
    for name in ("mlp", "cnn"):
        settings = train_module.loop.checkpoint_info(tmp_path / f"{name}.npz")["settings"]
        assert (settings["epochs"], settings["lr"], settings["precision"]) == (1, 0.01, "bf16")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--save", ""], "--save: give a folder; an empty name would save nothing"),
        (["--resume", ""], "--resume: give a folder; an empty name would resume nothing"),
        (["--lr", "1e39"], "less than 3.4"),
        (["--plot", "{folder}"], "is a folder; give the plot's file"),
        (["--save", "{file}/runs"], "--save: cannot make the folder"),
        (["--save", "{folder}"], "is a folder, where this run writes a checkpoint"),
        (["--resume", "{folder}"], "is a folder, not a checkpoint"),
    ],
)
def test_paths_and_rates_are_checked_before_any_work(capsys, tmp_path, argv, message):
    (tmp_path / "mlp.npz").mkdir()  # a folder where the checkpoint goes
    (tmp_path / "file").write_text("")
    argv = [a.format(folder=tmp_path, file=tmp_path / "file") for a in argv]
    assert message in _refused(capsys, ["--models", "mlp", "--epochs", "1", *argv])
