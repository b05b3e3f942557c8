"""The types of the plugin API: what hooks take and return.

Plain data a backend hands to the core (what the device is and can do) and
the types of the kernel hooks' tensors, KV pools and communicators. No
tensor library is imported here; the listing command and the scheduler read
these without loading paddle.

``Tensor`` is ``paddle.Tensor`` for the type checker (paddle ships
inline types, ``py.typed``) and only a name at run time: this package never
imports paddle, so the listing command and the API process stay
paddle-free, yet mypy checks hook implementations against paddle's own
signatures (a numpy array is not a ``Tensor``). KV pools and communicators
are ``Protocol``s: what the core relies on, whatever class a backend uses.
``tests/plugins/test_typed_contract.py`` checks every backend's hook
implementations against the hookspecs with mypy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    from paddle import Tensor
else:
    Tensor = Any  # a name only: importing paddle here would load it in paddle-free processes

__all__ = [
    "Availability",
    "Capabilities",
    "Communicator",
    "DeviceInfo",
    "KVPool",
    "KVTransport",
    "MemoryInfo",
    "QuantizedPool",
    "Tensor",
]


class QuantizedPool(Protocol):
    """A KV pool in an 8-bit dtype (``fd_core.ops.kv_storage.QuantizedKV``
    satisfies it): ``codes [S, Hkv, Dh]`` int8 (or uint8 fp8 e4m3fn bit
    patterns) and fp32 ``scales [S, Hkv]``; see ``fd_core.ops.kv_dtype``."""

    @property
    def codes(self) -> Tensor: ...

    @property
    def scales(self) -> Tensor: ...

    @property
    def kv_dtype(self) -> str: ...  # "int8" or "fp8"

    @property
    def shape(self) -> Sequence[int]: ...  # the codes' shape


# One layer's K (or V) cache as ``fd_allocate_kv_cache`` returns it: a tensor
# in the backend's own layout (the reference: ``[S, Hkv, Dh]`` fp32 / bf16 /
# fp16) or a quantized pool. Only the backend's own kernels look inside.
KVPool: TypeAlias = Tensor | QuantizedPool


class KVTransport(Protocol):
    """Moves prefill/decode disaggregation messages (lists of byte frames) between
    instances (``fd_kv_transport``); ``fd_core.disagg.transport.TcpTransport`` is the
    built-in one. The first frame of each message is a small header; the rest are
    KV blocks, laid out as ``fd_core.disagg.wire`` says."""

    name: str  # the --cache-transfer-protocol it answers, e.g. "rdma"

    # prefill side: serve tasks at "host:port"; on_task(frames, reply) runs on the transport's
    # thread, reply(frames) may be called later from any thread
    def listen(self, address: str, on_task: Callable[[list[bytes], Callable[[list[bytes]], None]], None]) -> None: ...

    # decode side: send one task, block for its reply; fd_core.disagg.wire.TransferError on timeout
    def request(self, address: str, frames: list[bytes], timeout_s: float) -> list[bytes]: ...

    def close(self) -> None: ...


class Communicator(Protocol):
    """Collectives for tensor / expert parallelism (``fd_communicator``);
    ``fd_core.ops.collectives.Communicator`` is the reference."""

    def all_reduce(self, x: Tensor, /) -> Tensor: ...  # sum over ranks -> the reduced tensor

    def all_gather(self, x: Tensor, /, axis: int = -1) -> Tensor: ...  # concat along axis, rank order

    def all_to_all(self, x: Tensor, /) -> Tensor: ...  # chunk r of every rank -> rank r


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
