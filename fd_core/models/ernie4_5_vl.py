"""ERNIE-4.5-VL (28B-A3B, 424B-A47B): ERNIE 4.5 MoE with modality-isolated experts,
3D rotary positions and a vision tower (``fd_core.models.ernie4_5_vl_vision``).

- MoE layers hold text experts and vision experts (each with its own router and
  correction-bias row) plus shared experts; a token goes to its modality's
  experts (image placeholders and the image start/end markers of the prompt are
  vision tokens; everything else, and every generated token, is text), the shared
  experts see every token.
- Rotary pair ``j`` of a head turns by ``pos_a(j) * theta^(-2j/Dh)`` where the axis
  ``a`` is height for even ``j < 2*h_sec``, width for odd ``j < 2*h_sec`` and time
  for the last ``t_sec`` pairs; text tokens have one position on all three axes,
  so a text-only step uses the ordinary rotary table.
- Image features replace the embeddings of the image placeholder tokens.

The runner passes ``mm`` (``fd_core.multimodal.step.MultiModalStep``) for steps that
hold image tokens or requests with 3D positions; it calls ``encode`` once per image.
Weights: PyTorch naming as HF transformers saves ``Ernie4_5_VLMoeForConditionalGeneration``
(baidu/ERNIE-4.5-VL-*-PT: ``model.layers``, ``model.vision_model``,
``model.resampler_model``, experts ``0..E_t-1`` text and ``E_t..`` vision, routers
``mlp.gate.weight`` / ``mlp.gate.weight_1`` as ``[hidden, experts]``, bias ``[2, E]``);
Paddle naming as the -Paddle releases (``ernie.`` prefix, ``[in, out]``, fused
``qkv_proj`` / ``up_gate_proj``, ``vision_model.``, ``ernie.resampler_model.``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.layers.attention import Attention, KVCache
from fd_core.layers.basic import Linear, RMSNorm, embed, tie_lm_head
from fd_core.layers.mlp import GatedMLP, MoE
from fd_core.layers.param import Param
from fd_core.models.base import Target
from fd_core.models.ernie4_5_vl_config import VLModelConfig
from fd_core.models.ernie4_5_vl_vision import Resampler, VisionTower
from fd_core.ops.kv_dtype import StaticKVScales
from fd_core.ops.rope import rope_cos_sin

if TYPE_CHECKING:
    from fd_core.backends.base import Ops

__all__ = ["Ernie4_5_VLForConditionalGeneration"]

paddle = import_paddle()


class VLMoE:
    """Text experts for text tokens, vision experts for vision tokens, shared experts for all."""

    def __init__(self, ops: Ops, c: VLModelConfig) -> None:
        self.text = MoE(ops, c.hidden_size, c.moe_intermediate_size, c.num_experts, c.moe_k, 0,
                        c.moe_norm_min, True)
        self.vision = MoE(ops, c.hidden_size, c.vision_moe_intermediate_size, c.vision_num_experts, c.moe_k, 0,
                          c.moe_norm_min, True)
        self.shared = (GatedMLP(ops, c.hidden_size, c.moe_intermediate_size * c.num_shared_experts)
                       if c.num_shared_experts else None)

    def __call__(self, x: Any, rows: tuple[Any, Any, Any] | None) -> Any:
        """``x [T, D]``; ``rows``: (text rows, vision rows, inverse permutation) or None (all text)."""
        if rows is None:
            out = self.text(x)
        else:
            text_rows, vision_rows, inverse = rows
            parts = [] if text_rows is None else [self.text(paddle.gather(x, text_rows))]
            parts.append(self.vision(paddle.gather(x, vision_rows)))
            out = paddle.gather(paddle.concat(parts, axis=0) if len(parts) > 1 else parts[0], inverse)
        return out + self.shared(x) if self.shared is not None else out


class DecoderLayer:
    def __init__(self, ops: Ops, c: VLModelConfig, index: int) -> None:
        self.input_layernorm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(ops, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim)
        self.mlp: GatedMLP | VLMoE = VLMoE(ops, c) if c.is_moe_layer(index) else \
            GatedMLP(ops, c.hidden_size, c.intermediate_size)

    def __call__(self, h: Any, residual: Any | None, cos_sin: Any, meta: Any, cache: KVCache,
                 rows: tuple[Any, Any, Any] | None) -> tuple[Any, Any]:
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm(h, residual)
        h = self.self_attn(x, cos_sin, meta, cache)
        x, residual = self.post_attention_layernorm(h, residual)
        return (self.mlp(x, rows) if isinstance(self.mlp, VLMoE) else self.mlp(x)), residual


class Ernie4_5_VLForConditionalGeneration:
    """ERNIE-4.5-VL: vision tower + resampler + the modality-split MoE language model."""

    weight_dtypes = ("float32", "bfloat16", "float16")
    # --quantization covers the language model (quantization.apply.quantize_model walks ``layers``:
    # attention and dense/shared MLPs the dense method, text and vision experts the MoE method);
    # the vision tower and the resampler stay float
    quantizable = True
    is_multimodal = True  # the runner builds a MultiModalStep for it (fd_core.multimodal.step)

    def __init__(self, config: VLModelConfig, ops: Ops, max_position: int | None = None) -> None:
        if not isinstance(config, VLModelConfig) or config.vision is None:
            raise ValueError(f"{config.architecture} needs an ERNIE-4.5-VL config (with vision_config)")
        c = self.config = config
        self.ops = ops
        self.embed_tokens = Param((c.vocab_size, c.hidden_size))
        self.layers = [DecoderLayer(ops, c, i) for i in range(c.num_layers)]
        self.norm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.lm_head = Linear(ops, c.hidden_size, c.vocab_size)
        vision = c.vision
        assert vision is not None  # checked above
        self.vision = VisionTower(vision, ops)
        self.resampler = Resampler(vision, c.hidden_size, c.rms_norm_eps, ops)
        self.max_position = max_position or c.max_position_embeddings
        self.cos_sin = rope_cos_sin(c.head_dim, self.max_position, c.rope_theta)
        exponent = np.arange(0, c.head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(c.head_dim)
        self.inv_freq = (np.float32(1.0) / (np.float32(c.rope_theta) ** exponent)).astype(np.float32)
        hw = 2 * c.mrope_section[0]
        pair = np.arange(c.head_dim // 2)
        # rotary pair -> axis of the 3D position it turns by (0 time, 1 height, 2 width)
        self.pair_axis = np.where(pair >= hw, 0, np.where(pair % 2 == 0, 1, 2))

    def finish_loading(self) -> None:
        # an offline W4A8C8 checkpoint's static KV scales (fd_core.model_loader.offline) to their layers
        for i, (k, v) in getattr(self, "kv_cache_static_scales", {}).items():
            self.layers[i].self_attn.kv_scales = StaticKVScales(k.data, v.data, layer=i)
        if self.config.tie_word_embeddings:
            tie_lm_head(self.lm_head, self.embed_tokens)

    # ------------------------------------------------------------ forward

    def unfuse_layers(self) -> None:
        """Tensor parallelism's request: the layers already run one by one."""

    def embed_ids(self, input_ids: Any) -> Any:
        """``input_ids [T]`` -> ``[T, D]`` fp32 rows of the embedding table (tensor
        parallelism replaces it with the vocab-parallel lookup)."""
        return embed(self.embed_tokens.data, input_ids)

    def encode(self, pixel_values: Any, grid_thw: tuple[int, int, int]) -> Any:
        """One image's (or video's) patches ``[N, C*P*P]`` -> its ``[N / m^2 / t_m, D]`` fp32 tokens."""
        with paddle.no_grad():
            return self.resampler(self.vision(paddle.to_tensor(pixel_values), grid_thw), grid_thw)

    def rope_table(self, positions3d: np.ndarray) -> Any:
        """``[T, Dh]`` = concat(cos, sin) of each token's 3D position ``positions3d [T, 3]``."""
        pos = positions3d[:, self.pair_axis].astype(np.float32)  # [T, Dh/2]
        angles = pos * self.inv_freq[None, :]
        return paddle.to_tensor(np.concatenate([np.cos(angles), np.sin(angles)], axis=-1))

    def forward(self, input_ids: Any, meta: Any, caches: list[KVCache], logits_indices: Any, mm: Any = None) -> Any:
        """``input_ids [T]`` -> logits ``[N, V]`` at ``logits_indices`` (None: every row); ``mm``: the
        step's image features, 3D positions and vision rows (None: a text-only step)."""
        h = self.embed_ids(input_ids)  # [T, D] fp32
        cos_sin, rows = self.cos_sin, None
        if mm is not None:
            if mm.embed_rows is not None:
                h = paddle.scatter(h, mm.embed_rows, mm.embeds.astype(h.dtype), overwrite=True)
            if mm.positions3d is not None:  # one table row per token, picked by positions 0..T-1
                cos_sin = self.rope_table(mm.positions3d)
                meta = replace(meta, positions=paddle.arange(h.shape[0], dtype="int64"))
            rows = mm.moe_rows
        residual = None
        for layer, cache in zip(self.layers, caches):
            h, residual = layer(h, residual, cos_sin, meta, cache, rows)
        h, _ = self.norm(h, residual)
        if logits_indices is not None and logits_indices.shape[0] == 0:
            return None
        if logits_indices is not None:
            h = paddle.gather(h, logits_indices)
        return self.lm_head(h)

    # ------------------------------------------------------------ loading

    def parameters(self) -> dict[str, Param]:
        params = {"embed_tokens": self.embed_tokens, "norm": self.norm.weight}
        if not self.config.tie_word_embeddings:
            params["lm_head"] = self.lm_head.weight
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}."
            params[p + "input_layernorm"] = layer.input_layernorm.weight
            params[p + "post_attention_layernorm"] = layer.post_attention_layernorm.weight
            params[p + "qkv_proj"] = layer.self_attn.qkv_proj.weight
            params[p + "o_proj"] = layer.self_attn.o_proj.weight
            mlp = layer.mlp
            if isinstance(mlp, VLMoE):
                for kind, moe in (("text", mlp.text), ("vision", mlp.vision)):
                    params[f"{p}{kind}.gate"] = moe.gate
                    assert moe.correction_bias is not None
                    params[f"{p}{kind}.e_score_correction_bias"] = moe.correction_bias
                    params[f"{p}{kind}.up_gate_proj"] = moe.up_gate_proj
                    params[f"{p}{kind}.down_proj"] = moe.down_proj
                if mlp.shared is not None:
                    params[p + "shared_experts.up_gate_proj"] = mlp.shared.up_gate_proj.weight
                    params[p + "shared_experts.down_proj"] = mlp.shared.down_proj.weight
            else:
                params[p + "up_gate_proj"] = mlp.up_gate_proj.weight
                params[p + "down_proj"] = mlp.down_proj.weight
        params.update(self.vision.params("vision_model."))
        params.update(self.resampler.params("resampler_model."))
        return params

    def checkpoint_targets(self, naming: str) -> dict[str, list[Target]]:
        """Checkpoint tensor name -> where it lands (``naming``: "pytorch" or "paddle")."""
        c = self.config
        torch_names = naming == "pytorch"
        root = "model." if torch_names else "ernie."
        out: dict[str, list[Target]] = {}

        def add(name: str, param: Param, shape: tuple[int, ...], index: tuple[Any, ...] = (),
                transpose: bool = False, source_index: tuple[Any, ...] = ()) -> None:
            out.setdefault(name, []).append(Target(param, shape, index, transpose, source_index))

        def linear(name: str, param: Param, in_f: int, out_f: int, cols: slice | None = None,
                   expert: int | None = None) -> None:
            shape = (out_f, in_f) if torch_names else (in_f, out_f)
            index: tuple[Any, ...] = () if expert is None else (expert,)
            if cols is not None:
                index = (*index, slice(None), cols)
            add(name, param, shape, index, transpose=torch_names)

        def gated(prefix: str, up_gate: Param, down: Param, size: int, expert: int | None = None) -> None:
            if torch_names:
                linear(prefix + "gate_proj.weight", up_gate, c.hidden_size, size, slice(0, size), expert)
                linear(prefix + "up_proj.weight", up_gate, c.hidden_size, size, slice(size, 2 * size), expert)
            else:
                linear(prefix + "up_gate_proj.weight", up_gate, c.hidden_size, 2 * size, None, expert)
            linear(prefix + "down_proj.weight", down, size, c.hidden_size, None, expert)

        add(root + "embed_tokens.weight", self.embed_tokens, (c.vocab_size, c.hidden_size))
        add(root + "norm.weight", self.norm.weight, (c.hidden_size,))
        if not c.tie_word_embeddings:
            linear("lm_head.weight", self.lm_head.weight, c.hidden_size, c.vocab_size)
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        for i, layer in enumerate(self.layers):
            p = f"{root}layers.{i}."
            add(p + "input_layernorm.weight", layer.input_layernorm.weight, (c.hidden_size,))
            add(p + "post_attention_layernorm.weight", layer.post_attention_layernorm.weight, (c.hidden_size,))
            attn = layer.self_attn
            if torch_names:
                for name, cols in (("q", slice(0, q)), ("k", slice(q, q + kv)), ("v", slice(q + kv, q + 2 * kv))):
                    linear(f"{p}self_attn.{name}_proj.weight", attn.qkv_proj.weight, c.hidden_size,
                           cols.stop - cols.start, cols)
            else:
                linear(p + "self_attn.qkv_proj.weight", attn.qkv_proj.weight, c.hidden_size, q + 2 * kv)
            linear(p + "self_attn.o_proj.weight", attn.o_proj.weight, q, c.hidden_size)
            mlp = layer.mlp
            if not isinstance(mlp, VLMoE):
                gated(p + "mlp.", mlp.up_gate_proj.weight, mlp.down_proj.weight, c.intermediate_size)
                continue
            # routers are [hidden, experts] in both releases; the bias holds [text; vision] rows
            add(p + "mlp.gate.weight", mlp.text.gate, (c.hidden_size, c.num_experts))
            add(p + "mlp.gate.weight_1", mlp.vision.gate, (c.hidden_size, c.vision_num_experts))
            bias_shape = (2, c.num_experts)
            assert mlp.text.correction_bias is not None and mlp.vision.correction_bias is not None
            add(p + "mlp.moe_statics.e_score_correction_bias", mlp.text.correction_bias, bias_shape,
                source_index=(0,))
            add(p + "mlp.moe_statics.e_score_correction_bias", mlp.vision.correction_bias, bias_shape,
                source_index=(1,))
            for e in range(c.num_experts):
                gated(f"{p}mlp.experts.{e}.", mlp.text.up_gate_proj, mlp.text.down_proj, c.moe_intermediate_size, e)
            for e in range(c.vision_num_experts):
                gated(f"{p}mlp.experts.{c.num_experts + e}.", mlp.vision.up_gate_proj, mlp.vision.down_proj,
                      c.vision_moe_intermediate_size, e)
            if mlp.shared is not None:
                gated(p + "mlp.shared_experts.", mlp.shared.up_gate_proj.weight, mlp.shared.down_proj.weight,
                      c.moe_intermediate_size * c.num_shared_experts)
        vision_prefix = "model.vision_model." if torch_names else "vision_model."
        resampler_prefix = "model.resampler_model." if torch_names else "ernie.resampler_model."
        for prefix, params in ((vision_prefix, self.vision.params("")), (resampler_prefix, self.resampler.params(""))):
            for name, param in params.items():
                if len(param.shape) == 2:  # a linear weight: [out, in] in PyTorch naming
                    add(prefix + name, param, param.shape[::-1] if torch_names else param.shape,
                        transpose=torch_names)
                else:
                    add(prefix + name, param, param.shape)
        return out
