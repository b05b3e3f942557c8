"""What both tokenizers answer the same way once their tables are built.

A tokenizer fills ``_pieces`` (id -> token text), ``_special_ids`` (ids a
``skip_special_tokens`` decode drops), ``_added`` (added-token text -> id,
matched whole in text) and ``special_tokens`` (name -> text, e.g.
``"eos_token"``), and implements ``_named_id``.
"""

from __future__ import annotations

__all__ = ["VocabTables"]


class VocabTables:
    """Ids, special tokens and id checks over a tokenizer's tables."""

    _pieces: list[str]
    _special_ids: frozenset[int]
    _added: dict[str, int]
    special_tokens: dict[str, str]

    def _named_id(self, name: str) -> int | None:
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
