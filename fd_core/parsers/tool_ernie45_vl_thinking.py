"""ERNIE-4.5-VL-28B-A3B-Thinking's tool calls (``--tool-call-parser ernie-45-vl-thinking``).

The blocks are ERNIE's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(``tool_ernie_x1`` parses them), with FastDeploy's rule for this model: the calls
must come first in the answer (after ``</think>`` only newlines or spaces). An
answer that starts with prose is all content, ``<tool_call>`` text included,
streamed or not. The chat layer runs this on the content the reasoning parser
(``ernie-45-vl-thinking``, the ``ernie-45-vl`` rules) left.
"""

from __future__ import annotations

from typing import Any

from fd_core.parsers.base import DeltaMessage, ExtractedToolCalls
from fd_core.parsers.tool_ernie_x1 import ErnieX1ToolParser

__all__ = ["Ernie45VLThinkingToolParser"]

_START = "<tool_call>"


def _prose_first(text: str) -> bool:
    """True once ``text`` (the answer so far) shows something other than a call first."""
    head = text.lstrip()
    return bool(head) and not (head.startswith(_START) or _START.startswith(head))


class Ernie45VLThinkingToolParser(ErnieX1ToolParser):
    """``--tool-call-parser ernie-45-vl-thinking``."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._plain = False  # the answer began with prose: everything is content

    def extract_tool_calls(self, model_output: str, request: Any = None) -> ExtractedToolCalls:
        if _prose_first(model_output):
            return ExtractedToolCalls(False, [], model_output)
        return super().extract_tool_calls(model_output, request)

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                     previous_token_ids: list[int], current_token_ids: list[int],
                                     delta_token_ids: list[int], request: Any = None) -> DeltaMessage | None:
        if self._plain:
            return DeltaMessage(content=delta_text) if delta_text else None
        if _prose_first(current_text):  # nothing was sent yet: leading blanks and a tag prefix were held
            self._plain = True
            self._splitter = None
            return DeltaMessage(content=current_text) if current_text else None
        return super().extract_tool_calls_streaming(previous_text, current_text, delta_text, previous_token_ids,
                                                    current_token_ids, delta_token_ids, request)

    def finish_streaming(self, request: Any = None) -> DeltaMessage | None:
        return None if self._plain else super().finish_streaming(request)
