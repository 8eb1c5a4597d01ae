"""A saved file's arrays go into a model only where they are what was saved: arrays held in
several places stay so (and only so), two places never share a name, every random generator
of the model is saved or refused, and no value is changed by its cast into the model's dtype
beyond rounding. Each refusal is checked for both kinds of file where both apply (`nn.save`
files and checkpoints)."""

import random

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.files import BadFileError


def _save_and_load(kind, tmp_path, saved, template):
    path = tmp_path / f"{kind}.npz"
    if kind == "checkpoint":
        optim.save_checkpoint(path, saved, optim.setup(optim.Adam(), saved))
        return optim.load_checkpoint(path, template).model
    nn.save(path, saved)
    return nn.load(path, template)


def test_a_tie_the_model_has_not_is_refused(tmp_path):
    """A checkpoint of one array in two places loaded into a model of two arrays of other
    shapes gave both places the one saved array, with one optimiser state."""
    a = np.ones(3)
    path = tmp_path / "tied.npz"
    optim.save_checkpoint(path, {"t1": a, "t2": a}, optim.setup(optim.Adam(), {"t1": a, "t2": a}))
    for untied in ({"t1": np.zeros(3), "t2": np.zeros((5, 7), np.float32)},
                   {"t1": np.zeros(3), "t2": np.zeros(3)}):  # fmt: skip
        with pytest.raises(BadFileError, match="held in several places"):
            optim.load_checkpoint(path, untied)
    b = np.zeros(3)
    loaded = optim.load_checkpoint(path, {"t1": b, "t2": b}).model
    assert loaded["t1"] is loaded["t2"] and np.array_equal(loaded["t1"], a)


def test_a_tie_the_checkpoint_has_not_is_refused(tmp_path):
    path = tmp_path / "untied.npz"
    model = {"t1": np.ones(3), "t2": np.ones(3)}
    optim.save_checkpoint(path, model, optim.setup(optim.Adam(), model))
    b = np.zeros(3)
    with pytest.raises(BadFileError, match="held in several places"):
        optim.load_checkpoint(path, {"t1": b, "t2": b})


def test_nn_load_refuses_untied_values_for_a_tied_model(tmp_path):
    """A file of two different arrays loaded into a model that ties them kept the first and
    dropped the second without a word; equal ones load, tied."""
    path, tied = tmp_path / "m.npz", np.zeros(3)
    nn.save(path, {"t1": np.ones(3), "t2": np.full(3, 7.0)})
    with pytest.raises(BadFileError, match="arrays t1 and t2 differ"):
        nn.load(path, {"t1": tied, "t2": tied})
    nn.save(path, {"t1": np.ones(3), "t2": np.ones(3)})
    loaded = nn.load(path, {"t1": tied, "t2": tied})
    assert loaded["t1"] is loaded["t2"] and np.array_equal(loaded["t1"], np.ones(3))


@pytest.mark.parametrize("kind", ["nn.save", "checkpoint"])
@pytest.mark.parametrize(
    "model",
    [{"a.b": np.ones(2), "a": {"b": np.zeros(2)}}, {0: np.ones(2), "0": np.zeros(2)}],
    ids=["a dotted key", "keys of two types"],
)
def test_two_places_of_one_name_are_refused_when_saved(kind, model, tmp_path):
    """Both were saved under one name, and the other array was lost without a word."""
    with pytest.raises(ValueError, match="two places of the model have the path"):
        _save_and_load(kind, tmp_path, model, model)
    assert not list(tmp_path.iterdir())


def _dropout_model(rng):
    return nn.Chain(nn.Dense(4, 4, rng=np.random.default_rng(0)), nn.Dropout(0.5, rng=rng))


@pytest.mark.parametrize("make", [np.random.default_rng, np.random.RandomState])
def test_a_resumed_dropout_draws_what_the_run_straight_through_draws(make, tmp_path):
    """A RandomState's state was not saved: a resumed run drew from the template's."""
    model, x = _dropout_model(make(1)), np.ones((2, 4))
    path = tmp_path / "c.npz"
    optim.save_checkpoint(path, model, optim.setup(optim.Adam(), model))
    straight = tg.withgradient(lambda m: tg.sum(m(x)), model).val
    resumed = optim.load_checkpoint(path, _dropout_model(make(99))).model
    assert tg.withgradient(lambda m: tg.sum(m(x)), resumed).val == straight


