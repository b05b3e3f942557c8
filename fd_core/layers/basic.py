"""Linear and RMSNorm layers."""

from __future__ import annotations

from typing import Any

from fd_core.backends.base import Ops
from fd_core.layers.param import Param

__all__ = ["Linear", "RMSNorm"]


class Linear:
    """``y = x @ W``, ``W [in, out]`` (Paddle's layout); quantization methods
    replace ``quant`` after loading and the kernel is chosen by the backend."""

    def __init__(self, ops: Ops, in_features: int, out_features: int) -> None:
        self.ops = ops
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Param((in_features, out_features))
        self.quant: Any = None

    def __call__(self, x: Any) -> Any:
        return self.ops.linear(x, self.weight.data, None, self.quant)


class RMSNorm:
    def __init__(self, ops: Ops, hidden_size: int, eps: float) -> None:
        self.ops = ops
        self.eps = eps
        self.weight = Param((hidden_size,))

    def __call__(self, x: Any, residual: Any | None = None) -> Any:
        """``x [T, D]``; with ``residual`` returns ``(normed, x + residual)``."""
        return self.ops.rms_norm(x, self.weight.data, self.eps, residual)
