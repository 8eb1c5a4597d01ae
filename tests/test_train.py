"""The main job: the MLP, the CNN and the LSTM learn scikit-learn's digits on every backend, a
stopped run resumes bit for bit from its checkpoint, and the command line prints the accuracies
and writes the plot."""

import dataclasses
import math

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim

pytest.importorskip("sklearn")
train_module = pytest.importorskip("tracker_gpu.train")


@pytest.fixture(scope="module")
def data(backend):
    if backend.name == "dask":
        pytest.skip(
            "training on the digits runs on the eager backends: on Dask each step is a lazy "
            "graph of its own (data-parallel training on Dask: test_distributed.py)"
        )
    return train_module.digits(xp=backend.xp, device=backend.device)


def test_digits_are_split_and_placed(backend, data):
    assert tuple(data.train_x.shape) == (1347, 1, 8, 8)
    assert tuple(data.test_x.shape) == (450, 1, 8, 8)
    assert data.train_x.dtype == backend.xp.float32
    assert tg.backend.device_of(data.test_y) == backend.device


def test_the_mlp_learns_the_digits(backend, data):
    result = train_module.train("mlp", epochs=10, xp=backend.xp, device=backend.device, data=data)
    assert result.test_accuracy >= 0.95
    assert len(result.history["loss"]) == 10
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert tg.backend.device_of(result.model.layers[1].weight) == backend.device


def test_the_cnn_learns_the_digits(backend, data):
    result = train_module.train("cnn", epochs=10, xp=backend.xp, device=backend.device, data=data)
    assert result.test_accuracy >= 0.95


def test_the_lstm_learns_the_digits_row_by_row(backend, data):
    result = train_module.train("lstm", epochs=10, xp=backend.xp, device=backend.device, data=data)
    assert result.test_accuracy >= 0.95
    assert tg.backend.device_of(result.model.layers[1].cell.Wi) == backend.device


class Stopped(Exception):
    pass


def test_a_stopped_run_resumes_bit_for_bit(backend, data, tmp_path):
    """Two epochs straight through, against one epoch, a stop, and a resumed second epoch."""
    where = dict(xp=backend.xp, device=backend.device, data=data, epochs=2, batch_size=128)
    straight = train_module.train("mlp", **where)
    checkpoint = tmp_path / "mlp.npz"

    def stop(epoch, history):
        raise Stopped

    with pytest.raises(Stopped):
        train_module.train("mlp", save=checkpoint, on_epoch=stop, **where)
    resumed = train_module.train("mlp", resume=checkpoint, **where)
    assert resumed.history == straight.history
    ours, theirs = nn._parameters(resumed.model), nn._parameters(straight.model)
    for key in theirs:
        assert np.array_equal(backend.to_numpy(ours[key]), backend.to_numpy(theirs[key])), key


def test_a_nan_loss_is_a_clear_error(backend, data):
    model = train_module.mlp(rng=np.random.default_rng(0), xp=backend.xp, device=backend.device)
    last = model.layers[-1]
    poisoned = dataclasses.replace(last, bias=last.bias * math.nan)
    model = nn.Chain(*model.layers[:-1], poisoned)
    state = optim.setup(optim.Adam(), model)
    with pytest.raises(tg.BackError, match="loss is nan"):
        train_module.train_step(model, state, data.train_x[:4, ...], data.train_y[:4])


def test_the_command_line(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    plot = tmp_path / "curves.png"
    args = ["--backend", "numpy", "--models", "mlp", "--epochs", "3", "--plot", str(plot)]
    assert train_module.main(args) is None  # the console script's exit status is 0
    out = capsys.readouterr().out
    assert "digits: 1347 training and 450 test images" in out
    assert "mlp: test accuracy 0.9" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_line_saves_and_resumes(tmp_path, capsys):
    pytest.importorskip("tqdm")
    folder = tmp_path / "runs"
    common = ["--backend", "numpy", "--models", "mlp", "--plot", "", "--no-progress"]
    train_module.main([*common, "--epochs", "1", "--save", str(folder)])
    assert (folder / "mlp.npz").is_file()
    (result,) = train_module.run([*common, "--epochs", "2", "--resume", str(folder)])
    assert len(result.history["loss"]) == 2
    assert "mlp: test accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_a_compiled_step_trains_as_the_eager_one(backend, data, name):
    """`--compile`: the step, recorded once per batch shape and replayed, follows the same
    losses as the eager step (the cosine schedule's rate, computed from a step count held in
    an array, may differ from the eager one in its last bit)."""
    where = dict(xp=backend.xp, device=backend.device, data=data, epochs=2, batch_size=128)
    step = train_module.compiled_step()
    compiled = train_module.train(name, step=step, **where)
    eager = train_module.train(name, **where)
    np.testing.assert_allclose(compiled.history["loss"], eager.history["loss"], rtol=1e-5)
    assert compiled.test_accuracy == pytest.approx(eager.test_accuracy, abs=2 / 450)


def test_compile_on_the_command_line(capsys):
    pytest.importorskip("tqdm")
    args = ["--backend", "numpy", "--models", "mlp", "--epochs", "1", "--plot", ""]
    (result,) = train_module.run([*args, "--no-progress", "--compile"])
    assert "mlp: test accuracy" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        train_module.main([*args, "--compile", "--workers", "2"])
    assert "--compile records a step on this machine" in capsys.readouterr().err


def test_the_plot_has_whole_epochs_and_the_whole_accuracy_range(tmp_path):
    pytest.importorskip("matplotlib")
    history = {"loss": [2.0, 1.0, 0.5], "train_accuracy": [0.3, 0.6, 0.9],
               "test_accuracy": [0.2, 0.5, 0.85]}  # fmt: skip
    result = train_module.Result("mlp", None, 0.85, 1.0, history)
    figure = train_module.plot([result], tmp_path / "curves.png")
    accuracy_axes = figure.axes[1]
    low, high = accuracy_axes.get_ylim()
    assert low <= 0.2 and high >= 0.9  # not clipped to the top of the range
    ticks = [t for t in accuracy_axes.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_the_default_plot_is_ignored_by_git():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    default = train_module.cli.parser().get_default("plot")
    assert default in (root / ".gitignore").read_text().split()


def test_command_line_errors(capsys):
    with pytest.raises(SystemExit):
        train_module.main(["--models", "rnn"])
    assert "unknown ['rnn']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_module.main(["--backend", "numpy", "--device", "gpu"])
    assert "runs on the CPU only" in capsys.readouterr().err


def test_cupy_without_a_gpu_is_a_clear_error():
    try:
        import cupy

        if cupy.is_available():
            pytest.skip("a GPU is present")
    except ImportError:
        pass
    with pytest.raises(ValueError, match="--backend cupy"):
        train_module.select_backend("cupy", "auto")
    xp, device, where = train_module.select_backend("auto", "auto")
    assert xp == "numpy" and where == "numpy on the CPU"
