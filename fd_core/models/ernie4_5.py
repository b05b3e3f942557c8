"""ERNIE 4.5: the dense (0.3B) and MoE (21B-A3B, 300B-A47B) text models.

Decoder layers of GQA attention with interleaved rotary embedding and a
gated SiLU MLP, RMSNorm before each block; layers from
``moe_layer_start_index`` to ``moe_layer_end_index`` (every
``moe_layer_interval``) replace the MLP by routed experts plus shared
experts. Embeddings may be tied to the LM head.

Weights are held in Paddle's layout (``[in, out]``, fused ``qkv_proj`` and
``up_gate_proj``); ``checkpoint_targets`` says where every tensor of a
PyTorch-named or Paddle-named checkpoint lands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fd_core._paddle import import_paddle
from fd_core.layers.attention import Attention, KVCache
from fd_core.layers.basic import Linear, RMSNorm, embed, tie_lm_head
from fd_core.layers.mlp import GatedMLP, MoE
from fd_core.layers.param import Param
from fd_core.models.base import Target
from fd_core.models.config import ModelConfig
from fd_core.ops.decoder import DecoderEmbedding, DecoderHead, DecoderLayerWeights
from fd_core.ops.kv_dtype import StaticKVScales
from fd_core.ops.rope import rope_cos_sin

if TYPE_CHECKING:
    from fd_core.backends.base import Ops

__all__ = ["Ernie4_5ForCausalLM", "Target"]

paddle = import_paddle()


class DecoderLayer:
    def __init__(self, ops: Ops, config: ModelConfig, index: int) -> None:
        c = config
        self.input_layernorm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(ops, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim)
        self.mlp: GatedMLP | MoE
        if c.is_moe_layer(index):
            self.mlp = MoE(
                ops, c.hidden_size, c.moe_intermediate_size, c.num_experts, c.moe_k,
                c.num_shared_experts, c.moe_norm_min, c.moe_use_correction_bias,
            )
        else:
            self.mlp = GatedMLP(ops, c.hidden_size, c.intermediate_size)
        self.ops = ops
        # a layer runs as part of an Ops.decoder_layers run: a dense layer whole, a MoE layer
        # with its MoE block (DecoderLayerWeights.moe) or, where its MoE runs its own __call__
        # (expert parallelism), as its attention half, the MoE after the run (off: the blocks
        # one by one, as tensor parallelism needs)
        self.fused = True

    def weights(self) -> DecoderLayerWeights:
        """The layer as ``fd_decoder_layers`` takes it: a MoE layer with its
        MoE block, or attention only when the block cannot join a run (built
        per call: a backend keys what it derives by the weights' content, not
        by this object)."""
        attn, mlp = self.self_attn, self.mlp
        up_gate = down = None
        moe = None
        if isinstance(mlp, GatedMLP):
            up_gate, down = mlp.up_gate_proj.weight.data, mlp.down_proj.weight.data
        elif self.runs_whole:
            moe = mlp.layer_weights()
        return DecoderLayerWeights(
            self.input_layernorm.weight.data, self.post_attention_layernorm.weight.data, self.input_layernorm.eps,
            attn.qkv_proj.weight.data, attn.o_proj.weight.data, up_gate, down, attn.num_heads, attn.num_kv_heads,
            attn.head_dim, attn.scale, attn.interleaved_rope, kv_scales=attn.kv_scales, moe=moe,
        )

    @property
    def is_dense(self) -> bool:
        return isinstance(self.mlp, GatedMLP)

    @property
    def runs_whole(self) -> bool:
        """A fused run computes this layer whole: dense, or its MoE block joins
        the run (a plugin takes such runs, ``Ops.fuses_moe_runs``, and the block
        has no ``__call__`` of its own)."""
        return self.is_dense or (self.ops.fuses_moe_runs and isinstance(self.mlp, MoE)
                                 and type(self.mlp).__call__ is MoE.__call__)

    def __call__(self, h: Any, residual: Any | None, cos_sin: Any, meta: Any, cache: KVCache) -> tuple[Any, Any]:
        """``(hidden, residual)`` in and out (``residual`` None in the first
        layer). The model runs its layers in runs (``_plan_runs``); this is one
        layer alone: fused, one ``Ops.decoder_layers`` call (with its MoE
        block, or its attention half and then the MoE); unfused, block by block."""
        if self.fused:
            h, residual = self.ops.decoder_layers([self.weights()], h, residual, cos_sin, meta, [cache.k], [cache.v])
            return (h if self.runs_whole else self.mlp(h)), residual
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm(h, residual)
        h = self.self_attn(x, cos_sin, meta, cache)
        x, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(x), residual


class Ernie4_5ForCausalLM:
    """Dense and MoE ERNIE 4.5 (the MoE layers follow the config)."""

    # storage dtypes its forward takes (16-bit: activations stay fp32, see layers.basic.embed)
    weight_dtypes = ("float32", "bfloat16", "float16")
    # its linear layers take --quantization (quantization.apply.quantize_model): dense
    # layers (qkv, o, dense MLPs, shared experts) the dense method, routed experts the MoE
    # method, the LM head its own method when set; a tied quantized head is built from the
    # embeddings in finish_loading
    quantizable = True
    # speculative MTP (fd_core.spec_decode.mtp) sets it: forward keeps the final-normed
    # hidden states of every position in ``last_hidden`` for the drafter
    keep_hidden = False
    last_hidden: Any = None

    def __init__(self, config: ModelConfig, ops: Ops, max_position: int | None = None) -> None:
        self.config = config
        self.ops = ops
        c = config
        self.embed_tokens = Param((c.vocab_size, c.hidden_size))
        self.layers = [DecoderLayer(ops, c, i) for i in range(c.num_layers)]
        self._runs = self._plan_runs()
        self.norm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.lm_head = Linear(ops, c.hidden_size, c.vocab_size)  # [D, V]
        self.max_position = max_position or c.max_position_embeddings
        self.cos_sin = rope_cos_sin(c.head_dim, self.max_position, c.rope_theta)

    def finish_loading(self) -> None:
        """Called by the loader after every parameter is filled. An offline
        W4A8C8 checkpoint's static KV scales (``kv_cache_static_scales``, set
        by ``fd_core.model_loader.offline``) go to their layers' attention."""
        for i, (k, v) in getattr(self, "kv_cache_static_scales", {}).items():
            self.layers[i].self_attn.kv_scales = StaticKVScales(k.data, v.data, layer=i)
        if not self.config.tie_word_embeddings:
            return
        tie_lm_head(self.lm_head, self.embed_tokens)

    def unfuse_layers(self) -> None:
        """Run every layer on its own, block by block (tensor parallelism puts a
        collective between the blocks, which the fused layer op has no room for)."""
        for layer in self.layers:
            layer.fused = False
        self._runs = self._plan_runs()

    def _plan_runs(self) -> list[tuple[int, int]]:
        """``[start, end)`` layer spans, each one ``Ops.decoder_layers`` call
        (one fused op where the backend has it): consecutive fused layers that
        run whole (dense, or MoE with the block in the run: a MoE model's whole
        stack), and the attention half of a MoE layer whose block runs its own
        ``__call__`` after them (it follows the call); an unfused layer alone.
        Call again after changing a layer's ``fused`` or its MoE block's class."""
        runs: list[tuple[int, int]] = []
        for i, layer in enumerate(self.layers):
            previous = self.layers[i - 1] if i else None
            if runs and layer.fused and previous is not None and previous.fused and previous.runs_whole:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        return runs

    def embed_ids(self, input_ids: Any) -> Any:
        """``input_ids [T]`` -> ``[T, D]`` fp32 rows of the embedding table."""
        return embed(self.embed_tokens.data, input_ids)

    def forward(self, input_ids: Any, meta: Any, caches: list[KVCache], logits_indices: Any) -> Any:
        """``input_ids [T]`` -> logits ``[N, V]`` at rows ``logits_indices [N]`` (None: every row).
        When every row's logits are wanted and a plugin takes the head in a run
        (``Ops.fuses_heads``), the last run of whole layers ends with the final
        norm and the LM head (``DecoderHead``), and where the model is that one
        run and a plugin takes it, starts at the token embedding
        (``DecoderEmbedding``): a decode step is one call."""
        last_start, last_end = self._runs[-1]
        if logits_indices is None and not self.keep_hidden and self.ops.fuses_heads \
                and type(self.lm_head) is Linear and self.layers[last_end - 1].fused \
                and self.layers[last_end - 1].runs_whole:
            # the whole model one run: it starts at the embedding where a plugin takes that too (not
            # when embed_ids is replaced, on the class or the instance: tensor parallelism's is sharded)
            h: Any = DecoderEmbedding(self.embed_tokens.data, input_ids) \
                if last_start == 0 and self.ops.fuses_embeddings \
                and getattr(self.embed_ids, "__func__", None) is Ernie4_5ForCausalLM.embed_ids \
                else self.embed_ids(input_ids)
            residual = None
            for start, end in self._runs[:-1]:
                h, residual = self._run(start, end, h, residual, meta, caches)
            run = range(last_start, last_end)
            head = DecoderHead(self.norm.fp32_weight(), self.norm.eps, self.lm_head.weight.data)
            return self.ops.decoder_layers([self.layers[i].weights() for i in run], h, residual, self.cos_sin, meta,
                                           [caches[i].k for i in run], [caches[i].v for i in run], head)
        h = self.embed_ids(input_ids)  # [T, D] fp32
        residual = None
        for start, end in self._runs:
            h, residual = self._run(start, end, h, residual, meta, caches)
        h, _ = self.norm(h, residual)
        if self.keep_hidden:
            self.last_hidden = h
        if logits_indices is not None and logits_indices.shape[0] == 0:
            return None
        if logits_indices is not None:
            h = paddle.gather(h, logits_indices)
        return self.lm_head(h)

    def decode_steps(self, input_ids: Any, meta: Any, caches: list[KVCache], steps: int, vocab_size: int,
                     sampling: Any = None) -> Any:
        """``steps`` decode steps from ``input_ids [T]`` (a decode-only step) in one backend call, each row's
        token greedy (``sampling`` None) or drawn as ``sampling`` (a ``DecoderSampling``) says: tokens
        ``[steps, T]`` int64, or None where no plugin runs the whole model from the embedding to the head
        (``Ops.decoder_steps``; the engine then runs the steps one by one). Each step's logits are
        ``forward``'s: the same run, the same kernels, as many rows."""
        start, end = self._runs[-1]
        if len(self._runs) != 1 or start != 0 or self.keep_hidden or not self.ops.fuses_embeddings \
                or type(self.lm_head) is not Linear or not self.layers[end - 1].fused \
                or not self.layers[end - 1].runs_whole \
                or getattr(self.embed_ids, "__func__", None) is not Ernie4_5ForCausalLM.embed_ids:
            return None
        run = range(start, end)
        head = DecoderHead(self.norm.fp32_weight(), self.norm.eps, self.lm_head.weight.data)
        return self.ops.decoder_steps(
            [self.layers[i].weights() for i in run], DecoderEmbedding(self.embed_tokens.data, input_ids),
            self.cos_sin, meta, [caches[i].k for i in run], [caches[i].v for i in run], head, steps, vocab_size,
            sampling)

    def _run(self, start: int, end: int, h: Any, residual: Any | None, meta: Any,
             caches: list[KVCache]) -> tuple[Any, Any]:
        """Layers ``[start, end)`` of ``_runs``: one layer alone, or one ``Ops.decoder_layers`` call."""
        if end - start == 1:
            return self.layers[start](h, residual, self.cos_sin, meta, caches[start])
        run = range(start, end)
        h, residual = self.ops.decoder_layers(
            [self.layers[i].weights() for i in run], h, residual, self.cos_sin, meta,
            [caches[i].k for i in run], [caches[i].v for i in run],
        )
        if not self.layers[end - 1].runs_whole:
            h = self.layers[end - 1].mlp(h)  # the run ended with its attention half
        return h, residual

    # ------------------------------------------------------------ loading

    def parameters(self) -> dict[str, Param]:
        """Every parameter the checkpoint must fill, by a readable name."""
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
            if isinstance(mlp, MoE):
                params[p + "gate"] = mlp.gate
                params[p + "experts.up_gate_proj"] = mlp.up_gate_proj
                params[p + "experts.down_proj"] = mlp.down_proj
                if mlp.correction_bias is not None:
                    params[p + "e_score_correction_bias"] = mlp.correction_bias
                if mlp.shared_experts is not None:
                    params[p + "shared_experts.up_gate_proj"] = mlp.shared_experts.up_gate_proj.weight
                    params[p + "shared_experts.down_proj"] = mlp.shared_experts.down_proj.weight
            else:
                params[p + "up_gate_proj"] = mlp.up_gate_proj.weight
                params[p + "down_proj"] = mlp.down_proj.weight
        return params

    def checkpoint_targets(self, naming: str) -> dict[str, list[Target]]:
        """Checkpoint tensor name -> where it lands, for ``naming`` in
        ``{"pytorch", "paddle"}``. Every listed tensor is required."""
        c = self.config
        torch_names = naming == "pytorch"
        root = "model." if torch_names else "ernie."
        out: dict[str, list[Target]] = {}

        def add(name: str, param: Param, shape: tuple[int, ...], index: tuple[Any, ...] = (),
                transpose: bool = False) -> None:
            out.setdefault(name, []).append(Target(param, shape, index, transpose))

        def linear(name: str, param: Param, in_f: int, out_f: int, cols: slice | None = None,
                   expert: int | None = None) -> None:
            # PyTorch stores [out, in]; Paddle stores [in, out].
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
                    width = cols.stop - cols.start
                    linear(f"{p}self_attn.{name}_proj.weight", attn.qkv_proj.weight, c.hidden_size, width, cols)
            else:
                linear(p + "self_attn.qkv_proj.weight", attn.qkv_proj.weight, c.hidden_size, q + 2 * kv)
            linear(p + "self_attn.o_proj.weight", attn.o_proj.weight, q, c.hidden_size)
            mlp = layer.mlp
            if isinstance(mlp, MoE):
                linear(p + "mlp.gate.weight", mlp.gate, c.hidden_size, c.num_experts)
                if mlp.correction_bias is not None:
                    add(p + "mlp.moe_statics.e_score_correction_bias", mlp.correction_bias, (1, c.num_experts))
                for e in range(c.num_experts):
                    gated(f"{p}mlp.experts.{e}.", mlp.up_gate_proj, mlp.down_proj, c.moe_intermediate_size, e)
                if mlp.shared_experts is not None:
                    shared = mlp.shared_experts
                    gated(p + "mlp.shared_experts.", shared.up_gate_proj.weight, shared.down_proj.weight,
                          c.moe_intermediate_size * c.num_shared_experts)
            else:
                gated(p + "mlp.", mlp.up_gate_proj.weight, mlp.down_proj.weight, c.intermediate_size)
        return out
