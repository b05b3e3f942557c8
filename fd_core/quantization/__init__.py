"""Quantization: how weights are quantized while loading, and laid out.

Owns the methods ``--quantization`` names (``methods``: a registry that
general plugins extend through ``fd_register_quantization_methods``), parsing
FastDeploy's flag forms (``config``), the reference quantizer and layouts
(``wint``: wint8/wint4, ``w8a8``, ``block_fp8``, ``w4a8``, ``w4afp8``, ``wint2``), the
parameter that quantizes as the loader fills it (``param``) and the transform that makes a finished model's
layers quantized (``apply``). The reference numerics of quantized layers live
here too (``reference``; the CPU reference backend calls them): dequantize,
then an fp32 matmul (w8a8 also quantizes activations per token).
FastDeploy's offline-quantized checkpoints (FP8, W4A8C8, 2Bits) are detected
from their config.json (``offline``) and loaded as stored
(``prequantized``); their layouts and sources: ``OFFLINE_FORMATS.md``.
May import: fd_core.ops, fd_core.layers, fd_core.errors, fd_core.plugins,
fd_core._paddle, numpy, paddle (only in the modules that run kernels: importing this package
or ``config``/``methods`` loads no paddle).

Public API::

    quantize_weight(method, weight [in, out] float32, group_size=128) -> QuantizedWeight
    dequantize(quant) -> float32 [in, out] paddle tensor
    parse_quantization(value, architecture=None, lm_head_fp32=False) -> QuantizationConfig | None

Layouts (``QuantizedWeight.qweight`` / ``.scales``; details in ``wint``):

- wint8, w8a8: int8 ``[out, in]``, float32 ``[out]``;
  ``W[i, o] = qweight[o, i] * scales[o]``.
- wint4: uint8 ``[out, in // 2]`` (in-index ``2j`` in the low nibble of byte
  ``j``, ``2j + 1`` in the high nibble, signed two's complement),
  float32 ``[out, in // group_size]`` (``[out, 1]`` per channel).
- block_wise_fp8 (``block_fp8``): uint8 e4m3 codes ``[out, in]``, float32
  block scales ``[ceil(out/128), ceil(in/128)]``; w4a8 (``w4a8``) and w4afp8
  (``w4afp8``: per-token e4m3 activations): wint4's layout; wint2 (``wint2``, offline checkpoints only): FastDeploy's
  ``quant_weight`` uint8 ``[in/4, out]``, scales float32 ``[in/64 + 3, out]``;
  w4a8_static (offline W4A8C8 experts): wint4's codes per channel, scales
  float32 ``[out, 2]`` (weight scale, the expert's static activation max).
- MoE experts: the same, stacked on a leading expert axis
  (``[E, out, in]`` / ``[E, out]``, ...); ``fd_moe_experts`` receives
  ``quant = (up_gate, down)``, two such stacked ``QuantizedWeight``s.

What is quantized in a model: every linear layer of the decoder layers
(qkv, o, dense MLPs, shared experts) with the dense method, routed experts
with the MoE method; the LM head stays float32 as in FastDeploy unless
``lm_head_quant_type`` names a method (opt-in, e.g. ``wint8``); embeddings,
norms and the MoE router gate stay float32. Plain ``wint4`` on ERNIE keeps
the dense layers at wint8 and quantizes routed experts to wint4, as
FastDeploy does.
"""

from __future__ import annotations

from typing import Any

from fd_core.quantization.config import (
    QuantizationConfig,
    check_backend_supports,
    parse_quantization,
)
from fd_core.quantization.methods import MethodRegistry, QuantMethod, registry

__all__ = [
    "MethodRegistry",
    "QuantMethod",
    "QuantizationConfig",
    "QuantizedParam",
    "check_backend_supports",
    "dequantize",
    "expert_weight",
    "parse_quantization",
    "quantize_weight",
    "registry",
    "resident_bytes",
]

_LAZY = {  # name -> module; these import paddle
    "quantize_weight": "fd_core.quantization.weights",
    "dequantize": "fd_core.quantization.weights",
    "expert_weight": "fd_core.quantization.weights",
    "resident_bytes": "fd_core.quantization.weights",
    "QuantizedParam": "fd_core.quantization.param",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fd_core.quantization' has no attribute {name!r}")
