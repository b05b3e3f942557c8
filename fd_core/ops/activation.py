"""SiLU-and-multiply (SwiGLU) for gated MLPs."""

from __future__ import annotations

from typing import Any

from fd_core._paddle import import_paddle

__all__ = ["reference_silu_and_mul"]

paddle = import_paddle()
F = paddle.nn.functional


def reference_silu_and_mul(x: Any) -> Any:
    """``x [T, 2*I] = [gate | up]`` -> ``silu(gate) * up`` ``[T, I]``."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last axis, got shape {list(x.shape)}")
    gate, up = paddle.chunk(x, 2, axis=-1)
    return F.silu(gate) * up
