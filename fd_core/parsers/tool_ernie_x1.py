"""ERNIE-4.5 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Any number of blocks, with text around them. Rules, the same in both modes:

- A block whose text starts with a JSON object with a string ``"name"``
  becomes a call as soon as that object is complete; ``arguments`` (an
  object, or a string holding JSON; ``{}`` when absent) is re-serialised
  with ``json.dumps(..., ensure_ascii=False)``. Text after the object up to
  ``</tool_call>`` is dropped.
- A closed block that is not such a call (invalid JSON, no name) stays in
  the content verbatim, tags included; nothing raises.
- A block cut off by the end of the output (e.g. ``max_tokens`` inside a
  call) is kept as a call when its JSON object is already complete, and
  dropped otherwise: a half-written argument is never passed on as a call.
- Text outside the blocks is the content; None (non-streaming) or not sent
  (streaming) while it is only whitespace.

Streaming sends a call whole, once its JSON object is complete: one
``DeltaToolCall`` with index, id, type, name and the full arguments. That
makes the streamed arguments equal the non-streamed ones exactly, whatever
spacing the model used; the cost is that a call's arguments do not trickle
out token by token.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fd_core.parsers.base import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCalls,
    FunctionCall,
    ToolCall,
    ToolParser,
)

__all__ = ["ErnieX1ToolParser", "make_tool_call_id"]

START, END = "<tool_call>", "</tool_call>"
_decoder = json.JSONDecoder()


def make_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex}"


def _as_call(obj: Any) -> FunctionCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass  # a plain string: pass it on as a JSON string
    return FunctionCall(name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))


def _decode_object(text: str) -> tuple[bool, Any]:
    """``(complete, value)`` for the JSON object that ``text`` starts with."""
    text = text.lstrip()
    if not text.startswith("{"):
        return False, None
    try:
        return True, _decoder.raw_decode(text)[0]
    except json.JSONDecodeError:
        return False, None


class _CallSplitter:
    """Incremental: text in, (content, calls) out; see the module docstring."""

    def __init__(self) -> None:
        self.pending = ""  # undecided text: a possible START prefix, or an open block
        self.in_block = False
        self.block_done = False  # the open block's call was already emitted
        self.content_started = False  # non-whitespace content was emitted
        self.blank = ""  # leading whitespace content, held until content starts
        self.fed = 0

    def _content(self, text: str) -> str:
        if self.content_started:
            return text
        self.blank += text
        if not self.blank.strip():
            return ""
        self.content_started = True
        text, self.blank = self.blank, ""
        return text

    def feed(self, text: str) -> tuple[str, list[FunctionCall]]:
        self.fed += len(text)
        buf = self.pending + text
        content, calls = "", []
        while True:
            if not self.in_block:
                index = buf.find(START)
                if index == -1:
                    hold = next((n for n in range(min(len(START) - 1, len(buf)), 0, -1)
                                 if buf.endswith(START[:n])), 0)
                    content += self._content(buf[: len(buf) - hold])
                    buf = buf[len(buf) - hold:]
                    break
                content += self._content(buf[:index])
                buf = buf[index + len(START):]
                self.in_block, self.block_done = True, False
                continue
            end = buf.find(END)
            body = buf if end == -1 else buf[:end]
            # the object can only have completed if this text brought a "}"
            if not self.block_done and ("}" in text or end != -1):
                complete, value = _decode_object(body)
                call = _as_call(value) if complete else None
                if call is not None:
                    calls.append(call)
                    self.block_done = True
                elif end != -1:  # closed, and not a call: it is text
                    content += self._content(START + body + END)
            if end == -1:
                break
            buf = buf[end + len(END):]
            self.in_block = False
        self.pending = buf
        return content, calls


class ErnieX1ToolParser(ToolParser):
    """``--tool-call-parser ernie_x1`` (also ``ernie-x1``)."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._splitter: _CallSplitter | None = None
        self._num_calls = 0

    def extract_tool_calls(self, model_output: str, request: Any = None) -> ExtractedToolCalls:
        content, calls = _CallSplitter().feed(model_output)
        tool_calls = [ToolCall(id=make_tool_call_id(), function=f) for f in calls]
        return ExtractedToolCalls(bool(tool_calls), tool_calls, content or None)

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
        splitter = self._splitter
        if splitter is None or splitter.fed != len(previous_text):
            # first call, or the caller restarted: catch up on what came before
            splitter = self._splitter = _CallSplitter()
            self._num_calls = len(splitter.feed(previous_text)[1])
        content, calls = splitter.feed(delta_text)
        if not content and not calls:
            return None
        deltas = []
        for call in calls:
            deltas.append(DeltaToolCall(
                index=self._num_calls, id=make_tool_call_id(), type="function",
                function=DeltaFunctionCall(name=call.name, arguments=call.arguments),
            ))
            self._num_calls += 1
        return DeltaMessage(content=content or None, tool_calls=deltas)
