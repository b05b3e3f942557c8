"""fd-cuda: NVIDIA GPUs through paddlepaddle-gpu.

Device hooks only. There are no kernel hooks yet: every op falls through to
fd-core's CPU reference backend, whose kernels are plain paddle ops and so run
on the GPU once ``fd_set_device`` has made it current. Not yet run on real
hardware.

``fd_device_availability`` never imports paddle in the calling process: the
installed distributions settle the common case (only the CPU ``paddlepaddle``
wheel is present), and otherwise a child process imports paddle and reports
``is_compiled_with_cuda()`` and the GPU count. The caller thus never
initialises CUDA, which would break worker processes it forks later.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata
from typing import Any

from fd_core.plugins import API_VERSION, hookimpl
from fd_core.plugins.types import Availability, Capabilities, DeviceInfo, MemoryInfo

FD_API_VERSION = API_VERSION

DEVICE_TYPE = "gpu"
VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
PADDLE_DISTRIBUTIONS = ("paddlepaddle-gpu",)  # wheels that may carry a CUDA build
INSTALL_HINT = (
    "install paddlepaddle-gpu, e.g. pip install paddlepaddle-gpu "
    "-i https://www.paddlepaddle.org.cn/packages/stable/cu126/ (see fd-cuda's README)"
)
# Runs in a child process; prints one JSON line.
PROBE = """
import json, paddle
built = paddle.is_compiled_with_cuda() and not paddle.is_compiled_with_rocm()
count = paddle.device.cuda.device_count() if built else 0
print(json.dumps({"version": paddle.__version__, "built": bool(built), "count": int(count)}))
"""


@hookimpl
def fd_device_info() -> DeviceInfo:
    return DeviceInfo(
        name="cuda",
        device_type=DEVICE_TYPE,
        visible_devices_env=VISIBLE_DEVICES_ENV,
        collective_backend="nccl",
        paddle_package="paddlepaddle-gpu (cu118 or cu126 build; see fd-cuda's README)",
        auto_priority=100,
        description="NVIDIA GPUs; kernels are fd-core's reference ops (not yet run on hardware)",
    )


def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=8)
def _probe(visible: str | None) -> dict[str, Any]:
    """Import paddle in a child process (``visible`` only keys the cache)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"could not run the paddle probe: {type(exc).__name__}: {exc}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"importing paddle failed: {tail}"}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def _availability() -> Availability:
    if importlib.util.find_spec("paddle") is None:
        return Availability.unusable(f"paddle is not installed; {INSTALL_HINT}")
    cpu_wheel = _installed("paddlepaddle")
    if cpu_wheel and not any(_installed(d) for d in PADDLE_DISTRIBUTIONS):
        return Availability.unusable(
            f"paddle {cpu_wheel} here is the CPU build (paddlepaddle), which has no CUDA "
            f"(paddle.is_compiled_with_cuda() is False); {INSTALL_HINT}"
        )
    visible = os.environ.get(VISIBLE_DEVICES_ENV)
    if visible is not None and not visible.strip():
        return Availability.unusable(f"{VISIBLE_DEVICES_ENV} is set but empty, which hides every GPU")
    probe = _probe(visible)
    if "error" in probe:
        return Availability.unusable(probe["error"])
    version = probe["version"]
    if not probe["built"]:
        return Availability.unusable(
            f"paddle {version} here is not a CUDA build (paddle.is_compiled_with_cuda() is False); "
            f"{INSTALL_HINT}"
        )
    if probe["count"] == 0:
        return Availability.unusable(
            f"paddle {version} is a CUDA build but sees no GPU (paddle.device.cuda.device_count() "
            f"is 0, {VISIBLE_DEVICES_ENV}={visible!r}); check the driver with nvidia-smi"
        )
    return Availability.ok(
        f"{probe['count']} GPU(s) visible", f"paddle {version}", "kernels: fd-core reference ops"
    )


@hookimpl
def fd_device_availability() -> Availability:
    try:
        return _availability()
    except Exception as exc:  # the hook must never raise
        return Availability.unusable(f"availability check failed: {type(exc).__name__}: {exc}")


@hookimpl
def fd_device_memory(device_id: int) -> MemoryInfo:
    import paddle

    try:  # cudaMemGetInfo: device-wide, other processes' use included
        free, total = paddle.cuda.mem_get_info(device_id)
    except (AttributeError, RuntimeError):  # older paddle: what this process has not reserved
        total = paddle.device.cuda.get_device_properties(device_id).total_memory
        free = total - paddle.device.cuda.memory_reserved(device_id)
    return MemoryInfo(total_bytes=int(total), free_bytes=int(free))


@hookimpl
def fd_device_capabilities() -> Capabilities:
    # What the kernels in use (fd-core's reference ops) support on a GPU.
    # Graph capture and fp8 wait for fd-cuda's own kernels: the reference
    # attention builds index tensors on the host every step. bf16 needs sm80+.
    return Capabilities(
        graph_capture=False,
        fp8=False,
        bf16=True,
        quantization_methods=(),
        kv_cache_dtypes=("float32", "float16", "bfloat16"),
    )


@hookimpl
def fd_set_device(device_id: int) -> str:
    import paddle

    place = f"{DEVICE_TYPE}:{device_id}"
    paddle.set_device(place)
    return place
