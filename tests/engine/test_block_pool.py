"""BlockPool: null block, ref counts, LRU eviction, prefix-cache map, host swap tier."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fd_core.engine.block_pool import NONE_HASH, BlockPool, HostHit, hash_block_tokens


def cached_free_blocks(pool: BlockPool, hashes: list[int]) -> list:
    """Allocate one block per hash, cache them, free them in the given order."""
    blocks = pool.get_new_blocks(len(hashes))
    pool.cache_full_blocks(blocks, hashes)
    pool.free_blocks(blocks)
    return blocks


def test_null_block_is_never_handed_out():
    pool = BlockPool(num_blocks=5)
    assert pool.num_free_blocks == 4
    blocks = pool.get_new_blocks(4)
    assert sorted(b.block_id for b in blocks) == [1, 2, 3, 4]
    assert pool.usage == 1.0
    with pytest.raises(RuntimeError, match="only 0 free"):
        pool.get_new_blocks(1)
    with pytest.raises(RuntimeError, match="double free"):
        pool.free_blocks([pool.null_block])


def test_ref_counts_and_double_free():
    pool = BlockPool(num_blocks=4)
    (block,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([block], [11])
    pool.touch([block])  # a second request hits it
    assert block.ref_cnt == 2
    pool.free_blocks([block])
    assert block.ref_cnt == 1 and pool.num_free_blocks == 2  # still held by the other
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and pool.num_free_blocks == 3
    with pytest.raises(RuntimeError, match="double free of block"):
        pool.free_blocks([block])
    assert block.ref_cnt == 0
    pool.touch([block])  # a hit on a free cached block takes it off the free queue
    assert block.ref_cnt == 1 and pool.num_free_blocks == 2


def test_lru_eviction_order_and_touch_moves_to_back():
    pool = BlockPool(num_blocks=4)
    a, b, c = cached_free_blocks(pool, [1, 2, 3])  # freed a, b, c: a is the oldest
    pool.touch([b])
    pool.free_blocks([b])  # b used again: now the most recent
    assert pool.get_cached_block(2) is b
    order = [blk.block_id for blk in pool.get_new_blocks(3)]
    assert order == [a.block_id, c.block_id, b.block_id]
    assert all(pool.get_cached_block(h) is None for h in (1, 2, 3))  # evicted on reuse
    assert all(blk.block_hash is None for blk in (a, b, c))


def test_free_block_keeps_its_hash_until_reused():
    pool = BlockPool(num_blocks=4)
    (a,) = cached_free_blocks(pool, [7])
    assert pool.get_cached_block(7) is a and a.ref_cnt == 0
    assert pool.num_evictions == 0


def test_unhashed_free_blocks_are_reused_before_cached_ones():
    pool = BlockPool(num_blocks=4)
    (cached,) = cached_free_blocks(pool, [5])
    plain = pool.get_new_blocks(2)
    pool.free_blocks(plain)
    got = pool.get_new_blocks(2)
    assert {b.block_id for b in got} == {b.block_id for b in plain}
    assert pool.get_cached_block(5) is cached


def test_duplicate_hash_stays_with_the_first_block():
    pool = BlockPool(num_blocks=4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [9])
    pool.cache_full_blocks([b], [9])
    assert pool.get_cached_block(9) is a and b.block_hash is None


def test_caching_disabled_caches_nothing():
    pool = BlockPool(num_blocks=4, num_host_blocks=2, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [1, 2])
    assert pool.get_cached_block(1) is None and pool.num_host_blocks == 0


def test_usage_fraction():
    pool = BlockPool(num_blocks=5)
    blocks = pool.get_new_blocks(1)
    assert pool.usage == pytest.approx(0.25)
    pool.free_blocks(blocks)
    assert pool.usage == 0.0


def test_hash_is_chained_keyed_and_deterministic_across_processes():
    tokens = list(range(64))
    h = hash_block_tokens(NONE_HASH, tokens)
    assert 0 <= h < 2**64
    assert hash_block_tokens(NONE_HASH, tokens) == h
    assert hash_block_tokens(h, tokens) != h  # the parent matters
    assert hash_block_tokens(NONE_HASH, tokens, (("salt", "x"),)) != h
    assert hash_block_tokens(NONE_HASH, tokens[:-1] + [64]) != h
    code = (
        "from fd_core.engine.block_pool import NONE_HASH, hash_block_tokens;"
        "print(hash_block_tokens(NONE_HASH, list(range(64))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == h


def test_eviction_swaps_out_to_host_and_swap_in_restores():
    pool = BlockPool(num_blocks=3, num_host_blocks=2)
    a, b = cached_free_blocks(pool, [1, 2])
    pool.get_new_blocks(1)  # evicts a (LRU)
    assert pool.get_cached_block(1) is None and pool.get_host_block(1) == 0
    swap_out, swap_in = pool.take_swap_ops()
    assert swap_out == [(a.block_id, 0)] and swap_in == []
    assert pool.take_swap_ops() == ([], [])

    (back,) = pool.swap_in([HostHit(1, 0)])  # evicts b, which goes to host block 1
    swap_out, swap_in = pool.take_swap_ops()
    assert swap_out == [(b.block_id, 1)]
    assert swap_in == [(0, back.block_id)]
    assert pool.get_cached_block(1) is back and back.ref_cnt == 1
    assert pool.get_host_block(1) == 0  # inclusive: the host copy stays
    pool.free_blocks([back])
    pool.get_new_blocks(1)  # evicting it again needs no copy: host has it
    assert pool.take_swap_ops() == ([], [])
    assert pool.num_swap_outs == 2 and pool.num_swap_ins == 1


def test_full_host_tier_evicts_its_lru():
    pool = BlockPool(num_blocks=4, num_host_blocks=2)
    a, b, c = cached_free_blocks(pool, [1, 2, 3])
    for _ in range(3):  # one eviction per step: 1, 2, 3 in LRU order
        pool.get_new_blocks(1)
        pool.take_swap_ops()
    assert pool.get_host_block(1) is None  # the oldest was pushed out
    assert pool.get_host_block(2) == 1 and pool.get_host_block(3) == 0


def test_host_blocks_written_this_step_are_not_reused_until_the_ops_are_taken():
    pool = BlockPool(num_blocks=4, num_host_blocks=2)
    a, b, c = cached_free_blocks(pool, [1, 2, 3])
    pool.get_new_blocks(3)  # three evictions in one step, two host blocks
    swap_out, _ = pool.take_swap_ops()
    assert swap_out == [(a.block_id, 0), (b.block_id, 1)]  # c is dropped, not copied over a
    assert pool.get_host_block(3) is None


def test_host_blocks_in_pending_ops_are_not_overwritten_in_the_same_step():
    pool = BlockPool(num_blocks=4, num_host_blocks=1)
    a, b, c = cached_free_blocks(pool, [1, 2, 3])
    pool.get_new_blocks(1)  # a -> host 0
    pool.take_swap_ops()
    pool.swap_in([HostHit(1, 0)])  # evicts b; host 0 is pinned as a swap-in source
    swap_out, swap_in = pool.take_swap_ops()
    assert swap_out == [] and swap_in == [(0, b.block_id)]  # b's content is dropped instead
    assert pool.get_host_block(2) is None and pool.get_host_block(1) == 0
    pool.get_new_blocks(1)  # next step: c may take the host block
    assert pool.take_swap_ops()[0] == [(c.block_id, 0)]
    assert pool.get_host_block(1) is None and pool.get_host_block(3) == 0


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(num_blocks=4, num_host_blocks=1)
    cached_free_blocks(pool, [1, 2])
    held = pool.get_new_blocks(1)
    assert not pool.reset_prefix_cache()  # a block is held, and a swap-out pending
    pool.take_swap_ops()
    pool.free_blocks(held)
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(2) is None and pool.get_host_block(1) is None
    assert pool.num_free_blocks == 3
