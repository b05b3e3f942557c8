"""Multi-step decoding (``--num-scheduler-steps``): the scheduler's rules for
when a schedule runs several decode steps and how their tokens come back
(pure Python, a fake model), then the engine end to end on the CPU
reference (the core runs the steps one forward at a time): the same tokens
as one step a schedule, whatever the batch, stops, arrivals and preemption."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from fd_core.config import EngineArgs
from fd_core.engine.config import CacheConfig, SchedulerConfig
from fd_core.engine.request import Request
from fd_core.engine.scheduler import Scheduler
from fd_core.engine.scheduler_output import SchedulerOutput
from tests.engine.test_scheduler import FakeKV
from tests.spec_decode.test_engine_scheduler import SP  # max_tokens 32, ignore_eos


def _sched(steps: int = 4, num_blocks: int = 33, block_size: int = 4, max_model_len: int = 64,
           max_num_seqs: int = 8, budget: int = 64, num_host_blocks: int = 0) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs, budget, max_model_len, True, num_scheduler_steps=steps),
                     CacheConfig(num_blocks, block_size, num_host_blocks))


def _add(s: Scheduler, rid: str, prompt: int = 6, multi: bool = True, **sp) -> Request:
    req = Request(rid, list(range(1, prompt + 1)), SP(**sp))
    req.multi_step = multi
    s.add_request(req)
    return req


def _prefill(s: Scheduler) -> SchedulerOutput:
    """A step that prefills whoever waits (their first token 100)."""
    out = s.schedule()
    assert all(x.num_steps == 1 for x in out.scheduled)
    s.update_from_output(out, {x.request_id: [100] for x in out.scheduled if x.samples})
    return out


def test_decoding_requests_run_the_steps_together_and_take_their_tokens():
    s = _sched(steps=4)
    a, b = _add(s, "a"), _add(s, "b", prompt=3)
    _prefill(s)
    out = s.schedule()
    assert [x.num_steps for x in out.scheduled] == [4, 4] and out.num_decodes == 2
    assert [x.token_ids for x in out.scheduled] == [[100], [100]]  # the last known token; the rest are sampled
    assert out.total_num_scheduled_tokens == 8 and out.num_scheduled_tokens == {"a": 4, "b": 4}
    for x, req in zip(out.scheduled, (a, b)):  # blocks for every step's slot: positions up to seq_len + 3
        assert len(x.block_ids) * 4 >= x.seq_len + 3 and x.block_ids == s.kv_cache_manager.get_block_ids(req)
    s.update_from_output(out, {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]})
    assert a.output_token_ids == [100, 1, 2, 3, 4] and a.num_computed_tokens == 10 and a.num_tokens == 11
    assert b.output_token_ids == [100, 5, 6, 7, 8] and b.num_computed_tokens == 7
    with pytest.raises(ValueError, match="3 tokens for a schedule of 4 steps"):
        s.update_from_output(s.schedule(), {"a": [1, 2, 3], "b": [1, 2, 3, 4]})


def test_the_steps_stop_at_max_tokens_and_max_model_len():
    s = _sched(steps=8, max_model_len=20)
    _add(s, "a", max_tokens=4)
    _prefill(s)
    (x,) = s.schedule().scheduled
    assert x.num_steps == 3  # 1 output so far, 4 at most
    s.update_from_output(s.last_output, {"a": [1, 2, 3]})
    assert s.get_request("a") is None  # finished: length

    s = _sched(steps=8, max_model_len=12)
    req = _add(s, "b", prompt=8, max_tokens=None)
    _prefill(s)
    (x,) = s.schedule().scheduled
    assert x.num_steps == 3 and x.seq_len + x.num_steps - 1 <= 12 - 1  # 9 tokens, at most 12
    s.update_from_output(s.last_output, {"b": [1, 2, 3]})
    assert req.is_finished and req.finish_reason == "length" and req.num_tokens == 12


def test_a_stop_among_the_steps_ends_the_request_there():
    s = _sched(steps=4)
    req = _add(s, "a", stop_token_ids=[7])
    _prefill(s)
    out = s.schedule()
    (update,) = s.update_from_output(out, {"a": [5, 7, 9, 9]})
    assert update.new_token_ids == [5, 7] and update.finished and req.stop_reason == 7
    assert req.output_token_ids == [100, 5, 7]
    assert s.kv_cache_manager.pool.num_free_blocks == 32  # every block back


@pytest.mark.parametrize("case", ["not-multi", "prefilling", "drafts", "one-step-left", "steps-1"])
def test_one_step_a_schedule_unless_every_running_request_may(case):
    s = _sched(steps=1 if case == "steps-1" else 4, budget=8 if case == "prefilling" else 64)
    _add(s, "a")
    _add(s, "b", multi=case != "not-multi", max_tokens=2 if case == "one-step-left" else 32)
    if case == "prefilling":
        _add(s, "c", prompt=20)  # mid-prefill after the first step (budget 8)
    _prefill(s)
    if case == "drafts":
        s.set_draft_token_ids("a", [3, 4])
    out = s.schedule()
    assert all(x.num_steps == 1 for x in out.scheduled)


def test_a_waiting_request_is_admitted_before_more_steps_unless_no_seat_is_free():
    s = _sched(steps=4, max_num_seqs=2)
    _add(s, "a")
    _prefill(s)
    _add(s, "b", prompt=3)
    out = s.schedule()  # a seat is free: b is admitted, a decodes one token
    assert [(x.request_id, x.num_steps, x.num_tokens) for x in out.scheduled] == [("a", 1, 1), ("b", 1, 3)]
    s.update_from_output(out, {"a": [1], "b": [100]})
    _add(s, "c")  # no seat: a and b run their steps, c waits
    out = s.schedule()
    assert [(x.request_id, x.num_steps) for x in out.scheduled] == [("a", 4), ("b", 4)] and s.num_waiting == 1


def test_a_request_decodes_one_step_a_schedule_until_it_has_min_tokens_outputs():
    s = _sched(steps=4)
    a = _add(s, "a", min_tokens=3, stop_token_ids=[9])
    _prefill(s)  # output 1 of 3
    for want in (1, 1):  # before 3 outputs the sampler bans the stop tokens each step: one step
        out = s.schedule()
        assert [x.num_steps for x in out.scheduled] == [want]
        s.update_from_output(out, {"a": [7]})
    assert a.num_output_tokens == 3
    out = s.schedule()
    assert [x.num_steps for x in out.scheduled] == [4]


@pytest.mark.parametrize("eos,ignore_eos,multi", [((2,), False, False), ((2,), True, True), ((), False, True)])
def test_min_tokens_holds_the_steps_back_only_where_it_bans_a_token(eos, ignore_eos, multi):
    """No stop_token_ids: min_tokens bans the EOS ids unless ignore_eos, and nothing without them."""
    s = _sched(steps=4)
    req = Request("a", [1, 2, 3], SP(min_tokens=5, ignore_eos=ignore_eos), eos_token_ids=eos)
    req.multi_step = True
    s.add_request(req)
    _prefill(s)
    assert [x.num_steps for x in s.schedule().scheduled] == [4 if multi else 1]


def test_too_few_free_blocks_make_one_step_and_preempt_nobody():
    s = _sched(steps=8, num_blocks=6, block_size=4)  # 5 usable blocks
    a, b = _add(s, "a", prompt=7, max_tokens=10), _add(s, "b", prompt=7, max_tokens=10)  # 2 blocks each
    _prefill(s)
    out = s.schedule()  # 8 steps would need 2 more blocks each; 1 is free
    assert [x.num_steps for x in out.scheduled] == [1, 1] and not out.preempted_req_ids
    s.update_from_output(out, {"a": [1], "b": [1]})
    assert a.num_computed_tokens == b.num_computed_tokens == 8


def _fake(request_id: str, index: int) -> int:
    """The fake model's output ``index`` of a request: fixed by its id and the index."""
    return (sum(map(ord, request_id)) * 31 + index * 17) % 900 + 1


