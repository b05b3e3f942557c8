"""The bitmask op (reference, host and device forms) and the manager's reasoning gate."""

from __future__ import annotations

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops.token_bitmask import _paddle_apply, reference_apply_token_bitmask, unpack_bitmask
from fd_core.sampling.guided import GuidedDecodingParams
from fd_core.sampling.reasoning_budget import ThinkingTokens
from fd_core.structured import GrammarVocab, StructuredOutputs

paddle = import_paddle()


def _naive(logits: np.ndarray, mask: np.ndarray, rows: list[int]) -> np.ndarray:
    out = logits.copy()
    for k, r in enumerate(rows):
        for t in range(out.shape[1]):
            w, b = divmod(t, 32)
            if w >= mask.shape[1] or not (int(mask[k, w]) >> b) & 1:
                out[r, t] = -np.inf
    return out


def test_host_and_device_forms_match_the_bit_by_bit_definition():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 100)).astype(np.float32)
    mask = rng.integers(-2**31, 2**31, size=(2, 3), dtype=np.int64).astype(np.int32)  # 96 bits < 100 columns
    expected = _naive(logits, mask, [3, 1])
    host = reference_apply_token_bitmask(paddle.to_tensor(logits), mask, [3, 1]).numpy()
    device = _paddle_apply(paddle.to_tensor(logits), mask, [3, 1]).numpy()
    np.testing.assert_array_equal(host, expected)
    np.testing.assert_array_equal(device, expected)
    assert unpack_bitmask(mask, 100).shape == (2, 100)


def test_the_backend_op_is_bound():
    from fd_core.backends import get_backend

    ops = get_backend("cpu").ops
    out = ops.apply_token_bitmask(paddle.zeros([1, 40]), np.array([[1, 0]], np.int32), [0]).numpy()
    assert np.isfinite(out[0]).nonzero()[0].tolist() == [0]


def _vocab() -> GrammarVocab:
    tokens = [b"<s>", b"</s>", b"</think>", b"a", b"b", b"{", b"}", b'"', b":", b"x"]
    return GrammarVocab.from_token_bytes(tokens, [1], special_ids=[0, 2])


def test_constraint_starts_after_the_reasoning_ends():
    so = StructuredOutputs(_vocab, thinking=ThinkingTokens(end_id=2))
    output: list[int] = []
    so.add("r", GuidedDecodingParams(regex="ab", after_reasoning=True), "req", output, prompt_token_ids=[3])
    ready, failed = so.admit(wait_s=5)
    assert ready == ["req"] and not failed
    assert so.bitmask(["r"]) is None  # still reasoning: unconstrained
    output += [9, 2]  # "x</think>"
    mask, rows = so.bitmask(["r"])  # type: ignore[misc]
    assert rows == [0] and unpack_bitmask(mask, 10)[0].nonzero()[0].tolist() == [3]  # only "a"
    assert so.accept(["r"], [3]) == {}
    assert so.accept(["r"], [4]) == {"r": None}  # "ab": complete, the request stops
    so.rollback("r", 1)


def test_a_refused_token_finishes_only_that_request_with_the_reason():
    so = StructuredOutputs(_vocab)
    so.add("r", GuidedDecodingParams(regex="ab"), "req", [])
    so.admit(wait_s=5)
    so.bitmask(["r"])
    assert "left its grammar" in (so.accept(["r"], [9])["r"] or "")
