"""Structured output's token mask on x86: ``fd_apply_token_bitmask`` natively.

Called by ``fd_x86.backend.fd_apply_token_bitmask`` (the hook the sampler
reaches through ``Ops.apply_token_bitmask``) once per step with the step's
logits and the int32 bitmask ``StructuredOutputs.bitmask`` filled. The C++ op
(``csrc/x86_bitmask_op.cc``) writes -inf over the forbidden tokens of the
named rows in place, one masked AVX-512 store per 16 tokens (a plain loop on
other CPUs), never reading the logits; the reference unpacks the whole mask
to bytes first (4 ms vs ~0.1 ms for 8 rows of a 103k vocabulary: README
"Structured output"). Returns None (the reference answers) for logits that
are not a 2-D fp32 CPU tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops

__all__ = ["apply_token_bitmask"]


def apply_token_bitmask(logits: Any, bitmask: np.ndarray, rows: Sequence[int]) -> Any:
    """``logits [N, V]`` with the tokens ``bitmask [M, W]`` clears set to -inf in
    ``rows`` (in place), or None when the native op does not take these logits."""
    import paddle

    if (not isinstance(logits, paddle.Tensor) or logits.dtype != paddle.float32 or len(logits.shape) != 2
            or not logits.place.is_cpu_place() or not logits.is_contiguous()):
        return None
    if len(rows) != bitmask.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows but {len(rows)} logits rows were named")
    if len(rows) == 0:
        return logits
    words = paddle.to_tensor(np.ascontiguousarray(bitmask, dtype=np.int32))
    idx = paddle.to_tensor(np.asarray(rows, dtype=np.int64))
    load_ops().fd_x86_apply_token_bitmask(logits, words, idx, num_threads())
    return logits
