"""The library's files: atomic, durable writes and checked reads of `.npz` archives.

Every file the library writes goes through `atomic_file(path)`: a temp file in the same folder
(named `<name>.partial-<pid>-<random>`) is written, flushed and `fsync`ed, renamed over the old
file and the folder is `fsync`ed, so a crash or a kill leaves the old file or the new one, never
half of one (a symbolic link is followed, and the old file's permission bits are kept). The
temp file is removed on every error, and one left by a killed process is removed at the next
save of that path. An `OSError` (full disk, read-only, not a folder) becomes
one `SaveError` (an `OSError`) naming the path and the cause; the old file is intact.

Every file the library reads goes through `Archive(path, who)`, which reads the zip's directory
and each member's `.npy` header and nothing else; its caller checks names, shapes and dtypes
against the model, `verify()` streams the members through their checksums in small chunks, and
only then `read(name)` allocates an array. A dtype the `.npy` format cannot name (bfloat16,
which NumPy writes as raw 2-byte values, `|V2`) is stored as its bits (`as_bits`: uint16) with
its name recorded by the writer, and read back exactly by `read(name, dtype="bfloat16")`.
Whatever is wrong with the file's content is one
`BadFileError` (a `ValueError`) whose message names the file and what is wrong. Pickles are never
loaded.

>>> import numpy as np, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "a.npz")
>>> with atomic_file(path) as file:
...     np.savez(file, x=np.arange(3.0))
>>> with Archive(path, "example") as archive:
...     archive.members["x"].shape, archive.verify(), archive.read("x")
((3,), None, array([0., 1., 2.]))
"""

import contextlib
import io
import json
import os
import secrets
import stat
import struct
import threading
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy

__all__ = ["BadFileError", "SaveError", "atomic_file", "write_npz", "Archive", "as_bits", "BITS"]

PARTIAL = ".partial-"  # temp files are "<name>.partial-<pid>-<random>"
HEADER_LIMIT = 65536  # bytes of a member's .npy header, as NumPy's own limit allows
META_LIMIT = 16 * 2**20  # bytes of a file's JSON description
CHUNK = 2**18  # bytes read at a time
NUMBERS = "biufc"  # the dtype kinds an array of a model or an optimiser state may have
BITS = {"bfloat16": np.dtype(np.uint16)}  # dtypes .npy cannot name: stored as these bits
_ACTIVE = set()  # temp files this process is writing now
_ACTIVE_LOCK = threading.Lock()
# what the zip and .npy readers raise on a damaged file (also OSError: a seek before the start)
_DAMAGED = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, KeyError,
            struct.error, zlib.error, NotImplementedError, RuntimeError, OverflowError, TypeError,
            IndexError, SyntaxError)  # fmt: skip


class BadFileError(ValueError):
    """A file that cannot be loaded; the message names the file and what is wrong with it."""


class SaveError(OSError):
    """A file that could not be written; the message names the path and the cause, and the
    file that was there before (if any) is unchanged."""

    def __init__(self, path, cause):
        reason = cause.strerror or str(cause)
        super().__init__(cause.errno, reason)
        self.filename = os.fspath(path)
        self.message = (
            f"cannot write {self.filename}: {reason}; the file there (if any) is unchanged"
        )

    def __str__(self):
        return self.message


# --- writing
@contextlib.contextmanager
def atomic_file(path):
    """A binary file to write whose content replaces `path` whole when the block ends without
    an error, durably (`fsync` of the file and of its folder); on an error nothing changes.
    A `path` that is a symbolic link stays one: the file it points to is replaced (the temp
    file beside that one). The new file keeps the old one's permission bits (0600 stays 0600).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "plot.png")
    >>> with atomic_file(path) as file:
    ...     _ = file.write(b"...")   # e.g. figure.savefig(file, format="png")
    >>> os.listdir(os.path.dirname(path))
    ['plot.png']
    """
    path = os.fspath(path)
    try:  # a symbolic link stays one: the file it points to is the one replaced
        target = os.path.realpath(path)
    except OSError as error:  # a loop of links, where realpath says so
        raise SaveError(path, error) from None
    folder, name = os.path.split(target)
    scratch = os.path.join(folder, f"{name}{PARTIAL}{os.getpid()}-{secrets.token_hex(4)}")
    with _ACTIVE_LOCK:
        _ACTIVE.add(scratch)
    try:
        try:
            _remove_stale(folder, name)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
            with os.fdopen(os.open(scratch, flags, 0o666), "wb") as file:
                yield file
                file.flush()
                os.fsync(file.fileno())
            _keep_mode(target, scratch)
            os.replace(scratch, target)
        except OSError as error:
            raise SaveError(path, error) from None
        _fsync_folder(folder)
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE.discard(scratch)
        with contextlib.suppress(OSError):
            os.remove(scratch)


