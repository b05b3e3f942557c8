"""Reasoning and tool-call parsing of chat outputs, whole and streamed (vLLM's flow).

The reasoning parser runs first and splits ``reasoning_content`` from the
content; the tool parser then runs on the content part only, and when it
finds calls the choice's ``finish_reason`` becomes ``"tool_calls"``.
Parsers come from ``fd_core.parsers`` (their objects are read by attribute,
so pydantic models and dataclasses both work).

When ``is_reasoning_end(prompt_ids)`` holds (the template pre-filled an
empty think block: ``enable_thinking=false``) the reasoning parser is left
out and the whole output is content. Otherwise it sees every delta, before
and after the reasoning ends (ERNIE X1's parser also shapes the answer).

Both modes give the same message: the deltas ``delta`` returns for an
output, joined (content, reasoning_content, tool calls by index), equal
what ``parse`` returns for its whole text, whatever the cuts between
deltas, provided the last delta says ``finished`` so the parsers release
what they held back (a partial tag, a ``<tool_call>`` that never became a
call). Ids of tool calls differ between the modes, and so may the spacing
of the arguments of calls ``tool_choice`` forced (streamed as generated,
re-serialized whole). ``parallel_tool_calls: false`` keeps the first call.

reasoning_tokens counts the output tokens up to and including the end of
the reasoning part: the shortest prefix for which ``is_reasoning_end`` holds
(binary search; the end marker does not un-happen), or, streaming, the
tokens of the deltas before it. When the parser cannot see the end marker
as a token id, the reasoning text is re-encoded (an approximation).
"""

from __future__ import annotations

import uuid
from typing import Any

from fd_core.entrypoints.openai.guided_request import (
    ForcedToolStream,
    forced_tool_calls,
    forces_tools,
)

__all__ = ["ChoiceParser", "resolve_parser", "tool_call_dict"]


def resolve_parser(kind: str, name: str | None) -> type | None:
    """The parser class registered as ``name`` (``ernie_x1`` == ``ernie-x1``), or None.

    Raises ValueError naming the known parsers when ``name`` is unknown.
    """
    if not name:
        return None
    from fd_core.parsers import ReasoningParserManager, ToolParserManager

    return (ReasoningParserManager if kind == "reasoning" else ToolParserManager).get(name)


def tool_call_dict(call: Any, index: int | None = None) -> dict[str, Any]:
    """An OpenAI ``tool_calls`` entry from a parser's ToolCall / DeltaToolCall."""
    out: dict[str, Any] = {}
    idx = getattr(call, "index", index)
    if idx is not None:
        out["index"] = idx
    if getattr(call, "id", None):
        out["id"] = call.id
    if getattr(call, "type", None):
        out["type"] = call.type
    fn = getattr(call, "function", None)
    if fn is not None:
        f: dict[str, Any] = {}
        if getattr(fn, "name", None) is not None:
            f["name"] = fn.name
        if getattr(fn, "arguments", None) is not None:
            f["arguments"] = fn.arguments
        out["function"] = f
    return out


