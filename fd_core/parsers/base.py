"""The parsers' data types and their two interfaces.

The data types mirror the OpenAI message fields the API layer fills in
(``reasoning_content``, ``content``, ``tool_calls``); the interfaces keep
vLLM's method names and arguments so its parsers port with little change,
plus ``finish_streaming`` (optional: the end of an output's stream).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "ExtractedToolCalls",
    "FunctionCall",
    "ReasoningParser",
    "ToolCall",
    "ToolParser",
    "token_id_of",
]


@dataclass
class FunctionCall:
    name: str
    arguments: str  # a JSON text, as OpenAI's "arguments"


@dataclass
class ToolCall:
    id: str
    function: FunctionCall
    type: str = "function"


@dataclass
class DeltaFunctionCall:
    name: str | None = None
    arguments: str | None = None  # a fragment; the fragments of one call concatenate to its JSON


@dataclass
class DeltaToolCall:
    index: int  # position of the call among the response's tool calls
    id: str | None = None  # set on the first delta of a call
    type: str | None = None  # "function" on the first delta of a call
    function: DeltaFunctionCall | None = None


@dataclass
class DeltaMessage:
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] = field(default_factory=list)


@dataclass
class ExtractedToolCalls:
    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None = None  # text outside the calls; None when it is only whitespace


def token_id_of(tokenizer: Any, token: str) -> int | None:
    """The id of an added/special token such as ``"</think>"``, or None when
    there is no tokenizer or it does not have the token as a single id."""
    if tokenizer is None:
        return None
    added = getattr(tokenizer, "added_tokens", None)  # fd_core.tokenizer.Tokenizer
    if isinstance(added, dict) and token in added:
        return int(added[token])
    get_vocab = getattr(tokenizer, "get_vocab", None)  # HF-style tokenizers
    if callable(get_vocab):
        value = get_vocab().get(token)
        return None if value is None else int(value)
    return None


class ReasoningParser(abc.ABC):
    """Splits a model's output into ``reasoning_content`` and ``content``.

    One instance serves one request: the API layer creates it per request
    (streaming parsers keep state between deltas). ``tokenizer`` is a
    ``fd_core.tokenizer.Tokenizer`` or None; parsers work from the text alone
    and use token ids only where the caller gives ids.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @abc.abstractmethod
    def is_reasoning_end(self, token_ids: list[int]) -> bool:
        """Whether the reasoning part is over in ``token_ids`` (e.g. the prompt
        pre-fills an empty think block when thinking is disabled). Called by
        the API layer on the prompt ids and on the output ids so far."""

    @abc.abstractmethod
    def extract_reasoning_content(
        self, model_output: str, request: Any = None
    ) -> tuple[str | None, str | None]:
        """``(reasoning_content, content)`` of a complete output; None for an empty part."""

    @abc.abstractmethod
    def extract_reasoning_content_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: list[int],
        current_token_ids: list[int],
        delta_token_ids: list[int],
    ) -> DeltaMessage | None:
        """The reasoning/content to send for ``delta_text`` (``current_text =
        previous_text + delta_text``); None when there is nothing to send yet."""

    def finish_streaming(self) -> DeltaMessage | None:
        """Called once after the last delta of an output: the reasoning/content
        still held back (e.g. a trailing ``"</thi"`` that never became a tag),
        or None. A parser whose deltas add up to ``extract_reasoning_content``
        only with this tail overrides it; the default holds nothing back."""
        return None


class ToolParser(abc.ABC):
    """Finds tool calls in a model's output (after any reasoning was split off).

    One instance per request, as for ``ReasoningParser``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @abc.abstractmethod
    def extract_tool_calls(self, model_output: str, request: Any = None) -> ExtractedToolCalls:
        """The calls in a complete output and the text outside them. Never raises
        on malformed model output: what is not a valid call stays text, and
        without calls the content is the output unchanged (the API layer
        keeps its own copy then)."""

    @abc.abstractmethod
    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: list[int],
        current_token_ids: list[int],
        delta_token_ids: list[int],
        request: Any = None,
    ) -> DeltaMessage | None:
        """Content and tool-call deltas for ``delta_text``; None when there is
        nothing to send yet."""

    def finish_streaming(self, request: Any = None) -> DeltaMessage | None:
        """Called once after the last delta of an output: the content and calls
        still held back (e.g. an unclosed block that turned out not to be a
        call), or None. The default holds nothing back."""
        return None
