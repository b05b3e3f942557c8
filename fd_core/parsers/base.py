"""The parsers' data types, their two interfaces, and the incremental tag splitter.

The data types mirror the OpenAI message fields the API layer fills in
(``reasoning_content``, ``content``, ``tool_calls``); the interfaces keep
vLLM's method names and arguments so its parsers port with little change.

``TagSplitter`` is the machine every built-in parser runs, in both modes: a
non-streaming parse feeds the whole text at once, a streaming parse feeds
each delta. It only emits text it is sure of and holds back a suffix that
could still turn out to be (part of) a tag, so what it emits does not depend
on how the text was cut into deltas.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "ExtractedToolCalls",
    "FunctionCall",
    "ReasoningParser",
    "TagReasoningParser",
    "TagRule",
    "TagSplitter",
    "TagState",
    "ToolCall",
    "ToolParser",
    "token_id_of",
]


@dataclass
class FunctionCall:
    name: str
    arguments: str  # a JSON text, as OpenAI's "arguments"


@dataclass
class ToolCall:
    id: str
    function: FunctionCall
    type: str = "function"


@dataclass
class DeltaFunctionCall:
    name: str | None = None
    arguments: str | None = None  # a fragment; the fragments of one call concatenate to its JSON


@dataclass
class DeltaToolCall:
    index: int  # position of the call among the response's tool calls
    id: str | None = None  # set on the first delta of a call
    type: str | None = None  # "function" on the first delta of a call
    function: DeltaFunctionCall | None = None


@dataclass
class DeltaMessage:
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] = field(default_factory=list)


@dataclass
class ExtractedToolCalls:
    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None = None  # text outside the calls; None when it is only whitespace


def token_id_of(tokenizer: Any, token: str) -> int | None:
    """The id of an added/special token such as ``"</think>"``, or None when
    there is no tokenizer or it does not have the token as a single id."""
    if tokenizer is None:
        return None
    added = getattr(tokenizer, "added_tokens", None)  # fd_core.tokenizer.Tokenizer
    if isinstance(added, dict) and token in added:
        return int(added[token])
    get_vocab = getattr(tokenizer, "get_vocab", None)  # HF-style tokenizers
    if callable(get_vocab):
        value = get_vocab().get(token)
        return None if value is None else int(value)
    return None


class ReasoningParser(abc.ABC):
    """Splits a model's output into ``reasoning_content`` and ``content``.

    One instance serves one request: the API layer creates it per request
    (streaming parsers keep state between deltas). ``tokenizer`` is a
    ``fd_core.tokenizer.Tokenizer`` or None; parsers work from the text alone
    and use token ids only where the caller gives ids.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @abc.abstractmethod
    def is_reasoning_end(self, token_ids: list[int]) -> bool:
        """Whether the reasoning part is over in ``token_ids`` (e.g. the prompt
        pre-fills an empty think block when thinking is disabled). Called by
        the API layer on the prompt ids and on the output ids so far."""

    @abc.abstractmethod
    def extract_reasoning_content(
        self, model_output: str, request: Any = None
    ) -> tuple[str | None, str | None]:
        """``(reasoning_content, content)`` of a complete output; None for an empty part."""

    @abc.abstractmethod
    def extract_reasoning_content_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: list[int],
        current_token_ids: list[int],
        delta_token_ids: list[int],
    ) -> DeltaMessage | None:
        """The reasoning/content to send for ``delta_text`` (``current_text =
        previous_text + delta_text``); None when there is nothing to send yet."""


class ToolParser(abc.ABC):
    """Finds tool calls in a model's output (after any reasoning was split off).

    One instance per request, as for ``ReasoningParser``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @abc.abstractmethod
    def extract_tool_calls(self, model_output: str, request: Any = None) -> ExtractedToolCalls:
        """The calls in a complete output and the text outside them. Never raises
        on malformed model output: what is not a valid call stays text."""

    @abc.abstractmethod
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
        """Content and tool-call deltas for ``delta_text``; None when there is
        nothing to send yet."""


# ------------------------------------------------------------------ splitting


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
    next text decides it; at the end of an output it is never released, in
    streaming and non-streaming alike, so both give the same result. No
    tag may contain another tag of the same state.
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
        out = self.new_splitter().feed(text)
        return out["reasoning"] or None, out["content"] or None

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
        out = splitter.feed(delta_text)
        if not out["reasoning"] and not out["content"]:
            return None
        return DeltaMessage(reasoning_content=out["reasoning"] or None, content=out["content"] or None)
