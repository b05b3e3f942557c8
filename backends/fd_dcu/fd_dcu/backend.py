"""fd-dcu: Hygon DCUs through paddlepaddle-dcu (PaddlePaddle's ROCm/HIP build).

Device hooks only. There are no kernel hooks yet: every op falls through to
fd-core's CPU reference backend, whose kernels are plain paddle ops and so run
on the DCU once ``fd_set_device`` has made it current. Not yet run on real
hardware.

Paddle's ROCm build keeps the CUDA names: device type ``"gpu"``, the
``paddle.device.cuda`` APIs, and the ``"nccl"`` collective backend (RCCL
underneath). ``paddle.is_compiled_with_cuda()`` is True there too, so the
build is told apart by ``paddle.is_compiled_with_rocm()``. Availability is
``fd_core.backends.device_support``'s check, which asks paddle only in a child
process, so the caller never initialises the HIP runtime.
"""

from __future__ import annotations

import functools

from fd_core.backends import device_support as ds
from fd_core.plugins import API_VERSION, hookimpl
from fd_core.plugins.types import Availability, Capabilities, DeviceInfo, MemoryInfo

FD_API_VERSION = API_VERSION

DEVICE_TYPE = "gpu"
# What FastDeploy reads on DCU; the HIP runtime honours it like HIP_VISIBLE_DEVICES.
VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
HIDING_ENVS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
PADDLE_DISTRIBUTIONS = ("paddlepaddle-dcu", "paddlepaddle-rocm")  # wheels that may carry a ROCm build
SPEC = ds.PaddleDeviceSpec(
    noun="DCU",
    device_type=DEVICE_TYPE,
    visible_devices_envs=HIDING_ENVS,
    install_hint=(
        "install paddlepaddle-dcu, e.g. pip install paddlepaddle-dcu "
        "-i https://www.paddlepaddle.org.cn/packages/stable/dcu/ (see fd-dcu's README)"
    ),
    driver_tool="hy-smi",
    paddle_distributions=PADDLE_DISTRIBUTIONS,
    build="a ROCm build",
    compiled_check="paddle.is_compiled_with_rocm()",
    cpu_wheel_lacks="ROCm",
    count_expr="paddle.device.cuda.device_count()",
)
# Looked up per call by fd_device_availability, so tests can replace them.
_installed = ds.installed
_probe = functools.partial(ds.probe_paddle, SPEC.probe_code)  # _probe(visible values)


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


@hookimpl
def fd_device_availability() -> Availability:
    return ds.device_availability(SPEC, installed=_installed, probe=_probe)


@hookimpl
def fd_device_memory(device_id: int) -> MemoryInfo:
    return ds.cuda_memory(device_id)  # the ROCm build keeps paddle.device.cuda


@hookimpl
def fd_device_capabilities() -> Capabilities:
    # What the kernels in use (fd-core's reference ops) support on a DCU.
    return Capabilities(graph_capture=False, fp8=False, bf16=True, quantization_methods=(),
                        kv_cache_dtypes=("float32", "float16", "bfloat16"))


@hookimpl
def fd_set_device(device_id: int) -> str:
    return ds.set_paddle_device(DEVICE_TYPE, device_id)
