"""A step's host inputs as the model takes them: token ids, attention metadata, logits rows.

``ModelRunner.execute`` calls ``step_tensors`` once per step. Most steps
in a serving loop are decode-only (every request adds one token and
samples it); those take ``_decode_only``, which computes the positions and
cache slots in plain Python over the B requests (no numpy scatter, no
cumsum, no row gather) and copies one array to the device: the ids,
positions, slots, sequence lengths and block tables, which the model and
the backends take as views of it (``AttentionMetadata.decode_ints``). Every other step goes through
``AttentionMetadata.build``. Both give the same tensors and metadata and
refuse the same bad steps with the same errors.

A runner passes its ``DecodeBuffers``: a decode-only step then writes its
numbers into the host tensor the last step of the same shape (batch, block
table width) used, and hands out the same tensor views, instead of making a
tensor and four views of it each step (~11 paddle calls' worth of Python,
paid cold after a step's kernels have streamed the weights through the
caches). The step's tensors are valid until the runner's next step, which
is as long as any consumer keeps them (the forward, the backends).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops.attention import AttentionMetadata

if TYPE_CHECKING:
    from fd_core.engine.model_runner import StepInput

__all__ = ["DecodeBuffers", "step_tensors"]

paddle = import_paddle()
_HOST = paddle.CPUPlace()


class DecodeBuffers:
    """A runner's host tensors for decode-only steps, one per (batch, block
    table width), the ``limit`` most recent kept: the one-array form
    ``[ids | positions | slots | seq_lens | block tables [B, W]]`` (int64),
    a numpy view of it that the step writes, the tensor views the step
    hands out (ids, positions, slots, ``decode_ints``) and its query lengths
    (ones)."""

    def __init__(self, limit: int = 8) -> None:
        if limit < 1:
            raise ValueError(f"DecodeBuffers: limit must be >= 1, got {limit}")
        self.limit = limit
        self._entries: OrderedDict[tuple[int, int], tuple[Any, ...]] = OrderedDict()

    def get(self, batch: int, width: int) -> tuple[np.ndarray, Any, Any, Any, Any, np.ndarray]:
        """``(host view, ids, positions, slots, decode_ints, query_lens)`` for a step of this shape."""
        key = (batch, width)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry  # type: ignore[return-value]
        ints = paddle.Tensor(np.zeros(4 * batch + batch * width, dtype=np.int64), _HOST)
        host = np.from_dlpack(ints)  # writes go to the tensor
        entry = (host, ints[:batch], ints[batch: 2 * batch], ints[2 * batch: 3 * batch], ints[batch:],
                 np.ones(batch, dtype=np.int64))
        self._entries[key] = entry
        if len(self._entries) > self.limit:
            self._entries.popitem(last=False)
        return entry


def step_tensors(step: StepInput, block_size: int, vocab_size: int,
                 max_model_len: int, buffers: DecodeBuffers | None = None) -> tuple[Any, AttentionMetadata, Any]:
    """``(input ids [T] int64 tensor, metadata, logits rows [N] int64 tensor or
    None: every row in order)`` for ``step``. Raises ValueError naming a
    sequence longer than ``max_model_len``, a token id outside
    ``[0, vocab_size)`` or a malformed step (``AttentionMetadata.build``'s).
    With ``buffers``, a decode-only step's tensors are ``buffers``' (valid
    until the next step that uses them)."""
    if step.num_reqs == 0:
        raise ValueError("empty step")
    for seq_len in step.seq_lens:
        if seq_len > max_model_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_model_len {max_model_len}")
    if _is_decode_only(step):
        return _decode_only(step, block_size, vocab_size, buffers)
    return _general(step, block_size, vocab_size)


def _is_decode_only(step: StepInput) -> bool:
    """Every request decodes one token and samples it (no prompt logprobs, no images)."""
    return (step.num_decodes == step.num_reqs and not step.mm_inputs
            and (not step.needs_logits or all(step.needs_logits)) and not any(step.all_logits)
            and all(len(t) == 1 for t in step.token_ids))


def _check_ids(ids: list[int] | np.ndarray, vocab_size: int) -> None:
    if len(ids) and (min(ids) < 0 or max(ids) >= vocab_size):
        raise ValueError(f"token id out of range [0, {vocab_size})")


def _decode_only(step: StepInput, block_size: int, vocab_size: int,
                 buffers: DecodeBuffers | None = None) -> tuple[Any, AttentionMetadata, None]:
    ids = [t[0] for t in step.token_ids]
    seq_lens = step.seq_lens
    tables = step.block_tables
    positions = []
    slots = []
    for seq_len, table in zip(seq_lens, tables):
        pos = seq_len - 1
        if pos < 0:
            raise ValueError(f"bad step: query_lens={[1] * len(seq_lens)} seq_lens={list(seq_lens)}")
        block = pos // block_size
        if block >= len(table):
            raise ValueError("a request's block table is too short for its sequence length")
        positions.append(pos)
        slots.append(table[block] * block_size + pos % block_size)
    _check_ids(ids, vocab_size)
    batch = len(ids)
    width = max(len(t) for t in tables) or 1
    # one host array [ids | positions | slots | seq_lens | block tables [B, W]] in one tensor; the
    # ids, positions, slots and the backends' decode_ints are views of it
    if buffers is not None:
        host, ids_t, positions_t, slots_t, decode_ints, query_lens = buffers.get(batch, width)
    else:
        host = np.zeros(4 * batch + batch * width, dtype=np.int64)
        query_lens = np.ones(batch, dtype=np.int64)
    host[: 4 * batch] = [*ids, *positions, *slots, *seq_lens]
    table_array = host[4 * batch:].reshape(batch, width)
    if all(len(t) == width for t in tables):
        table_array[:] = tables
    else:  # padded with 0, the null block
        for i, table in enumerate(tables):
            table_array[i, : len(table)] = table
            table_array[i, len(table):] = 0
    if buffers is None:
        ints = paddle.Tensor(host, _HOST)  # a copy, as paddle.to_tensor makes, without its Python wrappers
        ids_t, positions_t, slots_t, decode_ints = ints[:batch], ints[batch: 2 * batch], \
            ints[2 * batch: 3 * batch], ints[batch:]
    meta = AttentionMetadata(
        num_decodes=step.num_decodes, block_size=block_size,
        query_lens=query_lens, seq_lens=host[3 * batch: 4 * batch],
        block_tables=table_array, positions=positions_t, slot_mapping=slots_t, decode_ints=decode_ints,
    )
    return ids_t, meta, None


def _general(step: StepInput, block_size: int, vocab_size: int) -> tuple[Any, AttentionMetadata, Any]:
    query_lens = [len(t) for t in step.token_ids]
    meta = AttentionMetadata.build(query_lens, step.seq_lens, step.block_tables, block_size, step.num_decodes)
    flat = np.fromiter((t for ids in step.token_ids for t in ids), dtype=np.int64, count=sum(query_lens))
    if flat.size:
        _check_ids([int(flat.min()), int(flat.max())], vocab_size)
    needs = step.needs_logits or [True] * step.num_reqs
    ends = np.cumsum(query_lens)
    if any(step.all_logits):
        logits_rows = np.concatenate([
            np.arange(end - qlen, end) if whole else (np.array([end - 1]) if need else np.array([], dtype=np.int64))
            for qlen, end, need, whole in zip(query_lens, ends, needs, step.all_logits)
        ])
    else:
        logits_rows = (ends - 1)[np.asarray(needs, dtype=bool)]
    # every row in order (a decode-only step): no gather of the hidden states
    whole = len(logits_rows) == len(flat) and bool((logits_rows == np.arange(len(flat))).all())
    rows = None if whole else paddle.to_tensor(logits_rows.astype(np.int64))
    return paddle.to_tensor(flat), meta, rows
