"""SIGINT and SIGTERM stop the main job after the current step (issue 29): a checkpoint under
`--save` (mid-epoch), one line with the exact command that resumes, exit 130 or 143, and no
child process left; the resumed run ends with the weights of the run that was not stopped,
bit for bit."""

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")
train_module = pytest.importorskip("tracker_gpu.train")


def checkpoint_info(path):
    return train_module.loop.checkpoint_info(path)


ROOT = str(Path(__file__).resolve().parents[1])
_STARTED = []  # the jobs a test started
JOB = ["--backend", "numpy", "--epochs", "3", "--plot", "", "--no-progress"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The checkpoints of the MLP and the CNN trained for 3 epochs without a stop."""
    folder = tmp_path_factory.mktemp("straight")
    train_module.run([*JOB, "--models", "mlp,cnn", "--save", str(folder)])
    return folder


@pytest.fixture(autouse=True)
def _no_job_left():
    """Whatever a test started is stopped at its end, passed or failed."""
    yield
    while _STARTED:
        job = _STARTED.pop()
        with contextlib.suppress(ProcessLookupError):  # its group: the workers too
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def _start(argv, folder):
    command = [sys.executable, "-m", "tracker_gpu.train", *argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, env=env)  # fmt: skip
    _STARTED.append(job)
    return job


def _wait_for(path, job, timeout=60):
    """Wait until the job has written `path` (so it is training), then return."""
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.02)


def _same_weights(a, b):
    with np.load(a) as first, np.load(b) as second:
        assert sorted(first.files) == sorted(second.files)
        for key in first.files:
            if key != "__checkpoint__":
                assert np.array_equal(first[key], second[key]), key
    assert checkpoint_info(a)["history"] == checkpoint_info(b)["history"]


def _the_line(err, signum, folder):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    name = signal.Signals(signum).name
    assert lines[0].startswith(f"stopped by {name} (")
    prefix = "; resume with: "
    assert prefix in lines[0]
    command = shlex.split(lines[0].split(prefix, 1)[1])
    assert command[:3] == ["python", "-m", "tracker_gpu.train"]
    assert command[-2:] == ["--resume", str(folder)]
    return command[3:]


@pytest.mark.parametrize(
    "signum, models, during",
    [(signal.SIGINT, "cnn", "cnn"), (signal.SIGTERM, "mlp,cnn", "cnn")],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_stops_after_a_step_and_the_line_resumes_bit_for_bit(
    straight, tmp_path, capsys, signum, models, during
):
    folder = tmp_path / "run"
    job = _start([*JOB, "--models", models, "--save", str(folder)], folder)
    _wait_for(folder / f"{during}.npz", job)  # its first epoch is saved: it is training
    job.send_signal(signum)
    out, err = job.communicate(timeout=30)
    assert job.returncode == 128 + signum
    resume = _the_line(err, signum, folder)
    info = checkpoint_info(folder / f"{during}.npz")
    kept = f"{during} saved after {info['epoch']} epochs"  # the line names where it stopped
    assert f"({kept} and {info['step']} steps)" in err if info["step"] else f"({kept})" in err

    results = train_module.run(resume)  # the command of the line, here
    out = capsys.readouterr().out
    assert f"{during}: resumed after {info['epoch']} epochs" in out
    for name in models.split(","):
        _same_weights(folder / f"{name}.npz", straight / f"{name}.npz")
    assert len(results) == len(models.split(","))


def test_ctrl_c_on_a_cluster_leaves_no_process(tmp_path):
    """Ctrl-C in a terminal reaches the whole process group, the Dask workers included: the job
    still stops after its step, and the workers are gone when it has exited."""
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("distributed")
    folder = tmp_path / "run"
    argv = [*JOB, "--models", "mlp", "--batch-size", "256", "--workers", "1"]
    job = _start([*argv, "--save", str(folder)], folder)
    _wait_for(folder / "mlp.npz", job)
    children = psutil.Process(job.pid).children(recursive=True)
    assert children  # the worker
    os.killpg(job.pid, signal.SIGINT)
    out, err = job.communicate(timeout=30)
    assert job.returncode == 130
    _the_line(err, signal.SIGINT, folder)
    assert "dask: scheduler tcp://" in out and "1 workers: tcp://" in out
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def test_a_stop_before_any_checkpoint_says_to_start_again():
    line = train_module.cli._stopped_line(
        train_module.Interrupted(signal.SIGTERM, "mlp", 0, 0, None),
        ["--models", "mlp", "--save", "/nonexistent/folder"],
    )
    assert line == (
        "stopped by SIGTERM before any checkpoint was written; start again with: "
        "python -m tracker_gpu.train --models mlp --save /nonexistent/folder"
    )


def test_a_signal_while_connecting_stops_at_once(tmp_path):
    """Before training (here: waiting for a scheduler that never answers) a signal stops the
    job at once, with its one line."""
    pytest.importorskip("distributed")
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(30)
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        folder = tmp_path / "run"
        job = _start([*JOB, "--models", "mlp", "--save", str(folder), "--scheduler", address],
                     folder)  # fmt: skip
        connection, _ = listener.accept()  # the job is connecting
        start = time.monotonic()
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=30)
        connection.close()
    assert time.monotonic() - start < 5
    assert job.returncode == 143
    assert err.strip().splitlines() == [
        "stopped by SIGTERM before any checkpoint was written; start again with: "
        + shlex.join(
            [
                "python",
                "-m",
                "tracker_gpu.train",
                *JOB,
                "--models",
                "mlp",
                "--save",
                str(folder),
                "--scheduler",
                address,
            ]
        )  # fmt: skip
    ]
