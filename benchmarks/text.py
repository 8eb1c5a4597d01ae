"""Tokens per second of the text job's training step: tracker_gpu eager, tracker_gpu compiled
(`tg.compile`) and PyTorch eager, on the same model, weights and batch, in one process.

    python benchmarks/text.py [--layers 2] [--width 64] [--heads 4] [--context 64]
                              [--batch 32] [--steps 20] [--rounds 5] [--threads 1]
                              [--backend numpy|cupy] [--precision 32|16|bf16] [--json PATH]

The model is the text job's `CharTransformer` (pre-norm causal blocks, tied embedding, float32,
dropout off), the step forward + backward + clipping by global norm + AdamW, as in
`python -m tracker_gpu.train text`. PyTorch's model is the same one written with `torch.nn`
(`nn.MultiheadAttention`, `nn.LayerNorm`, `nn.GELU("tanh")`), given the same initial weights,
with `torch.optim.AdamW` and `clip_grad_norm_`; its first loss is checked against tracker_gpu's.
The three are timed in turn, `--steps` steps each, for `--rounds` rounds (interleaved, so load
from other processes falls on all three alike); the median rate of each and the ratios are
printed. BLAS and PyTorch run on `--threads` threads, and malloc keeps the memory a step frees
for the next, as the training jobs have it (`train.devices.keep_freed_memory`), for all three.

`--backend cupy` (a GPU; a step of `ci/gpu`): tracker_gpu on CuPy arrays and PyTorch on CUDA,
each block of steps ended by a synchronisation of the device (host overhead included, as a
training loop pays it); exits 3 without a GPU. `--precision 16|bf16`: tracker_gpu's step is the
text job's `--precision` step (float32 weights, the model in the half dtype, float16's loss
scaled), PyTorch's the same model under `torch.autocast` (float16 with a `GradScaler`). Not
measured: the data pipeline, the evaluations, memory (benchmarks/memory.py).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_measure

from train_step import blas_kernels  # noqa: E402

from tracker_gpu import nn  # noqa: E402
from tracker_gpu.train.devices import keep_freed_memory  # noqa: E402
from tracker_gpu.train.text_loop import (  # noqa: E402
    MAX_NORM,
    TextConfig,
    build,
    compiled_text_step,
    mixed_text_step,
    rule,
    text_step,
)

VOCAB = 103  # the characters of pydoc_data.topics


def torch_model(model, config):
    """The same model in `torch.nn`, with `model`'s weights (float32, dropout off)."""
    import torch
    from torch import nn as tnn

    class Block(tnn.Module):
        def __init__(self, w, h):
            super().__init__()
            self.norm1, self.norm2 = tnn.LayerNorm(w), tnn.LayerNorm(w)
            self.attention = tnn.MultiheadAttention(w, h, batch_first=True)
            self.mlp = tnn.Sequential(tnn.Linear(w, 4 * w), tnn.GELU("tanh"), tnn.Linear(4 * w, w))

        def forward(self, x, mask):
            h = self.norm1(x)
            x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))

    class Model(tnn.Module):
        def __init__(self, c):
            super().__init__()
            self.embed = tnn.Embedding(VOCAB, c.width)
            self.position = tnn.Parameter(torch.zeros(c.context, c.width))
            self.blocks = tnn.ModuleList(Block(c.width, c.heads) for _ in range(c.layers))
            self.norm = tnn.LayerNorm(c.width)
            mask = torch.ones(c.context, c.context, dtype=torch.bool).triu(1)
            self.register_buffer("mask", mask)

        def forward(self, x):
            t = x.shape[1]
            h = self.embed(x) + self.position[:t]
            for block in self.blocks:
                h = block(h, self.mask[:t, :t])
            return self.norm(h) @ self.embed.weight.T

    out = Model(config)
    with torch.no_grad():
        for name, value in _torch_weights(model).items():
            out.get_parameter(name).copy_(torch.from_numpy(value))
    return out


def _torch_weights(model):
    p = {k: np.asarray(v) for k, v in nn.io._parameters(model).items()}
    out = {"embed.weight": p["embed.weight"], "position": p["position"],
           "norm.weight": p["norm.scale"], "norm.bias": p["norm.bias"]}  # fmt: skip
    for i in range(len(model.blocks)):
        b = t = f"blocks.{i}."
        for n in ("norm1", "norm2"):
            out[t + f"{n}.weight"], out[t + f"{n}.bias"] = p[b + f"{n}.scale"], p[b + f"{n}.bias"]
        a = b + "attention."
        out[t + "attention.in_proj_weight"] = np.concatenate(
            [p[a + f"{n}_proj.weight"] for n in "qkv"]
        )
        out[t + "attention.in_proj_bias"] = np.concatenate([p[a + f"{n}_proj.bias"] for n in "qkv"])
        out[t + "attention.out_proj.weight"] = p[a + "out_proj.weight"]
        out[t + "attention.out_proj.bias"] = p[a + "out_proj.bias"]
        for j, k in ((0, 0), (1, 2)):
            out[t + f"mlp.{k}.weight"] = p[b + f"mlp.layers.{j}.weight"]
            out[t + f"mlp.{k}.bias"] = p[b + f"mlp.layers.{j}.bias"]
    return out


HALF = {"16": "float16", "bf16": "bfloat16"}


