"""``/v1/completions``: one engine request per prompt, choices ordered prompt-major.

A batch of P prompts with ``n`` samples answers P*n choices; choice
``p * n + i`` is sample ``i`` of prompt ``p`` (OpenAI's and vLLM's order).
With ``best_of`` > n each prompt draws best_of samples and answers the n
with the highest cumulative logprob, best first (vLLM's former behaviour);
usage counts every sample drawn, as OpenAI bills it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fd_core.engine.outputs import CompletionOutput, RequestOutput
from fd_core.entrypoints.openai.concurrency import reserve
from fd_core.entrypoints.openai.errors import OpenAIError, error_body
from fd_core.entrypoints.openai.guided_request import guided_params
from fd_core.entrypoints.openai.protocol import CompletionRequest
from fd_core.entrypoints.openai.serving_base import (
    MAX_N,
    MAX_SEQUENCES,
    OpenAIServing,
    merge_streams,
    random_id,
    sse,
    usage,
)
from fd_core.entrypoints.openai.tokenize_text import encode_text
from fd_core.entrypoints.openai.unsupported import check_refused
from fd_core.sampling.params import SamplingParams

__all__ = ["OpenAIServingCompletion"]

logger = logging.getLogger("fd_core.entrypoints.openai")


class OpenAIServingCompletion(OpenAIServing):
    async def prompts_of(self, request: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        """(text or None, token ids) per prompt of the request; FastDeploy's
        ``prompt_token_ids`` (one list or a batch) win over ``prompt``."""
        prompt: Any = request.prompt_token_ids or request.prompt
        field = "prompt_token_ids" if request.prompt_token_ids else "prompt"
        if prompt is None:
            raise OpenAIError("prompt is required (or prompt_token_ids)", 400, "prompt")
        if isinstance(prompt, str):
            items: list[str | list[int]] = [prompt]
        elif len(prompt) == 0:
            raise OpenAIError("prompt must not be empty", 400, "prompt")
        elif all(isinstance(p, int) for p in prompt):
            items = [list(prompt)]
        else:
            items = list(prompt)
        out: list[tuple[str | None, list[int]]] = []
        for item in items:
            if isinstance(item, str):
                out.append((item, await encode_text(self.tokenizer, item, self.max_model_len, "prompt")))
            else:
                self.check_token_ids(item, field)
                out.append((None, list(item)))
        return out

    def best_of(self, request: CompletionRequest) -> int:
        """Samples to draw per prompt: ``best_of`` (>= n; not with streaming), else n."""
        best_of = request.best_of
        if best_of is None or best_of == request.n:
            return request.n
        if best_of < request.n:
            raise OpenAIError(f"best_of must be >= n, got best_of={best_of} and n={request.n}", 400, "best_of")
        if best_of > MAX_N:
            raise OpenAIError(f"best_of must be at most {MAX_N}, got {best_of}", 400, "best_of")
        if request.stream:
            raise OpenAIError("best_of greater than n cannot be streamed: the best samples are known only "
                              "when all have finished", 400, "best_of")
        return best_of

    async def create(self, request: CompletionRequest) -> dict[str, Any] | AsyncIterator[str]:
        arrival = time.time()
        model = self.check_model(request.model)
        check_refused(request)
        prompts = await self.prompts_of(request)
        samples = self.best_of(request)
        if len(prompts) * samples > MAX_SEQUENCES:
            field = "best_of" if request.best_of else "n"
            raise OpenAIError(f"{len(prompts)} prompts x {field} {samples} = {len(prompts) * samples} sequences; one "
                              f"request may ask for at most {MAX_SEQUENCES} (send several requests)", 400, field)
        # every sequence is an engine request against --max-concurrency
        reserve(len(prompts) * samples, "best_of" if request.best_of else "n")
        constraint = guided_params(request, False)  # completions run no reasoning parser
        guided = {} if constraint is None else {"guided_decoding": constraint}
        params_list = []  # as the answer shows them (n, the logprobs asked for)
        engine_params = []  # as generated: best_of samples, with logprobs to rank them by
        for _, ids in prompts:
            max_tokens = self.max_tokens_for(len(ids), request.max_tokens, "max_tokens", "prompt")
            params = self.sampling_params(request, max_tokens, request.logprobs, **guided)
            params_list.append(params)
            engine_params.append(params if samples == params.n else params.replace(
                n=samples, logprobs=params.logprobs if params.logprobs is not None else 0))
        base_id = random_id("cmpl", request.request_id)
        streams = [self.generate(base_id if len(prompts) == 1 else f"{base_id}-{p}", ids, params, arrival)
                   for p, ((_, ids), params) in enumerate(zip(prompts, engine_params))]
        # every prompt is submitted at once (so the engine batches them) and each first
        # output awaited together: a refusal becomes a 400 before anything is sent
        results = await asyncio.gather(*(self.first_output(s) for s in streams), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for s in streams:
                await s.aclose()  # type: ignore[attr-defined]
            raise errors[0]
        firsts = [r for r in results if isinstance(r, RequestOutput)]
        n = params_list[0].n
        if request.stream:
            return self._stream(request, base_id, model, params_list[0], prompts, firsts, streams)
        finals = list(firsts)
        async for p, out in merge_streams(streams):
            finals[p] = out
        n_out = sum(len(c.token_ids) for f in finals for c in f.outputs)  # best_of: every sample drawn
        choices = []
        for p, final in enumerate(finals):
            for i, c in enumerate(_best(final.outputs, n)):
                choices.append(self._choice(request, params_list[p], prompts[p], final, c, p * n + i))
        n_prompt = sum(len(f.prompt_token_ids) for f in finals)
        return {"id": base_id, "object": "text_completion", "created": int(time.time()), "model": model,
                "choices": choices,
                "usage": usage(n_prompt, n_out, sum(f.num_cached_tokens for f in finals),
                               speculate=[f.metrics for f in finals])}

    def _choice(self, request: CompletionRequest, params: SamplingParams, prompt: tuple[str | None, list[int]],
                final: RequestOutput, c: CompletionOutput, index: int) -> dict[str, Any]:
        text, token_ids, logprobs = c.text, c.token_ids, c.logprobs
        prompt_text = prompt[0] if prompt[0] is not None else self.tokenizer.decode(prompt[1])
        lp = None
        if params.logprobs is not None and logprobs is not None:
            if request.echo and final.prompt_logprobs is not None:
                lp = self.completion_logprobs(prompt[1] + token_ids,
                                              [*final.prompt_logprobs, *logprobs], params.logprobs)
            else:
                lp = self.completion_logprobs(token_ids, [*logprobs], params.logprobs,
                                              len(prompt_text) if request.echo else 0)
        choice: dict[str, Any] = {"index": index, "text": prompt_text + text if request.echo else text,
                                  "logprobs": lp, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        if request.return_token_ids:
            choice["prompt_token_ids"] = final.prompt_token_ids
            choice["completion_token_ids"] = token_ids
        if params.prompt_logprobs is not None and final.prompt_logprobs is not None:
            choice["prompt_logprobs"] = self.prompt_logprobs(final.prompt_token_ids, final.prompt_logprobs,
                                                             request.include_logprobs_decode_token)
        return choice

    async def _stream(self, request: CompletionRequest, request_id: str, model: str, params: SamplingParams,
                      prompts: list[tuple[str | None, list[int]]], firsts: list[RequestOutput],
                      streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[str]:
        created = int(time.time())
        n = params.n
        per_chunk = request.max_streaming_response_tokens or 1
        n_prompt = sum(len(ids) for _, ids in prompts)
        generated: dict[int, int] = {}
        cached = [f.num_cached_tokens for f in firsts]
        buffers: dict[int, list[Any]] = {}  # choice index -> [text, ids, logprobs] not sent yet
        done: set[int] = set()
        offsets: dict[int, int] = {}  # choice index -> characters sent (its first chunk has gone out)

        def chunk(choice: dict[str, Any]) -> str:
            body = {"id": request_id, "object": "text_completion", "created": created, "model": model,
                    "choices": [choice]}
            if request.continuous_usage:
                body["usage"] = usage(n_prompt, sum(generated.values()), sum(cached))
            return sse(body)

        async def outputs() -> AsyncIterator[tuple[int, RequestOutput]]:
            for p, first in enumerate(firsts):
                yield p, first
            async for item in merge_streams(streams):
                yield item

        lasts = list(firsts)
        try:
            async for p, out in outputs():
                lasts[p] = out
                cached[p] = max(cached[p], out.num_cached_tokens)
                for c in out.outputs:
                    index = p * n + c.index
                    if index in done:
                        continue
                    generated[index] = len(c.token_ids)
                    buf = buffers.setdefault(index, ["", [], []])
                    buf[0] += c.delta_text
                    buf[1].extend(c.delta_token_ids)
                    buf[2].extend(c.delta_logprobs or [])
                    if len(buf[1]) < per_chunk and not c.finished:
                        continue
                    text, ids, lps = buffers.pop(index)
                    choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": None}
                    offset = offsets.get(index, 0)
                    if index not in offsets:  # this choice's first chunk
                        if request.echo:
                            prompt_text = prompts[p][0]
                            if prompt_text is None:
                                prompt_text = self.tokenizer.decode(prompts[p][1])
                            choice["text"] = prompt_text + text
                            offset = len(prompt_text)
                        if request.return_token_ids:
                            choice["prompt_token_ids"] = out.prompt_token_ids
                    if params.logprobs is not None and lps:
                        choice["logprobs"] = self.completion_logprobs(ids, lps, params.logprobs, offset)
                    offsets[index] = offset + len(text)
                    if request.return_token_ids:
                        choice["completion_token_ids"] = ids
                    if c.finished:
                        done.add(index)
                        choice["finish_reason"] = c.finish_reason
                        choice["stop_reason"] = c.stop_reason
                    if text or ids or c.finished:
                        yield chunk(choice)
            if request.include_usage:
                yield sse({"id": request_id, "object": "text_completion", "created": created, "model": model,
                           "choices": [], "usage": usage(n_prompt, sum(generated.values()), sum(cached),
                                                         speculate=[f.metrics for f in lasts])})
        except OpenAIError as exc:
            yield sse(error_body(exc.message, exc.status, exc.param))
        except Exception as exc:
            logger.exception("%s failed while streaming", request_id)
            yield sse(error_body(f"{type(exc).__name__}: {exc}", 503 if "Engine" in type(exc).__name__ else 500))
        finally:
            for s in streams:
                await s.aclose()  # type: ignore[attr-defined]
        yield sse("[DONE]")


def _best(outputs: list[CompletionOutput], n: int) -> list[CompletionOutput]:
    """The ``n`` samples with the highest cumulative logprob, best first (all, in order, when n covers them)."""
    if len(outputs) <= n:
        return outputs
    ranked = sorted(outputs, key=lambda c: c.cumulative_logprob if c.cumulative_logprob is not None else float("-inf"),
                    reverse=True)
    return ranked[:n]
