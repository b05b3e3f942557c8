"""Plain data a backend hands to the core: what the device is and can do.

No tensor library is imported here; the listing command and the scheduler
read these without loading paddle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Availability", "Capabilities", "DeviceInfo", "MemoryInfo"]


@dataclass(frozen=True)
class DeviceInfo:
    """Static description of a backend's device."""

    name: str  # backend name used by --backend: "cpu", "cuda", "xpu", ...
    device_type: str  # paddle device type: "cpu", "gpu", "xpu", "iluvatar_gpu", ...
    visible_devices_env: str | None  # e.g. "CUDA_VISIBLE_DEVICES"; None for cpu
    collective_backend: str  # "gloo", "nccl", "bkcl", "xccl"
    paddle_package: str  # the paddle build this backend needs, for error messages
    # Higher wins when --backend auto finds several usable backends.
    auto_priority: int = 0
    description: str = ""


@dataclass(frozen=True)
class Availability:
    """Whether the backend can run here, and if not, why (for the listing)."""

    usable: bool
    reason: str = ""
    # Extra facts for the listing: selected kernels, device count, driver...
    details: tuple[str, ...] = ()

    @classmethod
    def ok(cls, *details: str) -> Availability:
        return cls(True, "", tuple(details))

    @classmethod
    def unusable(cls, reason: str) -> Availability:
        return cls(False, reason)


@dataclass(frozen=True)
class MemoryInfo:
    """Memory of one device in bytes, as seen now."""

    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Capabilities:
    """What optional features the backend's kernels support."""

    graph_capture: bool = False
    fp8: bool = False
    bf16: bool = False
    quantization_methods: tuple[str, ...] = ()  # beyond unquantized, e.g. ("wint8", "wint4")
    kv_cache_dtypes: tuple[str, ...] = ("float32",)
    extras: dict[str, str] = field(default_factory=dict)
