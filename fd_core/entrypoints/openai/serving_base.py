"""What chat and completions share: model check, length checks, SamplingParams,
the metered generate loop, logprobs, usage, SSE framing, merged streams."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fd_core.engine.client import EngineClient, RequestError
from fd_core.engine.outputs import PositionLogprobs, RequestMetrics, RequestOutput
from fd_core.entrypoints.aio import wait_within
from fd_core.entrypoints.openai.errors import OpenAIError
from fd_core.entrypoints.openai.protocol import SamplingFields
from fd_core.metrics import Metrics
from fd_core.sampling.params import SamplingParams

__all__ = ["MAX_SEQUENCES", "OpenAIServing", "merge_streams", "random_id", "sse"]

logger = logging.getLogger("fd_core.entrypoints.openai")

MAX_N = 128  # samples per prompt (OpenAI's limit): one request cannot flood the engine
MAX_SEQUENCES = 256  # prompts x samples (n or best_of) of one request: the engine requests it fans out to
_UNEXPECTED_KWARG = re.compile(r"unexpected keyword argument '(\w+)'")


def random_id(prefix: str, user_id: str | None = None) -> str:
    return f"{prefix}-{user_id}" if user_id else f"{prefix}-{uuid.uuid4().hex}"


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: {json}\\n\\n`` (or ``data: [DONE]\\n\\n``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def merge_streams(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several async iterators as ``(index, item)``; closing the merge
    (or an error in one) closes them all."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, it: AsyncIterator[Any]) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
            await queue.put((i, done))
        except BaseException as exc:  # handed to the consumer, which re-raises
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for it in streams:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                await aclose()


class OpenAIServing:
    """Base of the chat and completion handlers."""

    def __init__(self, client: EngineClient, served_model_names: list[str], max_model_len: int,
                 metrics: Metrics) -> None:
        self.client = client
        self.tokenizer = client.tokenizer
        self.served_model_names = served_model_names
        self.max_model_len = max_model_len
        self.metrics = metrics
        self.max_logprobs = 20  # --max-logprobs (set by build_app)
        self.max_waiting_time: float | None = None  # --max-waiting-time, seconds (set by build_app)

    # ---- request checks -----------------------------------------------------------
    def check_model(self, model: str | None) -> str:
        """The model name to answer with; 404 for a name this server does not serve
        (FastDeploy's ``"default"`` names the first served model)."""
        if model is None or model in ("", "default"):
            return self.served_model_names[0]
        if model in self.served_model_names:
            return model
        raise OpenAIError(f"The model `{model}` does not exist.", 404, "model")

    def max_tokens_for(self, prompt_len: int, requested: int | None, field: str = "max_tokens",
                       what: str = "messages") -> int:
        """``requested`` checked against the context left after the prompt (vLLM's
        messages); None means all of it."""
        limit = self.max_model_len
        if prompt_len == 0:
            raise OpenAIError("The prompt is empty: it must hold at least one token.", 400, "prompt")
        if prompt_len >= limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{prompt_len} input tokens, which leaves no room for the completion. Please reduce "
                f"the length of the input {what}.", 400, what)
        if requested is None:
            # all the context left, but never more than the KV pool can hold for one sequence
            # (its last token's KV is never stored): a smaller pool is not a 400 for every request
            info = self.client.info
            pool = (info.num_kv_blocks - 1) * info.block_size + 1 if info.num_kv_blocks > 1 else limit
            return max(1, min(limit, pool) - prompt_len)
        if requested < 1:
            raise OpenAIError(f"{field} must be at least 1, got {requested}.", 400, field)
        if prompt_len + requested > limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + requested} tokens ({prompt_len} in the {what}, {requested} in the "
                f"completion). Please reduce the length of the {what} or completion.", 400, field)
        return requested

    def sampling_params(self, request: SamplingFields, max_tokens: int, logprobs: int | None,
                        **extra: Any) -> SamplingParams:
        """The request's SamplingParams (``extra``: endpoint-specific keyword arguments);
        a bad value is a 400 naming its field."""
        if request.n > MAX_N:
            raise OpenAIError(f"n must be at most {MAX_N}, got {request.n}", 400, "n")
        kwargs = {**request.sampling_kwargs(), **extra}
        vocab = len(self.tokenizer)
        if isinstance(kwargs.get("top_k"), int) and kwargs["top_k"] >= vocab:
            kwargs["top_k"] = 0  # keeping the whole vocabulary is no top-k at all
        try:
            params = SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **kwargs)
        except (ValueError, TypeError) as exc:
            unknown = _UNEXPECTED_KWARG.search(str(exc))  # a field this SamplingParams does not have
            if unknown:
                raise OpenAIError(f"{unknown.group(1)} is not supported by this engine", 400,
                                  unknown.group(1)) from None
            message = str(exc)
            raise OpenAIError(message, 400, message.split(" ", 1)[0]) from None
        for name, asked in (("top_logprobs" if hasattr(request, "top_logprobs") else "logprobs", params.logprobs),
                            ("prompt_logprobs", params.prompt_logprobs)):
            if asked is not None and asked > self.max_logprobs:
                raise OpenAIError(f"{name} {asked} is more than this server allows: at most {self.max_logprobs} "
                                  "(--max-logprobs)", 400, name)
        # token ids the sampler indexes with must exist: checked here, never in the engine's loop
        self.check_token_ids(params.stop_token_ids, "stop_token_ids")
        self.check_token_ids(list(params.logit_bias or {}), "logit_bias")
        words = params.bad_words_token_ids or []
        self.check_token_ids([t for w in words for t in ([w] if isinstance(w, int) else w)], "bad_words_token_ids")
        return params

    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = len(self.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise OpenAIError(f"{param} holds token ids outside the vocabulary [0, {vocab}): {bad[:8]}", 400, param)

    # ---- generation ---------------------------------------------------------------
    async def generate(self, request_id: str, prompt: list[int] | dict[str, Any], params: SamplingParams,
                       arrival_time: float) -> AsyncIterator[RequestOutput]:
        """``client.generate`` with metrics; closing it aborts the request."""
        self.metrics.request_received()
        last: RequestOutput | None = None
        stream = self.client.generate(request_id, prompt, params, arrival_time)
        try:
            async for out in stream:
                last = out
                yield out
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            if last is not None:
                self.metrics.request_finished(last, params.max_tokens, aborted=not last.finished)
                if last.finished:
                    m = last.metrics
                    logger.info("%s done: prompt %d tokens (%d cached), output %d tokens, ttft %.3fs, e2e %.3fs",
                                request_id, len(last.prompt_token_ids), last.num_cached_tokens,
                                sum(len(o.token_ids) for o in last.outputs), m.ttft or 0.0,
                                (m.finished_time or time.time()) - m.arrival_time)
                else:
                    logger.info("%s aborted after %d output tokens", request_id,
                                sum(len(o.token_ids) for o in last.outputs))
            else:  # refused, timed out or cut before its first output: only its end counts
                self.metrics.request_finished(None, params.max_tokens, aborted=True)

    async def first_output(self, stream: AsyncIterator[RequestOutput]) -> RequestOutput:
        """The first output; an engine refusal becomes a 400 before any byte is sent.
        With --max-waiting-time, a request not served by then (queued, then
        prefilled) is aborted and answered 408, as FastDeploy answers a request
        that waited too long for a slot."""
        try:
            if self.max_waiting_time is None:
                first = await stream.__anext__()
            else:
                first = await wait_within(stream.__anext__(), self.max_waiting_time)
            if first.error_code != 200:  # failed before its first token (a prefill instance's KV transfer)
                await stream.aclose()  # type: ignore[attr-defined]
                raise OpenAIError(first.error_msg or "the request failed", first.error_code)
            return first
        except RequestError as exc:
            await stream.aclose()  # type: ignore[attr-defined]
            raise OpenAIError(str(exc), 400) from None
        except asyncio.TimeoutError:
            await stream.aclose()  # type: ignore[attr-defined]
            raise OpenAIError(
                f"The request waited more than {self.max_waiting_time:g} s (--max-waiting-time) to be served; "
                "the server is busy, retry later", 408) from None

    # ---- answer pieces ------------------------------------------------------------
    def token_text(self, token_id: int) -> str:
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")

    def chat_logprobs(self, token_ids: list[int], logprobs: list[PositionLogprobs], top: int) -> list[dict]:
        """OpenAI's ``logprobs.content`` entries for generated tokens."""
        content = []
        for tok, position in zip(token_ids, logprobs):
            chosen = position.get(tok)
            ranked = sorted(position.items(), key=lambda kv: (kv[1].rank or 1 << 30, -kv[1].logprob))[:top]
            text = self.token_text(tok)
            content.append({
                "token": text,
                "logprob": _finite(chosen.logprob if chosen else float("-inf")),
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {"token": (t := self.token_text(tid)), "logprob": _finite(lp.logprob),
                     "bytes": list(t.encode("utf-8"))}
                    for tid, lp in ranked
                ],
            })
        return content

    def completion_logprobs(self, token_ids: list[int], logprobs: list[PositionLogprobs | None], top: int,
                            text_offset: int = 0) -> dict[str, list]:
        """OpenAI's legacy completions ``logprobs`` object."""
        out: dict[str, list] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        offset = text_offset
        for tok, position in zip(token_ids, logprobs):
            text = self.token_text(tok)
            out["tokens"].append(text)
            out["text_offset"].append(offset)
            offset += len(text)
            if position is None:  # the first prompt token has no logprob
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            chosen = position.get(tok)
            out["token_logprobs"].append(_finite(chosen.logprob) if chosen else None)
            ranked = sorted(position.items(), key=lambda kv: (kv[1].rank or 1 << 30, -kv[1].logprob))[:top]
            out["top_logprobs"].append({self.token_text(tid): _finite(lp.logprob) for tid, lp in ranked} or None)
        return out

    def prompt_logprobs(self, token_ids: list[int], logprobs: list[PositionLogprobs | None],
                        decode: bool = True) -> list[dict | None]:
        """vLLM's ``prompt_logprobs``: per prompt position, token id -> logprob, rank, text
        (``decode=False``: FastDeploy's include_logprobs_decode_token=false, no text)."""
        return [
            None if position is None else {
                str(tid): {"logprob": _finite(lp.logprob), "rank": lp.rank,
                           "decoded_token": self.token_text(tid) if decode else None}
                for tid, lp in position.items()
            }
            for _, position in zip(token_ids, logprobs)
        ]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
          reasoning_tokens: int = 0, speculate: Sequence[RequestMetrics] = ()) -> dict[str, Any]:
    """The OpenAI usage object; ``speculate``: the finished requests' metrics, whose
    speculative-decoding figures (summed) become FastDeploy's ``speculate_metrics``
    when anything was drafted."""
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }
    summed = RequestMetrics(arrival_time=0.0, num_generation_tokens=sum(m.num_generation_tokens for m in speculate),
                            num_draft_tokens=sum(m.num_draft_tokens for m in speculate),
                            num_accepted_tokens=sum(m.num_accepted_tokens for m in speculate))
    spec = summed.speculate_metrics()
    if spec is not None:
        body["speculate_metrics"] = spec
    kv_bytes = sum(m.kv_transfer_bytes for m in speculate)
    if kv_bytes:  # --splitwise-role decode: the KV received from the prefill instance (fd_core.disagg)
        body["kv_transfer_bytes"] = kv_bytes
        body["kv_transfer_ms"] = round(1000 * sum(m.kv_transfer_seconds for m in speculate), 3)
    return body


def _finite(x: float) -> float:
    """JSON has no -inf: clamp like vLLM does (-9999.0)."""
    return max(float(x), -9999.0)
