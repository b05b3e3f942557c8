"""The vocabulary a grammar engine needs: every token id's bytes, the special
ids and the EOS set, built once per model from fd_core's tokenizer.

Who calls it: ``StructuredOutputs`` (``manager``) at engine start, then hands
the ``GrammarVocab`` to the chosen backend, which builds its own tokenizer
table from it once. Sentencepiece byte-fallback pieces (``<0x0A>``) are their
single byte, ``▁`` is a space, control/added special tokens are flagged
special (a grammar never spells them out as text; EOS is allowed only where
the grammar may end); ids past the tokenizer's table (the model's vocabulary
padding) are empty special tokens, so no mask ever allows them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GrammarVocab"]


@dataclass(frozen=True)
class GrammarVocab:
    """``tokens[i]``: the bytes id ``i`` adds to decoded text (b"" for padding)."""

    tokens: tuple[bytes, ...]
    special_ids: frozenset[int]
    eos_token_ids: tuple[int, ...]

    @property
    def vocab_size(self) -> int:
        """Columns of the logits the masks cover (the model's vocabulary)."""
        return len(self.tokens)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, eos_token_ids: Sequence[int], vocab_size: int | None = None
                       ) -> GrammarVocab:
        """From a fd_core tokenizer (``token_bytes``, ``all_special_ids``,
        ``added_tokens``); ``vocab_size`` is the model's (>= the tokenizer's,
        the rest padding). ``eos_token_ids``: the model's generation-config
        EOS set (ValueError when empty: a grammar could never end)."""
        n = tokenizer.vocab_size
        size = n if vocab_size is None else vocab_size
        if size < n:
            raise ValueError(f"the model's vocab_size {size} is smaller than its tokenizer's {n} tokens")
        eos = tuple(dict.fromkeys(int(t) for t in eos_token_ids))
        if not eos:
            raise ValueError("structured output needs the model's EOS token id (generation_config.json "
                             "eos_token_id or the tokenizer's eos_token); none is set")
        bad = [t for t in eos if not 0 <= t < size]
        if bad:
            raise ValueError(f"EOS token id {bad[0]} is outside the vocabulary [0, {size})")
        special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens.values()) | set(eos)
        tokens = [tokenizer.token_bytes(i) for i in range(n)]
        special.update(i for i, data in enumerate(tokens) if not data)
        tokens += [b""] * (size - n)
        special.update(range(n, size))
        return cls(tuple(tokens), frozenset(special), eos)

    @classmethod
    def from_token_bytes(cls, tokens: Sequence[bytes], eos_token_ids: Sequence[int],
                         special_ids: Sequence[int] = ()) -> GrammarVocab:
        """A vocabulary given directly (tests, benchmarks on synthetic vocabularies)."""
        eos = tuple(int(t) for t in eos_token_ids)
        return cls(tuple(tokens), frozenset(special_ids) | frozenset(eos), eos)
