"""Saving over what is already at a path (`files.atomic_file`, under `nn.save` and
`optim.save_checkpoint`): a symbolic link stays a link, the file it points to replaced whole
(the temp file made beside that file, not beside the link); a file's permission bits are kept
(a private 0600 checkpoint stays private); a new file takes the umask's."""

import os
import stat

import numpy as np
import pytest

from tracker_gpu import nn, optim
from tracker_gpu.files import PARTIAL, atomic_file

KINDS = ["nn", "checkpoint", "atomic_file"]
POSIX = pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")


def save_any(kind, path, number):
    """Save something that holds `number` to `path` the way `kind` saves."""
    model = {"w": np.full(3, float(number))}
    if kind == "nn":
        nn.save(path, model)
    elif kind == "checkpoint":
        optim.save_checkpoint(path, model, optim.setup(optim.Descent(), model), number=number)
    else:
        with atomic_file(path) as file:
            file.write(f"number {number}".encode())


def load_any(kind, path):
    """The number saved at `path` by `save_any(kind, ...)`."""
    if kind == "nn":
        return int(nn.load(path)["w"][0])
    if kind == "checkpoint":
        return optim.read_checkpoint_info(path)["number"]
    with open(path, "rb") as file:
        return int(file.read().split()[1])


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def partials(*folders):
    return [e for folder in folders for e in os.listdir(folder) if PARTIAL in e]


def symlink(target, link):
    try:
        os.symlink(target, link)
    except (OSError, NotImplementedError) as error:  # Windows without the privilege
        pytest.skip(f"no symbolic links here: {error}")


@pytest.mark.parametrize("kind", KINDS)
def test_a_symbolic_link_stays_one_and_the_file_it_points_to_is_replaced(tmp_path, kind):
    """The link lives in another folder than its target, through a second link: the chain is
    followed, the target replaced, the links kept as they were, no temp file left anywhere."""
    runs, latest = tmp_path / "runs", tmp_path / "latest"
    runs.mkdir()
    latest.mkdir()
    target = runs / "run-1.npz"
    save_any(kind, target, 1)
    symlink(os.path.join("..", "runs", "run-1.npz"), latest / "hop.npz")
    symlink("hop.npz", latest / "model.npz")
    link = latest / "model.npz"
    save_any(kind, link, 2)
    assert os.path.islink(link) and os.readlink(link) == "hop.npz"
    assert os.path.islink(latest / "hop.npz")
    assert load_any(kind, target) == 2 and load_any(kind, link) == 2
    assert sorted(os.listdir(runs)) == ["run-1.npz"]
    assert sorted(os.listdir(latest)) == ["hop.npz", "model.npz"]
    # a save that fails through the link keeps the target and the link, and leaves nothing
    with pytest.raises(RuntimeError, match="failed"):
        with atomic_file(link) as file:
            file.write(b"half")
            raise RuntimeError("failed")
    assert os.path.islink(link) and load_any(kind, target) == 2
    assert partials(runs, latest) == []


def test_a_link_to_a_missing_file_creates_that_file(tmp_path):
    link = tmp_path / "model.npz"
    symlink("made.npz", link)
    nn.save(link, {"w": np.ones(2)})
    assert os.path.islink(link) and os.path.isfile(tmp_path / "made.npz")
    assert np.array_equal(nn.load(tmp_path / "made.npz")["w"], np.ones(2))


@POSIX
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", [0o600, 0o640, 0o444], ids=oct)
def test_a_saved_over_file_keeps_its_permission_bits(tmp_path, kind, bits):
    """A new file takes 0666 less the umask; one saved over keeps its own bits (read-only
    included: the folder's permission is what a rename needs)."""
    path = tmp_path / "model.npz"
    umask = os.umask(0o022)
    try:
        save_any(kind, path, 1)
        assert mode(path) == 0o644
        os.chmod(path, bits)
        save_any(kind, path, 2)
    finally:
        os.umask(umask)
    assert mode(path) == bits and load_any(kind, path) == 2
    assert os.listdir(tmp_path) == ["model.npz"]


@POSIX
def test_the_bits_of_the_file_a_link_points_to_are_kept(tmp_path):
    target, link = tmp_path / "run.npz", tmp_path / "latest.npz"
    nn.save(target, {"w": np.zeros(2)})
    os.chmod(target, 0o600)
    symlink("run.npz", link)
    nn.save(link, {"w": np.ones(2)})
    assert os.path.islink(link) and mode(target) == 0o600
    assert np.array_equal(nn.load(target)["w"], np.ones(2))
