"""The chat side of the offline ``LLM``: checking conversations, rendering them,
and splitting reasoning content and tool calls out of the answers.

The split is the server's own (``fd_core.entrypoints.openai.chat_parsing``):
the reasoning parser runs first, the tool parser on the content part, and
only when the call gave ``tools``; a sample then carries ``reasoning_content``,
``tool_calls`` and ``text`` = the content part, like the server's message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from fd_core.engine.outputs import CompletionOutput, RequestOutput
from fd_core.entrypoints.openai.chat_parsing import ChoiceParser

__all__ = ["ChatParsing", "check_tools", "conversations_of", "template_kwargs_for"]

Conversation = list[dict[str, Any]]

# apply_chat_template's own parameters: never taken from chat_template_kwargs
_RESERVED_TEMPLATE_KWARGS = ("messages", "add_generation_prompt", "tools", "tokenize", "chat_template")
_TEXT_PARTS = ("text",)


def conversations_of(messages: Conversation | Sequence[Conversation]) -> list[Conversation]:
    """One conversation or a batch of them, as a list; ValueError naming a malformed one."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of message dicts or a list of such lists, "
                        f"got {type(messages).__name__}")
    if messages and isinstance(messages[0], dict):
        conversations = [list(messages)]
    else:
        conversations = []
        for i, item in enumerate(messages):
            if not isinstance(item, (list, tuple)) or not item:
                raise ValueError(f"conversation {i}: expected a non-empty list of message dicts, got {item!r}")
            conversations.append(list(item))
    for i, conversation in enumerate(conversations):
        for j, message in enumerate(conversation):
            _check_message(i, j, message)
    return conversations


def _check_message(i: int, j: int, message: Any) -> None:
    where = f"conversation {i}, message {j}"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ValueError(f"{where}: expected a dict with a 'role' string, got {message!r}")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ValueError(f"{where}: 'content' must be a string or a list of content parts, got {content!r}")
    for part in content:
        if isinstance(part, str):
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise ValueError(
                f"{where}: content part type {kind!r} cannot be taken by a text model (multimodal "
                "inputs are not implemented in fd-core yet); send 'text' parts only"
            )


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI tool definitions (one dict or a list) as a list; None when empty."""
    if tools is None:
        return None
    tool_list = [tools] if isinstance(tools, dict) else tools
    if not isinstance(tool_list, (list, tuple)):
        raise ValueError(f"tools must be a tool dict or a list of them, got {type(tools).__name__}")
    for i, tool in enumerate(tool_list):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (not isinstance(fn, dict) or not isinstance(fn.get("name"), str)
                or tool.get("type", "function") != "function"):
            raise ValueError(
                f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}, "
                f"got {tool!r}"
            )
    return [dict(t) for t in tool_list] or None


def template_kwargs_for(chat_template_kwargs: dict[str, Any] | None, params: Any) -> dict[str, Any]:
    """The template's extra inputs for one conversation.

    FastDeploy also carries ``enable_thinking`` on its SamplingParams; when
    the params have it set it reaches the template, unless
    ``chat_template_kwargs`` says otherwise (a conflict is refused).
    """
    kwargs = dict(chat_template_kwargs or {})
    reserved = sorted(k for k in kwargs if k in _RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)}: they are LLM.chat's own "
                         "arguments")
    thinking = getattr(params, "enable_thinking", None)
    if thinking is not None:
        if "enable_thinking" in kwargs and kwargs["enable_thinking"] != thinking:
            raise ValueError(
                f"SamplingParams(enable_thinking={thinking!r}) conflicts with "
                f"chat_template_kwargs={{'enable_thinking': {kwargs['enable_thinking']!r}}}; give one"
            )
        kwargs["enable_thinking"] = thinking
    return kwargs


class ChatParsing:
    """Reasoning / tool-call splitting of one ``LLM.chat`` call's answers."""

    def __init__(self, reasoning_cls: type | None, tool_cls: type | None, tokenizer: Any,
                 tools: list[dict[str, Any]] | None) -> None:
        self.reasoning_cls = reasoning_cls
        self.tool_cls = tool_cls if tools else None  # as the server: tool calls only when tools were given
        self.tokenizer = tokenizer
        self.tools = tools
        self._streams: dict[tuple[str, int], ChoiceParser] = {}  # (request id, sample index) -> state

    @property
    def active(self) -> bool:
        return self.reasoning_cls is not None or self.tool_cls is not None

    def _parser(self, output: RequestOutput, template_kwargs: dict[str, Any]) -> ChoiceParser:
        request = SimpleNamespace(tools=self.tools, chat_template_kwargs=template_kwargs)
        return ChoiceParser(self.reasoning_cls, self.tool_cls, self.tokenizer, request, output.prompt_token_ids)

    def split(self, output: RequestOutput, template_kwargs: dict[str, Any]) -> RequestOutput:
        """A finished output with each sample's text split (in place, returned)."""
        if not self.active:
            return output
        for sample in output.outputs:
            parser = self._parser(output, template_kwargs)
            reasoning, content, tool_calls = parser.parse(sample.text, sample.token_ids)
            sample.text = content or ""
            sample.reasoning_content = reasoning
            sample.tool_calls = tool_calls
            sample.reasoning_token_num = parser.reasoning_tokens
            if parser.tools_called:
                sample.finish_reason = "tool_calls"
        return output

    def split_delta(self, output: RequestOutput, template_kwargs: dict[str, Any]) -> RequestOutput:
        """The streamed increment of ``output``: each sample's new text (split when parsers are set)."""
        samples = []
        for sample in output.outputs:
            delta = _increment(sample)
            if self.active:
                key = (output.request_id, sample.index)
                if key not in self._streams:
                    self._streams[key] = self._parser(output, template_kwargs)
                parser = self._streams[key]
                fields = parser.delta(sample.delta_text, sample.delta_token_ids,
                                      finished=sample.finish_reason is not None) or {}
                delta.text = fields.get("content") or ""
                delta.reasoning_content = fields.get("reasoning_content")
                delta.tool_calls = fields.get("tool_calls")
                delta.reasoning_token_num = parser.reasoning_tokens
                if parser.tools_called and sample.finish_reason is not None:
                    delta.finish_reason = "tool_calls"
                if sample.finish_reason is not None:
                    self._streams.pop(key, None)
            samples.append(delta)
        return dataclasses.replace(output, outputs=samples)


def _increment(sample: CompletionOutput) -> CompletionOutput:
    """FastDeploy's streamed shape: text, token_ids and logprobs hold only what is new."""
    return dataclasses.replace(
        sample, text=sample.delta_text, token_ids=list(sample.delta_token_ids), logprobs=sample.delta_logprobs,
        send_idx=len(sample.token_ids) - len(sample.delta_token_ids),
    )

