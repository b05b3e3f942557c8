"""``--escape-special-tokens``: special-token strings in user content stay text.

By default (as in FastDeploy and vLLM) the rendered chat prompt is tokenized
as one text, so a user who writes ``<|end_of_sentence|>`` or a role marker in
a message gets the control token, and can forge turns. With the flag, every
added-token string (special or not: structural markers are not always
marked special) in the content of ``user`` and ``tool`` messages is replaced,
before the template renders, by a sentinel that carries a per-request nonce;
the rendered text is tokenized piece by piece, the template's own text as
usual and each sentinel as its original string with added-token matching off
(``split_special_tokens``), so it becomes ordinary sub-word tokens.

``system`` and ``assistant`` content is left as it is: the application writes
it, and an assistant turn given back may carry the model's own markers.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any

__all__ = ["UNTRUSTED_ROLES", "LiteralSpecialTokens"]

UNTRUSTED_ROLES = frozenset({"user", "tool"})


class LiteralSpecialTokens:
    """Escaping for one tokenizer; ``escape`` per request, then ``encoder`` for its text."""

    def __init__(self, tokenizer: Any) -> None:
        added = getattr(tokenizer, "added_tokens", None) or {}
        strings = sorted((s for s in added if s), key=len, reverse=True)  # leftmost-longest, as encode
        self._pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
        self._tokenizer = tokenizer

    def escape(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str], str]:
        """``messages`` (contents already text) with added-token strings in untrusted content
        replaced by sentinels; returns (messages, the strings replaced, the request's nonce)."""
        nonce = secrets.token_hex(8)
        found: list[str] = []
        pattern = self._pattern
        if pattern is None:
            return messages, found, nonce

        def sentinel(match: re.Match[str]) -> str:
            found.append(match.group())
            return f"\ue000{nonce}:{len(found) - 1}\ue001"

        out = []
        for message in messages:
            content = message.get("content")
            if message.get("role") in UNTRUSTED_ROLES and isinstance(content, str):
                message = {**message, "content": pattern.sub(sentinel, content)}
            out.append(message)
        return out, found, nonce

    def encoder(self, found: list[str], nonce: str) -> Callable[[str], list[int]]:
        """Encode rendered text whose sentinels stand for ``found``: those as plain text."""
        tokenizer = self._tokenizer
        if not found:
            return tokenizer.encode
        split = re.compile(f"\ue000{nonce}:(\\d+)\ue001")

        def encode(text: str) -> list[int]:
            ids: list[int] = []
            start = 0
            for match in split.finditer(text):
                index = int(match.group(1))
                if index >= len(found):  # cannot be ours: the nonce is secret, but stay safe
                    continue
                if match.start() > start:
                    ids.extend(tokenizer.encode(text[start:match.start()]))
                ids.extend(tokenizer.encode(found[index], split_special_tokens=True))
                start = match.end()
            if start < len(text):
                ids.extend(tokenizer.encode(text[start:]))
            return ids

        return encode

    def encode_content(self, text: str) -> list[int]:
        """A single user text used as the whole prompt (``disable_chat_template``)."""
        return list(self._tokenizer.encode(text, split_special_tokens=True))
