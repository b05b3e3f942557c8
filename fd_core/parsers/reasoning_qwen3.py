"""Qwen3: ``[<think>]reasoning</think>answer``.

``reasoning_content`` is the text before ``</think>`` (a leading ``<think>``,
the newlines after it and the newline before ``</think>`` removed);
``content`` is the text after it, leading newlines removed. An output with
no ``</think>`` is all content (thinking disabled); a leading ``<think>`` is
still removed.

Streaming cannot know that ``</think>`` will never come, so a stream shows
the text before ``</think>`` as reasoning. When thinking is disabled the
prompt already holds the empty think block, ``is_reasoning_end(prompt ids)``
is true, and the API layer should then not run the reasoning parser at all
(as vLLM does); with that, streaming and non-streaming agree.
"""

from __future__ import annotations

from typing import Any

from fd_core.parsers.base import TagReasoningParser, TagRule, TagSplitter, TagState

__all__ = ["Qwen3ReasoningParser"]

_STATES = {
    "think": TagState("reasoning", {"</think>": TagRule("answer", drop_newline_before=True)}),
    "answer": TagState("content", {}),
}


class Qwen3ReasoningParser(TagReasoningParser):
    """``--reasoning-parser qwen3``."""

    def new_splitter(self) -> TagSplitter:
        return TagSplitter(_STATES, "start", start_tag=self.think_start, start_next="think")

    def extract_reasoning_content(
        self, model_output: str, request: Any = None
    ) -> tuple[str | None, str | None]:
        if self.think_end not in model_output:
            text = model_output
            if text.startswith(self.think_start):
                text = text[len(self.think_start):].lstrip("\n")
            return None, text or None
        return self.split(model_output)
