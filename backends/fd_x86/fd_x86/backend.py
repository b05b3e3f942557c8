"""fd-x86: x86 CPUs, with native int8 linear kernels and decode ops.

Device hooks are the CPU reference's (same memory, same ``cpu`` place, gloo).
Kernel hooks answered by paddle custom C++ ops: ``fd_linear`` for
``QuantizedWeight``s of wint8, wint4 and w8a8 (``fd_x86.linear``) and for
unquantized bf16 / fp16 weights on AVX-512 CPUs (``fd_x86.dense16``: widened
in registers, or an avx512_bf16 GEMM from 16 rows; ``FD_X86_DENSE16=0`` turns
it off), and for
fp32 CPU tensors ``fd_vision_attention`` (``fd_x86.vision``: the vision
tower's rotary and attention within each frame, AVX-512), ``fd_rms_norm``, ``fd_silu_and_mul``,
``fd_rotary_embedding``, ``fd_write_kv_cache``, ``fd_decode_attention`` and
``fd_prefill_attention`` (``fd_x86.ops``; the KV ops over fp32 pools, and
on AVX-512 CPUs over bfloat16 / float16 / int8 / fp8 pools too: writes
bit-identical to the reference's, attention widening the rows in registers);
the optional fusions
``fd_rope_and_write_kv_cache`` and, for decode steps with packed quantized
weights, ``fd_decoder_layers`` (``fd_x86.layer``); ``fd_moe_experts`` for
quantized experts, ``fd_moe_layer_experts`` (the same with the layer's shared
expert in the call), ``fd_moe_layer`` (the whole layer: router, routing, experts,
shared expert) and ``fd_moe_select_experts`` (``fd_x86.moe``: one native op
per MoE layer's experts, and the router's top-k); ``fd_communicator`` (``fd_x86.comm``: all-reduce
and all-gather through shared memory between the ranks of one host). Unquantized experts, sampling, the cache allocation / block copies and any input those ops do not
take return None here, so fd-core's reference answers.

Importing this module imports neither paddle nor the compiled ops; the ops
are built on first use (``fd_x86.build``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from fd_core.backends import cpu as reference
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
from fd_x86 import build
from fd_x86.cpu import choose_kernels

FD_API_VERSION = API_VERSION
# fd_decoder_layers takes (or declines) runs whose last layer is attention only (fd_core.backends.base.Ops)
FD_DECODER_LAYERS_ATTENTION_ONLY = True
FD_DECODER_LAYERS_MOE = True  # runs whose MoE layers carry their block (fd_x86.layer)
FD_DECODER_LAYERS_HEAD = True  # runs that end with the model's final norm and LM head (fd_x86.layer)
FD_DECODER_LAYERS_EMBEDDING = True  # such runs that start at the token embedding (fd_x86.layer)

logger = logging.getLogger(__name__)

_build_failed: list[str] = []  # the first build error, once logged


@hookimpl
def fd_device_info() -> DeviceInfo:
    return DeviceInfo(
        name="x86",
        device_type="cpu",
        visible_devices_env=None,
        collective_backend="gloo",
        paddle_package="paddlepaddle (pip install 'fd-core[cpu]')",
        auto_priority=50,  # above the reference (0), below hardware backends (100)
        description=("x86 CPUs: int8 linear kernels (AVX-512 VNNI / AVX2) and fp32 decode ops "
                     "as paddle custom ops"),
    )


def _availability() -> Availability:
    base = reference.fd_device_availability()
    if not base.usable:
        return base
    choice = choose_kernels()
    if choice.isa is None:
        return Availability.unusable(choice.reason)
    if build.is_built():
        state = f"ops built ({build.build_dir()})"
    elif build.compiler() is not None:
        state = f"ops build on first use with {build.compiler()} (~30 s, cached in {build.build_dir()})"
    else:
        return Availability.unusable(
            "fd_x86's kernels are not built and no C++ compiler was found (c++ / g++ on PATH, or "
            "$CXX); install one (e.g. apt-get install g++), or run python -m fd_x86.build where one is"
        )
    return Availability.ok(f"{reference.num_threads()} threads", *choice.summary, state,
                           "other ops (unquantized experts, sampling): fd-core reference")


@hookimpl
def fd_device_availability() -> Availability:
    try:
        return _availability()
    except Exception as exc:  # the hook must never raise
        return Availability.unusable(f"availability check failed: {type(exc).__name__}: {exc}")


@hookimpl
def fd_device_memory(device_id: int) -> MemoryInfo:
    return reference.fd_device_memory(device_id)


@hookimpl
def fd_device_capabilities() -> Capabilities:
    # KV dtypes: all run the native KV ops on AVX-512 CPUs (fp32 only on AVX2 ones, where
    # the hooks answer None for the others and fd-core's reference runs them)
    # bf16: 16-bit weights run native kernels (fd_x86.dense16; the bf16 GEMM rounds activations
    # to bf16), so --dtype auto keeps a bf16 / fp16 checkpoint's dtype on a CPU that has them
    # block_wise_fp8: native linears and experts (fd_x86.fp8) on AVX-512; w4a8: native 2-D linears, fused
    # decoder layers and experts on VNNI (fd_x86.linear.w4a8_linear, fd_x86.layer, the MoE ops' method 5)
    # w4a8_static, wint2 (offline checkpoints' experts): native on AVX-512 VNNI (fd_x86.offline), else the reference
    return Capabilities(quantization_methods=("wint8", "wint4", "w8a8", "block_wise_fp8", "w4a8", "wint2",
                                              "w4a8_static"),
                        kv_cache_dtypes=("float32", "bfloat16", "float16", "int8", "fp8", "int8_static"),
                        bf16=_dense16_native())


def _dense16_native() -> bool:
    from fd_x86.dense16 import dense16_enabled

    try:
        return dense16_enabled()
    except Exception:  # the hook must never raise
        return False


@hookimpl
def fd_set_device(device_id: int) -> str:
    return reference.fd_set_device(device_id)


@hookimpl
def fd_linear(x: Tensor, weight: Tensor | None, bias: Tensor | None, quant: Any) -> Tensor | None:
    """``x @ W + bias`` for wint8 / wint4 / w8a8 / 2-D w4a8 weights (2-D w4a8_static / wint2
    too, ``fd_x86.offline``, on AVX-512 VNNI) and for unquantized
    bf16 / fp16 / fp32 CPU weights (``fd_x86.dense16``); None otherwise (the
    reference answers), or when the ops cannot be built (logged once)."""
    if _build_failed:
        return None
    if quant is None:
        if weight is None or str(weight.dtype) not in ("paddle.bfloat16", "paddle.float16", "paddle.float32"):
            return None
        from fd_x86.dense16 import dense16_linear

        try:
            return dense16_linear(x, weight, bias)
        except build.BuildError as exc:
            _build_failed.append(str(exc))
            logger.warning("fd_x86: %s; unquantized linears fall back to fd-core's reference", exc)
            return None
    from fd_x86.fp8 import METHOD as FP8
    from fd_x86.fp8 import available as fp8_available
    from fd_x86.linear import METHODS, quantized_linear
    from fd_x86.offline import offline_linear
    from fd_x86.offline import runs as offline_runs

    offline = offline_runs(quant.method) and len(quant.qweight.shape) == 2
    if quant.method == "w4a8":
        from fd_x86.linear import w4a8_linear

        try:
            out = w4a8_linear(x, quant)
        except build.BuildError as exc:
            _build_failed.append(str(exc))
            logger.warning("fd_x86: %s; quantized linears fall back to fd-core's reference", exc)
            return None
        return out if out is None or bias is None else out + bias
    if quant.method not in METHODS and not (quant.method == FP8 and fp8_available()) and not offline:
        return None
    try:
        out = offline_linear(x, quant) if offline else quantized_linear(x, quant)
    except build.BuildError as exc:
        _build_failed.append(str(exc))
        logger.warning("fd_x86: %s; quantized linears fall back to fd-core's reference", exc)
        return None
    return out if bias is None else out + bias


def _native(op: Callable[..., Any], *args: Any) -> Any:
    """``op(*args)`` (an ``fd_x86.ops`` function), or None when the ops
    cannot be built here (logged once, as for ``fd_linear``)."""
    if _build_failed:
        return None
    try:
        return op(*args)
    except build.BuildError as exc:
        _build_failed.append(str(exc))
        logger.warning("fd_x86: %s; the native ops fall back to fd-core's reference", exc)
        return None


@hookimpl
def fd_rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None) -> Tensor | tuple[Tensor, Tensor] | None:
    from fd_x86 import ops

    return _native(ops.rms_norm, x, weight, eps, residual)


@hookimpl
def fd_silu_and_mul(x: Tensor) -> Tensor | None:
    from fd_x86 import ops

    return _native(ops.silu_and_mul, x)


@hookimpl
def fd_rotary_embedding(q: Tensor, k: Tensor, positions: Tensor, cos_sin: Tensor,
                        interleaved: bool) -> tuple[Tensor, Tensor] | None:
    from fd_x86 import ops

    return _native(ops.rotary_embedding, q, k, positions, cos_sin, interleaved)


@hookimpl
def fd_write_kv_cache(k: Tensor, v: Tensor, k_cache: KVPool, v_cache: KVPool, slot_mapping: Tensor) -> bool | None:
    from fd_x86 import ops

    return _native(ops.write_kv_cache, k, v, k_cache, v_cache, slot_mapping)


@hookimpl
def fd_decode_attention(q: Tensor, k_cache: KVPool, v_cache: KVPool, metadata: Any, scale: float) -> Tensor | None:
    from fd_x86 import ops

    return _native(ops.decode_attention, q, k_cache, v_cache, metadata, scale)


@hookimpl
def fd_prefill_attention(q: Tensor, k: Tensor, v: Tensor, k_cache: KVPool, v_cache: KVPool, metadata: Any,
                         scale: float) -> Tensor | None:
    from fd_x86 import ops

    return _native(ops.prefill_attention, q, k, v, k_cache, v_cache, metadata, scale)


@hookimpl
def fd_vision_attention(qkv: Tensor, cos: Tensor, sin: Tensor, cu_seqlens: list[int], num_heads: int,
                        scale: float) -> Tensor | None:
    from fd_x86 import vision

    return _native(vision.vision_attention, qkv, cos, sin, cu_seqlens, num_heads, scale)


@hookimpl
def fd_rope_and_write_kv_cache(qkv: Tensor, positions: Tensor, cos_sin: Tensor, interleaved: bool, num_heads: int,
                               num_kv_heads: int, k_cache: KVPool, v_cache: KVPool,
                               slot_mapping: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    from fd_x86 import ops

    return _native(ops.rope_and_write_kv_cache, qkv, positions, cos_sin, interleaved, num_heads, num_kv_heads,
                   k_cache, v_cache, slot_mapping)


@hookimpl
def fd_decoder_layers(layers: Sequence[Any], hidden: Tensor, residual: Tensor | None, cos_sin: Tensor,
                      metadata: Any, k_caches: Sequence[KVPool], v_caches: Sequence[KVPool],
                      head: Any | None) -> tuple[Tensor, Tensor] | Tensor | None:
    from fd_x86.layer import decoder_layers

    return _native(decoder_layers, layers, hidden, residual, cos_sin, metadata, k_caches, v_caches, head)


@hookimpl
def fd_decoder_steps(layers: Sequence[Any], embedding: Any, cos_sin: Tensor, metadata: Any,
                     k_caches: Sequence[KVPool], v_caches: Sequence[KVPool], head: Any, steps: int,
                     vocab_size: int, sampling: Any) -> Tensor | None:
    from fd_x86.layer import decoder_steps

    return _native(decoder_steps, layers, embedding, cos_sin, metadata, k_caches, v_caches, head, steps,
                   vocab_size, sampling)


@hookimpl
def fd_moe_experts(x: Tensor, topk_weights: Tensor, topk_ids: Tensor, up_gate_weights: Tensor | None,
                   down_weights: Tensor | None, quant: Any) -> Tensor | None:
    if quant is None:  # unquantized experts: the reference's paddle matmuls
        return None
    from fd_x86.moe import moe_experts

    return _native(moe_experts, x, topk_weights, topk_ids, quant)


@hookimpl
def fd_moe_layer_experts(x: Tensor, topk_weights: Tensor, topk_ids: Tensor, up_gate_weights: Tensor | None,
                         down_weights: Tensor | None, quant: Any, shared_up_gate: Any,
                         shared_down: Any) -> Tensor | None:
    """Routed and shared experts in one native op (``fd_x86.moe.moe_layer_experts``)."""
    if quant is None:
        return None
    from fd_x86.moe import moe_layer_experts

    return _native(moe_layer_experts, x, topk_weights, topk_ids, quant, shared_up_gate, shared_down)


@hookimpl
def fd_communicator(world_size: int, rank: int, group: Any) -> Communicator | None:
    """All-reduce / all-gather through shared memory between the ranks of one host
    (``fd_x86.comm``; collective: every rank calls it); None (gloo's reference
    answers) with one rank, ``FD_X86_SHM_COMM=0``, ranks on several hosts or no native ops."""
    from fd_x86.comm import shm_communicator

    return shm_communicator(world_size, rank, group)


@hookimpl
def fd_moe_layer(x: Tensor, gate: Tensor, correction_bias: Tensor | None, top_k: int, renormalize: bool,
                 norm_min: float, up_gate_weights: Tensor | None, down_weights: Tensor | None, quant: Any,
                 shared_up_gate: Any, shared_down: Any) -> Tensor | None:
    """A whole MoE layer (router, routing, experts, shared expert) in one native op (``fd_x86.moe.moe_layer``)."""
    if quant is None:
        return None
    from fd_x86.moe import moe_layer

    return _native(moe_layer, x, gate, correction_bias, top_k, renormalize, norm_min, quant, shared_up_gate,
                   shared_down)


@hookimpl
def fd_apply_token_bitmask(logits: Tensor, bitmask: Any, rows: list[int]) -> Tensor | None:
    """Structured output's mask, one masked store per 16 tokens (``fd_x86.bitmask``)."""
    from fd_x86.bitmask import apply_token_bitmask

    return _native(apply_token_bitmask, logits, bitmask, rows)


@hookimpl
def fd_sample(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, uniforms: Tensor,
              method: str) -> Tensor | None:
    """The "sort" draw natively (``fd_x86.sampling``): the reference's distribution, sorting only what the
    draw looks at."""
    from fd_x86.sampling import sample

    return _native(sample, logits, temperature, top_k, top_p, min_p, uniforms, method)


@hookimpl
def fd_moe_select_experts(router_logits: Tensor, top_k: int, correction_bias: Tensor | None, renormalize: bool,
                          norm_min: float) -> tuple[Tensor, Tensor] | None:
    """The reference's routing in one native op (``fd_x86.moe.select_experts``)."""
    from fd_x86.moe import select_experts

    return _native(select_experts, router_logits, top_k, correction_bias, renormalize, norm_min)
