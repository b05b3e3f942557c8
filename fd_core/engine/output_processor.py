"""Turning engine-core token ids into text: detokenize, stop strings, n > 1.

Runs next to the tokenizer (the offline ``LLMEngine``, or the API process
of the server), never next to the model. A stop string found in the text
finishes its request here; the caller then aborts it in the engine core.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fd_core.engine.outputs import CompletionOutput, EngineCoreOutput, RequestMetrics, RequestOutput
from fd_core.tokenizer.detokenizer import IncrementalDetokenizer

__all__ = ["OutputProcessor", "child_request_id"]


def child_request_id(parent_id: str, index: int, n: int) -> str:
    """Engine-core id of sample ``index`` of a request with ``n`` samples."""
    return parent_id if n == 1 else f"{index}_{parent_id}"


@dataclass
class _Sample:
    """Text state of one sample (one engine-core request)."""

    index: int
    detokenizer: IncrementalDetokenizer
    stop: list[str]
    include_stop: bool
    min_tokens: int
    text: str = ""
    sent_chars: int = 0  # characters already handed out as deltas (streaming)
    sent_tokens: int = 0  # tokens already handed out as deltas
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    longest_stop: int = field(init=False)  # characters in the longest stop string (0: none)

    def __post_init__(self) -> None:
        self.longest_stop = max(map(len, self.stop), default=0)

    def add(self, out: EngineCoreOutput) -> bool:
        """Append new tokens; returns True if a stop string finished it. Several tokens at once (multi-step
        decoding, speculative decoding) are taken one at a time where the request has stop strings: the text
        and the tokens end at the token that completes a stop string, as with one token a step, and the
        tokens after it (computed before the stop was seen) are dropped."""
        ids, logprobs = out.new_token_ids, out.new_logprobs
        if self.stop and len(ids) > 1:
            for i in range(len(ids)):
                last = i == len(ids) - 1
                if self._take(ids[i:i + 1], None if logprobs is None else logprobs[i:i + 1], out.finished and last):
                    return True
        elif self._take(ids, logprobs, out.finished):
            return True
        if out.finished:
            self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason
        return False

    def _take(self, ids: list[int], logprobs: list[Any] | None, finished: bool) -> bool:
        """Append ``ids`` (the request's last tokens when ``finished``); True if a stop string now ends it."""
        self.token_ids.extend(ids)
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + logprobs
            for tok, entry in zip(ids, logprobs):
                self.cumulative_logprob += entry[tok].logprob
        delta = self.detokenizer.add(ids)
        if finished:
            delta += self.detokenizer.finish()
        start = max(0, len(self.text) - self.longest_stop + 1)
        self.text += delta
        if self.stop and delta and len(self.token_ids) >= self.min_tokens:
            hits = [(self.text.find(s, start), s) for s in self.stop]
            hits = [(pos, s) for pos, s in hits if pos >= 0]
            if hits:
                pos, s = min(hits)
                self.text = self.text[: pos + len(s) if self.include_stop else pos]
                self.finish_reason, self.stop_reason = "stop", s
                return True
        return False

    def take_delta(self) -> str:
        """Text not handed out yet, holding back a possible stop-string prefix."""
        end = len(self.text)
        if self.finish_reason is None and self.stop:
            end = max(self.sent_chars, end - (self.longest_stop - 1))
        delta, self.sent_chars = self.text[self.sent_chars : end], end
        return delta

    def completion(self) -> CompletionOutput:
        start, self.sent_tokens = self.sent_tokens, len(self.token_ids)
        return CompletionOutput(
            index=self.index,
            text=self.text,
            token_ids=list(self.token_ids),
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            delta_text=self.take_delta(),
            delta_token_ids=self.token_ids[start:],
            delta_logprobs=self.logprobs[start:] if self.logprobs is not None else None,
        )


@dataclass
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    samples: list[_Sample]
    metrics: RequestMetrics
    prompt_logprobs: Any = None
    num_cached_tokens: int = 0
    error: str | None = None  # a sample failed outside the model (EngineCoreOutput.error)

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)