class ChoiceParser:
    """Parsing state of one choice of one chat request."""

    def __init__(self, reasoning_cls: type | None, tool_cls: type | None, tokenizer: Any, request: Any,
                 prompt_ids: list[int] | None = None) -> None:
        self.reasoning = reasoning_cls(tokenizer) if reasoning_cls is not None else None
        if self.reasoning is not None and prompt_ids and self.reasoning.is_reasoning_end(prompt_ids):
            self.reasoning = None  # the prompt closed the reasoning (enable_thinking=false): all is content
        self.tools = tool_cls(tokenizer) if tool_cls is not None else None
        self.tokenizer = tokenizer
        self.request = request
        self.reasoning_ended = self.reasoning is None
        self.reasoning_tokens = 0
        self.tools_called = False
        self._text = ""  # everything generated so far
        self._ids: list[int] = []
        self._content_text = ""  # the part after the reasoning, as the tool parser sees it
        self._content_ids: list[int] = []
        self._forced = ForcedToolStream(request) if forces_tools(request) else None
        self.single_call = getattr(request, "parallel_tool_calls", None) is False

    @property
    def active(self) -> bool:
        return self.reasoning is not None or self.tools is not None or self._forced is not None

    # ---- whole output -------------------------------------------------------------
    def parse(self, text: str, token_ids: list[int]) -> tuple[str | None, str | None, list[dict] | None]:
        """(reasoning_content, content, tool_calls) of a finished output."""
        reasoning, content = None, text
        if self.reasoning is not None:
            reasoning, content = self.reasoning.extract_reasoning_content(text, self.request)
            self.reasoning_tokens = self._count_reasoning_tokens(reasoning, content, token_ids)
        tool_calls = None
        forced = forced_tool_calls(self.request, content)
        if forced:  # tool_choice constrained the output to the calls' JSON
            self.tools_called = True
            return reasoning or None, None, forced
        if self.tools is not None:
            info = self.tools.extract_tool_calls(content or "", self.request)
            if info.tools_called:
                self.tools_called = True
                tool_calls = [tool_call_dict(c) for c in info.tool_calls or []]
                for call in tool_calls:
                    call.pop("index", None)
                    call.setdefault("id", f"call_{uuid.uuid4().hex[:24]}")
                    call.setdefault("type", "function")
                content = info.content
                if self.single_call:  # parallel_tool_calls false: the first call only (vLLM's rule)
                    tool_calls = tool_calls[:1]
            # without calls the content stays as given: a tool parser's content then
            # equals it (ours does, and its stream sends the same)
        return reasoning or None, content, tool_calls

    def _count_reasoning_tokens(self, reasoning: str | None, content: str | None, token_ids: list[int]) -> int:
        if not reasoning or self.reasoning is None:
            return 0
        is_end = self.reasoning.is_reasoning_end
        if not is_end(token_ids):
            if content is None:  # still thinking: every token is reasoning
                return len(token_ids)
            return min(len(token_ids), len(self.tokenizer.encode(reasoning)))  # no end-marker id: estimate
        lo, hi = 0, len(token_ids)  # smallest prefix length whose tokens end the reasoning
        while lo < hi:
            mid = (lo + hi) // 2
            if is_end(token_ids[:mid]):
                hi = mid
            else:
                lo = mid + 1
        return lo

    # ---- streaming ----------------------------------------------------------------
    def delta(self, delta_text: str, delta_ids: list[int], finished: bool = False) -> dict[str, Any] | None:
        """The delta message fields for new text, or None when the parsers hold it back.

        ``finished`` marks the output's last delta (it may be empty): the
        parsers then release what they held back, so the deltas of an output,
        joined, are what ``parse`` gives for its whole text.
        """
        prev_text, prev_ids = self._text, self._ids
        self._text, self._ids = prev_text + delta_text, prev_ids + list(delta_ids)
        out: dict[str, Any] = {}
        content_delta: str | None = delta_text
        if self.reasoning is not None:
            # the reasoning parser sees every delta: after the reasoning it still shapes the content
            if not self.reasoning_ended:
                self.reasoning_tokens += len(delta_ids)
            msgs = [self.reasoning.extract_reasoning_content_streaming(
                prev_text, self._text, delta_text, prev_ids, self._ids, list(delta_ids))]
            if finished:
                msgs.append(_finish_streaming(self.reasoning))
            content_delta = ""
            for msg in msgs:
                if msg is not None:
                    _add(out, "reasoning_content", getattr(msg, "reasoning_content", None))
                    content_delta += getattr(msg, "content", None) or ""
            if content_delta or self.reasoning.is_reasoning_end(self._ids):
                self.reasoning_ended = True
        if self._forced is not None:  # the calls' JSON, streamed as tool_calls pieces
            self._content_text += content_delta or ""
            pieces = self._forced.feed(content_delta or "")
            if pieces:
                out["tool_calls"] = pieces
            if finished and forced_tool_calls(self.request, self._content_text):
                self.tools_called = True  # complete calls: finish_reason tool_calls
            elif finished and not self._forced.calls_sent():
                _add(out, "content", self._content_text)  # cut off before a call began: as parse()
            return out or None
        if self.tools is None:
            _add(out, "content", content_delta)
            return out or None
        msgs = []
        if content_delta:
            prev_c, prev_cids = self._content_text, self._content_ids
            self._content_text = prev_c + content_delta
            self._content_ids = prev_cids + list(delta_ids)
            msgs.append(self.tools.extract_tool_calls_streaming(
                prev_c, self._content_text, content_delta, prev_cids, self._content_ids,
                list(delta_ids), self.request))
        if finished:
            msgs.append(_finish_streaming(self.tools, self.request))
        for msg in msgs:
            if msg is None:
                continue
            _add(out, "content", getattr(msg, "content", None))
            calls = getattr(msg, "tool_calls", None) or []
            if calls:
                self.tools_called = True
                out.setdefault("tool_calls", []).extend(
                    tool_call_dict(c, i) for i, c in enumerate(calls, len(out.get("tool_calls", []))))
        if self.single_call and "tool_calls" in out:  # parallel_tool_calls false: the first call only
            out["tool_calls"] = [c for c in out["tool_calls"] if c.get("index", 0) == 0]
            if not out["tool_calls"]:
                del out["tool_calls"]
        return out or None


def _add(out: dict[str, Any], key: str, text: str | None) -> None:
    if text:
        out[key] = out.get(key, "") + text


def _finish_streaming(parser: Any, *args: Any) -> Any:
    """The parser's held-back tail at the end of an output; parsers from plugins
    written to vLLM's interface have no ``finish_streaming`` and hold nothing."""
    finish = getattr(parser, "finish_streaming", None)
    return finish(*args) if callable(finish) else None