def _keep_mode(target, scratch):
    """Give the temp file the permission bits of the file it replaces (a private 0600 file
    stays private); a new file keeps those its creation gave (0666 less the umask)."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        os.chmod(scratch, stat.S_IMODE(mode))


def write_npz(path, arrays):
    """Write `{name: NumPy array}` to the `.npz` file `path` with `atomic_file`."""
    with atomic_file(path) as file:
        np.savez(file, **arrays)


def as_bits(array):
    """`(stored, name)`: a NumPy array of a dtype in `BITS` (bfloat16) as its bits and the
    dtype's name, for the writer to record; any other array as it is, and None.

    >>> import ml_dtypes, numpy as np
    >>> bits, name = as_bits(np.array([1.0, -2.5], ml_dtypes.bfloat16))
    >>> bits, name
    (array([16256, 49184], dtype=uint16), 'bfloat16')
    """
    name = array.dtype.name
    if name in BITS:
        return array.view(BITS[name]), name
    return array, None


def _from_bits(archive, name, array, dtype):
    """The array `name` of `archive`, stored as the bits of `dtype` (a name of `BITS`)."""
    from .backend import half_dtype

    try:
        return array.view(half_dtype(dtype, np))
    except TypeError as error:
        raise archive.error(f"{name!r} holds {dtype} values: {error}") from None


def _remove_stale(folder, name):
    """Remove the temp files of `name` that no running save is writing (a killed one's)."""
    for entry in os.listdir(folder):
        if not entry.startswith(name + PARTIAL):
            continue
        scratch = os.path.join(folder, entry)
        pid = entry[len(name + PARTIAL) :].split("-")[0]
        with _ACTIVE_LOCK:
            busy = scratch in _ACTIVE
        if not busy and not (pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid))):
            with contextlib.suppress(OSError):
                os.remove(scratch)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):
        return True  # another user's process, or a platform that cannot tell: keep its file
    return True