def test_a_generator_that_cannot_be_saved_is_refused(tmp_path):
    model = _dropout_model(random.Random(1))
    with pytest.raises(TypeError, match="layers.1.rng .Random. cannot be saved"):
        optim.save_checkpoint(tmp_path / "c.npz", model, optim.setup(optim.Adam(), model))


LOSSY = {
    "complex": (np.array([1.0 + 2.0j, 3.0]), np.zeros(2), "imaginary parts"),
    "overflow": (np.array([1e10, 1.0]), np.zeros(2, np.float16), "would become inf"),
    "integer": (np.array([2.5, 1.0]), np.zeros(2, np.int64), "changed by the cast"),
}


@pytest.mark.parametrize("kind", ["nn.save", "checkpoint"])
@pytest.mark.parametrize("case", LOSSY)
def test_a_cast_that_changes_the_values_is_refused(kind, case, tmp_path):
    """Complex into real dropped the imaginary parts, 1e10 into float16 became inf: loaded
    with a NumPy warning at most."""
    saved, template, why = LOSSY[case]
    with pytest.raises(BadFileError, match=why):
        _save_and_load(kind, tmp_path, {"w": saved}, {"w": template})


def test_an_optimiser_state_that_a_narrower_float_cannot_hold_is_refused(tmp_path):
    """Adam's second moment of a gradient of 1e30 is 1e60: into a float32 model it became inf
    (the model's own arrays were checked, the state's were not), with a NumPy warning at most."""
    model = {"w": np.array([1e20, 1.0])}
    state, model = optim.update(optim.setup(optim.Adam(0.1), model), model,
                                {"w": np.array([1e30, 1.0])})  # fmt: skip
    optim.save_checkpoint(tmp_path / "c.npz", model, state)
    with pytest.raises(BadFileError, match="optimiser state of w .*would become inf"):
        optim.load_checkpoint(tmp_path / "c.npz", {"w": np.zeros(2, np.float32)})


@pytest.mark.parametrize("kind", ["nn.save", "checkpoint"])
def test_rounding_into_a_narrower_float_still_loads(kind, tmp_path):
    saved = np.array([0.1, 1e-30, -2.0])
    loaded = _save_and_load(kind, tmp_path, {"w": saved}, {"w": np.zeros(3, np.float32)})
    assert loaded["w"].dtype == np.float32
    assert np.array_equal(loaded["w"], saved.astype(np.float32))


def _counted_models():
    """Models holding a count of batches (an integer) beside their floating arrays."""
    rng = np.random.default_rng(0)
    return {
        "BatchNorm": nn.BatchNorm(2, momentum=None),
        "InstanceNorm": nn.InstanceNorm(2, track_stats=True),
        "Chain": nn.Chain(nn.Dense(3, 2, rng=rng), nn.BatchNorm(2, momentum=None)),
    }


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("name", list(_counted_models()))
def test_load_with_a_dtype_casts_what_place_casts(name, dtype, tmp_path):
    """`nn.load(..., dtype=)` cast every array, a BatchNorm's integer count too (float16 stops
    counting at 2048); it casts the real floating ones, as `nn.place` does."""
    model = _counted_models()[name]
    nn.save(tmp_path / "m.npz", model)
    loaded = nn.load(tmp_path / "m.npz", _counted_models()[name], dtype=dtype)
    placed = nn.place(model, dtype=dtype)
    got, want = optim.tree.arrays_by_path(loaded), optim.tree.arrays_by_path(placed)
    assert list(got) == list(want)
    for path in got:
        assert str(got[path].dtype) == str(want[path].dtype), path


def test_float64_values_loaded_into_a_torch_float16_model_round_once(tmp_path):
    """PyTorch casts float64 to float16 through float32: 1 + 2^-11 + 2^-40 rounded twice is 1,
    once 1 + 2^-10 (NumPy's); six of 100,003 random values differed."""
    torch = pytest.importorskip("torch")
    values = np.concatenate([[1 + 2**-11 + 2**-40], np.random.default_rng(0).standard_normal(999)])
    nn.save(tmp_path / "w.npz", {"w": values})
    model = {"w": nn.asarray(np.zeros(values.size), xp="torch", dtype="float16")}
    loaded = nn.load(tmp_path / "w.npz", model)["w"]
    assert loaded.dtype == torch.float16
    np.testing.assert_array_equal(nn.to_numpy(loaded), values.astype(np.float16))
