"""The main job: the MLP, the CNN and the LSTM learn scikit-learn's digits on every backend, a
stopped run resumes bit for bit from its checkpoint, and the command line prints the accuracies
and writes the plot."""

import dataclasses
import math

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.pytree import tree_leaves

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


def _poisoned(model):
    last = model.layers[-1]
    return nn.Chain(*model.layers[:-1], dataclasses.replace(last, bias=last.bias * math.nan))


@pytest.mark.parametrize("synchronised", [True, False], ids=["checked", "unchecked"])
def test_a_nan_loss_is_a_clear_error(backend, data, synchronised):
    """A step's check of its loss reads the loss back: always on the host, on a GPU only where
    synchronised checks are asked for. Unchecked (a GPU's default), the loop's check of the
    epoch's loss names the epoch."""
    model = train_module.mlp(rng=np.random.default_rng(0), xp=backend.xp, device=backend.device)
    state = optim.setup(optim.Adam(), _poisoned(model))
    with tg.sync_checks(synchronised):
        if synchronised:
            with pytest.raises(tg.BackError, match="loss is nan"):
                train_module.train_step(
                    _poisoned(model), state, data.train_x[:4, ...], data.train_y[:4]
                )

        def step(model, state, x, y):
            return train_module.train_step(_poisoned(model), state, x, y)

        where = dict(xp=backend.xp, device=backend.device, data=data, epochs=1, step=step)
        with pytest.raises(FloatingPointError, match="mlp: the loss became nan in epoch 1"):
            train_module.train("mlp", **where)


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


@pytest.mark.filterwarnings("error:tg.compile. no CUDA graph")  # on CuPy: never step by step
@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm"])
def test_a_compiled_step_trains_as_the_eager_one(backend, data, name):
    """`--compile`: the step, recorded once per batch shape and replayed, is the eager step bit
    for bit, the cosine schedule's rate and Adam's bias correction included."""
    where = dict(xp=backend.xp, device=backend.device, data=data, epochs=2, batch_size=128)
    step = train_module.compiled_step()
    compiled = train_module.train(name, step=step, **where)
    eager = train_module.train(name, **where)
    assert compiled.history["loss"] == eager.history["loss"]
    arrays = [(a, b) for a, b in zip(tree_leaves(compiled.model), tree_leaves(eager.model))
              if hasattr(a, "shape")]  # fmt: skip
    assert arrays
    for a, b in arrays:
        assert np.array_equal(backend.to_numpy(a), backend.to_numpy(b))


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


# --- every argument checked before any work (issue 23) ---------------------------------------

QUICK = ["--backend", "numpy", "--models", "mlp", "--epochs", "1", "--no-progress"]


def _refused(capsys, argv):
    """The usage error of `argv`: exit status 2, one message, nothing trained."""
    with pytest.raises(SystemExit) as stopped:
        train_module.main(argv)
    out, err = capsys.readouterr()
    assert stopped.value.code == 2
    assert "digits:" not in out and "Traceback" not in err
    return err


def test_a_plot_format_matplotlib_cannot_write_is_refused_before_training(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    err = _refused(capsys, [*QUICK, "--plot", str(tmp_path / "x.txt")])
    assert "matplotlib cannot write '.txt' files" in err and ".png" in err


def test_a_plot_without_a_suffix_says_the_path_it_wrote(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    train_module.main([*QUICK, "--plot", str(tmp_path / "x")])
    assert f"plot written to {tmp_path / 'x.png'}\n" in capsys.readouterr().out
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--seed", "-3", "--seed: must be at least 0"),
        ("--seed", str(2**32), "--seed: must be at least 0 and less than 4294967296"),
        ("--lr", "inf", "--lr: must be a finite number, got inf"),
        ("--lr", "nan", "--lr: must be a finite number, got nan"),
        ("--lr", "0", "--lr: must be more than 0"),
        ("--device", "tpu", "--device 'tpu' is not a device here; choose auto, cpu, gpu or gpu:N"),
        ("--step-timeout", "0", "--step-timeout: must be more than 0"),
        ("--step-timeout", "nan", "--step-timeout: must be a finite number, got nan"),
        ("--step-timeout", "soon", "--step-timeout: expected a number, got 'soon'"),
    ],
)
def test_numbers_and_devices_are_checked(capsys, option, value, message):
    args = [a for a in QUICK if a not in ("--backend", "numpy")] if option == "--device" else QUICK
    err = _refused(capsys, [*args, option, value])
    assert message in err
    assert "--backend numpy" not in err  # not blamed on an option the user never passed


