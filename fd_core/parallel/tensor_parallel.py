"""Tensor parallelism as a transform of a finished single-device model (gpt-fast style).

``TensorParallel(rank, world).apply(model)`` runs on a model that is built but
not loaded (its ``Param``s hold no memory yet), before quantization:

- column-parallel: ``qkv_proj`` keeps the rank's query heads and its KV heads
  (the KV heads replicated when there are fewer than ranks), ``up_gate_proj``
  the rank's slice of both the gate and the up half (dense MLPs, shared
  experts, and every routed expert's intermediate dim: TP for MoE without EP);
- row-parallel, each followed by one all-reduce: ``o_proj`` (after attention),
  ``down_proj`` (after a dense MLP), and a MoE layer's output once, after its
  routed and shared experts are combined;
- vocab-parallel: the embedding keeps the rank's rows (masked lookup, then an
  all-reduce), the LM head the rank's vocab columns (logits all-gathered to the
  full vocabulary; a tied head is the local embedding rows, transposed);
- attention runs on the local heads and the rank's own KV cache shard.

Each split parameter's shape becomes the local one, so quantization
(``fd_core.quantization.apply``) quantizes only the rank's slice, and
``shard_targets`` rewrites the checkpoint targets so the loader reads only the
rank's rows / columns of each tensor (``Target.source_index``): no rank ever
holds the full model (an offline-quantized checkpoint's stored codes and scales
are cut to the same slices: ``fd_core.model_loader.offline``). A quantized
row-parallel parameter takes the whole column's scales
(``QuantizedParam.amax_reduce``: the per-channel maxima all-gathered while
loading, so the communicator is bound before the load), and a w8a8 row-parallel
linear quantizes its activations with the token's maximum over every rank
(``_RowParallelOps``): quantized TP computes what one device does. The
collectives go through the communicator bound with
``bind`` (``Ops.communicator``, so a backend answers with its own kernels).
The fused decoder-layer op has no all-reduce inside: the model's layers run
unfused (``model.unfuse_layers()``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.layers.basic import Linear, embed
from fd_core.layers.mlp import GatedMLP, MoE
from fd_core.models.base import Target
from fd_core.ops.linear import QuantizedWeight
from fd_core.parallel.config import check_tensor_parallel, local_kv_heads

__all__ = ["Split", "TensorParallel"]

paddle = import_paddle()

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Split:
    """How a rank keeps one parameter: along ``axis`` (of the full ``[in, out]`` /
    ``[E, in, out]`` shape) the ranges ``kept`` of the full axis, in order; the
    local axis is their concatenation."""

    axis: int
    kept: Ranges

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.kept)


def _even(start: int, size: int, rank: int, world: int) -> tuple[int, int]:
    part = size // world
    return start + rank * part, start + (rank + 1) * part


class TensorParallel:
    """The TP transform for rank ``rank`` of ``world`` (see the module doc)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank = rank
        self.world = world
        self.comm: Any = None  # bound after the rendezvous (``bind``)
        self.splits: dict[str, Split] = {}  # parameter name (model.parameters()) -> its split

    def bind(self, comm: Any) -> None:
        """The communicator the collectives go through (``Ops.communicator``)."""
        self.comm = comm

    def _communicator(self) -> Any:
        if self.comm is None:
            raise RuntimeError("tensor parallel model run before its communicator was bound")
        return self.comm

    # ------------------------------------------------------------ transform

    def apply(self, model: Any) -> None:
        """Shrink ``model``'s split parameters to this rank's shapes and wrap its
        row-parallel blocks, embedding and LM head with their collectives."""
        c = model.config
        if not hasattr(model, "unfuse_layers") or not hasattr(model, "embed_ids"):
            raise ValueError(f"--tensor-parallel-size {self.world}: {c.architecture} does not support tensor "
                             "parallelism yet (ERNIE 4.5 dense and MoE do)")
        check_tensor_parallel(c, self.world)
        r, n = self.rank, self.world
        model.unfuse_layers()
        names = {id(p): name for name, p in model.parameters().items()}
        for layer in model.layers:
            self._attention(layer.self_attn, names, c)
            mlp = layer.mlp
            if isinstance(mlp, MoE):
                self._moe(mlp, names)
            elif hasattr(mlp, "text") and hasattr(mlp, "vision"):  # ERNIE-4.5-VL's modality-split MoE
                self._modality_moe(mlp, names)
            else:
                self._gated(mlp, names)
                _reduce_output(mlp, self)
        vocab = c.vocab_size
        v0, v1 = _even(0, vocab, r, n)
        self._shrink(model.embed_tokens, names, Split(0, ((v0, v1),)))
        model.embed_ids = _VocabParallelEmbedding(model.embed_tokens, v0, v1, self)
        self._linear(model.lm_head, names, Split(1, ((v0, v1),)))
        model.lm_head.__class__ = _gathered(type(model.lm_head))
        model.lm_head._tp = self

    def _moe(self, mlp: MoE, names: dict[int, str]) -> None:
        """Every routed expert's intermediate dim split (TP for MoE without EP;
        ``fd_core.parallel.expert_parallel`` overrides this), shared experts as a
        dense MLP, one all-reduce of the layer's output."""
        self._split_experts(mlp, names)
        if mlp.shared_experts is not None:
            self._gated(mlp.shared_experts, names)
        _reduce_output(mlp, self)

    def _modality_moe(self, mlp: Any, names: dict[int, str]) -> None:
        """ERNIE-4.5-VL's MoE (``.text`` and ``.vision`` MoEs, ``.shared`` a dense MLP
        for every token): both expert sets split as a MoE's, the shared experts as a
        dense MLP, one all-reduce of the whole layer's output (the text and vision
        parts are partial sums like the shared one). The routers stay whole."""
        self._split_experts(mlp.text, names)
        self._split_experts(mlp.vision, names)
        if mlp.shared is not None:
            self._gated(mlp.shared, names)
        _reduce_output(mlp, self)

    def _split_experts(self, moe: MoE, names: dict[int, str]) -> None:
        """The routed experts' intermediate dim: this rank's slice of up and gate, and of down's input."""
        e, d = moe.up_gate_proj.shape[0], moe.up_gate_proj.shape[1]
        inter = moe.down_proj.shape[1]
        lo, hi = _even(0, inter, self.rank, self.world)
        self._shrink(moe.up_gate_proj, names, Split(2, ((lo, hi), (inter + lo, inter + hi))))
        self._shrink(moe.down_proj, names, Split(1, ((lo, hi),)))
        assert moe.up_gate_proj.shape[:2] == (e, d)

    def kv_channels(self, c: Any) -> tuple[int, int]:
        """This rank's KV channels ``[lo, hi)`` of the ``num_kv_heads * head_dim`` a K (or V)
        projection has (its KV heads; one replicated head when there are fewer than ranks)."""
        kv = local_kv_heads(c.num_kv_heads, self.world)
        first_kv = self.rank * c.num_kv_heads // self.world if c.num_kv_heads < self.world else self.rank * kv
        return first_kv * c.head_dim, (first_kv + kv) * c.head_dim

    def _attention(self, attn: Any, names: dict[int, str], c: Any) -> None:
        r, n, dh = self.rank, self.world, c.head_dim
        heads, kv = c.num_heads // n, local_kv_heads(c.num_kv_heads, n)
        q, kv_full = c.num_heads * dh, c.num_kv_heads * dh
        qs = _even(0, q, r, n)
        k0, k1 = self.kv_channels(c)
        ks = (q + k0, q + k1)
        vs = (ks[0] + kv_full, ks[1] + kv_full)
        self._linear(attn.qkv_proj, names, Split(1, (qs, ks, vs)))
        self._linear(attn.o_proj, names, Split(0, (qs,)))
        _row_parallel(attn, attn.o_proj, self)
        attn.num_heads, attn.num_kv_heads = heads, kv
        attn.q_size, attn.kv_size = heads * dh, kv * dh
        _reduce_output(attn, self)

    def _gated(self, mlp: GatedMLP, names: dict[int, str]) -> None:
        inter = mlp.down_proj.in_features
        lo, hi = _even(0, inter, self.rank, self.world)
        self._linear(mlp.up_gate_proj, names, Split(1, ((lo, hi), (inter + lo, inter + hi))))
        self._linear(mlp.down_proj, names, Split(0, ((lo, hi),)))
        _row_parallel(mlp.down_proj, mlp.down_proj, self)

    def _linear(self, linear: Linear, names: dict[int, str], split: Split) -> None:
        self._shrink(linear.weight, names, split)
        linear.in_features, linear.out_features = linear.weight.shape

    def _shrink(self, param: Any, names: dict[int, str], split: Split) -> None:
        shape = list(param.shape)
        shape[split.axis] = split.size
        param.shape = tuple(shape)
        name = names.get(id(param))
        if name is not None:  # a tied LM head is not loaded: it only changes shape
            self.splits[name] = split

    # ------------------------------------------------------------ loading

    def shard_targets(self, model: Any, targets: dict[str, list[Target]]) -> dict[str, list[Target]]:
        """``model.checkpoint_targets(naming)`` (full-model coordinates) rewritten
        for this rank: a target on a split parameter becomes one target per kept
        range it overlaps, each reading only its slice of the checkpoint tensor
        (``source_index``) into the local parameter."""
        split_of = {id(p): self.splits[name] for name, p in model.parameters().items() if name in self.splits}
        for name, p in model.parameters().items():
            split = self.splits.get(name)
            if split is not None and split.axis == len(p.shape) - 2 and hasattr(p, "amax_reduce"):
                p.amax_reduce = self._amax_over_ranks  # row-parallel, quantized: the whole column's scales
        out: dict[str, list[Target]] = {}
        for name, ts in targets.items():
            out[name] = [piece for t in ts for piece in _shard_target(t, split_of.get(id(t.param)))]
        return out

    def _amax_over_ranks(self, amax: np.ndarray) -> np.ndarray:
        """A row-parallel rank's per-channel maxima ``[out]`` -> the maxima over every rank
        (called by ``QuantizedParam`` while loading, in the same order on every rank)."""
        gathered = self._communicator().all_gather(paddle.to_tensor(amax.reshape(1, -1)), axis=0)
        return np.asarray(gathered.numpy(), dtype=np.float32).max(axis=0)