class OutputProcessor:
    """Per-request text state for every request in flight."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._parents: dict[str, _Parent] = {}
        self._child_to_parent: dict[str, tuple[_Parent, _Sample]] = {}

    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: Any,
        arrival_time: float | None = None,
    ) -> list[str]:
        """Track a request; returns the engine-core ids of its ``n`` samples."""
        if request_id in self._parents:
            raise ValueError(f"request id {request_id!r} is already in flight")
        stop = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        samples = [
            _Sample(
                index=i,
                detokenizer=IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
                stop=stop,
                include_stop=params.include_stop_str_in_output,
                min_tokens=params.min_tokens,
            )
            for i in range(params.n)
        ]
        parent = _Parent(request_id, prompt, list(prompt_token_ids), samples,
                         RequestMetrics(arrival_time or time.time()))
        self._parents[request_id] = parent
        ids = []
        for sample in samples:
            child = child_request_id(request_id, sample.index, params.n)
            self._child_to_parent[child] = (parent, sample)
            ids.append(child)
        return ids

    def parent_of(self, child_id: str) -> str | None:
        """The user-facing request id of an engine-core request id."""
        found = self._child_to_parent.get(child_id)
        return None if found is None else found[0].request_id

    def child_ids(self, request_id: str) -> list[str]:
        return [c for c, (p, _) in self._child_to_parent.items() if p.request_id == request_id]

    def process(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Apply engine outputs; returns (updated requests' outputs, engine-core
        ids that a stop string finished and the caller must abort)."""
        now = time.time()
        touched: dict[str, _Parent] = {}
        to_abort: list[str] = []
        for out in outputs:
            found = self._child_to_parent.get(out.request_id)
            if found is None:
                continue  # aborted meanwhile
            parent, sample = found
            if sample.finish_reason is not None:
                continue
            m = parent.metrics
            m.first_scheduled_time = m.first_scheduled_time or out.events.get("scheduled", now)
            if out.new_token_ids:
                m.first_token_time = m.first_token_time or now
                m.last_token_time = now
            m.num_draft_tokens += out.num_draft_tokens
            m.kv_transfer_bytes += out.kv_transfer_bytes
            m.kv_transfer_seconds += out.kv_transfer_seconds
            if out.prompt_logprobs is not None:
                parent.prompt_logprobs = out.prompt_logprobs
            parent.num_cached_tokens = max(parent.num_cached_tokens, out.num_cached_tokens)
            parent.error = parent.error or out.error
            before = len(sample.token_ids)
            if sample.add(out) and not out.finished:
                to_abort.append(out.request_id)
            kept = len(sample.token_ids) - before  # a stop string drops the tokens after it
            m.num_generation_tokens += kept
            # a verify step's tokens are its accepted drafts, then the target's own token: those kept
            m.num_accepted_tokens += min(out.num_accepted_tokens, kept)
            touched[parent.request_id] = parent
        results = []
        for parent in touched.values():
            if parent.finished:
                parent.metrics.finished_time = now
                self._drop(parent)
            results.append(self._output(parent))
        return results, to_abort

    def abort(self, request_id: str) -> list[str]:
        """Forget a request; returns its engine-core ids to abort."""
        parent = self._parents.get(request_id)
        if parent is None:
            return []
        ids = self.child_ids(request_id)
        self._drop(parent)
        return ids

    def _drop(self, parent: _Parent) -> None:
        self._parents.pop(parent.request_id, None)
        for child in [c for c, (p, _) in self._child_to_parent.items() if p is parent]:
            del self._child_to_parent[child]

    def _output(self, parent: _Parent) -> RequestOutput:
        return RequestOutput(
            request_id=parent.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            outputs=[s.completion() for s in parent.samples],
            finished=parent.finished,
            metrics=parent.metrics,
            prompt_logprobs=parent.prompt_logprobs,
            num_cached_tokens=parent.num_cached_tokens,
            error_code=200 if parent.error is None else 502,
            error_msg=parent.error,
        )

    @property
    def num_unfinished(self) -> int:
        return len(self._parents)
