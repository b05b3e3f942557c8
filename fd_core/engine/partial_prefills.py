"""Partial prefills: which waiting requests may start a prefill this step. Pure Python.

A partial prefill is a chunk that stops short of the end of its request's
tokens (chunked prefill). The scheduler allows at most
``max_num_partial_prefills`` of them per step, and at most
``max_long_partial_prefills`` of those "long" (more than the config's
``long_prompt_threshold`` tokens left), so several long prompts cannot take
every step from the short ones queued behind them (vLLM's and FastDeploy's
``--max-num-partial-prefills`` / ``--max-long-partial-prefills``).
"""

from __future__ import annotations

from fd_core.engine.config import SchedulerConfig
from fd_core.engine.request import Request

__all__ = ["PartialPrefills"]


class PartialPrefills:
    """One step's count of partial prefills (chunks that stop short of the end of
    the request's tokens), and of long ones among them."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.max_all = config.max_num_partial_prefills
        self.max_long = config.max_long_partial_prefills
        self.long_threshold = config.long_prompt_threshold
        self.num_all = 0
        self.num_long = 0

    def _kind(self, req: Request, num_computed: int, num_new: int) -> tuple[bool, bool]:
        left = req.num_tokens - num_computed
        return num_new < left, bool(self.long_threshold) and left > self.long_threshold

    def admit(self, req: Request, num_computed: int, num_new: int) -> str:
        """"ok"; "skip" (a long partial prefill with every long slot taken: the next
        waiting request may go); "stop" (every partial slot taken)."""
        partial, long = self._kind(req, num_computed, num_new)
        if not partial:
            return "ok"
        if self.num_all >= self.max_all:
            return "stop"
        if long and self.num_long >= self.max_long:
            return "skip"
        return "ok"

    def count(self, req: Request, num_computed: int, num_new: int) -> None:
        partial, long = self._kind(req, num_computed, num_new)
        self.num_all += partial
        self.num_long += partial and long