@pytest.mark.parametrize("seed", range(6))
def test_random_arrivals_with_multi_steps_keep_the_kv_and_the_counts_right(seed):
    """Arrivals, shared prefixes (prefix-cache hits), a host tier for evicted prefixes (swaps), preemption,
    stop tokens and aborts, with schedules of several steps among them: every slot a step reads holds the
    context it needs, every request's tokens are the fake model's in order, counts stay consistent."""
    rng = random.Random(2000 + seed)
    sched = _sched(steps=rng.choice([2, 3, 8]), num_blocks=rng.randrange(14, 30), max_num_seqs=rng.randrange(1, 5),
                   budget=rng.randrange(16, 64), max_model_len=48, num_host_blocks=rng.choice([0, 4, 10]))
    kv = FakeKV(4)
    expected: dict[str, int] = {}
    seen: Counter[int] = Counter()
    prefixes = [[rng.randrange(1, 900) for _ in range(12)] for _ in range(2)]
    for t in range(600):
        if sched.requests and rng.random() < 0.02:
            sched.abort(rng.choice(sorted(sched.requests)))
        if t < 400 and rng.random() < 0.1:
            rid = f"q{t}"
            prompt = rng.choice(prefixes)[: rng.randrange(0, 13)] + [rng.randrange(1, 900)
                                                                     for _ in range(rng.randrange(1, 20))]
            max_tokens = rng.randrange(1, 48 - len(prompt) + 1)
            req = Request(rid, prompt, SP(max_tokens=max_tokens, stop_token_ids=[_fake(rid, 5)]
                                          if rng.random() < 0.3 else None))
            req.multi_step = rng.random() < 0.8
            sched.add_request(req)
            expected[rid] = max_tokens
        out = sched.schedule()
        steps = {x.num_steps for x in out.scheduled}
        assert len(steps) <= 1 and (steps == {1} or out.num_decodes == len(out.scheduled))
        seen.update(steps)
        sampled = {}
        for x in out.scheduled:
            if x.samples:
                req = sched.get_request(x.request_id)
                sampled[x.request_id] = [_fake(x.request_id, req.num_output_tokens + i) for i in range(x.num_steps)]
        kv.run(sched, out, sampled)
        for u in sched.update_from_output(out, sampled):
            r = u.request
            assert r.num_output_tokens <= expected[r.request_id]
            assert r.output_token_ids == [_fake(r.request_id, i) for i in range(r.num_output_tokens)]
            if not u.finished:
                assert r.num_computed_tokens == r.num_tokens - 1
    assert not sched.has_unfinished_requests() or all(r.num_output_tokens for r in sched.running)
    assert seen[1] and sum(n for k, n in seen.items() if k > 1) > 5
    stats = sched.make_stats()
    assert stats.prefix_cache_hits > 0


