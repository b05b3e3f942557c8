"""The incremental tag splitter the built-in reasoning parsers run.

``TagSplitter`` is the machine, in both modes: a non-streaming parse feeds
the whole text at once, a streaming parse feeds each delta; both then call
``finish``. It only emits text it is sure of and holds back a suffix that
could still turn out to be (part of) a tag, which ``finish`` releases, so
what it emits does not depend on how the text was cut into deltas.
``TagReasoningParser`` is a reasoning parser built on it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from fd_core.parsers.base import DeltaMessage, ReasoningParser, token_id_of

__all__ = ["TagReasoningParser", "TagRule", "TagSplitter", "TagState"]


@dataclass(frozen=True)
class TagRule:
    """What a tag does in the state where it is recognised."""

    next_state: str
    keep_tag: bool = False  # emit the tag's own text on the state's channel
    drop_newline_before: bool = False  # drop one "\n" right before the tag
    drop_newlines_after: bool = True  # drop the "\n"s right after the tag


@dataclass(frozen=True)
class TagState:
    channel: str  # "reasoning" or "content"
    tags: dict[str, TagRule]


class TagSplitter:
    """An incremental splitter of text into channels at tags.

    ``states`` maps a state name to the channel its text goes to and the tags
    that leave it. Newlines right after a tag are dropped unless its rule
    says not to; a tag with ``drop_newline_before`` also drops one newline
    before it. The state ``"start"`` is special: it holds text back while
    the text could still be ``start_tag`` (which is dropped, with the
    newlines after it), then moves to ``start_next``.

    Text is held back while it could still be a prefix of a tag of the
    current state, and a single trailing newline is held back while it could
    be the one dropped before such a tag. Held-back text is released when the
    next text decides it, or by ``finish`` at the end of the output (on the
    current state's channel; in ``"start"``, on ``start_next``'s), in
    streaming and non-streaming alike, so both give the same result. No tag
    may contain another tag of the same state.
    """

    def __init__(self, states: dict[str, TagState], initial: str, start_tag: str = "",
                 start_next: str = "") -> None:
        if initial == "start" and not (start_tag and start_next in states):
            raise ValueError("a splitter starting in 'start' needs a start_tag and a known start_next")
        self.states = states
        self.state = initial
        self.start_tag = start_tag
        self.start_next = start_next
        self.pending = ""  # text fed but not yet decided
        self.skip_newlines = False  # drop "\n" at the start of the next text
        self.fed = 0  # characters fed so far

    def feed(self, text: str) -> dict[str, str]:
        """Consume ``text``; returns ``{"reasoning": ..., "content": ...}``
        (each possibly empty) decided by it."""
        out = {"reasoning": "", "content": ""}
        self.fed += len(text)
        buf = self.pending + text
        while True:
            if self.state == "start":
                if buf.startswith(self.start_tag):
                    buf = buf[len(self.start_tag):]
                    self.state, self.skip_newlines = self.start_next, True
                    continue
                if self.start_tag.startswith(buf):  # still could be the start tag
                    break
                self.state = self.start_next
                continue
            if self.skip_newlines:
                stripped = buf.lstrip("\n")
                if not stripped:
                    buf = ""
                    break
                buf, self.skip_newlines = stripped, False
            spec = self.states[self.state]
            hit = _earliest(buf, spec.tags)
            if hit is None:
                hold = _held_back(buf, spec.tags)
                out[spec.channel] += buf[: len(buf) - hold]
                buf = buf[len(buf) - hold:]
                break
            index, tag = hit
            rule = spec.tags[tag]
            before = buf[:index]
            if rule.drop_newline_before and before.endswith("\n"):
                before = before[:-1]
            out[spec.channel] += before + (tag if rule.keep_tag else "")
            buf = buf[index + len(tag):]
            self.state, self.skip_newlines = rule.next_state, rule.drop_newlines_after
        self.pending = buf
        return out

    def finish(self) -> dict[str, str]:
        """End of output: the held-back text, which no tag can complete now."""
        out = {"reasoning": "", "content": ""}
        state = self.start_next if self.state == "start" else self.state
        out[self.states[state].channel] += self.pending
        self.pending = ""
        return out


def _earliest(text: str, tags: dict[str, TagRule]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for tag in tags:
        index = text.find(tag)
        if index != -1 and (best is None or index < best[0]):
            best = (index, tag)
    return best


def _held_back(text: str, tags: dict[str, TagRule]) -> int:
    """Length of the suffix of ``text`` that may still become a tag (with the
    newline such a tag would drop)."""
    hold = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), hold, -1):
            if text.endswith(tag[:n]):
                hold = n
                break
    if any(rule.drop_newline_before for rule in tags.values()):
        if text[: len(text) - hold].endswith("\n"):
            hold += 1
    return hold


class TagReasoningParser(ReasoningParser):
    """A reasoning parser driven by a ``TagSplitter``: subclasses say how to
    build the splitter; ``is_reasoning_end`` looks for ``</think>`` ids."""

    think_start = "<think>"
    think_end = "</think>"
    # Tokens that open or close a chat turn: reasoning before one of them
    # belongs to an earlier turn of the prompt, not to this answer.
    turn_boundaries = ("<|end_of_sentence|>", "<|im_start|>", "<|im_end|>")

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.think_start_id = token_id_of(tokenizer, self.think_start)
        self.think_end_id = token_id_of(tokenizer, self.think_end)
        self._boundary_ids = {
            i for t in self.turn_boundaries if (i := token_id_of(tokenizer, t)) is not None
        }
        self._splitter: TagSplitter | None = None

    @abc.abstractmethod
    def new_splitter(self) -> TagSplitter:
        """A fresh splitter positioned at the start of an output."""

    def is_reasoning_end(self, token_ids: list[int]) -> bool:
        """True when the last ``</think>`` comes after the last ``<think>`` and
        after the last turn boundary (so an earlier turn's reasoning in the
        prompt does not count; boundaries at the very end, such as the stop
        token closing this answer, are passed over). Without the ids (no
        tokenizer): False."""
        if self.think_end_id is None:
            return False
        end = len(token_ids)
        while end and token_ids[end - 1] in self._boundary_ids:
            end -= 1
        for token in reversed(token_ids[:end]):
            if token == self.think_end_id:
                return True
            if token == self.think_start_id or token in self._boundary_ids:
                return False
        return False

    def split(self, text: str) -> tuple[str | None, str | None]:
        """A complete output through a fresh splitter: what streaming it, in any
        deltas, followed by ``finish_streaming``, adds up to."""
        splitter = self.new_splitter()
        out, tail = splitter.feed(text), splitter.finish()
        reasoning, content = out["reasoning"] + tail["reasoning"], out["content"] + tail["content"]
        return reasoning or None, content or None

    def extract_reasoning_content_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: list[int],
        current_token_ids: list[int],
        delta_token_ids: list[int],
    ) -> DeltaMessage | None:
        splitter = self._splitter
        if splitter is None or splitter.fed != len(previous_text):
            # first call, or the caller restarted: catch up on what came before
            splitter = self._splitter = self.new_splitter()
            splitter.feed(previous_text)
        return _message(splitter.feed(delta_text))

    def finish_streaming(self) -> DeltaMessage | None:
        splitter, self._splitter = self._splitter, None
        return None if splitter is None else _message(splitter.finish())


def _message(out: dict[str, str]) -> DeltaMessage | None:
    if not out["reasoning"] and not out["content"]:
        return None
    return DeltaMessage(reasoning_content=out["reasoning"] or None, content=out["content"] or None)
