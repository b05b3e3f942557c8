"""Self-attention over the paged KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fd_core.layers.basic import Linear
from fd_core.ops.decoder import self_attention
from fd_core.ops.kv_dtype import StaticKVScales

if TYPE_CHECKING:
    from fd_core.backends.base import Ops

__all__ = ["Attention", "KVCache"]


class KVCache:
    """One layer's K and V cache, in the backend's own layout, and its KV
    dtype (``--kv-cache-dtype`` resolved: float32, bfloat16, float16, int8, fp8, int8_static)."""

    def __init__(self, k: Any, v: Any, dtype: str = "float32") -> None:
        self.k = k
        self.v = v
        self.dtype = dtype

    @property
    def scales(self) -> tuple[Any, Any] | None:
        """The K and V scales ``[S, Hkv]`` fp32 of an 8-bit reference pool
        (``fd_core.ops.kv_storage.QuantizedKV``); None for a float pool."""
        k_scales, v_scales = getattr(self.k, "scales", None), getattr(self.v, "scales", None)
        return None if k_scales is None else (k_scales, v_scales)


class Attention:
    """Fused QKV projection, rotary embedding, cache write, paged attention,
    output projection. ``qkv_proj.weight`` is ``[D, (H + 2*Hkv) * Dh]`` with
    columns ``[q | k | v]``."""

    def __init__(
        self, ops: Ops, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
        interleaved_rope: bool = True,
    ) -> None:
        self.ops = ops
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.interleaved_rope = interleaved_rope
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        self.qkv_proj = Linear(ops, hidden_size, self.q_size + 2 * self.kv_size)
        self.o_proj = Linear(ops, self.q_size, hidden_size)
        self.kv_scales: StaticKVScales | None = None  # an offline W4A8C8 checkpoint's (fd_core.ops.kv_dtype)

    def __call__(self, x: Any, cos_sin: Any, meta: Any, cache: KVCache) -> Any:
        # x: [T, D]
        return self_attention(
            self.ops, x, self.qkv_proj.weight.data, self.o_proj.weight.data, cos_sin, meta, cache.k, cache.v,
            self.num_heads, self.num_kv_heads, self.scale, self.interleaved_rope, kv_scales=self.kv_scales,
        )
