"""A scripted EngineClient: yields outputs whose text is given piece by piece.

For tests of what the API layer does with text (parsers, streaming shape)
independent of what a random tiny model happens to generate.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fd_core.engine.client import EngineClient, EngineDeadError, EngineInfo, EngineStats
from fd_core.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from fd_core.sampling.params import SamplingParams


class ScriptedEngineClient(EngineClient):
    def __init__(self, tokenizer: Any, pieces: list[str], finish_reason: str = "stop") -> None:
        self.tokenizer = tokenizer
        self.info = EngineInfo("scripted", 512, len(tokenizer), 64, 16, "none")
        self.pieces = pieces
        self.finish_reason = finish_reason
        self.dead = False
        self.prompts: list[list[int]] = []

    async def generate(self, request_id: str, prompt: Any, params: SamplingParams,
                       arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        if self.dead:
            raise EngineDeadError("scripted engine is dead")
        self.prompts.append(list(prompt))
        metrics = RequestMetrics(arrival_time or time.time(), first_scheduled_time=time.time())
        samples = [CompletionOutput(i, "", []) for i in range(params.n)]
        for step, piece in enumerate(self.pieces):
            ids = self.tokenizer.encode(piece)
            last = step == len(self.pieces) - 1
            now = time.time()
            metrics.first_token_time = metrics.first_token_time or now
            metrics.last_token_time = now
            metrics.num_generation_tokens += len(ids) * params.n
            outs = []
            for s in samples:
                s.text += piece
                s.token_ids = s.token_ids + ids
                outs.append(CompletionOutput(s.index, s.text, list(s.token_ids),
                                             finish_reason=self.finish_reason if last else None,
                                             delta_text=piece, delta_token_ids=ids))
            if last:
                metrics.finished_time = now
            yield RequestOutput(request_id, None, list(prompt), outs, last, metrics)

    async def abort(self, request_id: str) -> None:
        pass

    async def check_health(self) -> None:
        if self.dead:
            raise EngineDeadError("scripted engine is dead")

    def stats(self) -> EngineStats:
        return EngineStats()

    async def shutdown(self) -> None:
        pass
