"""The built-in CPU reference backend.

Every hook is implemented with ``trylast=True``: it is the fallback for any
op a hardware backend leaves unanswered, and the oracle the conformance
suite compares backends against. Kernels are the ``reference_*`` functions
of ``fd_core.ops`` (plain fp32 paddle ops, so they also run on any paddle
device). Importing this module imports no paddle.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

from fd_core import envs
from fd_core.plugins import API_VERSION, hookimpl
from fd_core.plugins.types import (
    Availability,
    Capabilities,
    Communicator,
    DeviceInfo,
    KVPool,
    MemoryInfo,
    Tensor,
)

FD_API_VERSION = API_VERSION

impl = hookimpl(trylast=True)


def num_threads() -> int:
    """Threads for CPU kernels: FD_CPU_NUM_THREADS (read once, as every
    ``fd_core.envs`` variable), else the usable cores (read once: every
    native kernel call asks)."""
    configured = envs.get("FD_CPU_NUM_THREADS")
    if configured is not None:
        if configured < 1:
            raise ValueError(f"FD_CPU_NUM_THREADS must be >= 1, got {configured}")
        return int(configured)
    return _usable_cores()


@functools.lru_cache(maxsize=1)
def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def prefer_fast_mkl_kernels() -> None:
    """Let the MKL inside Paddle's CPU wheels use its AVX2 GEMM on AMD CPUs.

    That MKL dispatches on the CPU vendor and gives non-Intel CPUs its
    slowest code path; ``MKL_DEBUG_CPU_TYPE=5`` selects the AVX2 kernels
    (fp32 GEMM 3-4x faster on AMD EPYC, measured by
    ``benchmarks/decode_step.py``). MKL reads it once, at its first BLAS
    call, so this must run before any matmul; a value already set wins.
    """
    if _cpu_vendor() == "AuthenticAMD":
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")


@impl
def fd_device_info() -> DeviceInfo:
    return DeviceInfo(
        name="cpu",
        device_type="cpu",
        visible_devices_env=None,
        collective_backend="gloo",
        paddle_package="paddlepaddle (pip install 'fd-core[cpu]')",
        auto_priority=0,
        description="reference kernels in fp32 paddle ops",
    )


@impl
def fd_device_availability() -> Availability:
    if importlib.util.find_spec("paddle") is None:
        return Availability.unusable("paddle is not installed; pip install 'fd-core[cpu]'")
    return Availability.ok(f"{num_threads()} threads", "fp32 reference kernels")


@impl
def fd_device_memory(device_id: int) -> MemoryInfo:
    from fd_core.config import host_memory

    total, free = host_memory()
    return MemoryInfo(total_bytes=total, free_bytes=free)


@impl
def fd_device_capabilities() -> Capabilities:
    # The reference numerics of every built-in method (fd_core.quantization) and
    # KV-cache dtype (fd_core.ops.kv_dtype).
    # wint2 and w4a8_static come only from offline-quantized checkpoints (fd_core.quantization.offline).
    return Capabilities(quantization_methods=("wint8", "wint4", "w8a8", "block_wise_fp8", "w4a8", "w4afp8",
                                              "wint2", "w4a8_static"),
                        kv_cache_dtypes=("float32", "bfloat16", "float16", "int8", "fp8", "int8_static"))


@impl
def fd_set_device(device_id: int) -> str:
    from fd_core._paddle import import_paddle

    prefer_fast_mkl_kernels()  # before paddle runs its first matmul
    paddle = import_paddle()
    paddle.set_device("cpu")
    paddle.base.core.set_num_threads(num_threads())
    return "cpu"


@impl
def fd_rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None
) -> Tensor | tuple[Tensor, Tensor]:
    from fd_core.ops.norm import reference_rms_norm

    return reference_rms_norm(x, weight, eps, residual)


@impl
def fd_rotary_embedding(
    q: Tensor, k: Tensor, positions: Tensor, cos_sin: Tensor, interleaved: bool
) -> tuple[Tensor, Tensor]:
    from fd_core.ops.rope import reference_rotary_embedding

    return reference_rotary_embedding(q, k, positions, cos_sin, interleaved)


@impl
def fd_silu_and_mul(x: Tensor) -> Tensor:
    from fd_core.ops.activation import reference_silu_and_mul

    return reference_silu_and_mul(x)


@impl
def fd_linear(x: Tensor, weight: Tensor | None, bias: Tensor | None, quant: Any) -> Tensor:
    if quant is None:
        from fd_core.ops.linear import reference_linear

        return reference_linear(x, weight, bias)
    from fd_core.quantization.reference import quantized_linear

    return quantized_linear(x, quant, bias)


@impl
def fd_allocate_kv_cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str, location: str
) -> tuple[KVPool, KVPool]:
    from fd_core.ops.attention import reference_allocate_kv_cache

    return reference_allocate_kv_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, location)


@impl
def fd_copy_kv_blocks(
    src_cache: KVPool, dst_cache: KVPool, src_blocks: list[int], dst_blocks: list[int], block_size: int
) -> bool:
    from fd_core.ops.attention import reference_copy_kv_blocks

    return reference_copy_kv_blocks(src_cache, dst_cache, src_blocks, dst_blocks, block_size)


@impl
def fd_write_kv_cache(k: Tensor, v: Tensor, k_cache: KVPool, v_cache: KVPool, slot_mapping: Tensor) -> bool:
    from fd_core.ops.attention import reference_write_kv_cache

    return reference_write_kv_cache(k, v, k_cache, v_cache, slot_mapping)


@impl
def fd_vision_attention(
    qkv: Tensor, cos: Tensor, sin: Tensor, cu_seqlens: list[int], num_heads: int, scale: float
) -> Tensor:
    from fd_core.ops.vision_attention import reference_vision_attention

    return reference_vision_attention(qkv, cos, sin, cu_seqlens, num_heads, scale)


@impl
def fd_prefill_attention(
    q: Tensor, k: Tensor, v: Tensor, k_cache: KVPool, v_cache: KVPool, metadata: Any, scale: float
) -> Tensor:
    from fd_core.ops.attention import reference_prefill_attention

    return reference_prefill_attention(q, k, v, k_cache, v_cache, metadata, scale)


@impl
def fd_decode_attention(q: Tensor, k_cache: KVPool, v_cache: KVPool, metadata: Any, scale: float) -> Tensor:
    from fd_core.ops.attention import reference_decode_attention

    return reference_decode_attention(q, k_cache, v_cache, metadata, scale)


@impl
def fd_moe_select_experts(
    router_logits: Tensor, top_k: int, correction_bias: Tensor | None, renormalize: bool, norm_min: float
) -> tuple[Tensor, Tensor]:
    from fd_core.ops.moe import reference_moe_select_experts

    return reference_moe_select_experts(router_logits, top_k, correction_bias, renormalize, norm_min)


@impl
def fd_moe_experts(
    x: Tensor, topk_weights: Tensor, topk_ids: Tensor, up_gate_weights: Tensor | None,
    down_weights: Tensor | None, quant: Any,
) -> Tensor:
    if quant is None:
        from fd_core.ops.moe import reference_moe_experts

        return reference_moe_experts(x, topk_weights, topk_ids, up_gate_weights, down_weights)
    from fd_core.quantization.reference import quantized_moe_experts

    return quantized_moe_experts(x, topk_weights, topk_ids, quant)


@impl
def fd_apply_token_bitmask(logits: Tensor, bitmask: Any, rows: list[int]) -> Tensor | None:
    from fd_core.ops.token_bitmask import reference_apply_token_bitmask

    return reference_apply_token_bitmask(logits, bitmask, rows)


@impl
def fd_sample(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, uniforms: Tensor,
    method: str,
) -> Tensor | None:
    from fd_core.ops.sampling import reference_sample

    return reference_sample(logits, temperature, top_k, top_p, min_p, uniforms, method)


@impl
def fd_communicator(world_size: int, rank: int, group: Any) -> Communicator:
    from fd_core.ops.collectives import Communicator

    return Communicator(world_size, rank, group)
