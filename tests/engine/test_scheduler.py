"""Scheduler: budgets, chunked prefill, prefix hits, preemption, stops, aborts,
swap, admission checks, and randomized runs checking invariants every step.

No model: a fake sampler returns a token that depends only on the request
and its output index, and ``FakeKV`` plays the runner's KV memory, checking
that every step reads exactly the context it needs (swap ops included).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pytest

from fd_core.engine.config import CacheConfig, SchedulerConfig
from fd_core.engine.request import Request, RequestStatus
from fd_core.engine.scheduler import Scheduler
from fd_core.engine.scheduler_output import SchedulerOutput

EOS = 999


@dataclass
class SP:
    max_tokens: int | None = 8
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None


def make_scheduler(
    num_blocks: int = 65,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    chunked: bool = True,
    num_host_blocks: int = 0,
    caching: bool = True,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len, chunked),
        CacheConfig(num_blocks, block_size, num_host_blocks, caching),
    )


def make_req(rid: str, prompt: list[int] | int, max_tokens: int | None = 8, **kw) -> Request:
    tokens = list(range(1, prompt + 1)) if isinstance(prompt, int) else prompt
    sp = SP(max_tokens=max_tokens, **{k: kw.pop(k) for k in list(kw) if hasattr(SP, k)})
    return Request(rid, tokens, sp, eos_token_ids=[EOS], **kw)


def fake_token(req: Request) -> int:
    """The 'model': a token fixed by the request and its output index, never EOS."""
    return (sum(map(ord, req.request_id)) * 31 + req.num_output_tokens * 17) % 900 + 1


class FakeKV:
    """The runner's KV memory: each slot holds a key of the token prefix it was
    computed for. Checks every scheduled request reads the right context. A
    request of ``num_steps`` steps (multi-step decoding) also writes the slots
    of the tokens the model samples before its last step (``sampled``)."""

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.device: dict[int, list] = {}  # block id -> slot keys
        self.host: dict[int, list] = {}

    def run(self, sched: Scheduler, out: SchedulerOutput, sampled: dict[str, list[int]] | None = None) -> None:
        for dev, host in out.swap_out:  # all swap-outs, then all swap-ins, then the forward
            self.host[host] = list(self.device[dev])
        for host, dev in out.swap_in:
            self.device[dev] = list(self.host[host])
        for s in out.scheduled:
            req = sched.get_request(s.request_id)
            assert req is not None
            assert s.token_ids == req.all_token_ids[s.num_computed_tokens : s.seq_len]
            tokens = req.all_token_ids + (sampled or {}).get(s.request_id, [])[: s.num_steps - 1]
            end = s.seq_len + s.num_steps - 1  # the last slot a step writes, + 1
            assert len(s.block_ids) * self.bs >= end and end <= sched.config.max_model_len
            keys, key = [], 0
            for t in tokens[:end]:
                key = hash((key, t))
                keys.append(key)
            for pos in range(s.num_computed_tokens):  # the context attention reads
                block = self.device[s.block_ids[pos // self.bs]]
                assert block[pos % self.bs] == keys[pos], f"{s.request_id}: stale KV at {pos}"
            for pos in range(s.num_computed_tokens, end):
                block = self.device.setdefault(s.block_ids[pos // self.bs], [None] * self.bs)
                block[pos % self.bs] = keys[pos]


def check_invariants(sched: Scheduler, out: SchedulerOutput | None = None) -> None:
    kv, cfg = sched.kv_cache_manager, sched.config
    pool = kv.pool
    held: Counter[int] = Counter()
    for r in sched.running:
        assert r.status == RequestStatus.RUNNING
        assert r.num_computed_tokens <= r.num_tokens
        held.update(kv.get_block_ids(r))
    for r in sched.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert kv.get_block_ids(r) == [] and r.num_computed_tokens == 0
    assert 0 not in held  # the null block is never handed out
    assert all(b.ref_cnt >= 0 for b in pool.blocks)
    assert sum(b.ref_cnt for b in pool.blocks) == sum(held.values())
    assert all(pool.blocks[i].ref_cnt == n for i, n in held.items())
    assert pool.num_free_blocks + len(held) == pool.num_blocks - 1
    for block_id, n in held.items():  # shared only as a cached prefix block
        assert n == 1 or pool.blocks[block_id].block_hash is not None
    assert len(sched.running) <= cfg.max_num_seqs
    if out is not None:
        assert out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
        assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values())
        assert all(s.num_tokens == 1 for s in out.scheduled[: out.num_decodes])
        assert all(s.num_tokens > 1 for s in out.scheduled[out.num_decodes :])
        for s in out.scheduled:
            assert s.num_tokens > 0 and len(s.block_ids) * sched.block_size >= s.seq_len
            assert s.seq_len <= cfg.max_model_len


def step(sched: Scheduler, kv: FakeKV | None = None, sample=fake_token):
    out = sched.schedule()
    check_invariants(sched, out)
    if kv is not None:
        kv.run(sched, out)
    sampled = {
        s.request_id: [sample(sched.get_request(s.request_id))] for s in out.scheduled if s.samples
    }
    updates = sched.update_from_output(out, sampled)
    check_invariants(sched)
    return out, updates


def run_to_completion(sched: Scheduler, kv: FakeKV | None = None, max_steps: int = 5000) -> int:
    steps = 0
    while sched.has_unfinished_requests():
        step(sched, kv)
        steps += 1
        assert steps < max_steps, "no progress"
    return steps


def assert_all_blocks_free(sched: Scheduler) -> None:
    pool = sched.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks - 1 and pool.usage == 0.0
    assert all(b.ref_cnt == 0 for b in pool.blocks)


# -- budgets and chunking ------------------------------------------------------


def test_budget_and_max_num_seqs_are_respected():
    sched = make_scheduler(max_num_seqs=3, max_num_batched_tokens=40)
    for i in range(6):
        sched.add_request(make_req(f"r{i}", 15))
    out, _ = step(sched)
    assert [s.num_tokens for s in out.scheduled] == [15, 15, 10]  # the third is chunked
    assert sched.num_running == 3 and sched.num_waiting == 3
    out, _ = step(sched)
    assert out.num_decodes == 2 and out.scheduled[2].request_id == "r2"
    assert out.total_num_scheduled_tokens == 2 + 5  # no room for a fourth sequence
    run_to_completion(sched)
    assert_all_blocks_free(sched)


def test_chunked_prefill_cuts_the_prompt_and_samples_at_the_end():
    sched = make_scheduler(max_num_batched_tokens=16)
    req = make_req("a", 40, max_tokens=2)
    sched.add_request(req)
    chunks = []
    for _ in range(3):
        out, updates = step(sched)
        (s,) = out.scheduled
        chunks.append((s.num_computed_tokens, s.num_tokens, s.samples))
        assert (updates != []) == s.samples
    assert chunks == [(0, 16, False), (16, 16, False), (32, 8, True)]
    assert req.num_output_tokens == 1


def test_long_prefill_threshold_caps_a_chunk():
    sched = Scheduler(
        SchedulerConfig(8, 64, 64, long_prefill_token_threshold=10), CacheConfig(65, 4)
    )
    sched.add_request(make_req("a", 25))
    sched.add_request(make_req("b", 5))
    out, _ = step(sched)
    assert [(s.request_id, s.num_tokens) for s in out.scheduled] == [("a", 10), ("b", 5)]


def test_decodes_come_first_then_prefills():
    sched = make_scheduler()
    sched.add_request(make_req("a", 6))
    step(sched)
    sched.add_request(make_req("b", 6))
    out, _ = step(sched)
    assert [s.request_id for s in out.scheduled] == ["a", "b"] and out.num_decodes == 1
    assert out.scheduled[0].token_ids == [sched.get_request("a").output_token_ids[0]]


def test_without_chunking_a_prompt_waits_for_a_step_it_fits():
    sched = make_scheduler(max_num_batched_tokens=64, max_model_len=64, chunked=False)
    sched.add_request(make_req("a", 40))
    sched.add_request(make_req("b", list(range(100, 140))))
    out, _ = step(sched)
    assert [s.request_id for s in out.scheduled] == ["a"]  # b does not fit the 24 left
    out, _ = step(sched)
    assert [(s.request_id, s.num_tokens) for s in out.scheduled] == [("a", 1), ("b", 40)]


def test_without_chunking_the_budget_must_hold_max_model_len():
    with pytest.raises(ValueError, match=r"--max-num-batched-tokens 2048 .* --max-model-len 4096"):
        SchedulerConfig(8, 2048, 4096, enable_chunked_prefill=False)
    SchedulerConfig(8, 2048, 4096, enable_chunked_prefill=True)


# -- prefix caching ------------------------------------------------------------


def test_second_request_skips_the_cached_prefix():
    sched = make_scheduler(block_size=16)
    prefix = list(range(1, 49))  # three full blocks
    a = make_req("a", prefix + [7, 8])
    sched.add_request(a)
    run_to_completion(sched)
    b = make_req("b", prefix + [9, 10, 11])
    sched.add_request(b)
    out, _ = step(sched)
    (s,) = out.scheduled
    assert s.num_computed_tokens == 48 and s.token_ids == [9, 10, 11]
    assert b.num_cached_tokens == 48
    stats = sched.make_stats()
    assert stats.prefix_cache_hits == 48 and stats.prefix_cache_queries == 50 + 51


def test_full_prefix_hit_still_computes_the_last_prompt_token():
    sched = make_scheduler(block_size=16)
    sched.add_request(make_req("a", 32))
    run_to_completion(sched)
    b = make_req("b", 32)
    sched.add_request(b)
    out, updates = step(sched)
    (s,) = out.scheduled
    assert s.num_computed_tokens == 16 and s.num_tokens == 16 and s.samples
    assert updates[0].new_token_ids == b.output_token_ids and b.num_output_tokens == 1


def test_swapped_out_prefix_comes_back_by_swap_in():
    sched = make_scheduler(num_blocks=9, num_host_blocks=8)  # 8 usable blocks of 4
    kv = FakeKV(4)
    sched.add_request(make_req("a", 12, max_tokens=1))
    run_to_completion(sched, kv)
    sched.add_request(make_req("filler", list(range(100, 130)), max_tokens=1))
    swap_outs = []
    while sched.has_unfinished_requests():
        out, _ = step(sched, kv)
        swap_outs += out.swap_out
    assert len(swap_outs) >= 2  # a's full blocks moved to host
    b = make_req("b", 12, max_tokens=2)
    sched.add_request(b)
    out, _ = step(sched, kv)  # FakeKV checks the swapped-in context is right
    assert len(out.swap_in) == 2 and b.num_cached_tokens == 8
    assert out.scheduled[0].num_computed_tokens == 8
    assert sched.make_stats().num_swap_ins == 2
    run_to_completion(sched, kv)
    assert_all_blocks_free(sched)


# -- preemption ----------------------------------------------------------------


def test_preempts_the_most_recent_request_and_recomputes_it():
    sched = make_scheduler(num_blocks=5, caching=False)  # 4 blocks of 4 tokens
    a, b = make_req("a", 8, max_tokens=4), make_req("b", 7, max_tokens=4)
    sched.add_request(a)
    sched.add_request(b)
    step(sched)  # both prefilled: 2 + 2 blocks, the pool is full
    out, _ = step(sched)  # a needs a third block: b is preempted
    assert out.preempted_req_ids == ["b"] and [s.request_id for s in out.scheduled] == ["a"]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert sched.waiting[0] is b and b.num_output_tokens == 1 and b.num_preemptions == 1
    run_to_completion(sched)
    assert a.output_token_ids == [fake_token_at(a, k) for k in range(4)]
    assert b.output_token_ids == [fake_token_at(b, k) for k in range(4)]
    assert sched.make_stats().num_preemptions >= 1
    assert_all_blocks_free(sched)


def test_the_last_request_preempts_itself():
    sched = make_scheduler(num_blocks=5, caching=False)
    a, b = make_req("a", 7, max_tokens=4), make_req("b", 8, max_tokens=4)
    sched.add_request(a)
    sched.add_request(b)
    step(sched)
    out, _ = step(sched)  # a fits its 8th token; b needs a new block and is the newest
    assert out.preempted_req_ids == ["b"] and [s.request_id for s in out.scheduled] == ["a"]
    run_to_completion(sched)
    assert a.num_output_tokens == 4 and b.num_output_tokens == 4


def fake_token_at(req: Request, k: int) -> int:
    return (sum(map(ord, req.request_id)) * 31 + k * 17) % 900 + 1


@pytest.mark.parametrize("seed", range(4))
def test_memory_pressure_every_request_finishes_with_the_right_tokens(seed):
    rng = random.Random(seed)
    sched = make_scheduler(
        num_blocks=13,
        max_num_seqs=6,
        max_num_batched_tokens=24,
        max_model_len=40,
        num_host_blocks=4 if seed % 2 else 0,
    )
    kv = FakeKV(4)
    shared = [rng.randrange(1, 900) for _ in range(12)]
    reqs = []
    for i in range(30):
        prompt = shared[: rng.randrange(0, 13)] + [
            rng.randrange(1, 900) for _ in range(rng.randrange(1, 12))
        ]
        reqs.append(make_req(f"r{i}", prompt, max_tokens=rng.randrange(1, 40 - len(prompt) + 1)))
    pending = list(reqs)
    steps = 0
    while pending or sched.has_unfinished_requests():
        for _ in range(rng.randrange(0, 3)):
            if pending:
                sched.add_request(pending.pop(0))
        step(sched, kv)
        steps += 1
        assert steps < 5000
    assert steps > 100 and sched.num_preemptions > 0
    for r in reqs:
        assert r.finish_reason == "length"
        assert r.output_token_ids == [fake_token_at(r, k) for k in range(r.max_tokens)]
    assert_all_blocks_free(sched)


# -- stop conditions -----------------------------------------------------------


def drive(sched: Scheduler, tokens: list[int]) -> list[int]:
    """Run one request, sampling ``tokens`` in order; returns what it emitted."""
    script = iter(tokens)
    emitted = []
    while sched.has_unfinished_requests():
        for u in step(sched, sample=lambda r: next(script))[1]:
            emitted += u.new_token_ids
    return emitted


def test_eos_stops_but_not_before_min_tokens():
    sched = make_scheduler()
    r = make_req("a", 4, max_tokens=10, min_tokens=2)
    sched.add_request(r)
    assert drive(sched, [EOS, 5, EOS, 6]) == [EOS, 5, EOS]
    assert r.finish_reason == "stop" and r.stop_reason is None


def test_ignore_eos_runs_to_max_tokens():
    sched = make_scheduler()
    r = make_req("a", 4, max_tokens=3, ignore_eos=True)
    sched.add_request(r)
    assert drive(sched, [EOS, EOS, EOS, EOS]) == [EOS] * 3
    assert r.finish_reason == "length" and r.status == RequestStatus.FINISHED_LENGTH


def test_stop_token_ids_set_stop_reason():
    sched = make_scheduler()
    r = make_req("a", 4, max_tokens=10, stop_token_ids=[42], min_tokens=1)
    sched.add_request(r)
    assert drive(sched, [42, 42, 7]) == [42]  # the first output already meets min_tokens=1
    assert r.finish_reason == "stop" and r.stop_reason == 42


def test_stop_token_wins_over_length_on_the_same_token():
    sched = make_scheduler()
    r = make_req("a", 4, max_tokens=2, stop_token_ids=[42])
    sched.add_request(r)
    assert drive(sched, [1, 42]) == [1, 42] and r.finish_reason == "stop"


def test_generation_is_capped_at_max_model_len():
    sched = make_scheduler(max_model_len=16, max_num_batched_tokens=16)
    r = make_req("a", 10, max_tokens=None)
    sched.add_request(r)
    run_to_completion(sched)
    assert r.num_tokens == 16 and r.num_output_tokens == 6 and r.finish_reason == "length"


def test_multi_token_output_stops_at_the_first_stop():
    sched = make_scheduler()
    r = make_req("a", 4, max_tokens=10)
    sched.add_request(r)
    out = sched.schedule()
    (u,) = sched.update_from_output(out, {"a": [3, EOS, 5]})
    assert u.new_token_ids == [3, EOS] and u.finished and r.output_token_ids == [3, EOS]
    assert_all_blocks_free(sched)


def test_finish_requests_for_a_stop_string():
    sched = make_scheduler()
    r = make_req("a", 4)
    sched.add_request(r)
    out, _ = step(sched)
    (done,) = sched.finish_requests("a", RequestStatus.FINISHED_STOPPED, stop_reason="###")
    assert done is r and r.finish_reason == "stop" and r.stop_reason == "###"
    assert r.finish_time is not None and r.first_token_time is not None
    assert sched.schedule().finished_req_ids == ["a"]
    assert_all_blocks_free(sched)
    with pytest.raises(ValueError, match="finished status"):
        sched.finish_requests("a", RequestStatus.RUNNING)


# -- aborts --------------------------------------------------------------------


def test_abort_frees_blocks_of_running_and_waiting_requests():
    sched = make_scheduler(num_blocks=9, max_num_batched_tokens=20)
    for i in range(4):
        sched.add_request(make_req(f"r{i}", list(range(10 * i + 1, 10 * i + 11))))
    out = sched.schedule()
    assert sched.num_running == 2 and sched.num_waiting == 2
    assert sched.abort("r0").finish_reason == "abort"  # while its step runs
    assert sched.abort("r3").status == RequestStatus.FINISHED_ABORTED  # waiting
    assert sched.abort("nope") is None
    (u,) = sched.update_from_output(out, {"r0": [5], "r1": [5]})  # r0 is skipped
    assert u.request.request_id == "r1"
    with pytest.raises(RuntimeError, match="stale step"):
        sched.update_from_output(out, {"r1": [5]})
    sched.abort("r1")
    sched.abort("r2")
    assert_all_blocks_free(sched)
    assert not sched.has_unfinished_requests()
    assert sorted(sched.schedule().finished_req_ids) == ["r0", "r1", "r2", "r3"]


# -- admission -----------------------------------------------------------------


def test_too_long_prompt_is_rejected_naming_both_numbers():
    sched = make_scheduler(max_model_len=64)
    with pytest.raises(ValueError, match=r"64 tokens but max_model_len is 64"):
        sched.add_request(make_req("a", 64))
    sched.add_request(make_req("b", 63, max_tokens=100))  # generation is capped instead
    assert sched.num_waiting == 1


def test_request_larger_than_the_kv_pool_is_rejected():
    sched = make_scheduler(num_blocks=5, max_model_len=64)  # 4 blocks of 4 tokens
    with pytest.raises(
        ValueError, match=r"need 8 KV blocks of 4 tokens, but the KV cache has only 4"
    ):
        sched.add_request(make_req("a", 10, max_tokens=20))
    sched.add_request(make_req("c", 10, max_tokens=7))  # 16 tokens, 15 cached: 4 blocks
    run_to_completion(sched)


def test_no_max_tokens_means_as_many_as_the_pool_holds_not_a_refusal():
    sched = make_scheduler(num_blocks=5, max_model_len=64)  # 16 tokens of KV, less than max_model_len
    b = make_req("b", 10, max_tokens=None)
    sched.add_request(b)
    assert b.max_tokens == 7  # 10 + 7 = 17 tokens: the 17th is sampled, its KV never stored
    run_to_completion(sched)
    assert b.num_output_tokens == 7 and b.status == RequestStatus.FINISHED_LENGTH


def test_bad_requests_are_rejected():
    sched = make_scheduler()
    with pytest.raises(ValueError, match="prompt is empty"):
        make_req("a", [])
    sched.add_request(make_req("a", 3))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(make_req("a", 3))


# -- randomized property test --------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_random_arrivals_lengths_and_aborts_keep_invariants(seed):
    rng = random.Random(1000 + seed)
    chunked = seed % 3 != 2
    max_model_len = 48
    sched = make_scheduler(
        num_blocks=rng.randrange(14, 30),
        max_num_seqs=rng.randrange(2, 9),
        max_num_batched_tokens=rng.randrange(16, 64) if chunked else 64,
        max_model_len=max_model_len,
        chunked=chunked,
        num_host_blocks=rng.choice([0, 3, 10]),
        caching=seed != 5,
    )
    kv = FakeKV(4)
    prefixes = [[rng.randrange(1, 900) for _ in range(16)] for _ in range(3)]
    expected: dict[str, int] = {}
    aborted: set[str] = set()
    n = 0
    for t in range(400):
        if t < 300 and rng.random() < 0.4:
            prompt = rng.choice(prefixes)[: rng.randrange(0, 17)]
            prompt += [rng.randrange(1, 900) for _ in range(rng.randrange(1, 20))]
            max_tokens = rng.randrange(1, max_model_len - len(prompt) + 1)
            salt = rng.choice([None, None, "s"])
            r = make_req(f"q{n}", prompt, max_tokens=max_tokens, cache_salt=salt)
            n += 1
            sched.add_request(r)
            expected[r.request_id] = max_tokens
        if sched.requests and rng.random() < 0.05:
            victim = rng.choice(sorted(sched.requests))
            sched.abort(victim)
            aborted.add(victim)
        out, updates = step(sched, kv)
        for u in updates:
            assert u.request.num_output_tokens <= expected[u.request.request_id]
            if u.finished:
                assert u.request.num_output_tokens == expected[u.request.request_id]
    run_to_completion(sched, kv)
    assert n > 80 and aborted
    assert_all_blocks_free(sched)


def test_request_validation_and_status_names():
    with pytest.raises(ValueError, match="2 mm_hashes but 1 mm_positions"):
        make_req("a", 3, mm_hashes=["x", "y"], mm_positions=[(0, 1)])
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        make_req("a", 3, max_tokens=0)
    r = Request("plain", [1, 2])  # no sampling params: no limits but max_model_len
    assert r.max_tokens is None and r.finish_reason is None and not r.is_finished
    assert RequestStatus.FINISHED_ABORTED.finish_reason == "abort"
    assert not RequestStatus.PREEMPTED.is_finished


def test_stats_and_reset_prefix_cache():
    sched = make_scheduler(block_size=4)
    sched.add_request(make_req("a", 9, max_tokens=2))
    sched.add_request(make_req("b", list(range(50, 60)), max_tokens=2))
    step(sched)
    assert not sched.reset_prefix_cache()  # blocks in use
    stats = sched.make_stats()
    assert (stats.num_running, stats.num_waiting, stats.step_num_scheduled_tokens) == (2, 0, 19)
    assert stats.step_num_prefill_tokens == 19 and stats.step_num_decodes == 0
    assert 0 < stats.kv_cache_usage < 1
    run_to_completion(sched)
    assert sched.reset_prefix_cache()
    sched.add_request(make_req("c", 9))
    step(sched)
    assert sched.get_request("c").num_cached_tokens == 0


def _partial_scheduler(max_partial: int, max_long: int, threshold: int = 10) -> Scheduler:
    return Scheduler(
        SchedulerConfig(8, 64, 64, long_prefill_token_threshold=threshold,
                        max_num_partial_prefills=max_partial, max_long_partial_prefills=max_long),
        CacheConfig(129, 4),
    )


def test_partial_prefills_are_limited_per_step():
    sched = _partial_scheduler(max_partial=1, max_long=1)
    for rid in "abc":
        sched.add_request(make_req(rid, 25))
    out, _ = step(sched)
    # one prompt mid-prefill at a time: b and c wait although the budget has room
    assert [(s.request_id, s.num_tokens) for s in out.scheduled] == [("a", 10)]
    sched = _partial_scheduler(max_partial=2, max_long=2)
    for rid in "abc":
        sched.add_request(make_req(rid, 25))
    out, _ = step(sched)
    assert [(s.request_id, s.num_tokens) for s in out.scheduled] == [("a", 10), ("b", 10)]


def test_short_prompt_overtakes_a_long_one_without_a_long_slot():
    sched = _partial_scheduler(max_partial=3, max_long=1)
    sched.add_request(make_req("long1", 40))
    sched.add_request(make_req("long2", 40))
    sched.add_request(make_req("short", 8))
    out, _ = step(sched)
    # long2 finds the only long slot taken; short (one chunk, not partial) goes ahead of it
    assert [(s.request_id, s.num_tokens) for s in out.scheduled] == [("long1", 10), ("short", 8)]
    assert [r.request_id for r in sched.waiting] == ["long2"]
    # every request still finishes
    for _ in range(40):
        if not sched.has_unfinished_requests():
            break
        step(sched)
    assert not sched.has_unfinished_requests()


def test_partial_prefill_limits_are_checked():
    with pytest.raises(ValueError, match="max-long-partial-prefills 3 exceeds"):
        SchedulerConfig(8, 64, 64, max_num_partial_prefills=2, max_long_partial_prefills=3)
    with pytest.raises(ValueError, match="max-num-partial-prefills must be >= 1, got 0"):
        SchedulerConfig(8, 64, 64, max_num_partial_prefills=0)
    # the default long threshold: 4% of max_model_len once several partial prefills are allowed
    assert SchedulerConfig(8, 64, 2048, max_num_partial_prefills=2).long_prompt_threshold == 81
    assert SchedulerConfig(8, 64, 2048).long_prompt_threshold == 0
