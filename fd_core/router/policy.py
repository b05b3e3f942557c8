"""How the router picks an instance (``--policy``, ``--prefill-policy``, ``--decode-policy``).

FastDeploy's router's names:

- ``round_robin``: in turn, over the usable instances ordered by URL;
- ``random``: uniformly;
- ``power_of_two``: two at random, the less loaded of them;
- ``request_num`` (alias ``least_loaded``): the least loaded (fewest requests
  served so far on a tie); load is ``Instance.load``;
- ``cache_aware``: cache affinity for shared prefixes. The prompt's leading
  text is cut into blocks of ``BLOCK_CHARS`` characters, each keyed by a hash
  chained over the blocks before it (as the engine's prefix cache keys KV
  blocks); ``PrefixTable`` remembers which instance last served each key. The
  instance holding the longest matching prefix gets the request unless it is
  overloaded: its load + 1 above ``mean * (1 + --balance-rel-threshold) +
  --balance-abs-threshold`` (the bound of consistent hashing with bounded
  loads); a prompt with no match, or an overloaded match, goes to the least
  loaded. ``Picker.pick`` is called by the proxy for each attempt.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Sequence

from fd_core.router.registry import Instance

__all__ = ["BLOCK_CHARS", "Picker", "PrefixTable", "prefix_keys"]

BLOCK_CHARS = 64  # characters of prompt text per affinity block


def prefix_keys(text: str, max_chars: int, block_chars: int = BLOCK_CHARS) -> list[bytes]:
    """Chained hashes of the full ``block_chars`` blocks of ``text[:max_chars]``, in order."""
    keys: list[bytes] = []
    parent = b""
    chars = text[:max_chars]
    for start in range(0, len(chars) - block_chars + 1, block_chars):
        block = chars[start:start + block_chars].encode("utf-8", errors="surrogatepass")
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        keys.append(parent)
    return keys


class PrefixTable:
    """Prefix key -> URL of the instance that last served it (LRU, at most ``capacity`` keys)."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[bytes, str] = OrderedDict()

    def longest_match(self, keys: Sequence[bytes], allowed: set[str]) -> tuple[str | None, int]:
        """(URL, blocks matched) of the longest prefix of ``keys`` held by an instance in ``allowed``."""
        for n in range(len(keys), 0, -1):
            url = self._owner.get(keys[n - 1])
            if url is not None and url in allowed:
                return url, n
        return None, 0

    def record(self, keys: Sequence[bytes], url: str) -> None:
        for key in keys:
            self._owner[key] = url
            self._owner.move_to_end(key)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def __len__(self) -> int:
        return len(self._owner)


class Picker:
    """One policy over a changing set of instances (its own round-robin counter and prefix table)."""

    def __init__(self, policy: str, balance_abs: float = 2.0, balance_rel: float = 0.25,
                 rng: random.Random | None = None) -> None:
        self.policy = "request_num" if policy == "least_loaded" else policy
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self.rng = rng or random.Random()
        self.table = PrefixTable()
        self._turn = 0
        self.affinity_hits = 0  # cache_aware picks that followed a prefix match (for /registered, tests)

    def pick(self, instances: Sequence[Instance], keys: Sequence[bytes] = ()) -> Instance:
        """One of ``instances`` (not empty) for a request whose prompt has prefix ``keys``."""
        if not instances:
            raise ValueError("no instance to pick from")
        ordered = sorted(instances, key=lambda i: i.url)
        if self.policy == "round_robin":
            chosen = ordered[self._turn % len(ordered)]
            self._turn += 1
        elif self.policy == "random":
            chosen = self.rng.choice(ordered)
        elif self.policy == "power_of_two":
            pair = self.rng.sample(ordered, 2) if len(ordered) > 1 else ordered
            chosen = min(pair, key=lambda i: i.load)
        elif self.policy == "cache_aware":
            chosen = self._cache_aware(ordered, keys)
        else:
            chosen = _least_loaded(ordered)
        return chosen

    def _cache_aware(self, ordered: list[Instance], keys: Sequence[bytes]) -> Instance:
        by_url = {i.url: i for i in ordered}
        url, _ = self.table.longest_match(keys, set(by_url))
        chosen = by_url[url] if url is not None else None
        if chosen is not None:
            mean = sum(i.load for i in ordered) / len(ordered)
            if chosen.load + 1 > mean * (1 + self.balance_rel) + self.balance_abs:
                chosen = None  # overloaded: spread instead (its cache stays; later requests may return)
            else:
                self.affinity_hits += 1
        if chosen is None:
            chosen = _least_loaded(ordered)
        if keys:
            self.table.record(keys, chosen.url)
        return chosen


def _least_loaded(ordered: Sequence[Instance]) -> Instance:
    return min(ordered, key=lambda i: (i.load, i.served))
