"""The KV block pool: block ids, ref counts, the LRU free queue, the prefix
cache (hash -> block) and the host swap tier. Pure Python.

Modelled on vLLM v1's ``block_pool.py``:

- Block 0 is the *null block*: never handed out, never freed. Block tables
  are padded with 0 (``AttentionMetadata.build``), and a padded token (graph
  capture) may write to slot 0, so block 0 must never hold a request's KV.
  ``num_blocks`` therefore buys ``num_blocks - 1`` usable blocks.
- Free blocks sit in one queue in eviction order: ``get_new_blocks`` takes
  from the front. A freed block that holds a cached (full, hashed) block goes
  to the back, so cached blocks are evicted least recently used first; a
  freed block with no hash goes to the front, since reusing it loses
  nothing. A cache hit on a free block removes it from the middle (O(1):
  the queue is an ``OrderedDict``).
- A free block keeps its hash until it is evicted for reuse. With a host
  tier, eviction copies it to a host block first (a swap-out op) and the
  hash stays findable there; a later hit swaps it back in (a swap-in op).

Swap ops accumulate until ``take_swap_ops`` (once per step, by the
scheduler). The runner must run every swap-out, then every swap-in, then the
forward. Host blocks named by an op are pinned until then, so no op of the
same step overwrites a host block another op still has to read.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["BlockPool", "HostHit", "KVBlock", "NONE_HASH", "hash_block_tokens"]


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


# parent hash of a request's first block: a fixed seed, so hashes agree across
# processes and machines (the API server, the engine and the global scheduler)
NONE_HASH = _hash64(b"fd-core prefix cache v1")


def hash_block_tokens(parent_hash: int, token_ids: Sequence[int], extra_keys: tuple = ()) -> int:
    """Hash of one full block: sha256 over (parent hash, token ids as int64
    little-endian, repr of the extra keys), truncated to 64 bits.

    Deterministic across processes (unlike ``hash()``). A 64-bit collision
    would alias two prefixes; at 2**32 cached blocks the chance is ~1/2.
    """
    tokens = array("q", token_ids)
    if sys.byteorder != "little":
        tokens.byteswap()
    data = parent_hash.to_bytes(8, "little") + tokens.tobytes()
    if extra_keys:
        data += repr(extra_keys).encode()
    return _hash64(data)


class KVBlock:
    """One device block's metadata."""

    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0  # requests holding the block
        self.block_hash: int | None = None  # set once the block is full and cached

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref_cnt={self.ref_cnt}, hash={self.block_hash})"


@dataclass(frozen=True)
class HostHit:
    """A prefix-cache hit on a block that lives only in the host tier."""

    block_hash: int
    host_block_id: int


