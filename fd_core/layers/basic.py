"""Linear and RMSNorm layers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fd_core._paddle import import_paddle
from fd_core.layers.param import Param
from fd_core.ops._host import as_array, on_host
from fd_core.ops.embedding import embed
from fd_core.ops.linear import QuantizedWeight

if TYPE_CHECKING:
    from fd_core.backends.base import Ops

__all__ = ["Linear", "RMSNorm", "embed", "tie_lm_head"]

paddle = import_paddle()


class Linear:
    """``y = x @ W``, ``W [in, out]`` (Paddle's layout). Quantized (by
    ``fd_core.quantization.apply`` before loading), the weight is held as a
    ``QuantizedWeight`` and the backend picks the kernel."""

    def __init__(self, ops: Ops, in_features: int, out_features: int) -> None:
        self.ops = ops
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Param((in_features, out_features))

    @property
    def quant(self) -> QuantizedWeight | None:
        data = self.weight.data
        return data if isinstance(data, QuantizedWeight) else None

    def __call__(self, x: Any) -> Any:
        quant = self.quant
        if quant is not None:
            return self.ops.linear(x, None, None, quant)
        return self.ops.linear(x, self.weight.data, None, None)


def tie_lm_head(lm_head: Linear, embed_tokens: Param) -> None:
    """Fill an LM head tied to the embeddings ``[V, D]`` after loading: its own ``[D, V]``
    copy, or, when the head is to be quantized (a ``QuantizedParam`` not yet filled),
    the table handed to its quantizer as it is (``[V, D]`` is already ``[out, in]``).
    A float head is the one copy: the table becomes its transposed view (``embed``
    gathers columns; fp16 keeps both, paddle's CPU index_select has no fp16 kernel)."""
    table = embed_tokens.data
    if lm_head.quant is None and hasattr(lm_head.weight, "method"):
        # the head is no parameter of the model's (it is the table): it meets the model's activations,
        # the table's dtype (``QuantizedWeight.act_dtype``, as the loader records for the others)
        lm_head.weight.act_dtype = getattr(embed_tokens, "dtype", "float32")  # type: ignore[attr-defined]
        if table.dtype != paddle.float32:  # 16-bit table: the quantizer takes fp32 (numpy has no bf16)
            table = table.astype("float32")
        lm_head.weight.set((as_array(table) if on_host(table) else table.numpy()).T)
    elif getattr(lm_head.weight, "pinned", False) and lm_head.weight.dtype == "float32" \
            and table.dtype != paddle.float32:
        # --lm_head-fp32 under a 16-bit --dtype: the head is its own fp32 copy of the (rounded) table
        lm_head.weight.set(table.astype("float32").t().contiguous())
    else:
        lm_head.weight.set(table.t().contiguous())
        if table.dtype != paddle.float16 and len(table.shape) == 2:
            embed_tokens.set(lm_head.weight.data.t())  # a view: the [V, D] table is freed


class RMSNorm:
    def __init__(self, ops: Ops, hidden_size: int, eps: float) -> None:
        self.ops = ops
        self.eps = eps
        self.weight = Param((hidden_size,))
        self._widened: tuple[Any, int, Any] | None = None  # (16-bit weight, its version, its fp32 copy)

    def __call__(self, x: Any, residual: Any | None = None) -> Any:
        """``x [T, D]``; with ``residual`` returns ``(normed, x + residual)``.
        A 16-bit weight under fp32 activations is handed over as its fp32 copy
        (the same values; the reference widens it anyway, and a backend's fp32
        kernel then takes it), made once and again only if the weight changes."""
        return self.ops.rms_norm(x, self.weight_for(x), self.eps, residual)

    def weight_for(self, x: Any) -> Any:
        """The weight as a kernel takes it for activations ``x``: a 16-bit weight
        under fp32 activations as its cached fp32 copy, else the weight itself."""
        weight = self.weight.data
        return self.fp32_weight() if weight.dtype != x.dtype and x.dtype == paddle.float32 else weight

    def fp32_weight(self) -> Any:
        """The weight as fp32 activations take it (``weight_for`` an fp32 ``x``)."""
        weight = self.weight.data
        if weight.dtype != paddle.float32:
            widened = self._widened
            if widened is None or widened[0] is not weight or widened[1] != weight._inplace_version():
                widened = self._widened = (weight, weight._inplace_version(), weight.astype("float32"))
            weight = widened[2]
        return weight
