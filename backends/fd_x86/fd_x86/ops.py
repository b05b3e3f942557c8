"""The decode ops through the C++ ops of ``csrc/x86_ops.cc``.

Each function takes what its fd-core hook takes (``fd_core.plugins.hookspecs``)
and returns the hook's answer, or None when the inputs are not fp32 CPU
tensors of a shape the native op handles (the reference answers then). Inputs
are used in place when contiguous (the usual case: ``paddle.split`` copies),
else copied once. A decode step makes ~6 of these calls per layer, so the
wrappers do as little Python as they can.

KV pools (``fd_core.ops.kv_storage``): the KV ops read and write fp32 pools
on any CPU, and on one with AVX-512 F/BW/VL/DQ also bfloat16 / float16 pools
and int8 / fp8 ``QuantizedKV`` pools (codes and scales passed to the ``_q8``
ops), bit-identical to the reference's ``quantize`` on write and widening in
registers on read; q, k, v themselves stay fp32. Without AVX-512 a non-fp32
pool returns None. An ``int8_static`` pool (FastDeploy's C8, values arriving
pre-scaled by ``127 / S``) is written by its own op (codes ``clip(rint(x))``,
scales 1) and read by the int8 attention ops; the fused rotate-and-store and
the fused layer (``fd_x86.layer``) decline it (``_kv_parts``), so its rows
reach the cache only through ``write_kv_cache``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops

__all__ = ["decode_attention", "prefill_attention", "rms_norm", "rope_and_write_kv_cache", "rotary_embedding",
           "silu_and_mul", "write_kv_cache"]

# metadata.workspace keys: the step's block tables and lengths as paddle tensors
DECODE_KEY, PREFILL_KEY = "x86.decode", "x86.prefill"


_PADDLE: Any = None


def _paddle() -> Any:
    global _PADDLE
    if _PADDLE is None:
        import paddle

        _PADDLE = paddle
    return _PADDLE


def _host(*tensors: Any) -> bool:
    """True when every tensor is fp32 and the first in CPU memory (one op's
    tensors share a place; a mixed call fails the op's own checks). Runs
    ~6 times per layer per step, so it is kept to a few attribute reads."""
    f32 = _paddle().float32
    for t in tensors:
        if t.dtype != f32:
            return False
    return bool(tensors[0].place.is_cpu_place())


_STATIC = "int8_static"  # fd_core.ops.kv_dtype.STATIC_KV_DTYPES
_AVX512: list[bool] = []  # [whether the CPU has what the non-fp32 KV kernels need], once
_HALF_POOLS = ("paddle.bfloat16", "paddle.float16")


def _avx512() -> bool:
    if not _AVX512:
        from fd_x86.cpu import cpu_features

        _AVX512.append(cpu_features().has("avx512f", "avx512bw", "avx512vl", "avx512dq", "f16c"))
    return _AVX512[0]


def _kv_parts(k_cache: Any, v_cache: Any, static: bool = False) -> tuple[Any, Any, Any, Any] | None:
    """``(k data, v data, k scales, v scales)`` of a layer's two pools when the
    native ops read them (scales None unless int8 / fp8), else None: a pool
    off the CPU, not contiguous, of another dtype, or not fp32 without AVX-512.
    An ``int8_static`` pool only when ``static`` (its caller handles it)."""
    k_codes = getattr(k_cache, "codes", None)  # a QuantizedKV
    if k_codes is not None:
        v_codes = getattr(v_cache, "codes", None)
        if v_codes is None or v_codes.dtype != k_codes.dtype or not _avx512():
            return None
        kinds = (getattr(k_cache, "kv_dtype", None), getattr(v_cache, "kv_dtype", None))
        if kinds[0] != kinds[1] or (not static and _STATIC in kinds):
            return None
        parts = (k_codes, v_codes, k_cache.scales, v_cache.scales)
    else:
        dtype = getattr(k_cache, "dtype", None)
        if getattr(v_cache, "dtype", None) != dtype or (
                dtype != _paddle().float32 and (str(dtype) not in _HALF_POOLS or not _avx512())):
            return None
        parts = (k_cache, v_cache, None, None)
    if len(parts[0].shape) != 3 or not parts[0].place.is_cpu_place():
        return None
    if not all(p is None or p.is_contiguous() for p in parts):
        return None
    return parts


def _dense(t: Any) -> Any:
    return t if t.is_contiguous() else t.contiguous()


def _int64(t: Any) -> Any:
    paddle = _paddle()
    if not isinstance(t, paddle.Tensor):
        t = paddle.to_tensor(np.asarray(t, dtype=np.int64))
    if t.dtype != paddle.int64:
        t = t.astype("int64")
    return _dense(t)


def rms_norm(x: Any, weight: Any, eps: float, residual: Any | None = None) -> Any:
    """``normed``, or ``(normed, x + residual)`` with a residual, in one pass."""
    if not _host(x, weight) or (residual is not None and (not _host(residual) or residual.shape != x.shape)):
        return None
    ops = load_ops()
    if residual is None:
        return ops.fd_x86_rms_norm(_dense(x), _dense(weight), float(eps), num_threads())
    out, total = ops.fd_x86_add_rms_norm(_dense(x), _dense(residual), _dense(weight), float(eps), num_threads())
    return out, total


def silu_and_mul(x: Any) -> Any:
    """``x [..., 2I] = [gate | up]`` -> ``silu(gate) * up`` ``[..., I]``."""
    if not _host(x) or len(x.shape) == 0 or x.shape[-1] % 2:
        return None
    return load_ops().fd_x86_silu_and_mul(_dense(x), num_threads())


def rotary_embedding(q: Any, k: Any, positions: Any, cos_sin: Any, interleaved: bool) -> Any:
    """``(q, k)`` rotated at ``positions`` into new tensors (the inputs are
    left as they are)."""
    if not _host(q, k, cos_sin) or len(q.shape) != 3 or len(k.shape) != 3 or q.shape[-1] % 2:
        return None
    q_out, k_out = load_ops().fd_x86_rotary(
        _dense(q), _dense(k), _int64(positions), _dense(cos_sin), bool(interleaved), num_threads()
    )
    return q_out, k_out


def write_kv_cache(k: Any, v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any) -> Any:
    """Rows ``k, v [T, Hkv, Dh]`` into the reference layout's caches
    ``[S, Hkv, Dh]`` at ``slot_mapping`` (-1: skipped), rounded / quantized
    to the pools' dtype, in place; True."""
    parts = _kv_parts(k_cache, v_cache, static=True)
    if parts is None or not _host(k, v):
        return None
    k_data, v_data, k_scales, v_scales = parts
    if getattr(k_cache, "kv_dtype", None) == _STATIC:
        load_ops().fd_x86_write_kv_cache_i8s(_dense(k), _dense(v), k_data, v_data, k_scales, v_scales,
                                             _int64(slot_mapping))
    elif k_scales is None:
        load_ops().fd_x86_write_kv_cache(_dense(k), _dense(v), k_data, v_data, _int64(slot_mapping))
    else:
        load_ops().fd_x86_write_kv_cache_q8(_dense(k), _dense(v), k_data, v_data, k_scales, v_scales,
                                            _int64(slot_mapping))
    return True


def rope_and_write_kv_cache(qkv: Any, positions: Any, cos_sin: Any, interleaved: bool, num_heads: int,
                            num_kv_heads: int, k_cache: Any, v_cache: Any, slot_mapping: Any) -> Any:
    """Split ``qkv [T, (H + 2 Hkv) Dh]``, rotate q and k, store k and v in
    the caches at ``slot_mapping``, in one call -> ``(q, k, v)``."""
    parts = _kv_parts(k_cache, v_cache)
    if parts is None or not _host(qkv, cos_sin) or len(qkv.shape) != 2:
        return None
    k_data, v_data, k_scales, v_scales = parts
    head = (_dense(qkv), _int64(positions), _dense(cos_sin), _int64(slot_mapping), k_data, v_data)
    tail = (int(num_heads), int(num_kv_heads), bool(interleaved), num_threads())
    if k_scales is None:
        return tuple(load_ops().fd_x86_qkv_rope_cache(*head, *tail))
    return tuple(load_ops().fd_x86_qkv_rope_cache_q8(*head, k_scales, v_scales, *tail))


def _tables(metadata: Any, key: str, first: int, last: int) -> tuple[Any, ...]:
    """Requests ``[first, last)``'s block tables ``[R, W]``, cached lengths and
    new-token counts ``[R]`` as paddle tensors, built once per step and shared
    by every layer (``metadata.workspace[key]``)."""
    tables = metadata.workspace.get(key)
    if tables is None:
        paddle = _paddle()
        tables = metadata.workspace[key] = tuple(
            paddle.to_tensor(np.ascontiguousarray(array[first:last], dtype=np.int64))
            for array in (metadata.block_tables, metadata.seq_lens, metadata.query_lens)
        )
    return tables  # type: ignore[no-any-return]


def _attention_pools(q: Any, k_cache: Any, v_cache: Any) -> tuple[Any, ...] | None:
    """The pools as the attention ops take them (``(k, v)``, or ``(k codes,
    v codes, k scales, v scales)`` for the ``_q8`` ops; an ``int8_static``
    pool is int8 codes with scales 1), or None."""
    parts = _kv_parts(k_cache, v_cache, static=True)
    if parts is None or not _host(q) or len(q.shape) != 3:
        return None
    num_heads, head_dim, num_kv = q.shape[1], q.shape[2], parts[0].shape[1]
    if head_dim % 8 or num_heads % num_kv or parts[0].shape[2] != head_dim:
        return None
    return parts if parts[2] is not None else parts[:2]


def decode_attention(q: Any, k_cache: Any, v_cache: Any, metadata: Any, scale: float) -> Any:
    """``q [B, H, Dh]`` (the decode requests) over the paged reference-layout
    cache -> ``[B, H, Dh]``."""
    pools = _attention_pools(q, k_cache, v_cache)
    if pools is None or q.shape[0] > metadata.num_decodes:
        return None
    tables, lens, _ = _tables(metadata, DECODE_KEY, 0, metadata.num_decodes)
    ops = load_ops()
    op = ops.fd_x86_decode_attention if len(pools) == 2 else ops.fd_x86_decode_attention_q8
    return op(_dense(q), *pools, tables, lens, int(metadata.block_size), float(scale), num_threads())


def prefill_attention(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, metadata: Any, scale: float) -> Any:
    """``q [Tp, H, Dh]`` (the prefill requests' new tokens, ragged), causal
    over the cache they were written into (``k``, ``v`` are read from there)
    -> ``[Tp, H, Dh]``."""
    pools = _attention_pools(q, k_cache, v_cache)
    if pools is None:
        return None
    tables, lens, qlens = _tables(metadata, PREFILL_KEY, metadata.num_decodes, metadata.num_reqs)
    ops = load_ops()
    op = ops.fd_x86_prefill_attention if len(pools) == 2 else ops.fd_x86_prefill_attention_q8
    return op(_dense(q), *pools, tables, lens, qlens, int(metadata.block_size), float(scale), num_threads())
