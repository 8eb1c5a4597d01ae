"""The plot of the main job: each model's training loss, and its training and test accuracy,
per epoch."""

from pathlib import Path

from ..files import atomic_file

__all__ = ["plot"]


def plot(results, path):
    """Write a PNG of the loss and accuracy curves of each result to `path`; return the figure."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, the Agg canvas
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(10, 4), layout="constrained")
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    for i, result in enumerate(results):
        history, color = result.history, f"C{i}"
        epochs = range(1, len(history["loss"]) + 1)
        loss_axes.plot(epochs, history["loss"], ".-", color=color, label=result.name)
        accuracy_axes.plot(epochs, history["test_accuracy"], ".-", color=color,
                           label=f"{result.name} test")  # fmt: skip
        accuracy_axes.plot(epochs, history["train_accuracy"], "--", color=color,
                           label=f"{result.name} train")  # fmt: skip
    loss_axes.set(xlabel="epoch", ylabel="training loss", yscale="log", title="loss")
    accuracy_axes.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    for axes in (loss_axes, accuracy_axes):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle("tracker_gpu on scikit-learn's digits")
    _write(figure, Path(path))
    return figure


def _write(figure, path):
    """Save the figure atomically (`files.atomic_file`): a stopped job never leaves half a
    plot. The format is the suffix's (no suffix: PNG, and `path` is used as given)."""
    with atomic_file(path) as file:
        figure.savefig(file, dpi=100, format=path.suffix.lstrip(".").lower() or "png")


def plot_text(history, path, baselines=None):
    """Write the text job's curves to `path`: the training loss (the mean of each few steps)
    and the validation loss against the steps, with the baselines as horizontal lines; return
    the figure."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4), layout="constrained")
    axes = figure.subplots()
    axes.plot(history["step"], history["loss"], "-", color="C0", label="training", lw=1)
    axes.plot(history["valid_step"], history["valid_loss"], "o-", color="C1", label="validation")
    for i, (name, value) in enumerate((baselines or {}).items()):
        axes.axhline(value, ls="--", lw=1, color=f"C{i + 2}", label=f"{name} baseline")
    axes.set(xlabel="step", ylabel="loss (nats per character)",
             title="a character-level transformer on CPython's documentation")  # fmt: skip
    axes.grid(alpha=0.3)
    axes.legend()
    _write(figure, Path(path))
    return figure