def test_the_flag_is_checked():
    with pytest.raises(ValueError, match="--num-scheduler-steps must be a positive integer, got 0"):
        EngineArgs.from_kwargs("m", num_scheduler_steps=0)
    with pytest.raises(ValueError, match="--num-scheduler-steps 4 with --speculative-config"):
        EngineArgs.from_kwargs("m", num_scheduler_steps=4, speculative_config={"method": "ngram"})
    with pytest.raises(ValueError, match="--num-scheduler-steps must be >= 1, got 0"):
        SchedulerConfig(8, 64, 64, num_scheduler_steps=0)
    from fd_core.entrypoints.cli import build_parser, engine_args_from

    ns = build_parser().parse_args(["--model", "m", "--num-scheduler-steps", "8"])
    assert engine_args_from(ns).num_scheduler_steps == 8


# -- the engine on the CPU reference --------------------------------------------------------------------------


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(100, 2000, int(rng.integers(1, 60)))] for _ in range(n)]


def _generate(model, prompts, params, **kw) -> tuple[list[list[int]], list[str | None]]:
    args = dict(backend="cpu", max_model_len=256, max_num_seqs=8, num_gpu_blocks_override=96, block_size=16)
    args.update(kw)
    outs = LLM(str(model), **args).generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.outputs[0].finish_reason for o in outs]


def _record_schedules(monkeypatch) -> list[int]:
    """The step counts of every scheduled request, appended as schedules are made."""
    from fd_core.engine.scheduler import Scheduler as S

    schedules: list[int] = []
    real = S.schedule
    monkeypatch.setattr(S, "schedule", lambda self: (out := real(self), schedules.extend(
        x.num_steps for x in out.scheduled))[0])
    return schedules


@pytest.fixture(scope="module")
def dense(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


def test_the_engine_gives_the_same_tokens_with_multi_steps(dense, monkeypatch):
    prompts = _prompts(10)
    params = [SamplingParams(max_tokens=int(m), temperature=0, ignore_eos=True) for m in (1, 2, 5, 9, 17, 30, 3, 12,
                                                                                           20, 7)]
    want, _ = _generate(dense, prompts, params)
    # a stop token each request meets a few tokens in, from the one-step run
    stops = [SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[w[min(3, len(w) - 1)]]) for w in want]
    want_stop, reasons = _generate(dense, prompts, stops)
    schedules = _record_schedules(monkeypatch)
    for steps in (2, 5):
        assert _generate(dense, prompts, params, num_scheduler_steps=steps)[0] == want
        assert _generate(dense, prompts, stops, num_scheduler_steps=steps) == (want_stop, reasons)
        # a small pool (preemption), few seats (arrivals wait), chunked prefill: still the same tokens
        assert _generate(dense, prompts, params, num_scheduler_steps=steps, num_gpu_blocks_override=12,
                         max_num_seqs=3, max_num_batched_tokens=32)[0] == want
    assert max(schedules) == 5 and schedules.count(1) < len(schedules)


