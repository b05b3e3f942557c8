"""ERNIE-4.5 Thinking (X1): ``[<think>]reasoning</think>`` then the answer.

The answer is a ``<response>...</response>`` block, tool calls
(``<tool_call>...</tool_call>``), or both. ``reasoning_content`` is the text
before ``</think>`` (a leading ``<think>`` and the newline before
``</think>`` removed); ``content`` is the inside of the response blocks
(newlines after ``<response>`` and the one before ``</response>`` removed)
plus any other text after ``</think>``, tool-call blocks kept verbatim for
the tool parser (the API layer runs it on the content). Newlines right
after ``</think>``, ``</response>`` and ``</tool_call>`` are dropped.

With no ``</think>`` at all, everything is reasoning: the model is still
thinking (FastDeploy's ``ernie_x1`` does the same), and that is also what a
stream shows before ``</think>`` arrives. So streamed deltas always add up
to the one-shot result, for any split of the text.

``is_reasoning_end`` is true once ``</think>`` was generated (FastDeploy
looks for ``<tool_call>`` instead; ``</think>`` is what ends reasoning in
both kinds of answer).
"""

from __future__ import annotations

from typing import Any

from fd_core.parsers.tags import TagReasoningParser, TagRule, TagSplitter, TagState

__all__ = ["ErnieX1ReasoningParser"]

_STATES = {
    "think": TagState("reasoning", {"</think>": TagRule("answer", drop_newline_before=True)}),
    "answer": TagState("content", {
        "<response>": TagRule("response"),
        "<tool_call>": TagRule("tool_call", keep_tag=True, drop_newlines_after=False),
    }),
    "response": TagState("content", {"</response>": TagRule("answer", drop_newline_before=True)}),
    "tool_call": TagState("content", {"</tool_call>": TagRule("answer", keep_tag=True)}),
}


class ErnieX1ReasoningParser(TagReasoningParser):
    """``--reasoning-parser ernie_x1`` (also ``ernie-x1``)."""

    def new_splitter(self) -> TagSplitter:
        return TagSplitter(_STATES, "start", start_tag=self.think_start, start_next="think")

    def extract_reasoning_content(
        self, model_output: str, request: Any = None
    ) -> tuple[str | None, str | None]:
        return self.split(model_output)