def _fsync_folder(folder):
    """Make the rename durable; best effort where a folder cannot be opened (Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- reading
@dataclass(frozen=True)
class Member:
    """One array of an archive, as its directory entry and `.npy` header declare it."""

    info: zipfile.ZipInfo
    shape: tuple
    dtype: np.dtype
    fortran: bool
    offset: int  # where the data start in the member

    @property
    def nbytes(self):
        return self.info.file_size - self.offset


class Archive:
    """An `.npz` file opened for checked reading; `members` maps each array's name to its
    `Member` (shape, dtype), read from the zip's directory and the `.npy` headers only.
    `who` (the function loading it) starts every error message."""

    def __init__(self, path, who):
        self.path, self.who = os.fspath(path), who
        self._file = open(self.path, "rb")  # a missing file is open's OSError, naming it
        try:
            self._zip = zipfile.ZipFile(self._file)
            self.members = self._directory()
        except BaseException as error:
            self._file.close()
            if isinstance(error, _DAMAGED) and not isinstance(error, BadFileError):
                raise self.damaged(error) from None
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()

    def error(self, what):
        """The `BadFileError` saying `what` is wrong with this file."""
        return BadFileError(f"{self.who}: {self.path}: {what}")

    def damaged(self, error):
        text = " ".join(str(error).split())[:200]
        return self.error(f"the file is damaged or truncated ({type(error).__name__}: {text})")

    def _directory(self):
        members, infos = {}, self._zip.infolist()
        if not infos:
            raise self.error("the archive holds no arrays")
        listed = self._listed()
        if listed is not None and listed != len(infos):
            raise self.error(
                f"its end record lists {listed} members but its directory {len(infos)}"
            )
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise self.error(f"{info.filename!r} is not an array (.npy) member")
            name = info.filename[:-4]
            if name in members:
                raise self.error(f"{name!r} is in the archive twice")
            members[name] = self._header(info)
        return members

    def _listed(self):
        """The number of members the zip's end record declares (None where zip64 says)."""
        self._file.seek(0, os.SEEK_END)
        self._file.seek(max(0, self._file.tell() - 65536 - 22))
        tail = self._file.read()
        at = tail.rfind(b"PK\x05\x06")
        listed = struct.unpack("<H", tail[at + 10 : at + 12])[0]
        return None if listed == 0xFFFF else listed

    def _header(self, info):
        name = info.filename[:-4]
        with self._zip.open(info) as stream:
            head = io.BytesIO(stream.read(min(info.file_size, HEADER_LIMIT)))
        version = npy.read_magic(head)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise self.error(f"{name!r} has .npy version {version}, not 1, 2 or 3")
        read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, fortran, dtype = read(head, max_header_size=HEADER_LIMIT)
        if any(n < 0 for n in shape):
            raise self.error(f"{name!r} declares the shape {tuple(shape)}")
        if dtype.hasobject:
            raise self.error(f"{name!r} holds Python objects (a pickle), which are never loaded")
        member = Member(info, tuple(shape), dtype, bool(fortran), head.tell())
        declared = dtype.itemsize * _count(shape)
        if declared != member.nbytes:
            raise self.error(
                f"{name!r} declares {_shape_text(shape, dtype)} ({_size(declared)}) but the "
                f"archive declares {_size(max(member.nbytes, 0))} of data for it"
            )
        return member

    def check(self, name, *, shape=None, most=None, kinds=NUMBERS, what="the model", dtype=None):
        """Refuse member `name` unless its dtype is of `kinds` (or the bits of `dtype`, a name of
        `BITS`, where the writer recorded one), its shape is `shape` (if given) and it has at
        most `most` elements (if given): checked before anything is read."""
        member = self.members[name]
        if dtype is not None:
            self._check_bits(name, dtype)
        elif member.dtype.kind == "V":
            raise self.error(
                f"{name!r} has dtype {member.dtype}, raw bytes without a dtype's name (how "
                "np.save writes bfloat16); save it with nn.save or optim.save_checkpoint, "
                "which record the dtype"
            )
        elif member.dtype.kind not in kinds:
            raise self.error(f"{name!r} has dtype {member.dtype}, not numbers")
        if shape is not None and member.shape != tuple(shape):
            raise self.error(
                f"{name} has shape {member.shape} in the file but {tuple(shape)} in {what}"
            )
        if most is not None and _count(member.shape) > most:
            raise self.error(
                f"{name!r} declares {_shape_text(member.shape, member.dtype)} "
                f"({_size(member.nbytes)}), more than {what} holds ({most} numbers)"
            )

    def _check_bits(self, name, dtype):
        if dtype not in BITS:
            raise self.error(
                f"its description says {name!r} holds {dtype!r}; only {', '.join(BITS)} is "
                "stored as bits"
            )
        found = self.members[name].dtype
        if found != BITS[dtype]:
            raise self.error(
                f"its description says {name!r} holds {dtype} (stored as {BITS[dtype]} bits), "
                f"but it holds {found}"
            )

    def bound(self, names, limit, why=""):
        """Refuse unless the arrays `names` declare at most `limit` bytes in all (`why`: what
        sets the limit, and what to do)."""
        total = sum(self.members[n].nbytes for n in names)
        if total > limit:
            raise self.error(f"its arrays declare {_size(total)}, more than {_size(limit)}{why}")

    def verify(self, names=None):
        """Read every member (or those in `names`) through its checksum, a chunk at a time,
        so that a damaged file is refused before any array is allocated."""
        for name in self.members if names is None else names:
            with self._reading(name) as stream:
                while stream.read(CHUNK):
                    pass

    def read(self, name, dtype=None):
        """Member `name` as a NumPy array, read into its place a chunk at a time; `dtype`
        (bfloat16), the dtype whose bits it holds, checked by `check(name, dtype=...)`."""
        member = self.members[name]
        shape = member.shape[::-1] if member.fortran else member.shape
        array = np.empty(shape, member.dtype)
        with self._reading(name) as stream:
            stream.read(member.offset)
            buffer, done = memoryview(array.reshape(-1).view(np.uint8)), 0
            while done < member.nbytes:
                got = stream.readinto(buffer[done : done + CHUNK])
                if not got:
                    raise self.error(f"{name!r} ends before its {_size(member.nbytes)} of data")
                done += got
            if stream.read(1):
                raise self.error(f"{name!r} holds more data than it declares")
        array = array.T if member.fortran else array
        return array if dtype is None else _from_bits(self, name, array, dtype)

    def read_json(self, name):
        """Member `name`, a 0-d string array of at most `META_LIMIT` bytes, parsed as JSON."""
        member = self.members[name]
        if member.shape != () or member.dtype.kind != "U" or member.nbytes > META_LIMIT:
            raise self.error(
                f"its description {name!r} is {_shape_text(member.shape, member.dtype)}, not a "
                f"string of at most {_size(META_LIMIT)}"
            )
        try:
            return json.loads(str(self.read(name)))
        except ValueError as error:
            raise self.error(f"its description {name!r} is not JSON ({error})") from None

    @contextlib.contextmanager
    def _reading(self, name):
        try:
            with self._zip.open(self.members[name].info) as stream:
                yield stream
        except BadFileError:
            raise
        except _DAMAGED as error:
            raise self.damaged(error) from None

    def check_format(self, meta, name, written):
        """Refuse a description `meta` (member `name`) whose "format" is not `written`."""
        found = meta.get("format") if isinstance(meta, dict) else None
        if found != written:
            raise self.error(
                f"it is of format {found!r}, which this library cannot read: it reads and "
                f"writes format {written} (its description {name!r} says which)"
            )


def _count(shape):
    count = 1
    for n in shape:
        count *= int(n)
    return count


def _shape_text(shape, dtype):
    return f"shape {tuple(shape)} of {dtype}"


def _size(nbytes):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
