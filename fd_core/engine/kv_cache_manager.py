"""The KV cache manager: which blocks each request holds, prefix-cache
lookups, and block hashing. Pure Python; the scheduler is its only caller.

A request's blocks are ref-counted in the pool, so a prefix block shared by
several running requests stays allocated until the last of them frees it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fd_core.engine.block_pool import NONE_HASH, BlockPool, HostHit, KVBlock, hash_block_tokens
from fd_core.engine.config import CacheConfig
from fd_core.engine.request import Request

__all__ = ["CachedBlock", "KVCacheManager", "PrefixCacheStats"]

CachedBlock = KVBlock | HostHit  # a prefix hit: on device, or on host (swapped in on allocation)


@dataclass
class PrefixCacheStats:
    """Totals since start, in tokens, counted once per admission (a preempted
    request counts again when it is re-admitted)."""

    queries: int = 0  # tokens of admitted requests looked up
    hits: int = 0  # of which found in the cache (device or host)
    host_hits: int = 0  # of which found only on host (swapped in)


class KVCacheManager:
    """Maps requests to KV blocks of one ``BlockPool``."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.enable_caching = config.enable_prefix_caching
        self.pool = BlockPool(
            config.num_blocks, config.num_host_blocks, config.enable_prefix_caching
        )
        self.prefix_cache_stats = PrefixCacheStats()
        self._req_blocks: dict[str, list[KVBlock]] = {}  # request id -> its blocks, in order
        self._req_block_ids: dict[str, list[int]] = {}  # request id -> the same, as ids
        self._num_cached_blocks: dict[
            str, int
        ] = {}  # request id -> leading blocks registered in the cache

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_blocks - 1

    @property
    def usage(self) -> float:
        """Fraction of KV blocks in use (the kv_cache_usage metric)."""
        return self.pool.usage

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[CachedBlock], int]:
        """The longest cached prefix of a waiting request: its blocks and token
        count. Never the whole sequence: the last token is always left to
        compute, so the step that finishes the prefill has logits. Changes
        nothing; hand the blocks to ``allocate_slots``."""
        if not self.enable_caching:
            return [], 0
        self._update_block_hashes(request)
        if request.skip_prefix_cache:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[CachedBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is not None:
                hits.append(block)
                continue
            host_block = self.pool.get_host_block(block_hash)
            if host_block is None:
                break
            hits.append(HostHit(block_hash, host_block))
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[CachedBlock] = (),
    ) -> list[int] | None:
        """Give ``request`` blocks for its prefix hits and for ``num_new_tokens``
        more tokens after ``request.num_computed_tokens`` + the hits. Returns
        the ids of the blocks added (hits first), or None, changing nothing,
        when the pool has too few free blocks. Called by the scheduler for
        every request it schedules, hits only at admission."""
        req_id = request.request_id
        blocks = self._req_blocks.setdefault(req_id, [])
        if blocks and not new_computed_blocks and \
                -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) <= len(blocks):
            return []  # most decode steps: the tokens fit the request's blocks, nothing to add
        num_hit_tokens = len(new_computed_blocks) * self.block_size
        num_total_tokens = request.num_computed_tokens + num_hit_tokens + num_new_tokens
        num_new_blocks = (
            self.num_blocks_for(num_total_tokens) - len(blocks) - len(new_computed_blocks)
        )
        device_hits = [b for b in new_computed_blocks if isinstance(b, KVBlock)]
        host_hits = [b for b in new_computed_blocks if isinstance(b, HostHit)]
        # a free hit block leaves the free queue when touched; a host hit needs a new block
        num_evictable_hits = sum(1 for b in device_hits if b.ref_cnt == 0)
        if max(num_new_blocks, 0) + len(host_hits) + num_evictable_hits > self.pool.num_free_blocks:
            if not blocks:
                del self._req_blocks[req_id]
            return None

        if not blocks and self.enable_caching:  # admission
            stats = self.prefix_cache_stats
            stats.queries += request.num_tokens
            stats.hits += num_hit_tokens
            stats.host_hits += len(host_hits) * self.block_size
        self.pool.touch(device_hits)  # before any eviction below
        swapped_in = iter(self.pool.swap_in(host_hits))
        added = [b if isinstance(b, KVBlock) else next(swapped_in) for b in new_computed_blocks]
        if num_new_blocks > 0:
            added += self.pool.get_new_blocks(num_new_blocks)
        if new_computed_blocks:  # the hits are registered in the cache already
            self._num_cached_blocks[req_id] = len(blocks) + len(new_computed_blocks)
        blocks.extend(added)
        added_ids = [b.block_id for b in added]
        self._req_block_ids.setdefault(req_id, []).extend(added_ids)
        return added_ids

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's blocks that became full and computed, so later
        requests hit them. Called after each step with the new computed count."""
        if not self.enable_caching:
            return
        req_id = request.request_id
        num_full = num_computed_tokens // self.block_size
        start = self._num_cached_blocks.get(req_id, 0)
        if num_full <= start:
            return
        self._update_block_hashes(request)
        blocks = self._req_blocks[req_id]
        self.pool.cache_full_blocks(blocks[start:num_full], request.block_hashes[start:num_full])
        self._num_cached_blocks[req_id] = num_full

    def trim(self, request: Request, num_tokens: int) -> None:
        """Give back the request's blocks past the first ``num_tokens`` tokens,
        tail first: the blocks that held only rejected draft tokens
        (speculative decoding). Cached blocks hold verified tokens only and
        are never in that tail. Called by the scheduler after verification."""
        blocks = self._req_blocks.get(request.request_id)
        keep = self.num_blocks_for(num_tokens)
        if not blocks or len(blocks) <= keep:
            return
        assert self._num_cached_blocks.get(request.request_id, 0) <= keep, "a cached block past the verified tokens"
        tail = blocks[keep:]
        del blocks[keep:]
        del self._req_block_ids[request.request_id][keep:]
        self.pool.free_blocks(reversed(tail))

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first (finished, aborted or
        preempted). Cached ones stay findable until evicted."""
        req_id = request.request_id
        blocks = self._req_blocks.pop(req_id, [])
        self._req_block_ids.pop(req_id, None)
        self._num_cached_blocks.pop(req_id, None)
        self.pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request: Request) -> list[int]:
        """The request's block table (a copy)."""
        return list(self._req_block_ids.get(request.request_id, ()))

    def take_swap_ops(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``(swap_out, swap_in)`` since the last call; the scheduler calls it
        once per step. See ``BlockPool.take_swap_ops``."""
        return self.pool.take_swap_ops()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block hash; False (nothing done) while blocks are in use."""
        return self.pool.reset_prefix_cache()

    def _update_block_hashes(self, request: Request) -> None:
        """Extend ``request.block_hashes`` to every full block of its tokens."""
        bs = self.block_size
        hashes = request.block_hashes
        tokens = request.all_token_ids
        for i in range(len(hashes), request.num_tokens // bs):
            parent = hashes[-1] if hashes else NONE_HASH
            hashes.append(
                hash_block_tokens(
                    parent, tokens[i * bs : (i + 1) * bs], _extra_keys(request, i, bs)
                )
            )


def _extra_keys(request: Request, block_index: int, block_size: int) -> tuple:
    """Cache keys besides the tokens: the salt on block 0, and the hash of each
    multimodal item whose placeholder tokens overlap the block."""
    keys: list[object] = []
    if block_index == 0 and request.cache_salt:
        keys.append(("salt", request.cache_salt))
    start, end = block_index * block_size, (block_index + 1) * block_size
    for mm_hash, (offset, length) in zip(request.mm_hashes, request.mm_positions):
        if offset < end and offset + length > start:
            keys.append(mm_hash)
    return tuple(keys)
