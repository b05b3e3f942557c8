"""What the engine hands back: per-request outputs in vLLM/FastDeploy shape.

``EngineCoreOutput`` carries token ids out of the engine core (it crosses a
process boundary in the server, so it is plain data); ``RequestOutput`` is
what users of ``LLM`` and the API layer see, with text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "CompletionOutput",
    "EngineCoreOutput",
    "Logprob",
    "RequestMetrics",
    "RequestOutput",
]


@dataclass
class Logprob:
    """One candidate token at one position."""

    logprob: float
    rank: int | None = None  # 1 = most likely
    decoded_token: str | None = None


# position -> {token id -> Logprob}; the sampled token is always present
PositionLogprobs = dict[int, Logprob]


@dataclass
class EngineCoreOutput:
    """New tokens of one request from one engine step."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[PositionLogprobs] | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None  # set once, with the first token
    finish_reason: str | None = None  # "stop", "length", "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    events: dict[str, float] = field(default_factory=dict)  # "scheduled"/"first_token"/"finished" -> time

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0

    @property
    def time_in_queue(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One of the ``n`` samples of a request."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # streaming: what is new since the previous RequestOutput of this request
    # (text holds back a possible stop-string prefix until it is decided)
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[PositionLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
