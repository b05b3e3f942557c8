"""The fused dense decoder layer (``fd_decoder_layer``) for decode steps.

At a few requests a decode step of the 0.3B model is ~18 layers x 9 op calls;
each call costs 10-20 us of Python, pluggy and paddle dispatch, and the
calls between the quantized matmuls added ~30% to the matmuls' own time at
batch 1. ``fd_x86_decoder_layer`` (``csrc/x86_ops.cc``) runs the layer in one
call with the same kernels as the separate ops: the norms, the packed
quantized linears, the fused QKV / rotary / cache store and the paged decode
attention.

It answers decode-only steps whose four linear weights are quantized with
wint8, wint4 or w8a8, on fp32 CPU tensors, with the kernel ``fd_x86.linear``
would pick (the packed one; for wint8 above ``WINT8_PACKED_MAX_ROWS`` rows the
contract layout's);
anything else returns None and the separate ops run (``fd_core.ops.decoder``).
``FD_X86_FUSED_LAYER=0`` turns it off (A/B comparisons).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from fd_core.backends.cpu import num_threads
from fd_core.ops.linear import QuantizedWeight
from fd_x86 import ops as x86_ops
from fd_x86.build import load_ops
from fd_x86.linear import _PACKED_METHOD, METHODS, WINT8_PACKED_MAX_ROWS, _packed, _use_packed

__all__ = ["decoder_layer"]

WINT8_CONTRACT = 3  # the op's kernel code for wint8 on the contract layout [out, in]


@functools.lru_cache(maxsize=1)
def _enabled() -> bool:
    return os.environ.get("FD_X86_FUSED_LAYER", "1") != "0"


def _packed_linears(layer: Any, rows: int) -> tuple[list[Any], list[int], list[int], list[int]] | None:
    """The four linears' (packed, scales) tensors, kernel methods, output
    widths and wint4 groups; None when one has no packed kernel here."""
    weights, methods, widths, groups = [], [], [], []
    for quant in (layer.qkv, layer.o, layer.up_gate, layer.down):
        if not isinstance(quant, QuantizedWeight) or quant.method not in METHODS:
            return None
        if quant.method == "wint8" and rows > WINT8_PACKED_MAX_ROWS:
            # the contract layout's kernel, as fd_x86.linear picks at this many rows
            if len(quant.qweight.shape) != 2 or not quant.qweight.is_contiguous() \
                    or not quant.scales.is_contiguous():
                return None
            weights += [quant.qweight, quant.scales]
            methods.append(WINT8_CONTRACT)
        else:
            packed = _packed(quant)
            if packed is None:
                return None
            weights += packed
            methods.append(_PACKED_METHOD[quant.method])
        widths.append(int(quant.out_features))
        groups.append(int(quant.group_size) if quant.group_size and quant.group_size > 0 else -1)
    return weights, methods, widths, groups


def decoder_layer(layer: Any, hidden: Any, residual: Any | None, cos_sin: Any, metadata: Any, k_cache: Any,
                  v_cache: Any) -> Any:
    """``(hidden, residual)`` after the layer, or None (see the module doc)."""
    rows = hidden.shape[0]
    if rows == 0 or metadata.num_decodes != rows or len(hidden.shape) != 2 or not _enabled() \
            or not _use_packed("auto"):
        return None
    tensors = (hidden, layer.input_norm, layer.post_norm, cos_sin, k_cache, v_cache)
    if not x86_ops._host(*tensors) or (residual is not None and not x86_ops._host(residual)):
        return None
    if len(k_cache.shape) != 3 or not k_cache.is_contiguous() or not v_cache.is_contiguous() \
            or layer.head_dim % 8 or cos_sin.shape[-1] != layer.head_dim:
        return None
    linears = _packed_linears(layer, rows)
    if linears is None:
        return None
    weights, methods, widths, groups = linears
    tables, lens, _ = x86_ops._tables(metadata, x86_ops.DECODE_KEY, 0, rows)
    dense = x86_ops._dense
    hidden = dense(hidden)
    out, total = load_ops().fd_x86_decoder_layer(
        hidden, hidden if residual is None else dense(residual), dense(layer.input_norm), dense(layer.post_norm),
        dense(cos_sin), x86_ops._int64(metadata.positions), x86_ops._int64(metadata.slot_mapping), k_cache, v_cache,
        tables, lens, weights, residual is not None, methods, widths, groups, float(layer.eps),
        int(layer.num_heads), int(layer.num_kv_heads), bool(layer.interleaved_rope), int(metadata.block_size),
        float(layer.scale), num_threads(),
    )
    return out, total
