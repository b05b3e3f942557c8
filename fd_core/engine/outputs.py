"""What the engine hands back: per-request outputs in vLLM/FastDeploy shape.

``EngineCoreOutput`` carries token ids out of the engine core (it crosses a
process boundary in the server, so it is plain data); ``RequestOutput`` is
what users of ``LLM`` and the API layer see, with text.

One result serves both offline styles: ``RequestOutput.outputs`` is a list of
the ``n`` samples (vLLM: ``output.outputs[0].text``) that also answers the
first sample's attributes itself (FastDeploy: ``output.outputs.text``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CompletionOutput",
    "CompletionOutputs",
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
    # speculative decoding, this step: draft tokens verified and of them accepted
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # the request failed outside the model (its KV transfer, fd_core.disagg): the reason; the
    # finish_reason is "abort" and the API answers an error (502) rather than an empty completion
    error: str | None = None
    events: dict[str, float] = field(default_factory=dict)  # "scheduled"/"first_token"/"finished" -> time
    # prefill/decode disaggregation (fd_core.disagg), on the output with the first token: KV bytes
    # received from the prefill instance for this request, and the transfer's seconds (task sent -> KV
    # written, less the prefill side's queue and compute)
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Times (``time.time()`` seconds) of one request; FastDeploy's names are properties."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0
    # speculative decoding: draft tokens verified for the request, and of them accepted
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # prefill/decode disaggregation: KV bytes received from the prefill instance, and the seconds the
    # transfer cost (task sent -> KV written here, less the prefill side's queue and compute)
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0

    @property
    def draft_acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (None when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    def speculate_metrics(self) -> dict[str, float | int] | None:
        """FastDeploy's per-request ``speculate_metrics`` (None when nothing was
        drafted). ``accepted_tokens`` are the tokens the request produced (each
        step's target token plus its accepted drafts, FastDeploy's meaning);
        ``rejected_tokens`` the drafts verified and refused; ``accept_ratio``
        the share of produced tokens that were accepted drafts;
        ``average_accept_length`` tokens per target step. fd-core adds the raw
        counts: ``draft_tokens`` verified and ``draft_acceptance_rate``."""
        if not self.num_draft_tokens:
            return None
        produced, accepted = self.num_generation_tokens, self.num_accepted_tokens
        steps = max(produced - accepted, 1)
        return {"accepted_tokens": produced, "rejected_tokens": self.num_draft_tokens - accepted,
                "accept_ratio": accepted / produced if produced else 0.0,
                "average_accept_length": produced / steps,
                "draft_tokens": self.num_draft_tokens, "draft_acceptance_rate": accepted / self.num_draft_tokens}

    @property
    def time_in_queue(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def request_start_time(self) -> float:
        """FastDeploy's name: when the request was accepted (= ``arrival_time``)."""
        return self.arrival_time

    @property
    def inference_start_time(self) -> float | None:
        """FastDeploy's name: when the request was first scheduled (= ``first_scheduled_time``)."""
        return self.first_scheduled_time

    @property
    def model_execute_time(self) -> float | None:
        """FastDeploy's name: seconds from first scheduling to the last token."""
        end = self.finished_time or self.last_token_time
        if end is None or self.first_scheduled_time is None:
            return None
        return end - self.first_scheduled_time

    @property
    def model_forward_time(self) -> None:
        """FastDeploy's name; forward time is not measured per request here: always None."""
        return None


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
    # LLM.chat with --reasoning-parser / --tool-call-parser (as the server's message):
    # text is then the content part only
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI "tool_calls" entries
    reasoning_token_num: int = 0  # output tokens up to the end of the reasoning part
    # FastDeploy's: where this output's token_ids start in the whole output
    # (0 for a whole result; LLM.generate(stream=True) chunks: the chunk's offset)
    send_idx: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def draft_token_ids(self) -> list[int]:
        """FastDeploy's name: speculative draft tokens; fd-core does not report drafts (only
        their counts, in ``RequestOutput.metrics``), so empty."""
        return []


def _first(name: str) -> property:
    """A property of ``CompletionOutputs`` that reads/writes ``name`` of the first sample."""

    def get(self: CompletionOutputs) -> Any:
        return getattr(self._sample(name), name)

    def set_(self: CompletionOutputs, value: Any) -> None:
        setattr(self._sample(name), name, value)

    return property(get, set_, doc=f"``self[0].{name}`` (FastDeploy's single-sample access)")


class CompletionOutputs(list[CompletionOutput]):
    """The samples of a request: a list that also reads as its first sample.

    ``outputs[0].text``, ``len(outputs)``, ``for c in outputs`` and slicing
    work as on a list (vLLM); ``outputs.text``, ``outputs.token_ids``,
    ``outputs.reasoning_content``, ... read (and set) the first sample's
    field (FastDeploy, whose ``outputs`` is one ``CompletionOutput``). With
    ``n > 1`` the attribute form sees sample 0 only. ``outputs.index`` is
    the first sample's index (FastDeploy's field), so the list method
    ``index()`` is not available here: use ``list(outputs).index(x)``.
    """

    __slots__ = ()  # no instance state beyond the list: pickles and copies as a list

    def _sample(self, name: str) -> CompletionOutput:
        if not self:
            raise AttributeError(f"outputs.{name}: this request has no samples")
        return self[0]

    index = _first("index")  # type: ignore[assignment]
    text = _first("text")
    token_ids = _first("token_ids")
    cumulative_logprob = _first("cumulative_logprob")
    logprobs = _first("logprobs")
    finish_reason = _first("finish_reason")
    stop_reason = _first("stop_reason")
    delta_text = _first("delta_text")
    delta_token_ids = _first("delta_token_ids")
    delta_logprobs = _first("delta_logprobs")
    reasoning_content = _first("reasoning_content")
    tool_calls = _first("tool_calls")
    reasoning_token_num = _first("reasoning_token_num")
    finished = _first("finished")
    send_idx = _first("send_idx")
    draft_token_ids = _first("draft_token_ids")


@dataclass
class RequestOutput:
    """One request's result (or, streaming, its state so far).

    ``outputs`` is always a ``CompletionOutputs`` (a plain list given here is
    wrapped). ``error_code``/``error_msg`` are FastDeploy's fields: a prompt
    the engine cannot serve is refused when it is added (``LLM.generate``
    raises naming its index), so a returned output is 200 / None, except a
    request that failed outside the model (a prefill instance's KV transfer,
    ``fd_core.disagg``): 502 and the reason (the API answers it as an error).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
    error_code: int = 200
    error_msg: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.outputs, CompletionOutputs):
            self.outputs = CompletionOutputs(self.outputs)
