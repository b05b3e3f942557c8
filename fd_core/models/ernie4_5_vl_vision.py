"""ERNIE-4.5-VL's vision side: the adaptive-resolution ViT and the resampler.

``VisionTower`` turns an image's (or a video's) patches ``[N, C*P*P]`` (in the
processor's merge-block order) into ``[N, Dv]``: a linear patch embedding, pre-norm
blocks of bidirectional attention (within each frame) with a 2D axial rotary
embedding (height and width angles over the first half of each head, rotated as
halves) and a quick-GELU MLP, then a LayerNorm. ``Resampler`` merges every
``m x m`` patches (and, for video, every 2 frames; an image's one frame is
duplicated) and projects into the language model: ``[N / m^2 / t_m, D]``.

Called by ``fd_core.models.ernie4_5_vl.Ernie4_5_VLForConditionalGeneration.encode``
once per image. Weights are pinned to fp32 (the tower is small beside the
language model, and HF computes it in the checkpoint's dtype: fp32 in tests).
Kernels go through the backend's ops: every linear (patch embedding, qkv,
proj, fc1/fc2, the resampler's) through ``Ops.linear``, the rotary plus the
attention within each frame through ``Ops.vision_attention``
(``fd_vision_attention``); the LayerNorms and activations are paddle ops.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fd_core._paddle import import_paddle
from fd_core.layers.param import Param
from fd_core.models.ernie4_5_vl_config import VisionConfig
from fd_core.ops.vision_attention import vision_rotary_cos_sin, vision_rotary_positions

if TYPE_CHECKING:
    from fd_core.backends.base import Ops

__all__ = ["Resampler", "VisionTower", "vision_rotary_positions"]

paddle = import_paddle()
F = paddle.nn.functional


class _Linear:
    """``x @ W + b`` with ``W [in, out]`` fp32 (Paddle's layout), through ``Ops.linear``."""

    def __init__(self, ops: Ops, in_f: int, out_f: int, bias: bool = True) -> None:
        self.ops = ops
        self.in_f, self.out_f = in_f, out_f
        self.weight = Param((in_f, out_f), pinned=True)
        self.bias = Param((out_f,), pinned=True) if bias else None

    def __call__(self, x: Any) -> Any:
        return self.ops.linear(x, self.weight.data, None if self.bias is None else self.bias.data)


class _LayerNorm:
    def __init__(self, size: int, eps: float) -> None:
        self.weight = Param((size,), pinned=True)
        self.bias = Param((size,), pinned=True)
        self.eps = eps

    def __call__(self, x: Any) -> Any:
        return F.layer_norm(x, x.shape[-1:], self.weight.data, self.bias.data, self.eps)


class _Block:
    def __init__(self, ops: Ops, c: VisionConfig) -> None:
        self.ops = ops
        self.norm1 = _LayerNorm(c.hidden_size, c.layer_norm_eps)
        self.norm2 = _LayerNorm(c.hidden_size, c.layer_norm_eps)
        self.qkv = _Linear(ops, c.hidden_size, 3 * c.hidden_size)
        self.proj = _Linear(ops, c.hidden_size, c.hidden_size)
        self.fc1 = _Linear(ops, c.hidden_size, c.intermediate_size)
        self.fc2 = _Linear(ops, c.intermediate_size, c.hidden_size)
        self.num_heads = c.num_heads
        self.head_dim = c.head_dim

    def params(self, p: str) -> dict[str, Param]:
        out: dict[str, Param] = {}
        for name, layer in (("norm1", self.norm1), ("norm2", self.norm2), ("attn.qkv", self.qkv),
                            ("attn.proj", self.proj), ("mlp.fc1", self.fc1), ("mlp.fc2", self.fc2)):
            out[f"{p}{name}.weight"] = layer.weight
            if layer.bias is not None:
                out[f"{p}{name}.bias"] = layer.bias
        return out

    def attention(self, x: Any, cos: Any, sin: Any, cu_seqlens: list[int]) -> Any:
        # x: [N, Dv]; cos/sin: [N, Dh/2]; attention within each frame (rows cu_seqlens[f]:cu_seqlens[f+1])
        out = self.ops.vision_attention(self.qkv(x), cos, sin, cu_seqlens, self.num_heads, self.head_dim**-0.5)
        return self.proj(out)  # out: [N, H*Dh]

    def __call__(self, x: Any, cos: Any, sin: Any, cu_seqlens: list[int]) -> Any:
        x = x + self.attention(self.norm1(x), cos, sin, cu_seqlens)
        h = self.fc1(self.norm2(x))
        h = h * F.sigmoid(1.702 * h)  # quick_gelu
        return x + self.fc2(h)


class VisionTower:
    """Patches ``[N, C*P*P]`` of one image or video -> ``[N, Dv]``."""

    def __init__(self, c: VisionConfig, ops: Ops) -> None:
        self.config = c
        self.patch_embed = _Linear(ops, c.in_channels * c.patch_size**2, c.hidden_size, bias=False)
        self.blocks = [_Block(ops, c) for _ in range(c.depth)]
        self.ln = _LayerNorm(c.hidden_size, c.layer_norm_eps)

    def params(self, p: str) -> dict[str, Param]:
        out = {f"{p}patch_embed.proj.weight": self.patch_embed.weight,
               f"{p}ln.weight": self.ln.weight, f"{p}ln.bias": self.ln.bias}
        for i, block in enumerate(self.blocks):
            out.update(block.params(f"{p}blocks.{i}."))
        return out

    def __call__(self, pixel_values: Any, grid_thw: tuple[int, int, int]) -> Any:
        c = self.config
        t, h, w = grid_thw
        cos_np, sin_np = vision_rotary_cos_sin(grid_thw, c.spatial_merge_size, c.head_dim, c.rope_theta)
        cos, sin = paddle.to_tensor(cos_np), paddle.to_tensor(sin_np)  # [N, Dh/2]: [row angles | column angles]
        cu_seqlens = [f * h * w for f in range(t + 1)]  # a frame per time step
        x = self.patch_embed(pixel_values.astype("float32"))
        for block in self.blocks:
            x = block(x, cos, sin, cu_seqlens)
        return self.ln(x)


class _MergeMLP:
    """fc1 -> GELU (erf) -> fc2 -> LayerNorm."""

    def __init__(self, ops: Ops, in_dim: int, out_dim: int, eps: float) -> None:
        self.fc1 = _Linear(ops, in_dim, out_dim)
        self.fc2 = _Linear(ops, out_dim, out_dim)
        self.ln = _LayerNorm(out_dim, eps)

    def params(self, p: str) -> dict[str, Param]:
        out: dict[str, Param] = {}  # the released checkpoints' nn.Sequential indices: 0 fc1, 1 GELU, 2 fc2, 3 LayerNorm
        layers: tuple[_Linear | _LayerNorm, ...] = (self.fc1, self.fc2, self.ln)
        for key, layer in zip(("0", "2", "3"), layers):
            out[f"{p}{key}.weight"] = layer.weight
            assert layer.bias is not None
            out[f"{p}{key}.bias"] = layer.bias
        return out

    def __call__(self, x: Any) -> Any:
        return self.ln(self.fc2(F.gelu(self.fc1(x))))


class Resampler:
    """``[N, Dv]`` -> ``[N / m^2 / t_m, D]`` tokens for the language model."""

    def __init__(self, c: VisionConfig, text_hidden: int, text_eps: float, ops: Ops) -> None:
        self.merge = c.spatial_merge_size
        self.temporal = c.temporal_merge_size
        spatial = c.hidden_size * self.merge**2
        self.spatial_linear = _MergeMLP(ops, spatial, spatial, c.layer_norm_eps)
        self.temporal_linear = _MergeMLP(ops, spatial * self.temporal, spatial, c.layer_norm_eps)
        self.mlp = _Linear(ops, spatial, text_hidden)
        self.after_norm = Param((text_hidden,), pinned=True)
        self.eps = text_eps

    def params(self, p: str) -> dict[str, Param]:
        out = {f"{p}mlp.weight": self.mlp.weight, f"{p}after_norm.weight": self.after_norm}
        assert self.mlp.bias is not None
        out[f"{p}mlp.bias"] = self.mlp.bias
        out.update(self.spatial_linear.params(f"{p}spatial_linear."))
        out.update(self.temporal_linear.params(f"{p}temporal_linear."))
        return out

    def __call__(self, x: Any, grid_thw: tuple[int, int, int]) -> Any:
        if self.temporal != 2:
            raise ValueError(f"temporal_merge_size {self.temporal} is not supported (ERNIE-4.5-VL uses 2)")
        t, h, w = grid_thw
        x = self.spatial_linear(x.reshape([-1, x.shape[-1] * self.merge**2]))
        per_frame = h * w // self.merge**2
        # frames paired (even | odd); an image's one frame is paired with itself
        pairs = list(zip(range(0, t, 2), range(1 if t > 1 else 0, t, 2)))
        firsts = [x[a * per_frame : (a + 1) * per_frame] for a, _ in pairs]
        seconds = [x[b * per_frame : (b + 1) * per_frame] for _, b in pairs]
        x = paddle.concat([paddle.concat(firsts, axis=0), paddle.concat(seconds, axis=0)], axis=-1)
        x = self.mlp(self.temporal_linear(x))
        variance = (x * x).mean(axis=-1, keepdim=True)
        return x * paddle.rsqrt(variance + self.eps) * self.after_norm.data


def num_tokens(grid_thw: tuple[int, int, int], merge: int, temporal: int = 1) -> int:
    """Language-model tokens of a ``(t, h, w)`` patch grid."""
    return math.prod(grid_thw) // merge**2 // temporal
