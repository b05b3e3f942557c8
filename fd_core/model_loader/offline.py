"""The checkpoint map of an offline-quantized checkpoint.

``load_model`` calls ``prequantized_targets`` after
``fd_core.quantization.prequantized.install_prequantized``: the model's own
map names float ``X.weight`` tensors; an offline checkpoint stores each such
weight as ``X.quant_weight``, ``X.weight_scale``, ... (FastDeploy's names),
and int8-KV formats add per-layer static KV-cache scales.

Under tensor / expert parallelism the map it is given is already a rank's
(``TensorParallel.shard_targets``: float slices ``source_index`` of the
``[in, out]`` tensor into the local parameter, experts renumbered): each
slice becomes the matching slices of the stored codes and scales
(``part_axes``), a per-output-channel scale follows the output columns, a
one-number activation scale is taken whole, and the KV scales follow the
rank's KV heads. A slice that does not fall on the stored packing (128-blocks
of fp8 scales, 64-input wint2 groups two per byte, int4 pairs) is refused.
"""

from __future__ import annotations

import re
from typing import Any

from fd_core.layers.param import Param
from fd_core.models.base import Target
from fd_core.quantization.offline import OfflineQuantization
from fd_core.quantization.prequantized import PrequantizedParam, part_axes, part_shapes

__all__ = ["prequantized_targets"]


_EXPERT = re.compile(r"^(ernie\.layers\.(\d+)\.mlp\.experts\.\d+\.(?:up_gate|down)_proj)\.weight$")


def _axis_range(index: Any, size: int) -> tuple[int, int]:
    """``[lo, hi)`` of an axis of length ``size`` that a slice (or nothing: all) picks."""
    if index is None or index == slice(None):
        return 0, size
    return int(index.start), int(index.stop)


def _stored_pieces(name: str, t: Target, transform: Any) -> list[tuple[str, Target]]:
    """The stored tensors ``X.quant_weight``, ``X.weight_scale``, ... that float
    target ``t`` (``X.weight``, maybe the slice ``transform``, a rank's
    ``TensorParallel``, cut) stands for, each as the piece of the stored tensor
    that lands in the rank's part."""
    param = t.param
    assert isinstance(param, PrequantizedParam)
    if not name.endswith(".weight") or t.transpose or len(t.source_shape) != 2:
        raise ValueError(f"{name}: a pre-quantized weight must be an [in, out] tensor in Paddle naming")
    prefix = name[: -len(".weight")]
    stacked = len(param.shape) == 3
    expert = int(t.index[0]) if stacked and t.index else 0
    dst_index = list(t.index[1:] if stacked else t.index) + [None, None]
    src_index = list(t.source_index) + [None, None]
    local = param.shape[-2:]
    # per matrix axis (in, out): the float source range and where it lands locally
    src = [_axis_range(src_index[a], t.source_shape[a]) for a in (0, 1)]
    dst = [_axis_range(dst_index[a], local[a]) for a in (0, 1)]
    whole = all(s == (0, t.source_shape[a]) and d == (0, local[a]) for a, (s, d) in enumerate(zip(src, dst)))
    full_parts = part_shapes(param.method, *t.source_shape)
    pieces = []
    for suffix, stored_shape in full_parts.items():
        if whole:
            pieces.append((f"{prefix}.{suffix}", Target(param, stored_shape, (suffix, expert))))
            continue
        part_src: list[slice] = [slice(None)] * len(stored_shape)
        part_dst: list[slice] = [slice(None)] * len(stored_shape)
        for a, axis in enumerate(part_axes(param.method, suffix)):
            if axis is None:
                continue
            stored_axis, per = axis
            (s0, s1), (d0, _) = src[a], dst[a]
            full = t.source_shape[a]
            if s0 % per or d0 % per or (s1 % per and s1 != full):
                side = ("input rows", "output columns")[a]
                raise ValueError(
                    f"{prefix} ({param.method}, {full} {side.split()[0]}s): --tensor-parallel-size "
                    f"{transform.world} gives rank {transform.rank} its {side} {s0}..{s1}, which do not fall on "
                    f"the {per}-element boundaries "
                    f"{prefix}.{suffix} is stored in; use a tensor-parallel size whose slices of this "
                    f"weight are multiples of {per} (or 1)")
            lo, hi = s0 // per, -(-s1 // per)
            part_src[stored_axis] = slice(lo, hi)
            part_dst[stored_axis] = slice(d0 // per, d0 // per + hi - lo)
        pieces.append((f"{prefix}.{suffix}", Target(param, stored_shape, (suffix, expert, tuple(part_dst)),
                                                    source_index=tuple(part_src))))
    return pieces


def prequantized_targets(model: Any, targets: dict[str, list[Target]], offline: OfflineQuantization,
                         num_kv_channels: int, transform: Any = None) -> dict[str, list[Target]]:
    """``targets`` (Paddle naming; a rank's when ``transform``, the
    ``TensorParallel`` that cut them, is given) with each pre-quantized
    ``X.weight`` replaced by its stored tensors, plus
    ``ernie.layers.N.self_attn.cachek_matmul`` / ``cachev_matmul.activation_scale``
    (``[num_kv_channels]``: FastDeploy's int8 KV scales are per channel; a rank
    reads its KV heads' channels) when the format has static KV scales;
    those land in ``model.kv_cache_static_scales[N] = (k, v)`` (float Params) for an int8
    cache (applied: ``int8_static``); a ``float8_e4m3fn`` cache's are read, shape-checked
    and left unused (fd-core's fp8 cache is dynamic)."""
    out: dict[str, list[Target]] = {}
    for name, tlist in targets.items():
        if not tlist:  # read by another rank (EP: another rank's experts): its stored tensors too
            expert = _EXPERT.match(name)
            if expert is None:
                out.setdefault(name, [])
                continue
            for suffix in part_shapes(offline.moe_method_of(int(expert.group(2))), 0, 0):
                out.setdefault(f"{expert.group(1)}.{suffix}", [])
            continue
        for t in tlist:
            if not isinstance(t.param, PrequantizedParam):
                out.setdefault(name, []).append(t)
                continue
            for stored_name, piece in _stored_pieces(name, t, transform):
                kept = out.setdefault(stored_name, [])
                if piece not in kept:  # a part the split does not cut (one activation scale): once
                    kept.append(piece)
    if offline.static_kv_scales:
        k0, k1 = transform.kv_channels(model.config) if transform is not None else (0, num_kv_channels)
        cut = () if (k0, k1) == (0, num_kv_channels) else (slice(k0, k1),)
        scales: dict[int, tuple[Param, Param]] = {}
        for i in range(len(model.layers)):
            pair = (Param((k1 - k0,)), Param((k1 - k0,)))
            scales[i] = pair
            for which, param in zip(("cachek", "cachev"), pair):
                out[f"ernie.layers.{i}.self_attn.{which}_matmul.activation_scale"] = [
                    Target(param, (num_kv_channels,), source_index=cut)]
        if offline.kv_cache_dtype == "int8":  # applied (int8_static); fp8's are read and checked only
            model.kv_cache_static_scales = scales
    return out

