"""KVCacheManager: allocation, prefix hits (device and host), sharing, extra keys."""

from __future__ import annotations

from dataclasses import dataclass

from fd_core.engine.block_pool import HostHit, KVBlock
from fd_core.engine.config import CacheConfig
from fd_core.engine.kv_cache_manager import KVCacheManager
from fd_core.engine.request import Request

BS = 4


@dataclass
class SP:
    max_tokens: int | None = 8
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None


def make_manager(
    num_blocks: int = 9, num_host_blocks: int = 0, caching: bool = True
) -> KVCacheManager:
    return KVCacheManager(CacheConfig(num_blocks, BS, num_host_blocks, caching))


def req(rid: str, tokens: list[int], **kw) -> Request:
    return Request(rid, tokens, SP(), **kw)


def admit_and_compute(kv: KVCacheManager, r: Request) -> list[int]:
    """Admit ``r`` with its hits, compute the whole prompt, cache its full blocks."""
    hits, num_hit = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - num_hit, hits) is not None
    r.num_computed_tokens = r.num_tokens
    kv.cache_blocks(r, r.num_tokens)
    return kv.get_block_ids(r)


def test_allocate_rounds_up_and_failure_changes_nothing():
    kv = make_manager(num_blocks=4)  # 3 usable
    r = req("a", list(range(9)))
    assert kv.allocate_slots(r, 9) is not None
    assert len(kv.get_block_ids(r)) == 3 and kv.pool.num_free_blocks == 0
    other = req("b", [1])
    assert kv.allocate_slots(other, 1) is None
    assert kv.get_block_ids(other) == [] and kv.pool.num_free_blocks == 0
    r.num_computed_tokens = 9
    assert kv.allocate_slots(r, 3) == []  # 12 tokens still fit 3 blocks
    assert kv.allocate_slots(r, 4) is None and len(kv.get_block_ids(r)) == 3
    kv.free(r)
    assert kv.pool.num_free_blocks == 3 and kv.usage == 0.0


def test_second_request_reuses_the_shared_prefix():
    kv = make_manager()
    a = req("a", list(range(10)))  # two full blocks + 2
    ids_a = admit_and_compute(kv, a)
    b = req("b", list(range(8)) + [50, 51, 52])
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8 and [blk.block_id for blk in hits] == ids_a[:2]
    new = kv.allocate_slots(b, b.num_tokens - num_hit, hits)
    assert new is not None and new[:2] == ids_a[:2]
    assert [kv.pool.blocks[i].ref_cnt for i in ids_a[:2]] == [2, 2]
    kv.free(a)  # shared blocks stay with b
    assert [kv.pool.blocks[i].ref_cnt for i in ids_a[:2]] == [1, 1]
    assert kv.prefix_cache_stats.queries == 10 + 11 and kv.prefix_cache_stats.hits == 8


def test_full_prefix_hit_still_leaves_the_last_token_to_compute():
    kv = make_manager()
    admit_and_compute(kv, req("a", list(range(8))))  # exactly two blocks
    hits, num_hit = kv.get_computed_blocks(req("b", list(range(8))))
    assert num_hit == 4 and len(hits) == 1  # block 2 holds the last token: recomputed


def test_cache_salt_and_mm_hashes_separate_equal_tokens():
    kv = make_manager()
    tokens = list(range(12))
    admit_and_compute(kv, req("a", tokens, cache_salt="alice"))
    assert kv.get_computed_blocks(req("b", tokens, cache_salt="bob"))[1] == 0
    assert kv.get_computed_blocks(req("c", tokens, cache_salt="alice"))[1] == 8

    kv = make_manager()
    admit_and_compute(kv, req("a", tokens, mm_hashes=["img1"], mm_positions=[(5, 2)]))
    same = req("b", tokens, mm_hashes=["img1"], mm_positions=[(5, 2)])
    other = req("c", tokens, mm_hashes=["img2"], mm_positions=[(5, 2)])
    assert kv.get_computed_blocks(same)[1] == 8
    # the image's tokens 5-6 sit in block 1: block 0 is shared, block 1 is not
    assert kv.get_computed_blocks(other)[1] == 4
    assert kv.get_computed_blocks(req("d", tokens))[1] == 4


def test_caching_disabled_never_hits():
    kv = make_manager(caching=False)
    admit_and_compute(kv, req("a", list(range(12))))
    assert kv.get_computed_blocks(req("b", list(range(12)))) == ([], 0)


