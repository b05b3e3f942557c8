"""MTP speculation through ``LLM`` and the server: greedy output token for token as
without it (k in {1, 2, 4}, dense and MoE blocks, both namings), with prefix caching
and chunked prefill on and under forced preemption; the MTP weights from the target's
checkpoint or a directory of MTP tensors only; refusals that name the path; and
FastDeploy's MTP launch line serving a generated checkpoint. Random weights: the
drafts are almost never accepted (reported, not tuned)."""

from __future__ import annotations

import json
import shlex

import httpx
import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from fd_core.config import UnsupportedFeatureError
from fd_core.model_loader.loader import CheckpointError

MAX_TOKENS = 16
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
BASE = dict(backend="cpu", max_model_len=512, max_num_seqs=8, num_gpu_blocks_override=128, block_size=16,
            enable_prefix_caching=True)


def _prompts(n: int = 6, seed: int = 0) -> list[list[int]]:
    """Random prompts; two share a 40-token prefix, so prefix caching hits."""
    rng = np.random.default_rng(seed)
    out = [[int(t) for t in rng.integers(100, 2000, int(rng.integers(5, 70)))] for _ in range(n)]
    out[1] = out[0][:40] + out[1]
    return out


def _run(model, prompts, **kw):
    llm = LLM(str(model), **{**BASE, **kw})
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.fixture(scope="module", params=[("tiny-dense", "pytorch"), ("tiny-moe", "paddle")], ids=["dense", "moe"])
def case(request, checkpoint_factory):
    shape, naming = request.param
    model = checkpoint_factory(shape, naming, num_nextn_predict_layers=1)
    prompts = _prompts()
    return model, prompts, _run(model, prompts)[0]


def _check_ran(llm) -> None:
    stats = llm.engine.core.spec.stats
    assert stats.num_draft_tokens > 0  # the drafter really proposed
    assert 0 <= stats.num_accepted_tokens <= stats.num_draft_tokens
    assert llm.engine.core.scheduler.kv_cache_manager.usage == 0.0  # every block back


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_equals_no_speculation_with_chunked_prefill_and_prefix_cache(case, k):
    model, prompts, expected = case
    spec = {"method": "mtp", "num_speculative_tokens": k}
    got, llm = _run(model, prompts, speculative_config=spec, max_num_batched_tokens=37)
    assert got == expected
    _check_ran(llm)
    assert llm.engine.core.scheduler.kv_cache_manager.prefix_cache_stats.hits > 0


def test_greedy_equals_no_speculation_under_preemption(case):
    model, prompts, expected = case
    spec = {"method": "mtp", "num_speculative_tokens": 4}
    got, llm = _run(model, prompts, speculative_config=spec, num_gpu_blocks_override=12, max_num_batched_tokens=64)
    assert got == expected
    assert llm.engine.core.scheduler.num_preemptions > 0
    _check_ran(llm)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_greedy_equals_no_speculation_with_swap_space(case, kv_cache_dtype):
    """Preemption with a host tier: the block's KV layer is swapped with the target's."""
    model, prompts, _ = case
    expected, _ = _run(model, prompts, kv_cache_dtype=kv_cache_dtype)
    spec = {"method": "mtp", "num_speculative_tokens": 2}
    got, llm = _run(model, prompts, speculative_config=spec, num_gpu_blocks_override=14, swap_space=0.001,
                    kv_cache_dtype=kv_cache_dtype)
    assert got == expected
    core = llm.engine.core
    assert core.scheduler.num_preemptions > 0
    assert len(core.runner.host_caches) == len(core.runner.kv_caches) == core.model_config.num_layers + 1


def test_mtp_weights_from_a_separate_directory(case, tmp_path):
    """``model`` may be a directory of MTP tensors only: the drafts equal those from
    the target's own checkpoint."""
    from safetensors.numpy import save_file

    from fd_core.model_loader.safetensors_io import SafetensorsFile

    model, prompts, expected = case
    reader = SafetensorsFile(model / "model.safetensors")
    save_file({n: reader.get(n) for n in reader.keys() if ".mtp_" in n}, str(tmp_path / "mtp.safetensors"))
    reader.close()
    runs = []
    for path in (None, str(tmp_path)):
        spec = {"method": "mtp", "num_speculative_tokens": 2, **({"model": path} if path else {})}
        got, llm = _run(model, prompts[:3], speculative_config=spec)
        assert got == expected[:3]
        runs.append(llm.engine.core.spec.stats.num_draft_tokens)
    assert runs[0] == runs[1] > 0


def test_no_mtp_weights_is_refused_naming_the_path(checkpoint_factory, tmp_path):
    plain = checkpoint_factory("tiny-dense", "pytorch")
    with pytest.raises(CheckpointError, match=f"{plain}.*holds no MTP weights"):
        LLM(str(plain), **BASE, speculative_config={"method": "mtp"})
    with_mtp = checkpoint_factory("tiny-dense", "pytorch", num_nextn_predict_layers=1)
    with pytest.raises(UnsupportedFeatureError, match="quantization 'wint8'.*MTP block"):
        LLM(str(with_mtp), **BASE, speculative_config={"method": "mtp", "quantization": "wint8"})
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match=f"{missing}.*not a directory"):
        LLM(str(plain), **BASE, speculative_config={"method": "mtp", "model": str(missing)})


