"""What ci/gpu finds on the machine (`ci/gpu machine`), and the check of a gradient on GPU 1
(`ci/gpu device-check`). Both run with the venv's python, so they see what the steps see."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "tracker-gpu"
# not on the GPU machine (array-api-extra: the client tests)
MISSING_THERE = ("array-api-compat", "array-api-strict", "array-api-extra")


def machine_facts():
    import platform
    from importlib.metadata import version

    facts = {"python": platform.python_version(), "cpus": os.cpu_count() or 1}
    facts["xdist"] = importlib.util.find_spec("xdist") is not None  # pytest's workers
    for name in ("numpy", PROJECT, *MISSING_THERE):
        try:
            facts[name] = version(name)
        except Exception as error:
            facts[name] = f"missing ({type(error).__name__})"
    try:
        import tracker_gpu

        facts["tracker_gpu_file"] = tracker_gpu.__file__
    except Exception as error:
        facts["tracker_gpu_file"] = f"cannot import: {error!r}"
    facts.update(_cupy_facts())
    facts.update(_torch_facts())
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]
        done = subprocess.run(query, capture_output=True, text=True)
        facts["driver"] = done.stdout.strip().splitlines()[0] if done.returncode == 0 else None
    return facts


def _cuda_version(number):
    return f"{number // 1000}.{number % 1000 // 10}"


def _cupy_facts():
    try:
        import cupy
    except Exception as error:
        return {"cupy": f"cannot import ({error})", "gpus": 0, "why": "CuPy is missing"}
    facts = {"cupy": cupy.__version__, "gpus": 0}
    try:
        if not cupy.is_available():
            return {**facts, "why": "CuPy finds no CUDA GPU"}
        runtime = cupy.cuda.runtime
        count = runtime.getDeviceCount()
        names = [runtime.getDeviceProperties(i)["name"] for i in range(count)]
        facts.update(
            gpus=count,
            names=[n.decode() if isinstance(n, bytes) else n for n in names],
            cuda_driver_api=_cuda_version(runtime.driverGetVersion()),
            cuda_runtime=_cuda_version(runtime.runtimeGetVersion()),
            cupy_bfloat16=_has_bfloat16(cupy),
        )
    except Exception as error:
        facts.update(gpus=0, why=f"CuPy cannot use the GPU: {type(error).__name__}: {error}")
    return facts


def _has_bfloat16(cupy):
    """Whether tracker_gpu makes CuPy arrays of bfloat16: the library's own answer (CuPy 14.2
    makes arrays of ml_dtypes' bfloat16 where ml_dtypes is installed, but tracker_gpu refuses
    bfloat16 on CuPy, where it has not been tested)."""
    from tracker_gpu.backend import half_dtype

    try:
        cupy.zeros(2, dtype=half_dtype("bfloat16", cupy))
    except Exception:
        return False
    return True


def _torch_facts():
    try:
        import torch
    except Exception as error:
        return {"torch": f"cannot import ({error})"}
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_sees_gpu": torch.cuda.is_available(),
    }


def probe(python):
    """The facts, from `python` (the venv's, or this one's when the setup failed)."""
    done = subprocess.run(
        [str(python), str(ROOT / "ci" / "gpu"), "machine"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"gpus": 0, "why": f"the probe failed: {done.stderr.strip()[-2000:]}"}


# --- device1: a gradient on GPU 1 (run as `ci/gpu device-check`)
def device_check():
    sys.path.insert(0, str(ROOT))  # the source tree, as the other steps use it
    import cupy as cp
    import numpy as np

    import tracker_gpu as tg
    from tracker_gpu.cuda import recording

    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal((512, 256)).astype(np.float32) for _ in range(2))
    b = rng.standard_normal(256).astype(np.float32)
    results, problems = {}, []
    for device in (0, 1):
        with cp.cuda.Device(device):
            xd, bd, wd = (cp.asarray(a) for a in (x, b, w))
        with cp.cuda.Device(0), recording() as log:  # GPU 0 current, whatever the data's
            grads = tg.gradient(lambda x, b, w=wd: tg.sum(tg.tanh(x + b) * w), xd, bd)
            cp.cuda.Device(device).synchronize()
        where = [g.device.id for g in grads]
        if where != [device, device]:
            problems.append(f"gradients of data on GPU {device} came back on GPUs {where}")
        launches = [name for kind, name in log if kind == "launch"]
        if not launches:
            problems.append(f"no fused launch on GPU {device}")
        results[device] = {"grads": [cp.asnumpy(g) for g in grads], "launches": launches}
    pairs = list(zip(results[0]["grads"], results[1]["grads"], strict=True))
    bitwise = all(np.array_equal(a, c) for a, c in pairs)
    if not all(np.allclose(a, c, rtol=1e-5, atol=1e-6) for a, c in pairs):
        problems.append("the gradients on GPU 1 differ from GPU 0's")
    report = {
        "ok": not problems,
        "problems": problems,
        "bitwise_equal": bitwise,
        "max_abs_difference": max(float(np.max(np.abs(a - c))) for a, c in pairs),
        "launches": {str(d): r["launches"] for d, r in results.items()},
    }
    print(json.dumps(report))
    return 0 if report["ok"] else 1
