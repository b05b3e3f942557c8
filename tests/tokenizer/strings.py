"""Seeded random unicode strings for tokenizer tests."""

from __future__ import annotations

import random

# Characters that stress a tokenizer: ASCII, CJK, kana/hangul, emoji (with ZWJ and
# variation selectors), combining marks, controls, odd whitespace, private use, max code point.
_POOL = (
    [chr(c) for c in range(32, 127)] * 4
    + [chr(c) for c in range(0x4E00, 0x4E00 + 300)]
    + list("あいうえおカタカナ한국어Привет")
    + [
        chr(c)
        for c in (0x1F600, 0x1F680, 0x1F9D1, 0x1F3FD, 0x2764, 0xFE0F, 0x200D, 0x1F1E8, 0x1F1F3)
    ]
    + [chr(c) for c in (0x0301, 0x0308, 0x0327, 0x20DD)]
    + ["\n", "\t", "\r", "\x00", "\x01", "\x7f", "\x0b", "\u00a0", "\u3000", "\u2028", "\ufeff"]
    + [chr(c) for c in (0xE000, 0xFFFD, 0x10FFFF, 0x1D11E, 0x00E9)]
    + ["  ", "    ", "\n\n", " \t "]
)


def random_texts(seed: int, count: int, max_len: int = 60) -> list[str]:
    """Seeded random strings over _POOL (never U+2581, which sentencepiece reads as a space)."""
    rng = random.Random(seed)
    return [
        "".join(rng.choice(_POOL) for _ in range(rng.randint(0, max_len))) for _ in range(count)
    ]
