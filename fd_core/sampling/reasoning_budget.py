"""The thinking budget (``reasoning_max_tokens``), as FastDeploy's kernels do it.

Where the reasoning is: a request's output starts inside reasoning unless
its prompt already closed a think block in the current turn (the prompt's
last ``</think>`` comes after its last ``<think>`` and its last turn
boundary: ``enable_thinking=false`` pre-fills ``<think>\\n\\n</think>\\n\\n``).
That is the ``ernie_x1`` reasoning parser's rule (``is_reasoning_end``):
with no ``</think>`` everything the model writes is reasoning. The model
ends the reasoning itself with its first ``</think>``.

The budget: ``FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR`` (``"</think>"``,
the default, for ERNIE-4.5-VL; ``"\\n</think>\\n\\n"`` for ERNIE-X1 and
ERNIE-4.5-21B-A3B-Thinking) is tokenized once at engine start into the
*forced sequence* (``forced_sequence``). While the output is still inside
reasoning,

- output token ``N + 1`` (N = ``reasoning_max_tokens``) and the ones after
  it are replaced by the forced sequence, one token a step; the budget
  counts sampled tokens only, so the reasoning ends up ``N + len(forced)``
  tokens long. A ``</think>`` the model samples at ``N + 1`` itself stands
  and nothing is forced;
- an EOS sampled before that starts the forced sequence too (it replaces
  the EOS), so a thinking model that gives up early still answers;
- once forcing began it runs to the end whatever is sampled; the reasoning
  is over when it is complete (FastDeploy's ``limit_thinking_content_length``
  kernels behave the same: ``custom_ops/gpu_ops/limit_thinking_content_length*.cu``).

The scheduler still stops a request at ``max_tokens`` / ``max_model_len``:
one reaching it in the middle of the forced sequence just stops there.

The state is the output tokens (a scan for the first ``</think>``, cached
by length) plus the position where an EOS started forcing early; the
output outlives preemption, so a recomputed request resumes exactly.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReasoningBudget", "ThinkingTokens", "forced_sequence", "prompt_ends_reasoning"]

THINK_START = "<think>"
THINK_END = "</think>"
# tokens that open or close a chat turn (as TagReasoningParser.turn_boundaries):
# a think block before one of them belongs to an earlier turn
TURN_BOUNDARIES = ("<|end_of_sentence|>", "<|im_start|>", "<|im_end|>")
# the newline's token: the vocabulary's own "\n" piece (ERNIE's), else its byte piece
NEWLINE_PIECES = ("\n", "<0x0A>")


@dataclass(frozen=True)
class ThinkingTokens:
    """The model's thinking markers, looked up in its tokenizer at engine start."""

    end_id: int  # "</think>"
    start_id: int | None = None  # "<think>"
    boundary_ids: frozenset[int] = frozenset()
    # what the budget forces, one token a step; () means (end_id,)
    forced_ids: tuple[int, ...] = ()


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


def forced_sequence(text: str, tokenizer: Any) -> tuple[int, ...]:
    """The token ids of ``text`` as the budget forces them: each newline is the
    tokenizer's newline token (so ``"\\n\\n"`` is two of them, as FastDeploy's
    ``line_break_id``), the rest is ``tokenizer.encode`` (``"</think>"`` its
    added token). ValueError when that does not give ``text`` back or holds
    no ``</think>`` token."""
    added = tokenizer.added_tokens
    if THINK_END not in added:
        raise ValueError(f"the tokenizer has no {THINK_END!r} token")
    newline = _newline_id(tokenizer)
    ids: list[int] = []
    for k, part in enumerate(text.split("\n")):
        if k:
            if newline is None:
                raise ValueError("the tokenizer has no newline token ('\\n' or '<0x0A>')")
            ids.append(newline)
        ids += tokenizer.encode(part) if part else []
    if tokenizer.decode(ids) != text:
        raise ValueError(f"its tokens {ids} decode to {tokenizer.decode(ids)!r}, not to the value")
    if added[THINK_END] not in ids:
        raise ValueError(f"its tokens {ids} hold no {THINK_END!r} token ({added[THINK_END]})")
    return tuple(ids)


def _newline_id(tokenizer: Any) -> int | None:
    for piece in NEWLINE_PIECES:
        i = tokenizer.convert_tokens_to_ids(piece)
        if i is not None and tokenizer.convert_ids_to_tokens(i) == piece:  # an unknown piece maps to <unk>
            return int(i)
    ids = tokenizer.encode("\n")  # byte-level BPE spells it "\u010a"
    return int(ids[0]) if len(ids) == 1 and tokenizer.decode(ids) == "\n" else None


@dataclass
class ReasoningBudget:
    """One request's budget; ``next_token`` picks what it emits each step."""

    budget: int  # reasoning_max_tokens
    end_id: int
    forced: tuple[int, ...] = ()  # forced when the budget is spent; () means (end_id,)
    _scanned: int = field(default=0, repr=False)  # output tokens already searched for end_id
    _end_at: int | None = field(default=None, repr=False)  # position of the first end_id
    _started_at: int | None = field(default=None, repr=False)  # where an EOS started forcing

    def __post_init__(self) -> None:
        if not self.forced:
            self.forced = (self.end_id,)
        assert self.end_id in self.forced, "the forced sequence must close the reasoning"

    def _first_end(self, output: Sequence[int]) -> int | None:
        if len(output) < self._scanned:  # shorter than last time: scan again
            self._scanned, self._end_at = 0, None
            if self._started_at is not None and self._started_at >= len(output):
                self._started_at = None
        if self._end_at is None:
            for i in range(self._scanned, len(output)):
                if output[i] == self.end_id:
                    self._end_at = i
                    break
            self._scanned = len(output)
        return self._end_at

    def in_reasoning(self, output: Sequence[int]) -> bool:
        """Whether ``output`` (all output tokens so far) holds no ``</think>`` yet."""
        return self._first_end(output) is None

    def reasoning_over(self, output: Sequence[int]) -> bool:
        """Whether the reasoning is over after ``output``: a ``</think>`` is in it and no
        forced sequence is still being emitted (structured output starts here)."""
        end_at = self._first_end(output)
        return end_at is not None and self._forcing_from(output, end_at) is None

    def _forcing_from(self, output: Sequence[int], end_at: int | None) -> int | None:
        """Where the forced sequence ``output`` stops in the middle of began, or None."""
        pos = len(output)
        for start in (self.budget, self._started_at):
            if (start is not None and start < pos < start + len(self.forced)
                    and (end_at is None or end_at >= start)
                    and all(output[start + k] == self.forced[k] for k in range(pos - start))):
                return start
        return None

    def next_token(self, output: Sequence[int], sampled: int, eos_token_ids: Collection[int]) -> int:
        """The token to emit after ``output`` instead of ``sampled``."""
        end_at = self._first_end(output)
        start = self._forcing_from(output, end_at)
        if start is not None:
            return self.forced[len(output) - start]
        if end_at is not None or sampled == self.end_id:
            return sampled
        if len(output) >= self.budget or sampled in eos_token_ids:
            if len(output) != self.budget:
                self._started_at = len(output)
            return self.forced[0]
        return sampled