def torch_step(module, config, precision="32"):
    """PyTorch's step; under a half precision, the forward and loss in `torch.autocast` (and
    float16's loss scaled by a `GradScaler`, as PyTorch's recipe has it)."""
    import torch
    import torch.nn.functional as F

    c = config
    opt = torch.optim.AdamW(module.parameters(), c.lr, betas=(0.9, 0.99),
                            weight_decay=c.weight_decay)  # fmt: skip
    device = next(module.parameters()).device.type
    half = getattr(torch, HALF[precision]) if precision in HALF else None
    scaler = torch.amp.GradScaler(device) if precision == "16" else None

    def step(x, y):
        with torch.autocast(device, dtype=half, enabled=half is not None):
            loss = F.cross_entropy(module(x).reshape(-1, VOCAB).float(), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(module.parameters(), MAX_NORM)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        return loss

    return step


def contenders(config, x, y, backend="numpy", precision="32"):
    """`{name: step()}`: each runs one training step on the batch `(x, y)` (NumPy arrays),
    on `backend`'s arrays (PyTorch's on the GPU for CuPy), in `precision`."""
    import torch

    model, _ = build(config, VOCAB)
    module = torch_model(model, config)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    if backend == "cupy":
        import cupy

        module, tx, ty = module.cuda(), tx.cuda(), ty.cuda()
        model, x, y = nn.place(model, xp="cupy"), cupy.asarray(x), cupy.asarray(y)
    reference = torch_step(module, config, precision)
    out = {"torch eager": lambda: reference(tx, ty)}
    for name, compiled in (("tracker_gpu eager", False), ("tracker_gpu compiled", True)):
        if precision != "32":
            step = mixed_text_step(precision, compiled=compiled)
        else:
            step = compiled_text_step() if compiled else text_step
        out[name] = _stateful(step, model, config, x, y)
        out[name].compiled = getattr(step, "compiled", None)
    return out


def _stateful(step, model, config, x, y):
    from tracker_gpu import optim

    held = {"model": model, "state": optim.setup(rule(config), model)}

    def run():
        loss, held["model"], held["state"] = step(held["model"], held["state"], x, y)
        return loss

    return run


# the loss of the first step may differ this much between the contenders: rounding in float32,
# and the half dtype's own in a half precision
AGREE = {"32": 1e-3, "bf16": 5e-2, "16": 2e-2}


def measure(steps, config, args):
    rng = np.random.default_rng(1)
    shape = (args.batch, args.context)
    x, y = rng.integers(0, VOCAB, shape), rng.integers(0, VOCAB, shape)
    runs = contenders(config, x, y, args.backend, args.precision)
    first = {name: float(run()) for name, run in runs.items()}  # warm-up, and the recording
    spread = max(first.values()) - min(first.values())
    assert spread < AGREE[args.precision], f"the first losses differ: {first}"
    rates = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            began = time.perf_counter()
            for _ in range(steps):
                loss = run()
            float(loss)  # waits for the device: a block ends when its last step is done
            rates[name].append(steps * x.size / (time.perf_counter() - began))
    if args.backend == "cupy":
        from gpu_measure import capture_of, describe_capture

        captures = capture_of(runs["tracker_gpu compiled"].compiled)
        print(f"tracker_gpu compiled: {describe_capture(captures)}")
    return {name: statistics.median(r) for name, r in rates.items()}, first


def targets(rates):
    """Issue 25's targets, met or missed."""
    torch_rate, eager, compiled = (rates[k] for k in ("torch eager", "tracker_gpu eager",
                                                       "tracker_gpu compiled"))  # fmt: skip
    found = [
        ("eager at least 0.8x PyTorch eager's tokens per second", eager / torch_rate, 0.8),
        ("compiled faster than PyTorch eager", compiled / torch_rate, 1.0),
        ("compiled at least 1.3x eager's tokens per second", compiled / eager, 1.3),
    ]
    return [{"target": t, "value": v, "met": v >= bound} for t, v, bound in found]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 2), ("width", 64), ("heads", 4), ("context", 64),
                          ("batch", 32), ("steps", 20), ("rounds", 5), ("threads", 1)):  # fmt: skip
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--backend", choices=["numpy", "cupy"], default="numpy")
    p.add_argument("--precision", choices=["32", "16", "bf16"], default="32")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    keep_freed_memory()  # as the job does, for every contender of this process
    if args.backend == "cupy":
        from gpu_measure import cupy_gpu

        if cupy_gpu()[0] is None:
            print(f"--backend cupy: no GPU available ({cupy_gpu()[1]})", file=sys.stderr)
            sys.exit(3)
    config = TextConfig(layers=args.layers, width=args.width, heads=args.heads,
                        context=args.context, batch_size=args.batch)  # fmt: skip
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    with threadpool_limits(limits=args.threads, user_api="blas"):
        rates, first = measure(args.steps, config, args)
    base = rates["torch eager"]
    precision = "float32" if args.precision == "32" else f"{HALF[args.precision]} compute"
    print(f"text step: {args.layers} layers, width {args.width}, {args.heads} heads, context "
          f"{args.context}, batch {args.batch}, {precision}, on {args.backend}; {args.threads} "
          f"thread(s), {blas_kernels()}; median of {args.rounds} rounds of {args.steps} "
          "steps")  # fmt: skip
    for name, rate in rates.items():
        print(f"  {name:22s} {rate:10,.0f} tokens/s  {rate / base:5.2f}x PyTorch eager")
    found = targets(rates)
    for t in found:
        print(f"target: {t['target']}: {t['value']:.2f} {'met' if t['met'] else 'MISSED'}")
    if args.json:
        document = dict(vars(args), rates=rates, first=first, targets=found)
        Path(args.json).write_text(json.dumps(document))
    return rates


if __name__ == "__main__":
    main()
