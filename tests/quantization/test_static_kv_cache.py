"""An offline W4A8C8 checkpoint's static per-channel KV scales, applied:
the engine picks the ``int8_static`` cache, every layer carries its
``cachek`` / ``cachev_matmul`` scales, the written slots hold scale 1 (the
static write; a dynamic one stores absmax / 127), and greedy tokens do not
change under chunked prefill, prefix-cache hits or preemption."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fd_core.config import EngineArgs
from fd_core.engine.core import EngineCore, EngineCoreRequest
from fd_core.sampling.params import SamplingParams
from fd_core.testing.quantized_checkpoints import generate_offline_checkpoint

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def w4a8c8(tmp_path_factory):
    return generate_offline_checkpoint(tmp_path_factory.mktemp("c8"), "w4a8c8", "tiny-moe", seed=1)[1]


def _prompts(n: int = 5, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    shared = [int(t) for t in rng.integers(100, 2000, 36)]  # two full blocks and more: a prefix-cache hit
    return [(shared if i % 2 == 0 else []) + [int(t) for t in rng.integers(100, 2000, int(rng.integers(3, 40)))]
            for i in range(n)]


def _engine(model_dir, **overrides: Any) -> EngineCore:
    args: dict[str, Any] = dict(model=str(model_dir), backend="cpu", max_model_len=128, max_num_seqs=8,
                num_gpu_blocks_override=48, block_size=16)
    args.update(overrides)
    return EngineCore(EngineArgs(**args))


def _generate(core: EngineCore, prompts: list[list[int]], tag: str = "r") -> list[list[int]]:
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(f"{tag}{i}", prompt, GREEDY))
    tokens: dict[str, list[int]] = {f"{tag}{i}": [] for i in range(len(prompts))}
    while core.has_unfinished_requests():
        for out in core.step():
            tokens[out.request_id].extend(out.new_token_ids)
    return [tokens[f"{tag}{i}"] for i in range(len(prompts))]


def test_the_checkpoint_runs_with_its_static_scales_applied(w4a8c8):
    core = _engine(w4a8c8)
    assert core.runner.kv_cache_dtype == "int8_static"
    model = core.runner.model
    for i, layer in enumerate(model.layers):
        k, v = model.kv_cache_static_scales[i]
        assert layer.self_attn.kv_scales is not None and layer.self_attn.kv_scales.k is k.data
        assert layer.weights().kv_scales is layer.self_attn.kv_scales
    got = _generate(core, _prompts())
    assert [len(t) for t in got] == [GREEDY.max_tokens] * len(got)
    cache = core.runner.kv_caches[0]
    written = cache.scales[0].numpy() != 0  # [S, Hkv]: the slots the step wrote
    assert written.sum() > 0 and (cache.scales[0].numpy()[written] == 1.0).all()
    assert int(np.abs(cache.k.codes.numpy()).max()) <= 127


def test_an_explicit_int8_is_the_checkpoints_static_cache(w4a8c8):
    assert _engine(w4a8c8, kv_cache_dtype="int8").runner.kv_cache_dtype == "int8_static"


def test_tokens_do_not_change_under_chunked_prefill_and_prefix_caching(w4a8c8):
    prompts = _prompts()
    base = _generate(_engine(w4a8c8, enable_prefix_caching=False), prompts)
    assert _generate(_engine(w4a8c8, max_num_batched_tokens=16), prompts) == base
    core = _engine(w4a8c8)  # prefix caching on: the second run hits the first's blocks
    assert _generate(core, prompts, "a") == base
    assert _generate(core, prompts, "b") == base


def test_tokens_do_not_change_under_preemption(w4a8c8):
    prompts = _prompts(6, seed=3)
    base = _generate(_engine(w4a8c8), prompts)
    tight = _engine(w4a8c8, num_gpu_blocks_override=10, max_num_batched_tokens=64)
    assert _generate(tight, prompts) == base
    assert tight.scheduler.num_preemptions > 0


def test_a_float8_cache_with_static_scales_runs_fd_cores_dynamic_fp8(w4a8c8, tmp_path):
    """FastDeploy's float8_e4m3fn KV cache with static scales: the scales are read and checked but
    not applied (fd-core's fp8 cache is dynamic); the engine runs, no layer carries scales."""
    import json
    import shutil

    ckpt = tmp_path / "fp8kv"
    shutil.copytree(w4a8c8, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["quantization_config"]["kv_cache_quant_type"] = "float8_e4m3fn"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    core = _engine(ckpt)
    assert core.runner.kv_cache_dtype == "fp8"
    assert all(layer.self_attn.kv_scales is None for layer in core.runner.model.layers)
    got = _generate(core, _prompts(2))
    assert [len(t) for t in got] == [GREEDY.max_tokens] * 2


def test_a_backend_without_the_static_cache_is_refused_naming_the_checkpoints_cache():
    from fd_core.config import UnsupportedFeatureError
    from fd_core.quantization.config import QuantizationConfig, resolve_kv_cache_dtype
    from fd_core.quantization.offline import OfflineQuantization

    offline = OfflineQuantization("mix_quant", "wint8", "w4a8_static", "int8")
    quant = QuantizationConfig("mix_quant", "wint8", "w4a8_static", kv_cache_dtype="int8", offline=offline)
    for requested in ("auto", "int8"):
        with pytest.raises(UnsupportedFeatureError, match="static per-channel scales.*'gpuish' has float32, int8"):
            resolve_kv_cache_dtype(requested, quant, "gpuish", ("float32", "int8"))
    assert resolve_kv_cache_dtype("auto", quant, "cpu", ("float32", "int8", "int8_static")) == "int8_static"
