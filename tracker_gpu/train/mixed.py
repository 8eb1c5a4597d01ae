"""Mixed precision for both jobs (`--precision 32|16|bf16`): the model keeps float32 master
weights, runs in the half dtype through a `tg.Policy` (its outputs given back in float32, so
the loss is taken in float32), and under float16 the loss is scaled by a dynamic `tg.LossScale`
that a step carries and the checkpoints save.

>>> policy_of("bf16").compute_dtype, policy_of("32")
('bfloat16', None)
>>> scaler_of("16").scale, scaler_of("bf16")
(32768.0, None)
"""

from contextlib import nullcontext

import numpy as np

import tracker_gpu as tg
from tracker_gpu import optim
from tracker_gpu.backend import is_array

__all__ = ["PRECISIONS", "DEFAULT", "policy_of", "scaler_of", "Mixed", "scaled", "stepped",
           "restored", "described"]  # fmt: skip

# --precision: the dtype the model computes in
PRECISIONS = {"32": "float32", "16": "float16", "bf16": "bfloat16"}
DEFAULT = "32"
# the precisions whose small gradients underflow without loss scaling
SCALED = ("16",)


def policy_of(precision):
    """The `tg.Policy` of `precision` (float32 parameters and outputs), None for "32"."""
    if precision == DEFAULT:
        return None
    return tg.Policy("float32", PRECISIONS[precision], "float32")


def scaler_of(precision):
    """A fresh dynamic `tg.LossScale` (from 2^15, grown and shrunk as PyTorch's GradScaler
    does) for float16, else None."""
    return tg.LossScale() if precision in SCALED else None


class Mixed:
    """What a step needs to train in `precision`: the policy and, under float16, the loss
    scaler, which each step hands to its function and replaces with the one it returns (a
    compiled step's holds arrays), and a checkpoint saves (`state_dict`)."""

    def __init__(self, precision=DEFAULT):
        self.precision = precision
        self.policy = policy_of(precision)
        self.scaler = scaler_of(precision)

    def quiet(self):
        """A block in which NumPy does not warn of the overflows that loss scaling provokes
        and skips (a plain block without a scaler)."""
        return np.errstate(over="ignore", invalid="ignore") if self.scaler else nullcontext()

    def forward(self, model, x):
        """`model(x)` under the policy (float32 output), or as it is for "32"."""
        return model(x) if self.policy is None else self.policy(model, x)

    def carried(self, compiled, model):
        """The scaler a step hands to its function: on the device of `model`'s arrays when
        the step is compiled (nothing read back at a step: `LossScale.placed`)."""
        if self.scaler is None or not compiled:
            return self.scaler
        arrays = [x for x in tg.pytree.tree_leaves(model) if is_array(x)]
        return self.scaler.placed(arrays[0])

    def state_dict(self):
        """The scaler's state for a checkpoint's `info` (None without one)."""
        return None if self.scaler is None else self.scaler.state_dict()


def scaled(scaler, loss):
    """`loss` multiplied by the scaler's scale (as it is without a scaler)."""
    return loss if scaler is None else scaler.scaled(loss)


def stepped(scaler, state, model, grads, before_step=None):
    """`(scaler, state, model)` after one optimiser step along the gradients of the scaled
    loss: unscaled, `before_step` applied (clipping), skipped where they are not finite
    (`LossScale.update`); without a scaler, the step as it is."""
    if scaler is not None:
        return scaler.update(state, model, grads, before_step=before_step)
    state, model = optim.update(state, model, grads if before_step is None else before_step(grads))
    return None, state, model


def described(precision):
    """The words a job's first line gives a precision ("" for float32, the default)."""
    if precision in (None, DEFAULT):
        return ""
    return f", computing in {PRECISIONS[precision]} (float32 weights)"


def restored(mixed, saved):
    """`mixed` with the scaler of a checkpoint's `loss_scale` (`saved`), where both have one."""
    if mixed.scaler is not None and saved:
        mixed.scaler = tg.LossScale(**saved)
    return mixed
