"""fd-xpu: Kunlunxin XPUs through paddlepaddle-xpu.

Device hooks only. There are no kernel hooks yet: every op falls through to
fd-core's CPU reference backend, whose kernels are plain paddle ops and so run
on the XPU once ``fd_set_device`` has made it current. Not yet run on real
hardware. Availability is ``fd_core.backends.device_support``'s check, which
asks paddle only in a child process, so the caller never initialises the XPU
runtime.
"""

from __future__ import annotations

import functools

from fd_core.backends import device_support as ds
from fd_core.plugins import API_VERSION, hookimpl
from fd_core.plugins.types import Availability, Capabilities, DeviceInfo, MemoryInfo

FD_API_VERSION = API_VERSION

DEVICE_TYPE = "xpu"
VISIBLE_DEVICES_ENV = "XPU_VISIBLE_DEVICES"
PADDLE_DISTRIBUTIONS = ("paddlepaddle-xpu",)  # wheels that may carry an XPU build
SPEC = ds.PaddleDeviceSpec(
    noun="XPU",
    device_type=DEVICE_TYPE,
    visible_devices_envs=(VISIBLE_DEVICES_ENV,),
    install_hint=(
        "install paddlepaddle-xpu, e.g. pip install paddlepaddle-xpu "
        "-i https://www.paddlepaddle.org.cn/packages/stable/xpu-p800/ (see fd-xpu's README)"
    ),
    driver_tool="xpu-smi",
    paddle_distributions=PADDLE_DISTRIBUTIONS,
    build="an XPU build",
    compiled_check="paddle.is_compiled_with_xpu()",
    cpu_wheel_lacks="XPU support",
    count_expr="paddle.device.xpu.device_count()",
)
# Looked up per call by fd_device_availability, so tests can replace them.
_installed = ds.installed
_probe = functools.partial(ds.probe_paddle, SPEC.probe_code)  # _probe(visible values)


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


@hookimpl
def fd_device_availability() -> Availability:
    return ds.device_availability(SPEC, installed=_installed, probe=_probe)


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
    return Capabilities(graph_capture=False, fp8=False, bf16=True, quantization_methods=(),
                        kv_cache_dtypes=("float32", "float16", "bfloat16"))


@hookimpl
def fd_set_device(device_id: int) -> str:
    return ds.set_paddle_device(DEVICE_TYPE, device_id)
