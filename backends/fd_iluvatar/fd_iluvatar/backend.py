"""fd-iluvatar: Iluvatar CoreX GPUs through paddle-iluvatar-gpu (custom device ``iluvatar_gpu``).

Device hooks only. There are no kernel hooks yet: every op falls through to
fd-core's CPU reference backend, whose kernels are plain paddle ops and so run
on the GPU once ``fd_set_device`` has made it current. Not yet run on real
hardware.

The CoreX GPU is a paddle custom device: the framework is the ``paddlepaddle``
wheel and the device comes from the ``paddle-iluvatar-gpu`` plugin, which paddle
loads at import. Collectives go through paddle's custom-device backend
``xccl`` (the plugin's CUDA-compatible CCL underneath). Availability is
``fd_core.backends.device_support``'s check: no plugin installed settles it,
otherwise a child process asks paddle for its custom device types and count.
"""

from __future__ import annotations

import functools

from fd_core.backends import device_support as ds
from fd_core.plugins import API_VERSION, hookimpl
from fd_core.plugins.types import Availability, Capabilities, DeviceInfo, MemoryInfo

FD_API_VERSION = API_VERSION

DEVICE_TYPE = "iluvatar_gpu"
VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"  # CoreX is CUDA-compatible; FastDeploy reads it too
PLUGIN_DISTRIBUTIONS = ("paddle-iluvatar-gpu",)
SPEC = ds.PaddleDeviceSpec(
    noun="GPU",
    device_type=DEVICE_TYPE,
    visible_devices_envs=(VISIBLE_DEVICES_ENV,),
    install_hint=(
        "install the paddlepaddle CPU wheel plus the plugin, e.g. pip install paddle-iluvatar-gpu "
        "-i https://www.paddlepaddle.org.cn/packages/stable/ixuca/ (see fd-iluvatar's README)"
    ),
    driver_tool="ixsmi",
    plugin_distributions=PLUGIN_DISTRIBUTIONS,
    plugin_title="Iluvatar CoreX plugin",
)
# Looked up per call by fd_device_availability, so tests can replace them.
_installed = ds.installed
_probe = functools.partial(ds.probe_paddle, SPEC.probe_code)  # _probe(visible values)


@hookimpl
def fd_device_info() -> DeviceInfo:
    return DeviceInfo(
        name="iluvatar",
        device_type=DEVICE_TYPE,
        visible_devices_env=VISIBLE_DEVICES_ENV,
        collective_backend="xccl",
        paddle_package="paddlepaddle + paddle-iluvatar-gpu (custom device 'iluvatar_gpu'; see fd-iluvatar's README)",
        auto_priority=100,
        description="Iluvatar CoreX GPUs; kernels are fd-core's reference ops (not yet run on hardware)",
    )


@hookimpl
def fd_device_availability() -> Availability:
    return ds.device_availability(SPEC, installed=_installed, probe=_probe)


@hookimpl
def fd_device_memory(device_id: int) -> MemoryInfo:
    return ds.custom_device_memory(DEVICE_TYPE, device_id)


@hookimpl
def fd_device_capabilities() -> Capabilities:
    # What the kernels in use (fd-core's reference ops) support on a CoreX GPU.
    return Capabilities(graph_capture=False, fp8=False, bf16=True, quantization_methods=(),
                        kv_cache_dtypes=("float32", "float16", "bfloat16"))


@hookimpl
def fd_set_device(device_id: int) -> str:
    return ds.set_paddle_device(DEVICE_TYPE, device_id)
