"""The main job: the MLP and the CNN learn scikit-learn's digits on every backend, and the command
line prints the accuracies and writes the plot."""

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
