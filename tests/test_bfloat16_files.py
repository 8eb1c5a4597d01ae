"""bfloat16 in the library's files: `nn.save`/`nn.load` and the optimiser's checkpoints store a
bfloat16 array as its uint16 bits with the dtype's name and load it back bit for bit; a file
whose bits and description disagree, or a raw `|V2` array (how `np.save` writes bfloat16), is
refused with one error naming the file and the fix."""

import json
import zipfile

import ml_dtypes
import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.files import BadFileError

BF16 = np.dtype(ml_dtypes.bfloat16)


def model(seed=0):
    rng = np.random.default_rng(seed)
    return nn.Chain(
        nn.Dense(5, 7, tg.tanh, rng=rng, dtype="bfloat16"),
        nn.LayerNorm(7, dtype="bfloat16"),
        nn.Dense(7, 3, rng=rng, dtype="float32"),
    )


def bits(a):
    """The raw bits of an array, as NumPy sees them: the test's own reference."""
    a = np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def trained(m):
    x = np.random.default_rng(3).standard_normal((4, 5)).astype(BF16)
    state = optim.setup(optim.Adam(0.1), m)
    for _ in range(2):
        (g,) = tg.gradient(lambda m: tg.sum(m(x) ** 2), m)
        state, m = optim.update(state, m, g)
    return m, state


def leaves(m):
    return list(nn.io._parameters(m).values())


def test_a_bfloat16_model_round_trips_bit_for_bit(tmp_path):
    m, _ = trained(model())
    path = tmp_path / "m.npz"
    nn.save(path, m)
    loaded = nn.load(path, model(seed=1))
    pairs = list(zip(leaves(loaded), leaves(m)))
    assert [a.dtype for a, _ in pairs] == [BF16, BF16, BF16, BF16, np.float32, np.float32]
    for a, b in pairs:
        assert a.dtype == b.dtype and np.array_equal(bits(a), bits(b))
    plain = nn.load(path)  # without a model: NumPy arrays of the saved dtypes
    assert plain["layers.0.weight"].dtype == BF16
    assert np.array_equal(bits(plain["layers.0.weight"]), bits(m.layers[0].weight))
    with zipfile.ZipFile(path) as z:  # stored as uint16 bits, the dtype named
        assert z.open("layers.0.weight.npy").read().find(b"<u2") > 0


def test_a_bfloat16_checkpoint_resumes_bit_for_bit(tmp_path):
    m, state = trained(model())
    path = tmp_path / "c.npz"
    optim.save_checkpoint(path, m, state, epoch=2)
    m2, state2, info = optim.load_checkpoint(path, model(seed=1))
    assert info == {"epoch": 2}
    for a, b in zip(leaves(m2), leaves(m)):
        assert a.dtype == b.dtype and np.array_equal(bits(a), bits(b))
    moments = [a for a in tg.pytree.tree_leaves(state2) if getattr(a, "ndim", 0)]
    expected = [a for a in tg.pytree.tree_leaves(state) if getattr(a, "ndim", 0)]
    assert moments and len(moments) == len(expected)
    for a, b in zip(moments, expected):
        assert a.dtype == b.dtype and np.array_equal(bits(a), bits(b))


def test_a_bfloat16_torch_model_saves_and_loads(tmp_path):
    torch = pytest.importorskip("torch")
    xp = pytest.importorskip("array_api_compat.torch")
    m = nn.place(model(), xp=xp)
    assert m.layers[0].weight.dtype == torch.bfloat16
    nn.save(tmp_path / "m.npz", m)
    loaded = nn.load(tmp_path / "m.npz", nn.place(model(seed=1), xp=xp))
    for a, b in zip(leaves(loaded), leaves(m)):
        assert a.dtype == b.dtype and torch.equal(a, b)


def rewrite(path, member, array=None, meta=None):
    """The file at `path` with `member` replaced by `array`, or its description by `meta`."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    if array is not None:
        arrays[member] = array
    if meta is not None:
        arrays[member] = np.array(json.dumps(meta))
    np.savez(path, **arrays)


def test_bits_that_disagree_with_the_description_are_refused(tmp_path):
    path = tmp_path / "m.npz"
    nn.save(path, model())
    rewrite(path, "layers.0.weight", np.zeros((7, 5), np.float32))
    with pytest.raises(BadFileError, match=r"m\.npz.*says 'layers\.0\.weight' holds bfloat16"):
        nn.load(path, model())
    nn.save(path, model())
    rewrite(path, "__model__", meta={"format": 1, "dtypes": {"layers.0.weight": "float8"}})
    with pytest.raises(BadFileError, match="holds 'float8'; only bfloat16 is stored as bits"):
        nn.load(path, model())
    rewrite(path, "__model__", meta={"format": 1, "dtypes": ["bfloat16"]})
    with pytest.raises(BadFileError, match="dtypes are .* not names by array"):
        nn.load(path)
    rewrite(path, "__model__", meta={"format": 1, "dtypes": {"nowhere": "bfloat16"}})
    with pytest.raises(BadFileError, match=r"dtypes of arrays it lacks: \['nowhere'\]"):
        nn.load(path)


def test_a_checkpoints_bits_that_disagree_are_refused(tmp_path):
    m, state = trained(model())
    path = tmp_path / "c.npz"
    optim.save_checkpoint(path, m, state)
    rewrite(path, "model/layers.0.weight", np.zeros((7, 5), np.int16))
    with pytest.raises(BadFileError, match="stored as uint16 bits.*but it holds int16"):
        optim.load_checkpoint(path, model())


def test_raw_bfloat16_written_by_numpy_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "raw.npz"
    np.savez(path, w=np.ones(3, BF16))
    with pytest.raises(BadFileError, match=r"raw\.npz: 'w' has dtype \|V2.*save it with nn\.save"):
        nn.load(path)


FLOATS = ("float64", "float32", "float16", "bfloat16")


def dense(dtype, seed=0):
    return nn.Dense(3, 4, rng=np.random.default_rng(seed), dtype=dtype)


@pytest.mark.parametrize("into", FLOATS)
@pytest.mark.parametrize("saved", FLOATS)
def test_a_file_of_every_float_dtype_loads_into_a_model_of_every_other(tmp_path, saved, into):
    """Into a bfloat16 model, a file of another dtype raised an AttributeError (from nn.load)
    or was called malformed (from load_checkpoint). Each load is NumPy's own cast of the saved
    values (ml_dtypes' for bfloat16), by `nn.load` and by `load_checkpoint`."""
    source = dense(saved)
    expected = np.asarray(source.weight).astype(np.dtype(ml_dtypes.bfloat16) if into == "bfloat16"
                                                else np.dtype(into))  # fmt: skip
    nn.save(tmp_path / "m.npz", source)
    loaded = nn.load(tmp_path / "m.npz", dense(into, seed=1))
    np.testing.assert_array_equal(bits(np.asarray(loaded.weight)), bits(expected))
    optim.save_checkpoint(tmp_path / "c.npz", source, optim.setup(optim.Adam(), source))
    loaded, _, _ = optim.load_checkpoint(tmp_path / "c.npz", dense(into, seed=1))
    np.testing.assert_array_equal(bits(np.asarray(loaded.weight)), bits(expected))
