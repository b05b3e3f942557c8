"""``/v1/chat/completions``: render the chat template, generate, answer or stream."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fd_core.engine.client import EngineClient
from fd_core.engine.outputs import RequestOutput
from fd_core.entrypoints.openai.chat_parsing import ChoiceParser
from fd_core.entrypoints.openai.chat_prompt import chat_prompt_ids, render_chat
from fd_core.entrypoints.openai.concurrency import reserve
from fd_core.entrypoints.openai.errors import OpenAIError, error_body
from fd_core.entrypoints.openai.guided_request import guided_params
from fd_core.entrypoints.openai.literal_tokens import LiteralSpecialTokens
from fd_core.entrypoints.openai.mm_content import MultiModalChat
from fd_core.entrypoints.openai.protocol import ChatCompletionRequest
from fd_core.entrypoints.openai.serving_base import OpenAIServing, random_id, sse, usage
from fd_core.entrypoints.openai.template_sandbox import RequestTemplateRenderer
from fd_core.entrypoints.openai.unsupported import check_refused
from fd_core.metrics import Metrics
from fd_core.sampling.params import SamplingParams

__all__ = ["OpenAIServingChat", "render_chat"]

logger = logging.getLogger("fd_core.entrypoints.openai")


class OpenAIServingChat(OpenAIServing):
    def __init__(self, client: EngineClient, served_model_names: list[str], max_model_len: int,
                 metrics: Metrics, reasoning_parser: type | None = None, tool_parser: type | None = None,
                 chat_template: str | None = None, allow_request_chat_template: bool = True) -> None:
        super().__init__(client, served_model_names, max_model_len, metrics)
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser
        self.chat_template = chat_template
        self.allow_request_chat_template = allow_request_chat_template
        self.template_renderer: RequestTemplateRenderer | None = None  # request templates; None: the shared one
        self.literal: LiteralSpecialTokens | None = None  # --escape-special-tokens (set by build_app)
        self.mm: MultiModalChat | None = None  # image content parts, for a multimodal model (set by build_app)

    async def create(self, request: ChatCompletionRequest) -> dict[str, Any] | AsyncIterator[str]:
        """The response dict, or the SSE event strings when ``request.stream``."""
        arrival = time.time()
        model = self.check_model(request.model)
        check_refused(request)
        self._check_unsupported(request)
        self.check_token_ids(request.prompt_token_ids or [], "prompt_token_ids")
        self.check_token_ids(request.completion_token_ids or [], "completion_token_ids")
        request, media = (self.mm.split(request, self.literal is not None) if self.mm is not None
                          else (request, []))  # image parts -> text + the images, in order
        prompt_ids = await chat_prompt_ids(request, self.tokenizer, self.chat_template,
                                           self.allow_request_chat_template, self.template_renderer,
                                           self.max_model_len, self.literal)
        engine_prompt: list[int] | dict[str, Any] = prompt_ids
        if media and self.mm is not None:  # decoded and processed off the event loop; placeholders expanded
            engine_prompt = await self.mm.prompt(prompt_ids, media)
            prompt_ids = engine_prompt["prompt_token_ids"]
        field = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        requested = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        max_tokens = self.max_tokens_for(len(prompt_ids), requested, field)
        if request.response_max_tokens is not None:
            max_tokens = min(max_tokens, self._response_budget(request.response_max_tokens, prompt_ids))
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError("top_logprobs needs logprobs set to true", 400, "top_logprobs")
        extra: dict[str, Any] = {} if request.reasoning_max_tokens is None else {
            "reasoning_max_tokens": request.reasoning_max_tokens}
        guided = guided_params(request, self.reasoning_parser is not None)
        if guided is not None:
            extra["guided_decoding"] = guided
        params = self.sampling_params(request, max_tokens, (request.top_logprobs or 0) if request.logprobs else None,
                                      **extra)
        reserve(params.n, "n")  # each sample is an engine request against --max-concurrency
        request_id = random_id("chatcmpl", request.request_id)
        stream = self.generate(request_id, engine_prompt, params, arrival)
        first = await self.first_output(stream)
        use_tools = self.tool_parser if request.template_tools() else None
        parsers = [ChoiceParser(self.reasoning_parser, use_tools, self.tokenizer, request, prompt_ids)
                   for _ in range(params.n)]
        if request.stream:
            return self._stream(request, request_id, model, params, prompt_ids, first, stream, parsers)
        final = first
        try:
            async for out in stream:
                final = out
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        return self._response(request, request_id, model, params, final, parsers)

    def _response_budget(self, response_max_tokens: int, prompt_ids: list[int]) -> int:
        """FastDeploy's response_max_tokens: a cap on max_tokens when the model answers without
        thinking; with thinking on it would bound only the answer, which fd-core cannot do yet."""
        thinking = (self.reasoning_parser is not None
                    and not self.reasoning_parser(self.tokenizer).is_reasoning_end(prompt_ids))
        if thinking:
            raise OpenAIError("response_max_tokens applies only when thinking is off (enable_thinking=false); "
                              "with thinking on bound the reasoning with reasoning_max_tokens and the whole "
                              "output with max_tokens", 400, "response_max_tokens")
        return response_max_tokens

    @staticmethod
    def _check_unsupported(request: ChatCompletionRequest) -> None:
        """Nothing left to refuse here: structured output is served (``guided_request``)."""

    def _response(self, request: ChatCompletionRequest, request_id: str, model: str, params: SamplingParams,
                  final: RequestOutput, parsers: list[ChoiceParser]) -> dict[str, Any]:
        choices = []
        for c, parser in zip(final.outputs, parsers):
            reasoning, content, tool_calls = parser.parse(c.text, c.token_ids)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if tool_calls:
                message["tool_calls"] = tool_calls
            if request.return_token_ids:
                message["prompt_token_ids"] = final.prompt_token_ids
                message["completion_token_ids"] = c.token_ids
            logprobs = None
            if params.logprobs is not None and c.logprobs is not None:
                logprobs = {"content": self.chat_logprobs(c.token_ids, c.logprobs, params.logprobs)}
            choice = {"index": c.index, "message": message, "logprobs": logprobs,
                      "finish_reason": "tool_calls" if parser.tools_called else c.finish_reason,
                      "stop_reason": c.stop_reason}
            if params.prompt_logprobs is not None and final.prompt_logprobs is not None:
                choice["prompt_logprobs"] = self.prompt_logprobs(final.prompt_token_ids, final.prompt_logprobs,
                                                                request.include_logprobs_decode_token)
            choices.append(choice)
        return {
            "id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices,
            "usage": usage(len(final.prompt_token_ids), sum(len(c.token_ids) for c in final.outputs),
                           final.num_cached_tokens, sum(p.reasoning_tokens for p in parsers), [final.metrics]),
        }

    async def _stream(self, request: ChatCompletionRequest, request_id: str, model: str, params: SamplingParams,
                      prompt_ids: list[int], first: RequestOutput, stream: AsyncIterator[RequestOutput],
                      parsers: list[ChoiceParser]) -> AsyncIterator[str]:
        created = int(time.time())
        n_prompt = len(prompt_ids)
        per_chunk = request.max_streaming_response_tokens or 1
        done = [False] * params.n
        buffers: list[list[Any]] = [["", [], []] for _ in range(params.n)]  # text, ids, logprobs not sent yet
        generated = [0] * params.n
        cached = first.num_cached_tokens

        def chunk(choices: list[dict[str, Any]]) -> str:
            body: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                                    "model": model, "choices": choices}
            if request.continuous_usage:
                body["usage"] = usage(n_prompt, sum(generated), cached)
            return sse(body)

        async def outputs() -> AsyncIterator[RequestOutput]:
            yield first
            async for out in stream:
                yield out

        try:
            for i in range(params.n):
                delta: dict[str, Any] = {"role": "assistant", "content": ""}
                if request.return_token_ids:
                    delta["prompt_token_ids"] = prompt_ids
                yield chunk([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
            last = first
            async for out in outputs():
                last = out
                cached = max(cached, out.num_cached_tokens)
                for c in out.outputs:
                    if done[c.index]:
                        continue
                    generated[c.index] = len(c.token_ids)
                    buf = buffers[c.index]
                    buf[0] += c.delta_text
                    buf[1].extend(c.delta_token_ids)
                    buf[2].extend(c.delta_logprobs or [])
                    if len(buf[1]) < per_chunk and not c.finished:
                        continue
                    text, ids, lps = buf
                    buffers[c.index] = ["", [], []]
                    parser = parsers[c.index]
                    delta = (parser.delta(text, ids, finished=c.finished) or {}) if parser.active else ({"content": text} if text else {})
                    if request.return_token_ids and ids:
                        delta["completion_token_ids"] = ids
                    logprobs = None
                    if params.logprobs is not None and lps:
                        logprobs = {"content": self.chat_logprobs(ids, lps, params.logprobs)}
                    finish = None
                    if c.finished:
                        done[c.index] = True
                        finish = "tool_calls" if parser.tools_called else c.finish_reason
                    if delta or logprobs or finish:
                        choice = {"index": c.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
                        if finish:
                            choice["stop_reason"] = c.stop_reason
                        yield chunk([choice])
            if request.include_usage:
                yield sse({"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [], "usage": usage(n_prompt, sum(generated), cached,
                                                         sum(p.reasoning_tokens for p in parsers), [last.metrics])})
        except OpenAIError as exc:
            yield sse(error_body(exc.message, exc.status, exc.param))
        except Exception as exc:  # the engine died mid-stream, or a bug: tell the client, then end
            logger.exception("%s failed while streaming", request_id)
            yield sse(error_body(f"{type(exc).__name__}: {exc}", 503 if "Engine" in type(exc).__name__ else 500))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        yield sse("[DONE]")
