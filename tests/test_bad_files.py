"""Broken and hostile files are refused before they are read (issue 29).

Every kind of file the library loads (`KINDS`: `nn.save` files loaded into a model or alone,
checkpoints loaded or checked) meets every corruption of `CORRUPTIONS`, which are written
against the zip and `.npy` layout only (the file's members, its description member, its bytes),
so that a new kind of saved file is covered by adding one line to `KINDS`. Each must raise the
one `BadFileError` (a `ValueError`), in one line naming the file, with a peak of allocated
memory (tracemalloc) under twice the size of the model.
"""

import io
import json
import struct
import tracemalloc
import warnings
import zipfile
import zlib

import numpy as np
import pytest

from tracker_gpu import nn, optim
from tracker_gpu.files import BadFileError

BOMB = 64 * 2**20  # bytes a compressed bomb decompresses to: 32 times the model


def big_model():
    rng = np.random.default_rng(0)
    return nn.Chain(nn.Dense(512, 512, nn.relu, rng=rng), nn.Dense(512, 512, rng=rng))  # 2 MiB


def other_model():  # what a file of another model holds
    return nn.Chain(nn.Dense(512, 256, nn.relu), nn.Dense(256, 512))


def small_model():
    rng = np.random.default_rng(1)
    return nn.Chain(nn.Dense(3, 4, nn.relu, rng=rng), nn.Dense(4, 2, rng=rng))


def save_checkpoint(path, model):
    state = optim.setup(optim.OptimiserChain(optim.ClipNorm(1.0), optim.Adam(1e-3)), model)
    optim.save_checkpoint(path, model, state, epoch=3, rng={"state": [1, 2, 3]})


# name: (save(path, model), load(path, model))
KINDS = {
    "nn.save, loaded into a model": (nn.save, nn.load),
    "nn.save, loaded alone": (nn.save, lambda path, model: nn.load(path)),
    "checkpoint, loaded": (save_checkpoint, optim.load_checkpoint),
    "checkpoint, checked": (save_checkpoint, optim.read_checkpoint_info),
}


