"""The ``toy`` backend: a CPU device that brings exactly one kernel of its own.

It answers ``fd_silu_and_mul`` with its own paddle code and counts the calls
in ``calls`` so tests can prove it ran; every other op falls through to
fd-core's CPU reference, because this module does not implement it.
"""

from __future__ import annotations

from fd_core.plugins import API_VERSION, hookimpl
from fd_core.plugins.types import Availability, Capabilities, DeviceInfo, MemoryInfo, Tensor

FD_API_VERSION = API_VERSION

calls = {"silu_and_mul": 0}  # op -> times this backend's kernel ran


@hookimpl
def fd_device_info() -> DeviceInfo:
    return DeviceInfo(
        name="toy",
        device_type="cpu",
        visible_devices_env=None,
        collective_backend="gloo",
        paddle_package="paddlepaddle",
        auto_priority=-1,  # below the reference (0): a test backend never wins --backend auto
        description="test backend: own silu_and_mul, reference for the rest",
    )


@hookimpl
def fd_device_availability() -> Availability:
    return Availability.ok("own kernel: silu_and_mul")


@hookimpl
def fd_device_memory(device_id: int) -> MemoryInfo:
    return MemoryInfo(total_bytes=8 << 30, free_bytes=8 << 30)


@hookimpl
def fd_device_capabilities() -> Capabilities:
    return Capabilities(kv_cache_dtypes=("float32",))


@hookimpl
def fd_set_device(device_id: int) -> str:
    import paddle

    paddle.set_device("cpu")
    return "cpu"


@hookimpl
def fd_silu_and_mul(x: Tensor) -> Tensor:
    """``x [T, 2*I] = [gate | up]`` -> ``gate * sigmoid(gate) * up`` ``[T, I]``."""
    import paddle

    calls["silu_and_mul"] += 1
    half = x.shape[-1] // 2
    gate, up = x[..., :half], x[..., half:]
    return gate * paddle.nn.functional.sigmoid(gate) * up
