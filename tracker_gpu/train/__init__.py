"""The main job: train an MLP, a small CNN and an LSTM on scikit-learn's handwritten digits.

    python -m tracker_gpu.train [--backend auto|numpy|torch|cupy] [--device auto|cpu|gpu]
                                [--models mlp,cnn,lstm] [--epochs N] [--plot training.png]
                                [--save DIR] [--resume DIR] [--compile]

The digits (1,797 images of 8x8 pixels, shipped with scikit-learn: no download) are split into
training and test sets; each model is trained with Adam (its rate on a cosine schedule) on the
logit cross-entropy, with a progress bar (tqdm) showing the loss and accuracy, then its test
accuracy is printed, and a PNG of the loss and accuracy curves is written (matplotlib). It runs
on the GPU when CuPy can use one, and on the CPU otherwise. With `--compile` each model's step
is recorded once per batch shape by `tg.compile` and replayed (a CUDA graph on CuPy).

One module per concern: `cli` (the command line), `loop` (the training loop and checkpoints),
`data` (the digits and their batches), `models` (the models and their recipes), `plots` and
`devices` (the library and device).
"""

from .cli import main, run
from .data import Data, batches, digits
from .devices import select_backend
from .loop import Interrupted, Result, accuracy, compiled_step, fit, train, train_step
from .models import RECIPES, cnn, lstm, mlp
from .plots import plot

__all__ = [
    "train",
    "fit",
    "train_step",
    "compiled_step",
    "accuracy",
    "Result",
    "Interrupted",
    "digits",
    "batches",
    "Data",
    "mlp",
    "cnn",
    "lstm",
    "RECIPES",
    "select_backend",
    "plot",
    "main",
    "run",
]
