"""The offline API: ``LLM(model=...).generate(...)`` and ``.chat(...)``.

FastDeploy's and vLLM's scripts both run: the constructor takes FastDeploy's
launch flags as keyword arguments, ``generate``/``chat`` take both projects'
argument names, and each result reads both ways (``output.outputs.text`` and
``output.outputs[0].text``, see ``fd_core.engine.outputs``).

A prompt the engine cannot serve (empty, longer than ``max_model_len``,
token ids outside the vocabulary, a wrong type) makes the whole call raise
ValueError/TypeError naming its index before any generation runs; nothing of
the batch stays in the engine, so the next call starts clean.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Literal, overload

from fd_core import envs
from fd_core.engine.llm_engine import LLMEngine
from fd_core.engine.outputs import RequestOutput
from fd_core.entrypoints.llm_chat import (
    ChatParsing,
    check_tools,
    conversations_of,
    template_kwargs_for,
)
from fd_core.entrypoints.llm_inputs import (
    Prompt,
    check_prompt,
    indexed,
    prompts_of,
    refuse_unsupported,
)
from fd_core.entrypoints.openai.chat_parsing import resolve_parser
from fd_core.logging_setup import setup_logging
from fd_core.multimodal.options import MultiModalOptions
from fd_core.multimodal.prompt import MultiModalPrompts, split_chat_images
from fd_core.sampling.params import SamplingParams

__all__ = ["LLM"]

logger = logging.getLogger("fd_core.llm")

Params = SamplingParams | Sequence[SamplingParams] | None
StreamChunk = list[RequestOutput | None]  # one slot per prompt; None: nothing new for it this step


class LLM:
    """Runs a model in this process for batches of prompts.

    ``engine_args`` are FastDeploy's launch flags as keyword arguments
    (``max_model_len``, ``max_num_seqs``, ``block_size``, ``backend``,
    ``enable_prefix_caching``, ``swap_space``, ``tokenizer``,
    ``chat_template``, ...; every ``EngineArgs`` field), an unknown one is a
    TypeError naming it. LLM-level ones: ``reasoning_parser`` and
    ``tool_call_parser`` split ``LLM.chat``'s answers as the server does;
    ``tool_parser_plugin`` is a Python file that registers tool parsers. FastDeploy's
    other names (``enable_logprob``, ``load_choices``, ...) go to ``EngineArgs.from_kwargs``,
    which logs those with no effect here and refuses those naming a missing feature.
    """

    def __init__(self, model: str, *, reasoning_parser: str | None = None, tool_call_parser: str | None = None,
                 tool_parser_plugin: str | None = None, limit_mm_per_prompt: Any = None,
                 mm_processor_kwargs: Any = None, **engine_args: Any) -> None:
        setup_logging("llm", console=not logging.getLogger().handlers)
        # images per prompt and the image processor's pixel budget (FastDeploy's names; checked here)
        self._mm_options = MultiModalOptions.from_flags(limit_mm_per_prompt, mm_processor_kwargs)
        envs.check_values()
        envs.log_no_effect(logger)
        if tool_parser_plugin is not None:
            from fd_core.parsers import ToolParserManager

            ToolParserManager.import_tool_parser(tool_parser_plugin)
        self.reasoning_parser = resolve_parser("reasoning", reasoning_parser)
        self.tool_parser = resolve_parser("tool-call", tool_call_parser)
        if engine_args.get("splitwise_role") in ("prefill", "decode"):  # fd_core.disagg
            from fd_core.disagg.engine import disaggregate

            engine_args.setdefault("core_wrapper", disaggregate)
        self.engine = LLMEngine.from_kwargs(model, **engine_args)
        self._ids = itertools.count()
        self._mm: MultiModalPrompts | None = None  # built on the first prompt with images

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def llm_engine(self) -> LLMEngine:
        """FastDeploy's and vLLM's attribute name for the engine."""
        return self.engine

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    # ---- public calls ---------------------------------------------------------------
    @overload
    def generate(self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = ..., use_tqdm: bool = ...,
                 stream: Literal[False] = ..., *, lora_request: Any = ...,
                 priority: Sequence[int] | None = ...) -> list[RequestOutput]: ...
    @overload
    def generate(self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = ..., use_tqdm: bool = ...,
                 *, stream: Literal[True], lora_request: Any = ...,
                 priority: Sequence[int] | None = ...) -> Iterator[StreamChunk]: ...

    def generate(self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = None, use_tqdm: bool = True,
                 stream: bool = False, *, lora_request: Any = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput] | Iterator[StreamChunk]:
        """Generate for every prompt; outputs come back in prompt order.

        ``sampling_params``: one for all, or one per prompt; None gives
        FastDeploy's default (sample until EOS or ``max_model_len``).
        ``stream=True`` (FastDeploy) returns an iterator of lists, one slot per
        prompt holding the new part of its output (text, token_ids) or None.
        """
        refuse_unsupported(lora_request=lora_request, priority=priority)
        prompt_list = prompts_of(prompts)
        params = self._params_for(sampling_params, len(prompt_list), "prompts")
        if any(p.enable_thinking is not None for p in params):  # nothing renders a template here
            raise ValueError("SamplingParams(enable_thinking=...) is a chat-template input: it works with "
                             "LLM.chat; generate takes the prompt as it is")
        ids = self._add_all(prompt_list, params, "prompt")
        parsing = ChatParsing(None, None, self.tokenizer, None)
        kwargs: list[dict[str, Any]] = [{}] * len(ids)
        if stream:
            return self._stream(ids, use_tqdm, parsing, kwargs)
        return self._run(ids, use_tqdm)

    @overload
    def chat(self, messages: list[dict[str, Any]] | Sequence[list[dict[str, Any]]], sampling_params: Params = ...,
             use_tqdm: bool = ..., chat_template_kwargs: dict[str, Any] | None = ..., chat_template: str | None = ...,
             tools: list[dict[str, Any]] | dict[str, Any] | None = ..., stream: Literal[False] = ..., *,
             add_generation_prompt: bool = ..., continue_final_message: bool = ...,
             chat_template_content_format: str = ..., lora_request: Any = ...,
             mm_processor_kwargs: dict[str, Any] | None = ...) -> list[RequestOutput]: ...
    @overload
    def chat(self, messages: list[dict[str, Any]] | Sequence[list[dict[str, Any]]], sampling_params: Params = ...,
             use_tqdm: bool = ..., chat_template_kwargs: dict[str, Any] | None = ..., chat_template: str | None = ...,
             tools: list[dict[str, Any]] | dict[str, Any] | None = ..., *, stream: Literal[True],
             add_generation_prompt: bool = ..., continue_final_message: bool = ...,
             chat_template_content_format: str = ..., lora_request: Any = ...,
             mm_processor_kwargs: dict[str, Any] | None = ...) -> Iterator[StreamChunk]: ...

    def chat(self, messages: list[dict[str, Any]] | Sequence[list[dict[str, Any]]], sampling_params: Params = None,
             use_tqdm: bool = True, chat_template_kwargs: dict[str, Any] | None = None,
             chat_template: str | None = None, tools: list[dict[str, Any]] | dict[str, Any] | None = None,
             stream: bool = False, *, add_generation_prompt: bool = True, continue_final_message: bool = False,
             chat_template_content_format: str = "auto", lora_request: Any = None,
             mm_processor_kwargs: dict[str, Any] | None = None) -> list[RequestOutput] | Iterator[StreamChunk]:
        """Render each conversation with the chat template, then generate.

        With ``reasoning_parser`` / ``tool_call_parser`` set on the LLM each
        sample comes back split as the server's message: ``reasoning_content``,
        ``tool_calls`` (only when ``tools`` were given; ``finish_reason`` is
        then ``"tool_calls"``) and ``text`` = the content part. ``stream=True``
        yields the split increments.
        """
        refuse_unsupported(lora_request=lora_request, mm_processor_kwargs=mm_processor_kwargs)
        if continue_final_message:
            raise ValueError("continue_final_message=True is not supported yet; end the conversation with a "
                             "user turn and use add_generation_prompt")
        if chat_template_content_format not in ("auto", "string", "openai"):
            raise ValueError(f"chat_template_content_format must be 'auto', 'string' or 'openai', "
                             f"got {chat_template_content_format!r}")
        messages, chat_images = split_chat_images(messages)  # image parts -> ERNIE-VL's markers + images
        conversations = conversations_of(messages)
        params = self._params_for(sampling_params, len(conversations), "conversations")
        tool_list = check_tools(tools)
        kwargs = [template_kwargs_for(chat_template_kwargs, p) for p in params]
        prompts: list[Prompt] = []
        for i, conversation in enumerate(conversations):
            images = chat_images[i] if i < len(chat_images) else []
            try:
                text = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt,
                                                          tools=tool_list, chat_template=chat_template, **kwargs[i])
            except Exception as exc:  # jinja errors, raise_exception() in the template
                raise ValueError(f"conversation {i}: the chat template could not render it: "
                                 f"{type(exc).__name__}: {exc}") from exc
            try:
                token_ids = self.tokenizer.encode(text)
            except ValueError as exc:  # a lone surrogate in a message
                raise ValueError(f"conversation {i} (of {len(conversations)}): {exc}") from None
            prompts.append({"prompt": text, "prompt_token_ids": token_ids, "multi_modal_data": images}
                           if images else {"prompt": text, "prompt_token_ids": token_ids})
        ids = self._add_all(prompts, params, "conversation")
        parsing = ChatParsing(self.reasoning_parser, self.tool_parser, self.tokenizer, tool_list)
        if stream:
            return self._stream(ids, use_tqdm, parsing, kwargs)
        return [parsing.split(out, kw) for out, kw in zip(self._run(ids, use_tqdm), kwargs)]

    # ---- internals ------------------------------------------------------------------
    @staticmethod
    def _params_for(sampling_params: Params, count: int, what: str) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams(max_tokens=None)] * count  # FastDeploy's default: up to max_model_len
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        if not isinstance(sampling_params, (list, tuple)):
            raise TypeError(f"sampling_params must be a SamplingParams or a list of them, "
                            f"got {type(sampling_params).__name__}")
        params = list(sampling_params)
        if len(params) != count:
            raise ValueError(f"got {len(params)} sampling params for {count} {what}; give one, or one per prompt")
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params[{i}] must be a SamplingParams, got {type(p).__name__}")
        return params

    def _add_all(self, prompts: list[Prompt], params: list[SamplingParams], what: str) -> list[str]:
        """Queue every prompt or none: a bad one raises naming its index, the rest are taken back."""
        ids: list[str] = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                request_id = str(next(self._ids))
                try:
                    if MultiModalPrompts.has_images(prompt):  # images: expanded ids + mm_inputs
                        prompt = self._multimodal().prepare(prompt, self.tokenizer)  # type: ignore[arg-type]
                    else:
                        check_prompt(prompt)
                    self.engine.add_request(request_id, prompt, p)
                except (ValueError, TypeError) as exc:
                    raise indexed(exc, f"{what} {i} (of {len(prompts)})") from exc
                ids.append(request_id)
        except BaseException:
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        return ids

    def _multimodal(self) -> MultiModalPrompts:
        """The image side of prompts, built on first use; ValueError for a text-only model."""
        if self._mm is None:
            config = self.engine.core.model_config
            if getattr(config, "vision", None) is None:
                raise ValueError(f"this model ({config.architecture}) takes no images (multi_modal_data, "
                                 "image content parts); send text only or use a multimodal model such as "
                                 "ERNIE-4.5-VL")
            self._mm = MultiModalPrompts(self.engine.core.model_dir, config, self._mm_options.limits["image"],
                                         self._mm_options.processor_overrides, self._mm_options.limits["video"],
                                         self._mm_options.video)
        return self._mm

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        bar = _progress(len(ids)) if use_tqdm else None
        wanted = set(ids)
        try:
            while len(results) < len(ids):
                for output in self.engine.step():
                    if output.finished and output.request_id in wanted:
                        results[output.request_id] = output
                        if bar is not None:
                            bar.update(1)
                if not self.engine.has_unfinished_requests() and len(results) < len(ids):
                    raise RuntimeError("the engine has no work left but requests did not finish")
        except BaseException:  # Ctrl-C or an engine error: free what is left of this batch
            for request_id in ids:
                if request_id not in results:
                    self.engine.abort_request(request_id)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in ids]

    def _stream(self, ids: list[str], use_tqdm: bool, parsing: ChatParsing,
                kwargs: list[dict[str, Any]]) -> Iterator[StreamChunk]:
        slot = {request_id: i for i, request_id in enumerate(ids)}
        pending = set(ids)
        bar = _progress(len(ids)) if use_tqdm else None
        try:
            while pending:
                chunk: StreamChunk = [None] * len(ids)
                for output in self.engine.step():
                    i = slot.get(output.request_id)
                    if i is None or output.request_id not in pending:
                        continue
                    chunk[i] = parsing.split_delta(output, kwargs[i])
                    if output.finished:
                        pending.discard(output.request_id)
                        if bar is not None:
                            bar.update(1)
                if any(c is not None for c in chunk):
                    yield chunk
                elif pending and not self.engine.has_unfinished_requests():
                    raise RuntimeError("the engine has no work left but requests did not finish")
        finally:  # also when the caller stops iterating early: free what is left
            for request_id in pending:
                self.engine.abort_request(request_id)
            if bar is not None:
                bar.close()


def _progress(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
