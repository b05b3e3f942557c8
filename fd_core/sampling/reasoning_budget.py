"""The thinking budget (``reasoning_max_tokens``), as FastDeploy's ``</think>`` strategy.

Where the reasoning is: a request's output starts inside reasoning unless
its prompt already closed a think block in the current turn (the prompt's
last ``</think>`` comes after its last ``<think>`` and its last turn
boundary: ``enable_thinking=false`` pre-fills ``<think>\\n\\n</think>\\n\\n``).
That is the ``ernie_x1`` reasoning parser's rule (``is_reasoning_end``):
with no ``</think>`` everything the model writes is reasoning. The
reasoning ends at the first ``</think>`` in the output.

The budget (FastDeploy's ``limit_thinking_content_length_v1``, the default
``FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR="</think>"``): while the output is
still inside reasoning,

- output token ``N + 1`` (N = ``reasoning_max_tokens``) is replaced by
  ``</think>``; nothing else is forced (no newline);
- an EOS sampled before that is replaced by ``</think>`` too, so a thinking
  model that gives up early still answers (FastDeploy does the same).

The state is derived from the output tokens alone (a scan cached by
length), so a preempted and recomputed request resumes exactly.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

__all__ = ["ReasoningBudget", "ThinkingTokens", "prompt_ends_reasoning"]

THINK_START = "<think>"
THINK_END = "</think>"
# tokens that open or close a chat turn (as TagReasoningParser.turn_boundaries):
# a think block before one of them belongs to an earlier turn
TURN_BOUNDARIES = ("<|end_of_sentence|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class ThinkingTokens:
    """The model's thinking markers, looked up in its tokenizer at engine start."""

    end_id: int  # "</think>"
    start_id: int | None = None  # "<think>"
    boundary_ids: frozenset[int] = frozenset()


def prompt_ends_reasoning(prompt: Sequence[int], tokens: ThinkingTokens) -> bool:
    """True when ``prompt`` closed a think block in its last turn (boundary
    tokens at the very end are passed over, as the reasoning parser does)."""
    end = len(prompt)
    while end and prompt[end - 1] in tokens.boundary_ids:
        end -= 1
    for i in range(end - 1, -1, -1):
        token = prompt[i]
        if token == tokens.end_id:
            return True
        if token == tokens.start_id or token in tokens.boundary_ids:
            return False
    return False


@dataclass
class ReasoningBudget:
    """One request's budget; ``next_token`` picks what it emits each step."""

    budget: int  # reasoning_max_tokens
    end_id: int
    _scanned: int = field(default=0, repr=False)  # output tokens already searched for end_id
    _ended: bool = field(default=False, repr=False)

    def in_reasoning(self, output: Sequence[int]) -> bool:
        """Whether ``output`` (all output tokens so far) holds no ``</think>`` yet."""
        if len(output) < self._scanned:  # shorter than last time: scan again
            self._scanned, self._ended = 0, False
        if not self._ended:
            for i in range(self._scanned, len(output)):
                if output[i] == self.end_id:
                    self._ended = True
                    break
            self._scanned = len(output)
        return not self._ended

    def next_token(self, output: Sequence[int], sampled: int, eos_token_ids: Collection[int]) -> int:
        """The token to emit after ``output`` instead of ``sampled``."""
        if not self.in_reasoning(output):
            return sampled
        if len(output) >= self.budget or sampled in eos_token_ids:
            return self.end_id
        return sampled
