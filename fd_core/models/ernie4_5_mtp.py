"""ERNIE 4.5's multi-token-prediction (MTP) block: FastDeploy's ``ernie4_5_mtp``.

One block of the released checkpoints (``num_nextn_predict_layers: 1``), tensors
``{ernie.|model.}mtp_emb_norm.0``, ``mtp_hidden_norm.0``, ``mtp_linear_proj.0``
and ``mtp_block.0.*`` (one ERNIE decoder layer; its FFN dense or routed experts,
whichever the checkpoint holds). The token embedding, the final norm and the LM
head are the target model's (shared, not stored again). Per position t, with the
target's hidden state ``h_t`` (after its final norm) and the next token ``x_{t+1}``::

    g = eh_proj(concat([enorm(embed(x_{t+1})), hnorm(h_t)]))   # [T, 2H] -> [T, H]
    g = mtp_block(g)                 # a decoder layer with its own KV cache layer
    g = norm(g + residual)           # the target's final RMSNorm
    logits_{t+2} = lm_head(g)

``g`` (after the final norm) is also the hidden state the next autoregressive
draft step takes in place of ``h``. Built and loaded by
``fd_core.spec_decode.mtp``; runs through the backend's ops like the target.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from fd_core._paddle import import_paddle
from fd_core.layers.attention import KVCache
from fd_core.layers.basic import Linear, RMSNorm, embed
from fd_core.layers.mlp import GatedMLP, MoE
from fd_core.layers.param import Param
from fd_core.models.base import Target
from fd_core.models.config import ModelConfig
from fd_core.models.ernie4_5 import DecoderLayer, Ernie4_5ForCausalLM

if TYPE_CHECKING:
    from fd_core.backends.base import Ops

__all__ = ["MTP_PATTERN", "Ernie4_5_MTP"]

paddle = import_paddle()
MTP_PATTERN = r"^(ernie\.|model\.)mtp_"  # the MTP tensors of a checkpoint, both namings


class Ernie4_5_MTP:
    """The MTP block over a loaded ``Ernie4_5ForCausalLM`` (``target``), whose
    embedding, final norm and LM head it shares. ``moe``: the block's FFN is
    routed experts (as the checkpoint's ``mtp_block.0.mlp.experts.*`` say)."""

    def __init__(self, target: Ernie4_5ForCausalLM, moe: bool, index: int = 0) -> None:
        c: ModelConfig = target.config
        ops: Ops = target.ops
        self.target = target
        self.config = c
        self.index = index
        self.enorm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.hnorm = RMSNorm(ops, c.hidden_size, c.rms_norm_eps)
        self.eh_proj = Linear(ops, 2 * c.hidden_size, c.hidden_size)  # [2H, H]: embedding half first
        self.layer = DecoderLayer(ops, c, 0)
        if moe != isinstance(self.layer.mlp, MoE):
            self.layer.mlp = MoE(
                ops, c.hidden_size, c.moe_intermediate_size, c.num_experts, c.moe_k,
                c.num_shared_experts, c.moe_norm_min, c.moe_use_correction_bias,
            ) if moe else GatedMLP(ops, c.hidden_size, c.intermediate_size)

    def parameters(self) -> dict[str, Param]:
        """The block's own parameters (not the shared ones), by a readable name."""
        params = {"mtp.enorm": self.enorm.weight, "mtp.hnorm": self.hnorm.weight, "mtp.eh_proj": self.eh_proj.weight}
        shim = self._shim()
        for name, param in Ernie4_5ForCausalLM.parameters(shim).items():  # type: ignore[arg-type]
            if name.startswith("layers.0."):
                params["mtp.block." + name[len("layers.0."):]] = param
        return params

    def checkpoint_targets(self, naming: str) -> dict[str, list[Target]]:
        """Checkpoint tensor name -> where it lands (``naming``: pytorch or paddle);
        the decoder layer's names are the target's layer names under ``mtp_block.{i}``."""
        c, i = self.config, self.index
        torch_names = naming == "pytorch"
        root = "model." if torch_names else "ernie."
        h = c.hidden_size
        proj_shape = (h, 2 * h) if torch_names else (2 * h, h)
        out: dict[str, list[Target]] = {
            f"{root}mtp_emb_norm.{i}.weight": [Target(self.enorm.weight, (h,))],
            f"{root}mtp_hidden_norm.{i}.weight": [Target(self.hnorm.weight, (h,))],
            f"{root}mtp_linear_proj.{i}.weight": [Target(self.eh_proj.weight, proj_shape, (), torch_names)],
        }
        layer_prefix = f"{root}layers.0."
        for name, targets in Ernie4_5ForCausalLM.checkpoint_targets(self._shim(), naming).items():  # type: ignore[arg-type]
            if name.startswith(layer_prefix):
                out[f"{root}mtp_block.{i}." + name[len(layer_prefix):]] = targets
        return out

    def _shim(self) -> Any:
        """The target class's naming functions over this block's one layer."""
        return SimpleNamespace(
            config=dataclasses.replace(self.config, tie_word_embeddings=True),
            layers=[self.layer], embed_tokens=Param((1,)), norm=SimpleNamespace(weight=Param((1,))),
            lm_head=SimpleNamespace(weight=Param((1,))),
        )

    def forward(self, hidden: Any, next_ids: Any, meta: Any, cache: KVCache, logits_indices: Any | None
                ) -> tuple[Any, Any]:
        """``hidden [T, H]`` (the target's, after its final norm, or this block's
        previous output), ``next_ids [T]`` -> (logits ``[N, V]`` at rows
        ``logits_indices`` (None: every row), this block's normed output ``[T, H]``).
        ``meta``: the attention metadata of the T positions (the target's positions
        of ``hidden``); ``cache``: this block's KV layer."""
        t = self.target
        e = self.enorm(embed(t.embed_tokens.data, next_ids))
        z = paddle.concat([e, self.hnorm(hidden)], axis=-1)
        g = self.eh_proj(z)
        g, residual = self.layer(g, None, t.cos_sin, meta, cache)
        g, _ = t.norm(g, residual)
        rows = g if logits_indices is None else paddle.gather(g, logits_indices)
        return t.lm_head(rows), g
