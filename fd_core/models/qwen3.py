"""Qwen3 (dense): ``Qwen3ForCausalLM``, as HF transformers and FastDeploy define it.

Pre-norm decoder layers: RMSNorm, GQA self-attention whose q and k get a
per-head RMSNorm over ``head_dim`` before a neox-style (rotate-half) rotary
embedding, RMSNorm, gated SiLU MLP; a final RMSNorm and an LM head, tied to
the embeddings when ``tie_word_embeddings``. ``head_dim`` is explicit in the
config and need not equal ``hidden_size / num_attention_heads``.

Weights are held in Paddle's layout (``[in, out]``, fused ``qkv_proj`` and
``up_gate_proj``); ``checkpoint_targets`` maps HF's PyTorch names onto them.
Its layers are ``fd_core.ops.decoder.DecoderLayerWeights`` with q/k norms:
the model runs them through ``Ops.decoder_layers``, so a backend whose fused
layer kernel takes q/k norms runs them fused; the others compose the ops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fd_core._paddle import import_paddle
from fd_core.layers.attention import KVCache
from fd_core.layers.basic import Linear, RMSNorm, embed, tie_lm_head
from fd_core.layers.mlp import GatedMLP
from fd_core.layers.param import Param
from fd_core.models.base import Target
from fd_core.models.config import ModelConfig
from fd_core.ops.decoder import DecoderLayerWeights
from fd_core.ops.rope import rope_cos_sin

if TYPE_CHECKING:
    from fd_core.backends.base import Ops

__all__ = ["Qwen3ForCausalLM"]

paddle = import_paddle()


class Qwen3Attention:
    """``qkv_proj [D, (H + 2 Hkv) Dh]`` (columns ``[q | k | v]``), q/k norms
    ``[Dh]`` shared by all heads, neox rotary, paged attention, ``o_proj``."""

    def __init__(self, ops: Ops, config: ModelConfig) -> None:
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.scale = c.head_dim**-0.5
        self.qkv_proj = Linear(ops, c.hidden_size, self.q_size + 2 * self.kv_size)
        self.o_proj = Linear(ops, self.q_size, c.hidden_size)
        self.q_norm = RMSNorm(ops, c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(ops, c.head_dim, c.rms_norm_eps)


class Qwen3DecoderLayer:
    def __init__(self, ops: Ops, config: ModelConfig) -> None:
        c = config
        self.input_layernorm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.self_attn = Qwen3Attention(ops, c)
        self.post_attention_layernorm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.mlp = GatedMLP(ops, c.hidden_size, c.intermediate_size)

    def weights(self) -> DecoderLayerWeights:
        """The layer as ``Ops.decoder_layers`` takes it: pre-norm, q/k norms
        sharing the layer's eps, half-split (neox) rotary."""
        attn = self.self_attn
        return DecoderLayerWeights(
            self.input_layernorm.weight.data, self.post_attention_layernorm.weight.data, self.input_layernorm.eps,
            attn.qkv_proj.weight.data, attn.o_proj.weight.data, self.mlp.up_gate_proj.weight.data,
            self.mlp.down_proj.weight.data, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scale,
            interleaved_rope=False, q_norm=attn.q_norm.weight.data, k_norm=attn.k_norm.weight.data,
        )


