"""Expert parallelism (``--enable-expert-parallel``) as a transform composed with TP.

FastDeploy's meaning: with ``--tensor-parallel-size N --enable-expert-parallel``
the MoE layers' routed experts are partitioned over the N ranks, whole (rank
``r`` holds experts ``[r*E/N, (r+1)*E/N)``, not a slice of every expert), while
attention, the dense MLPs, the shared experts, the embedding and the LM head
stay tensor-parallel (``TensorParallel``, which this class extends: only
``_moe`` and the loading of the expert tensors differ).

Dispatch and combine. After TP attention every rank holds every token's hidden
state (the o_proj all-reduce made them equal), so the router runs on every rank
(its ``[D, E]`` weight and correction bias are replicated, small) and each rank
already has the rows its experts need: dispatch moves nothing. Each rank runs
its own experts on the (token, k) pairs routed to them (gathered rows, one
``Ops.moe_experts`` call with local expert ids), adds them, weighted, into a
``[T, D]`` partial sum together with its shard of the shared experts, and the
one all-reduce a TP MoE layer already does combines the ranks' partials. An
all-to-all dispatch would only pay off where ranks hold different tokens (data-
parallel attention); here it would add two collectives carrying ``top_k`` times
the rows of that one all-reduce. The numerics are the single-device layer's up
to the order of the fp32 sums (per rank, then across ranks).

Loading: each rank's expert parameters are ``[E/N, ...]``; ``shard_targets``
keeps only the checkpoint tensors of the rank's experts (the others are never
read) and renumbers them locally. Quantization then quantizes the local experts
only. Dense models and expert counts that N does not divide are refused by name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.layers.mlp import MoE
from fd_core.models.base import Target
from fd_core.parallel.config import ParallelConfig, check_expert_parallel
from fd_core.parallel.tensor_parallel import TensorParallel, _even

__all__ = ["ExpertParallel", "check_expert_parallel", "parallel_transform"]

paddle = import_paddle()


def parallel_transform(config: ParallelConfig) -> TensorParallel:
    """The transform rank ``config.rank`` applies to its model: TP, or TP with EP."""
    cls = ExpertParallel if config.enable_expert_parallel else TensorParallel
    return cls(config.rank, config.world_size)


class ExpertParallel(TensorParallel):
    """TP for everything but the routed experts, which are partitioned (module doc)."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__(rank, world)
        self.first_expert = 0  # this rank's experts: [first_expert, first_expert + local_experts)
        self.local_experts = 0

    def apply(self, model: Any) -> None:
        check_expert_parallel(model.config, self.world)
        super().apply(model)

    def _moe(self, mlp: MoE, names: dict[int, str]) -> None:
        e = mlp.up_gate_proj.shape[0]
        self.first_expert, hi = _even(0, e, self.rank, self.world)
        self.local_experts = hi - self.first_expert
        for param in (mlp.up_gate_proj, mlp.down_proj):
            param.shape = (self.local_experts, *param.shape[1:])
        if mlp.shared_experts is not None:
            self._gated(mlp.shared_experts, names)
        mlp.__class__ = _ExpertParallelMoE
        mlp._ep = self  # type: ignore[attr-defined]

    def shard_targets(self, model: Any, targets: dict[str, list[Target]]) -> dict[str, list[Target]]:
        """TP's targets, with each routed expert's tensors kept only on the rank that
        holds the expert (index renumbered from 0); other ranks map them to no target."""
        out = super().shard_targets(model, targets)
        lo, hi = self.first_expert, self.first_expert + self.local_experts
        # the layers' current parameters: quantization replaced the ones ``apply`` shrank
        experts = {id(p) for layer in model.layers if isinstance(layer.mlp, _ExpertParallelMoE)
                   for p in (layer.mlp.up_gate_proj, layer.mlp.down_proj)}
        for name, ts in out.items():
            kept = []
            for t in ts:
                if id(t.param) not in experts:
                    kept.append(t)
                elif lo <= t.index[0] < hi:
                    kept.append(replace(t, index=(t.index[0] - lo, *t.index[1:])))
            out[name] = kept
        return out


class _ExpertParallelMoE(MoE):
    """A MoE layer whose routed experts are this rank's share; output all-reduced."""

    _ep: ExpertParallel

    def __call__(self, x: Any) -> Any:
        # x: [T, D], equal on every rank
        ep, ops = self._ep, self.ops
        bias = self.correction_bias.data if self.correction_bias is not None else None
        router_logits = ops.linear(x.astype("float32"), self.gate.data)  # [T, E]
        weights, ids = ops.moe_select_experts(router_logits, self.top_k, bias, True, self.norm_min)  # [T, k]
        # the rank's partial sum, in fp32 whatever the activations' dtype: each rank's share is
        # rounded once, after the all-reduce, as one device rounds the whole layer's sum once
        out = (self.shared_experts(x).astype("float32") if self.shared_experts is not None
               else paddle.zeros(x.shape, dtype="float32"))
        local = ids.numpy() - ep.first_expert  # [T, k]
        token, slot = np.nonzero((local >= 0) & (local < ep.local_experts))  # the pairs routed here
        if token.size:
            quant = self.expert_quant
            up_gate, down = (None, None) if quant is not None else (self.up_gate_proj.data, self.down_proj.data)
            pick = paddle.to_tensor(token.astype(np.int64))
            rows = paddle.gather(x, pick)  # [P, D]
            pair_w = paddle.to_tensor(weights.numpy()[token, slot].reshape(-1, 1))  # [P, 1]
            pair_id = paddle.to_tensor(local[token, slot].reshape(-1, 1).astype(np.int64))  # [P, 1]
            routed = ops.moe_experts(rows, pair_w, pair_id, up_gate, down, quant)  # [P, D], weighted
            out = paddle.index_add(out, pick, 0, routed.astype("float32"))
        return ep._communicator().all_reduce(out).astype(x.dtype)
