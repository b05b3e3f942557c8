"""Tensor parallelism on ERNIE-4.5-VL: the language model splits as ERNIE MoE does (attention
heads, text and vision experts, shared experts, vocab), the vision tower runs whole on every
rank; greedy tokens of prompts with an image equal TP=1's, logprobs within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.testing.vl_checkpoint import generate_vl_checkpoint

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return generate_vl_checkpoint(tmp_path_factory.mktemp("vl_tp"), "tiny-vl", naming="paddle")


def _run(path, tp: int, **kwargs):
    from fd_core import LLM, SamplingParams

    llm = LLM(model=str(path), backend="cpu", max_model_len=256, num_gpu_blocks_override=32, block_size=16,
              tensor_parallel_size=tp, **kwargs)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for shape in ((60, 90, 3), (40, 40, 3))]
    prompts = [{"prompt": "Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> what is it?",
                "multi_modal_data": {"image": images[0]}},
               {"prompt": "Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>Picture 2:"
                          "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> compare them",
                "multi_modal_data": {"image": images}},
               "Describe the weather today."]
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0),
                            use_tqdm=False)
    finally:
        if tp > 1:
            llm.engine.core.runner.close()
    return [(list(o.outputs[0].token_ids), [e[t].logprob for e, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outs]


@pytest.mark.slow
def test_tp2_vl_equals_tp1(vl_dir):
    want = _run(vl_dir, 1)
    got = _run(vl_dir, 2)
    for (ids, lps), (want_ids, want_lps) in zip(got, want):
        assert ids == want_ids
        np.testing.assert_allclose(lps, want_lps, atol=1e-4)


def test_expert_parallel_is_refused_for_vl_by_name(vl_dir):
    from fd_core.models.config import load_config
    from fd_core.parallel.config import check_expert_parallel

    with pytest.raises(ValueError, match="--enable-expert-parallel: .*text and vision experts"):
        check_expert_parallel(load_config(str(vl_dir)), 2)
