"""Per-engine facts a request's sampling set-up needs: the default seed of
unseeded requests (``--seed``) and the tokenizer's thinking tokens with the
sequence the thinking budget forces (``reasoning_max_tokens``,
FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR). Computed once at engine start or
per request by the engine core.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from fd_core import envs
from fd_core.sampling.reasoning_budget import (
    THINK_END,
    THINK_START,
    TURN_BOUNDARIES,
    ThinkingTokens,
    forced_sequence,
)

__all__ = ["default_seed", "thinking_tokens"]

logger = logging.getLogger("fd_core.engine.core")


def default_seed(base: int, k: int) -> int:
    """The seed of the ``k``-th unseeded request (0-based, in arrival order)
    of an engine started with ``--seed base``: a 63-bit mix of both."""
    state = np.random.SeedSequence([base % 2**64, k]).generate_state(1, np.uint64)
    return int(state[0]) >> 1


def thinking_tokens(tokenizer_dir: str | Path) -> ThinkingTokens | None:
    """The tokenizer's ``</think>`` / ``<think>`` / turn-boundary ids and the
    tokens of FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR, or None when it has no
    ``</think>`` token (or no tokenizer is there). ValueError naming the
    variable when its value does not tokenize to text holding ``</think>``."""
    from fd_core.tokenizer import Tokenizer

    name = "FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR"
    truncate = envs.get(name)
    try:
        tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    except (FileNotFoundError, OSError, ValueError) as e:
        logger.info("no tokenizer in %s (%s): reasoning_max_tokens is unavailable", tokenizer_dir, e)
        return None
    added = tokenizer.added_tokens
    if THINK_END not in added:
        if truncate != THINK_END:
            logger.warning("%s=%r has no effect: the tokenizer in %s has no %s token",
                           name, truncate, tokenizer_dir, THINK_END)
        return None
    try:
        forced = forced_sequence(truncate, tokenizer)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={truncate!r} cannot be forced by this model's "
                         f"tokenizer ({tokenizer_dir}): {e}") from None
    logger.debug("thinking budget forces %r as tokens %s", truncate, list(forced))
    return ThinkingTokens(
        end_id=added[THINK_END], start_id=added.get(THINK_START),
        boundary_ids=frozenset(added[t] for t in TURN_BOUNDARIES if t in added),
        forced_ids=forced,
    )