def _shard_target(target: Target, split: Split | None) -> list[Target]:
    if split is None:
        return [target]
    index = list(target.index)
    axis = split.axis
    while len(index) <= axis:
        index.append(slice(None))
    full = split.kept  # the target's range on the split axis, in full coordinates
    region = index[axis]
    ndim_v = len(target.source_shape)
    # the value's axis for the param's axis: integer indices before it drop axes
    value_axis = axis - sum(isinstance(i, int) for i in index[:axis])
    if target.transpose and value_axis >= ndim_v - 2:
        source_axis = 2 * ndim_v - 3 - value_axis  # swap the last two
    else:
        source_axis = value_axis
    a = 0 if region == slice(None) else region.start
    b = target.source_shape[source_axis] + a if region == slice(None) else region.stop
    pieces: list[Target] = []
    local = 0
    for k0, k1 in full:
        lo, hi = max(a, k0), min(b, k1)
        if lo < hi:
            dst = list(index)
            dst[axis] = slice(local + lo - k0, local + hi - k0)
            src: list[Any] = [slice(None)] * ndim_v
            src[source_axis] = slice(lo - a, hi - a)
            pieces.append(replace(target, index=tuple(dst), source_index=tuple(src)))
        local += k1 - k0
    return pieces


class _VocabParallelEmbedding:
    """Rows ``[v0, v1)`` of the table on this rank: a token outside them looks up
    row 0 and is zeroed; the all-reduce sums the one rank that has it."""

    def __init__(self, table: Any, v0: int, v1: int, tp: TensorParallel) -> None:
        self.table, self.v0, self.v1, self.tp = table, v0, v1, tp

    def __call__(self, input_ids: Any) -> Any:
        local = input_ids - self.v0
        mine = (local >= 0) & (local < self.v1 - self.v0)  # [T]
        rows = embed(self.table.data, paddle.where(mine, local, paddle.zeros_like(local)))  # [T, D] fp32
        rows = rows * mine.astype(rows.dtype).unsqueeze(-1)
        return self.tp._communicator().all_reduce(rows)


