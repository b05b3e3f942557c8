"""``FdScriptedForCausalLM``: answers the checkpoint's script, one token per step.

The model keeps each sequence's token ids in its own KV cache: layer 0's K
row of a token's slot is filled with the token id, so a sequence's history
is read back through its block table. For a logits row at position ``p``,
the next token is ``script[k]`` where ``k`` counts the tokens after the last
occurrence of the marker in positions ``0..p``; past the script's end it is
the end token. The history lives wherever the engine keeps the sequence's
KV, so the answer is the same under batching, chunked prefill, prefix
caching, swapping and preemption (recompute), like a real model's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.layers.param import Param
from fd_core.model_loader.loader import CheckpointError
from fd_core.models.config import ModelConfig
from fd_core.models.ernie4_5 import Target
from fd_scripted_model.checkpoint import MARKER_TENSOR, SCRIPT_TENSOR

__all__ = ["ScriptedModel"]

paddle = import_paddle()

LOGIT = 100.0  # at the scripted token; 0 elsewhere: greedy and sampling agree


class ScriptedModel:
    def __init__(self, config: ModelConfig, ops: Any, max_position: int | None = None) -> None:
        self.config = config
        self.ops = ops
        capacity = config.max_position_embeddings
        self.script = Param((capacity,))  # script ids, end id, then -1
        self.marker = Param((capacity,))  # marker ids, then -1
        self._script: list[int] = []
        self._marker: list[int] = []

    def parameters(self) -> dict[str, Param]:
        return {"script": self.script, "marker": self.marker}

    def checkpoint_targets(self, naming: str) -> dict[str, list[Target]]:
        if naming != "pytorch":
            raise CheckpointError("a scripted checkpoint holds 'model.' tensors only")
        shape = (self.config.max_position_embeddings,)
        return {SCRIPT_TENSOR: [Target(self.script, shape)], MARKER_TENSOR: [Target(self.marker, shape)]}

    def finish_loading(self) -> None:
        def ids(param: Param) -> list[int]:
            values = param.data.numpy()
            return [int(round(v)) for v in values[values >= 0]]

        self._script, self._marker = ids(self.script), ids(self.marker)
        if not self._script or not self._marker:
            raise CheckpointError("a scripted checkpoint needs a script and a marker")

    def next_token(self, history: list[int]) -> int:
        """The token after ``history`` (the sequence up to and including the
        current position)."""
        n = len(self._marker)
        for start in range(len(history) - n, -1, -1):
            if history[start : start + n] == self._marker:
                k = len(history) - (start + n)
                return self._script[min(k, len(self._script) - 1)]
        return self._script[-1]  # no marker: end at once

    def _history(self, cache: Any, meta: Any, b: int) -> list[int]:
        length = int(meta.seq_lens[b])
        bs = meta.block_size
        j = np.arange(length)
        slots = meta.block_tables[b, j // bs] * bs + j % bs
        rows = paddle.gather(cache.k, paddle.to_tensor(slots.astype(np.int64), place=cache.k.place))
        return [int(round(v)) for v in rows[:, 0, 0].astype("float32").numpy()]

    def forward(self, input_ids: Any, meta: Any, caches: list[Any], logits_indices: Any) -> Any:
        """``input_ids [T]`` -> logits ``[N, V]`` at rows ``logits_indices [N]``."""
        cache = caches[0]
        num_tokens = int(input_ids.shape[0])
        _, num_kv, head_dim = cache.k.shape
        k = input_ids.astype("float32").reshape([num_tokens, 1, 1]).expand([num_tokens, num_kv, head_dim])
        self.ops.write_kv_cache(k, k, cache.k, cache.v, meta.slot_mapping)
        if logits_indices is None:
            rows = np.arange(num_tokens)
        else:
            rows = logits_indices.numpy()
        if rows.size == 0:
            return None
        request_of = np.repeat(np.arange(meta.num_reqs), meta.query_lens)
        positions = meta.positions.numpy()
        histories: dict[int, list[int]] = {}
        next_ids = []
        for row in rows:
            b = int(request_of[row])
            if b not in histories:
                histories[b] = self._history(cache, meta, b)
            next_ids.append(self.next_token(histories[b][: int(positions[row]) + 1]))
        hot = paddle.nn.functional.one_hot(paddle.to_tensor(next_ids, dtype="int64"), self.config.vocab_size)
        return hot.astype("float32") * LOGIT
