"""Tokenizing request text without stalling the server.

Text that could not fit in the tokens allowed, whatever its tokens, is refused
by its length alone (a token covers at most ``max_token_bytes`` bytes, so at
most that many characters), and long text is tokenized on a worker thread, so
a 40 MB prompt neither takes minutes of the event loop nor delays /health.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fd_core.entrypoints.openai.errors import OpenAIError

__all__ = ["INLINE_CHARS", "encode_text"]

INLINE_CHARS = 16384  # shorter text is tokenized in place: a thread costs more than it saves
_FALLBACK_TOKEN_BYTES = 64  # a tokenizer that does not say how long its longest token is


async def encode_text(tokenizer: Any, text: str, max_tokens: int, field: str,
                      encode: Callable[[str], list[int]] | None = None) -> list[int]:
    """Token ids of ``text`` (by ``encode``, default ``tokenizer.encode``); a 400 naming
    ``field`` when it is too long to be at most ``max_tokens`` tokens."""
    per_token = getattr(tokenizer, "max_token_bytes", None) or _FALLBACK_TOKEN_BYTES
    if len(text) > max_tokens * per_token:
        raise OpenAIError(
            f"{field} has {len(text)} characters, more than {max_tokens} tokens can hold (a token is at most "
            f"{per_token} characters here); shorten it", 400, field)
    encode = encode or tokenizer.encode
    try:
        if len(text) <= INLINE_CHARS:
            return list(encode(text))
        return list(await asyncio.to_thread(encode, text))
    except ValueError as exc:  # e.g. a lone surrogate that reached here
        raise OpenAIError(f"{field}: {exc}", 400, field) from None
