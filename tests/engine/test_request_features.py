"""Engine-side request features on a generated checkpoint: the default seed
(--seed), the thinking budget (reasoning_max_tokens), logits processors
(--logits-processors, logits_processors_args) and the repetition early stop."""

from __future__ import annotations

import itertools

import pytest

from fd_core import envs
from fd_core.config import EngineArgs
from fd_core.engine.core import EngineCore, EngineCoreRequest
from fd_core.engine.request_setup import default_seed
from fd_core.sampling.params import SamplingParams
from fd_core.tokenizer import Tokenizer

PROMPTS = [[100 + i, 200 + 3 * i, 300, 400 + i] for i in range(4)]
_ids = itertools.count()


def _core(model_dir, **kwargs) -> EngineCore:
    args = dict(backend="cpu", max_model_len=256, max_num_seqs=8, num_gpu_blocks_override=64,
                block_size=16)
    args.update(kwargs)
    return EngineCore(EngineArgs.from_kwargs(str(model_dir), **args))


def _run(core: EngineCore, prompts, params) -> list[tuple[list[int], str | None]]:
    """Each prompt's output tokens and finish reason, all requests added first."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    rids = [f"r{next(_ids)}" for _ in prompts]
    for rid, prompt, p in zip(rids, prompts, params):
        core.add_request(EngineCoreRequest(rid, list(prompt), p, eos_token_ids=[2]))
    tokens: dict[str, list[int]] = {rid: [] for rid in rids}
    reasons: dict[str, str | None] = {}
    while core.has_unfinished_requests():
        for out in core.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finish_reason is not None:
                reasons[out.request_id] = out.finish_reason
    return [(tokens[rid], reasons.get(rid)) for rid in rids]


@pytest.fixture(scope="module")
def dense(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


@pytest.fixture(scope="module")
def tokens(dense):
    return Tokenizer.from_pretrained(dense).added_tokens


@pytest.fixture(scope="module")
def core(dense):
    """One engine for the tests that need no special flags."""
    return _core(dense)


# ---------------------------------------------------------------- default seed


SAMPLED = SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)


def test_a_seeded_engine_answers_the_same_stream_alike(dense):
    first = _run(_core(dense, seed=7), PROMPTS, SAMPLED)
    again = _core(dense, seed=7)
    assert _run(again, PROMPTS, SAMPLED) == first
    # request k of the stream samples as if it had asked for default_seed(7, k)
    explicit = [SAMPLED.replace(seed=default_seed(7, k)) for k in range(len(PROMPTS))]
    assert _run(_core(dense, seed=None), PROMPTS, explicit) == first
    # the counter moves on: the engine's next requests differ from its first ones
    assert _run(again, PROMPTS, SAMPLED) != first
    assert _run(_core(dense, seed=8), PROMPTS, SAMPLED) != first


def test_default_seeds_are_distinct_and_fit_63_bits():
    seeds = {default_seed(base, k) for base in (0, 1, -1, 2**40 + 3) for k in range(50)}
    assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)


# ------------------------------------------------------------- thinking budget


def test_budget_closes_the_reasoning_at_token_n_plus_1(core, tokens):
    think_end, n = tokens["</think>"], 5
    # bad words keep the model from closing the reasoning itself, deterministically
    base = SamplingParams(max_tokens=n + 4, temperature=0, ignore_eos=True,
                          bad_words_token_ids=[think_end])
    budgeted = base.replace(reasoning_max_tokens=n)
    (out, reason), = _run(core, PROMPTS[:1], budgeted)
    (free, _), = _run(core, PROMPTS[:1], base)
    assert reason == "length" and len(out) == n + 4
    assert out[n] == think_end and think_end not in out[:n]
    assert out[:n] == free[:n] and think_end not in free


def test_no_budget_when_the_prompt_turned_thinking_off(core, tokens, dense):
    tok = Tokenizer.from_pretrained(dense)
    off = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  tokenize=True, enable_thinking=False)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, reasoning_max_tokens=2,
                            bad_words_token_ids=[tokens["</think>"]])
    (out, _), = _run(core, [off], params)
    assert tokens["</think>"] not in out


def test_budget_survives_preemption(dense, tokens):
    think_end = tokens["</think>"]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, reasoning_max_tokens=30,
                            bad_words_token_ids=[think_end])
    prompts = [[100 + i] * 30 for i in range(6)]
    roomy = _run(_core(dense), prompts, params)
    tight = _core(dense, num_gpu_blocks_override=12, max_num_batched_tokens=64)
    assert _run(tight, prompts, params) == roomy
    assert tight.scheduler.num_preemptions > 0
    assert all(out[30] == think_end and think_end not in out[:30] for out, _ in roomy)


TRUNCATE = "FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR"


@pytest.fixture
def x1_core(dense, monkeypatch):
    """An engine started with ERNIE-X1's strategy, "\\n</think>\\n\\n"."""
    monkeypatch.setenv(TRUNCATE, "\n</think>\n\n")
    envs.reset()
    yield _core(dense)
    monkeypatch.delenv(TRUNCATE)
    envs.reset()


