"""The checkpoint map of an offline-quantized checkpoint.

``load_model`` calls ``prequantized_targets`` after
``fd_core.quantization.prequantized.install_prequantized``: the model's own
map names float ``X.weight`` tensors; an offline checkpoint stores each such
weight as ``X.quant_weight``, ``X.weight_scale``, ... (FastDeploy's names),
and int8-KV formats add per-layer static KV-cache scales.
"""

from __future__ import annotations

from typing import Any

from fd_core.layers.param import Param
from fd_core.models.base import Target
from fd_core.quantization.offline import OfflineQuantization
from fd_core.quantization.prequantized import PrequantizedParam

__all__ = ["prequantized_targets"]


def prequantized_targets(model: Any, targets: dict[str, list[Target]], offline: OfflineQuantization,
                         num_kv_channels: int) -> dict[str, list[Target]]:
    """``targets`` (Paddle naming) with each pre-quantized ``X.weight`` replaced
    by its stored tensors, plus ``ernie.layers.N.self_attn.cachek_matmul`` /
    ``cachev_matmul.activation_scale`` (``[num_kv_channels]``: FastDeploy's
    int8 KV scales are per channel) when the format has static KV scales;
    those land in ``model.kv_cache_static_scales[N] = (k, v)`` (float Params)."""
    out: dict[str, list[Target]] = {}
    for name, tlist in targets.items():
        for t in tlist:
            if not isinstance(t.param, PrequantizedParam):
                out.setdefault(name, []).append(t)
                continue
            if not name.endswith(".weight") or t.transpose or t.source_index or len(t.index) > 1:
                raise ValueError(f"{name}: a pre-quantized weight must be whole and in Paddle naming")
            prefix = name[: -len(".weight")]
            expert = int(t.index[0]) if t.index else 0
            for suffix, shape in t.param.parts.items():
                out.setdefault(f"{prefix}.{suffix}", []).append(Target(t.param, shape, (suffix, expert)))
    if offline.static_kv_scales:
        scales: dict[int, tuple[Param, Param]] = {}
        for i in range(len(model.layers)):
            pair = (Param((num_kv_channels,)), Param((num_kv_channels,)))
            scales[i] = pair
            for which, param in zip(("cachek", "cachev"), pair):
                out[f"ernie.layers.{i}.self_attn.{which}_matmul.activation_scale"] = [
                    Target(param, (num_kv_channels,))]
        model.kv_cache_static_scales = scales
    return out
