"""The scheduler with draft tokens (pure Python, no model): drafts counted in the
budget and cut to it, rejected drafts rolled back (computed tokens, blocks),
the prefix cache registering only verified tokens."""

from __future__ import annotations

from dataclasses import dataclass

from fd_core.engine.config import CacheConfig, SchedulerConfig
from fd_core.engine.request import Request
from fd_core.engine.scheduler import Scheduler


@dataclass
class SP:
    max_tokens: int | None = 32
    min_tokens: int = 0
    ignore_eos: bool = True
    stop_token_ids: list[int] | None = None


def _sched(budget: int = 64, num_blocks: int = 33, block_size: int = 4, max_model_len: int = 64) -> Scheduler:
    return Scheduler(SchedulerConfig(8, budget, max_model_len, True), CacheConfig(num_blocks, block_size))


def _decoding(s: Scheduler, rid: str = "a", prompt: int = 6, **sp) -> Request:
    """A request past its prefill (first token sampled), decoding."""
    req = Request(rid, list(range(1, prompt + 1)), SP(**sp))
    s.add_request(req)
    out = s.schedule()
    s.update_from_output(out, {x.request_id: [100] for x in out.scheduled if x.samples})
    return req


def test_drafts_are_scheduled_after_the_last_token_and_counted_in_the_budget():
    s = _sched()
    req = _decoding(s)
    s.set_draft_token_ids("a", [7, 8, 9])
    out = s.schedule()
    (sr,) = out.scheduled
    assert sr.token_ids == [100, 7, 8, 9] and sr.num_draft_tokens == 3 and sr.samples
    assert sr.seq_len == 10 and out.total_num_scheduled_tokens == 4
    assert out.num_decodes == 0  # more than one new token: the ragged (prefill) path
    assert req.num_computed_tokens == 6


def test_drafts_are_cut_to_the_budget_and_used_once():
    s = _sched(budget=3)
    _decoding(s, prompt=2)
    s.set_draft_token_ids("a", [7, 8, 9])
    (sr,) = s.schedule().scheduled
    assert sr.token_ids == [100, 7, 8]
    s.update_from_output(s._last_step, {"a": [7, 50]})
    (sr,) = s.schedule().scheduled  # no new drafts handed in: an ordinary decode
    assert sr.token_ids == [50] and sr.num_draft_tokens == 0


def test_rejected_drafts_roll_back_computed_tokens_and_free_their_blocks():
    s = _sched(block_size=4)
    req = _decoding(s, prompt=6)  # 7 tokens, 6 computed: 2 blocks
    kv = s.kv_cache_manager
    s.set_draft_token_ids("a", [1, 2, 3, 4, 5, 6])
    out = s.schedule()
    assert len(out.scheduled[0].block_ids) == 4  # KV for 13 tokens
    free_before = kv.pool.num_free_blocks
    # one draft accepted, then the target's own token
    (update,) = s.update_from_output(out, {"a": [1, 77]})
    assert update.new_token_ids == [1, 77]
    assert req.output_token_ids == [100, 1, 77]
    assert req.num_computed_tokens == 8 == req.num_tokens - 1
    assert len(kv.get_block_ids(req)) == 2  # the two blocks that held only rejected drafts are back
    assert kv.pool.num_free_blocks == free_before + 2
    (sr,) = s.schedule().scheduled
    assert sr.token_ids == [77] and sr.num_computed_tokens == 8


def test_prefix_cache_registers_only_blocks_of_verified_tokens():
    s = _sched(block_size=4)
    req = _decoding(s, prompt=6)
    kv = s.kv_cache_manager
    s.set_draft_token_ids("a", [1, 2, 3, 4, 5])  # KV for positions 6..11: blocks 1 and 2 written
    out = s.schedule()
    s.update_from_output(out, {"a": [9]})  # every draft rejected
    assert req.num_computed_tokens == 7
    assert kv._num_cached_blocks["a"] == 1  # block 1 holds 3 verified tokens and a rejected draft
    s.set_draft_token_ids("a", [2, 3])
    out = s.schedule()
    s.update_from_output(out, {"a": [2, 3, 4]})  # all accepted + bonus: 10 verified
    assert req.num_computed_tokens == 10
    assert kv._num_cached_blocks["a"] == 2
    assert req.all_token_ids[:8] == [1, 2, 3, 4, 5, 6, 100, 9]
    # a new request with the same first 8 tokens hits both verified blocks
    twin = Request("b", req.all_token_ids[:8] + [42], SP())
    s.add_request(twin)
    hits, num = kv.get_computed_blocks(twin)
    assert num == 8


def test_short_of_blocks_a_request_drops_its_drafts_before_anyone_is_preempted():
    s = _sched(block_size=4, num_blocks=5)  # 4 usable blocks
    _decoding(s, "a", prompt=3, max_tokens=8)  # 1 block
    _decoding(s, "b", prompt=7, max_tokens=8)  # 2 blocks
    s.set_draft_token_ids("a", [1, 2, 3, 4, 5, 6, 7, 8])  # would need 2 more blocks; 1 is free
    out = s.schedule()
    assert not out.preempted_req_ids
    assert {x.request_id: x.num_draft_tokens for x in out.scheduled} == {"a": 0, "b": 0}


def test_drafts_never_pass_max_model_len_and_preempted_requests_lose_theirs():
    s = _sched(max_model_len=12)
    req = _decoding(s, prompt=8)  # 9 tokens
    s.set_draft_token_ids("a", [1, 2, 3, 4, 5])
    (sr,) = s.schedule().scheduled
    assert sr.seq_len <= 12 and sr.num_draft_tokens == 3
    s.update_from_output(s._last_step, {"a": [5]})
    s.set_draft_token_ids("a", [1])
    s._preempt(s.running.pop())
    assert "a" not in s._draft_token_ids
    assert req.num_computed_tokens == 0


def test_a_request_with_drafts_runs_as_one_token_decode_rows():
    from fd_core.engine.speculative import step_input

    s = _sched()
    _decoding(s, "a", prompt=6)
    _decoding(s, "b", prompt=3)
    s.add_request(Request("c", list(range(200, 209)), SP()))  # a prefill
    s.set_draft_token_ids("b", [7, 8])
    out = s.schedule()
    assert [x.request_id for x in out.scheduled] == ["a", "b", "c"] and out.num_decodes == 1
    step = step_input(out.scheduled, out.num_decodes, [False] * 3, [])
    b = out.scheduled[1]
    assert step.token_ids == [[100], [100], [7], [8], list(range(200, 209))]
    assert step.seq_lens == [8, 4, 5, 6, 9]  # each draft row sees the tokens before it and itself
    assert step.block_tables[1] == step.block_tables[2] == step.block_tables[3] == b.block_ids
    assert step.num_decodes == 4 and step.needs_logits == [True] * 5
