"""fd-gcu: Enflame GCUs through paddle-custom-gcu (custom device ``gcu``).

Device hooks only. There are no kernel hooks yet: every op falls through to
fd-core's CPU reference backend, whose kernels are plain paddle ops and so run
on the GCU once ``fd_set_device`` has made it current. Not yet run on real
hardware.

The GCU is a paddle custom device: the framework is the ``paddlepaddle``
wheel and the device comes from the ``paddle-custom-gcu`` plugin, which paddle
loads at import. Collectives go through paddle's custom-device backend
``xccl`` (ECCL underneath).

``fd_device_availability`` never imports paddle in the calling process: the
installed distributions settle the common case (no plugin installed), and
otherwise a child process imports paddle and reports whether ``gcu`` is
among ``paddle.device.get_all_custom_device_type()`` and the GCU count.
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

DEVICE_TYPE = "gcu"
VISIBLE_DEVICES_ENV = "TOPS_VISIBLE_DEVICES"  # the TopsRider runtime's variable
PLUGIN_DISTRIBUTIONS = ("paddle-custom-gcu",)
INSTALL_HINT = (
    "install the paddlepaddle CPU wheel plus the plugin, e.g. pip install paddle-custom-gcu "
    "-i https://www.paddlepaddle.org.cn/packages/stable/gcu/ (see fd-gcu's README)"
)
# Runs in a child process; prints one JSON line.
PROBE = """
import json, paddle
types = [str(t) for t in paddle.device.get_all_custom_device_type()]
built = "gcu" in types
count = paddle.base.core.get_custom_device_count("gcu") if built else 0
print(json.dumps({"version": paddle.__version__, "built": built, "count": int(count), "types": types}))
"""


@hookimpl
def fd_device_info() -> DeviceInfo:
    return DeviceInfo(
        name="gcu",
        device_type=DEVICE_TYPE,
        visible_devices_env=VISIBLE_DEVICES_ENV,
        collective_backend="xccl",
        paddle_package="paddlepaddle + paddle-custom-gcu (custom device 'gcu'; see fd-gcu's README)",
        auto_priority=100,
        description="Enflame GCUs; kernels are fd-core's reference ops (not yet run on hardware)",
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
    # A plugin built from source may be found through CUSTOM_DEVICE_ROOT instead.
    if not any(_installed(d) for d in PLUGIN_DISTRIBUTIONS) and not os.environ.get("CUSTOM_DEVICE_ROOT"):
        return Availability.unusable(
            "the Enflame plugin paddle-custom-gcu is not installed, so paddle has no custom "
            f"device 'gcu'; {INSTALL_HINT}"
        )
    visible = os.environ.get(VISIBLE_DEVICES_ENV)
    if visible is not None and not visible.strip():
        return Availability.unusable(f"{VISIBLE_DEVICES_ENV} is set but empty, which hides every GCU")
    probe = _probe(visible)
    if "error" in probe:
        return Availability.unusable(probe["error"])
    version = probe["version"]
    if not probe["built"]:
        return Availability.unusable(
            f"paddle {version} has no custom device 'gcu' "
            f"(paddle.device.get_all_custom_device_type() is {probe['types']}); {INSTALL_HINT}"
        )
    if probe["count"] == 0:
        return Availability.unusable(
            f"paddle {version} has the 'gcu' plugin but sees no GCU (custom device count is 0, "
            f"{VISIBLE_DEVICES_ENV}={visible!r}); check the driver with efsmi"
        )
    return Availability.ok(
        f"{probe['count']} GCU(s) visible", f"paddle {version}", "kernels: fd-core reference ops"
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
    from paddle.device import custom_device

    # Best effort: total from the plugin's device properties, minus what this
    # process has reserved (other processes on the device are not seen).
    place = f"{DEVICE_TYPE}:{device_id}"
    try:
        total = int(paddle.device.get_device_properties(place).total_memory)
        free = total - int(custom_device.memory_reserved(place))
    except Exception as exc:
        raise RuntimeError(
            f"could not read the memory of {place} ({type(exc).__name__}: {exc}); "
            "size the KV cache with --num-gpu-blocks-override"
        ) from exc
    return MemoryInfo(total_bytes=total, free_bytes=free)


@hookimpl
def fd_device_capabilities() -> Capabilities:
    # What the kernels in use (fd-core's reference ops) support on a GCU.
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