def test_a_gpu_without_one_names_the_device_not_a_backend(capsys):
    try:
        import cupy

        if cupy.is_available():
            pytest.skip("a GPU is present")
    except ImportError:
        pass
    err = _refused(capsys, ["--device", "gpu:1", "--models", "mlp"])
    assert "--device gpu:1 needs CuPy and a CUDA GPU" in err and "--backend numpy" not in err


def test_a_learning_rate_that_diverges_is_one_line_of_advice(capsys):
    with pytest.raises(SystemExit) as stopped:
        train_module.main([*QUICK, "--models", "cnn", "--lr", "1e9", "--plot", ""])
    err = capsys.readouterr().err
    assert stopped.value.code == 1
    assert err.strip().splitlines() == [
        "python -m tracker_gpu.train: error: cnn: the loss became nan in epoch 1; lower the "
        "learning rate"
    ]


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers (as an HTTP server does Dask)."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_an_unreachable_scheduler_is_one_line_naming_it(capsys, monkeypatch, kind, request):
    pytest.importorskip("distributed")
    import time

    address = "tcp://127.0.0.1:1"
    if kind == "silent":
        address = f"tcp://127.0.0.1:{request.getfixturevalue('silent_port')}"
    assert 5 <= train_module.cli.CONNECT_TIMEOUT <= 15  # about 10 s, not Dask's 30
    monkeypatch.setattr(train_module.cli, "CONNECT_TIMEOUT", 1)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as stopped:
        train_module.main([*QUICK, "--plot", "", "--scheduler", address])
    out, err = capsys.readouterr()
    assert time.perf_counter() - start < 8
    assert stopped.value.code == 1 and "digits:" not in out
    (line,) = err.strip().splitlines()
    assert f"no Dask scheduler answered at {address} within 1 s" in line


def test_a_step_timeout_needs_a_cluster(capsys):
    pytest.importorskip("distributed")
    err = _refused(capsys, [*QUICK, "--plot", "", "--step-timeout", "5"])
    assert "--step-timeout bounds a data-parallel step: pass it with --workers" in err


def test_a_step_no_worker_answers_is_one_line_and_keeps_the_last_epoch(capsys, monkeypatch,
                                                                        tmp_path):  # fmt: skip
    """The job whose cluster stops answering in its second epoch: one line naming the workers,
    the command that resumes, and the checkpoint of the first epoch intact."""
    import shlex

    pytest.importorskip("distributed")
    from tracker_gpu.distributed import StalledWorkers

    given = []

    def stalling_step(client, timeout=None):
        given.append(timeout)
        steps = iter(range(1000))

        def step(model, state, x, y):
            if next(steps) == 3:  # the first step of the second epoch (3 batches of 512)
                raise StalledWorkers(
                    "a data-parallel step waited 7 s and no worker answered within 5 s "
                    "(tcp://10.0.0.1:1234); check or restart them",
                    ["tcp://10.0.0.1:1234"],
                )
            return train_module.train_step(model, state, x, y)

        return step

    monkeypatch.setattr(train_module.cli, "_connect", lambda stack, args: object())
    monkeypatch.setattr(train_module.cli, "data_parallel_step", stalling_step)
    folder = tmp_path / "runs"
    argv = [*QUICK, "--epochs", "2", "--batch-size", "512", "--plot", "", "--workers", "2",
            "--step-timeout", "7", "--save", str(folder)]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        train_module.main(argv)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 1 and given == [7.0]
    assert line.startswith("python -m tracker_gpu.train: error: a data-parallel step waited")
    assert "tcp://10.0.0.1:1234" in line
    command = shlex.join(["python", "-m", "tracker_gpu.train", *argv, "--resume", str(folder)])
    assert line.endswith(f"; the checkpoints in {folder} keep the last finished epoch; resume "
                         f"with: {command}")  # fmt: skip
    assert train_module.loop.checkpoint_info(str(folder / "mlp.npz"), "mlp")["epoch"] == 1
