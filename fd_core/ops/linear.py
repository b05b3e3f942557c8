"""Linear layers, unquantized and quantized.

Unquantized weights are ``[in, out]`` (Paddle's layout), so ``y = x @ W``;
a weight stored in 16 bits (``--dtype bfloat16|float16``) is upcast to x's
dtype (fp32) for the matmul: paddle's CPU matmul has no bf16 kernel, and the
reference defines the numerics as fp32 compute on the rounded weights.
Quantized layers carry a ``QuantizedWeight`` (the data type lives here, where
every kernel can read it); the layout and the reference numerics of each method
are defined by ``fd_core.quantization`` (wint8/wint4: dequantize, then an fp32
matmul; w8a8: per-token dynamic int8 activations), which the CPU reference
backend calls for a quantized layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops._host import as_array, empty_host

__all__ = ["QuantizedWeight", "reference_linear", "upcast", "widen_for_matmul"]

paddle = import_paddle()


@dataclass
class QuantizedWeight:
    """A quantized linear weight as stored after loading (paddle tensors).

    wint8/w8a8: ``qweight`` int8 ``[out, in]``, ``scales`` float32 ``[out]``.
    wint4: ``qweight`` uint8 ``[out, in // 2]`` (two signed nibbles, low =
    even in-index), ``scales`` float32 ``[out, in // group_size]`` (``[out, 1]``
    and ``group_size`` -1 when per channel). Stacked MoE experts add a leading
    expert axis to both tensors; ``in_features``/``out_features`` are then one
    expert's. See ``fd_core.quantization.wint`` for the exact arithmetic.

    ``act_dtype`` is the dtype of the activations the weight meets in its model
    (``--dtype``; the loader sets it): under ``bfloat16`` the reference's linear
    multiplies bf16 activations, and a backend whose kernels keep activations in
    fp32 between ops may round them to bf16 at this linear (the same operands as
    the reference's). ``float32`` (the default) promises nothing more.
    """

    method: str  # "wint8", "wint4", "w8a8", or a plugin's method
    qweight: Any  # packed integer weight, a row per output channel
    scales: Any  # float32 scales: [out] or [out, groups]
    in_features: int
    out_features: int
    group_size: int = -1  # -1: per channel
    act_dtype: str = "float32"  # the model's activation dtype (see above)

    def expert(self, index: int) -> QuantizedWeight:
        """Expert ``index``'s weight from one stacked over a leading expert axis."""
        return QuantizedWeight(self.method, self.qweight[index], self.scales[index],
                               self.in_features, self.out_features, self.group_size, self.act_dtype)


def reference_linear(x: Any, weight: Any, bias: Any | None = None) -> Any:
    """``x [T, in] @ weight [in, out] + bias``, in fp32. (A quantized layer's
    reference numerics are its method's: ``fd_core.quantization.reference``.)"""
    out = paddle.matmul(x, widen_for_matmul(weight, x.dtype))
    if bias is not None:
        out = out + upcast(bias, out.dtype)
    return out


def upcast(weight: Any, dtype: Any) -> Any:
    """``weight`` as ``dtype`` (the activations'): itself when it already is."""
    return weight if weight.dtype == dtype else weight.astype(dtype)


# (shape, dtype) -> an fp32 CPU tensor and its numpy view, reused by widen_for_matmul
_SCRATCH: dict[tuple[tuple[int, ...], str], tuple[Any, np.ndarray]] = {}


def widen_for_matmul(weight: Any, dtype: Any) -> Any:
    """``upcast(weight, dtype)`` for a matrix consumed at once by one matmul.

    A 16-bit contiguous CPU weight is widened into a scratch tensor kept per
    shape and reused by the next call of that shape, so the caller must not
    hold the result. Widening into fresh memory at every call costs about the
    fp32 size in page faults (the 0.3B LM head: ~200 ms vs ~40 ms here). The
    scratch is one fp32 matrix per distinct weight shape (for ERNIE 4.5: the
    LM head, the four decoder linears, one expert's two): the memory bf16
    storage gives back, less those. Values are exactly ``astype``'s."""
    if weight.dtype == dtype:
        return weight
    if dtype != paddle.float32 or weight.dtype not in (paddle.bfloat16, paddle.float16) \
            or not weight.place.is_cpu_place() or not weight.is_contiguous():
        return weight.astype(dtype)
    key = (tuple(weight.shape), str(weight.dtype))
    entry = _SCRATCH.get(key)
    if entry is None:
        entry = _SCRATCH[key] = empty_host(weight.shape)
    out, view = entry
    if weight.dtype == paddle.bfloat16:  # fp32 bits = bf16 bits << 16 (int16's sign extension shifts out)
        np.left_shift(as_array(weight.view(paddle.int16)), 16, out=view.view(np.uint32),
                      dtype=np.uint32, casting="unsafe")
    else:
        np.copyto(view, as_array(weight))
    return out
