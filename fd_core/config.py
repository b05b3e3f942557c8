"""Engine arguments with FastDeploy's names, and sizing the KV cache.

``EngineArgs`` is what users give (``LLM(**kwargs)``, ``fd-serve`` flags);
it is validated here and turned into the small per-component configs
(``CacheConfig``, ``SchedulerConfig``) only at this boundary. Components
never see the whole argument set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fd_core import envs

__all__ = ["EngineArgs", "UnsupportedFeatureError", "kv_cache_blocks"]

GIB = 1 << 30


class UnsupportedFeatureError(ValueError):
    """A flag names a feature that is not implemented (yet)."""


@dataclass
class EngineArgs:
    model: str
    tokenizer: str | None = None  # defaults to the model directory
    served_model_name: str | None = None
    backend: str = "auto"  # auto, cpu, cuda, xpu, iluvatar, dcu, gcu, or a plugin's name
    max_model_len: int = 2048  # FastDeploy's default
    max_num_seqs: int = 8  # FastDeploy's default
    max_num_batched_tokens: int | None = None  # default: 2048 (chunked) or max_model_len
    block_size: int = 64
    gpu_memory_utilization: float = 0.9
    kv_cache_ratio: float = 0.75  # accepted for FastDeploy compatibility; see README
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    swap_space: float = 0.0  # GiB of host memory for evicted prefix-cache blocks
    enable_chunked_prefill: bool | None = None  # default on unless FD_DISABLE_CHUNKED_PREFILL=1
    tensor_parallel_size: int = 1
    quantization: str | dict[str, Any] | None = None
    use_cudagraph: bool = False
    speculative_config: str | dict[str, Any] | None = None
    chat_template: str | None = None
    seed: int | None = 0
    disable_log_stats: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        """Build from keyword arguments, naming any unknown one."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(
                f"unknown engine argument(s) {', '.join(unknown)}; known: {', '.join(sorted(names - {'extra'}))}"
            )
        args = cls(model=model, **kwargs)
        args.validate()
        return args

    def validate(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")

        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                     "num_gpu_blocks_override", "tensor_parallel_size"):
            positive(name)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not 0.0 < self.kv_cache_ratio <= 1.0:
            raise ValueError(f"--kv-cache-ratio must be in (0, 1], got {self.kv_cache_ratio}")
        if self.swap_space < 0:
            raise ValueError(f"--swap-space must be >= 0 GiB, got {self.swap_space}")
        if self.tensor_parallel_size != 1:
            raise UnsupportedFeatureError(
                f"--tensor-parallel-size {self.tensor_parallel_size}: tensor parallelism is not "
                "implemented yet; use 1"
            )
        from fd_core.quantization.config import parse_quantization

        parse_quantization(self.quantization)  # raises naming an unknown or unimplemented method
        if self.use_cudagraph:
            raise UnsupportedFeatureError("--use-cudagraph: graph capture is not implemented yet")
        if self.speculative_config:
            raise UnsupportedFeatureError(
                "--speculative-config: speculative decoding is not implemented yet"
            )

    @property
    def chunked_prefill(self) -> bool:
        if self.enable_chunked_prefill is not None:
            return self.enable_chunked_prefill
        return not envs.get("FD_DISABLE_CHUNKED_PREFILL")

    @property
    def batched_tokens(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.chunked_prefill else max(2048, self.max_model_len)


def kv_cache_blocks(
    args: EngineArgs, bytes_per_block: int, device_type: str, total_bytes: int, free_bytes: int
) -> int:
    """How many KV blocks to allocate.

    ``--num-gpu-blocks-override`` wins. On accelerators the cache gets
    ``total * gpu_memory_utilization`` minus what is already in use (model
    weights included). On the CPU backend the cache is host memory shared
    with everything else, so it is capped by ``FD_CPU_KVCACHE_SPACE`` GiB
    (default 4) and by ``gpu_memory_utilization`` of the memory available now.
    """
    if args.num_gpu_blocks_override is not None:
        return args.num_gpu_blocks_override
    if device_type == "cpu":
        cap = envs.get("FD_CPU_KVCACHE_SPACE") * GIB
        budget = min(cap, int(free_bytes * args.gpu_memory_utilization))
    else:
        budget = int(total_bytes * args.gpu_memory_utilization) - (total_bytes - free_bytes)
    blocks = budget // bytes_per_block
    if blocks < 2:
        raise ValueError(
            f"no memory left for the KV cache: budget {budget / GIB:.2f} GiB, one block needs "
            f"{bytes_per_block / (1 << 20):.1f} MiB; raise --gpu-memory-utilization"
            + (" or FD_CPU_KVCACHE_SPACE" if device_type == "cpu" else "")
            + ", or set --num-gpu-blocks-override"
        )
    return int(blocks)
