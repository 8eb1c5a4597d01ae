"""Every file the library writes is atomic and durable (issue 29).

A process killed (SIGKILL) at a random time while it saves, over and over, a model (`nn.save`)
or a checkpoint (`optim.save_checkpoint`) leaves the previous file or the new one, always
loadable, and the next save removes the temp file it left. A save that fails (a full disk, a
path that is no folder) raises one `SaveError` naming the path and keeps the old file.

The killed processes are forked by one helper process that imported the library once, so that
the 40 kills take a few seconds, not 40 imports.
"""

import errno
import os
import random
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tracker_gpu import nn, optim
from tracker_gpu.files import PARTIAL, SaveError, atomic_file

RUNS = 20
SHAPES = {"a": (512, 1024), "b": (1024, 512), "c": (1024,)}  # about 4 MiB of float32

# The helper: reads a command per line from stdin. "save KIND PATH" forks a child that saves
# models numbered 0, 1, 2, ... (every array filled with its number) to PATH in a loop, and
# answers the child's pid once its first save is done; "reap PID" waits for that (killed) child.
HELPER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from tracker_gpu import nn, optim

    SHAPES = SHAPES_HERE

    def model(k):
        return {key: np.full(shape, k, np.float32) for key, shape in SHAPES.items()}

    def save(kind, path, k):
        if kind == "nn":
            nn.save(path, model(k))
        else:
            m = model(k)
            optim.save_checkpoint(path, m, optim.setup(optim.Adam(), m), number=k)

    for line in sys.stdin:
        command, *args = line.split()
        if command == "save":
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                save(args[0], args[1], 0)
                os.write(write, b"ready")
                k = 1
                while True:
                    save(args[0], args[1], k)
                    k += 1
            os.close(write)
            os.read(read, 5)
            os.close(read)
            print(pid, flush=True)
        elif command == "reap":
            os.waitpid(int(args[0]), 0)
            print("reaped", flush=True)
    """
).replace("SHAPES_HERE", repr(SHAPES))


@pytest.fixture(scope="module")
def helper():
    process = subprocess.Popen(
        [sys.executable, "-c", HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield process
    process.stdin.close()
    process.wait(timeout=30)


def template():
    return {key: np.zeros(shape, np.float32) for key, shape in SHAPES.items()}


def load(kind, path):
    """The number of the model saved at `path`: every array must hold it, whole."""
    if kind == "nn":
        model = nn.load(path, template())
    else:
        model, _, info = optim.load_checkpoint(path, template())
    number = model["a"].flat[0]
    assert all(np.all(x == number) for x in model.values())
    if kind == "checkpoint":
        assert info["number"] == number
    return int(number)


def partials(folder):
    return [name for name in os.listdir(folder) if PARTIAL in name]


@pytest.mark.parametrize("kind", ["nn", "checkpoint"])
def test_kill_9_while_saving_leaves_a_loadable_file(helper, tmp_path, kind):
    rng = random.Random(29)
    path = str(tmp_path / "model.npz")
    caught_writing = 0
    for run in range(RUNS):
        helper.stdin.write(f"save {kind} {path}\n")
        helper.stdin.flush()
        pid = int(helper.stdout.readline())
        time.sleep(rng.uniform(0.0, 0.15))  # the child saves on and on: kill it in any save
        os.kill(pid, 9)
        helper.stdin.write(f"reap {pid}\n")
        helper.stdin.flush()
        assert helper.stdout.readline().strip() == "reaped"
        caught_writing += bool(partials(tmp_path))
        number = load(kind, path)  # the old file or the new one, whole
        assert number >= 0
        model = {key: np.full(shape, -1, np.float32) for key, shape in SHAPES.items()}
        if kind == "nn":  # the next save removes what the killed one left
            nn.save(path, model)
        else:
            optim.save_checkpoint(path, model, optim.setup(optim.Adam(), model), number=-1)
        assert load(kind, path) == -1
        assert partials(tmp_path) == [], f"run {run}: a temp file is left after the next save"
        assert sorted(os.listdir(tmp_path)) == ["model.npz"]
    assert caught_writing >= 2, "the kills should land while a temp file is being written"


def save_any(kind, path, model):
    if kind == "nn":
        nn.save(path, model)
    elif kind == "checkpoint":
        optim.save_checkpoint(path, model, optim.setup(optim.Descent(), model))
    else:
        with atomic_file(path) as file:
            file.write(b"x" * 100)


KINDS = ["nn", "checkpoint", "atomic_file"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_full_disk_keeps_the_old_file(tmp_path, monkeypatch, kind):
    path = tmp_path / "model.npz"
    old = {"w": np.arange(3.0)}
    save_any(kind, path, old)
    before = path.read_bytes()
    real_fdopen = os.fdopen

    class FullDisk:  # a file whose writes fail as on a full disk, after the first few
        def __init__(self, file):
            self.file, self.written = file, 0

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            self.written += len(data)
            if self.written > 50:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.file.write(data)

    monkeypatch.setattr(
        "tracker_gpu.files.os.fdopen", lambda *a, **k: FullDisk(real_fdopen(*a, **k))
    )
    with pytest.raises(SaveError) as raised:
        save_any(kind, path, {"w": np.ones(1000)})
    message = str(raised.value)
    assert str(path) in message and "No space left on device" in message
    assert "\n" not in message and isinstance(raised.value, OSError)
    assert raised.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.npz"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_path_that_cannot_be_written(tmp_path, kind):
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "folder").mkdir()
    for path, cause in [
        (tmp_path / "file" / "x.npz", "Not a directory"),
        (tmp_path / "missing" / "x.npz", "No such file or directory"),
        (tmp_path / "folder", "Is a directory"),
    ]:
        with pytest.raises(SaveError, match=f"cannot write {path}: {cause}"):
            save_any(kind, path, {"w": np.ones(2)})
    assert sorted(os.listdir(tmp_path)) == ["file", "folder"]
    assert os.listdir(tmp_path / "folder") == []


def test_dev_full_is_one_error(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with pytest.raises(SaveError, match="cannot write /dev/full/x.npz: Not a directory"):
        nn.save("/dev/full/x.npz", {"w": np.ones(2)})


def test_stale_temp_files_go_at_the_next_save_but_a_live_ones_stay(tmp_path):
    path = tmp_path / "run.npz"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / f"run.npz{PARTIAL}{dead.stdout.strip()}-0000"
    live = tmp_path / f"run.npz{PARTIAL}{os.getppid()}-0000"  # a running process is saving
    other = tmp_path / f"other.npz{PARTIAL}{dead.stdout.strip()}-0000"  # another file's
    for scratch in (stale, live, other):
        scratch.write_bytes(b"half a file")
    nn.save(path, {"w": np.ones(2)})
    assert sorted(os.listdir(tmp_path)) == sorted(["run.npz", live.name, other.name])


def test_an_error_while_writing_removes_the_temp_file(tmp_path):
    path = tmp_path / "plot.png"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="drawing failed"):
        with atomic_file(path) as file:
            file.write(b"new, half")
            raise RuntimeError("drawing failed")
    assert os.listdir(tmp_path) == ["plot.png"] and path.read_bytes() == b"old"


def test_saves_are_fsynced_file_and_folder(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr("tracker_gpu.files.os.fsync", lambda fd: synced.append(fd) or real(fd))
    nn.save(tmp_path / "m.npz", {"w": np.ones(2)})
    assert len(synced) == 2  # the temp file, then the folder after the rename
