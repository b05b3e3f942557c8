"""ERNIE-4.5 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Any number of blocks, with text around them. A block runs from
``<tool_call>`` to the next ``</tool_call>``, or to the end of the output
when it never closes. Rules, the same streamed and not:

- A block whose text starts with a JSON object with a string ``"name"``
  is a call, from the moment that object is complete, closed or not;
  ``arguments`` (an object, or a string holding JSON; ``{}`` when absent)
  is re-serialised with ``json.dumps(..., ensure_ascii=False)``. The rest
  of the block, up to ``</tool_call>``, is dropped.
- Any other block stays in the content verbatim, tags included: a closed
  block that is not a call (invalid JSON, no name, prose), and an unclosed
  one whose object never completed (e.g. ``max_tokens`` inside a call, or
  a ``<tool_call>`` followed by a plain answer). Nothing raises, and no
  text is lost.
- Text outside the blocks is the content. When the output has calls and
  the content is only whitespace, the content is None (non-streaming) or
  not sent (streaming); without calls the content is the text unchanged.

Streaming sends a call whole, once its JSON object is complete: one
``DeltaToolCall`` with index, id, type, name and the full arguments. That
makes the streamed arguments equal the non-streamed ones exactly, whatever
spacing the model used; the cost is that a call's arguments do not trickle
out token by token. A block that may still become a call is held back
until it is decided (a block that does not start with ``{`` is decided at
once); ``finish_streaming`` releases, as content, what the end of the
output decided.
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


def _held_back(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    return next((n for n in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:n])), 0)


class _CallSplitter:
    """Incremental: text in, (content, calls) out; see the module docstring.

    ``block`` is None outside a block; inside one it is ``"open"`` while the
    block may still become a call (its text, after START, is held back),
    ``"call"`` once its call was emitted (the rest is dropped) and
    ``"text"`` once it cannot be a call (passed through verbatim). Every
    decision depends only on the text so far, never on where it was cut.
    """

    def __init__(self) -> None:
        self.pending = ""  # undecided text: a possible START/END prefix, or an open block's text
        self.block: str | None = None
        self.num_calls = 0
        self.content_started = False  # non-whitespace content was emitted
        self.blank = ""  # leading whitespace content, held until content starts or the output ends
        self.fed = 0  # characters fed so far

    def _content(self, text: str) -> str:
        if self.content_started or not text:
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
            if self.block is None:
                index = buf.find(START)
                if index == -1:
                    hold = _held_back(buf, START)
                    content += self._content(buf[: len(buf) - hold])
                    buf = buf[len(buf) - hold:]
                    break
                content += self._content(buf[:index])
                buf = buf[index + len(START):]
                self.block = "open"
                continue
            end = buf.find(END)
            if self.block == "open":
                body = buf if end == -1 else buf[:end]
                # a JSON object can only complete on a "}" this text brought
                verdict = _verdict(body, may_be_complete="}" in text)
                if verdict is None and end == -1:
                    break
                if isinstance(verdict, FunctionCall):
                    calls.append(verdict)
                    self.num_calls += 1
                    self.block = "call"
                else:  # not a call: the block is text, its START included
                    content += self._content(START)
                    self.block = "text"
                continue
            if end == -1:
                hold = _held_back(buf, END)
                if self.block == "text":
                    content += self._content(buf[: len(buf) - hold])
                buf = buf[len(buf) - hold:]
                break
            if self.block == "text":
                content += self._content(buf[: end + len(END)])
            buf = buf[end + len(END):]
            self.block = None
        self.pending = buf
        return content, calls

    def finish(self) -> str:
        """End of output: the content still held back (calls are all out by now)."""
        buf, self.pending = self.pending, ""
        if self.block == "open":  # its object never completed: not a call
            buf = START + buf
        content = "" if self.block == "call" else self._content(buf)
        if not self.content_started and not self.num_calls:
            content, self.blank = self.blank, ""  # whitespace-only content is dropped only beside calls
        return content


def _verdict(body: str, may_be_complete: bool) -> FunctionCall | bool | None:
    """What an open block's text decides: its call, False (not a call), or None (not yet)."""
    text = body.lstrip()
    if not text:
        return None
    if not text.startswith("{"):
        return False
    if not may_be_complete:
        return None
    complete, value = _decode_object(text)
    if not complete:
        return None
    return _as_call(value) or False


class ErnieX1ToolParser(ToolParser):
    """``--tool-call-parser ernie_x1`` (also ``ernie-x1``)."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._splitter: _CallSplitter | None = None
        self._num_calls = 0

    def extract_tool_calls(self, model_output: str, request: Any = None) -> ExtractedToolCalls:
        splitter = _CallSplitter()
        content, calls = splitter.feed(model_output)
        content += splitter.finish()
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
        return self._message(*splitter.feed(delta_text))

    def finish_streaming(self, request: Any = None) -> DeltaMessage | None:
        splitter, self._splitter = self._splitter, None
        return None if splitter is None else self._message(splitter.finish(), [])

    def _message(self, content: str, calls: list[FunctionCall]) -> DeltaMessage | None:
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
