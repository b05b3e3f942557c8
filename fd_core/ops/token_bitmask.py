"""Applying a packed token bitmask to logits (structured output).

``bitmask [M, W]`` int32 (numpy): bit ``j`` of word ``w`` of row ``k``
allows token ``32 * w + j`` for logits row ``rows[k]``; every token whose bit
is clear, and every column past ``32 * W``, becomes ``-inf``. Rows not in
``rows`` are untouched. The reference unpacks the whole mask with one
``numpy.unpackbits`` (CPU tensors) or one shift-and-and (paddle, other
devices) and writes the rows in place: no loop over tokens or rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops._host import as_array, on_host

__all__ = ["reference_apply_token_bitmask", "unpack_bitmask"]

paddle = import_paddle()


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """``[M, W]`` int32 -> ``[M, vocab_size]`` bool (True = allowed)."""
    words = np.ascontiguousarray(bitmask, dtype=np.int32)
    bits = np.unpackbits(words.view(np.uint8), axis=1, count=min(vocab_size, words.shape[1] * 32),
                         bitorder="little")
    allowed = bits.view(bool)
    if allowed.shape[1] < vocab_size:
        allowed = np.pad(allowed, ((0, 0), (0, vocab_size - allowed.shape[1])))
    return allowed


def reference_apply_token_bitmask(logits: Any, bitmask: np.ndarray, rows: Sequence[int]) -> Any:
    """Mask ``logits [N, V]`` (fp32) in place for ``rows``; returns ``logits``."""
    if len(rows) != bitmask.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows but {len(rows)} logits rows were named")
    if len(rows) == 0:
        return logits
    if on_host(logits):
        allowed = unpack_bitmask(bitmask, int(logits.shape[1]))
        arr = as_array(logits)
        idx = np.asarray(rows, dtype=np.int64)
        if len(idx) == arr.shape[0] and (idx == np.arange(len(idx))).all():
            np.putmask(arr, ~allowed, -np.inf)
        else:
            sub = arr[idx]
            np.putmask(sub, ~allowed, -np.inf)
            arr[idx] = sub
        return logits
    return _paddle_apply(logits, bitmask, rows)


def _paddle_apply(logits: Any, bitmask: np.ndarray, rows: Sequence[int]) -> Any:
    """The device form: one shift-and-and unpacks the mask; the rows are gathered,
    masked and scattered back (a new tensor)."""
    vocab = int(logits.shape[1])
    idx = paddle.to_tensor(np.asarray(rows, dtype=np.int64))
    words = paddle.to_tensor(np.ascontiguousarray(bitmask, dtype=np.int32))
    shifts = paddle.arange(32, dtype="int32")
    shifted = words.unsqueeze(-1) >> shifts
    bits = paddle.bitwise_and(shifted, paddle.ones_like(shifted)).reshape([words.shape[0], -1])[:, :vocab]
    if bits.shape[1] < vocab:  # columns past the mask are forbidden
        bits = paddle.concat([bits, paddle.zeros([bits.shape[0], vocab - bits.shape[1]], bits.dtype)], axis=1)
    sub = paddle.gather(logits, idx)
    sub = paddle.where(bits.astype("bool"), sub, paddle.full_like(sub, -float("inf")))
    return paddle.scatter(logits, idx, sub, overwrite=True)