_REDUCED: dict[type, type] = {}
_GATHERED: dict[type, type] = {}


def _reduce_output(block: Any, tp: TensorParallel) -> None:
    """Make ``block(...)`` all-reduce its output (a row-parallel block's partial sums)."""
    cls = type(block)
    if cls not in _REDUCED:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._tp._communicator().all_reduce(cls.__call__(self, *args, **kwargs))

        _REDUCED[cls] = type(f"AllReduced{cls.__name__}", (cls,), {"__call__": call, "__module__": __name__})
    block.__class__ = _REDUCED[cls]
    block._tp = tp


def _gathered(cls: type) -> type:
    """``cls`` whose output (``[N, V/world]`` logits) is all-gathered along the last axis."""
    if cls not in _GATHERED:
        def call(self: Any, x: Any) -> Any:
            return self._tp._communicator().all_gather(cls.__call__(self, x), axis=-1)

        _GATHERED[cls] = type(f"VocabGathered{cls.__name__}", (cls,), {"__call__": call, "__module__": __name__})
    return _GATHERED[cls]


# zero input channels appended to a row-parallel w8a8 weight; the first carries the token's
# maximum over every rank (a multiple of 16 keeps native kernels on their unrolled paths)
_W8A8_PAD = 16


class _RowParallelOps:
    """The ops of a block with a row-parallel linear (attention's ``o_proj``, a dense
    ``down_proj``). Every op is the backend's, but a w8a8 call on that linear's weight quantizes
    its activations per token with the token's scale over all ``in`` channels, as one device
    does, rather than over this rank's slice. The maximum of ``|x|`` is all-gathered (one value
    per token per rank) and appended as an extra input channel whose weight is zero. Any backend's
    w8a8 kernel then takes it as the token's maximum, so the codes of this rank's channels are
    the ones one device would compute."""

    def __init__(self, ops: Any, linear: Linear, tp: TensorParallel) -> None:
        self._ops, self._linear, self._tp = ops, linear, tp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def linear(self, x: Any, weight: Any, bias: Any = None, quant: Any = None) -> Any:
        if quant is None or quant.method != "w8a8" or quant is not self._linear.weight.data:
            return self._ops.linear(x, weight, bias, quant)
        if quant.in_features == self._linear.in_features:  # first call: append the zero channels once
            zeros = paddle.zeros([quant.out_features, _W8A8_PAD], dtype=quant.qweight.dtype)
            quant = QuantizedWeight(quant.method, paddle.concat([quant.qweight, zeros], axis=1), quant.scales,
                                    quant.in_features + _W8A8_PAD, quant.out_features, quant.group_size,
                                    quant.act_dtype)
            self._linear.weight.data = quant
        amax = paddle.abs(x.astype("float32")).max(axis=-1, keepdim=True)  # [T, 1]
        amax = self._tp._communicator().all_gather(amax, axis=-1).max(axis=-1, keepdim=True)
        pad = paddle.zeros([*x.shape[:-1], _W8A8_PAD - 1], dtype=x.dtype)
        return self._ops.linear(paddle.concat([x, amax.astype(x.dtype), pad], axis=-1), None, bias, quant)


def _row_parallel(owner: Any, linear: Linear, tp: TensorParallel) -> None:
    """``owner`` (the block that calls ``linear`` through its ``ops``) runs it as row-parallel."""
    owner.ops = _RowParallelOps(owner.ops, linear, tp)
