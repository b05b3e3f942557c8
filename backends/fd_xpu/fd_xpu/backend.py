"""fd-xpu: Kunlunxin XPUs through paddlepaddle-xpu.

Device hooks only. There are no kernel hooks yet: every op falls through to
fd-core's CPU reference backend, whose kernels are plain paddle ops and so run
on the XPU once ``fd_set_device`` has made it current. Not yet run on real
hardware.

``fd_device_availability`` never imports paddle in the calling process: the
installed distributions settle the common case (only the CPU ``paddlepaddle``
wheel is present), and otherwise a child process imports paddle and reports
``is_compiled_with_xpu()`` and the XPU count, so the caller never
initialises the XPU runtime.
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

DEVICE_TYPE = "xpu"
VISIBLE_DEVICES_ENV = "XPU_VISIBLE_DEVICES"
PADDLE_DISTRIBUTIONS = ("paddlepaddle-xpu",)  # wheels that may carry an XPU build
INSTALL_HINT = (
    "install paddlepaddle-xpu, e.g. pip install paddlepaddle-xpu "
    "-i https://www.paddlepaddle.org.cn/packages/stable/xpu-p800/ (see fd-xpu's README)"
)
# Runs in a child process; prints one JSON line.
PROBE = """
import json, paddle
built = paddle.is_compiled_with_xpu()
count = paddle.device.xpu.device_count() if built else 0
print(json.dumps({"version": paddle.__version__, "built": bool(built), "count": int(count)}))
"""


@hookimpl
def fd_device_info() -> DeviceInfo:
    return DeviceInfo(
        name="xpu",
        device_type=DEVICE_TYPE,
        visible_devices_env=VISIBLE_DEVICES_ENV,
        collective_backend="bkcl",
        paddle_package="paddlepaddle-xpu (the Kunlunxin XPU build; see fd-xpu's README)",
        auto_priority=100,
        description="Kunlunxin XPUs; kernels are fd-core's reference ops (not yet run on hardware)",
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
            f"paddle {cpu_wheel} here is the CPU build (paddlepaddle), which has no XPU support "
            f"(paddle.is_compiled_with_xpu() is False); {INSTALL_HINT}"
        )
    visible = os.environ.get(VISIBLE_DEVICES_ENV)
    if visible is not None and not visible.strip():
        return Availability.unusable(f"{VISIBLE_DEVICES_ENV} is set but empty, which hides every XPU")
    probe = _probe(visible)
    if "error" in probe:
        return Availability.unusable(probe["error"])
    version = probe["version"]
    if not probe["built"]:
        return Availability.unusable(
            f"paddle {version} here is not an XPU build (paddle.is_compiled_with_xpu() is False); "
            f"{INSTALL_HINT}"
        )
    if probe["count"] == 0:
        return Availability.unusable(
            f"paddle {version} is an XPU build but sees no XPU (paddle.device.xpu.device_count() "
            f"is 0, {VISIBLE_DEVICES_ENV}={visible!r}); check the driver with xpu-smi"
        )
    return Availability.ok(
        f"{probe['count']} XPU(s) visible", f"paddle {version}", "kernels: fd-core reference ops"
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

    # Memory held on the device by the XPU runtime, as paddle reports it.
    total = paddle.device.xpu.memory_total(device_id)
    used = paddle.device.xpu.memory_used(device_id)
    return MemoryInfo(total_bytes=int(total), free_bytes=int(total - used))


@hookimpl
def fd_device_capabilities() -> Capabilities:
    # What the kernels in use (fd-core's reference ops) support on an XPU;
    # bf16 assumes an XPU3 (P800), the part FastDeploy targets.
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
