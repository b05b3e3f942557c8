"""One rank's view of the parallel layout, and the checks a TP size must pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ParallelConfig", "check_tensor_parallel", "local_kv_heads", "rank_device_id"]


@dataclass(frozen=True)
class ParallelConfig:
    """What a rank needs to know: the tensor-parallel size (the world, for now),
    its rank, and where rank 0's rendezvous store listens."""

    tensor_parallel_size: int = 1
    rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    # seconds a rank waits for the others at the rendezvous before it fails
    rendezvous_timeout_s: int = 120

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size

    def for_rank(self, rank: int) -> ParallelConfig:
        return ParallelConfig(self.tensor_parallel_size, rank, self.master_addr, self.master_port,
                              self.rendezvous_timeout_s)


def local_kv_heads(num_kv_heads: int, world: int) -> int:
    """KV heads each rank holds: its share, or one (replicated) when there are fewer than ranks."""
    return num_kv_heads // world if num_kv_heads >= world else 1


def check_tensor_parallel(config: Any, world: int) -> None:
    """Raise ValueError when ``--tensor-parallel-size world`` cannot split the
    model of ``config`` (a ``fd_core.models.config.ModelConfig``): naming the
    size that does not divide and the sizes that would."""
    if world == 1:
        return

    def divides(what: str, value: int) -> None:
        if value % world:
            ok = [n for n in range(1, value + 1) if value % n == 0 and n <= 64]
            raise ValueError(f"--tensor-parallel-size {world} does not divide the model's {what} ({value}); "
                             f"use one of {', '.join(map(str, ok))}")

    divides("num_attention_heads", config.num_heads)
    kv = config.num_kv_heads
    if kv >= world:
        divides("num_key_value_heads", kv)
    elif world % kv:
        raise ValueError(f"--tensor-parallel-size {world}: the model's {kv} KV heads are replicated over the ranks "
                         f"when there are fewer of them than ranks, which needs a size that is a multiple of {kv}")
    divides("vocab_size", config.vocab_size)
    divides("intermediate_size", config.intermediate_size)
    if config.is_moe:
        divides("moe_intermediate_size", config.moe_intermediate_size)


def rank_device_id(visible_devices_env: str | None, environ: Mapping[str, str], rank: int, world: int) -> int:
    """The device index rank ``rank`` sets (``Backend.set_device``): its position among
    the devices the backend's visible-devices variable lists (``XPU_VISIBLE_DEVICES=0,1``:
    rank 1 -> index 1, which paddle maps to xpu:1). A host backend (no variable) has one
    device, shared: every rank gets 0 and they split the cores instead."""
    if visible_devices_env is None:
        return 0
    raw = environ.get(visible_devices_env, "")
    visible = [d for d in raw.split(",") if d.strip()]
    if visible and len(visible) < world:
        raise ValueError(f"--tensor-parallel-size {world} needs {world} devices, but {visible_devices_env}={raw} "
                         f"lists {len(visible)}; list {world} devices or lower the size")
    return rank
