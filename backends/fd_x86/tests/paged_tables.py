"""Block tables for paged-attention tests: shuffled block ids, so a kernel that
assumes contiguous blocks fails."""

from __future__ import annotations

import numpy as np


def shuffled_tables(rng: np.random.Generator, seq_lens: list[int], block_size: int) -> tuple[int, list[list[int]]]:
    """(pool size, per-request block ids): enough blocks for each sequence,
    from a pool of 3 spare blocks more, in a random order."""
    need = [-(-int(n) // block_size) for n in seq_lens]
    num_blocks = sum(need) + 3
    order = rng.permutation(num_blocks)
    tables, used = [], 0
    for n in need:
        tables.append([int(b) for b in order[used:used + n]])
        used += n
    return num_blocks, tables
