"""Helpers shared by the parser tests: random splits and stream replay."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest


def splits(text: str, seed: int) -> Iterator[list[str]]:
    """Ways to cut ``text`` into deltas: whole, per character, random chunks."""
    yield [text]
    yield list(text)
    rng = random.Random(seed)
    for _ in range(20):
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, 12)
            pieces.append(text[i : i + n])
            i += n
        yield pieces


def stream_reasoning(parser, deltas: list[str]) -> tuple[str, str, list]:
    """Feed ``deltas`` to a streaming reasoning parser, then end the output;
    returns the joined reasoning, the joined content and the messages."""
    previous, messages = "", []
    for delta in deltas:
        current = previous + delta
        messages.append(parser.extract_reasoning_content_streaming(previous, current, delta, [], [], []))
        previous = current
    messages.append(parser.finish_streaming())
    messages = [m for m in messages if m is not None]
    reasoning = "".join(m.reasoning_content or "" for m in messages)
    content = "".join(m.content or "" for m in messages)
    return reasoning, content, messages


@pytest.fixture(scope="session")
def tokenizer(checkpoint_factory):
    from fd_core.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(checkpoint_factory("tiny-dense", "pytorch"))
