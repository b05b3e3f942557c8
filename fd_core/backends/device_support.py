"""Optional helpers for backends whose device is a paddle build or custom device.

The hook contract (``fd_core/plugins/hookspecs.py``) is the only API a backend
must implement; this module is help for the common case, used by the bundled
fd-cuda, fd-xpu, fd-iluvatar, fd-dcu and fd-gcu. Describe the device with a
:class:`PaddleDeviceSpec` and answer ``fd_device_availability`` with
:func:`device_availability`, which decides, in this order and never raising:

1. paddle is not importable;
2. the paddle distributions installed cannot carry the device: only the CPU
   ``paddlepaddle`` wheel (a device build), or no plugin and no
   ``CUSTOM_DEVICE_ROOT`` (a custom device);
3. a visible-devices variable is set but empty;
4. a child process that imports paddle fails;
5. that paddle is not built for the device (or lacks the custom device);
6. it sees zero devices;
7. otherwise usable, with the device count and paddle version.

Paddle is imported only in the child process (:func:`probe_paddle`), so the
caller never initialises a device runtime (which would break the worker
processes it forks later), and importing this module stays cheap.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from fd_core.plugins.types import Availability, MemoryInfo

CUSTOM_DEVICE_ROOT_ENV = "CUSTOM_DEVICE_ROOT"  # where paddle also finds custom-device plugins


def build_probe(built: str, count: str) -> str:
    """Probe code for a paddle device build: ``built`` and ``count`` are expressions."""
    return (
        "import json, paddle\n"
        f"built = {built}\n"
        f"count = {count} if built else 0\n"
        'print(json.dumps({"version": paddle.__version__, "built": bool(built), "count": int(count)}))\n'
    )


def custom_device_probe(device_type: str) -> str:
    """Probe code for a paddle custom device; also reports the custom types found."""
    quoted = json.dumps(device_type)
    return (
        "import json, paddle\n"
        "types = [str(t) for t in paddle.device.get_all_custom_device_type()]\n"
        f"built = {quoted} in types\n"
        f"count = paddle.base.core.get_custom_device_count({quoted}) if built else 0\n"
        'print(json.dumps({"version": paddle.__version__, "built": built, "count": int(count), '
        '"types": types}))\n'
    )


@dataclass(frozen=True)
class PaddleDeviceSpec:
    """A device reached through paddle, and the texts its availability reasons use.

    Give either ``paddle_distributions`` (a paddle device build such as
    paddlepaddle-gpu, with ``build``, ``compiled_check``, ``cpu_wheel_lacks``
    and ``count_expr``) or ``plugin_distributions`` (a custom device: the CPU
    ``paddlepaddle`` wheel plus a plugin, with ``plugin_title``).
    """

    noun: str  # "GPU": "hides every GPU", "sees no GPU", "2 GPU(s) visible"
    device_type: str  # paddle's device type: "gpu", "xpu", "gcu", ...
    visible_devices_envs: tuple[str, ...]  # each hides every device when set but empty
    install_hint: str  # ends each reason that calls for another install
    driver_tool: str  # "nvidia-smi": "check the driver with nvidia-smi"
    # A paddle device build:
    paddle_distributions: tuple[str, ...] = ()  # wheels that may carry the build
    build: str = ""  # "a CUDA build": "is not a CUDA build", "is a CUDA build but ..."
    compiled_check: str = ""  # "paddle.is_compiled_with_cuda()"
    cpu_wheel_lacks: str = ""  # "CUDA": "the CPU build (paddlepaddle), which has no CUDA"
    count_expr: str = ""  # "paddle.device.cuda.device_count()"
    # Or a custom device:
    plugin_distributions: tuple[str, ...] = ()  # plugin wheels that register device_type
    plugin_title: str = ""  # "Enflame plugin": "the Enflame plugin paddle-custom-gcu is ..."
    # Child-process code printing one JSON line {"version", "built", "count"} (plus
    # "types" for a custom device). Default: build_probe(compiled_check, count_expr),
    # or custom_device_probe(device_type).
    probe_code: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.visible_devices_envs, str):
            object.__setattr__(self, "visible_devices_envs", (self.visible_devices_envs,))
        if bool(self.paddle_distributions) == bool(self.plugin_distributions):
            raise ValueError("give exactly one of paddle_distributions and plugin_distributions")
        if not self.probe_code:
            code = (
                custom_device_probe(self.device_type)
                if self.custom_device
                else build_probe(self.compiled_check, self.count_expr)
            )
            object.__setattr__(self, "probe_code", code)

    @property
    def custom_device(self) -> bool:
        return bool(self.plugin_distributions)


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def paddle_importable() -> bool:
    """Whether ``import paddle`` could find it, without importing it."""
    return importlib.util.find_spec("paddle") is not None


@functools.lru_cache(maxsize=32)
def probe_paddle(code: str, key: Hashable = None) -> dict[str, Any]:
    """Run ``code`` in a child process and return the JSON object it printed last.

    Cached per ``(code, key)``: pass what the answer depends on (the
    visible-devices values) as ``key``. Never raises: a failure comes back
    as ``{"error": reason}``.
    """
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"could not run the paddle probe: {type(exc).__name__}: {exc}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"importing paddle failed: {tail}"}
    try:
        return json.loads(lines[-1])  # type: ignore[no-any-return]
    except ValueError:
        return {"error": f"the paddle probe printed no JSON: {lines[-1]}"}


def device_availability(
    spec: PaddleDeviceSpec,
    *,
    installed: Callable[[str], str | None] | None = None,
    probe: Callable[[Any], dict[str, Any]] | None = None,
) -> Availability:
    """The answer for ``fd_device_availability``; never raises.

    ``installed`` (default :func:`installed`) and ``probe`` (default
    :func:`probe_paddle` of ``spec.probe_code``, called with the tuple of
    visible-devices values) may be replaced, e.g. by a backend's own seams.
    """
    try:
        return _availability(spec, installed, probe)
    except Exception as exc:  # the hook must never raise
        return Availability.unusable(f"availability check failed: {type(exc).__name__}: {exc}")


def _availability(
    spec: PaddleDeviceSpec,
    find: Callable[[str], str | None] | None,
    probe: Callable[[Any], dict[str, Any]] | None,
) -> Availability:
    find = find or installed
    hint = spec.install_hint
    if not paddle_importable():
        return Availability.unusable(f"paddle is not installed; {hint}")
    if spec.custom_device:
        # A plugin built from source may be found through CUSTOM_DEVICE_ROOT instead.
        if not any(find(d) for d in spec.plugin_distributions) and not os.environ.get(
            CUSTOM_DEVICE_ROOT_ENV
        ):
            return Availability.unusable(
                f"the {spec.plugin_title} {spec.plugin_distributions[0]} is not installed, so "
                f"paddle has no custom device '{spec.device_type}'; {hint}"
            )
    else:
        cpu_wheel = find("paddlepaddle")
        if cpu_wheel and not any(find(d) for d in spec.paddle_distributions):
            return Availability.unusable(
                f"paddle {cpu_wheel} here is the CPU build (paddlepaddle), which has no "
                f"{spec.cpu_wheel_lacks} ({spec.compiled_check} is False); {hint}"
            )
    visible = tuple(os.environ.get(name) for name in spec.visible_devices_envs)
    for name, value in zip(spec.visible_devices_envs, visible):
        if value is not None and not value.strip():
            return Availability.unusable(f"{name} is set but empty, which hides every {spec.noun}")
    result = probe(visible) if probe else probe_paddle(spec.probe_code, visible)
    if "error" in result:
        return Availability.unusable(result["error"])
    version = result["version"]
    if not result["built"]:
        if spec.custom_device:
            missing = (
                f"has no custom device '{spec.device_type}' "
                f"(paddle.device.get_all_custom_device_type() is {result['types']})"
            )
        else:
            missing = f"here is not {spec.build} ({spec.compiled_check} is False)"
        return Availability.unusable(f"paddle {version} {missing}; {hint}")
    if result["count"] == 0:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(spec.visible_devices_envs, visible))
        if spec.custom_device:
            has, counted = f"has the '{spec.device_type}' plugin", "custom device count"
        else:
            has, counted = f"is {spec.build}", spec.count_expr
        return Availability.unusable(
            f"paddle {version} {has} but sees no {spec.noun} ({counted} is 0, {shown}); "
            f"check the driver with {spec.driver_tool}"
        )
    return Availability.ok(
        f"{result['count']} {spec.noun}(s) visible",
        f"paddle {version}",
        "kernels: fd-core reference ops",
    )


def set_paddle_device(device_type: str, device_id: int) -> str:
    """``paddle.set_device("<device_type>:<id>")``; returns the place string."""
    import paddle

    place = f"{device_type}:{device_id}"
    paddle.set_device(place)
    return place


def cuda_memory(device_id: int) -> MemoryInfo:
    """Memory of a device behind ``paddle.device.cuda`` (CUDA and ROCm builds)."""
    import paddle

    try:  # device-wide free memory (cudaMemGetInfo), other processes' use included
        free, total = paddle.cuda.mem_get_info(device_id)
    except (AttributeError, RuntimeError):  # older paddle: what this process has not reserved
        total = paddle.device.cuda.get_device_properties(device_id).total_memory
        free = total - paddle.device.cuda.memory_reserved(device_id)
    return MemoryInfo(total_bytes=int(total), free_bytes=int(free))


def custom_device_memory(device_type: str, device_id: int) -> MemoryInfo:
    """Best effort for a custom device: the plugin's total minus what this process reserved.

    Other processes on the device are not seen. Raises RuntimeError, pointing
    at ``--num-gpu-blocks-override``, when the plugin cannot tell.
    """
    import paddle
    from paddle.device import custom_device

    place = f"{device_type}:{device_id}"
    try:
        total = int(paddle.device.get_device_properties(place).total_memory)
        free = total - int(custom_device.memory_reserved(place))
    except Exception as exc:
        raise RuntimeError(
            f"could not read the memory of {place} ({type(exc).__name__}: {exc}); "
            "size the KV cache with --num-gpu-blocks-override"
        ) from exc
    return MemoryInfo(total_bytes=total, free_bytes=free)
