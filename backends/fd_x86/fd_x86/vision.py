"""The vision tower's attention (``fd_vision_attention``) through the C++ op of
``csrc/x86_vision_op.cc`` (kernel: ``csrc/kernels_vision_avx512.cc``).

One call per vision block: the 2D rotary of q and k and the bidirectional
attention within each frame, over the block's fused ``qkv [N, 3*H*Dh]``, in
fp32 on AVX-512 F/BW/VL/DQ (scores, exact softmax and values in register
tiles; no ``[H, L, L]`` tensor in memory). Called by ``fd_x86.backend``;
returns None (the reference answers) without AVX-512, for tensors that are not
fp32 on the CPU, for an odd head size or one over the kernel's 512, or when
``FD_X86_VISION_ATTN=0``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fd_core.backends.cpu import num_threads
from fd_core.ops.vision_attention import check_cu_seqlens
from fd_x86.build import load_ops

__all__ = ["MAX_HEAD_DIM", "available", "vision_attention"]

MAX_HEAD_DIM = 512  # csrc/vision_kernels.h kVisionMaxHeadDim

_AVAILABLE: list[bool] = []  # [whether the CPU has AVX-512 and the kernel is on], once


def available() -> bool:
    """AVX-512 F/BW/VL/DQ here and ``FD_X86_VISION_ATTN`` not 0."""
    if not _AVAILABLE:
        from fd_x86.cpu import cpu_features

        enabled = os.environ.get("FD_X86_VISION_ATTN") != "0"  # the backend's switches, as FD_X86_DENSE16
        _AVAILABLE.append(enabled and cpu_features().has("avx512f", "avx512bw", "avx512vl", "avx512dq"))
    return _AVAILABLE[0]


def vision_attention(qkv: Any, cos: Any, sin: Any, cu_seqlens: Sequence[int], num_heads: int,
                     scale: float) -> Any:
    """``qkv [N, 3*H*Dh]`` -> ``[N, H*Dh]`` (see the hookspec), or None where the kernel does not apply."""
    import paddle

    if not available() or any(t.dtype != paddle.float32 or not t.place.is_cpu_place() for t in (qkv, cos, sin)):
        return None
    if len(qkv.shape) != 2 or num_heads < 1 or qkv.shape[1] % (3 * num_heads):
        return None
    head_dim = qkv.shape[1] // (3 * num_heads)
    if head_dim % 2 or head_dim > MAX_HEAD_DIM or list(cos.shape) != [qkv.shape[0], head_dim // 2] \
            or cos.shape != sin.shape:
        return None
    cu = paddle.to_tensor(np.asarray(check_cu_seqlens(cu_seqlens, qkv.shape[0]), dtype=np.int64))
    dense = [t if t.is_contiguous() else t.contiguous() for t in (qkv, cos, sin)]
    return load_ops().fd_x86_vision_attention(*dense, cu, int(num_heads), float(scale), num_threads())
