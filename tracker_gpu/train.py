"""The main job: train an MLP and a small CNN on scikit-learn's handwritten digits.

    python -m tracker_gpu.train [--backend auto|numpy|torch|cupy] [--device auto|cpu|gpu]
                                [--models mlp,cnn] [--epochs N] [--plot training.png]

The digits (1,797 images of 8x8 pixels, shipped with scikit-learn: no download) are split into
training and test sets; each model is trained with Adam on the logit cross-entropy, with a
progress bar (tqdm) showing the loss and accuracy, then its test accuracy is printed, and a PNG
of the loss and accuracy curves is written (matplotlib). It runs on the GPU when CuPy can use
one, and on the CPU otherwise.
"""

import argparse
import contextlib
import importlib
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

import tracker_gpu as tg
from tracker_gpu import nn, optim

__all__ = ["train", "digits", "mlp", "cnn", "select_backend", "train_step", "main"]

CLASSES = 10


def mlp(*, rng, **placement):
    """64-128-10 with ReLU, on flattened images."""
    return nn.Chain(
        nn.Flatten(),
        nn.Dense(64, 128, nn.relu, rng=rng, **placement),
        nn.Dense(128, CLASSES, rng=rng, **placement),
    )


def cnn(*, rng, **placement):
    """Two 3x3 convolutions with max pooling, then a dense layer: 8x8 -> 4x4 -> 2x2."""
    return nn.Chain(
        nn.Conv((3, 3), 1, 16, nn.relu, pad=1, rng=rng, **placement),
        nn.MaxPool(2),
        nn.Conv((3, 3), 16, 32, nn.relu, pad=1, rng=rng, **placement),
        nn.MaxPool(2),
        nn.Flatten(),
        nn.Dense(32 * 2 * 2, CLASSES, rng=rng, **placement),
    )


@dataclass(frozen=True)
class Recipe:
    build: object
    epochs: int
    lr: float


RECIPES = {"mlp": Recipe(mlp, epochs=20, lr=3e-3), "cnn": Recipe(cnn, epochs=15, lr=3e-3)}


@dataclass
class Data:
    """Images `(n, 1, 8, 8)` scaled to [0, 1] and integer labels, on the training device."""

    train_x: object
    train_y: object
    test_x: object
    test_y: object


def digits(*, xp=None, device=None, dtype="float32", test_fraction=0.25, seed=0):
    """scikit-learn's digits, split (stratified) into training and test sets, as arrays of
    library `xp` on `device`."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = (bunch.images / 16.0)[:, None, :, :]
    split = train_test_split(
        images, bunch.target, test_size=test_fraction, stratify=bunch.target, random_state=seed
    )
    train_x, test_x, train_y, test_y = split

    def put(values, dtype):
        return nn.asarray(values, xp=xp, device=device, dtype=dtype)

    return Data(
        put(train_x, dtype), put(train_y, "int64"), put(test_x, dtype), put(test_y, "int64")
    )


def loss_function(model, x, y):
    """The training loss, and the logits (to count correct answers without a second pass)."""
    logits = model(x)
    return nn.logitcrossentropy(logits, y), logits


def train_step(model, state, x, y):
    """One step of training: `(loss, logits, model, state)`, the loss and logits as plain
    arrays on the data's device."""
    (loss, logits), (grads,) = tg.withgradient(lambda m: loss_function(m, x, y), model)
    state, model = optim.update(state, model, grads)
    return tg.data(loss), tg.data(logits), model, state


def accuracy(model, x, y):
    """The fraction of `x` that `model` classifies as `y` (a float; one sync)."""
    return int(_hits(model(x), y)) / x.shape[0]


def _hits(logits, y):
    """How many rows of `logits` pick their label, as a 0-d array on the data's device."""
    xp = tg.backend.namespace_of(logits)
    return xp.sum(xp.astype(xp.argmax(logits, axis=-1) == y, xp.int64))


@dataclass
class Result:
    """What training a model gives: the model, its test accuracy, the wall time in seconds and
    the curves (one value per epoch)."""

    name: str
    model: object
    test_accuracy: float
    seconds: float
    history: dict = field(default_factory=dict)


def train(
    name="mlp",
    *,
    epochs=None,
    batch_size=32,
    lr=None,
    seed=0,
    xp=None,
    device=None,
    data=None,
    progress=False,
):
    """Train model `name` ("mlp" or "cnn") on the digits and return a `Result`.

    `xp` (a namespace or "numpy", "torch", "cupy", "strict") and `device` say where the model and
    data live; `epochs` and `lr` default to the model's recipe; `data` reuses a `digits()` split.
    """
    recipe = RECIPES[name]
    epochs = recipe.epochs if epochs is None else epochs
    start = time.perf_counter()
    data = data if data is not None else digits(xp=xp, device=device, seed=seed)
    # on CuPy every new array and kernel goes to the data's GPU, not the current one
    with _one_thread(data.train_x), tg.backend.on_device_of(data.train_x):
        return _train(name, recipe, data, epochs, batch_size, lr, seed, xp, device, progress, start)


@contextlib.contextmanager
def _one_thread(x):
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


