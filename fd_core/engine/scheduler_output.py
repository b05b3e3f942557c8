"""What ``Scheduler.schedule`` hands the engine core for one step, and what
``Scheduler.update_from_output`` hands back. Plain dataclasses, pure Python.

The engine core builds the runner's ``StepInput`` from ``SchedulerOutput``
one to one: ``token_ids``, ``seq_len``, ``block_ids`` and ``samples`` of each
``ScheduledRequest`` in order, and ``num_decodes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from fd_core.engine.request import Request

__all__ = ["RequestUpdate", "ScheduledRequest", "SchedulerOutput", "SchedulerStats"]


@dataclass
class ScheduledRequest:
    """One request's share of a step."""

    request_id: str
    token_ids: list[
        int
    ]  # the tokens computed this step: all_token_ids[num_computed_tokens:seq_len]
    num_computed_tokens: int  # tokens already in the KV cache before this step
    block_ids: list[int]  # the request's whole block table after this step's allocation
    # the step computes the request's last known token: return its logits and
    # sample (False for a prefill chunk that does not finish the prompt)
    samples: bool
    # speculative decoding: the last token_ids are this many draft tokens to verify
    # (the step returns logits for every new token, and keeps only the verified ones)
    num_draft_tokens: int = 0
    # multi-step decoding (a decode only): forward steps this schedule runs, each feeding the token
    # sampled by the one before; the KV slots of all of them are allocated (block_ids)
    num_steps: int = 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Tokens in the KV cache after this step (StepInput.seq_lens)."""
        return self.num_computed_tokens + len(self.token_ids)


@dataclass
class SchedulerOutput:
    """One step. The runner copies ``swap_out``, then ``swap_in``, then runs the
    forward over ``scheduled`` (which may be empty when only copies are due)."""

    # decodes (exactly one new token) first, then decodes with draft tokens
    # (speculative decoding), then prefill chunks; within each group running
    # requests in admission order, then newly admitted ones
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_decodes: int = 0  # scheduled[:num_decodes] are decodes
    # request id -> new tokens this step
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0  # sum of num_scheduled_tokens; <= max_num_batched_tokens
    preempted_req_ids: list[str] = field(default_factory=list)  # sent back to waiting this step
    # finished or aborted since the previous step: the runner may drop their state
    finished_req_ids: list[str] = field(default_factory=list)
    # (device block, host block): copy first, before swap_in and the forward
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    # (host block, device block): copy second, after every swap_out
    swap_in: list[tuple[int, int]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        """Nothing to copy and nothing to run."""
        return not (self.scheduled or self.swap_out or self.swap_in)


class RequestUpdate(NamedTuple):
    """One request's result of a step, from ``update_from_output``."""

    request: Request
    new_token_ids: list[int]  # appended this step (after a stop, none of the rest)
    finished: bool  # request.finish_reason / stop_reason say why


@dataclass
class SchedulerStats:
    """A snapshot for metrics (``Scheduler.make_stats``)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of usable KV blocks held by requests
    prefix_cache_queries: int  # tokens, total since start
    prefix_cache_hits: int  # tokens, total since start (host-tier hits included)
    num_preemptions: int  # total since start
    num_swap_outs: int  # blocks, total since start
    num_swap_ins: int  # blocks, total since start
    step_num_scheduled_tokens: int  # last step
    step_num_prefill_tokens: int  # last step
    step_num_decodes: int  # last step
    prefix_cache_host_hits: int = 0  # tokens, total since start, of the hits found only on host
    num_preempted: int = 0  # waiting requests preempted now, to be recomputed
    num_free_blocks: int = 0  # blocks a request can get now (cached free ones included)
    num_free_uncached_blocks: int = 0  # of which hold no cached prefix
    num_cached_blocks: int = 0  # blocks holding a cached prefix, in use or free
