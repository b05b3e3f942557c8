"""One rank's view of the parallel layout, and the checks a TP size must pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["ParallelConfig", "check_expert_parallel", "check_tensor_parallel", "local_kv_heads", "rank_device_id", "rank_physical_device",
           "visible_devices"]


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
    # --enable-expert-parallel: routed experts partitioned over the ranks (fd_core.parallel.expert_parallel)
    enable_expert_parallel: bool = False

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size

    def for_rank(self, rank: int) -> ParallelConfig:
        return replace(self, rank=rank)


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
    if getattr(config, "vision", None) is not None:  # ERNIE-4.5-VL: its vision experts split too
        divides("vision moe_intermediate_size", config.vision_moe_intermediate_size)


def visible_devices(visible_devices_env: str, environ: Mapping[str, str]) -> list[str] | None:
    """The device ids the backend's visible-devices variable lists, in order; None when it
    is unset (every device is visible). Empty, or a device listed twice: ValueError."""
    raw = environ.get(visible_devices_env)
    if raw is None:
        return None
    visible = [d.strip() for d in raw.split(",") if d.strip()]
    if not visible:
        raise ValueError(f"{visible_devices_env}={raw!r} lists no device; list the devices to use, e.g. "
                         f"{visible_devices_env}=0,1, or unset it")
    twice = sorted({d for d in visible if visible.count(d) > 1})
    if twice:
        raise ValueError(f"{visible_devices_env}={raw} lists device {', '.join(twice)} more than once; each rank "
                         "needs its own device")
    return visible


def check_expert_parallel(config: Any, world: int) -> None:
    """Raise ValueError when ``--enable-expert-parallel`` cannot run the model of
    ``config`` (``fd_core.models.config.ModelConfig``) over ``world`` ranks."""
    if getattr(config, "vision", None) is not None:
        raise ValueError(f"--enable-expert-parallel: {config.architecture} keeps text and vision experts apart, "
                         "which expert parallelism does not place yet; drop the flag (--tensor-parallel-size alone "
                         "splits every expert)")
    if not config.is_moe:
        raise ValueError(f"--enable-expert-parallel: {config.architecture} is a dense model (no routed experts); "
                         "drop the flag (--tensor-parallel-size alone splits it)")
    if config.num_experts % world:
        ok = [n for n in range(1, config.num_experts + 1) if config.num_experts % n == 0]
        raise ValueError(f"--enable-expert-parallel with --tensor-parallel-size {world}: the model's "
                         f"{config.num_experts} experts do not divide over {world} ranks; use a size among "
                         f"{', '.join(map(str, ok))}")


def rank_device_id(visible_devices_env: str | None, environ: Mapping[str, str], rank: int, world: int) -> int:
    """The device index rank ``rank`` of the ``world`` ranks on this host sets
    (``Backend.set_device``): its position among the devices the backend's visible-devices
    variable lists. ``XPU_VISIBLE_DEVICES=4,5,6,7`` at TP=2: rank 0 -> index 0 (xpu 4),
    rank 1 -> index 1 (xpu 5); paddle numbers the visible devices from 0. Unset: every
    device is visible, rank r takes device r. A host backend (no variable) has one device,
    shared: every rank gets 0 and they split the cores instead. Fewer listed devices than
    ranks: ValueError naming the variable."""
    if visible_devices_env is None:
        return 0
    visible = visible_devices(visible_devices_env, environ)
    if visible is not None and len(visible) < world:
        raise ValueError(f"--tensor-parallel-size {world} needs {world} devices, but "
                         f"{visible_devices_env}={environ.get(visible_devices_env)} lists {len(visible)}; list "
                         f"{world} devices or lower the size")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside 0..{world - 1}")
    return rank


def rank_physical_device(visible_devices_env: str | None, environ: Mapping[str, str], rank: int, world: int) -> str:
    """The device id (as the variable lists it) that rank ``rank`` runs on, for logs and checks."""
    index = rank_device_id(visible_devices_env, environ, rank, world)
    if visible_devices_env is None:
        return "host"
    visible = visible_devices(visible_devices_env, environ)
    return str(index) if visible is None else visible[index]
