"""RMSNorm (optionally fused with the residual add)."""

from __future__ import annotations

from typing import Any

from fd_core._paddle import import_paddle
from fd_core.ops.linear import upcast

__all__ = ["reference_rms_norm"]

paddle = import_paddle()


def reference_rms_norm(x: Any, weight: Any, eps: float, residual: Any | None = None) -> Any:
    """``x [T, D]`` -> ``x * rsqrt(mean(x^2) + eps) * weight``; with ``residual``,
    normalise ``x + residual`` and return ``(normed, x + residual)``."""
    if residual is not None:
        x = x + residual
    variance = paddle.mean(x * x, axis=-1, keepdim=True)
    normed = x * paddle.rsqrt(variance + eps) * upcast(weight, x.dtype)  # a 16-bit weight: fp32 math
    return (normed, x) if residual is not None else normed