def test_hits_on_free_blocks_count_against_free_space():
    kv = make_manager(num_blocks=4)  # 3 usable
    a = req("a", list(range(9)))
    admit_and_compute(kv, a)
    kv.free(a)  # 3 free blocks, two of them cached
    b = req("b", list(range(8)) + [99] * 5)  # 13 tokens: 2 hit blocks + 2 new
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    assert kv.allocate_slots(b, 5, hits) is None  # 2 evictable hits + 2 new > 3 free
    assert kv.pool.num_free_blocks == 3 and all(h.ref_cnt == 0 for h in hits)
    assert kv.prefix_cache_stats.queries == 9  # a failed admission is not counted


def test_host_hit_is_swapped_in_and_counts_as_a_hit():
    kv = make_manager(num_blocks=4, num_host_blocks=4)
    a = req("a", list(range(9)))
    ids_a = admit_and_compute(kv, a)
    kv.free(a)
    filler = req("f", [7] * 12)
    kv.allocate_slots(filler, 12)  # evicts a's blocks to host
    swap_out, _ = kv.take_swap_ops()
    assert sorted(d for d, _ in swap_out) == sorted(ids_a[:2])
    kv.free(filler)

    b = req("b", list(range(9)))
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8 and all(isinstance(h, HostHit) for h in hits)
    new = kv.allocate_slots(b, 1, hits)
    assert new is not None and len(new) == 3
    _, swap_in = kv.take_swap_ops()
    assert swap_in == [(hits[0].host_block_id, new[0]), (hits[1].host_block_id, new[1])]
    stats = kv.prefix_cache_stats
    assert stats.hits == 8 and stats.host_hits == 8
    # the swapped-in blocks are cached on device again
    hits_c, _ = kv.get_computed_blocks(req("c", list(range(9))))
    assert all(isinstance(h, KVBlock) for h in hits_c) and [h.block_id for h in hits_c] == new[:2]


def test_mixed_device_and_host_hits_keep_their_order():
    kv = make_manager(num_blocks=5, num_host_blocks=4)
    a = req("a", list(range(13)))  # three full blocks + 1
    ids_a = admit_and_compute(kv, a)
    kv.free(a)  # freed tail first: block 2 is evicted first, then 1, 0
    f, g = req("f", [7]), req("g", [7])
    kv.allocate_slots(f, 1)  # takes the unhashed tail block
    kv.allocate_slots(g, 1)  # evicts a's third full block to host
    kv.take_swap_ops()
    kv.free(f)
    kv.free(g)
    b = req("b", list(range(13)))
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 12
    assert [type(h) for h in hits] == [KVBlock, KVBlock, HostHit]
    new = kv.allocate_slots(b, 1, hits)
    assert new is not None and new[:2] == ids_a[:2]
    assert kv.take_swap_ops()[1] == [(hits[2].host_block_id, new[2])]


def test_block_hashes_extend_over_generated_tokens():
    kv = make_manager()
    a = req("a", list(range(6)))
    admit_and_compute(kv, a)
    assert len(a.block_hashes) == 1
    for t in (100, 101):
        a.append_output_token_id(t)
    kv.allocate_slots(a, 2)
    a.num_computed_tokens = 8
    kv.cache_blocks(a, 8)
    assert len(a.block_hashes) == 2
    follow_up = req("b", list(range(6)) + [100, 101, 5])  # a multi-turn follow-up
    assert kv.get_computed_blocks(follow_up)[1] == 8


def test_decode_steps_add_a_block_only_when_the_last_one_is_full() -> None:
    kv = make_manager(num_blocks=9, caching=False)
    r = req("a", [1, 2, 3])
    assert kv.allocate_slots(r, 3) == [1]
    free = kv.pool.num_free_blocks
    r.num_computed_tokens = 3  # token 4 still fits block 1: nothing added, the pool unchanged
    assert kv.allocate_slots(r, 1) == []
    assert kv.pool.num_free_blocks == free and kv.get_block_ids(r) == [1]
    r.num_computed_tokens = 4  # token 5 opens block 2
    added = kv.allocate_slots(r, 1)
    assert len(added) == 1 and kv.get_block_ids(r) == [1, *added]
    assert kv.pool.num_free_blocks == free - 1
