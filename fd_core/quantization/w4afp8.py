"""``w4afp8``: int4 weights with group scales, per-token dynamic fp8 (e4m3) activations.

FastDeploy's scheme, as its code reads (PaddlePaddle/FastDeploy, 2025-26):

- ``fastdeploy/model_executor/layers/quantization/w4afp8.py``: ``W4AFP8Config``
  gives routed experts (``FusedMoE``) ``CutlassW4AFP8MoEMethod`` and every other
  linear ``W4AFP8LinearMethod``; the latter needs per-layer *static* scales from
  the config's ``weight_scale_dict`` / ``act_scale_dict`` (per-channel int4 weights
  by ``scaled_gemm_f8_i4_f16_weight_quantize(groupsize=-1)``, output scale
  ``weight_scale / (act_scale * 448 * 448)``), which a float checkpoint does not
  have; in practice w4afp8 is FastDeploy's MoE-expert method, named in
  ``mix_quant`` as ``"moe_quant_type": "w4afp8"`` (``mix_quant.py`` passes
  ``is_quantized`` and ``hadamard_block_size`` to it).
- ``fastdeploy/model_executor/layers/moe/fused_moe_cutlass_backend.py``
  (``CutlassW4AFP8MoEMethod``), float checkpoint (``is_quantized`` false): each
  expert's ``[in, out]`` weight is quantized by ``group_wise_int4_weight_quantize
  (group_size=128)`` (``fastdeploy/model_executor/layers/utils.py``): symmetric,
  per output channel and group of 128 inputs, ``amax = max(max |W_group|, 1e-8)``,
  ``q = clip(round(W / amax * 7), -8, 7)``, stored scale ``amax`` (the kernel's
  ``weight_scale`` is then ``amax / (448 * 7 * 2**-9)``: constants of its int4 ->
  fp8 conversion, read here as cancelling in the product; the CUTLASS kernel
  itself was not read). The activations are quantized in
  ``moe_expert_dispatch`` (``custom_ops/gpu_ops/moe/moe_dispatch.cu``): without a
  static ``up_gate_proj_in_scale`` the dispatched rows become ``FLOAT8_E4M3FN``
  with one ``dequant_scale`` per (token, expert) row, i.e. per token (EP decode
  passes ``quant_group_size=-1``: per token, not per 128-group). Offline
  checkpoints instead carry static per-expert ``activation_scale``s
  (``moe_dynamic_quant`` false), which fd-core does not read.

fd-core's ``w4afp8``:

- weights: exactly ``wint4``'s layout and quantizer (``fd_core.quantization.wint``):
  uint8 ``[out, in // 2]`` codes in ``[-7, 7]``, float32 scales
  ``[out, in // group_size]`` with ``scale = amax / 7`` (FastDeploy's ``amax`` with
  the 7 folded in; the same codes up to round-half-even vs half-away ties, and an
  all-zero group gets scale 1 instead of 1e-8: both dequantize to 0). The group is
  ``group_size`` (128 by default, FastDeploy's fixed value); a layer whose ``in``
  is not a multiple falls back to per-channel scales (FastDeploy asserts instead).
- activations, on every call, per token: ``s_t = max |x_t| / 448`` (1 for an
  all-zero token), ``xq = e4m3_rne(x / s_t)`` (FastDeploy's epsilon for tiny rows
  was not found in its kernels; this choice only matters for all-zero rows, whose
  output is 0 either way).
- product: ``y[t, o] = s_t * sum_g scales[o, g] * sum_{i in g} xq[t, i] * q[o, i]``;
  int4 codes are exact in e4m3, so the inner sums are what an fp8 x fp8 tensor core
  accumulates in fp32 per group. The reference computes ``(xq @ dequantize_int4(W)) * s_t``
  in fp32 (the group scale applied to each code before the sum: equal up to fp32 rounding).

Where fd-core differs, and why:

- FastDeploy's float-checkpoint path rotates each expert's ``down_proj`` by a
  block-diagonal Hadamard matrix (``rotate_model`` / ``get_orthogonal_matrix
  (mode="hadamard_ffn2")``, blocks of the largest power of two dividing
  ``moe_intermediate_size``) and its kernel applies the matching transform to the
  activations before fp8 (``hadamard_block_size``, scale divided by ``sqrt(block)``).
  The rotation is an identity in exact arithmetic (it only spreads outliers before
  rounding); fd-core does not rotate, so ``dequantize`` stays the float weight and
  the quantizer need not know which projection it quantizes. The JSON key
  ``hadamard_block_size`` is therefore not accepted.
- Plain ``--quantization w4afp8`` quantizes every linear layer of the decoder and the
  routed experts with this dynamic scheme (as fd-core's ``w4a8`` does); FastDeploy's
  split is ``{"quantization": "mix_quant", "dense_quant_type": "wint8" (or
  "block_wise_fp8"), "moe_quant_type": "w4afp8"}``.
- Tensor parallelism: per-token activation scales of a row-parallel rank's slice
  would differ from one device's, as for ``w4a8`` (refused there).
"""

from __future__ import annotations

from typing import Any

from fd_core.quantization.block_fp8 import E4M3_MAX
from fd_core.quantization.methods import QuantMethod
from fd_core.quantization.wint import dequantize_int4, quantize_int4

__all__ = ["W4AFP8", "quantize_activations_e4m3", "w4afp8_linear"]


def quantize_activations_e4m3(x: Any) -> tuple[Any, Any]:
    """``x [T, in]`` (paddle) -> (e4m3 values as float32 ``[T, in]``, scales float32 ``[T]``),
    one scale per token: ``s_t = max |x_t| / 448`` (1 for an all-zero token)."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    x = x.astype("float32")
    amax = paddle.abs(x).max(axis=-1)  # [T]
    scales = paddle.where(amax > 0, amax / E4M3_MAX, paddle.ones_like(amax))
    scaled = paddle.clip(x / scales.unsqueeze(-1), -E4M3_MAX, E4M3_MAX)
    # paddle's float8_e4m3fn cast rounds to nearest even, as block_fp8's encode_e4m3
    values = scaled.astype("float8_e4m3fn").astype("float32")
    return values, scales


def w4afp8_linear(x: Any, quant: Any) -> Any:
    """Reference ``y = (e4m3(x / s_t) @ dequantize_int4(W)) * s_t`` in fp32, in ``x``'s dtype."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    if int(x.shape[0]) == 0:
        return paddle.zeros([0, quant.out_features], dtype=x.dtype)
    values, token_scales = quantize_activations_e4m3(x)
    acc = paddle.matmul(values, dequantize_int4(quant.qweight, quant.scales))  # [T, out]
    out = acc * token_scales.unsqueeze(-1)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


W4AFP8 = QuantMethod(
    "w4afp8", "int4 weights with group-wise scales (wint4's layout), per-token dynamic fp8 (e4m3) activations",
    quantize=quantize_int4, linear=w4afp8_linear, grouped=True, dequantize=dequantize_int4,
)
