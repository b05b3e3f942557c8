"""fd-cuda: NVIDIA GPUs through paddlepaddle-gpu.

Device hooks only. There are no kernel hooks yet: every op falls through to
fd-core's CPU reference backend, whose kernels are plain paddle ops and so run
on the GPU once ``fd_set_device`` has made it current. Not yet run on real
hardware. Availability is ``fd_core.backends.device_support``'s check, which
asks paddle only in a child process, so the caller never initialises CUDA.
"""

from __future__ import annotations

import functools

from fd_core.backends import device_support as ds
from fd_core.plugins import API_VERSION, hookimpl
from fd_core.plugins.types import Availability, Capabilities, DeviceInfo, MemoryInfo

FD_API_VERSION = API_VERSION

DEVICE_TYPE = "gpu"
VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
PADDLE_DISTRIBUTIONS = ("paddlepaddle-gpu",)  # wheels that may carry a CUDA build
SPEC = ds.PaddleDeviceSpec(
    noun="GPU",
    device_type=DEVICE_TYPE,
    visible_devices_envs=(VISIBLE_DEVICES_ENV,),
    install_hint=(
        "install paddlepaddle-gpu, e.g. pip install paddlepaddle-gpu "
        "-i https://www.paddlepaddle.org.cn/packages/stable/cu126/ (see fd-cuda's README)"
    ),
    driver_tool="nvidia-smi",
    paddle_distributions=PADDLE_DISTRIBUTIONS,
    build="a CUDA build",
    compiled_check="paddle.is_compiled_with_cuda()",
    cpu_wheel_lacks="CUDA",
    count_expr="paddle.device.cuda.device_count()",
    # A ROCm build also answers is_compiled_with_cuda(); it is fd-dcu's.
    probe_code=ds.build_probe(
        "paddle.is_compiled_with_cuda() and not paddle.is_compiled_with_rocm()",
        "paddle.device.cuda.device_count()",
    ),
)
# Looked up per call by fd_device_availability, so tests can replace them.
_installed = ds.installed
_probe = functools.partial(ds.probe_paddle, SPEC.probe_code)  # _probe(visible values)


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


@hookimpl
def fd_device_availability() -> Availability:
    return ds.device_availability(SPEC, installed=_installed, probe=_probe)


@hookimpl
def fd_device_memory(device_id: int) -> MemoryInfo:
    return ds.cuda_memory(device_id)


@hookimpl
def fd_device_capabilities() -> Capabilities:
    # What the kernels in use (fd-core's reference ops) support on a GPU.
    # Graph capture and fp8 wait for fd-cuda's own kernels: the reference
    # attention builds index tensors on the host every step. bf16 needs sm80+.
    return Capabilities(graph_capture=False, fp8=False, bf16=True, quantization_methods=(),
                        kv_cache_dtypes=("float32", "float16", "bfloat16"))


@hookimpl
def fd_set_device(device_id: int) -> str:
    return ds.set_paddle_device(DEVICE_TYPE, device_id)
