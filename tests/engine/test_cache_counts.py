"""The counts behind FastDeploy's cache metrics: free vs available blocks, device
vs host prefix hits, requests preempted now (scheduler stats)."""

from __future__ import annotations

import random

from fd_core.engine.block_pool import BlockPool, HostHit
from tests.engine.test_kv_cache_manager import admit_and_compute, make_manager, req


def check_counts(pool: BlockPool) -> None:
    free = list(pool._free.values())
    assert pool.num_free_blocks == len(free)
    assert pool.num_free_uncached_blocks == sum(b.block_hash is None for b in free)
    assert pool.num_cached_blocks == sum(b.block_hash is not None for b in pool.blocks)


def test_free_uncached_blocks_follow_every_transition():
    pool = BlockPool(num_blocks=6, num_host_blocks=2)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_full_blocks([a, b], [11, 12])
    check_counts(pool)
    assert pool.num_free_blocks == 2 and pool.num_free_uncached_blocks == 2
    pool.free_blocks([b, a, c])  # two cached blocks join the LRU part
    check_counts(pool)
    assert pool.num_free_blocks == 5 and pool.num_free_uncached_blocks == 3
    pool.touch([a])  # a cache hit takes a cached block back
    check_counts(pool)
    assert pool.num_free_uncached_blocks == 3
    pool.get_new_blocks(4)  # uncached first, then evicts b (swapped out to host)
    check_counts(pool)
    assert pool.num_free_blocks == 0 and pool.num_cached_blocks == 1
    pool.take_swap_ops()
    pool.free_blocks([a])
    check_counts(pool)


def test_counts_stay_right_under_random_use():
    rng = random.Random(0)
    pool = BlockPool(num_blocks=9, num_host_blocks=3)
    held: list = []
    next_hash = 1
    for _ in range(400):
        op = rng.randrange(5)
        if op == 0 and pool.num_free_blocks:
            held += pool.get_new_blocks(rng.randint(1, pool.num_free_blocks))
        elif op == 1 and held:
            block = held.pop(rng.randrange(len(held)))
            pool.free_blocks([block])
        elif op == 2 and held:
            block = rng.choice(held)
            pool.cache_full_blocks([block], [next_hash])
            next_hash += 1
        elif op == 3:
            cached = [b for b in pool.blocks if b.block_hash is not None and b.ref_cnt == 0]
            if cached:
                block = rng.choice(cached)
                pool.touch([block])
                held.append(block)
        elif op == 4:
            hosts = [(h, hb) for h, hb in pool._host_cached.items() if pool.get_cached_block(h) is None]
            if hosts and pool.num_free_blocks:
                h, hb = rng.choice(hosts)
                held += pool.swap_in([HostHit(h, hb)])
            pool.take_swap_ops()
        check_counts(pool)
    pool.free_blocks(held)
    check_counts(pool)
    assert pool.reset_prefix_cache()
    check_counts(pool)
    assert pool.num_free_uncached_blocks == pool.num_blocks - 1


def test_host_hits_are_counted_apart():
    kv = make_manager(num_blocks=4, num_host_blocks=4)  # 3 usable device blocks
    a = req("a", list(range(9)))  # two full blocks cached
    admit_and_compute(kv, a)
    kv.free(a)
    filler = req("f", [90, 91, 92, 93, 94, 95, 96, 97, 98])  # evicts a's blocks to host
    admit_and_compute(kv, filler)
    kv.free(filler)
    kv.take_swap_ops()
    b = req("b", list(range(8)) + [70, 71])
    admit_and_compute(kv, b)
    stats = kv.prefix_cache_stats
    assert stats.hits >= 8 and stats.host_hits == 8


def test_scheduler_stats_count_preempted_requests_and_blocks_now():
    from tests.engine.test_scheduler import make_req, make_scheduler, run_to_completion, step

    sched = make_scheduler(num_blocks=5, caching=False)  # 4 usable blocks of 4 tokens
    a, b, c = make_req("a", 8, max_tokens=4), make_req("b", 7, max_tokens=4), make_req("c", 3)
    for r in (a, b, c):
        sched.add_request(r)
    step(sched)  # a and b prefilled, the pool is full, c waits
    st = sched.make_stats()
    assert (st.num_running, st.num_waiting, st.num_preempted, st.num_free_blocks) == (2, 1, 0, 0)
    step(sched)  # a needs a third block: b is preempted, back at the head of the queue
    st = sched.make_stats()
    assert (st.num_running, st.num_waiting, st.num_preempted) == (1, 2, 1)
    assert st.num_free_blocks == 1 and st.num_free_uncached_blocks == 1
    run_to_completion(sched)
    st = sched.make_stats()
    assert (st.num_running, st.num_waiting, st.num_preempted, st.num_free_blocks) == (0, 0, 0, 4)