def test_the_target_ignores_mtp_weights_without_speculation(checkpoint_factory):
    """The same seed with and without MTP tensors: the target's output is unchanged."""
    prompts = _prompts(3, seed=5)
    plain, _ = _run(checkpoint_factory("tiny-dense", "paddle"), prompts)
    with_mtp, _ = _run(checkpoint_factory("tiny-dense", "paddle", num_nextn_predict_layers=1), prompts)
    assert plain == with_mtp


@pytest.mark.slow
def test_fastdeploy_mtp_launch_line_serves_the_generated_checkpoint(checkpoint_factory, tmp_path):
    """FastDeploy's 21B-A3B MTP line (tests/entrypoints/test_fastdeploy_launch_lines.py), the model and
    the MTP path swapped for a generated MoE checkpoint with its MTP block; greedy answers equal the
    engine's without speculation."""
    from tests.entrypoints.server_process import Server
    from tests.entrypoints.test_fastdeploy_launch_lines import LINES

    model = checkpoint_factory("tiny-moe", "paddle", num_nextn_predict_layers=1, max_position_embeddings=32768)
    _, line, _, refused = next(x for x in LINES if x[0] == "ERNIE-4.5-21B-A3B-Paddle MTP")
    assert refused is None
    words = [str(model) if w == "M" else w.replace('"/mtp"', json.dumps(str(model))) for w in shlex.split(line)]
    prompts = _prompts(3, seed=7)
    llm = LLM(str(model), backend="cpu", quantization="wint4", max_model_len=32768, max_num_seqs=8,
              num_gpu_blocks_override=64)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    srv = Server([*words, "--backend", "cpu", "--num-gpu-blocks-override", "64", "--served-model-name", "tiny"],
                 tmp_path / "server.log")
    try:
        srv.wait_ready()
        for prompt, want in zip(prompts, expected):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}
            got = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
            assert got["choices"][0]["completion_token_ids"] == want
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        drafted = [line for line in metrics.splitlines()
                   if line.startswith("fastdeploy:spec_decode_num_draft_tokens_total ")]
        assert drafted and float(drafted[0].rsplit(" ", 1)[1]) > 0
    finally:
        assert srv.stop() == 0, srv.output()


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
def test_hf_oracle_loads_the_mtp_checkpoint_and_speculation_matches_it(checkpoint_factory, shape):
    """HF transformers loads a checkpoint with MTP tensors (it ignores them); our greedy
    output with MTP speculation equals HF's, token for token."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.models.test_ernie_vs_hf import _hf_greedy

    model = checkpoint_factory(shape, "pytorch", num_nextn_predict_layers=1)
    prompts = _prompts(3, seed=9)
    hf_tokens, _ = _hf_greedy(model, prompts)  # NEW_TOKENS (32) greedy tokens each
    llm = LLM(str(model), **BASE, speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    params = SamplingParams(max_tokens=len(hf_tokens[0]), temperature=0, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert ours == hf_tokens
    assert llm.engine.core.spec.stats.num_draft_tokens > 0


def test_seeded_sampling_with_mtp_is_reproducible(case):
    model, prompts, _ = case
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.9, seed=3 + i, ignore_eos=True)
              for i in range(len(prompts))]
    spec = {"method": "mtp", "num_speculative_tokens": 2}
    runs = []
    for _ in range(2):
        llm = LLM(str(model), **BASE, speculative_config=spec)
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        _check_ran(llm)
    assert runs[0] == runs[1]
    assert all(len(o) == MAX_TOKENS for o in runs[0])


def test_fd_gen_checkpoint_mtp_flag_writes_the_block(tmp_path):
    from fd_core.model_loader.safetensors_io import SafetensorsFile
    from fd_core.testing.checkpoints import main

    assert main(["--shape", "tiny-moe", "--naming", "paddle", "--out", str(tmp_path), "--mtp"]) == 0
    assert json.loads((tmp_path / "config.json").read_text())["num_nextn_predict_layers"] == 1
    reader = SafetensorsFile(tmp_path / "model.safetensors")
    names = {n for n in reader.keys() if ".mtp_" in n}
    shapes = {n: tuple(reader.get_raw(n).shape) for n in names}
    reader.close()
    assert shapes["ernie.mtp_linear_proj.0.weight"] == (128, 64)  # [2H, H], Paddle layout
    assert "ernie.mtp_block.0.self_attn.qkv_proj.weight" in names
    assert "ernie.mtp_block.0.mlp.experts.7.up_gate_proj.weight" in names  # the MoE block's routed experts
    assert {"ernie.mtp_emb_norm.0.weight", "ernie.mtp_hidden_norm.0.weight"} <= names


def test_mtp_with_an_offline_w4a8c8_checkpoint_equals_no_speculation(checkpoint_factory, tmp_path):
    """The target's int8 KV cache is static per channel (int8_static, its scales applied); the MTP
    block carries no static KV scales, so its own KV layer is the dynamic int8 cache."""
    from fd_core.testing.quantized_checkpoints import quantize_checkpoint

    src = checkpoint_factory("tiny-moe", "paddle", num_nextn_predict_layers=1)
    model = quantize_checkpoint(src, tmp_path / "w4a8c8", "w4a8c8")
    prompts = _prompts(4)
    expected, plain = _run(model, prompts)
    assert plain.engine.core.runner.kv_cache_dtype == "int8_static"
    got, llm = _run(model, prompts, speculative_config={"method": "mtp", "num_speculative_tokens": 2},
                    max_num_batched_tokens=37)
    assert got == expected
    _check_ran(llm)
    assert [c.dtype for c in llm.engine.core.runner.kv_caches][-2:] == ["int8_static", "int8"]
