"""Qwen3: ``[<think>]reasoning</think>answer``.

``reasoning_content`` is the text before ``</think>`` (a leading ``<think>``,
the newlines after it and the newline before ``</think>`` removed);
``content`` is the text after it, leading newlines removed. An output with
no ``</think>`` is all reasoning: the model was still thinking when it
stopped (e.g. at ``max_tokens``).

That last rule is what a stream can show: it cannot know that ``</think>``
will never come, so it sends the text before ``</think>`` as reasoning, and
the one-shot result says the same (FastDeploy's ``qwen3`` returns such an
output as content when not streaming, so its two modes disagree).
When thinking is disabled the prompt already holds the empty think block,
``is_reasoning_end(prompt ids)`` is true, and the API layer does not run
the reasoning parser at all (as vLLM does): the whole output is content.
"""

from __future__ import annotations

from typing import Any

from fd_core.parsers.tags import TagReasoningParser, TagRule, TagSplitter, TagState

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
        return self.split(model_output)