def test_the_string_strategy_forces_its_tokens_from_token_n_plus_1(x1_core, core, tokens, dense):
    think_end, n = tokens["</think>"], 5
    newline = Tokenizer.from_pretrained(dense).encode("\n")
    assert len(newline) == 1  # the tiny vocabulary's newline is its byte piece <0x0A>
    forced = [newline[0], think_end, newline[0], newline[0]]
    assert x1_core.thinking.forced_ids == tuple(forced)
    assert core.thinking.forced_ids == (think_end,)  # the default forces </think> alone
    base = SamplingParams(max_tokens=n + 6, temperature=0, ignore_eos=True,
                          bad_words_token_ids=[think_end])
    budgeted = base.replace(reasoning_max_tokens=n)
    (out, reason), = _run(x1_core, PROMPTS[:1], budgeted)
    (free, _), = _run(x1_core, PROMPTS[:1], base)
    assert reason == "length" and len(out) == n + 6
    assert out[:n] == free[:n] and out[n:n + 4] == forced
    (default, _), = _run(core, PROMPTS[:1], budgeted)
    assert default[:n + 1] == free[:n] + [think_end]


def test_max_tokens_stops_a_request_in_the_middle_of_the_forced_tokens(x1_core, tokens):
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, reasoning_max_tokens=2,
                            bad_words_token_ids=[tokens["</think>"]])
    (out, reason), = _run(x1_core, PROMPTS[:1], params)
    assert reason == "length" and out[2:] == list(x1_core.thinking.forced_ids[:2])


def test_the_string_strategy_survives_preemption(dense, tokens, monkeypatch):
    monkeypatch.setenv(TRUNCATE, "\n</think>\n\n")
    envs.reset()
    try:
        roomy_core = _core(dense)
        tight = _core(dense, num_gpu_blocks_override=12, max_num_batched_tokens=64)
    finally:
        envs.reset()
    forced = list(roomy_core.thinking.forced_ids)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, reasoning_max_tokens=30,
                            bad_words_token_ids=[tokens["</think>"]])
    prompts = [[100 + i] * 30 for i in range(6)]
    roomy = _run(roomy_core, prompts, params)
    assert _run(tight, prompts, params) == roomy
    assert tight.scheduler.num_preemptions > 0
    assert all(out[30:34] == forced for out, _ in roomy)


@pytest.mark.parametrize("value", ["\n\n", "</think", "\\n\\n"])
def test_a_truncate_str_without_think_end_is_refused_at_start(dense, monkeypatch, value):
    monkeypatch.setenv(TRUNCATE, value)
    envs.reset()
    try:
        with pytest.raises(ValueError, match=f"{TRUNCATE}.*'</think>'"):
            _core(dense)
    finally:
        envs.reset()


def test_budget_on_a_model_without_think_end_is_refused(core, monkeypatch):
    monkeypatch.setattr(core, "thinking", None)
    params = SamplingParams(max_tokens=4, reasoning_max_tokens=2)
    with pytest.raises(ValueError, match="reasoning_max_tokens needs a model whose tokenizer"):
        core.add_request(EngineCoreRequest("no-think", [5, 6], params))
    assert not core.has_unfinished_requests()


# ----------------------------------------------------------- logits processors


def test_logits_processors_args_need_a_loaded_processor(core):
    params = SamplingParams(logits_processors_args={"logit_bias": {"7": 5.0}})
    with pytest.raises(ValueError, match=r"'logit_bias'.*--logits-processors"):
        core.add_request(EngineCoreRequest("unread", [5, 6], params))
    assert not core.has_unfinished_requests()


def test_a_bad_processor_spec_fails_at_start(dense):
    with pytest.raises(ValueError, match="'nowhere_xyz:Proc': no module named 'nowhere_xyz'"):
        _core(dense, logits_processors=["nowhere_xyz:Proc"])  # found missing before anything loads
    with pytest.raises(ValueError, match="'fd_core.sampling:NoSuchProc'.*has no attribute 'NoSuchProc'"):
        _core(dense, logits_processors=["fd_core.sampling:NoSuchProc"])  # the engine imports and checks


@pytest.fixture(scope="module")
def stopping_core(dense):
    return _core(dense, logits_processors=["LogitBiasLogitsProcessor"], enable_early_stop=True,
                 early_stop_config={"window_size": 4, "threshold": 0.95})


def test_logit_bias_processor_steers_only_its_request(stopping_core, core):
    steered = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True,
                             logits_processors_args={"logit_bias": {"777": 100.0}})
    plain = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    (out, _), (other, _) = _run(stopping_core, PROMPTS[:2], [steered, plain])
    assert out == [777] * 3
    assert other == _run(core, PROMPTS[1:2], plain)[0][0]


def test_early_stop_ends_a_request_stuck_on_one_token(stopping_core):
    sure = SamplingParams(max_tokens=20, temperature=0.7, seed=1, ignore_eos=True,
                          logits_processors_args={"logit_bias": {"777": 100.0}})
    plain = SamplingParams(max_tokens=20, temperature=0.7, seed=1, ignore_eos=True)
    (stuck, why), (free, free_why) = _run(stopping_core, PROMPTS[:2], [sure, plain])
    assert (stuck, why) == ([777] * 4, "stop")
    assert len(free) == 20 and free_why == "length"
    assert not stopping_core.has_unfinished_requests()


def test_max_logprobs_bounds_what_a_request_may_ask(checkpoint_factory):
    from fd_core import LLM, SamplingParams

    llm = LLM(str(checkpoint_factory("tiny-dense")), backend="cpu", max_model_len=64, max_num_seqs=2,
              num_gpu_blocks_override=16, block_size=16, max_logprobs=2)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, logprobs=2), use_tqdm=False)
    assert len(out[0].outputs[0].logprobs) == 2
    with pytest.raises(ValueError, match=r"logprobs 3 is more than this server allows: at most 2 \(--max-logprobs\)"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, logprobs=3), use_tqdm=False)