# --- the zip and .npy layout, to corrupt any saved file the same way
def members(data):
    """`{name: (raw .npy bytes)}` of the archive `data`, in order."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def archive(entries, deflated=(), declare=None):
    """An archive of `entries` (`[(name, bytes or a function writing to a file)]`), the names
    in `deflated` compressed; `declare` gives the zip directory's fields of a name instead of
    the true ones (`{name: {"file_size": n, "CRC": c}}`)."""
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a duplicate name, on purpose
        with zipfile.ZipFile(out, "w") as new:
            for name, content in entries:
                info = zipfile.ZipInfo(name)
                info.compress_type = (
                    zipfile.ZIP_DEFLATED if name in deflated else zipfile.ZIP_STORED
                )
                with new.open(info, "w") as file:
                    content(file) if callable(content) else file.write(content)
            for name, fields in (declare or {}).items():  # the directory is written at close
                for field, value in fields.items():
                    setattr(new.getinfo(name), field, value)
    return out.getvalue()


def npy(array, allow_pickle=False):
    out = io.BytesIO()
    np.save(out, array, allow_pickle=allow_pickle)
    return out.getvalue()


def header_of(raw):
    """`(shape, fortran, dtype, offset)` of raw .npy bytes."""
    file = io.BytesIO(raw)
    version = np.lib.format.read_magic(file)
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(file)
    return shape, fortran, dtype, file.tell()


def npy_header(shape, dtype):
    out = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": shape}  # fmt: skip
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue()


def with_header(raw, shape=None, dtype=None):
    """`raw` .npy bytes with the header declaring `shape` and `dtype` and the same data."""
    old_shape, _, old_dtype, offset = header_of(raw)
    return npy_header(old_shape if shape is None else shape, dtype or old_dtype) + raw[offset:]


def description(entries):
    return next(name for name in entries if name.startswith("__"))


def largest(entries):
    arrays = [n for n in entries if not n.startswith("__")]
    return max(arrays, key=lambda n: len(entries[n]))


def edit(entries, name, content=None, deflated=(), drop=False):
    items = [(n, content if n == name and content is not None else c)
             for n, c in entries.items() if not (drop and n == name)]  # fmt: skip
    return archive(items, deflated)


def edit_description(entries, change):
    name = description(entries)
    meta = json.loads(str(np.load(io.BytesIO(entries[name]))))
    text = change(meta)
    return edit(entries, name, npy(np.array(text if isinstance(text, str) else json.dumps(text))))


def set_key(key, value):
    def change(meta):
        meta = dict(meta)
        if value is KeyError:
            meta.pop(key)
        else:
            meta[key] = value
        return meta

    return change


def bomb_writer(first=b""):
    """What writes `first`, then `BOMB` zero bytes, a MiB at a time."""

    def write(file):
        file.write(first)
        chunk = bytes(2**20)
        for _ in range(BOMB // len(chunk)):
            file.write(chunk)

    return write


def honest_bomb(entries, name=None):
    """Member `name` (else the largest) replaced by a compressed array of `BOMB` bytes that
    says so, in its .npy header and in the zip's directory."""
    name = name or largest(entries)
    write = bomb_writer(npy_header((BOMB // 4,), np.float32))
    items = [(n, write if n == name else c) for n, c in entries.items()]
    if name not in entries:
        items.append((name, write))
    return archive(items, deflated={name})


def lying_bomb(entries):
    """The largest member's data followed by `BOMB` bytes more, compressed, while the zip's
    directory declares the member's own size (and the checksum of all of it)."""
    name = largest(entries)
    raw = entries[name]
    crc = zlib.crc32(bytes(BOMB), zlib.crc32(raw))
    items = [(n, bomb_writer(raw) if n == name else c) for n, c in entries.items()]
    return archive(items, {name}, {name: {"file_size": len(raw), "CRC": crc}})


def declaring(entries, size):
    name = largest(entries)
    return archive(list(entries.items()), declare={name: {"file_size": size}})


def flip(data, at):
    data = bytearray(data)
    data[at] ^= 0xFF
    return bytes(data)


def data_at(data, name):
    """Where the data of member `name` start, in the file's bytes."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = z.getinfo(name)
    local = data[info.header_offset : info.header_offset + 30]
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_length + extra_length


def central_directory(data):
    return data.rfind(b"PK\x01\x02")


# name: corrupt(file bytes, its members) -> bytes
CORRUPTIONS = {
    "empty": lambda d, m: b"",
    "not a zip": lambda d, m: b"tracker_gpu " * 1000,
    "a lone .npy": lambda d, m: m[largest(m)],
    "truncated to 30 bytes": lambda d, m: d[:30],
    "truncated to a quarter": lambda d, m: d[: len(d) // 4],
    "truncated to a half": lambda d, m: d[: len(d) // 2],
    "truncated before its directory": lambda d, m: d[: central_directory(d)],
    "truncated in its end record": lambda d, m: d[:-10],
    "without its last byte": lambda d, m: d[:-1],
    "a flipped byte in the first member's data": lambda d, m: flip(
        d, data_at(d, next(iter(m))) + 150
    ),
    "a flipped byte in the largest member's data": lambda d, m: flip(
        d, data_at(d, largest(m)) + 1000
    ),
    "a flipped byte in the description": lambda d, m: flip(d, data_at(d, description(m)) + 140),
    "a flipped byte in a .npy magic": lambda d, m: flip(d, data_at(d, largest(m)) + 1),
    "a flipped byte in a local header's name": lambda d, m: flip(d, 31),
    "a flipped byte in the directory's name": lambda d, m: flip(d, central_directory(d) + 47),
    "zeros over the middle": lambda d, m: (
        d[: len(d) // 3] + bytes(len(d) // 3) + d[2 * len(d) // 3 :]
    ),
    "unknown format 99": lambda d, m: edit_description(m, set_key("format", 99)),
    "format as a string": lambda d, m: edit_description(m, set_key("format", "1")),
    "no format": lambda d, m: edit_description(m, set_key("format", KeyError)),
    "a description that is not JSON": lambda d, m: edit_description(m, lambda meta: "{format: 1"),
    "a description that is a list": lambda d, m: edit_description(m, lambda meta: [meta]),
    "a description of numbers": lambda d, m: edit(m, description(m), npy(np.arange(3.0))),
    "a description declaring 1 GiB": lambda d, m: edit(
        m, description(m), with_header(m[description(m)], dtype="<U268435456")
    ),
    "a member declaring 24 GB": lambda d, m: edit(
        m, largest(m), with_header(m[largest(m)], shape=(3 * 10**9,), dtype="<f8")
    ),
    "a member declaring 80 TB": lambda d, m: edit(
        m, largest(m), with_header(m[largest(m)], shape=(10**13,), dtype="<f8")
    ),
    "a member declaring a negative shape": lambda d, m: edit(
        m,
        largest(m),
        with_header(m[largest(m)], shape=(-1, -(len(m[largest(m)]) // 4)), dtype="<f4"),
    ),
    "a member whose directory declares 4 GiB": lambda d, m: declaring(m, 2**32 - 16),
    "a member whose directory declares 24 GB": lambda d, m: declaring(m, 24 * 10**9),
    "a member whose directory declares 80 TB": lambda d, m: declaring(m, 80 * 10**12),
    "a compressed bomb": lambda d, m: honest_bomb(m),
    "a compressed bomb that lies about its size": lambda d, m: lying_bomb(m),
    "an extra compressed member": lambda d, m: honest_bomb(m, "extra.npy"),
    "an object array": lambda d, m: edit(
        m, largest(m), npy(np.array([print, 1], dtype=object), allow_pickle=True)
    ),
    "an array of strings": lambda d, m: edit(m, largest(m), npy(np.array(["a", "b"]))),
    "a member missing": lambda d, m: edit(m, largest(m), drop=True),
    "a member twice": lambda d, m: archive(list(m.items()) + [(largest(m), m[largest(m)])]),
    "a member that is not .npy": lambda d, m: archive(list(m.items()) + [("notes.txt", b"hello")]),
    "a member of the wrong shape": lambda d, m: edit(m, largest(m), npy(np.zeros(7, np.float32))),
    "a file of another model": None,  # saved from another model, by the kind's own save
}


NEEDS_A_MODEL = {"a member missing", "a member of the wrong shape", "a file of another model"}


@pytest.fixture(scope="module")
def good_files(tmp_path_factory):
    folder, files = tmp_path_factory.mktemp("good"), {}
    for kind, (save, _) in KINDS.items():
        for which, model in (("model", big_model()), ("other", other_model())):
            path = folder / f"{kind}-{which}.npz"
            save(path, model)
            files[kind, which] = path.read_bytes()
    return files


def model_bytes(model):
    return sum(a.nbytes for a in nn._parameters(model).values())


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_bad_file_is_one_error_naming_it(good_files, tmp_path, kind, corruption):
    save, load = KINDS[kind]
    if "alone" in kind and corruption in NEEDS_A_MODEL:
        pytest.skip("without a model, this is a good file of another model")
    if CORRUPTIONS[corruption] is None:
        bad = good_files[kind, "other"]
    else:
        good = good_files[kind, "model"]
        bad = CORRUPTIONS[corruption](good, members(good))
    path = tmp_path / "bad file.npz"
    path.write_bytes(bad)
    model = big_model()
    tracemalloc.start()
    try:
        with pytest.raises(BadFileError) as raised:
            load(path, model)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(raised.value)
    assert str(path) in message and "\n" not in message, message
    assert isinstance(raised.value, ValueError)
    assert peak < 2 * model_bytes(model), f"peak {peak} bytes for {message}"


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_good_files_load(good_files, tmp_path, kind):
    save, load = KINDS[kind]
    path = tmp_path / "good.npz"
    path.write_bytes(good_files[kind, "model"])
    load(path, big_model())


def small_files(tmp_path):
    model, files = small_model(), {}
    for kind, (save, load) in KINDS.items():
        save(tmp_path / "good.npz", model)
        files[kind] = (tmp_path / "good.npz").read_bytes(), repr(load(tmp_path / "good.npz", model))
    return model, files


def test_every_flipped_byte_is_refused_or_harmless(tmp_path):
    """A byte flipped anywhere in a small file of each kind: the same result, or the error."""
    model, files = small_files(tmp_path)
    path = tmp_path / "flipped.npz"
    for kind, stride in (("nn.save, loaded alone", 2), ("checkpoint, loaded", 5)):
        data, expected = files[kind]
        _, load = KINDS[kind]
        for at in range(0, len(data), stride):
            path.write_bytes(flip(data, at))
            try:
                got = repr(load(path, model))
            except BadFileError as error:
                assert str(path) in str(error)
            else:
                assert got == expected, f"{kind}: byte {at} flipped loads something else"


def paths_of(value, path=()):
    yield path
    if isinstance(value, dict):
        for key, v in value.items():
            yield from paths_of(v, path + (key,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths_of(v, path + (i,))


def replaced(value, path, new):
    if not path:
        return new
    value = dict(value) if isinstance(value, dict) else list(value)
    if new is KeyError and len(path) == 1:
        del value[path[0]]
    else:
        value[path[0]] = replaced(value[path[0]], path[1:], new)
    return value


def test_every_edit_of_the_description_is_refused_or_loads(tmp_path):
    """Each key of each kind's description deleted or given another type: the error, or a
    load (edits of free-form parts such as `info` are not errors)."""
    model, files = small_files(tmp_path)
    path = tmp_path / "edited.npz"
    refused = 0
    for kind in ("nn.save, loaded into a model", "checkpoint, loaded"):
        _, load = KINDS[kind]
        entries = members(files[kind][0])
        meta = json.loads(str(np.load(io.BytesIO(entries[description(entries)]))))
        for where in list(paths_of(meta))[1:]:
            for new in (KeyError, None, "x", -1.5, [], {"array": "model/nothing"}):
                path.write_bytes(
                    edit_description(
                        entries, lambda m, where=where, new=new: replaced(m, where, new)
                    )
                )
                try:
                    load(path, model)
                except BadFileError as error:
                    assert str(path) in str(error)
                    refused += 1
    assert refused > 100


def test_pickles_are_never_loaded(tmp_path):
    path = tmp_path / "pickle.npz"
    np.savez(path, w=np.array([{"a": 1}], dtype=object))
    with pytest.raises(BadFileError, match="a pickle"):
        nn.load(path)


def test_the_error_is_one_class_for_both_kinds():
    assert nn.BadFileError is optim.BadFileError and issubclass(nn.BadFileError, ValueError)


def test_a_file_without_a_format_loads_as_format_1(tmp_path):
    """nn.save files written before the format was recorded still load."""
    model = small_model()
    np.savez(tmp_path / "old.npz", **{k: v for k, v in nn._parameters(model).items()})
    loaded = nn.load(tmp_path / "old.npz", model)
    assert np.array_equal(loaded.layers[0].weight, model.layers[0].weight)


def test_unknown_format_names_the_one_this_library_writes(tmp_path, good_files):
    data = good_files["checkpoint, loaded", "model"]
    (tmp_path / "f.npz").write_bytes(edit_description(members(data), set_key("format", 99)))
    with pytest.raises(BadFileError, match=r"format 99, .* reads and writes format 1"):
        optim.read_checkpoint_info(tmp_path / "f.npz")


def test_info_is_read_without_the_arrays(tmp_path):
    model = big_model()
    save_checkpoint(tmp_path / "run.npz", model)
    tracemalloc.start()
    try:
        info = optim.read_checkpoint_info(tmp_path / "run.npz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info == {"epoch": 3, "rng": {"state": [1, 2, 3]}}
    assert peak < model_bytes(model) / 10
