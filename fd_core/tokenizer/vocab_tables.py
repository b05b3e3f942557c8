"""What both tokenizers answer the same way once their tables are built.

A tokenizer fills ``_pieces`` (id -> token text), ``_special_ids`` (ids a
``skip_special_tokens`` decode drops), ``_added`` (added-token text -> id,
matched whole in text) and ``special_tokens`` (name -> text, e.g.
``"eos_token"``), ``chat_template`` (jinja text or None), and implements
``_named_id`` and ``encode``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from fd_core.tokenizer.chat_template import ChatTemplate, load_chat_template

__all__ = ["VocabTables"]


class VocabTables:
    """Ids, special tokens and id checks over a tokenizer's tables."""

    _pieces: list[str]
    _special_ids: frozenset[int]
    _added: dict[str, int]
    special_tokens: dict[str, str]
    chat_template: str | None

    def _named_id(self, name: str) -> int | None:
        raise NotImplementedError

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> list[int]:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        """How many ids decode: every id in [0, vocab_size) is valid."""
        return len(self._pieces)

    def __len__(self) -> int:
        return len(self._pieces)

    @property
    def bos_token_id(self) -> int | None:
        return self._named_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._named_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._named_id("pad_token")

    @property
    def all_special_ids(self) -> list[int]:
        """Ids dropped by `decode(..., skip_special_tokens=True)`."""
        return sorted(self._special_ids)

    @property
    def all_special_tokens(self) -> list[str]:
        return [self._pieces[i] for i in self.all_special_ids]

    @property
    def added_tokens(self) -> dict[str, int]:
        """Every token matched whole in text (special or not): content -> id."""
        return dict(self._added)

    def _check_id(self, i: int) -> int:
        if not 0 <= i < len(self._pieces):
            raise ValueError(
                f"token id {i} is out of range: the vocabulary has ids 0..{len(self._pieces) - 1}"
            )
        return i

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tokenize: bool = False,
        chat_template: str | os.PathLike[str] | None = None,
        **chat_template_kwargs: Any,
    ) -> str | list[int]:
        """Render `messages` with the chat template (the prompt text, or its ids when `tokenize`).

        `chat_template` overrides the tokenizer's template for this call;
        `chat_template_kwargs` such as `enable_thinking=False` reach the template.
        """
        source = self.chat_template if chat_template is None else load_chat_template(chat_template)
        if source is None:
            raise ValueError("this tokenizer has no chat template (none in tokenizer_config.json or "
                             "chat_template.jinja); pass one with --chat-template")
        prompt = ChatTemplate(source, self.special_tokens).render(
            messages, add_generation_prompt, tools, **chat_template_kwargs)
        return self.encode(prompt) if tokenize else prompt
