"""fd_x86's native token-bitmask op against fd-core's reference (the conformance
case test_apply_token_bitmask covers small shapes; these add the model-sized
vocabulary over threads, unordered rows and the fallbacks)."""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")


def _case(rows: int, vocab: int, words: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (rows, vocab)).astype(np.float32)
    return logits, rng.integers(-2**31, 2**31, (rows, words), dtype=np.int64).astype(np.int32)


@pytest.mark.parametrize("n, vocab, words, rows", [
    (32, 103424, 3232, list(range(32))),  # ERNIE's vocabulary, every row, over threads
    (6, 1000, 32, [5, 0, 3]),  # rows out of order; the mask covers 1024 > 1000 columns
    (3, 1000, 20, [1]),  # the mask stops at 640: the rest is forbidden
])
def test_native_mask_equals_the_reference(n, vocab, words, rows):
    from fd_x86.bitmask import apply_token_bitmask

    from fd_core.ops.token_bitmask import reference_apply_token_bitmask

    logits, mask = _case(n, vocab, words)
    mask = mask[: len(rows)]
    want = reference_apply_token_bitmask(paddle.to_tensor(logits.copy()), mask, rows).numpy()
    got = paddle.to_tensor(logits.copy())
    assert apply_token_bitmask(got, mask, rows) is got  # in place
    np.testing.assert_array_equal(got.numpy(), want)


def test_what_the_native_op_does_not_take_falls_back_or_is_refused():
    from fd_x86.bitmask import apply_token_bitmask

    logits, mask = _case(2, 64, 2)
    assert apply_token_bitmask(paddle.to_tensor(logits).astype("float16"), mask, [0, 1]) is None
    assert apply_token_bitmask(paddle.to_tensor(logits).T, mask, [0, 1]) is None  # not contiguous
    with pytest.raises(ValueError, match="2 rows but 1"):
        apply_token_bitmask(paddle.to_tensor(logits), mask, [0])
    with pytest.raises(Exception, match="outside"):
        apply_token_bitmask(paddle.to_tensor(logits), mask, [0, 7])
