"""The decode ops through the C++ ops of ``csrc/x86_ops.cc``.

Each function takes what its fd-core hook takes (``fd_core.plugins.hookspecs``)
and returns the hook's answer, or None when the inputs are not fp32 CPU
tensors of a shape the native op handles (the reference answers then). Inputs
are used in place when contiguous (the usual case: ``paddle.split`` copies),
else copied once. A decode step makes ~6 of these calls per layer, so the
wrappers do as little Python as they can.
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
    ``[S, Hkv, Dh]`` at ``slot_mapping`` (-1: skipped), in place; True."""
    if not _host(k, v, k_cache, v_cache) or len(k_cache.shape) != 3 or not k_cache.is_contiguous() \
            or not v_cache.is_contiguous():
        return None
    load_ops().fd_x86_write_kv_cache(_dense(k), _dense(v), k_cache, v_cache, _int64(slot_mapping))
    return True


def rope_and_write_kv_cache(qkv: Any, positions: Any, cos_sin: Any, interleaved: bool, num_heads: int,
                            num_kv_heads: int, k_cache: Any, v_cache: Any, slot_mapping: Any) -> Any:
    """Split ``qkv [T, (H + 2 Hkv) Dh]``, rotate q and k, store k and v in
    the caches at ``slot_mapping``, in one call -> ``(q, k, v)``."""
    if not _host(qkv, cos_sin, k_cache, v_cache) or len(qkv.shape) != 2 or len(k_cache.shape) != 3 \
            or not k_cache.is_contiguous() or not v_cache.is_contiguous():
        return None
    return tuple(load_ops().fd_x86_qkv_rope_cache(
        _dense(qkv), _int64(positions), _dense(cos_sin), _int64(slot_mapping), k_cache, v_cache,
        int(num_heads), int(num_kv_heads), bool(interleaved), num_threads(),
    ))


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


def _attention_shapes_ok(q: Any, k_cache: Any, v_cache: Any) -> bool:
    if not _host(q, k_cache, v_cache) or len(q.shape) != 3 or len(k_cache.shape) != 3:
        return False
    num_heads, head_dim, num_kv = q.shape[1], q.shape[2], k_cache.shape[1]
    return (head_dim % 8 == 0 and num_heads % num_kv == 0 and k_cache.shape[2] == head_dim
            and k_cache.is_contiguous() and v_cache.is_contiguous())


def decode_attention(q: Any, k_cache: Any, v_cache: Any, metadata: Any, scale: float) -> Any:
    """``q [B, H, Dh]`` (the decode requests) over the paged reference-layout
    cache -> ``[B, H, Dh]``."""
    if not _attention_shapes_ok(q, k_cache, v_cache) or q.shape[0] > metadata.num_decodes:
        return None
    tables, lens, _ = _tables(metadata, DECODE_KEY, 0, metadata.num_decodes)
    return load_ops().fd_x86_decode_attention(
        _dense(q), k_cache, v_cache, tables, lens, int(metadata.block_size), float(scale), num_threads()
    )


def prefill_attention(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, metadata: Any, scale: float) -> Any:
    """``q [Tp, H, Dh]`` (the prefill requests' new tokens, ragged), causal
    over the cache they were written into (``k``, ``v`` are read from there)
    -> ``[Tp, H, Dh]``."""
    if not _attention_shapes_ok(q, k_cache, v_cache):
        return None
    tables, lens, qlens = _tables(metadata, PREFILL_KEY, metadata.num_decodes, metadata.num_reqs)
    return load_ops().fd_x86_prefill_attention(
        _dense(q), k_cache, v_cache, tables, lens, qlens, int(metadata.block_size), float(scale), num_threads()
    )
