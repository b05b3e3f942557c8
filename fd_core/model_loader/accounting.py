"""The memory a loaded model's weights hold, by storage.

Counted over the parameters the checkpoint fills plus an LM head tied to the
embeddings (it holds its own ``[D, V]`` copy, or its quantized form).
Quantized weights count their codes plus scales, under their method's name.
"""

from __future__ import annotations

from typing import Any

from fd_core.layers.param import Param
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization.weights import resident_bytes

__all__ = ["resident_params", "weight_bytes", "weight_bytes_by_dtype"]


def resident_params(model: Any) -> list[Param]:
    params = list(model.parameters().values())
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(model, "lm_head"):
        params.append(model.lm_head.weight)
        # a float tied head holds the table once: the embedding is its transposed view
        table = getattr(model, "embed_tokens", None)
        params = [p for p in params if id(p) != id(table) or not _is_view(p.data)]
    return params


def _is_view(data: Any) -> bool:
    """A paddle tensor that is a strided view (the tied table, see ``layers.basic.tie_lm_head``)."""
    return data is not None and not isinstance(data, QuantizedWeight) and not data.is_contiguous()


def weight_bytes_by_dtype(model: Any) -> dict[str, int]:
    """Resident bytes by storage: ``{"bfloat16": ..., "float32": ...}``; quantized
    weights under their method (``"wint8"``: codes + scales)."""
    out: dict[str, int] = {}
    for p in resident_params(model):
        data = p.data
        if data is None:
            continue
        key = data.method if isinstance(data, QuantizedWeight) else str(data.dtype).replace("paddle.", "")
        out[key] = out.get(key, 0) + resident_bytes(data)
    return out


def weight_bytes(model: Any, as_fp32: bool = False) -> int:
    """Bytes the loaded weights hold in their storage; ``as_fp32``: what they would
    hold unquantized in fp32."""
    if as_fp32:
        return sum(p.numel * 4 for p in resident_params(model))
    return sum(weight_bytes_by_dtype(model).values())
