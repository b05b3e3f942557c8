"""The decode-only fast path of ``step_tensors`` gives what the general path gives."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.engine import step_tensors as st
from fd_core.engine.model_runner import StepInput

BLOCK = 4
VOCAB = 100


def _general(step: StepInput) -> tuple:
    return st._general(step, BLOCK, VOCAB)


def _values(result: tuple) -> dict:
    ids, meta, rows = result
    return {
        "ids": ids.numpy().tolist(), "positions": meta.positions.numpy().tolist(),
        "slots": meta.slot_mapping.numpy().tolist(), "tables": meta.block_tables.tolist(),
        "seq_lens": meta.seq_lens.tolist(), "query_lens": meta.query_lens.tolist(),
        "num_decodes": meta.num_decodes, "block_size": meta.block_size,
        "rows": None if rows is None else rows.numpy().tolist(),
        "dtypes": (str(ids.dtype), str(meta.positions.dtype), str(meta.slot_mapping.dtype),
                   meta.block_tables.dtype, meta.seq_lens.dtype, meta.query_lens.dtype),
    }


def _decode_step(rng: np.random.Generator, batch: int, ragged: bool) -> StepInput:
    seq_lens = [int(s) for s in rng.integers(1, 30, batch)]
    tables = []
    for s in seq_lens:
        need = -(-s // BLOCK) + (int(rng.integers(0, 3)) if ragged else 0)
        tables.append([int(b) for b in rng.integers(1, 50, need)])
    if not ragged:  # equal lengths: the one-array form
        width = max(len(t) for t in tables)
        tables = [t + [7] * (width - len(t)) for t in tables]
    return StepInput([[int(rng.integers(0, VOCAB))] for _ in range(batch)], seq_lens, tables, batch,
                     [True] * batch)


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_decode_only_matches_general(batch: int, ragged: bool) -> None:
    rng = np.random.default_rng(batch * 2 + ragged)
    for _ in range(5):
        step = _decode_step(rng, batch, ragged)
        assert st._is_decode_only(step)
        fast = st.step_tensors(step, BLOCK, VOCAB, 64)
        assert _values(fast) == _values(_general(step))
        assert fast[2] is None  # every row in order: no gather


def test_steps_that_are_not_decode_only_take_the_general_path() -> None:
    lens, tables = [5, 9], [[1, 2], [3, 4, 5]]
    steps = [
        StepInput([[1], [2, 3, 4]], lens, tables, 1),  # a prefill
        StepInput([[1], [2]], lens, tables, 2, needs_logits=[True, False]),
        StepInput([[1], [2]], lens, tables, 2, all_logits=[False, True]),
        StepInput([[1], [2]], lens, tables, 2, mm_inputs=[None, None]),
    ]
    for step in steps:
        assert not st._is_decode_only(step)
        assert _values(st.step_tensors(step, BLOCK, VOCAB, 64)) == _values(_general(step))
    assert st.step_tensors(steps[1], BLOCK, VOCAB, 64)[2].numpy().tolist() == [0]


@pytest.mark.parametrize("step, message", [
    (StepInput([[1]], [70], [[1] * 18], 1), "sequence length 70 exceeds max_model_len 64"),
    (StepInput([[100]], [5], [[1, 2]], 1), r"token id out of range \[0, 100\)"),
    (StepInput([[-1]], [5], [[1, 2]], 1), r"token id out of range \[0, 100\)"),
    (StepInput([[1]], [9], [[1, 2]], 1), "block table is too short"),
    (StepInput([[1]], [0], [[1, 2]], 1), "bad step"),
    (StepInput([], [], [], 0), "empty step"),
])
def test_bad_decode_steps_are_refused_as_before(step: StepInput, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        st.step_tensors(step, BLOCK, VOCAB, 64)
    if step.num_reqs and "max_model_len" not in message:
        with pytest.raises(ValueError, match=message):
            _general(step)


@pytest.mark.parametrize("ragged", [False, True])
def test_reused_buffers_give_what_the_general_path_gives(ragged: bool) -> None:
    """A runner's DecodeBuffers: every step of a shape writes the same host tensor, and
    what a step hands out equals the general path's, whatever the last step wrote there
    (a ragged table's padding is 0 again, not the last step's blocks)."""
    rng = np.random.default_rng(7 + ragged)
    buffers = st.DecodeBuffers(limit=2)
    pointers: dict[tuple[int, int], int] = {}
    for _ in range(40):
        step = _decode_step(rng, int(rng.integers(1, 4)), ragged)
        key = (len(step.seq_lens), max(len(t) for t in step.block_tables))
        cached = key in buffers._entries
        ids, meta, rows = st.step_tensors(step, BLOCK, VOCAB, 64, buffers)
        assert _values((ids, meta, rows)) == _values(_general(step))
        if cached:
            assert ids.data_ptr() == pointers[key]  # the same tensor as this shape's last step
        pointers[key] = ids.data_ptr()
        assert len(buffers._entries) <= 2


def test_decode_buffers_limit_is_checked() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1, got 0"):
        st.DecodeBuffers(limit=0)
