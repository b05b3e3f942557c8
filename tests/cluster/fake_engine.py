"""A model-free EngineClient for the scheduler tests: each request yields ``steps``
outputs, ``delay`` seconds apart; token i of a request is ``prompt[0] + i``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fd_core.engine.client import EngineClient, EngineDeadError, EngineInfo, EngineStats
from fd_core.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from fd_core.sampling.params import SamplingParams


class FakeEngine(EngineClient):
    def __init__(self, capacity: int = 2, steps: int = 4, delay: float = 0.02) -> None:
        self.tokenizer = None
        self.info = EngineInfo("fake", 512, 1000, 64, 16, "none", max_num_seqs=capacity)
        self.steps, self.delay = steps, delay
        self.ran: list[str] = []  # tickets, in the order they started
        self.running = 0
        self.dead = False
        self.shut = False

    async def generate(self, request_id: str, prompt: Any, params: SamplingParams,
                       arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        if self.dead:
            raise EngineDeadError("fake engine is dead")
        self.ran.append(request_id)
        self.running += 1
        try:
            metrics = RequestMetrics(arrival_time or time.time())
            ids: list[int] = []
            for i in range(self.steps):
                await asyncio.sleep(self.delay)
                if self.dead:
                    raise EngineDeadError("fake engine died")
                token = prompt[0] + i
                ids.append(token)
                last = i == self.steps - 1
                sample = CompletionOutput(0, f"t{token}", list(ids), finish_reason="length" if last else None,
                                          delta_text=f"t{token}", delta_token_ids=[token])
                yield RequestOutput(request_id, None, list(prompt), [sample], last, metrics)
        finally:
            self.running -= 1

    async def abort(self, request_id: str) -> None:
        pass

    async def check_health(self) -> None:
        if self.dead:
            raise EngineDeadError("fake engine is dead")

    def stats(self) -> EngineStats:
        return EngineStats(num_running=self.running, num_free_blocks=100, time=time.time())

    async def shutdown(self) -> None:
        self.shut = True