def test_seeded_sampled_requests_draw_the_same_tokens_with_multi_steps(dense, monkeypatch):
    """Temperature, top-k, top-p and min-p requests multi-step too: each draws its uniforms for every step
    of a schedule up front, in its generator's order, so a seed gives the tokens of one step a schedule
    (with stops, few seats and preemption); greedy rows beside them keep the argmax."""
    prompts = _prompts(6, seed=2)
    params = [SamplingParams(max_tokens=17, temperature=0.8, top_p=0.8, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=9, temperature=1.0, top_k=5, seed=4, ignore_eos=True),
              SamplingParams(max_tokens=23, temperature=1.3, min_p=0.05, seed=5, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=30, temperature=0.7, top_k=50, top_p=0.9, seed=6),
              SamplingParams(max_tokens=14, temperature=1.0, seed=7, ignore_eos=True)]
    want = _generate(dense, prompts, params)
    assert len({tuple(w) for w in want[0]}) == len(prompts)
    schedules = _record_schedules(monkeypatch)
    for steps in (3, 8):
        assert _generate(dense, prompts, params, num_scheduler_steps=steps) == want
        assert _generate(dense, prompts, params, num_scheduler_steps=steps, num_gpu_blocks_override=12,
                         max_num_seqs=3, max_num_batched_tokens=32) == want
    assert max(schedules) == 8


def test_requests_with_stop_strings_multi_step_and_end_where_one_step_ends(dense, monkeypatch):
    """Stop strings are matched on the text outside the core: a schedule's tokens are taken one at a time
    there, and the text and tokens end at the token that completes the stop string, as with one step a
    schedule (the core's later tokens dropped, the request aborted)."""
    prompts = _prompts(6, seed=3)
    plain = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    llm = LLM(str(dense), backend="cpu", max_model_len=256, num_gpu_blocks_override=96, block_size=16)
    texts = [o.outputs[0].text for o in llm.generate([{"prompt_token_ids": p} for p in prompts], plain,
                                                      use_tqdm=False)]
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[t[i:i + 2]],
                             include_stop_str_in_output=bool(i % 2))
              for i, t in zip((3, 6, 9, 2, 12, 5), texts)]
    params[4] = SamplingParams(max_tokens=24, temperature=0.8, seed=9, ignore_eos=True, stop=[texts[4][12:14]])
    params[5] = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=["\u2603 never"])

    def run(**kw):
        args = dict(backend="cpu", max_model_len=256, max_num_seqs=8, num_gpu_blocks_override=96, block_size=16)
        args.update(kw)
        outs = LLM(str(dense), **args).generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [(o.outputs[0].text, list(o.outputs[0].token_ids), o.outputs[0].finish_reason,
                 o.outputs[0].stop_reason) for o in outs]

    want = run()
    assert sum(w[2] == "stop" for w in want) >= 4 and want[5][2] == "length"
    schedules = _record_schedules(monkeypatch)
    for steps in (4, 8):
        assert run(num_scheduler_steps=steps) == want
    assert max(schedules) == 8


def test_min_tokens_requests_give_the_tokens_of_one_step_a_schedule(dense, monkeypatch):
    """Their stop tokens are banned before min_tokens outputs: one step a schedule until then, then several.
    Each greedy request's stop token is the one it first emits at output min_tokens, so one step a schedule
    ends it right there, and a ban held a step too long would not."""
    prompts = _prompts(6, seed=6)
    plain, _ = _generate(dense, prompts, [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)] * 6)
    params = []
    for i, s in enumerate(plain[:5]):
        m = next(j for j in range(3 + i, len(s)) if s[j] not in s[:j])  # a token new at output m
        params.append(SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop_token_ids=[s[m]],
                                     min_tokens=m))
    params.append(SamplingParams(max_tokens=20, temperature=0.9, seed=11, min_tokens=6))
    want = _generate(dense, prompts, params)
    assert [len(w) for w in want[0][:5]] == [p.min_tokens + 1 for p in params[:5]]
    schedules = _record_schedules(monkeypatch)
    for steps in (3, 8):
        assert _generate(dense, prompts, params, num_scheduler_steps=steps) == want
    assert max(schedules) > 1


def test_requests_that_need_the_sampler_each_step_run_one_step_a_schedule(dense):
    prompts = _prompts(5, seed=1)
    params = [SamplingParams(max_tokens=12, temperature=0.8, seed=3, logit_bias={5: 2.0}, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.3, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0, logprobs=2, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True)]
    llm = LLM(str(dense), backend="cpu", max_model_len=256, num_scheduler_steps=4, num_gpu_blocks_override=64)
    core = llm.engine.core
    for i, (p, sp) in enumerate(zip(prompts, params)):
        llm.engine.add_request(f"r{i}", {"prompt_token_ids": p}, sp)
    assert [r.multi_step for r in core.scheduler.requests.values()] == [False, False, False, True, True]
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
        assert all(x.num_steps == 1 for x in core.scheduler.last_output.scheduled)  # a mixed batch: one step
    want = _generate(dense, prompts, params)[0]
    got = _generate(dense, prompts, params, num_scheduler_steps=4)[0]
    assert got == want
