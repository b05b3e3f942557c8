"""The vision encoder's outputs, kept by image hash so an image is encoded once.

The model runner asks ``get(hash, encode)`` for every image whose tokens a step
computes; a chunked prefill that spans several steps, a preempted request that
is recomputed and another request with the same image all reuse the features.
Least recently used entries go first once ``capacity_tokens`` is exceeded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["EncoderCache"]


class EncoderCache:
    """image hash -> its ``[num_tokens, D]`` features (a paddle tensor)."""

    def __init__(self, capacity_tokens: int = 65536) -> None:
        if capacity_tokens < 1:
            raise ValueError(f"encoder cache capacity must be at least 1 token, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        self._entries: OrderedDict[str, Any] = OrderedDict()
        self._tokens = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str, encode: Callable[[], Any]) -> Any:
        """The features of ``key``, computing them with ``encode()`` on a miss."""
        features = self._entries.get(key)
        if features is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return features
        self.misses += 1
        features = encode()
        self._entries[key] = features
        self._tokens += int(features.shape[0])
        while self._tokens > self.capacity_tokens and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self._tokens -= int(old.shape[0])
        return features

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
