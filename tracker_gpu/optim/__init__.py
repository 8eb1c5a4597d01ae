"""Optimisers, the Optimisers.jl way, over any nested structure of arrays of any library.

    state = setup(Adam(1e-3), model)               # a state per parameter, shaped like the model
    state, model = update(state, model, grads)     # after each gradient; nothing is mutated

Rules: `Descent`, `Momentum`, `Nesterov`, PyTorch's `SGD` (`rules`), `Adam`, `AdamW`,
`RMSProp`, `AdaGrad`, `AdaBelief`, `Lion` (`adaptive`), `AMSGrad`, `NAdam`, `RAdam`, `AdaMax`,
`AdaDelta`, `Rprop` (`variants`), and the gradient transforms `ClipGrad`, `ClipNorm`,
`WeightDecay` and `SignDecay`, composed by `OptimiserChain` (in order: clip first, then the
step). Schedules `Step`, `Exp`, `Cosine`, `CosineRestarts`, `OneCycle`, `Linear` and
`Polynomial` set the learning rate per step through `Scheduled(rule, schedule)` (`schedules`);
`ReduceLROnPlateau` follows a validation metric (`plateau`). `clip_grad_norm` clips all the
gradients by their global norm (`clip`); `LBFGS` steps with `lbfgs_step(state, model, loss)`,
evaluating the loss as often as it needs (`lbfgs`). `adjust(state, eta=...)` changes
hyperparameters, `freeze`/`thaw` stop and restart parts of a model, and tied arrays stay
tied (`state`).
`save_checkpoint`/`load_checkpoint` keep a model with its optimiser state, so a run resumes
exactly (`checkpoint`); `read_checkpoint_info` reads a checkpoint's `info` without its
arrays, and a file that cannot be loaded raises `BadFileError` naming it.

Each parameter is updated by one call of `step(rule, param, grad, state)`, the seam where a
fused kernel takes over (registered by rule name in `cuda.dispatch`). Hyperparameters given as
NumPy scalars or 0-d NumPy arrays are kept as Python numbers, so float32 parameters stay
float32; float16 and bfloat16 parameters step in float32 with float32 states (`state`).

>>> import numpy as np
>>> model = {"w": np.array([1.0, 2.0]), "name": "toy"}
>>> state = setup(Descent(0.1), model)
>>> state, model = update(state, model, {"w": np.array([1.0, -1.0]), "name": None})
>>> model["w"]
array([0.9, 2.1])
"""

# isort: skip_file
from .tree import tree_map_with_path
from .rules import (
    ClipGrad,
    ClipNorm,
    Descent,
    Momentum,
    Nesterov,
    OptimiserChain,
    Rule,
    SGD,
    SignDecay,
    WeightDecay,
)
from .adaptive import AdaBelief, AdaGrad, Adam, AdamW, Lion, RMSProp
from .variants import AdaDelta, AdaMax, Adadelta, Adamax, AMSGrad, NAdam, RAdam, Rprop
from .schedules import Cosine, CosineRestarts, Exp, Linear, OneCycle, Polynomial, Scheduled, Step
from .state import Leaf, adjust, freeze, setup, step, thaw, update
from .lbfgs import LBFGS, lbfgs_step
from .plateau import Plateau, ReduceLROnPlateau
from .clip import clip_grad_norm
from .checkpoint import Checkpoint, load_checkpoint, read_checkpoint_info, save_checkpoint
from ..files import BadFileError, SaveError

Adagrad = AdaGrad  # PyTorch's spelling

__all__ = [
    "Rule",
    "Descent",
    "Momentum",
    "Nesterov",
    "SGD",
    "Adam",
    "AdamW",
    "RMSProp",
    "AdaGrad",
    "Adagrad",
    "AdaBelief",
    "Lion",
    "AMSGrad",
    "NAdam",
    "RAdam",
    "AdaMax",
    "Adamax",
    "AdaDelta",
    "Adadelta",
    "Rprop",
    "ClipGrad",
    "ClipNorm",
    "WeightDecay",
    "SignDecay",
    "OptimiserChain",
    "Step",
    "Exp",
    "Cosine",
    "CosineRestarts",
    "OneCycle",
    "Linear",
    "Polynomial",
    "Scheduled",
    "ReduceLROnPlateau",
    "Plateau",
    "LBFGS",
    "lbfgs_step",
    "clip_grad_norm",
    "Leaf",
    "setup",
    "update",
    "adjust",
    "freeze",
    "thaw",
    "step",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint_info",
    "BadFileError",
    "SaveError",
    "Checkpoint",
    "tree_map_with_path",
]