class BlockPool:
    """Owns every device block and host block; hands them to the KV cache manager."""

    def __init__(
        self, num_blocks: int, num_host_blocks: int = 0, enable_caching: bool = True
    ) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        # block id -> block, front = next to evict
        self._free: OrderedDict[int, KVBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks[1:]
        )
        self._cached: dict[int, KVBlock] = {}  # block hash -> device block holding it

        self.num_host_blocks = num_host_blocks if enable_caching else 0
        self._host_free = list(range(self.num_host_blocks - 1, -1, -1))  # pop() gives 0 first
        self._host_cached: OrderedDict[int, int] = OrderedDict()  # hash -> host block, front = LRU
        self._host_pinned: set[int] = set()  # host blocks named by an op not yet taken
        self._swap_out: list[tuple[int, int]] = []  # (device block, host block)
        self._swap_in: list[tuple[int, int]] = []  # (host block, device block)

        self._num_free_cached = 0  # free blocks still holding a cached hash (the LRU part)
        self.num_evictions = 0  # cached device blocks reused for new content
        self.num_swap_outs = 0
        self.num_swap_ins = 0

    # -- counts --------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks ``get_new_blocks`` can hand out now (cached free ones included)."""
        return len(self._free)

    @property
    def num_free_uncached_blocks(self) -> int:
        """Free blocks holding no cached prefix (FastDeploy's free_gpu_block_num);
        ``num_free_blocks`` adds the cached ones kept in LRU order."""
        return len(self._free) - self._num_free_cached

    @property
    def num_cached_blocks(self) -> int:
        """Device blocks holding a cached prefix, in use or free."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests, in [0, 1]."""
        return 1.0 - len(self._free) / (self.num_blocks - 1)

    # -- allocation ----------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[KVBlock]:
        """Take ``num_blocks`` blocks from the front of the free queue, each with
        ref_cnt 1 and no hash. A cached one is evicted on the way (swapped out
        to the host tier when there is one). Raises if too few are free:
        callers check ``num_free_blocks`` first."""
        if num_blocks > len(self._free):
            raise RuntimeError(f"cannot get {num_blocks} blocks: only {len(self._free)} free")
        blocks = []
        for _ in range(num_blocks):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None:
                self._num_free_cached -= 1
                self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on cache-hit blocks; a free one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
                self._num_free_cached -= block.block_hash is not None
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference on each block, in the order given. The KV cache
        manager passes a request's blocks tail first, so of two cached blocks
        freed together the tail one is evicted first. Raises on a double free."""
        for block in blocks:
            if block.ref_cnt <= 0 or block is self.null_block:
                raise RuntimeError(
                    f"double free of block {block.block_id} (ref_cnt {block.ref_cnt})"
                )
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block
                if block.block_hash is None:
                    self._free.move_to_end(block.block_id, last=False)
                else:
                    self._num_free_cached += 1

    # -- prefix cache --------------------------------------------------------

    def get_cached_block(self, block_hash: int) -> KVBlock | None:
        """The device block holding ``block_hash``, or None."""
        return self._cached.get(block_hash)

    def get_host_block(self, block_hash: int) -> int | None:
        """The host block holding ``block_hash``, or None."""
        return self._host_cached.get(block_hash)

    def cache_full_blocks(self, blocks: Sequence[KVBlock], block_hashes: Sequence[int]) -> None:
        """Register computed full blocks under their hashes. A hash already held
        by another block (two requests computed the same prefix at once) is
        left to that block; this one stays unhashed and is reused first."""
        if not self.enable_caching:
            return
        for block, block_hash in zip(blocks, block_hashes, strict=True):
            if block.block_hash is not None or block_hash in self._cached:
                continue
            block.block_hash = block_hash
            self._cached[block_hash] = block
            self._num_free_cached += block.ref_cnt == 0

    def swap_in(self, hits: Sequence[HostHit]) -> list[KVBlock]:
        """Allocate one device block per host hit, cache it under the hit's hash
        and record the swap-in op. The host copy stays (the host tier is
        inclusive), so evicting the device copy later needs no copy back."""
        self._host_pinned.update(h.host_block_id for h in hits)  # before evictions below
        blocks = self.get_new_blocks(len(hits))
        for hit, block in zip(hits, blocks):
            self._host_cached.move_to_end(hit.block_hash)
            self._swap_in.append((hit.host_block_id, block.block_id))
            block.block_hash = hit.block_hash
            self._cached[hit.block_hash] = block
        self.num_swap_ins += len(hits)
        return blocks

    def take_swap_ops(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``(swap_out, swap_in)`` recorded since the last call; unpins host blocks.
        Run all swap-outs, then all swap-ins, before the step's forward."""
        ops = self._swap_out, self._swap_in
        self._swap_out, self._swap_in = [], []
        self._host_pinned.clear()
        return ops

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, device and host. Refused (False) while any
        block is held, since running requests expect their blocks to stay
        cached, or while swap ops are pending."""
        if len(self._free) != self.num_blocks - 1 or self._swap_out or self._swap_in:
            return False
        for block in self.blocks:
            block.block_hash = None
        self._cached.clear()
        self._num_free_cached = 0
        self._host_cached.clear()
        self._host_free = list(range(self.num_host_blocks - 1, -1, -1))
        return True

    def _evict(self, block: KVBlock) -> None:
        """Drop a free block's hash before reuse; keep the content on host if we can."""
        block_hash = block.block_hash
        assert block_hash is not None
        del self._cached[block_hash]
        block.block_hash = None
        self.num_evictions += 1
        if self.num_host_blocks == 0:
            return
        if block_hash in self._host_cached:  # already on host (swapped in earlier)
            self._host_cached.move_to_end(block_hash)
            return
        host_block = self._take_host_block()
        if host_block is None:  # every host block is pinned by this step's ops
            return
        self._host_cached[block_hash] = host_block
        self._host_pinned.add(host_block)
        self._swap_out.append((block.block_id, host_block))
        self.num_swap_outs += 1

    def _take_host_block(self) -> int | None:
        if self._host_free:
            return self._host_free.pop()
        for block_hash, host_block in self._host_cached.items():  # LRU first
            if host_block not in self._host_pinned:
                del self._host_cached[block_hash]
                return host_block
        return None
