"""--enable-expert-parallel through the offline LLM: TP=2 + EP on the tiny MoE gives TP=1's
greedy tokens (logprobs within 1e-3), each rank holds only its experts, and the flag is
refused, by name, for a dense model and an expert count the ranks do not divide."""

from __future__ import annotations

import os

import pytest

from fd_core import LLM, SamplingParams
from fd_core.models.config import load_config
from fd_core.parallel.expert_parallel import ExpertParallel, check_expert_parallel
from fd_core.testing.process_tree import alive, descendants

PROMPTS = ["hello world", "the quick brown fox jumps over", "a"]
PARAMS = SamplingParams(max_tokens=8, temperature=0, logprobs=1)


def _run(model, tp: int, **kwargs):
    llm = LLM(model=str(model), backend=kwargs.pop("backend", "cpu"), tensor_parallel_size=tp,
              max_model_len=256, **kwargs)
    try:
        outs = llm.generate(PROMPTS, PARAMS)
        runner = llm.engine.core.runner
        experts = [tuple(mlp.up_gate_proj.shape) for mlp in _moe_layers(runner)]
    finally:
        if tp > 1:
            llm.engine.core.runner.close()
    tokens = [(o.outputs[0].token_ids,
               [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]) for o in outs]
    return tokens, experts


def _moe_layers(runner):
    from fd_core.layers.mlp import MoE

    return [layer.mlp for layer in runner.model.layers if isinstance(layer.mlp, MoE)]


@pytest.mark.parametrize("naming", ["paddle", pytest.param("pytorch", marks=pytest.mark.slow)])
def test_ep2_greedy_tokens_equal_tp1(checkpoint_factory, naming):
    model = checkpoint_factory("tiny-moe", naming)
    before = set(descendants(os.getpid()))
    one, full = _run(model, 1)
    two, local = _run(model, 2, enable_expert_parallel=True)
    for (tokens1, lps1), (tokens2, lps2) in zip(one, two):
        assert tokens2 == tokens1
        assert max(abs(a - b) for a, b in zip(lps1, lps2)) <= 1e-3
    # rank 0 holds experts [0, E/2), whole: half the experts, every expert's full intermediate dim
    assert [(e // 2, d, i) for e, d, i in full] == local
    assert not alive(sorted(set(descendants(os.getpid())) - before))


@pytest.mark.slow
def test_ep2_wint8_greedy_tokens_equal_wint8_tp1(checkpoint_factory):
    # routed experts are whole on their rank, so their int8 scales equal TP=1's; the
    # attention and shared experts are TP slices (see test_tp_llm's wint8 tolerance)
    model = checkpoint_factory("tiny-moe", "pytorch")
    one, _ = _run(model, 1, quantization="wint8")
    two, _ = _run(model, 2, quantization="wint8", enable_expert_parallel=True)
    for (tokens1, lps1), (tokens2, lps2) in zip(one, two):
        assert tokens2 == tokens1
        assert max(abs(a - b) for a, b in zip(lps1, lps2)) <= 0.15


def test_each_rank_loads_only_its_experts(checkpoint_factory):
    from fd_core.backends import get_backend
    from fd_core.model_loader.loader import load_model

    model_dir = checkpoint_factory("tiny-moe", "paddle")
    ep = ExpertParallel(1, 2)
    model = load_model(model_dir, get_backend("cpu").ops, 256, transform=ep)
    assert (ep.first_expert, ep.local_experts) == (4, 4)
    targets = ep.shard_targets(model, model.checkpoint_targets("paddle"))
    experts = {name: ts for name, ts in targets.items() if ".mlp.experts." in name}
    mine = {name for name, ts in experts.items() if ts}
    assert mine and all(int(name.split(".mlp.experts.")[1].split(".")[0]) >= 4 for name in mine)
    assert all(t.index[0] < 4 for ts in experts.values() for t in ts)  # renumbered locally


def test_ep_refuses_a_dense_model_by_name(checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    before = set(descendants(os.getpid()))
    with pytest.raises(ValueError, match=r"--enable-expert-parallel: .* is a dense model"):
        LLM(model=str(model), backend="cpu", tensor_parallel_size=2, enable_expert_parallel=True,
            max_model_len=256)
    assert set(descendants(os.getpid())) <= before


def test_ep_refuses_an_expert_count_the_ranks_do_not_divide(checkpoint_factory):
    config = load_config(checkpoint_factory("tiny-moe", "paddle"))
    with pytest.raises(ValueError, match=r"the model's 8 experts do not divide over 3 ranks; use a size among "
                                         r"1, 2, 4, 8"):
        check_expert_parallel(config, 3)


def test_fd_serve_refuses_ep_for_a_dense_model_before_any_engine_starts(checkpoint_factory):
    import subprocess
    import sys

    model = checkpoint_factory("tiny-dense", "pytorch")
    done = subprocess.run([sys.executable, "-m", "fd_core.entrypoints.openai.api_server", "--model", str(model),
                           "--backend", "cpu", "--port", "0", "--tensor-parallel-size", "2",
                           "--enable-expert-parallel"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--enable-expert-parallel: Ernie4_5ForCausalLM is a dense model" in done.stderr