def _train(name, recipe, data, epochs, batch_size, lr, seed, xp, device, progress, start):
    rng = np.random.default_rng(seed)
    model = recipe.build(rng=rng, xp=xp, device=device)
    base_lr = recipe.lr if lr is None else lr
    state = optim.setup(optim.Adam(base_lr), model)
    n = data.train_x.shape[0]
    steps = math.ceil(n / batch_size)
    history = {"loss": [], "train_accuracy": [], "test_accuracy": []}
    bar = _progress(name, epochs * steps, progress)
    lib = tg.backend.namespace_of(data.train_x)
    device_of_data = tg.backend.device_of(data.train_x)
    for epoch in range(1, epochs + 1):
        state = optim.adjust(state, eta=_cosine(base_lr, epoch, epochs))
        order = lib.asarray(rng.permutation(n), device=device_of_data)
        total_loss, correct = 0.0, 0  # summed on the device: no wait for it in a step
        for i in range(steps):
            batch = order[i * batch_size : min((i + 1) * batch_size, n)]
            x = lib.take(data.train_x, batch, axis=0)
            y = lib.take(data.train_y, batch, axis=0)
            loss, logits, model, state = train_step(model, state, x, y)
            total_loss = loss * batch.shape[0] + total_loss
            correct = _hits(logits, y) + correct
            bar.update(1)
        total_loss, correct = float(total_loss), int(correct)
        _check_finite(name, epoch, total_loss)
        history["loss"].append(total_loss / n)
        history["train_accuracy"].append(correct / n)
        history["test_accuracy"].append(accuracy(model, data.test_x, data.test_y))
        bar.set_postfix(
            loss=f"{history['loss'][-1]:.4f}",
            acc=f"{history['train_accuracy'][-1]:.3f}",
            test=f"{history['test_accuracy'][-1]:.3f}",
        )
    bar.close()
    seconds = time.perf_counter() - start
    return Result(name, model, history["test_accuracy"][-1], seconds, history)


def _cosine(lr, epoch, epochs, floor=0.05):
    """The learning rate of `epoch` (1-based): from `lr` down to `floor * lr`, on a half cosine."""
    progress = (epoch - 1) / max(epochs - 1, 1)
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _check_finite(name, epoch, total_loss):
    if not math.isfinite(total_loss):
        raise FloatingPointError(
            f"{name}: the loss became {total_loss} in epoch {epoch}; lower the learning rate"
        )


class _NoBar:
    def update(self, n):
        pass

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def _progress(name, total, enabled):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=name, unit="step", leave=True, dynamic_ncols=True)


# --- the plot
def plot(results, path):
    """Write a PNG of the loss and test accuracy curves of each result to `path`."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, the Agg canvas

    figure = Figure(figsize=(10, 4), layout="constrained")
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    for i, result in enumerate(results):
        epochs = range(1, len(result.history["loss"]) + 1)
        color = f"C{i}"
        loss_axes.plot(epochs, result.history["loss"], ".-", color=color, label=result.name)
        accuracy_axes.plot(
            epochs, result.history["test_accuracy"], ".-", color=color, label=f"{result.name} test"
        )
        accuracy_axes.plot(
            epochs,
            result.history["train_accuracy"],
            "--",
            color=color,
            label=f"{result.name} train",
        )
    loss_axes.set(xlabel="epoch", ylabel="training loss", yscale="log", title="loss")
    accuracy_axes.set(xlabel="epoch", ylabel="accuracy", title="accuracy", ylim=(0.8, 1.0))
    for axes in (loss_axes, accuracy_axes):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle("tracker_gpu on scikit-learn's digits")
    figure.savefig(path, dpi=100)


# --- choosing the library and the device
def select_backend(backend="auto", device="auto"):
    """`(xp, device, description)` for `--backend` and `--device`; raises ValueError when the
    choice cannot run here."""
    if backend == "auto":
        backend = "cupy" if device != "cpu" and _cupy_usable() else "numpy"
        if device == "gpu" and backend != "cupy":
            raise ValueError("--device gpu needs CuPy and a CUDA GPU it can use; none was found")
    if backend == "numpy":
        if device not in ("auto", "cpu"):
            raise ValueError("--backend numpy runs on the CPU only; use --device cpu")
        return "numpy", None, "numpy on the CPU"
    if backend == "cupy":
        return _cupy_device(device)
    if backend == "torch":
        return _torch_device(device)
    raise ValueError(f"unknown backend {backend!r}; choose auto, numpy, torch or cupy")


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


# --- the command line
def main(argv=None):
    """The console script: train, print the test accuracies, write the plot."""
    run(sys.argv[1:] if argv is None else argv)


def run(argv):
    """`main`, returning the results."""
    parser = argparse.ArgumentParser(
        prog="python -m tracker_gpu.train", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--backend", default="auto", choices=["auto", "numpy", "torch", "cupy"])
    parser.add_argument("--device", default="auto", help="auto (default), cpu, gpu or gpu:N")
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn")
    parser.add_argument("--epochs", type=int, help="epochs per model (default: 20 mlp, 15 cnn)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, help="Adam's learning rate (default 3e-3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="training.png", help="PNG path ('' for no plot)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in RECIPES]
    if unknown or not names:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(RECIPES)}")
    try:
        xp, device, where = select_backend(args.backend, args.device)
    except ValueError as error:
        parser.error(str(error))
    data = digits(xp=xp, device=device, seed=args.seed)
    print(
        f"digits: {data.train_x.shape[0]} training and {data.test_x.shape[0]} test images "
        f"of 8x8 pixels; {where}",
        flush=True,
    )
    results = []
    for name in names:
        result = train(
            name,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            xp=xp,
            device=device,
            data=data,
            progress=not args.no_progress,
        )
        results.append(result)
        print(
            f"{name}: test accuracy {result.test_accuracy:.3f} ({result.seconds:.1f} s)", flush=True
        )
    if args.plot:
        plot(results, args.plot)
        print(f"plot written to {args.plot}")
    return results


if __name__ == "__main__":
    main()
