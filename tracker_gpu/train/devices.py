"""Where the main job runs: the array library and device for `--backend` and `--device`, one
CPU thread for BLAS and PyTorch while training on the CPU, and host memory kept for reuse."""

import contextlib
import ctypes
import importlib
import os
import sys

__all__ = ["select_backend", "one_thread", "keep_freed_memory"]

# glibc's mallopt parameters
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(mapped_from=32 << 20, trimmed_from=128 << 20):
    """Let the C library's malloc keep the memory a step frees for the next step: a training
    step makes and frees the same large arrays every time, and glibc's malloc maps each array
    over its threshold (128 KiB at first) pages of its own, returning them when it is freed,
    and gives the top of its heap back to the system past another: each step then faults its
    activations in anew (the text job's eager step: 10,000 page faults and 15 ms of its 45 in
    the kernel). Arrays below `mapped_from` bytes then come from the heap, and its free top
    is kept up to `trimmed_from` bytes. The jobs own their process and call this once; a
    library would not. True where it took effect (glibc); nothing is changed elsewhere.

    >>> keep_freed_memory() in (True, False)
    True
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mapped_from)) and bool(
        mallopt(M_TRIM_THRESHOLD, trimmed_from)
    )


def select_backend(backend="auto", device="auto"):
    """`(xp, device, description)` for `--backend` and `--device`; raises ValueError when the
    choice cannot run here."""
    _check_device(device)
    if backend == "auto":
        backend = "cupy" if device != "cpu" and _cupy_usable() else "numpy"
        if device != "auto" and backend != "cupy" and device != "cpu":
            raise ValueError(
                f"--device {device} needs CuPy and a CUDA GPU it can use; none was found "
                "(use --device cpu, or --backend torch for PyTorch's GPUs)"
            )
    if backend == "numpy":
        if device not in ("auto", "cpu"):
            raise ValueError("--backend numpy runs on the CPU only; use --device cpu")
        return "numpy", None, "numpy on the CPU"
    if backend == "cupy":
        return _cupy_device(device)
    if backend == "torch":
        return _torch_device(device)
    raise ValueError(f"unknown backend {backend!r}; choose auto, numpy, torch or cupy")


def memory_of(where):
    """The bytes of memory that `where` (`select_backend`'s answer) computes in: the GPU's for
    CuPy and PyTorch's CUDA, else the host's; None where it cannot be read."""
    kind, device, _ = where
    try:
        if kind == "cupy":
            return device.mem_info[1]
        if kind == "torch" and device.type == "cuda":
            return importlib.import_module("torch").cuda.get_device_properties(device).total_memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_device(device):
    kind, _, index = device.partition(":")
    if device in ("auto", "cpu", "gpu") or (kind == "gpu" and index.isdigit()):
        return
    raise ValueError(f"--device {device!r} is not a device here; choose auto, cpu, gpu or gpu:N")


def _cupy_usable():
    try:
        cupy = importlib.import_module("cupy")
        return bool(cupy.is_available())
    except Exception:
        return False


def _cupy_device(device):
    if device == "cpu":
        raise ValueError("--backend cupy runs on a GPU; use --backend numpy for the CPU")
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as error:
        raise ValueError(
            f"--backend cupy needs CuPy ({error}); install it with "
            "pip install 'tracker-gpu[cuda12]' (or [cuda13]), or use --backend numpy"
        ) from None
    if not cupy.is_available():
        raise ValueError("--backend cupy: CuPy is installed but finds no CUDA GPU it can use")
    index = _gpu_index(device)
    return "cupy", cupy.cuda.Device(index), f"cupy on GPU {index}"


def _torch_device(device):
    try:
        torch = importlib.import_module("torch")
    except ImportError as error:
        raise ValueError(f"--backend torch needs PyTorch ({error})") from None
    has_gpu = torch.cuda.is_available()
    if device == "cpu" or (device == "auto" and not has_gpu):
        return "torch", torch.device("cpu"), "torch on the CPU"
    if not has_gpu:
        raise ValueError("--device gpu: PyTorch finds no CUDA GPU")
    index = _gpu_index(device)
    return "torch", torch.device("cuda", index), f"torch on GPU {index}"


def _gpu_index(device):
    if device in ("auto", "gpu"):
        return 0
    try:
        return int(device.rsplit(":", 1)[-1])
    except ValueError:
        raise ValueError(f"unknown device {device!r}; use auto, cpu, gpu or gpu:N") from None


@contextlib.contextmanager
def one_thread(x):
    """One CPU thread for BLAS (and for PyTorch) while training. These matrices are too small to
    gain from threads, and on a busy two-core machine spinning threads cost a lot: once
    scikit-learn has imported scipy.stats, NumPy's threaded matmul can take milliseconds instead
    of microseconds, and PyTorch's thread pool can make a step ten times slower."""
    with contextlib.ExitStack() as stack:
        try:
            from threadpoolctl import threadpool_limits

            stack.enter_context(threadpool_limits(limits=1, user_api="blas"))
        except ImportError:
            pass
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor) and x.device.type == "cpu":
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            stack.callback(torch.set_num_threads, threads)
        yield