class Qwen3ForCausalLM:
    # storage dtypes its forward takes (16-bit: widened per op, activations stay fp32)
    weight_dtypes = ("float32", "bfloat16", "float16")
    # --quantization applies (quantization.apply.quantize_model): qkv, o and MLP linears take the
    # dense method, the LM head its own method when set
    quantizable = True

    def __init__(self, config: ModelConfig, ops: Ops, max_position: int | None = None) -> None:
        c = config
        self.config = config
        self.ops = ops
        self.embed_tokens = Param((c.vocab_size, c.hidden_size))
        self.layers = [Qwen3DecoderLayer(ops, c) for _ in range(c.num_layers)]
        self.norm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.lm_head = Linear(ops, c.hidden_size, c.vocab_size)  # [D, V]
        self.max_position = max_position or c.max_position_embeddings
        self.cos_sin = rope_cos_sin(c.head_dim, self.max_position, c.rope_theta)  # [P, Dh]

    def forward(self, input_ids: Any, meta: Any, caches: list[KVCache], logits_indices: Any) -> Any:
        """``input_ids [T]`` -> logits ``[N, V]`` at rows ``logits_indices [N]`` (None: every row)."""
        h = embed(self.embed_tokens.data, input_ids)  # [T, D] fp32 whatever the table's dtype
        h, residual = self.ops.decoder_layers(
            [layer.weights() for layer in self.layers], h, None, self.cos_sin, meta,
            [cache.k for cache in caches], [cache.v for cache in caches],
        )
        h, _ = self.norm(h, residual)
        if logits_indices is not None and logits_indices.shape[0] == 0:
            return None
        if logits_indices is not None:
            h = paddle.gather(h, logits_indices)
        return self.lm_head(h)

    # ------------------------------------------------------------ loading

    def finish_loading(self) -> None:
        """Called by the loader after every parameter is filled."""
        if self.config.tie_word_embeddings:
            tie_lm_head(self.lm_head, self.embed_tokens)

    def parameters(self) -> dict[str, Param]:
        """Every parameter the checkpoint must fill, by a readable name."""
        params = {"embed_tokens": self.embed_tokens, "norm": self.norm.weight}
        if not self.config.tie_word_embeddings:
            params["lm_head"] = self.lm_head.weight
        for i, layer in enumerate(self.layers):
            p, attn = f"layers.{i}.", layer.self_attn
            params[p + "input_layernorm"] = layer.input_layernorm.weight
            params[p + "post_attention_layernorm"] = layer.post_attention_layernorm.weight
            params[p + "qkv_proj"] = attn.qkv_proj.weight
            params[p + "q_norm"] = attn.q_norm.weight
            params[p + "k_norm"] = attn.k_norm.weight
            params[p + "o_proj"] = attn.o_proj.weight
            params[p + "up_gate_proj"] = layer.mlp.up_gate_proj.weight
            params[p + "down_proj"] = layer.mlp.down_proj.weight
        return params

    def checkpoint_targets(self, naming: str) -> dict[str, list[Target]]:
        """HF tensor name -> where it lands. Qwen3 checkpoints use the PyTorch
        naming (``model.``, linear weights ``[out, in]``), transposed on load."""
        if naming != "pytorch":
            raise ValueError(
                f"a Qwen3 checkpoint must use HF's PyTorch naming (tensors under 'model.'), found {naming!r} naming"
            )
        c = self.config
        out: dict[str, list[Target]] = {}

        def add(name: str, param: Param, shape: tuple[int, ...]) -> None:
            out.setdefault(name, []).append(Target(param, shape))

        def linear(name: str, param: Param, in_f: int, out_f: int, cols: slice | None = None) -> None:
            index: tuple[Any, ...] = () if cols is None else (slice(None), cols)
            out.setdefault(name, []).append(Target(param, (out_f, in_f), index, transpose=True))

        d, inter = c.hidden_size, c.intermediate_size
        add("model.embed_tokens.weight", self.embed_tokens, (c.vocab_size, d))
        add("model.norm.weight", self.norm.weight, (d,))
        if not c.tie_word_embeddings:
            linear("lm_head.weight", self.lm_head.weight, d, c.vocab_size)
        for i, layer in enumerate(self.layers):
            p, attn = f"model.layers.{i}.", layer.self_attn
            q, kv = attn.q_size, attn.kv_size
            add(p + "input_layernorm.weight", layer.input_layernorm.weight, (d,))
            add(p + "post_attention_layernorm.weight", layer.post_attention_layernorm.weight, (d,))
            for name, cols in (("q", slice(0, q)), ("k", slice(q, q + kv)), ("v", slice(q + kv, q + 2 * kv))):
                linear(f"{p}self_attn.{name}_proj.weight", attn.qkv_proj.weight, d, cols.stop - cols.start, cols)
            add(p + "self_attn.q_norm.weight", attn.q_norm.weight, (c.head_dim,))
            add(p + "self_attn.k_norm.weight", attn.k_norm.weight, (c.head_dim,))
            linear(p + "self_attn.o_proj.weight", attn.o_proj.weight, q, d)
            up_gate = layer.mlp.up_gate_proj.weight
            linear(p + "mlp.gate_proj.weight", up_gate, d, inter, slice(0, inter))
            linear(p + "mlp.up_proj.weight", up_gate, d, inter, slice(inter, 2 * inter))
            linear(p + "mlp.down_proj.weight", layer.mlp.down_proj.weight, inter, d)
        return out
