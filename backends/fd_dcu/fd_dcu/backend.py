"""fd-dcu: Hygon DCUs through paddlepaddle-dcu (PaddlePaddle's ROCm/HIP build).

Device hooks only. There are no kernel hooks yet: every op falls through to
fd-core's CPU reference backend, whose kernels are plain paddle ops and so run
on the DCU once ``fd_set_device`` has made it current. Not yet run on real
hardware.

Paddle's ROCm build keeps the CUDA names: device type ``"gpu"``, the
``paddle.device.cuda`` APIs, and the ``"nccl"`` collective backend (RCCL
underneath). ``paddle.is_compiled_with_cuda()`` is True there too, so the
build is told apart by ``paddle.is_compiled_with_rocm()``.

``fd_device_availability`` never imports paddle in the calling process: the
installed distributions settle the common case (only the CPU ``paddlepaddle``
wheel is present), and otherwise a child process imports paddle and reports
``is_compiled_with_rocm()`` and the DCU count, so the caller never
initialises the HIP runtime.
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
# What FastDeploy reads on DCU; the HIP runtime honours it like HIP_VISIBLE_DEVICES.
VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
HIDING_ENVS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
PADDLE_DISTRIBUTIONS = ("paddlepaddle-dcu", "paddlepaddle-rocm")  # wheels that may carry a ROCm build
INSTALL_HINT = (
    "install paddlepaddle-dcu, e.g. pip install paddlepaddle-dcu "
    "-i https://www.paddlepaddle.org.cn/packages/stable/dcu/ (see fd-dcu's README)"
)
# Runs in a child process; prints one JSON line.
PROBE = """
import json, paddle
built = paddle.is_compiled_with_rocm()
count = paddle.device.cuda.device_count() if built else 0
print(json.dumps({"version": paddle.__version__, "built": bool(built), "count": int(count)}))
"""


@hookimpl
def fd_device_info() -> DeviceInfo:
    return DeviceInfo(
        name="dcu",
        device_type=DEVICE_TYPE,
        visible_devices_env=VISIBLE_DEVICES_ENV,
        collective_backend="nccl",
        paddle_package="paddlepaddle-dcu (PaddlePaddle's ROCm build; see fd-dcu's README)",
        auto_priority=100,
        description="Hygon DCUs; kernels are fd-core's reference ops (not yet run on hardware)",
    )


def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=8)
def _probe(visible: tuple[str | None, ...]) -> dict[str, Any]:
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
            f"paddle {cpu_wheel} here is the CPU build (paddlepaddle), which has no ROCm "
            f"(paddle.is_compiled_with_rocm() is False); {INSTALL_HINT}"
        )
    visible = tuple(os.environ.get(name) for name in HIDING_ENVS)
    for name, value in zip(HIDING_ENVS, visible):
        if value is not None and not value.strip():
            return Availability.unusable(f"{name} is set but empty, which hides every DCU")
    probe = _probe(visible)
    if "error" in probe:
        return Availability.unusable(probe["error"])
    version = probe["version"]
    if not probe["built"]:
        return Availability.unusable(
            f"paddle {version} here is not a ROCm build (paddle.is_compiled_with_rocm() is False); "
            f"{INSTALL_HINT}"
        )
    if probe["count"] == 0:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(HIDING_ENVS, visible))
        return Availability.unusable(
            f"paddle {version} is a ROCm build but sees no DCU (paddle.device.cuda.device_count() "
            f"is 0, {shown}); check the driver with hy-smi"
        )
    return Availability.ok(
        f"{probe['count']} DCU(s) visible", f"paddle {version}", "kernels: fd-core reference ops"
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

    try:  # device-wide free memory, where paddle.cuda's runtime bindings exist
        free, total = paddle.cuda.mem_get_info(device_id)
    except (AttributeError, RuntimeError):  # otherwise: what this process has not reserved
        total = paddle.device.cuda.get_device_properties(device_id).total_memory
        free = total - paddle.device.cuda.memory_reserved(device_id)
    return MemoryInfo(total_bytes=int(total), free_bytes=int(free))


@hookimpl
def fd_device_capabilities() -> Capabilities:
    # What the kernels in use (fd-core's reference ops) support on a DCU.
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
