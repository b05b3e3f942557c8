"""Paged attention: the step's metadata, the cache write, prefill and decode.

A step's requests are ordered decodes first (one new token each), then
prefills (a chunk of new tokens each, possibly after cached context). The
metadata is built once per step on the host and shared by every layer;
kernels may keep derived per-step tensors in ``metadata.workspace``.

Reference cache layout: ``[num_blocks * block_size, Hkv, Dh]`` per layer, so
slot ``block_id * block_size + offset`` is one row. The pool's dtype is the
``--kv-cache-dtype`` (float32, bfloat16, float16, or int8 / fp8 codes with
one fp32 scale per slot and KV head, or ``int8_static``'s codes with
scales 1, written pre-scaled by a layer's static per-channel scales:
``fd_core.ops.kv_dtype`` states the layouts and numerics,
``fd_core.ops.kv_storage`` stores and reads them). Writes
round or quantize to the pool's dtype; attention dequantizes the blocks it
reads and computes in fp32. An fp32 pool takes the direct paths below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops._host import as_array, as_tensor, on_host
from fd_core.ops.kv_storage import allocate_pool, copy_rows, store_rows, take_blocks

__all__ = [
    "AttentionMetadata",
    "reference_allocate_kv_cache",
    "reference_copy_kv_blocks",
    "reference_decode_attention",
    "reference_prefill_attention",
    "reference_write_kv_cache",
]

paddle = import_paddle()

_NEG = -1e30  # additive mask; every query row keeps at least one key
_MAX_EXPANDED_BIAS = 1 << 22  # elements (16 MB fp32)


@dataclass
class AttentionMetadata:
    """Per-step description of where each request's tokens live in the cache."""

    num_decodes: int  # requests [0, num_decodes) decode one token each
    block_size: int
    query_lens: np.ndarray  # [B] int64, new tokens per request this step
    seq_lens: np.ndarray  # [B] int64, tokens in the cache per request after this step
    block_tables: np.ndarray  # [B, max_blocks] int64, padded with 0
    positions: Any  # [T] int64 paddle tensor, absolute position of each new token
    slot_mapping: Any  # [T] int64 paddle tensor, cache slot of each new token
    workspace: dict[str, Any] = field(default_factory=dict)  # per-step kernel scratch
    # a decode-only step's positions, slots, seq_lens and block tables ([B, W] row-major) in one
    # [3 B + B W] int64 host tensor (positions and slot_mapping are views of it), for a backend
    # that takes them in one piece; None when the step was built otherwise. A copy with other
    # positions or slots (dataclasses.replace) keeps it stale: a reader checks the views first
    decode_ints: Any = None

    @property
    def num_reqs(self) -> int:
        return int(self.query_lens.shape[0])

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes

    @property
    def num_tokens(self) -> int:
        return int(self.query_lens.sum())

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        num_decodes: int,
    ) -> AttentionMetadata:
        """Compute positions and slot mapping for a step (vectorised, on host)."""
        qlens = np.asarray(query_lens, dtype=np.int64)
        slens = np.asarray(seq_lens, dtype=np.int64)
        if (qlens < 1).any() or (slens < qlens).any():
            raise ValueError(f"bad step: query_lens={query_lens} seq_lens={seq_lens}")
        if not (qlens[:num_decodes] == 1).all():
            raise ValueError(f"the first {num_decodes} requests must decode one token each")
        width = max((len(t) for t in block_tables), default=0) or 1
        tables = np.zeros((len(block_tables), width), dtype=np.int64)
        for i, table in enumerate(block_tables):
            tables[i, : len(table)] = table
        starts = np.concatenate([[0], np.cumsum(qlens)[:-1]])
        req = np.repeat(np.arange(len(qlens)), qlens)
        pos = (slens - qlens)[req] + np.arange(int(qlens.sum())) - starts[req]
        if (pos // block_size >= np.asarray([len(t) for t in block_tables])[req]).any():
            raise ValueError("a request's block table is too short for its sequence length")
        slots = tables[req, pos // block_size] * block_size + pos % block_size
        return cls(
            num_decodes=num_decodes,
            block_size=block_size,
            query_lens=qlens,
            seq_lens=slens,
            block_tables=tables,
            positions=paddle.to_tensor(pos, dtype="int64"),
            slot_mapping=paddle.to_tensor(slots, dtype="int64"),
        )


def reference_allocate_kv_cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str = "float32",
    location: str = "device",
) -> tuple[Any, Any]:
    """Zeroed K and V pools ``[num_blocks * block_size, Hkv, Dh]`` of KV dtype
    ``dtype`` (``fd_core.ops.kv_dtype.KV_DTYPES``); the host tier lives in CPU
    memory whatever the current device is."""
    if location not in ("device", "host"):
        raise ValueError(f"location must be 'device' or 'host', got {location!r}")
    rows = num_blocks * block_size
    host = location == "host"
    return (allocate_pool(rows, num_kv_heads, head_dim, dtype, host),
            allocate_pool(rows, num_kv_heads, head_dim, dtype, host))


def reference_copy_kv_blocks(
    src_cache: Any, dst_cache: Any, src_blocks: list[int], dst_blocks: list[int], block_size: int
) -> bool:
    """Copy whole blocks between two caches of the reference layout (and dtype;
    an 8-bit pool's scales move with their codes)."""
    if not src_blocks:
        return True
    offsets = np.arange(block_size, dtype=np.int64)
    src = (np.asarray(src_blocks, dtype=np.int64)[:, None] * block_size + offsets).reshape(-1)
    dst = (np.asarray(dst_blocks, dtype=np.int64)[:, None] * block_size + offsets).reshape(-1)
    if not _is_fp32(src_cache) or not _is_fp32(dst_cache):
        copy_rows(src_cache, dst_cache, src, dst)
        return True
    rows = paddle.gather(src_cache, paddle.to_tensor(src, place=src_cache.place))
    rows = rows.to(dst_cache.place) if rows.place != dst_cache.place else rows
    paddle.scatter_(dst_cache, paddle.to_tensor(dst, place=dst_cache.place), rows, overwrite=True)
    return True


def _is_fp32(cache: Any) -> bool:
    return isinstance(cache, paddle.Tensor) and cache.dtype == paddle.float32


def reference_write_kv_cache(k: Any, v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any) -> bool:
    """Scatter ``k, v [T, Hkv, Dh]`` into the cache rows ``slot_mapping [T]``,
    rounded or quantized to the cache's dtype."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    if not _is_fp32(k_cache):
        store_rows(k, k_cache, slot_mapping)
        store_rows(v, v_cache, slot_mapping)
        return True
    paddle.scatter_(k_cache, slot_mapping, k.astype(k_cache.dtype), overwrite=True)
    paddle.scatter_(v_cache, slot_mapping, v.astype(v_cache.dtype), overwrite=True)
    return True


@dataclass
class _Gather:
    """Host-built indices for one group of requests (decodes or prefills).

    Keys are read a whole block at a time: request ``i`` sees the
    ``num_blocks * block_size`` slots of its first ``num_blocks`` table
    entries, and the bias masks the ones past its length (and the causal
    future), so the math is attention over exactly its cached tokens."""

    blocks: np.ndarray  # [B * num_blocks] block ids, row-major by request (0 where padded)
    blocks_tensor: Any  # the same, as a paddle tensor (for non-CPU caches)
    query_index: Any  # [B * Qmax] row of q (or the appended zero row) per padded query; None: identity
    token_index: Any  # [Tq] padded row of each real query token; None: identity
    bias: Any  # [1, B, 1, Qmax, num_blocks * block_size] additive causal/length mask
    num_reqs: int
    max_q: int
    num_blocks: int
    expanded_bias: dict[tuple[int, int], Any] = field(default_factory=dict)  # (Hkv, G) -> bias

    def full_bias(self, num_kv: int, group: int, length: int) -> Any:
        """The bias broadcast to the scores' shape ``[Hkv, B, G, Qmax, L]``,
        built once per step when small: paddle's CPU broadcasting add is slow."""
        if num_kv * self.num_reqs * group * self.max_q * length > _MAX_EXPANDED_BIAS:
            return self.bias
        key = (num_kv, group)
        if key not in self.expanded_bias:
            shape = [num_kv, self.num_reqs, group, self.max_q, length]
            self.expanded_bias[key] = self.bias.expand(shape).contiguous()
        return self.expanded_bias[key]


def _gather_plan(meta: AttentionMetadata, first: int, last: int) -> _Gather:
    qlens = meta.query_lens[first:last]
    slens = meta.seq_lens[first:last]
    bs = meta.block_size
    n, max_q = len(qlens), int(qlens.max())
    num_blocks = int(-(-int(slens.max()) // bs))
    blocks = np.ascontiguousarray(meta.block_tables[first:last, :num_blocks]).reshape(-1)
    j = np.arange(num_blocks * bs)
    starts = np.concatenate([[0], np.cumsum(qlens)[:-1]])
    i = np.arange(max_q)
    real = i[None, :] < qlens[:, None]  # [B, Qmax]
    num_q = int(qlens.sum())
    padded = num_q != n * max_q
    query_index = np.where(real, starts[:, None] + i[None, :], num_q)  # num_q -> zero row
    token_index = (np.arange(n)[:, None] * max_q + i[None, :])[real]
    qpos = (slens - qlens)[:, None] + i[None, :]  # [B, Qmax]
    allowed = j[None, None, :] <= qpos[:, :, None]
    allowed &= j[None, None, :] < slens[:, None, None]
    allowed |= ~real[:, :, None] & (j[None, None, :] == 0)  # padded rows: any finite row
    bias = np.where(allowed, 0.0, _NEG).astype(np.float32)[None, :, None, :, :]
    return _Gather(
        blocks=blocks,
        blocks_tensor=paddle.to_tensor(blocks),
        query_index=paddle.to_tensor(query_index.reshape(-1)) if padded else None,
        token_index=paddle.to_tensor(token_index.astype(np.int64)) if padded else None,
        bias=paddle.to_tensor(bias),
        num_reqs=n,
        max_q=max_q,
        num_blocks=num_blocks,
    )


def _take_blocks(cache: Any, plan: _Gather, block_size: int) -> Any:
    """Blocks ``plan.blocks`` of ``cache [S, Hkv, Dh]`` as ``[Hkv, n, block_size, Dh]``.

    A plain copy; on CPU it goes through numpy (zero-copy via DLPack), whose
    strided copy is several times faster than paddle's CPU gather. Other
    dtypes come back dequantized to fp32."""
    if not _is_fp32(cache):
        return take_blocks(cache, plan.blocks, plan.blocks_tensor, block_size)
    rows, num_kv, head_dim = cache.shape
    if on_host(cache):
        table = as_array(cache).reshape(rows // block_size, block_size, num_kv, head_dim)
        return as_tensor(table.transpose(2, 0, 1, 3)[:, plan.blocks])
    table = cache.reshape([rows // block_size, block_size, num_kv, head_dim])
    return paddle.index_select(table, plan.blocks_tensor, axis=0).transpose([2, 0, 1, 3])


def _permute(x: Any, perm: list[int]) -> Any:
    """``x.transpose(perm)``, contiguous (through numpy on CPU: faster)."""
    if on_host(x):
        return as_tensor(as_array(x).transpose(perm))
    return x.transpose(perm)


def _paged_attention(q: Any, k_cache: Any, v_cache: Any, plan: _Gather, scale: float,
                     block_size: int) -> Any:
    # q: [Tq, H, Dh]; cache: [S, Hkv, Dh]; the math is fp32 whatever q's and the cache's dtypes
    out_dtype = q.dtype
    if out_dtype != paddle.float32:
        q = q.astype("float32")
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv = k_cache.shape[1]
    group = num_heads // num_kv
    b, qmax, length = plan.num_reqs, plan.max_q, plan.num_blocks * block_size
    if plan.query_index is not None:
        q = paddle.concat([q, paddle.zeros([1, num_heads, head_dim], dtype=q.dtype)])
        q = paddle.gather(q, plan.query_index)
    qp = _permute(q.reshape([b, qmax, num_kv, group, head_dim]), [2, 0, 3, 1, 4])
    qp = qp.reshape([num_kv, b, group * qmax, head_dim])  # [Hkv, B, G*Qmax, Dh]
    keys = _take_blocks(k_cache, plan, block_size).reshape([num_kv, b, length, head_dim])
    values = _take_blocks(v_cache, plan, block_size).reshape([num_kv, b, length, head_dim])
    scores = paddle.matmul(qp, keys, transpose_y=True) * scale  # [Hkv, B, G*Qmax, L]
    scores = scores.reshape([num_kv, b, group, qmax, length]) + plan.full_bias(num_kv, group, length)
    probs = paddle.nn.functional.softmax(scores, axis=-1).reshape([num_kv, b, group * qmax, length])
    out = paddle.matmul(probs, values).reshape([num_kv, b, group, qmax, head_dim])
    out = _permute(out, [1, 3, 0, 2, 4]).reshape([b * qmax, num_heads, head_dim])
    out = out if plan.token_index is None else paddle.gather(out, plan.token_index)
    return out if out_dtype == paddle.float32 else out.astype(out_dtype)


def _plan(meta: AttentionMetadata, key: str, first: int, last: int) -> _Gather:
    plan = meta.workspace.get(key)
    if plan is None:
        plan = meta.workspace[key] = _gather_plan(meta, first, last)
    return plan  # type: ignore[no-any-return]


def reference_prefill_attention(
    q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, metadata: AttentionMetadata, scale: float
) -> Any:
    """Causal attention of the prefill requests' new tokens over their cache."""
    plan = _plan(metadata, "reference.prefill", metadata.num_decodes, metadata.num_reqs)
    return _paged_attention(q, k_cache, v_cache, plan, scale, metadata.block_size)


def reference_decode_attention(
    q: Any, k_cache: Any, v_cache: Any, metadata: AttentionMetadata, scale: float
) -> Any:
    """One query per decode request over its first ``seq_len`` cached tokens."""
    plan = _plan(metadata, "reference.decode", 0, metadata.num_decodes)
    return _paged_attention(q, k_cache, v_cache, plan, scale, metadata.block_size)
